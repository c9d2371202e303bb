//! A sentinel set: a master, one replica of it, and one sentinel monitoring it (quorum 1,
//! down after 500 ms, failover timeout 3 s), so that a failover takes a few seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{RedisServer, Role, TOPOLOGY_TIMEOUT};
use crate::wait;

/// The name the sentinel monitors the master under.
pub const MASTER_NAME: &str = "mymaster";

/// A master, its replica and a sentinel.
pub struct SentinelSet {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
}

impl SentinelSet {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A set whose data nodes take `extra` arguments too (e.g. persistence, so that a
    /// master killed and restarted keeps its data).
    pub fn start_with(extra: &[&str]) -> Self {
        let master = RedisServer::start_with("master", extra);
        let master_port = master.port.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend_from_slice(extra);
        let replica = RedisServer::start_with("replica", &replica_args);
        wait::until(
            "the replica in sync with the master",
            TOPOLOGY_TIMEOUT,
            || match replica.info_field("replication", "master_link_status") {
                Some(status) if status == "up" => Ok(()),
                other => Err(format!("master_link_status {other:?}")),
            },
        );

        let mut sentinel = RedisServer::unstarted_with("sentinel", &[]);
        sentinel.role = Role::Sentinel;
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {MASTER_NAME} 500\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n",
            port = sentinel.port,
            dir = sentinel.dir.path().display(),
        );
        std::fs::write(sentinel.dir.path().join("sentinel.conf"), conf)
            .expect("write sentinel.conf");
        sentinel.launch();

        let set = Self {
            master,
            replica,
            sentinel,
        };
        wait::until(
            "the sentinel sees the master and its replica in sync",
            TOPOLOGY_TIMEOUT,
            || {
                if set.master_port_by_sentinel() == Some(set.master.port)
                    && set.sentinel_sees_replica_ok(set.replica.port)
                {
                    Ok(())
                } else {
                    Err(set.describe())
                }
            },
        );
        set
    }

    /// `mymaster,127.0.0.1:SENTINEL_PORT`.
    pub fn url(&self) -> String {
        format!("{MASTER_NAME},{}", self.sentinel.host_port())
    }

    /// The master's port according to the sentinel.
    pub fn master_port_by_sentinel(&self) -> Option<u16> {
        let mut conn = self
            .sentinel
            .try_connection(Duration::from_millis(500))
            .ok()?;
        let addr: Option<Vec<String>> = ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .ok()?;
        addr?.get(1)?.parse().ok()
    }

    /// The replicas the sentinel knows, as field → value.
    fn sentinel_replicas(&self) -> Vec<BTreeMap<String, String>> {
        let Ok(mut conn) = self.sentinel.try_connection(Duration::from_millis(500)) else {
            return Vec::new();
        };
        let replicas: Vec<Vec<String>> = ::redis::cmd("SENTINEL")
            .arg("replicas")
            .arg(MASTER_NAME)
            .query(&mut conn)
            .unwrap_or_default();
        replicas
            .into_iter()
            .map(|flat| {
                flat.chunks(2)
                    .filter_map(|kv| Some((kv.first()?.clone(), kv.get(1)?.clone())))
                    .collect()
            })
            .collect()
    }

    fn sentinel_sees_replica_ok(&self, port: u16) -> bool {
        self.sentinel_replicas().iter().any(|r| {
            r.get("port") == Some(&port.to_string())
                && r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        })
    }

    fn describe(&self) -> String {
        format!(
            "the sentinel says master port {:?}; replicas {:?}; sentinel log:\n{}",
            self.master_port_by_sentinel(),
            self.sentinel_replicas(),
            self.sentinel.log_tail()
        )
    }

    /// The data node the sentinel names master now, and the other one; `None` while it
    /// names neither (during a failover).
    pub fn by_role(&mut self) -> Option<(&mut RedisServer, &mut RedisServer)> {
        let port = self.master_port_by_sentinel()?;
        if port == self.master.port {
            Some((&mut self.master, &mut self.replica))
        } else if port == self.replica.port {
            Some((&mut self.replica, &mut self.master))
        } else {
            None
        }
    }

    /// Waits until the topology has settled after a fault: the sentinel names a master
    /// that says `role:master`, and the other node is its replica with the link up.
    pub fn await_settled(&mut self, timeout: Duration) -> Duration {
        let start = Instant::now();
        wait::until("the sentinel set settled", timeout, || {
            let Some(port) = self.master_port_by_sentinel() else {
                return Err(self.describe());
            };
            let (master, replica) = if port == self.master.port {
                (&self.master, &self.replica)
            } else {
                (&self.replica, &self.master)
            };
            let role = |node: &RedisServer| {
                node.try_query::<String>(&["INFO", "replication"])
                    .ok()
                    .and_then(|info| super::info_value(&info, "role"))
            };
            let linked = replica
                .try_query::<String>(&["INFO", "replication"])
                .ok()
                .and_then(|info| super::info_value(&info, "master_link_status"));
            if role(master).as_deref() == Some("master")
                && role(replica).as_deref() == Some("slave")
                && linked.as_deref() == Some("up")
            {
                Ok(())
            } else {
                Err(self.describe())
            }
        });
        start.elapsed()
    }

    /// Kills the master and waits until the sentinel has promoted the replica (it names
    /// the replica, which says `role:master`); returns how long that took.
    pub fn kill_master_and_await_failover(&mut self) -> Duration {
        let start = Instant::now();
        self.master.stop();
        let replica_port = self.replica.port;
        wait::until(
            "the sentinel's failover to the replica",
            TOPOLOGY_TIMEOUT,
            || {
                if self.master_port_by_sentinel() == Some(replica_port)
                    && self.replica.info_field("replication", "role").as_deref() == Some("master")
                {
                    Ok(())
                } else {
                    Err(self.describe())
                }
            },
        );
        start.elapsed()
    }
}
