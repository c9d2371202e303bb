//! Child processes that never outlive the test process.
//!
//! A test can end without running a single destructor: its binary times out and is
//! SIGKILLed, or aborts. Its redis-servers, Envoys and Tollgates must die with it, or they
//! keep their ports and CPU for good. On Linux every child is therefore spawned with
//! `prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills it when its parent dies.
//!
//! The kernel means the parent *thread*: the signal fires when the thread that forked the
//! child exits, and the test harness runs every test on a thread of its own that ends
//! with the test. So children are not forked by the caller but by one spawner thread that
//! lives as long as the process, and that receives its commands over a channel.
//!
//! [`Process`] wraps a child: its stdout and stderr are read line by line as they come,
//! it can be signalled (with `libc::kill`, no `kill` command needed) and awaited with a
//! deadline, and it is killed and reaped when dropped. [`run`] runs a one-shot command,
//! and [`blocking`] a start or stop from an async test.

use std::io::{self, BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::Error;

/// How often an exit is polled for (there is no portable wait with a timeout).
const EXIT_POLL: Duration = Duration::from_millis(5);
/// How long the output pipes may stay open after the process exited (a grandchild could
/// hold them) before the output is taken as it is.
const PIPE_LINGER: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------
// The spawner thread
// ---------------------------------------------------------------------------

/// A command for the spawner thread and where to send the child.
struct SpawnRequest {
    command: Command,
    reply: Sender<io::Result<Child>>,
}

/// Spawns `command` from the spawner thread (see the module documentation), so that the
/// child is SIGKILLed when this process dies, however it dies.
pub fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Result<Sender<SpawnRequest>, String>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for mut request in rx {
                    // The caller may have given up waiting; then the child is dropped.
                    let _ = request.reply.send(spawn_here(&mut request.command));
                }
            })
            .map(|_| tx)
            .map_err(|e| format!("cannot start the spawner thread: {e}"))
    });
    let spawner = spawner.as_ref().map_err(|e| io::Error::other(e.clone()))?;
    let (reply, child) = mpsc::channel();
    spawner
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    child
        .recv()
        .map_err(|_| io::Error::other("the spawner thread dropped a request"))?
}

#[cfg(target_os = "linux")]
fn spawn_here(command: &mut Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
    // SAFETY: the closure runs in the child between fork and exec, and only calls
    // async-signal-safe functions (prctl, getppid) and builds errors without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(io::Error::last_os_error());
            }
            // Had the parent died before prctl, nothing would ever signal this child.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    command.spawn()
}

#[cfg(not(target_os = "linux"))]
fn spawn_here(command: &mut Command) -> io::Result<Child> {
    command.spawn()
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

/// The lines a child wrote to one pipe, read on a thread as they come. Nothing is lost:
/// waiting for a line leaves every line in place for later reads.
#[derive(Clone)]
pub struct Lines {
    shared: Arc<(Mutex<Captured>, Condvar)>,
}

/// What the reader thread has collected so far.
#[derive(Default)]
struct Captured {
    lines: Vec<String>,
    /// The pipe reached end of file (the process exited, or closed it).
    closed: bool,
}

/// Why [`Lines::wait_for`] found no matching line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLine {
    /// The pipe closed first.
    Closed,
    /// The deadline passed first.
    TimedOut,
}

impl Lines {
    fn capture(pipe: Option<impl Read + Send + 'static>) -> Self {
        let lines = Self {
            shared: Arc::default(),
        };
        let Some(pipe) = pipe else {
            lines.lock().closed = true;
            return lines;
        };
        let writer = lines.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            // A read error ends the capture like end of file does.
            while matches!(reader.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
                let line = String::from_utf8_lossy(&buf);
                writer.push(line.trim_end_matches(['\n', '\r']).to_owned());
                buf.clear();
            }
            writer.lock().closed = true;
            writer.shared.1.notify_all();
        });
        lines
    }

    fn lock(&self) -> MutexGuard<'_, Captured> {
        // A reader thread cannot panic while holding the lock; recover the data if it did.
        self.shared
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, line: String) {
        self.lock().lines.push(line);
        self.shared.1.notify_all();
    }

    /// Every line so far.
    pub fn all(&self) -> Vec<String> {
        self.lock().lines.clone()
    }

    /// Every line so far, each ended by a newline.
    pub fn text(&self) -> String {
        self.lock().lines.iter().map(|l| format!("{l}\n")).collect()
    }

    /// The last `n` lines, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let captured = self.lock();
        let from = captured.lines.len().saturating_sub(n);
        captured.lines[from..].join("\n")
    }

    /// Waits up to `timeout` for a line (already written or still to come) that `matches`.
    pub fn wait_for(
        &self,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String, NoLine> {
        self.wait_for_count(matches, 1, timeout)
    }

    /// Waits up to `timeout` until `count` lines (already written or still to come)
    /// match; the last of them.
    pub fn wait_for_count(
        &self,
        matches: impl Fn(&str) -> bool,
        count: usize,
        timeout: Duration,
    ) -> Result<String, NoLine> {
        let deadline = Instant::now() + timeout;
        let mut captured = self.lock();
        let (mut seen, mut found) = (0, 0);
        loop {
            for line in &captured.lines[seen..] {
                found += usize::from(matches(line));
                if found >= count {
                    return Ok(line.clone());
                }
            }
            seen = captured.lines.len();
            if captured.closed {
                return Err(NoLine::Closed);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NoLine::TimedOut);
            }
            captured = self
                .shared
                .1
                .wait_timeout(captured, left)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    /// Waits up to `timeout` for the pipe to close; true if it did.
    fn wait_closed(&self, timeout: Duration) -> bool {
        let captured = self.lock();
        let (captured, _) = self
            .shared
            .1
            .wait_timeout_while(captured, timeout, |c| !c.closed)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        captured.closed
    }
}

/// How a process ended, and everything it printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A signal a test sends to a child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    /// PostgreSQL's fast shutdown: clients cut off, then a clean exit.
    Int,
    Hup,
    /// Stops the process: its connections stay open, nothing answers.
    Stop,
    Cont,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Int => libc::SIGINT,
            Signal::Hup => libc::SIGHUP,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

impl Signal {
    /// Sends the signal to process `pid`, which the caller knows to be alive and its
    /// own (a pid may be reused once reaped); panics, naming it `whom`, if it cannot.
    fn send_to(self, pid: libc::pid_t, whom: &str) {
        // SAFETY: kill has no memory-safety preconditions.
        let sent = unsafe { libc::kill(pid, self.number()) };
        assert_eq!(
            sent,
            0,
            "kill({pid}, {self:?}) of {whom}: {}",
            io::Error::last_os_error()
        );
    }
}

/// Sends `signal` to this process (for a test of its own signal handling).
pub fn signal_self(signal: Signal) {
    let pid = libc::pid_t::try_from(std::process::id()).expect("a pid fits in pid_t");
    signal.send_to(pid, "this process");
}

/// A running child with its output captured; killed and reaped when dropped.
pub struct Process {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    stdout: Lines,
    stderr: Lines,
}

impl Process {
    /// Starts `command` (named `name` in messages) with stdin closed and stdout and
    /// stderr captured.
    pub fn start(name: &str, mut command: Command) -> Result<Self, Error> {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let program = command.get_program().to_owned();
        let mut child = spawn(command)
            .map_err(|e| Error::new(format!("cannot start {name} ({program:?}): {e}")))?;
        let stdout = Lines::capture(child.stdout.take());
        let stderr = Lines::capture(child.stderr.take());
        Ok(Self {
            name: name.to_owned(),
            child,
            status: None,
            stdout,
            stderr,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&self) -> &Lines {
        &self.stdout
    }

    pub fn stderr(&self) -> &Lines {
        &self.stderr
    }

    /// Sends `signal` to the process; panics if it has exited (its pid may be reused).
    pub fn signal(&mut self, signal: Signal) {
        assert!(
            self.exit_status().is_none(),
            "{} has exited; not sending {signal:?}",
            self.name
        );
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits in pid_t");
        // The pid is our unreaped child.
        signal.send_to(pid, &self.name);
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            // An error here means the child was reaped already, which only we could do.
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits up to `timeout` for the process to exit by itself; `None` if it still runs.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(EXIT_POLL);
        }
    }

    /// Polls `answering` (e.g. "its ports answer") until it returns `Ok`; fails, quoting
    /// the process's stderr, if the process exits first or `timeout` passes.
    pub async fn await_answering(
        &mut self,
        timeout: Duration,
        mut answering: impl AsyncFnMut() -> Result<(), String>,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Err(Error::new(format!(
                    "{} exited ({status}) while starting; stderr:\n{}",
                    self.name,
                    self.stderr.text()
                )));
            }
            match answering().await {
                Ok(()) => return Ok(()),
                Err(state) if Instant::now() >= deadline => {
                    return Err(Error::new(format!(
                        "{} did not answer within {timeout:?} ({state}); stderr:\n{}",
                        self.name,
                        self.stderr.text()
                    )));
                }
                Err(_) => tokio::time::sleep(crate::wait::POLL).await,
            }
        }
    }

    /// Kills the process (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.exit_status() {
            return status;
        }
        // Fails only if it exited meanwhile; wait reaps it either way.
        let _ = self.child.kill();
        let status = self.child.wait().expect("reap a killed child");
        self.status = Some(status);
        status
    }

    /// Waits up to `timeout` for the process to exit by itself and returns its output;
    /// kills it and fails if it does not.
    pub fn wait_exit(mut self, timeout: Duration) -> Result<Finished, Error> {
        match self.wait_timeout(timeout) {
            Some(status) => Ok(self.finished(status)),
            None => {
                let status = self.kill();
                let output = self.finished(status);
                Err(Error::new(format!(
                    "{} did not exit within {timeout:?}; stdout:\n{}stderr:\n{}",
                    self.name, output.stdout, output.stderr
                )))
            }
        }
    }

    /// Kills the process and returns its output.
    pub fn stop(mut self) -> Finished {
        let status = self.kill();
        self.finished(status)
    }

    fn finished(&self, status: ExitStatus) -> Finished {
        // The readers see end of file right after the exit, unless a grandchild holds a pipe.
        self.stdout.wait_closed(PIPE_LINGER);
        self.stderr.wait_closed(PIPE_LINGER);
        Finished {
            status,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            // SIGKILL also ends a stopped (SIGSTOP) process. Nothing here may panic: a
            // drop during a test's unwinding would abort the whole test binary.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a blocking call (a process start or stop, psql, a topology change) without
/// stalling the runtime's other tasks, such as a background load; on a multi-threaded
/// runtime only.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Runs a command that should exit by itself within `timeout`, and returns its output.
pub fn run(name: &str, command: Command, timeout: Duration) -> Result<Finished, Error> {
    Process::start(name, command)?.wait_exit(timeout)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Set in the environment of the helper run of [`children_die_with_the_test_process`].
    const HELPER: &str = "TESTKIT_ORPHAN_HELPER";

    fn sleeper() -> Command {
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        cmd
    }

    fn alive(pid: u32) -> bool {
        let pid = libc::pid_t::try_from(pid).expect("a pid fits in pid_t");
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    /// The thread that asks for a child may end at once (each test runs on a thread of
    /// its own): the child must not die with it.
    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let mut child = std::thread::spawn(|| Process::start("sleep", sleeper()))
            .join()
            .expect("the asking thread")
            .expect("start sleep");
        assert_eq!(child.wait_timeout(Duration::from_millis(300)), None);
    }

    /// A test binary that dies without running a destructor (here: abort) takes its
    /// children with it. The test re-runs itself as the helper that spawns and aborts.
    #[test]
    fn children_die_with_the_test_process() {
        if std::env::var_os(HELPER).is_some() {
            let child = Process::start("sleep", sleeper()).expect("start sleep");
            println!("child pid {}", child.pid());
            std::process::abort();
        }
        let mut helper = Command::new(std::env::current_exe().expect("the test binary"));
        helper
            .args([
                "--exact",
                "process::tests::children_die_with_the_test_process",
            ])
            .args(["--nocapture", "--test-threads", "1"])
            .env(HELPER, "1");
        let finished = run("helper", helper, Duration::from_secs(30)).expect("run the helper");
        assert!(
            !finished.status.success(),
            "the helper aborts: {finished:?}"
        );
        let pid: u32 = finished
            .stdout
            .lines()
            .find_map(|l| l.split("child pid ").nth(1))
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no child pid from the helper: {finished:?}"));
        crate::wait::until("the orphan to die", Duration::from_secs(10), || {
            if alive(pid) {
                Err(format!("pid {pid} alive"))
            } else {
                Ok(())
            }
        });
    }
}
