//! Real `redis-server` processes (single node, 3-master cluster, sentinel set) and the
//! Tollgate-side helpers shared by the Redis-store integration tests.
//!
//! Every server listens on a free 127.0.0.1 port (never 6379), keeps no data on disk and
//! is killed when dropped. Nothing here sleeps to synchronise: readiness, cluster state,
//! failover and recovery are awaited as conditions, polled at a short interval inside a
//! deadline.
//!
//! A test crate using this module must also declare `mod common;` (Tollgate processes and
//! gRPC helpers live there).

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;

use crate::common::{Code, Rls, Server, http_get, request};

/// How long a redis-server may take to answer PING after it was spawned.
pub const REDIS_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long cluster creation, sentinel discovery and failover may take.
pub const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);
/// Interval of every condition poll.
pub const POLL: Duration = Duration::from_millis(20);
/// A call that has not answered after this long is reported as hung.
pub const HANG: Duration = Duration::from_secs(5);

const SENTINEL_MASTER: &str = "mymaster";

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// A port nothing listens on right now: bind 127.0.0.1:0, take the port, drop the listener.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("listener address").port()
}

/// Polls `check` every [`POLL`] until it returns `Some`, or panics after `timeout` with
/// `what` and the last state `describe` reports.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    describe: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not reached within {timeout:?}; {}", describe());
        }
        std::thread::sleep(POLL);
    }
}

// ---------------------------------------------------------------------------
// One redis-server process
// ---------------------------------------------------------------------------

/// What a process runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A data node; arguments are appended to the standard ones.
    Data,
    /// A sentinel, from the `sentinel.conf` in its directory.
    Sentinel,
}

/// One `redis-server` on a fixed 127.0.0.1 port with its own temporary directory.
/// `stop` and `restart` keep the port and the directory (so a cluster node keeps its
/// `nodes.conf`); data is not persisted. Killed on drop.
pub struct RedisServer {
    name: String,
    port: u16,
    role: Role,
    extra: Vec<String>,
    dir: TempDir,
    child: Option<Child>,
    frozen: bool,
    /// `--requirepass`, which the harness's own connections use.
    password: Option<String>,
}

impl RedisServer {
    /// A standalone redis-server, answering PING.
    pub fn start() -> Self {
        Self::start_with("redis", &[])
    }

    /// A redis-server with extra arguments (e.g. `--replicaof`), answering PING. Picks
    /// another port if the chosen one was taken before redis-server could bind it.
    pub fn start_with(name: &str, extra: &[&str]) -> Self {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut server = Self::unstarted_with(name, extra);
            match server.try_launch() {
                Ok(()) => return server,
                Err(why) if attempts < 5 && why.contains("Address already in use") => continue,
                Err(why) => panic!("{why}"),
            }
        }
    }

    /// A server with a reserved port and directory that is not running yet (for "Redis is
    /// down when Tollgate starts"); `launch` starts it.
    pub fn unstarted() -> Self {
        Self::unstarted_with("redis", &[])
    }

    pub fn unstarted_with(name: &str, extra: &[&str]) -> Self {
        let password = extra
            .windows(2)
            .find(|w| w[0] == "--requirepass")
            .map(|w| w[1].to_owned());
        Self {
            password,
            name: name.to_owned(),
            port: free_port(),
            role: Role::Data,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir: TempDir::new().expect("create a redis directory"),
            child: None,
            frozen: false,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(redis_server_bin());
        match self.role {
            Role::Data => {
                let dir = self.dir.path().to_str().expect("UTF-8 temp path");
                let log = self.log_path();
                cmd.arg("--port")
                    .arg(self.port.to_string())
                    .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    .args(["--daemonize", "no", "--dir", dir])
                    .arg("--logfile")
                    .arg(log)
                    .args(&self.extra);
            }
            Role::Sentinel => {
                cmd.arg(self.dir.path().join("sentinel.conf"))
                    .arg("--sentinel");
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// Starts the process on its port and waits until it answers PING.
    pub fn launch(&mut self) {
        // A restart may find the port briefly held (e.g. by a connection that used it as
        // its source port): keep trying until the start deadline.
        let deadline = Instant::now() + REDIS_START_TIMEOUT;
        loop {
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if Instant::now() < deadline && why.contains("Address already in use") => {
                    std::thread::sleep(POLL);
                }
                Err(why) => panic!("{why}"),
            }
        }
    }

    fn try_launch(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let child = self.command().spawn().unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); install redis-server and redis-cli, e.g. with scripts/install-test-deps.sh",
                redis_server_bin()
            )
        });
        self.child = Some(child);
        self.frozen = false;
        let deadline = Instant::now() + REDIS_START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().expect("poll redis-server"))
            {
                self.child = None;
                return Err(format!(
                    "{} on port {} exited before answering PING ({status}); log:\n{}",
                    self.name,
                    self.port,
                    self.log_tail()
                ));
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!(
                    "{} on port {} did not answer PING within {REDIS_START_TIMEOUT:?}; log:\n{}",
                    self.name,
                    self.port,
                    self.log_tail()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Whether the server answers PING right now.
    pub fn ping(&self) -> bool {
        let Ok(mut conn) = self.try_connection(Duration::from_millis(500)) else {
            return false;
        };
        matches!(redis::cmd("PING").query::<String>(&mut conn), Ok(pong) if pong == "PONG")
    }

    /// Kills the process (SIGKILL, as a crash would) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.frozen = false;
    }

    /// Kills the process and starts it again on the same port (empty: nothing persisted).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Stops the process with SIGSTOP: connections stay open, nothing answers.
    pub fn freeze(&mut self) {
        self.signal("-STOP");
        self.frozen = true;
    }

    /// Resumes a frozen process (SIGCONT).
    pub fn thaw(&mut self) {
        self.signal("-CONT");
        self.frozen = false;
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let status = Command::new("kill")
            .arg(signal)
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed: {status}");
    }

    /// A blocking connection whose connect, reads and writes each time out after `timeout`.
    fn try_connection(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        self.try_connection_as(self.password.as_deref(), timeout)
    }

    fn try_connection_as(
        &self,
        password: Option<&str>,
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        let url = match password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        let client = redis::Client::open(url)?;
        let conn = client.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// A blocking connection for inspecting the server from the test.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to {} on port {}: {e}", self.name, self.port))
    }

    /// A blocking connection authenticated with `password` (`None`: none).
    pub fn connection_as(&self, password: Option<&str>) -> redis::Connection {
        self.try_connection_as(password, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to {} on port {}: {e}", self.name, self.port))
    }

    /// Runs one command and returns its reply.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| panic!("{args:?} on {} (port {}): {e}", self.name, self.port))
    }

    /// `INFO section` as text.
    pub fn info(&self, section: &str) -> String {
        self.query(&["INFO", section])
    }

    /// One `field:value` line of `INFO section`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_value(&self.info(section), field)
    }

    /// Calls per command, from `INFO commandstats`.
    pub fn commandstats(&self) -> CommandStats {
        CommandStats::parse(&self.info("commandstats"))
    }

    /// Every key matching `pattern` (KEYS: test data sets are small).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.query(&["KEYS", pattern]);
        keys.sort();
        keys
    }

    pub fn dbsize(&self) -> u64 {
        self.query(&["DBSIZE"])
    }

    /// `PTTL key` in milliseconds (-2: no such key, -1: no expiry).
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(&["PTTL", key])
    }

    /// `TYPE key`.
    pub fn key_type(&self, key: &str) -> String {
        self.query(&["TYPE", key])
    }

    /// `HGETALL key` as field → value.
    pub fn hgetall(&self, key: &str) -> BTreeMap<String, String> {
        self.query(&["HGETALL", key])
    }

    fn into_sentinel(mut self) -> Self {
        self.role = Role::Sentinel;
        self
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.frozen {
            // A stopped process still dies of SIGKILL; resuming first is only tidier.
            let _ = self.child.as_ref().map(|c| {
                Command::new("kill")
                    .arg("-CONT")
                    .arg(c.id().to_string())
                    .status()
            });
        }
        self.stop();
    }
}

fn info_value(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == field).then(|| value.to_owned())
    })
}

/// Calls per command from `INFO commandstats` (`cmdstat_<name>:calls=N,...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandStats(pub BTreeMap<String, u64>);

impl CommandStats {
    pub fn parse(info: &str) -> Self {
        let mut calls = BTreeMap::new();
        for line in info.lines() {
            let Some(rest) = line.trim_end().strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let n = fields
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no calls= in commandstats line {line:?}"));
            calls.insert(name.to_owned(), n);
        }
        Self(calls)
    }

    pub fn calls(&self, command: &str) -> u64 {
        self.0.get(command).copied().unwrap_or(0)
    }

    /// Script invocations: EVALSHA + EVAL (and their read-only variants).
    pub fn scripts(&self) -> u64 {
        ["evalsha", "eval", "evalsha_ro", "eval_ro"]
            .iter()
            .map(|c| self.calls(c))
            .sum()
    }

    /// Calls of every command.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// Commands whose call count changed since `before`, with the increase.
    pub fn since(&self, before: &CommandStats) -> BTreeMap<String, u64> {
        self.0
            .iter()
            .filter_map(|(name, &n)| {
                let was = before.calls(name);
                (n != was).then(|| (name.clone(), n.saturating_sub(was)))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Redis Cluster: three masters, no replicas
// ---------------------------------------------------------------------------

/// A 3-master Redis Cluster covering all 16384 slots.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| {
                let mut node = RedisServer::unstarted_with(&format!("cluster node {i}"), &[]);
                let conf = node.dir().join("nodes.conf");
                node.extra = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    conf.to_str().expect("UTF-8 temp path").into(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ];
                node.launch();
                node
            })
            .collect();
        let cluster = Self { nodes };
        let mut cmd = Command::new(redis_cli_bin());
        cmd.args(["--cluster", "create"])
            .args(cluster.nodes.iter().map(RedisServer::host_port))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null());
        let out = run_with_timeout(cmd, TOPOLOGY_TIMEOUT);
        assert!(
            out.0.success(),
            "redis-cli --cluster create failed ({}):\n{}",
            out.0,
            out.1
        );
        cluster.wait_ok();
        cluster
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::host_port)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every node reports `cluster_state:ok`, knows all three nodes and sees
    /// every slot served.
    pub fn wait_ok(&self) -> Duration {
        let start = Instant::now();
        wait_for(
            "cluster_state:ok on every node",
            TOPOLOGY_TIMEOUT,
            || {
                self.nodes
                    .iter()
                    .all(|n| {
                        n.ping() && {
                            let info = n.info_cluster();
                            info_value(&info, "cluster_state").as_deref() == Some("ok")
                                && info_value(&info, "cluster_known_nodes").as_deref() == Some("3")
                                && info_value(&info, "cluster_slots_ok").as_deref() == Some("16384")
                        }
                    })
                    .then_some(())
            },
            || {
                self.nodes
                    .iter()
                    .map(|n| {
                        if n.ping() {
                            format!("port {}:\n{}", n.port, n.info_cluster())
                        } else {
                            format!("port {}: down", n.port)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        start.elapsed()
    }

    /// Kills node `i` and starts it again on the same port with its `nodes.conf` (it
    /// rejoins with its slots, empty); waits until the whole cluster is ok again.
    pub fn restart_node(&mut self, i: usize) -> Duration {
        let start = Instant::now();
        self.nodes[i].restart();
        self.wait_ok();
        start.elapsed()
    }

    /// Slot ranges and the index of the node serving each, from `CLUSTER NODES` of a
    /// running node.
    pub fn slot_ranges(&self) -> Vec<(u16, u16, usize)> {
        let asker = self
            .nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a running node");
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
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
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

    /// Index of the node serving `slot`.
    pub fn node_serving(&self, slot: u16) -> usize {
        let ranges = self.slot_ranges();
        ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|r| r.2)
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {ranges:?}"))
    }

    /// Index of the node holding `key`.
    pub fn node_of(&self, key: &str) -> usize {
        self.node_serving(key_slot(key))
    }
}

impl RedisServer {
    fn info_cluster(&self) -> String {
        self.try_connection(Duration::from_millis(500))
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
            .unwrap_or_default()
    }
}

/// Runs a command to completion within `timeout`; returns its status and combined output.
fn run_with_timeout(mut cmd: Command, timeout: Duration) -> (std::process::ExitStatus, String) {
    let dir = TempDir::new().expect("temp dir");
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path).expect("create output file");
    let err = out.try_clone().expect("clone output file");
    let mut child = cmd
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program()));
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("poll child") {
            return (
                status,
                std::fs::read_to_string(&out_path).unwrap_or_default(),
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{:?} did not finish within {timeout:?}:\n{}",
                cmd.get_program(),
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The Redis Cluster slot of `key` (CRC16-XMODEM of its hash tag, mod 16384).
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
    crc % 16384
}

// ---------------------------------------------------------------------------
// Sentinel: master, one replica, one sentinel
// ---------------------------------------------------------------------------

/// A master, a replica of it, and one sentinel monitoring it as `mymaster` (quorum 1,
/// down after 500 ms, failover timeout 3 s).
pub struct SentinelSet {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
}

impl SentinelSet {
    pub const MASTER_NAME: &'static str = SENTINEL_MASTER;

    pub fn start() -> Self {
        let master = RedisServer::start_with("master", &[]);
        let master_port = master.port.to_string();
        let replica =
            RedisServer::start_with("replica", &["--replicaof", "127.0.0.1", &master_port]);
        wait_for(
            "replica in sync with the master",
            TOPOLOGY_TIMEOUT,
            || {
                (replica
                    .info_field("replication", "master_link_status")
                    .as_deref()
                    == Some("up"))
                .then_some(())
            },
            || replica.info("replication"),
        );

        let mut sentinel = RedisServer::unstarted_with("sentinel", &[]).into_sentinel();
        let dir = sentinel.dir().to_str().expect("UTF-8 temp path").to_owned();
        let conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/redis.log\n\
             sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 1\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} 500\n\
             sentinel failover-timeout {SENTINEL_MASTER} 3000\n",
            port = sentinel.port,
        );
        std::fs::write(sentinel.dir().join("sentinel.conf"), conf).expect("write sentinel.conf");
        sentinel.launch();

        let set = Self {
            master,
            replica,
            sentinel,
        };
        wait_for(
            "sentinel reports the master and its replica in sync",
            TOPOLOGY_TIMEOUT,
            || {
                (set.master_port_by_sentinel() == Some(set.master.port)
                    && set.sentinel_sees_replica_ok(set.replica.port))
                .then_some(())
            },
            || set.describe(),
        );
        set
    }

    /// `mymaster,127.0.0.1:SENTINEL_PORT`.
    pub fn url(&self) -> String {
        format!("{SENTINEL_MASTER},{}", self.sentinel.host_port())
    }

    /// The master's port according to the sentinel.
    pub fn master_port_by_sentinel(&self) -> Option<u16> {
        let mut conn = self
            .sentinel
            .try_connection(Duration::from_millis(500))
            .ok()?;
        let addr: Option<Vec<String>> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(SENTINEL_MASTER)
            .query(&mut conn)
            .ok()?;
        addr?.get(1)?.parse().ok()
    }

    fn sentinel_replicas(&self) -> Vec<BTreeMap<String, String>> {
        let Ok(mut conn) = self.sentinel.try_connection(Duration::from_millis(500)) else {
            return Vec::new();
        };
        let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("replicas")
            .arg(SENTINEL_MASTER)
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
            r.get("port").map(String::as_str) == Some(&port.to_string())
                && r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
        })
    }

    fn describe(&self) -> String {
        format!(
            "sentinel says master port {:?}; replicas {:?}; sentinel log:\n{}",
            self.master_port_by_sentinel(),
            self.sentinel_replicas(),
            self.sentinel.log_tail()
        )
    }

    /// Kills the master and waits until the sentinel has promoted the replica (it reports
    /// the replica's address and the replica says `role:master`). Returns how long it took.
    pub fn kill_master_and_await_failover(&mut self) -> Duration {
        let start = Instant::now();
        self.master.stop();
        let replica_port = self.replica.port;
        wait_for(
            "sentinel failover to the replica",
            TOPOLOGY_TIMEOUT,
            || {
                (self.master_port_by_sentinel() == Some(replica_port)
                    && self.replica.info_field("replication", "role").as_deref() == Some("master"))
                .then_some(())
            },
            || self.describe(),
        );
        start.elapsed()
    }
}

// ---------------------------------------------------------------------------
// Rules shared by the Redis tests
// ---------------------------------------------------------------------------

pub const DOMAIN: &str = "rl";

/// Limits of the Redis tests, each for one purpose.
pub const RULES: &str = r#"
domain: rl
descriptors:
  # 5 per minute, the default sliding window (precision 10).
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  # 5 per hour, the reference's fixed window.
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  # 4 per hour: recovery probes, a fresh value per round.
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 4}
  # 5 per year: no sub-window closes while a test runs, so the store has no reason to
  # read anything in the background.
  - key: yearly
    rate_limit: {unit: year, requests_per_unit: 5}
  # Never reached: every request for it needs the store.
  - key: busy
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  # Accuracy runs: 200 per 2-second window (sub-windows of 200 ms).
  - key: acc
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 200}
"#;

pub const USER_LIMIT: usize = 5;
pub const USER_SHAPE: &str = "s60000000000.10";
pub const FIXED_LIMIT: usize = 5;
pub const FIXED_SHAPE: &str = "f3600000000000";
pub const PROBE_LIMIT: usize = 4;
pub const PROBE_SHAPE: &str = "s3600000000000.10";
pub const YEARLY_LIMIT: usize = 5;
pub const YEARLY_SHAPE: &str = "s31536000000000000.10";
pub const BUSY_SHAPE: &str = "s3600000000000.10";
pub const ACC_LIMIT: u64 = 200;
pub const ACC_SHAPE: &str = "s2000000000.10";
pub const ACC_WINDOW: Duration = Duration::from_secs(2);
pub const ACC_SUB_WINDOW: Duration = Duration::from_millis(200);

// ---------------------------------------------------------------------------
// Tollgate against Redis
// ---------------------------------------------------------------------------

/// `tollgate serve` with `--backend redis`, the given deployment type and URL, and extra
/// arguments (e.g. `--on-store-error deny`).
pub fn start_tollgate(yaml: &str, redis_type: &str, url: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--backend",
        "redis",
        "--redis-type",
        redis_type,
        "--redis-url",
        url,
    ];
    args.extend_from_slice(extra);
    Server::start_with_args(yaml, &args)
}

/// [`start_tollgate`], then waits until `/healthcheck/store` says the store is connected,
/// for tests whose subject is not what happens while it connects.
pub fn start_connected(yaml: &str, redis_type: &str, url: &str, extra: &[&str]) -> Server {
    let server = start_tollgate(yaml, redis_type, url, extra);
    wait_store_health(server.http_addr(), 200, Duration::from_secs(15));
    server
}

/// Polls `/healthcheck/store` (blocking) until it answers `want`; returns how long it took.
pub fn wait_store_health(http: SocketAddr, want: u16, timeout: Duration) -> Duration {
    let start = Instant::now();
    wait_for(
        &format!("/healthcheck/store answering {want}"),
        timeout,
        || (http_get(http, "/healthcheck/store").status == want).then_some(()),
        || format!("it answers {}", http_get(http, "/healthcheck/store").status),
    );
    start.elapsed()
}

/// The Redis key of a counter: `PREFIX{domain|key=value|…#shape}` (plain components only).
pub fn redis_key(prefix: &str, domain: &str, entries: &[(&str, &str)], shape: &str) -> String {
    let special = |s: &str| s.contains(['%', '|', '=', '#', '{', '}']);
    assert!(
        !special(domain) && entries.iter().all(|(k, v)| !special(k) && !special(v)),
        "redis_key only builds keys of components that need no escaping"
    );
    let mut key = format!("{prefix}{{{domain}");
    for (k, v) in entries {
        key.push_str(&format!("|{k}={v}"));
    }
    key.push('#');
    key.push_str(shape);
    key.push('}');
    key
}

/// One answer as the client saw it.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Wall-clock time the request was sent and the answer received.
    pub sent: SystemTime,
    pub received: SystemTime,
    pub took: Duration,
    /// The overall code, or the gRPC error code (DeadlineExceeded if it hung for [`HANG`]).
    pub result: Result<Code, tonic::Code>,
}

impl Answer {
    pub fn code(&self) -> Option<Code> {
        self.result.ok()
    }
}

/// One request with one descriptor, timed, never waiting longer than [`HANG`].
pub async fn timed_check(rls: &mut Rls, domain: &str, entries: &[(&str, &str)]) -> Answer {
    let req = request(domain, &[entries]);
    let sent = SystemTime::now();
    let start = Instant::now();
    let result = match tokio::time::timeout(HANG, rls.call(req)).await {
        Err(_) => Err(tonic::Code::DeadlineExceeded),
        Ok(Err(status)) => Err(status.code()),
        Ok(Ok(resp)) => Ok(Code::try_from(resp.overall_code)
            .unwrap_or_else(|_| panic!("unknown code in {resp:?}"))),
    };
    Answer {
        sent,
        received: SystemTime::now(),
        took: start.elapsed(),
        result,
    }
}

/// Sends `count` requests for one descriptor, one after another, round-robin over
/// `clients`; returns the results in order.
pub async fn round_robin(
    clients: &mut [Rls],
    domain: &str,
    entries: &[(&str, &str)],
    count: usize,
) -> Vec<Result<Code, tonic::Code>> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let n = clients.len();
        out.push(
            timed_check(&mut clients[i % n], domain, entries)
                .await
                .result,
        );
    }
    out
}

/// `limit` admissions followed by `extra` denials.
pub fn exactly(limit: usize, extra: usize) -> Vec<Result<Code, tonic::Code>> {
    let mut want = vec![Ok(Code::Ok); limit];
    want.extend(vec![Ok(Code::OverLimit); extra]);
    want
}

/// Polls, with a fresh descriptor `(key, PREFIX-i)` each round, until `limit + 2` requests
/// round-robin over `clients` give exactly `limit` OK and then OVER_LIMIT — limiting that is
/// exact across instances, which only a working shared store gives. Returns the time it
/// took and the number of rounds; panics after `timeout` with the last round's answers.
pub async fn await_exact_limiting(
    clients: &mut [Rls],
    domain: &str,
    key: &str,
    value_prefix: &str,
    limit: usize,
    timeout: Duration,
) -> (Duration, usize) {
    await_exact_limiting_with(clients, domain, key, limit, timeout, |round| {
        format!("{value_prefix}-{round}")
    })
    .await
}

/// [`await_exact_limiting`] with the value of each round from `value(round)` (rounds
/// count from 1; every value must be fresh).
pub async fn await_exact_limiting_with(
    clients: &mut [Rls],
    domain: &str,
    key: &str,
    limit: usize,
    timeout: Duration,
    mut value: impl FnMut(usize) -> String,
) -> (Duration, usize) {
    let start = Instant::now();
    let want = exactly(limit, 2);
    let mut round = 0;
    loop {
        round += 1;
        let value = value(round);
        let got = round_robin(clients, domain, &[(key, &value)], limit + 2).await;
        if got == want {
            return (start.elapsed(), round);
        }
        if start.elapsed() >= timeout {
            panic!(
                "limiting not exact across {} instances within {timeout:?} ({round} rounds); \
                 last round ({key}={value}): {got:?}",
                clients.len()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------
// Background load
// ---------------------------------------------------------------------------

/// Requests at a steady pace in the background, one spawned task per request (so a hung
/// call cannot hold back the next), round-robin over clients and over `values` values of
/// one key. Every answer is kept.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answers: std::sync::Arc<std::sync::Mutex<Vec<Answer>>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Load {
    pub fn start(
        clients: &[Rls],
        domain: &str,
        key: &str,
        values: Vec<String>,
        period: Duration,
    ) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let clients = clients.to_vec();
        let (domain, key) = (domain.to_owned(), key.to_owned());
        let driver = {
            let (stop, answers) = (stop.clone(), answers.clone());
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut tasks = tokio::task::JoinSet::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    ticker.tick().await;
                    let mut rls = clients[i % clients.len()].clone();
                    let value = values[i % values.len()].clone();
                    let (domain, key, answers) = (domain.clone(), key.clone(), answers.clone());
                    tasks.spawn(async move {
                        let answer = timed_check(&mut rls, &domain, &[(&key, &value)]).await;
                        answers.lock().expect("answers").push(answer);
                    });
                    i += 1;
                    // Reap finished tasks as we go.
                    while tasks.try_join_next().is_some() {}
                }
                while tasks.join_next().await.is_some() {}
            })
        };
        Self {
            stop,
            answers,
            driver,
        }
    }

    /// Answers received so far for requests sent at or after `since`.
    pub fn answered_since(&self, since: SystemTime) -> usize {
        self.answers
            .lock()
            .expect("answers")
            .iter()
            .filter(|a| a.sent >= since)
            .count()
    }

    /// Waits until at least `n` requests sent at or after `since` have been answered.
    pub async fn await_answers_since(&self, since: SystemTime, n: usize, timeout: Duration) {
        let start = Instant::now();
        loop {
            let got = self.answered_since(since);
            if got >= n {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "background load: only {got} of {n} answers within {timeout:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Stops sending, waits for every outstanding answer, and returns all answers in the
    /// order they were sent.
    pub async fn finish(self) -> Vec<Answer> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.driver.await.expect("load driver");
        let mut answers = std::mem::take(&mut *self.answers.lock().expect("answers"));
        answers.sort_by_key(|a| a.sent);
        answers
    }
}

/// Answers sent in `[from, to)`.
pub fn sent_between(answers: &[Answer], from: SystemTime, to: SystemTime) -> Vec<&Answer> {
    answers
        .iter()
        .filter(|a| a.sent >= from && a.sent < to)
        .collect()
}

/// Panics if any answer took longer than `limit`, naming the slowest.
pub fn assert_all_within(answers: &[Answer], limit: Duration, what: &str) {
    let slow: Vec<&Answer> = answers.iter().filter(|a| a.took > limit).collect();
    let slowest = answers.iter().map(|a| a.took).max().unwrap_or_default();
    assert!(
        slow.is_empty(),
        "{what}: {} of {} calls took longer than {limit:?} (slowest {slowest:?}), e.g. {:?}",
        slow.len(),
        answers.len(),
        &slow[..slow.len().min(5)]
    );
}

/// Counts of each result among `answers`.
/// Every answer was OK: with `--on-store-error local`, counters far from their limit are
/// admitted whether Redis answers or not.
pub fn assert_all_ok(answers: &[Answer]) {
    let failed: Vec<_> = answers
        .iter()
        .filter(|a| a.result != Ok(Code::Ok))
        .collect();
    assert!(
        failed.is_empty(),
        "--on-store-error local: every answer OK for counters far from their limit; got {:?}, e.g. {:?}",
        tally(answers),
        &failed[..failed.len().min(5)]
    );
}

pub fn tally<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in answers {
        *counts.entry(format!("{:?}", a.result)).or_insert(0) += 1;
    }
    counts
}

/// `GET /healthcheck/store` status, off the async runtime.
pub async fn store_health(http: SocketAddr) -> u16 {
    tokio::task::spawn_blocking(move || http_get(http, "/healthcheck/store").status)
        .await
        .expect("health check task")
}

/// Polls `/healthcheck/store` until it answers `want`; returns how long it took.
pub async fn await_store_health(http: SocketAddr, want: u16, timeout: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let status = store_health(http).await;
        if status == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "/healthcheck/store still {status} (want {want}) after {timeout:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------
// Accuracy under steady overload
// ---------------------------------------------------------------------------

/// Nanoseconds since the Unix epoch.
pub fn epoch_ns(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// The answers of a steady overload run, with the run's start (a window boundary).
pub struct OverloadRun {
    pub start: SystemTime,
    pub window: Duration,
    pub windows: u32,
    pub limit: u64,
    pub answers: Vec<Answer>,
}

/// Sends `factor × limit` requests per `window` at a steady pace for `windows` windows,
/// round-robin over `clients`, all for one descriptor, starting exactly at an epoch-aligned
/// window boundary (Tollgate's windows and sub-windows are aligned to the epoch, on the same
/// clock as this machine's, so the client can attribute answers to the store's windows).
/// The accuracy check of the issue: a steady 3× overload of the `acc` rule (value
/// `value`) spread round-robin over `servers` for three windows; every window within 1 %
/// of the limit and never above it.
pub async fn assert_accurate_under_overload(servers: &[Server], value: &str) -> OverloadRun {
    let mut clients = Vec::new();
    for s in servers {
        clients.push(s.client().await);
    }
    let run = steady_overload(
        &clients,
        DOMAIN,
        &[("acc", value)],
        ACC_LIMIT,
        ACC_WINDOW,
        3,
        3,
    )
    .await;
    eprintln!(
        "per window {:?}; admissions per sub-window {:?}; slowest {:?}",
        run.per_window(),
        run.histogram(ACC_SUB_WINDOW),
        run.slowest()
    );
    run.assert_accurate(ACC_LIMIT / 100, ACC_SUB_WINDOW);
    run
}

pub async fn steady_overload(
    clients: &[Rls],
    domain: &str,
    entries: &[(&str, &str)],
    limit: u64,
    window: Duration,
    windows: u32,
    factor: u64,
) -> OverloadRun {
    let window_ns = window.as_nanos();
    let now = SystemTime::now();
    // The next boundary at least 300 ms away, so that every task is ready when it comes.
    let mut start_ns = (epoch_ns(now) / window_ns + 1) * window_ns;
    if start_ns - epoch_ns(now) < 300_000_000 {
        start_ns += window_ns;
    }
    let wait =
        Duration::from_nanos(u64::try_from(start_ns - epoch_ns(now)).expect("wait fits in u64"));
    let start = UNIX_EPOCH + Duration::from_nanos(u64::try_from(start_ns).expect("fits"));
    let total = limit * factor * u64::from(windows);
    let period = window / u32::try_from(limit * factor).expect("rate fits in u32");

    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + wait, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    let entries: Vec<(String, String)> = entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for i in 0..total {
        ticker.tick().await;
        let mut rls = clients[usize::try_from(i).expect("fits") % clients.len()].clone();
        let domain = domain.to_owned();
        let entries = entries.clone();
        tasks.spawn(async move {
            let refs: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            timed_check(&mut rls, &domain, &refs).await
        });
    }
    let mut answers = Vec::with_capacity(usize::try_from(total).expect("fits"));
    while let Some(answer) = tasks.join_next().await {
        answers.push(answer.expect("request task"));
    }
    answers.sort_by_key(|a| a.sent);
    OverloadRun {
        start,
        window,
        windows,
        limit,
        answers,
    }
}

/// Admissions of one window of an overload run.
#[derive(Debug, Default, Clone, Copy)]
pub struct WindowCount {
    /// Admitted, sent and answered inside the window: the store decided inside it.
    pub certain: u64,
    /// Admitted, sent before or answered after the window while overlapping it: the
    /// decision may belong to this window or a neighbour.
    pub straddling: u64,
}

impl OverloadRun {
    fn window_of(&self, t: SystemTime) -> i128 {
        let offset = epoch_ns(t) as i128 - epoch_ns(self.start) as i128;
        offset.div_euclid(self.window.as_nanos() as i128)
    }

    /// Admissions per window of the run.
    pub fn per_window(&self) -> Vec<WindowCount> {
        let mut counts = vec![WindowCount::default(); self.windows as usize];
        for a in &self.answers {
            if a.result != Ok(Code::Ok) {
                continue;
            }
            let (first, last) = (self.window_of(a.sent), self.window_of(a.received));
            for w in first..=last {
                if let Some(count) = usize::try_from(w).ok().and_then(|w| counts.get_mut(w)) {
                    if first == last {
                        count.certain += 1;
                    } else {
                        count.straddling += 1;
                    }
                }
            }
        }
        counts
    }

    pub fn admitted(&self) -> u64 {
        self.answers
            .iter()
            .filter(|a| a.result == Ok(Code::Ok))
            .count() as u64
    }

    /// Answers that are neither OK nor OVER_LIMIT, and the slowest answer.
    pub fn failures(&self) -> Vec<&Answer> {
        self.answers
            .iter()
            .filter(|a| !matches!(a.result, Ok(Code::Ok) | Ok(Code::OverLimit)))
            .collect()
    }

    pub fn slowest(&self) -> Duration {
        self.answers
            .iter()
            .map(|a| a.took)
            .max()
            .unwrap_or_default()
    }

    /// Admissions per sub-window of `sub` length (by send time), for failure messages.
    pub fn histogram(&self, sub: Duration) -> Vec<u64> {
        let n = (self.window.as_nanos() * u128::from(self.windows) / sub.as_nanos()) as usize;
        let mut h = vec![0; n];
        for a in self.answers.iter().filter(|a| a.result == Ok(Code::Ok)) {
            let offset = epoch_ns(a.sent) as i128 - epoch_ns(self.start) as i128;
            if let Ok(i) = usize::try_from(offset.div_euclid(sub.as_nanos() as i128))
                && i < n
            {
                h[i] += 1;
            }
        }
        h
    }

    /// Checks a sliding-window run against what the algorithm guarantees (see the test
    /// files for the derivation):
    /// - every answer is OK or OVER_LIMIT, none slow;
    /// - no epoch-aligned window admits more than the limit (`certain ≤ limit`): exact,
    ///   because the window is a whole number of sub-windows and Redis never lets the
    ///   weighted count exceed the limit;
    /// - every window admits at least `limit − tolerance` (`certain + straddling`);
    /// - over the whole run, admitted ≤ limit × (run length / window + 1).
    pub fn assert_accurate(&self, tolerance: u64, sub: Duration) {
        let per_window = self.per_window();
        let context = || {
            format!(
                "limit {} per {:?}; per window {:?}; admissions per {:?} sub-window: {:?}; \
                 {} answers, slowest {:?}",
                self.limit,
                self.window,
                per_window,
                sub,
                self.histogram(sub),
                self.answers.len(),
                self.slowest()
            )
        };
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "{} answers were not OK/OVER_LIMIT, e.g. {:?}; {}",
            failures.len(),
            &failures[..failures.len().min(5)],
            context()
        );
        for (w, count) in per_window.iter().enumerate() {
            assert!(
                count.certain <= self.limit,
                "window {w} admitted {} > limit {}; {}",
                count.certain,
                self.limit,
                context()
            );
            assert!(
                count.certain + count.straddling + tolerance >= self.limit,
                "window {w} admitted only {} (+{} straddling) of {} (tolerance {tolerance}); {}",
                count.certain,
                count.straddling,
                self.limit,
                context()
            );
        }
        let first = self.answers.first().expect("answers").sent;
        let last = self
            .answers
            .iter()
            .map(|a| a.received)
            .max()
            .expect("answers");
        let run = last.duration_since(first).unwrap_or_default();
        let bound = self.limit as f64 * (run.as_secs_f64() / self.window.as_secs_f64() + 1.0);
        assert!(
            self.admitted() as f64 <= bound,
            "admitted {} over a {run:?} run > limit × (run / window + 1) = {bound}; {}",
            self.admitted(),
            context()
        );
    }
}
