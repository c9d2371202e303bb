//! Shared harness for Tollgate's integration tests.
//!
//! Every test runs the real `tollgate` binary as a child process on
//! 127.0.0.1 with OS-assigned ports, with rules written into a temporary
//! directory. Synchronisation is always event-driven: the harness waits for
//! the readiness line on stdout (or for the process to exit), never sleeps.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic::transport::{Channel, Endpoint};

pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// How long a server may take to print its readiness line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a one-shot command (`check-config`, a failing `serve`) may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-RPC and per-HTTP-request timeout, so a hung server fails the test.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");
const READY_PREFIX: &str = "tollgate listening ";

// ---------------------------------------------------------------------------
// Rule files
// ---------------------------------------------------------------------------

/// A temporary directory holding rule files; removed on drop.
pub struct ConfigDir {
    dir: TempDir,
}

impl ConfigDir {
    pub fn new() -> Self {
        Self {
            dir: TempDir::new().expect("create a temporary config directory"),
        }
    }

    /// A directory holding a single file `name` with `contents`.
    pub fn with_file(name: &str, contents: &str) -> Self {
        let dir = Self::new();
        dir.write(name, contents);
        dir
    }

    /// Writes `contents` to `relative` (parent directories are created) and
    /// returns the absolute path.
    pub fn write(&self, relative: &str, contents: &str) -> PathBuf {
        let path = self.dir.path().join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create config subdirectory");
        }
        std::fs::write(&path, contents).expect("write config file");
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
// Processes
// ---------------------------------------------------------------------------

/// A `tollgate` command with a clean environment, so that variables of the
/// machine running the tests (PORT, HOST, REDIS_URL, ...) cannot leak in.
pub fn tollgate() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().stdin(Stdio::null());
    cmd
}

/// `tollgate serve --config PATH` on OS-assigned loopback ports.
pub fn serve_command(config: &Path) -> Command {
    let mut cmd = tollgate();
    cmd.arg("serve").arg("--config").arg(config).args([
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    cmd
}

/// Collects everything a child writes to one pipe, line by line, on a thread.
struct PipeReader {
    lines: Receiver<String>,
    thread: JoinHandle<()>,
}

impl PipeReader {
    fn spawn(pipe: impl Read + Send + 'static) -> Self {
        let (tx, lines) = mpsc::channel();
        let thread = thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                // Invalid UTF-8 or a closed pipe ends the capture.
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { lines, thread }
    }

    /// Waits for end of file (the child exited) and returns all unread lines.
    fn finish(self) -> Vec<String> {
        self.thread.join().expect("pipe reader thread panicked");
        self.lines.try_iter().collect()
    }
}

/// The result of a finished `tollgate` process.
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

/// Spawns `cmd` with its output read line by line on background threads.
fn spawn_piped(cmd: &mut Command) -> (Child, PipeReader, PipeReader) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate");
    let stdout = PipeReader::spawn(child.stdout.take().expect("piped stdout"));
    let stderr = PipeReader::spawn(child.stderr.take().expect("piped stderr"));
    (child, stdout, stderr)
}

/// Runs a command that is expected to exit by itself within `COMMAND_TIMEOUT`.
pub fn run(mut cmd: Command) -> Finished {
    let (mut child, stdout, stderr) = spawn_piped(&mut cmd);

    // Each reader's channel disconnects when its pipe hits end of file, which
    // happens when the process exits.
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let mut out = Vec::new();
    loop {
        match stdout
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(line) => out.push(line),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = stderr.finish();
                panic!(
                    "tollgate {:?} did not exit within {COMMAND_TIMEOUT:?}; stdout: {out:?}; stderr:\n{}",
                    cmd.get_args().collect::<Vec<_>>(),
                    err.join("\n")
                );
            }
        }
    }
    out.extend(stdout.finish());
    let status = child.wait().expect("wait for tollgate");
    Finished {
        status,
        stdout: join_lines(out),
        stderr: join_lines(stderr.finish()),
    }
}

fn join_lines(lines: Vec<String>) -> String {
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

/// `tollgate check-config PATH`.
pub fn check_config(path: &Path) -> Finished {
    let mut cmd = tollgate();
    cmd.arg("check-config").arg(path);
    run(cmd)
}

/// The two addresses announced by the readiness line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listening {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
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

/// A running `tollgate serve`; killed when dropped.
pub struct Server {
    child: Option<Child>,
    stdout: Option<PipeReader>,
    stderr: Option<PipeReader>,
    pub addrs: Listening,
    /// Lines printed on stdout before the readiness line (should be none).
    pub stdout_before_ready: Vec<String>,
    config: Option<ConfigDir>,
}

impl Server {
    /// Serves a single rule file with the given YAML.
    pub fn start(yaml: &str) -> Self {
        Self::start_with_args(yaml, &[])
    }

    /// Serves a single rule file with extra command-line arguments.
    pub fn start_with_args(yaml: &str, args: &[&str]) -> Self {
        let config = ConfigDir::with_file("config.yaml", yaml);
        let mut cmd = serve_command(&config.file("config.yaml"));
        cmd.args(args);
        let mut server = Self::spawn(cmd).unwrap_or_else(|exit| exit.fail());
        server.config = Some(config);
        server
    }

    /// Spawns `cmd` and waits for the readiness line. `Err` if the process
    /// exits before announcing itself; panics on timeout or a malformed line.
    pub fn spawn(mut cmd: Command) -> Result<Self, Box<Finished>> {
        let (mut child, stdout, stderr) = spawn_piped(&mut cmd);

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut before = Vec::new();
        loop {
            match stdout
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line.starts_with(READY_PREFIX) => {
                    let Some(addrs) = parse_ready_line(&line) else {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("malformed readiness line: {line:?}");
                    };
                    return Ok(Self {
                        child: Some(child),
                        stdout: Some(stdout),
                        stderr: Some(stderr),
                        addrs,
                        stdout_before_ready: before,
                        config: None,
                    });
                }
                Ok(line) => before.push(line),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = child.wait().expect("wait for tollgate");
                    before.extend(stdout.finish());
                    return Err(Box::new(Finished {
                        status,
                        stdout: join_lines(before),
                        stderr: join_lines(stderr.finish()),
                    }));
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "no readiness line within {STARTUP_TIMEOUT:?}; stdout: {before:?}; stderr:\n{}",
                        stderr.finish().join("\n")
                    );
                }
            }
        }
    }

    /// Keeps `config` alive for as long as the server runs.
    pub fn keep(mut self, config: ConfigDir) -> Self {
        self.config = Some(config);
        self
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.addrs.grpc
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.addrs.http
    }

    /// A connected rate-limit client.
    pub async fn client(&self) -> Rls {
        Rls {
            inner: RateLimitServiceClient::new(self.channel().await),
        }
    }

    /// A raw gRPC channel to the server (for other services, e.g. health).
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addrs.grpc))
            .expect("valid endpoint URI")
            .connect_timeout(REQUEST_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .connect()
            .await
            .expect("connect to tollgate's gRPC listener")
    }

    /// Sends a signal (e.g. "TERM", "HUP") to the server process.
    pub fn signal(&self, name: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid} failed");
    }

    /// Waits for the server to exit by itself (after a signal) and returns its output.
    pub fn wait_exit(mut self, timeout: Duration) -> Finished {
        let mut child = self.child.take().expect("server already stopped");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait().expect("poll tollgate") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tollgate did not exit within {timeout:?}");
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.output(status)
    }

    /// Everything the exited server printed.
    fn output(&mut self, status: ExitStatus) -> Finished {
        let stdout = self
            .stdout
            .take()
            .map(PipeReader::finish)
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .map(PipeReader::finish)
            .unwrap_or_default();
        Finished {
            status,
            stdout: join_lines(stdout),
            stderr: join_lines(stderr),
        }
    }

    /// Kills the server and returns everything it printed.
    pub fn stop(mut self) -> Finished {
        let mut child = self.child.take().expect("server already stopped");
        let _ = child.kill();
        let status = child.wait().expect("wait for tollgate");
        self.output(status)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Finished {
    /// Panics with the process's output; used when a start was expected to work.
    pub fn fail(&self) -> ! {
        panic!(
            "tollgate exited before it was ready ({}); stdout:\n{}stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Asserts the process exited with code 1 and that one stderr line reports
/// `problem` for `file_name` at `path` (in the form `FILE: PATH: PROBLEM`).
pub fn assert_config_problem(finished: &Finished, file_name: &str, path: &str, problem: &str) {
    assert_eq!(
        finished.status.code(),
        Some(1),
        "expected exit code 1; stderr:\n{}",
        finished.stderr
    );
    assert!(
        finished
            .stderr_lines()
            .iter()
            .any(|line| line_reports(line, &[file_name, path, problem])),
        "no stderr line reports `{file_name}` … `{path}` … `{problem}`; stderr:\n{}",
        finished.stderr
    );
}

/// True if `parts` occur in `line` in this order, without overlapping.
pub fn line_reports(line: &str, parts: &[&str]) -> bool {
    let mut rest = line;
    for part in parts {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// A minimal HTTP/1.1 GET over a blocking socket (no HTTP client crate).
pub fn http_get(addr: SocketAddr, path: &str) -> HttpResponse {
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).expect("connect HTTP");
    stream
        .set_read_timeout(Some(REQUEST_TIMEOUT))
        .expect("set read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send HTTP request");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .expect("read HTTP response until the server closes");
    let raw = String::from_utf8(raw).expect("HTTP response is UTF-8");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("HTTP response without header end: {raw:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP status line: {head:?}"));
    let chunked = head
        .lines()
        .any(|h| h.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    HttpResponse { status, body }
}

/// Decodes an HTTP/1.1 chunked body.
pub fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .unwrap_or_else(|| panic!("bad chunk: {body:?}"));
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size: {size:?}"));
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = rest[size..]
            .strip_prefix("\r\n")
            .expect("chunk ends with CRLF");
    }
}

pub fn is_loopback_v4(addr: SocketAddr) -> bool {
    addr.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST) && addr.port() != 0
}

// ---------------------------------------------------------------------------
// Rate-limit requests
// ---------------------------------------------------------------------------

pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

/// A rate-limit client with assertion-friendly helpers.
#[derive(Clone)]
pub struct Rls {
    pub inner: RateLimitServiceClient<Channel>,
}

impl Rls {
    pub async fn call(
        &mut self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.inner
            .should_rate_limit(req)
            .await
            .map(tonic::Response::into_inner)
    }

    /// A request that must succeed at the gRPC level, with one status per
    /// descriptor.
    pub async fn ok(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        let (domain, descriptors) = (req.domain.clone(), req.descriptors.len());
        let resp = self.call(req).await.unwrap_or_else(|status| {
            panic!(
                "ShouldRateLimit(domain {domain:?}, {descriptors} descriptors) failed: {status:?}"
            )
        });
        assert_eq!(
            resp.statuses.len(),
            descriptors,
            "one status per descriptor: {resp:?}"
        );
        resp
    }

    /// A request that must fail with INVALID_ARGUMENT; returns its message.
    pub async fn invalid(&mut self, req: RateLimitRequest) -> String {
        match self.call(req).await {
            Ok(resp) => panic!("expected INVALID_ARGUMENT, got {resp:?}"),
            Err(status) => {
                assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "wrong gRPC code: {status:?}"
                );
                status.message().to_owned()
            }
        }
    }

    /// One descriptor, default hits; returns its status.
    pub async fn check(&mut self, domain: &str, entries: &[(&str, &str)]) -> DescriptorStatus {
        self.check_hits(domain, entries, 0).await
    }

    /// One descriptor with a request-level `hits_addend`; returns its status.
    pub async fn check_hits(
        &mut self,
        domain: &str,
        entries: &[(&str, &str)],
        hits_addend: u32,
    ) -> DescriptorStatus {
        let mut req = request(domain, &[entries]);
        req.hits_addend = hits_addend;
        let resp = self.ok(req).await;
        let status = resp.statuses[0].clone();
        assert_eq!(
            resp.overall_code, status.code,
            "overall code of a single-descriptor response: {resp:?}"
        );
        status
    }
}

pub fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap_or_else(|_| panic!("unknown code in {status:?}"))
}

pub fn overall(resp: &RateLimitResponse) -> Code {
    Code::try_from(resp.overall_code).unwrap_or_else(|_| panic!("unknown code in {resp:?}"))
}

pub fn limit(requests_per_unit: u32, unit: Unit, name: &str) -> RateLimit {
    RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

/// Status for a descriptor that matched no limit (or an unknown domain).
pub fn assert_unlimited(status: &DescriptorStatus) {
    assert_eq!(code(status), Code::Ok, "{status:?}");
    assert_eq!(status.current_limit, None, "no limit expected: {status:?}");
}

/// Status for a descriptor that matched `expected` with `remaining` left.
pub fn assert_limited(status: &DescriptorStatus, want: Code, expected: &RateLimit, remaining: u32) {
    assert_eq!(code(status), want, "{status:?}");
    assert_eq!(status.current_limit.as_ref(), Some(expected), "{status:?}");
    assert_eq!(status.limit_remaining, remaining, "{status:?}");
}

/// `duration_until_reset` as a std Duration (panics if absent or negative).
pub fn until_reset(status: &DescriptorStatus) -> Duration {
    let d = status
        .duration_until_reset
        .as_ref()
        .unwrap_or_else(|| panic!("duration_until_reset missing: {status:?}"));
    let seconds = u64::try_from(d.seconds).expect("non-negative seconds");
    let nanos = u32::try_from(d.nanos).expect("non-negative nanos");
    Duration::new(seconds, nanos)
}
