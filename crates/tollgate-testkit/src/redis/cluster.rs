//! A Redis Cluster of three masters without replicas (Redis or Valkey nodes), made with
//! `redis-cli --cluster create`, and the slot a key hashes to (CRC16), to tell which master holds a counter.

use std::process::Command;
use std::time::{Duration, Instant};

use super::{Engine, RedisServer, TOPOLOGY_TIMEOUT, info_value};
use crate::pki::Pki;
use crate::{free_port, loopback, process, wait};

/// The number of masters.
const MASTERS: usize = 3;
/// The number of hash slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// A 3-master Redis Cluster covering every slot.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// A cluster of the [chosen](Engine::chosen) engine's nodes.
    pub fn start() -> Self {
        Self::start_on(Engine::chosen())
    }

    /// A cluster of `engine` nodes.
    pub fn start_on(engine: Engine) -> Self {
        Self::start_with(engine, Vec::new)
    }

    /// A cluster that also speaks TLS, with a certificate for 127.0.0.1 that `pki`
    /// issues, on a second port of each node, and over TLS between its nodes; with
    /// `auth_clients`, TLS clients must present a certificate of `pki`. Redis tells TLS
    /// clients the nodes' TLS ports; the plaintext ports stay for the test's own checks.
    pub fn start_tls(pki: &Pki, auth_clients: bool) -> Self {
        let server = pki.issue("redis-cluster", "IP:127.0.0.1");
        Self::start_with(Engine::Redis, || {
            super::tls::args(pki, &server, free_port(), auth_clients)
        })
    }

    /// A cluster of `engine` nodes that each take `extra()` arguments too.
    fn start_with(engine: Engine, extra: impl Fn() -> Vec<String>) -> Self {
        let nodes = (0..MASTERS)
            .map(|i| {
                let name = format!("{} cluster node {i}", engine.name());
                let mut node = RedisServer::unstarted_on(engine, &name, &[]);
                let conf = node.dir.path().join("nodes.conf");
                node.extra = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    conf.to_string_lossy().into_owned(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                    // Without it the cluster bus takes port + 10000, a port nothing
                    // checked, which another test's connection may hold as its source
                    // port: the node then fails to start (seen in a clean-clone run).
                    "--cluster-port".into(),
                    free_port().to_string(),
                ];
                node.extra.extend(extra());
                node.launch();
                node
            })
            .collect();
        let cluster = Self { nodes };
        let mut create =
            Command::new(std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned()));
        create
            .args(["--cluster", "create"])
            .args(cluster.nodes.iter().map(RedisServer::host_port))
            .args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = process::run("redis-cli --cluster create", create, TOPOLOGY_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed ({}):\n{}{}",
            out.status,
            out.stdout,
            out.stderr
        );
        cluster.wait_ok();
        cluster
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(RedisServer::host_port).collect();
        nodes.join(",")
    }

    /// The TLS ports as [`RedisCluster::url`] lists the plaintext ones (empty unless
    /// started with [`RedisCluster::start_tls`]).
    pub fn tls_url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|node| Some(loopback(node.tls_port()?).to_string()))
            .collect();
        nodes.join(",")
    }

    /// Waits until every node reports `cluster_state:ok`, knows every node and sees every
    /// slot served.
    pub fn wait_ok(&self) {
        wait::until("cluster_state:ok on every node", TOPOLOGY_TIMEOUT, || {
            let infos: Vec<Option<String>> =
                self.nodes.iter().map(RedisServer::cluster_info).collect();
            let ok = infos.iter().all(|info| {
                info.as_deref().is_some_and(|info| {
                    info_value(info, "cluster_state").as_deref() == Some("ok")
                        && info_value(info, "cluster_known_nodes") == Some(MASTERS.to_string())
                        && info_value(info, "cluster_slots_ok") == Some(SLOTS.to_string())
                })
            });
            if ok {
                Ok(())
            } else {
                Err(format!("CLUSTER INFO per node: {infos:?}"))
            }
        });
    }

    /// Kills node `i` and starts it again on the same port with its `nodes.conf` (it
    /// rejoins with its slots, empty); waits until the whole cluster is ok again and
    /// returns how long that took.
    pub fn restart_node(&mut self, i: usize) -> Duration {
        let start = Instant::now();
        self.nodes[i].restart();
        self.wait_ok();
        start.elapsed()
    }

    /// Which node serves which slots: `(first, last, node index)` per range, from
    /// `CLUSTER NODES` of a running node.
    pub fn slot_ranges(&self) -> Vec<(u16, u16, usize)> {
        let asker = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
        self.slot_ranges_seen_by(asker)
    }

    /// [`RedisCluster::slot_ranges`] as `asker` sees them.
    fn slot_ranges_seen_by(&self, asker: &RedisServer) -> Vec<(u16, u16, usize)> {
        let nodes: String = asker.query(&["CLUSTER", "NODES"]);
        let mut ranges = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let port: u16 = fields[1]
                .split('@')
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|port| port.parse().ok())
                .unwrap_or_else(|| panic!("bad CLUSTER NODES line {line:?}"));
            let index = self
                .nodes
                .iter()
                .position(|n| n.port == port)
                .unwrap_or_else(|| panic!("unknown node port {port} in CLUSTER NODES"));
            for range in &fields[8..] {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>()) {
                    ranges.push((lo, hi, index));
                }
            }
        }
        ranges
    }

    /// Starts moving `slot` from the master serving it to master `to`, as a reshard
    /// does: the slot is MIGRATING on its owner and IMPORTING on `to`, so the owner serves
    /// the keys it still holds and sends a client asking for another key to `to` (ASK).
    /// Returns the owner's index, for [`RedisCluster::finish_moving`].
    pub fn begin_moving(&self, slot: u16, to: usize) -> usize {
        let from = Self::node_in_slot(&self.slot_ranges(), slot);
        assert_ne!(from, to, "slot {slot} is on node {to} already");
        let slot_arg = slot.to_string();
        let setslot = |node: usize, state: &str, peer: usize| {
            let () = self.nodes[node].query(&[
                "CLUSTER",
                "SETSLOT",
                &slot_arg,
                state,
                &self.node_id(peer),
            ]);
        };
        setslot(to, "IMPORTING", from);
        setslot(from, "MIGRATING", to);
        from
    }

    /// Ends the move [`RedisCluster::begin_moving`] began: every key of `slot` is
    /// migrated from `from` to `to` (MIGRATE), every master is told `to` serves the slot
    /// (the new owner first, as a reshard does), and this waits until each says so.
    /// Clients asking `from` are then sent to `to` for good (MOVED).
    pub fn finish_moving(&self, slot: u16, from: usize, to: usize) {
        let slot_arg = slot.to_string();
        let to_port = self.nodes[to].port().to_string();
        loop {
            let keys: Vec<String> =
                self.nodes[from].query(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]);
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "5000", "KEYS"];
            migrate.extend(keys.iter().map(String::as_str));
            // NOKEY: every one of them expired meanwhile.
            let reply: String = self.nodes[from].query(&migrate);
            assert!(
                ["OK", "NOKEY"].contains(&reply.as_str()),
                "MIGRATE of {keys:?}: {reply}"
            );
        }
        let owner = self.node_id(to);
        let others = (0..self.nodes.len()).filter(|&i| i != to && i != from);
        for node in [to, from].into_iter().chain(others) {
            let () = self.nodes[node].query(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &owner]);
        }
        wait::until(
            &format!("every master sees slot {slot} on node {to}"),
            TOPOLOGY_TIMEOUT,
            || {
                let seen: Vec<Option<usize>> = self
                    .nodes
                    .iter()
                    .map(|node| Self::serving(&self.slot_ranges_seen_by(node), slot))
                    .collect();
                match seen.iter().all(|&owner| owner == Some(to)) {
                    true => Ok(()),
                    false => Err(format!("owner of slot {slot} per node: {seen:?}")),
                }
            },
        );
    }

    /// `CLUSTER MYID` of node `i`.
    fn node_id(&self, i: usize) -> String {
        self.nodes[i].query(&["CLUSTER", "MYID"])
    }

    /// The index of the node holding `key`, given `ranges` from [`RedisCluster::slot_ranges`].
    pub fn node_in(ranges: &[(u16, u16, usize)], key: &str) -> usize {
        Self::node_in_slot(ranges, key_slot(key))
    }

    /// The index of the node serving `slot`, given `ranges`.
    fn node_in_slot(ranges: &[(u16, u16, usize)], slot: u16) -> usize {
        Self::serving(ranges, slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {ranges:?}"))
    }

    /// The index of the node serving `slot` in `ranges`, if one does.
    fn serving(ranges: &[(u16, u16, usize)], slot: u16) -> Option<usize> {
        ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|range| range.2)
    }

    /// The index of the node holding `key` now.
    pub fn node_of(&self, key: &str) -> usize {
        Self::node_in(&self.slot_ranges(), key)
    }

    /// Whether `key` exists on the master serving it.
    pub fn exists(&self, key: &str) -> bool {
        self.nodes[self.node_of(key)].exists(key)
    }
}

impl RedisServer {
    /// `CLUSTER INFO`, or `None` if the node does not answer.
    fn cluster_info(&self) -> Option<String> {
        self.try_connection(Duration::from_millis(500))
            .and_then(|mut c| ::redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
            .ok()
    }
}

/// The Redis Cluster slot of `key`: CRC16-XMODEM of its hash tag (the part between the
/// first `{` and the next `}`, if not empty) or of the whole key, modulo 16384.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

#[cfg(test)]
mod tests {
    use super::key_slot;

    #[test]
    fn slots_of_the_cluster_specification() {
        // The check value of CRC16-XMODEM: "123456789" → 0x31C3 (below 16384).
        assert_eq!(key_slot("123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(
            key_slot("{user1000}.following"),
            key_slot("{user1000}.followers")
        );
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(
            key_slot("foo{}{bar}"),
            key_slot("bar"),
            "an empty tag hashes the whole key"
        );
    }
}
