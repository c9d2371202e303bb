//! A real PostgreSQL server: `initdb` into a temporary directory and `postgres` on a free
//! 127.0.0.1 port (never 5432: a user's machine may run its own there, or none), TCP only,
//! with password logins over TCP. PostgreSQL refuses to run as root, so when the tests
//! run as root the server runs as the `postgres` user. Binaries come from
//! `$POSTGRES_BIN_DIR`, else the newest `/usr/lib/postgresql/*/bin` (Debian's
//! `postgresql` package; scripts/install-test-deps.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::{Finished, Process, Signal, run};
use crate::{free_port, loopback};

/// How long initdb, a start or a stop may take.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The superuser's password.
pub const PASSWORD: &str = "tollgate-test";

/// The directory of `initdb`, `postgres` and `psql`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("POSTGRES_BIN_DIR") {
        return dir.into();
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server found in /usr/lib/postgresql/*/bin; install Debian's \
             postgresql package (scripts/install-test-deps.sh does) or set POSTGRES_BIN_DIR"
        )
    })
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program` from [`bin_dir`], run as `postgres` when we are root.
fn server_command(program: &str) -> Command {
    let binary = bin_dir().join(program);
    if running_as_root() {
        let mut cmd = Command::new("setpriv");
        // Changing user clears the parent-death signal the testkit sets; setpriv sets it
        // again after the change, so the server still dies with the test process.
        cmd.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--pdeathsig=SIGKILL",
            "--",
        ])
        .arg(binary);
        cmd
    } else {
        Command::new(binary)
    }
}

/// Hands `path` to the `postgres` user when the server will run as it.
fn give_to_server(path: &Path) {
    if !running_as_root() {
        return;
    }
    let name = c"postgres";
    // SAFETY: getpwnam reads a static buffer that we copy out of at once.
    let (uid, gid) = unsafe {
        let entry = libc::getpwnam(name.as_ptr());
        assert!(
            !entry.is_null(),
            "tests run as root, and PostgreSQL refuses root, but there is no `postgres` \
             user to run it as (Debian's postgresql package creates one)"
        );
        ((*entry).pw_uid, (*entry).pw_gid)
    };
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {} to postgres: {e}", path.display()));
}

/// A directory for a data directory, owned by the user the server runs as.
fn data_parent() -> TempDir {
    let dir = TempDir::new().expect("create a directory for PostgreSQL");
    give_to_server(dir.path());
    dir
}

/// Runs a PostgreSQL tool to its end; panics with its output if it fails.
fn finish(name: &str, command: Command) {
    let done = run(name, command, START_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        done.status.success(),
        "{name} failed: {}{}",
        done.stdout,
        done.stderr
    );
}

/// One PostgreSQL server with its own data directory, stopped when dropped.
pub struct PostgresServer {
    port: u16,
    dir: TempDir,
    process: Option<Process>,
    /// Commits wait for the WAL to reach the disk (PostgreSQL's defaults), instead of the
    /// tests' faster `fsync=off`.
    durable: bool,
}

impl PostgresServer {
    /// A fresh cluster, accepting connections.
    pub fn start() -> Self {
        Self::initialised(false)
    }

    /// [`Self::start`] with PostgreSQL's durable defaults (`fsync=on`,
    /// `synchronous_commit=on`): each counter update waits for a flush to the disk, as in
    /// production.
    pub fn start_durable() -> Self {
        Self::initialised(true)
    }

    fn initialised(durable: bool) -> Self {
        let dir = data_parent();
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, PASSWORD).expect("write the password file");
        let mut initdb = server_command("initdb");
        initdb
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-U", "postgres", "-E", "UTF8", "--no-sync"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()));
        finish("initdb", initdb);
        Self::launched(dir, durable)
    }

    /// A streaming-replication standby of `primary` (read-only until promoted), from a
    /// base backup, accepting connections.
    pub fn standby_of(primary: &PostgresServer) -> Self {
        let dir = data_parent();
        let mut backup = server_command("pg_basebackup");
        backup
            .arg("-d")
            .arg(format!(
                "postgresql://postgres:{PASSWORD}@{}",
                loopback(primary.port)
            ))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args(["-R", "-X", "stream", "--no-sync"]);
        finish("pg_basebackup", backup);
        Self::launched(dir, false)
    }

    /// Serves TLS with `issued` (from the testkit's [`crate::pki`]) from now on; plaintext
    /// logins still work.
    pub fn enable_tls(&self, issued: &crate::pki::Issued) {
        let data = self.dir.path().join("data");
        for (from, to) in [(&issued.cert, "server.crt"), (&issued.key, "server.key")] {
            let path = data.join(to);
            std::fs::copy(from, &path).unwrap_or_else(|e| panic!("copy {to}: {e}"));
            // PostgreSQL refuses a key others can read.
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap_or_else(|e| panic!("chmod {to}: {e}"));
            give_to_server(&path);
        }
        // ALTER SYSTEM cannot share a transaction, so one statement per call.
        self.psql("ALTER SYSTEM SET ssl = on");
        self.psql("SELECT pg_reload_conf()");
        crate::wait::until("PostgreSQL serving TLS", START_TIMEOUT, || {
            match self.psql("SHOW ssl").as_str() {
                "on" => Ok(()),
                other => Err(format!("ssl is {other}")),
            }
        });
    }

    /// Loads pg_stat_statements, which counts each statement's calls as they finish (the
    /// cumulative statistics system would report them seconds late): a restart.
    pub fn count_statements(&mut self) {
        self.psql("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'");
        self.stop();
        self.restart();
        self.psql("CREATE EXTENSION pg_stat_statements");
    }

    /// Calls so far of the statements that start with `prefix`, once
    /// [`Self::count_statements`] has loaded the counting.
    pub fn statement_calls(&self, prefix: &str) -> u64 {
        let escaped = prefix.replace('\'', "''");
        let calls = self.psql(&format!(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements \
             WHERE starts_with(query, '{escaped}')"
        ));
        calls
            .parse()
            .unwrap_or_else(|e| panic!("pg_stat_statements calls {calls:?}: {e}"))
    }

    /// Makes this standby the primary, and waits until it is.
    pub fn promote(&self) {
        assert_eq!(self.psql("SELECT pg_promote()"), "t", "promotion");
    }

    fn launched(dir: TempDir, durable: bool) -> Self {
        let mut server = Self {
            port: 0,
            dir,
            process: None,
            durable,
        };
        server.launch_on_free_port();
        server
    }

    fn launch_on_free_port(&mut self) {
        for _ in 0..5 {
            self.port = free_port();
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if why.contains("could not bind") || why.contains("in use") => continue,
                Err(why) => panic!("{why}"),
            }
        }
        panic!("five free ports in a row were taken before PostgreSQL bound them")
    }

    fn try_launch(&mut self) -> Result<(), String> {
        assert!(self.process.is_none(), "PostgreSQL is already running");
        let mut cmd = server_command("postgres");
        cmd.arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "unix_socket_directories=",
            ]);
        if !self.durable {
            // Test data need not survive a power cut.
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off"]);
        }
        let process = Process::start("postgres", cmd).map_err(|e| e.to_string())?;
        let process = self.process.insert(process);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let log = process.stderr().text();
            if log.contains("database system is ready to accept") {
                return Ok(());
            }
            if process.exit_status().is_some() || Instant::now() >= deadline {
                self.process = None;
                return Err(format!(
                    "PostgreSQL on port {} did not start; log:\n{log}",
                    self.port
                ));
            }
            std::thread::sleep(crate::wait::POLL);
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id while it runs (benchmarks read its CPU time; its backends
    /// are its children).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// A URL for the superuser, TLS off.
    pub fn url(&self) -> String {
        self.url_as("postgres", PASSWORD)
    }

    /// `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        loopback(self.port).to_string()
    }

    /// A URL for `user` with `password`, TLS off.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "postgres://{user}:{password}@{}/postgres?sslmode=disable",
            loopback(self.port)
        )
    }

    /// Runs `sql` with psql as the superuser; its output, unaligned, one row per line.
    pub fn psql(&self, sql: &str) -> String {
        let done = self.try_psql(sql);
        assert!(
            done.status.success(),
            "psql failed on {sql:?}: {}",
            done.stderr
        );
        done.stdout.trim().to_owned()
    }

    /// Runs `sql` with psql; how it ended.
    pub fn try_psql(&self, sql: &str) -> Finished {
        let mut cmd = Command::new(bin_dir().join("psql"));
        cmd.arg(self.url())
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]);
        run("psql", cmd, START_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A psql session that runs `sql` (e.g. `BEGIN; SELECT … FOR UPDATE`) and keeps its
    /// connection, and so its transaction and locks, until dropped.
    pub fn hold(&self, sql: &str) -> Process {
        let mut cmd = Command::new(bin_dir().join("psql"));
        // `\!` runs a shell command and waits: the session idles in its transaction. When
        // psql is killed its connection closes, and the server rolls back at once.
        cmd.arg(self.url())
            .args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .args(["-c", "\\echo held", "-c", "\\! sleep 600"]);
        let process = Process::start("psql", cmd).unwrap_or_else(|e| panic!("{e}"));
        process
            .stdout()
            .wait_for(|line| line == "held", START_TIMEOUT)
            .unwrap_or_else(|e| panic!("psql never ran {sql:?}: {e:?}"));
        process
    }

    /// Stops the server with a fast shutdown (clients cut off), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.signal(Signal::Int);
            if process.wait_timeout(START_TIMEOUT).is_none() {
                process.kill();
            }
        }
    }

    /// Starts the stopped server again on the same port, with its data.
    pub fn restart(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.try_launch() {
                Ok(()) => return,
                Err(why) if Instant::now() < deadline && why.contains("could not bind") => {
                    std::thread::sleep(crate::wait::POLL);
                }
                Err(why) => panic!("{why}"),
            }
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(process) = &mut self.process {
            // Immediate shutdown: its backends go with it. Nothing here may panic.
            if process.exit_status().is_none() {
                let pid = process.pid();
                if let Ok(pid) = libc::pid_t::try_from(pid) {
                    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
                    unsafe { libc::kill(pid, libc::SIGQUIT) };
                }
                process.wait_timeout(Duration::from_secs(10));
            }
        }
    }
}
