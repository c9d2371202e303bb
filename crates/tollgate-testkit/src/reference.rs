//! The reference service, envoyproxy/ratelimit, as a black box beside Tollgate: where
//! `scripts/install-test-deps.sh` put it ([`installed`]), its rules in the runtime
//! directory layout it reads ([`RuntimeRoot`]), and its server on free loopback ports
//! with the environment a test gives ([`Reference`]).
//!
//! The reference is built from the Go module proxy at a pinned version, only when Go is
//! there: suites that need it skip without it, saying so ([`or_skip`]).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

use crate::grpc::Rls;
use crate::process::{Lines, Process};
use crate::{Error, free_ports, http, loopback};

/// How long the reference may take to answer on its ports.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Where `scripts/install-test-deps.sh` installs the Go binaries, relative to the
/// workspace: one directory per module and version, `NAME@VERSION/`.
const INSTALL_DIR: &str = "target/reference";

/// The reference's binaries and sources as installed.
#[derive(Debug)]
pub struct Installed {
    /// The reference's server (`src/service_cmd` of the module).
    pub server: PathBuf,
    /// The module's source directory (Go's module cache, read-only): its
    /// `integration-test/`, its `examples/`.
    pub module_dir: PathBuf,
    /// Prometheus's statsd_exporter, where the reference's own suite reads its metrics.
    pub statsd_exporter: PathBuf,
}

/// The installed reference: `$REFERENCE_BIN`, `$REFERENCE_MODULE_DIR` and
/// `$STATSD_EXPORTER_BIN` (scripts/test exports what the install script prints), else
/// what that script left under `target/reference/` with the module directory that `go env
/// GOMODCACHE` gives. `Err` says why there is none.
pub fn installed() -> Result<&'static Installed, String> {
    static FOUND: OnceLock<Result<Installed, String>> = OnceLock::new();
    FOUND.get_or_init(find).as_ref().map_err(Clone::clone)
}

fn find() -> Result<Installed, String> {
    let hint = "run scripts/install-test-deps.sh with Go on PATH (it installs the reference \
                from the Go module proxy), or set REFERENCE_BIN, REFERENCE_MODULE_DIR and \
                STATSD_EXPORTER_BIN";
    let installs = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(INSTALL_DIR);
    let server = from_env("REFERENCE_BIN")
        .or_else(|| newest_install(&installs, "ratelimit@", "service_cmd"))
        .ok_or_else(|| format!("no reference binary: {hint}"))?;
    if !server.is_file() {
        return Err(format!("{} is not a file: {hint}", server.display()));
    }
    let module_dir = match from_env("REFERENCE_MODULE_DIR") {
        Some(dir) => dir,
        None => module_cache_dir(&server).ok_or_else(|| {
            format!(
                "no source directory for the reference at {}: {hint}",
                server.display()
            )
        })?,
    };
    let statsd_exporter = from_env("STATSD_EXPORTER_BIN")
        .or_else(|| newest_install(&installs, "statsd_exporter@", "statsd_exporter"))
        .ok_or_else(|| format!("no statsd_exporter binary: {hint}"))?;
    if !statsd_exporter.is_file() {
        return Err(format!(
            "{} is not a file: {hint}",
            statsd_exporter.display()
        ));
    }
    let scripts = module_dir.join("integration-test/scripts");
    if !scripts.is_dir() {
        return Err(format!("{} is not a directory: {hint}", scripts.display()));
    }
    Ok(Installed {
        server,
        module_dir,
        statsd_exporter,
    })
}

fn from_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// `binary` in the most recently installed `PREFIX*` directory of `installs`.
fn newest_install(installs: &Path, prefix: &str, binary: &str) -> Option<PathBuf> {
    std::fs::read_dir(installs)
        .ok()?
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path().join(binary))
        .filter(|path| path.is_file())
        .max_by_key(|path| path.metadata().and_then(|m| m.modified()).ok())
}

/// The module's directory in Go's module cache, for a server installed in
/// `target/reference/ratelimit@VERSION/`.
fn module_cache_dir(server: &Path) -> Option<PathBuf> {
    let install = server.parent()?.file_name()?.to_str()?;
    let version = install.strip_prefix("ratelimit@")?;
    let mut cmd = Command::new("go");
    cmd.args(["env", "GOMODCACHE"]);
    let out = crate::process::run("go env", cmd, Duration::from_secs(30)).ok()?;
    let cache = PathBuf::from(out.stdout.trim());
    let dir = cache.join(format!("github.com/envoyproxy/ratelimit@{version}"));
    dir.is_dir().then_some(dir)
}

/// The installed reference, or `None` after a line on the test's stderr saying that
/// `test` is skipped and why. The line bypasses the test harness's capture, so that a
/// skip is seen even when the test passes.
pub fn or_skip(test: &str) -> Option<&'static Installed> {
    match installed() {
        Ok(installed) => Some(installed),
        Err(why) => {
            skipped(test, why);
            None
        }
    }
}

/// Says on the test's stderr, past the harness's capture, that `test` is skipped and why.
pub fn skipped(test: &str, why: impl std::fmt::Display) {
    let line = format!("SKIPPED {test}: {why}\n");
    // Nothing to do if stderr is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

// ---------------------------------------------------------------------------
// Rules
// ---------------------------------------------------------------------------

/// The reference's rule layout: `ROOT/SUBDIRECTORY/config/*.yaml`, read at startup from
/// `RUNTIME_ROOT` and `RUNTIME_SUBDIRECTORY` (Tollgate reads the same variables). A
/// temporary directory, removed on drop.
pub struct RuntimeRoot {
    dir: TempDir,
    subdirectory: String,
}

impl RuntimeRoot {
    /// An empty root with the subdirectory `ratelimit`, as in the reference's compose
    /// files, inside `parent` (e.g. under `target/`, to look at after a failure).
    pub fn new_in(parent: &Path) -> Self {
        std::fs::create_dir_all(parent).expect("create the parent of a runtime root");
        Self {
            dir: TempDir::new_in(parent).expect("create a runtime root"),
            subdirectory: "ratelimit".to_owned(),
        }
    }

    /// An empty root in the system's temporary directory.
    pub fn new() -> Self {
        Self::new_in(&std::env::temp_dir())
    }

    /// The root (`RUNTIME_ROOT`).
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The directory the rule files go in.
    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join(&self.subdirectory).join("config")
    }

    /// Writes rule file `name`; returns its path.
    pub fn write(&self, name: &str, yaml: &str) -> PathBuf {
        let dir = self.config_dir();
        std::fs::create_dir_all(&dir).expect("create the runtime config directory");
        let path = dir.join(name);
        std::fs::write(&path, yaml).expect("write a rule file");
        path
    }

    /// Copies every `*.yaml` file of `dir` into the config directory.
    pub fn copy_rules_from(&self, dir: &Path) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read the rule directory {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == "yaml") {
                let yaml = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                self.write(&entry.file_name().to_string_lossy(), &yaml);
            }
        }
    }

    /// `RUNTIME_ROOT` and `RUNTIME_SUBDIRECTORY` for this root.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "RUNTIME_ROOT".to_owned(),
                self.dir.path().display().to_string(),
            ),
            ("RUNTIME_SUBDIRECTORY".to_owned(), self.subdirectory.clone()),
        ]
    }
}

impl Default for RuntimeRoot {
    fn default() -> Self {
        Self::new()
    }
}

/// The reference's settings for counting in the redis-server at `redis` (`HOST:PORT`) on
/// the rules of `root`, with no statsd collector and warnings only in its log. Tollgate
/// reads the same variables.
pub fn plain_env(redis: &str, root: &RuntimeRoot) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("DISABLE_STATS", "true"),
        ("LOG_LEVEL", "warn"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("RUNTIME_WATCH_ROOT", "false"),
    ]
    .iter()
    .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
    .collect();
    env.extend(root.env());
    env
}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// Starts tried when a port was taken meanwhile.
const PORT_RACE_ATTEMPTS: u32 = 4;
/// How the reference says so.
const IN_USE: &str = "address already in use";

/// A running reference server on loopback; killed when dropped.
pub struct Reference {
    process: Process,
    /// `GRPC_PORT`: the rate-limit service.
    pub grpc: SocketAddr,
    /// `PORT`: `/healthcheck`, `/json`.
    pub http: SocketAddr,
    /// `DEBUG_PORT`: `/rlconfig`, `/stats`, pprof.
    pub debug: SocketAddr,
}

impl Reference {
    /// Starts the reference with a clean environment holding only `env` and its three
    /// listeners (`HOST`, `PORT`, `GRPC_HOST`, `GRPC_PORT`, `DEBUG_HOST`, `DEBUG_PORT`) on
    /// free loopback ports; ready once all three answer. Panics, with its output, if it
    /// does not get there.
    pub async fn start(installed: &Installed, env: &[(String, String)]) -> Self {
        let mut attempt = 1;
        loop {
            match Self::try_start(installed, env).await {
                Ok(reference) => return reference,
                // A free port can be taken by another process before the reference binds
                // it (the suites run in parallel): new ports, a few times.
                Err(e) if attempt < PORT_RACE_ATTEMPTS && e.to_string().contains(IN_USE) => {
                    attempt += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// [`Reference::start`], returning why it failed.
    pub async fn try_start(installed: &Installed, env: &[(String, String)]) -> Result<Self, Error> {
        // It listens with SO_REUSEPORT: two of its listeners given one port would both
        // bind it, and share its connections.
        let [grpc, http, debug] = free_ports().map(loopback);
        let mut cmd = Command::new(&installed.server);
        cmd.env_clear();
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        for (host, port, addr) in [
            ("HOST", "PORT", http),
            ("GRPC_HOST", "GRPC_PORT", grpc),
            ("DEBUG_HOST", "DEBUG_PORT", debug),
        ] {
            cmd.env(host, addr.ip().to_string())
                .env(port, addr.port().to_string());
        }
        let mut process = Process::start("the reference", cmd)?;
        process
            .await_answering(STARTUP_TIMEOUT, async || answering(http, grpc, debug).await)
            .await?;
        Ok(Self {
            process,
            grpc,
            http,
            debug,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Its log (logrus writes to stderr).
    pub fn log(&self) -> &Lines {
        self.process.stderr()
    }

    /// A rate-limit client on a connection of its own.
    pub async fn client(&self) -> Rls {
        let channel: Channel = Endpoint::from_shared(format!("http://{}", self.grpc))
            .expect("a valid endpoint URI")
            .connect_timeout(crate::grpc::TIMEOUT)
            .timeout(crate::grpc::TIMEOUT)
            .connect()
            .await
            .expect("connect to the reference's gRPC port");
        Rls::new(channel)
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- last lines of the log of the reference (grpc {}) ---\n{}",
                self.grpc,
                self.process.stderr().tail(40)
            );
        }
    }
}

/// Whether `/healthcheck` answers 200 and the gRPC and debug ports accept connections.
async fn answering(http: SocketAddr, grpc: SocketAddr, debug: SocketAddr) -> Result<(), String> {
    let health = http::send(http, http::Method::GET, "/healthcheck", &[], "").await?;
    if health.status != 200 {
        return Err(format!("/healthcheck answers {}", health.status));
    }
    for (name, addr) in [("gRPC", grpc), ("debug", debug)] {
        tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("{name} port {addr}: {e}"))?;
    }
    Ok(())
}
