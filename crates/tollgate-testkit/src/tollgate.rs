//! The `tollgate` binary under test: where it is, rule directories, `check-config`, and
//! `serve` on OS-assigned loopback ports, ready once it prints
//! `tollgate listening grpc=ADDR http=ADDR`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

use crate::grpc::Rls;
use crate::http;
use crate::process::{self, Finished, NoLine, Process, Signal};
use crate::wait;
use crate::{Error, loopback};

/// How long a server may take to print its readiness line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a one-shot command (`check-config`) may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `serve` waits for a Redis that does not answer before it serves without it:
/// the server's fixed first-connect window. See [`Serve::start_without_store`].
pub const FIRST_CONNECT: Duration = Duration::from_secs(3);
/// How long a server may take to report its store connected.
pub const STORE_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

const READY_PREFIX: &str = "tollgate listening ";

/// The built `tollgate` binary: `$TOLLGATE_BIN`, else `tollgate` in the directory above
/// the running executable's (cargo puts test and bench executables in
/// `target/PROFILE/deps` and binaries in `target/PROFILE`, and builds the binaries of a
/// package before its tests and benches).
pub fn binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("TOLLGATE_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe()?;
    let candidate = exe
        .parent()
        .and_then(Path::parent)
        .map(|profile_dir| profile_dir.join("tollgate"))
        .filter(|path| path.is_file());
    candidate.ok_or_else(|| {
        Error::new(format!(
            "no tollgate binary next to {}: build it (cargo build), or set TOLLGATE_BIN",
            exe.display()
        ))
    })
}

/// A `tollgate` command with a clean environment, so that variables of the machine that
/// runs the tests (PORT, HOST, REDIS_URL, …) cannot leak in.
pub fn command() -> Command {
    let binary = binary().unwrap_or_else(|e| panic!("{e}"));
    command_at(&binary)
}

/// [`command`] for the binary at `binary`.
pub fn command_at(binary: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.env_clear();
    // The debug port's default is the reference's fixed 6070 on every interface: tests
    // that want it name a free loopback port.
    cmd.env("DEBUG_PORT", "off");
    // `LEASES=false cargo test` runs a suite with leasing off (a test may still set it).
    if let Some(leases) = std::env::var_os("LEASES") {
        cmd.env("LEASES", leases);
    }
    cmd
}

/// `tollgate serve` on the given addresses and no rules path: the environment says where
/// the rules come from (xDS).
pub fn serve_on(grpc: &str, http: &str) -> Command {
    let mut cmd = command();
    cmd.args(["serve", "--grpc-addr", grpc, "--http-addr", http]);
    cmd
}

/// [`serve_on`] on OS-assigned loopback ports.
pub fn serve_from_env() -> Command {
    serve_on("127.0.0.1:0", "127.0.0.1:0")
}

/// `tollgate check-config PATH`.
pub fn check_config(path: &Path) -> Finished {
    let mut cmd = command();
    cmd.arg("check-config").arg(path);
    process::run("tollgate check-config", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------
// Rule files
// ---------------------------------------------------------------------------

/// A temporary directory of rule files; removed on drop.
pub struct ConfigDir {
    dir: TempDir,
}

impl ConfigDir {
    pub fn new() -> Self {
        Self {
            dir: TempDir::new().expect("create a temporary config directory"),
        }
    }

    /// A directory holding the single file `name`.
    pub fn with_file(name: &str, contents: &str) -> Self {
        let dir = Self::new();
        dir.write(name, contents);
        dir
    }

    /// Writes `contents` to `relative` (creating parent directories); returns its path.
    pub fn write(&self, relative: &str, contents: &str) -> PathBuf {
        let path = self.file(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create a config subdirectory");
        }
        std::fs::write(&path, contents).expect("write a config file");
        path
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }
}

impl Default for ConfigDir {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------
// Starting servers
// ---------------------------------------------------------------------------

/// How to start one `tollgate serve`: a command and the rule directory it must outlive.
pub struct Serve {
    command: Command,
    config: Option<ConfigDir>,
}

impl Serve {
    /// Serves `yaml` as the only rule file.
    pub fn rules(yaml: &str) -> Self {
        let config = ConfigDir::with_file("rules.yaml", yaml);
        Self::path(&config.file("rules.yaml")).keep(config)
    }

    /// Serves the rule file or directory at `config` on OS-assigned loopback ports.
    pub fn path(config: &Path) -> Self {
        Self::custom(command()).serve_path(config)
    }

    /// [`Serve::path`] with the binary at `binary`.
    pub fn with_binary(binary: &Path, config: &Path) -> Self {
        Self::custom(command_at(binary)).serve_path(config)
    }

    /// Runs `command` as it is: the caller chose every argument.
    pub fn custom(command: Command) -> Self {
        Self {
            command,
            config: None,
        }
    }

    fn serve_path(mut self, config: &Path) -> Self {
        self.command.arg("serve").arg("--config").arg(config).args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ]);
        self
    }

    /// Keeps `config` until the server is gone.
    pub fn keep(mut self, config: ConfigDir) -> Self {
        self.config = Some(config);
        self
    }

    pub fn args<S: AsRef<std::ffi::OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.command.env(key, value);
        self
    }

    /// Counters in Redis: `--backend redis --redis-type TYPE --redis-url URL`.
    pub fn redis(self, redis_type: &str, url: &str) -> Self {
        self.args([
            "--backend",
            "redis",
            "--redis-type",
            redis_type,
            "--redis-url",
            url,
        ])
    }

    /// Counters in PostgreSQL: `--backend postgres --postgres-url URL`.
    pub fn postgres(self, url: &str) -> Self {
        self.args(["--backend", "postgres", "--postgres-url", url])
    }

    /// Starts the process without waiting for it: several can start at once.
    pub fn spawn(self) -> Result<Starting, Error> {
        Ok(Starting {
            process: Process::start("tollgate serve", self.command)?,
            config: self.config,
        })
    }

    /// Starts the server and waits until it is ready; panics with its output if it is not.
    pub fn start(self) -> Server {
        self.try_start().unwrap_or_else(|exit| fail_start(&exit))
    }

    /// Starts the server and waits until it is ready, or returns how it exited.
    pub fn try_start(self) -> Result<Server, Box<Finished>> {
        self.spawn().unwrap_or_else(|e| panic!("{e}")).ready()
    }

    /// Starts the server expecting startup to fail: how it exited. A server that serves
    /// fails the test, which says what it should have refused.
    pub fn refused(self, what: &str) -> Finished {
        match self.try_start() {
            Ok(server) => panic!("{what}: served on {:?}", server.addrs),
            Err(finished) => *finished,
        }
    }

    /// Starts a server whose Redis will not answer (down, refusing the password, not
    /// trusted): it serves only once its first-connect window ([`FIRST_CONNECT`]) is
    /// over. Every such start in the suites goes through here, so that a setting for that
    /// window, once the server has one, needs adding in one place.
    pub fn start_without_store(self) -> Server {
        start_all_without_store([self]).remove(0)
    }

    /// Starts the server and waits until `/healthcheck/store` says its store is connected.
    pub async fn start_connected(self) -> Server {
        let server = self.start();
        server.await_store_health(200, STORE_CONNECT_TIMEOUT).await;
        server
    }
}

/// [`Serve::start_without_store`] for several servers, started at once so that their
/// first-connect windows overlap.
pub fn start_all_without_store(serves: impl IntoIterator<Item = Serve>) -> Vec<Server> {
    let starting: Vec<Starting> = serves
        .into_iter()
        .map(|serve| serve.spawn().unwrap_or_else(|e| panic!("{e}")))
        .collect();
    starting
        .into_iter()
        .map(|s| s.ready().unwrap_or_else(|exit| fail_start(&exit)))
        .collect()
}

/// A `tollgate serve` that has been spawned and may not be ready yet.
pub struct Starting {
    process: Process,
    config: Option<ConfigDir>,
}

impl Starting {
    /// Signals the process before it is ready (e.g. SIGTERM while it waits for rules).
    pub fn signal(&mut self, signal: Signal) {
        self.process.signal(signal);
    }

    /// Waits for the process to exit by itself and returns its output.
    pub fn wait_exit(self, timeout: Duration) -> Finished {
        self.process
            .wait_exit(timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits for the readiness line; `Err` with the output if the process exits first.
    /// Panics on a timeout or a malformed line.
    pub fn ready(self) -> Result<Server, Box<Finished>> {
        let line = self
            .process
            .stdout()
            .wait_for(|l| l.starts_with(READY_PREFIX), STARTUP_TIMEOUT);
        match line {
            Ok(line) => {
                let addrs = parse_ready_line(&line)
                    .unwrap_or_else(|| panic!("malformed readiness line: {line:?}"));
                Ok(Server {
                    process: self.process,
                    addrs,
                    _config: self.config,
                })
            }
            Err(NoLine::Closed) => Err(Box::new(self.process.stop())),
            Err(NoLine::TimedOut) => panic!(
                "tollgate printed no readiness line within {STARTUP_TIMEOUT:?}; stdout:\n{}stderr:\n{}",
                self.process.stdout().text(),
                self.process.stderr().text()
            ),
        }
    }
}

/// The two addresses of the readiness line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listening {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

impl Listening {
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// A gRPC channel to the server.
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.grpc))
            .expect("a valid endpoint URI")
            .connect_timeout(crate::grpc::TIMEOUT)
            .timeout(crate::grpc::TIMEOUT)
            .connect()
            .await
            .expect("connect to tollgate's gRPC listener")
    }

    /// A rate-limit client on a channel of its own.
    pub async fn client(&self) -> Rls {
        Rls::new(self.channel().await)
    }

    /// `GET path` on the HTTP port.
    pub async fn get(&self, path: &str) -> http::Response {
        http::get(self.http, path).await
    }

    /// The value of the first `/metrics` series that starts with `series` (a name, or a
    /// name with labels), if there is one.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let page = self.get("/metrics").await;
        assert_eq!(page.status, 200, "GET /metrics: {page:?}");
        metric_value(&page.body, series)
    }

    /// `GET /healthcheck/store`'s status.
    pub async fn store_health(&self) -> u16 {
        self.get("/healthcheck/store").await.status
    }

    /// How many times the store came up, to compare after trouble with
    /// [`Server::assert_never_down_since`].
    pub async fn store_ups(&self) -> Option<f64> {
        self.metric("tollgate_store_reconnects_total").await
    }

    /// The store is up and was never reported down since it had come up `ups` times.
    pub async fn assert_never_down_since(&self, ups: Option<f64>) {
        assert_eq!(self.store_health().await, 200, "the store is up");
        assert_eq!(self.store_ups().await, ups, "never reported down meanwhile");
    }

    /// Both on 127.0.0.1, on ports the OS gave, and different.
    pub fn on_ipv4_loopback(&self) -> bool {
        let given = |addr: SocketAddr| addr.ip() == loopback(0).ip() && addr.port() != 0;
        given(self.grpc) && given(self.http) && self.grpc != self.http
    }
}

/// Parses `tollgate listening grpc=ADDR http=ADDR` exactly.
pub fn parse_ready_line(line: &str) -> Option<Listening> {
    let rest = line.strip_prefix(READY_PREFIX)?;
    let (grpc, http) = rest.split_once(' ')?;
    Some(Listening {
        grpc: grpc.strip_prefix("grpc=")?.parse().ok()?,
        http: http.strip_prefix("http=")?.parse().ok()?,
    })
}

/// Panics with the output of a server that exited before it was ready.
fn fail_start(exit: &Finished) -> ! {
    panic!(
        "tollgate exited before it was ready ({}); stdout:\n{}stderr:\n{}",
        exit.status, exit.stdout, exit.stderr
    )
}

// ---------------------------------------------------------------------------
// A running server
// ---------------------------------------------------------------------------

/// A running `tollgate serve`; killed when dropped.
pub struct Server {
    process: Process,
    pub addrs: Listening,
    _config: Option<ConfigDir>,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The process's resident memory in bytes (`VmRSS` of `/proc/PID/status`).
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_else(|e| panic!("read the status of tollgate {}: {e}", self.pid()));
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1_024)
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }

    /// What the server wrote to stderr so far and still writes (its log).
    pub fn stderr(&self) -> &crate::process::Lines {
        self.process.stderr()
    }

    /// Lines on stdout other than the readiness line (there should be none).
    pub fn other_stdout(&self) -> Vec<String> {
        let mut lines = self.process.stdout().all();
        lines.retain(|l| !l.starts_with(READY_PREFIX));
        lines
    }

    pub fn signal(&mut self, signal: Signal) {
        self.process.signal(signal);
    }

    /// Polls `/healthcheck/store` until it answers `want`; returns how long it took.
    pub async fn await_store_health(&self, want: u16, timeout: Duration) -> Duration {
        let what = format!("/healthcheck/store answering {want}");
        let ((), took) =
            wait::until_async(&what, timeout, async || match self.store_health().await {
                status if status == want => Ok(()),
                status => Err(format!("it answers {status}")),
            })
            .await;
        took
    }

    /// Waits for the server to exit by itself (after a signal) and returns its output.
    pub fn wait_exit(self, timeout: Duration) -> Finished {
        self.process
            .wait_exit(timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// How the server exited, if it has.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.process.exit_status()
    }

    /// Kills the server and returns its output.
    pub fn stop(self) -> Finished {
        self.process.stop()
    }
}

/// A server's addresses, and the clients of them ([`Listening::client`], [`Listening::get`]).
impl std::ops::Deref for Server {
    type Target = Listening;

    fn deref(&self) -> &Listening {
        &self.addrs
    }
}

/// The value of the first line of a Prometheus page that starts with `series` followed by
/// a space or a label set.
pub fn metric_value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find(|line| {
            line.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}
