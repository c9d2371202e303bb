//! Toxiproxy, the TCP proxy that fault tests put between Tollgate and its store: latency
//! (with jitter), data held back, connections reset, bandwidth capped, the link cut and
//! healed, each set and removed while connections stay up.
//!
//! [`Toxiproxy::start`] runs the server on a free loopback port (killed when dropped, as
//! every testkit child is); [`Toxiproxy::proxy`] opens a [`Proxy`] on a free loopback
//! port in front of an upstream address; a [`Proxy`] adds toxics and cuts or heals its
//! link. Everything goes through Toxiproxy's JSON API on its control port.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{self, Method};
use crate::process::Process;
use crate::{free_port, loopback};

/// The release `scripts/install-test-deps.sh` builds.
pub const PINNED_VERSION: &str = "v2.5.0";
/// How long the server may take to answer on its control port.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Where `scripts/install-test-deps.sh` builds it, relative to the workspace.
const INSTALLED: &str = "target/test-deps/toxiproxy/toxiproxy-server";

/// The toxiproxy-server binary: `$TOXIPROXY_BIN`, else the one the install script built.
/// Panics saying how to install it when there is none.
pub fn binary() -> &'static Path {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        let install = format!(
            "run scripts/install-test-deps.sh (it builds Toxiproxy {PINNED_VERSION} with `go \
             install` into {INSTALLED}; it needs Go), or set TOXIPROXY_BIN"
        );
        match std::env::var_os("TOXIPROXY_BIN") {
            Some(path) if path.is_empty() => panic!(
                "TOXIPROXY_BIN is empty (the install script found no Go to build Toxiproxy \
                 with): this test needs Toxiproxy; install Go and {install}"
            ),
            Some(path) => {
                let path = PathBuf::from(path);
                assert!(
                    path.is_file(),
                    "TOXIPROXY_BIN={} is not a file; {install}",
                    path.display()
                );
                path
            }
            None => Some(crate::workspace().join(INSTALLED))
                .filter(|path| path.is_file())
                .unwrap_or_else(|| panic!("no toxiproxy-server found: {install}")),
        }
    })
}

/// A running toxiproxy-server on loopback; killed when dropped, with its proxies.
pub struct Toxiproxy {
    _process: Process,
    api: SocketAddr,
}

impl Toxiproxy {
    /// Starts the server on a free loopback port; ready once its API answers.
    pub async fn start() -> Self {
        for _ in 0..5 {
            let api = loopback(free_port());
            let mut cmd = Command::new(binary());
            cmd.arg("-host")
                .arg(api.ip().to_string())
                .arg("-port")
                .arg(api.port().to_string());
            let mut process = Process::start("toxiproxy", cmd).unwrap_or_else(|e| panic!("{e}"));
            match process
                .await_answering(STARTUP_TIMEOUT, async || {
                    call(api, Method::GET, "/version", "").await.map(drop)
                })
                .await
            {
                Ok(()) => {
                    return Self {
                        _process: process,
                        api,
                    };
                }
                // Another process took the port between our check and its bind.
                Err(e) if e.to_string().contains("address already in use") => continue,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("toxiproxy: five free ports in a row were taken before it bound them")
    }

    /// A proxy named `name` (unique on this server) from a free loopback port to
    /// `upstream` (`host:port`), enabled, without toxics.
    pub async fn proxy(&self, name: &str, upstream: &str) -> Proxy {
        // The name goes into the API's paths as it is.
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "a proxy name is letters, digits, - and _, not {name:?}"
        );
        let body = json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream});
        let created = expect(self.api, Method::POST, "/proxies", &body.to_string()).await;
        let listen = created["listen"]
            .as_str()
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| {
                panic!("toxiproxy created {name} without a listen address: {created}")
            });
        Proxy {
            api: self.api,
            name: name.to_owned(),
            listen,
            toxics: AtomicU64::new(0),
        }
    }
}

/// Which way through a proxy a toxic acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the upstream: requests.
    Upstream,
    /// From the upstream back to the client: answers.
    Downstream,
}

impl Direction {
    fn stream(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// A toxic added to a proxy, to remove with [`Proxy::remove`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toxic {
    name: String,
}

impl Toxic {
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// One proxy of a [`Toxiproxy`]: clients connect to [`Proxy::listen`] and reach its
/// upstream through the toxics set on it. Toxiproxy keeps whole milliseconds.
pub struct Proxy {
    api: SocketAddr,
    name: String,
    listen: SocketAddr,
    /// Numbers the toxics, so that two of one kind and direction can be set at once.
    toxics: AtomicU64,
}

impl Proxy {
    /// Where clients connect.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// `redis://HOST:PORT` of the listen address, for a Redis behind the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.listen)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Delays the data going `direction` by `latency`, give or take up to `jitter`.
    pub async fn latency(
        &self,
        direction: Direction,
        latency: Duration,
        jitter: Duration,
    ) -> Toxic {
        let attributes = json!({"latency": millis(latency), "jitter": millis(jitter)});
        self.add("latency", direction, attributes).await
    }

    /// Holds back every byte going `direction` (a stalled peer); with `close_after`, closes
    /// each connection that long after the toxic reached it.
    pub async fn timeout(&self, direction: Direction, close_after: Option<Duration>) -> Toxic {
        // Toxiproxy reads a timeout of 0 as "never close".
        let timeout = close_after.map_or(0, |after| {
            assert!(
                after >= Duration::from_millis(1),
                "a timeout toxic closes after 1 ms or more, not {after:?} (None: never)"
            );
            millis(after)
        });
        self.add("timeout", direction, json!({ "timeout": timeout }))
            .await
    }

    /// Resets each connection (TCP RST, unsent data dropped) `after` its next data going
    /// `direction` arrives.
    pub async fn reset_peer(&self, direction: Direction, after: Duration) -> Toxic {
        self.add("reset_peer", direction, json!({"timeout": millis(after)}))
            .await
    }

    /// Caps the data going `direction` at `kilobytes_per_second`.
    pub async fn bandwidth(&self, direction: Direction, kilobytes_per_second: u64) -> Toxic {
        self.add(
            "bandwidth",
            direction,
            json!({"rate": kilobytes_per_second}),
        )
        .await
    }

    /// Cuts the link: closes every connection through the proxy and refuses new ones.
    pub async fn disable(&self) {
        self.set_enabled(false).await;
    }

    /// Heals the link: listens again on the same port.
    pub async fn enable(&self) {
        self.set_enabled(true).await;
    }

    /// Removes one toxic; its connections carry on without it.
    pub async fn remove(&self, toxic: &Toxic) {
        let path = format!("/proxies/{}/toxics/{}", self.name, toxic.name);
        expect(self.api, Method::DELETE, &path, "").await;
    }

    /// Removes every toxic of the proxy.
    pub async fn remove_all(&self) {
        let path = format!("/proxies/{}/toxics", self.name);
        let toxics = expect(self.api, Method::GET, &path, "").await;
        for toxic in toxics.as_array().into_iter().flatten() {
            let name = toxic["name"]
                .as_str()
                .unwrap_or_else(|| panic!("a toxic without a name on {}: {toxic}", self.name));
            self.remove(&Toxic {
                name: name.to_owned(),
            })
            .await;
        }
    }

    async fn add(&self, kind: &str, direction: Direction, attributes: Value) -> Toxic {
        let number = self.toxics.fetch_add(1, Ordering::Relaxed);
        let name = format!("{kind}_{}_{number}", direction.stream());
        let body = json!({
            "name": name,
            "type": kind,
            "stream": direction.stream(),
            "toxicity": 1.0,
            "attributes": attributes,
        });
        let path = format!("/proxies/{}/toxics", self.name);
        expect(self.api, Method::POST, &path, &body.to_string()).await;
        Toxic { name }
    }

    async fn set_enabled(&self, enabled: bool) {
        let path = format!("/proxies/{}", self.name);
        let body = json!({ "enabled": enabled });
        expect(self.api, Method::POST, &path, &body.to_string()).await;
    }
}

/// Whole milliseconds, as Toxiproxy takes durations.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// One API call; its answer's body, or the failure as a message.
async fn call(api: SocketAddr, method: Method, path: &str, body: &str) -> Result<String, String> {
    let headers = [("content-type", "application/json")];
    let answer = http::send(api, method.clone(), path, &headers, body).await?;
    if !(200..300).contains(&answer.status) {
        return Err(format!(
            "{method} {path} {body} answered {}: {}",
            answer.status, answer.body
        ));
    }
    Ok(answer.body)
}

/// One API call; its JSON answer (null when empty). Panics on any failure.
async fn expect(api: SocketAddr, method: Method, path: &str, body: &str) -> Value {
    let what = format!("toxiproxy at {api}: {method} {path}");
    let answer = call(api, method, path, body)
        .await
        .unwrap_or_else(|e| panic!("toxiproxy at {api}: {e}"));
    if answer.trim().is_empty() {
        return Value::Null;
    }
    serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("{what} answered JSON that does not parse ({e}): {answer}"))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::redis::RedisServer;

    /// Far more than a PING on loopback takes, even on a busy host.
    const LATENCY: Duration = Duration::from_secs(1);
    /// How long an answer that must come is waited for.
    const ANSWER: Duration = Duration::from_secs(10);

    /// PING on `stream`; the time to its PONG, or what happened instead within `wait`.
    async fn ping(stream: &mut TcpStream, wait: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        stream
            .write_all(b"PING\r\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut answer = [0u8; 7];
        match tokio::time::timeout(wait, stream.read_exact(&mut answer)).await {
            Err(_) => Err(format!("no answer within {wait:?}")),
            Ok(Err(e)) => Err(format!("read: {e}")),
            Ok(Ok(_)) if &answer == b"+PONG\r\n" => Ok(start.elapsed()),
            Ok(Ok(_)) => Err(format!("answer {:?}", String::from_utf8_lossy(&answer))),
        }
    }

    async fn connect(proxy: &Proxy) -> TcpStream {
        TcpStream::connect(proxy.listen())
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", proxy.listen()))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn toxics_delay_hold_and_reset_a_real_redis_and_the_link_cuts_and_heals() {
        let redis = crate::process::blocking(RedisServer::start);
        let toxiproxy = Toxiproxy::start().await;
        let proxy = toxiproxy.proxy("redis", &redis.host_port()).await;
        let mut conn = connect(&proxy).await;
        ping(&mut conn, ANSWER)
            .await
            .expect("PING through the proxy");

        // Latency on the answers delays the PONG of an open connection by the amount set.
        let latency = proxy
            .latency(Direction::Downstream, LATENCY, Duration::ZERO)
            .await;
        let took = ping(&mut conn, ANSWER).await.expect("PING with latency");
        assert!(
            took >= LATENCY,
            "PING took {took:?} with {LATENCY:?} of latency"
        );
        proxy.remove(&latency).await;
        let took = ping(&mut conn, ANSWER)
            .await
            .expect("PING after the latency");
        assert!(
            took < LATENCY,
            "PING took {took:?} once the latency was removed"
        );

        // Held requests get no answer; the connection closes when the timeout says so.
        proxy
            .timeout(Direction::Upstream, Some(Duration::from_millis(300)))
            .await;
        let held = ping(&mut conn, Duration::from_millis(100)).await;
        assert_eq!(held, Err("no answer within 100ms".to_owned()));
        let mut rest = Vec::new();
        let read = tokio::time::timeout(ANSWER, conn.read_to_end(&mut rest))
            .await
            .expect("the timeout toxic closes the connection");
        assert!(read.is_ok() && rest.is_empty(), "{read:?}, {rest:?}");
        proxy.remove_all().await;

        // A reset toxic resets the next connection that sends.
        proxy.reset_peer(Direction::Upstream, Duration::ZERO).await;
        let mut conn = connect(&proxy).await;
        assert!(ping(&mut conn, ANSWER).await.is_err());
        proxy.remove_all().await;

        // A cut closes open connections and refuses new ones; the heal serves again.
        let mut conn = connect(&proxy).await;
        ping(&mut conn, ANSWER).await.expect("PING before the cut");
        proxy.disable().await;
        assert!(ping(&mut conn, ANSWER).await.is_err());
        let refused = TcpStream::connect(proxy.listen()).await;
        assert!(refused.is_err(), "a disabled proxy accepted a connection");
        proxy.enable().await;
        let mut conn = connect(&proxy).await;
        ping(&mut conn, ANSWER).await.expect("PING after the heal");
    }
}
