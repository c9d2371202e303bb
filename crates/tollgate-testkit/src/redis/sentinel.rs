//! A sentinel set: a master, one replica of it, and one sentinel monitoring it (quorum 1,
//! down after 500 ms, failover timeout 3 s), so that a failover takes a few seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{Engine, RedisServer, Role, TOPOLOGY_TIMEOUT};
use crate::pki::Pki;
use crate::{free_port, loopback, wait};

/// The name the sentinel monitors the master under.
pub const MASTER_NAME: &str = "mymaster";

/// A master, its replica and a sentinel.
pub struct SentinelSet {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
    /// The sentinel's TLS port, for a set started with [`SentinelSet::start_tls`].
    sentinel_tls_port: Option<u16>,
}

impl SentinelSet {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A set whose data nodes take `extra` arguments too (e.g. persistence, so that a
    /// master killed and restarted keeps its data).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::build(extra, None)
    }

    /// A set that also speaks TLS, with a certificate for 127.0.0.1 that `pki` issues:
    /// each node and the sentinel on a second port, replication and monitoring over TLS
    /// (so the sentinel names the master's TLS port); with `auth_clients`, TLS clients
    /// must present a certificate of `pki`. The plaintext ports stay for the test's own
    /// checks.
    pub fn start_tls(pki: &Pki, auth_clients: bool) -> Self {
        Self::build(&[], Some((pki, auth_clients)))
    }

    fn build(extra: &[&str], tls: Option<(&Pki, bool)>) -> Self {
        let issued = tls.map(|(pki, _)| pki.issue("redis-sentinel-set", "IP:127.0.0.1"));
        let tls_settings = || match (tls, &issued) {
            (Some((pki, auth)), Some(issued)) => {
                super::tls::settings(pki, issued, free_port(), auth)
            }
            _ => Vec::new(),
        };
        let args = |first: &[String]| {
            let mut args: Vec<String> = first.to_vec();
            args.extend(extra.iter().map(|s| (*s).to_owned()));
            args.extend(
                tls_settings()
                    .into_iter()
                    .flat_map(|(name, value)| [format!("--{name}"), value]),
            );
            args
        };
        fn as_strs(args: &[String]) -> Vec<&str> {
            args.iter().map(String::as_str).collect()
        }
        // The pinned Valkey has no TLS.
        let engine = match tls {
            Some(_) => Engine::Redis,
            None => Engine::chosen(),
        };
        let master = RedisServer::start_on(engine, "master", &as_strs(&args(&[])));
        let master_port = master.announced_port().to_string();
        let replica_of = [
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.clone(),
        ];
        let replica = RedisServer::start_on(engine, "replica", &as_strs(&args(&replica_of)));
        wait::until(
            "the replica in sync with the master",
            TOPOLOGY_TIMEOUT,
            || match replica.info_field("replication", "master_link_status") {
                Some(status) if status == "up" => Ok(()),
                other => Err(format!("master_link_status {other:?}")),
            },
        );

        let mut sentinel = RedisServer::unstarted_on(engine, "sentinel", &[]);
        sentinel.role = Role::Sentinel;
        let sentinel_tls = tls_settings();
        let sentinel_tls_port = sentinel_tls
            .iter()
            .find(|(name, _)| name == "tls-port")
            .and_then(|(_, port)| port.parse().ok());
        let tls_lines: String = sentinel_tls
            .iter()
            .map(|(name, value)| format!("{name} {value}\n"))
            .collect();
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n{tls_lines}\
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
            sentinel_tls_port,
        };
        wait::until(
            "the sentinel sees the master and its replica in sync",
            TOPOLOGY_TIMEOUT,
            || {
                if set.master_port_by_sentinel() == Some(set.master.announced_port())
                    && set.sentinel_sees_replica_ok(set.replica.announced_port())
                {
                    Ok(())
                } else {
                    Err(set.describe())
                }
            },
        );
        set
    }

    /// `mymaster,127.0.0.1:SENTINEL_TLS_PORT`, for a set started with
    /// [`SentinelSet::start_tls`].
    pub fn tls_url(&self) -> String {
        let port = self.sentinel_tls_port.expect("a set started with TLS");
        format!("{MASTER_NAME},{}", loopback(port))
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
        if port == self.master.announced_port() {
            Some((&mut self.master, &mut self.replica))
        } else if port == self.replica.announced_port() {
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
            let (master, replica) = if port == self.master.announced_port() {
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
        let replica_port = self.replica.announced_port();
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
