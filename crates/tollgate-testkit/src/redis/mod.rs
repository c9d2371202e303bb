//! Real `redis-server` processes: one server here, a Cluster in [`cluster`], a sentinel
//! set in [`sentinel`], TLS in [`tls`]. A server, a Cluster and a sentinel set can run
//! Valkey instead ([`engine`]): where the test says so, or for every test that does not
//! say, with `TEST_REDIS_ENGINE=valkey`. Every server listens on a free 127.0.0.1 port
//! (never 6379: a user's machine may have its own Redis there, or none), keeps nothing on
//! disk, and is killed when dropped. Readiness, topology changes and recovery are
//! awaited as conditions.

pub mod cluster;
pub mod engine;
pub mod sentinel;
pub mod tls;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

pub use self::engine::Engine;
use crate::process::{Process, Signal};
use crate::wait::POLL;
use crate::{free_port, loopback};

/// How long a redis-server may take to answer PING once spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long cluster creation, sentinel discovery and failover may take.
pub const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);

/// What a process runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A data node, with its extra arguments after the standard ones.
    Data,
    /// A sentinel, from the `sentinel.conf` in its directory.
    Sentinel,
}

/// One `redis-server` on a fixed loopback port with a temporary directory of its own.
/// `stop` and `restart` keep both (a cluster node keeps its `nodes.conf`); data is not
/// persisted.
pub struct RedisServer {
    engine: Engine,
    name: String,
    port: u16,
    role: Role,
    extra: Vec<String>,
    dir: TempDir,
    process: Option<Process>,
    /// `--requirepass`, which the test's own connections use.
    password: Option<String>,
}

impl RedisServer {
    /// A standalone server of the [chosen](Engine::chosen) engine, answering PING.
    pub fn start() -> Self {
        Self::start_engine(Engine::chosen())
    }

    /// A standalone server of `engine`, named for it, answering PING.
    pub fn start_engine(engine: Engine) -> Self {
        Self::start_on(engine, engine.name(), &[])
    }

    /// A server of `engine` with extra arguments, answering PING. Takes another port if
    /// the chosen one was taken before the server could bind it.
    pub fn start_on(engine: Engine, name: &str, extra: &[&str]) -> Self {
        for _ in 0..5 {
            let mut server = Self::unstarted_on(engine, name, extra);
            match server.try_launch() {
                Ok(()) => return server,
                Err(why) if why.contains("Address already in use") => continue,
                Err(why) => panic!("{why}"),
            }
        }
        panic!(
            "{name}: five free ports in a row were taken before {} bound them",
            engine.name()
        )
    }

    /// A server of the [chosen](Engine::chosen) engine with a port and a directory that
    /// is not running yet (for "Redis is down when Tollgate starts");
    /// [`RedisServer::launch`] starts it.
    pub fn unstarted() -> Self {
        let engine = Engine::chosen();
        Self::unstarted_on(engine, engine.name(), &[])
    }

    fn unstarted_on(engine: Engine, name: &str, extra: &[&str]) -> Self {
        let password = extra
            .windows(2)
            .find(|w| w[0] == "--requirepass")
            .map(|w| w[1].to_owned());
        Self {
            engine,
            name: name.to_owned(),
            port: free_port(),
            role: Role::Data,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            dir: TempDir::new().expect("create a directory for redis-server"),
            process: None,
            password,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Which server runs: Redis or Valkey.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The TLS port, for a server started with one (`--tls-port`).
    pub fn tls_port(&self) -> Option<u16> {
        let at = self.extra.iter().position(|a| a == "--tls-port")?;
        self.extra.get(at + 1)?.parse().ok()
    }

    /// The port the server names to others: its TLS port if it has one (where it
    /// replicates and is monitored), else its port.
    pub fn announced_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// The redis-server's process id while it runs (benchmarks read its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        loopback(self.port).to_string()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.host_port())
    }

    fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// The last lines the server logged, for failure messages.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.stdout().tail(30))
            .unwrap_or_else(|| format!("{} is not running", self.name))
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(self.engine.binary());
        let dir = self.dir.path();
        match self.role {
            Role::Data => {
                cmd.arg("--port")
                    .arg(self.port.to_string())
                    .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    .args(["--daemonize", "no", "--dir"])
                    .arg(dir)
                    .args(&self.extra);
            }
            Role::Sentinel => {
                cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
            }
        }
        cmd
    }

    /// Starts the process on its port and waits until it answers PING.
    pub fn launch(&mut self) {
        // A restart may find the port briefly held (e.g. by a connection that used it as
        // its source port): keep trying until the start deadline.
        let deadline = Instant::now() + START_TIMEOUT;
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
        assert!(!self.is_running(), "{} is already running", self.name);
        let process = Process::start(&self.name, self.command()).unwrap_or_else(|e| {
            panic!(
                "{e}; install {} (and redis-cli), e.g. with scripts/install-test-deps.sh",
                self.engine.name()
            )
        });
        self.process = Some(process);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.running().exit_status() {
                let log = self.running().stdout().text();
                self.process = None;
                return Err(format!(
                    "{} on port {} exited before answering PING ({status}); log:\n{log}",
                    self.name, self.port
                ));
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let log = self.log_tail();
                self.stop();
                return Err(format!(
                    "{} on port {} did not answer PING within {START_TIMEOUT:?}; log:\n{log}",
                    self.name, self.port
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
        matches!(::redis::cmd("PING").query::<String>(&mut conn), Ok(pong) if pong == "PONG")
    }

    /// Kills the process (SIGKILL, as a crash would) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Kills the process and starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Stops the process with SIGSTOP: connections stay open, nothing answers.
    pub fn freeze(&mut self) {
        self.running().signal(Signal::Stop);
    }

    /// Resumes a frozen process.
    pub fn thaw(&mut self) {
        self.running().signal(Signal::Cont);
    }

    fn running(&mut self) -> &mut Process {
        let name = self.name.clone();
        self.process
            .as_mut()
            .unwrap_or_else(|| panic!("{name} is not running"))
    }

    /// A blocking connection whose connect, reads and writes each time out after `timeout`.
    fn try_connection(&self, timeout: Duration) -> ::redis::RedisResult<::redis::Connection> {
        self.try_connection_as(self.password.as_deref(), timeout)
    }

    fn try_connection_as(
        &self,
        password: Option<&str>,
        timeout: Duration,
    ) -> ::redis::RedisResult<::redis::Connection> {
        let url = match password {
            Some(password) => format!("redis://:{password}@{}", self.host_port()),
            None => self.url(),
        };
        let conn = ::redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// A blocking connection authenticated with `password` (`None`: none).
    pub fn connection_as(&self, password: Option<&str>) -> ::redis::Connection {
        self.try_connection_as(password, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect to {} on port {}: {e}", self.name, self.port))
    }

    /// Runs one command and returns its reply.
    pub fn query<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.try_query(args)
            .unwrap_or_else(|e| panic!("{args:?} on {} (port {}): {e}", self.name, self.port))
    }

    fn try_query<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> ::redis::RedisResult<T> {
        let mut cmd = ::redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.try_connection(Duration::from_secs(10))?)
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

    /// Every key matching `pattern`, sorted (KEYS: test data sets are small).
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.query(&["KEYS", pattern]);
        keys.sort();
        keys
    }

    pub fn exists(&self, key: &str) -> bool {
        self.query::<u64>(&["EXISTS", key]) == 1
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
}

/// The value of `field` in INFO output (`field:value` lines).
fn info_value(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == field).then(|| value.to_owned())
    })
}

/// Calls per command from `INFO commandstats` (`cmdstat_NAME:calls=N,…`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandStats(pub BTreeMap<String, u64>);

impl CommandStats {
    pub fn parse(info: &str) -> Self {
        let mut calls = BTreeMap::new();
        for line in info.lines() {
            let Some((name, fields)) = line
                .trim_end()
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(':'))
            else {
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

    /// Script invocations: EVALSHA and EVAL, and their read-only variants.
    pub fn scripts(&self) -> u64 {
        ["evalsha", "eval", "evalsha_ro", "eval_ro"]
            .iter()
            .map(|c| self.calls(c))
            .sum()
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
