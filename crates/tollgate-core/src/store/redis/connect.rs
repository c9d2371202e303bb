//! Connections to Redis (single node, Cluster or Sentinel) kept alive by a supervisor task,
//! so that requests never wait for a connect and learn at once when Redis is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates, TlsMode};
use tokio::sync::Notify;

use crate::limit::UnknownName;

/// How long one connect or health probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Probe period while Redis answers; a request error wakes the supervisor sooner.
const HEALTHY_PROBE: Duration = Duration::from_secs(1);
/// Retry period while Redis is down: recovery is noticed within this.
const DOWN_RETRY: Duration = Duration::from_millis(100);

/// A login to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user; none for the default user.
    pub user: Option<String>,
    /// The password.
    pub password: String,
}

/// The Redis deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisKind {
    /// One node (or a proxy in front of several).
    Single,
    /// A Redis Cluster: keys spread over masters by hash slot.
    Cluster,
    /// A master found through Sentinel, re-resolved after a failover.
    Sentinel,
}

impl std::str::FromStr for RedisKind {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        match text.to_ascii_lowercase().as_str() {
            "single" => Ok(Self::Single),
            "cluster" => Ok(Self::Cluster),
            "sentinel" => Ok(Self::Sentinel),
            _ => Err(UnknownName {
                what: "Redis deployment",
                given: text.to_owned(),
                expected: "single, cluster or sentinel",
            }),
        }
    }
}

/// TLS for `rediss://` connections beyond the defaults (the system's roots, hostnames
/// checked): managed Redis services often need a client certificate or their own CA.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// A client certificate chain and its key (PEM), for `tls-auth-clients yes`.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    /// The CA (PEM) that signed the servers' certificates; trusted instead of the
    /// system's roots.
    pub ca: Option<Vec<u8>>,
    /// Check the chain but not the name in the certificate (servers reached by an
    /// address their certificate does not name). Not available for Sentinel.
    pub skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("RedisTls")
            .field("client", &self.client.as_ref().map(|_| "<certificate>"))
            .field("ca", &self.ca.as_ref().map(|_| "<CA>"))
            .field(
                "skip_hostname_verification",
                &self.skip_hostname_verification,
            )
            .finish()
    }
}

impl RedisTls {
    /// Whether anything differs from the defaults.
    fn is_custom(&self) -> bool {
        self.client.is_some() || self.ca.is_some()
    }

    fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Where Redis is: one deployment and its addresses, as URLs the client understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One node.
    Single {
        /// `redis://` or `rediss://` URL.
        url: String,
    },
    /// A Cluster, found through any of its nodes.
    Cluster {
        /// Node URLs.
        nodes: Vec<String>,
    },
    /// The master of a Sentinel set.
    Sentinel {
        /// The monitored master's name.
        master: String,
        /// Sentinel URLs.
        sentinels: Vec<String>,
        /// How to log in to the master.
        credentials: Option<Credentials>,
    },
}

/// Why a Redis address setting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// No address at all.
    #[error("REDIS_URL is empty")]
    Empty,
    /// A Sentinel setting without the master's name.
    #[error("REDIS_URL '{0}' for sentinel must be 'master-name,sentinel-host:port[,…]'")]
    SentinelForm(String),
    /// An address the client cannot parse.
    #[error("invalid Redis address '{address}': {reason}")]
    Address {
        /// The address as given.
        address: String,
        /// The client's complaint.
        reason: String,
    },
}

impl RedisTarget {
    /// Whether connections use TLS (`rediss://`).
    pub fn uses_tls(&self) -> bool {
        let tls = |url: &String| url.starts_with("rediss://");
        match self {
            Self::Single { url } => tls(url),
            Self::Cluster { nodes } => nodes.iter().any(tls),
            Self::Sentinel { sentinels, .. } => sentinels.iter().any(tls),
        }
    }

    /// Parses `REDIS_URL` in any of the reference's forms: `redis://[user:password@]host:port`,
    /// `rediss://…`, `host:port`; for a Cluster a comma-separated node list; for Sentinel
    /// `master-name,sentinel-host:port,…`. `auth` (`password` or `user:password`) applies
    /// to addresses without credentials; `tls` makes `host:port` forms `rediss://`.
    pub fn parse(
        url: &str,
        kind: RedisKind,
        auth: Option<&str>,
        tls: bool,
    ) -> Result<Self, TargetError> {
        let mut parts: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let credentials = auth.map(|a| match a.split_once(':') {
            Some((user, password)) => Credentials {
                user: Some(user.to_owned()),
                password: password.to_owned(),
            },
            None => Credentials {
                user: None,
                password: a.to_owned(),
            },
        });
        if kind == RedisKind::Sentinel {
            if parts.len() < 2 {
                return Err(TargetError::SentinelForm(url.to_owned()));
            }
            let master = parts.remove(0).to_owned();
            // Sentinels take no credentials of the master.
            let sentinels = urls(&parts, None, tls)?;
            return Ok(Self::Sentinel {
                master,
                sentinels,
                credentials,
            });
        }
        let mut nodes = urls(&parts, credentials.as_ref(), tls)?;
        if nodes.is_empty() {
            return Err(TargetError::Empty);
        }
        Ok(match kind {
            RedisKind::Cluster => Self::Cluster { nodes },
            RedisKind::Single | RedisKind::Sentinel => Self::Single {
                url: nodes.swap_remove(0),
            },
        })
    }
}

fn urls(
    parts: &[&str],
    credentials: Option<&Credentials>,
    tls: bool,
) -> Result<Vec<String>, TargetError> {
    parts
        .iter()
        .map(|p| node_url(p, credentials, tls))
        .collect()
}

fn node_url(
    addr: &str,
    credentials: Option<&Credentials>,
    tls: bool,
) -> Result<String, TargetError> {
    let login = credentials.map_or(String::new(), |c| {
        format!(
            "{}:{}@",
            encode(c.user.as_deref().unwrap_or("")),
            encode(&c.password)
        )
    });
    let url = match addr.split_once("://") {
        Some((scheme, rest)) if rest.contains('@') || login.is_empty() => {
            format!("{scheme}://{rest}")
        }
        Some((scheme, rest)) => format!("{scheme}://{login}{rest}"),
        None => format!("{}://{login}{addr}", if tls { "rediss" } else { "redis" }),
    };
    url.as_str()
        .into_connection_info()
        .map_err(|e| TargetError::Address {
            address: addr.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(url)
}

/// Percent-encodes everything but unreserved URL characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A live connection; clones share it and pipeline their commands over it.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &mut self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => invocation.invoke_async(c).await,
            Self::Cluster(c) => invocation.invoke_async(c).await,
        }
    }

    /// Redis's clock (`TIME`), in nanoseconds since the epoch: the health probe, which
    /// also tells the local view the store's time before any script has run.
    async fn time_ns(&mut self) -> redis::RedisResult<u64> {
        let cmd = redis::cmd("TIME");
        let (secs, micros): (u64, u64) = match self {
            Self::Single(c) => cmd.query_async(c).await?,
            Self::Cluster(c) => cmd.query_async(c).await?,
        };
        Ok(secs
            .saturating_mul(1_000_000)
            .saturating_add(micros)
            .saturating_mul(1_000))
    }
}

/// Told the store's time whenever a probe reads it.
pub(super) type TimeSink = Box<dyn Fn(u64) + Send + Sync>;

/// The supervised connection: the current `Conn`, whether Redis answers, and a way for
/// requests to report trouble.
#[derive(Default)]
pub(super) struct Link {
    current: ArcSwapOption<Conn>,
    up: AtomicBool,
    wake: Notify,
    /// Notified whenever the link comes up.
    connected: Notify,
    reconnects: AtomicU64,
    /// Why the link last went down or failed to connect, for the operator.
    last_error: std::sync::Mutex<Option<String>>,
}

impl Link {
    /// Starts the supervisor, which reports Redis's time to `time`; the link is down until
    /// it first connects.
    pub(super) fn start(target: RedisTarget, tls: RedisTls, time: TimeSink) -> Arc<Self> {
        let link = Arc::new(Self::default());
        tokio::spawn(supervise(Arc::downgrade(&link), target, tls, time));
        link
    }

    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub(super) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Why Redis last failed, if it has.
    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until Redis answers, at most `limit`; whether it does.
    pub(super) async fn wait_up(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let connected = self.connected.notified();
            if self.is_up() {
                return true;
            }
            if tokio::time::timeout_at(deadline, connected).await.is_err() {
                return self.is_up();
            }
        }
    }

    /// The connection to use, if Redis is believed to answer.
    pub(super) fn conn(&self) -> Option<Conn> {
        if !self.is_up() {
            return None;
        }
        self.current.load().as_deref().cloned()
    }

    /// A request saw Redis fail: stop sending until the supervisor reconnects.
    pub(super) fn report_down(&self, why: &redis::RedisError) {
        self.set_up(false, Some(why.to_string()));
        self.wake.notify_one();
    }

    /// A request was slow: have the supervisor probe now.
    pub(super) fn report_slow(&self) {
        self.wake.notify_one();
    }

    fn set_up(&self, up: bool, why: Option<String>) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if up && !was {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            self.connected.notify_waiters();
            tracing::info!("redis connected");
        }
        let Some(why) = why else { return };
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        // Each new reason once at warn level; the same failure repeating only at debug.
        if was || last.as_deref() != Some(why.as_str()) {
            tracing::warn!(
                "redis unreachable: {why}; deciding per --on-store-error until it is back"
            );
        } else {
            tracing::debug!("redis still unreachable: {why}");
        }
        *last = Some(why);
    }
}

async fn supervise(
    link: std::sync::Weak<Link>,
    target: RedisTarget,
    tls: RedisTls,
    time: TimeSink,
) {
    loop {
        let Some(strong) = link.upgrade() else { return };
        // A Sentinel set may have moved the master: resolve it again whenever Redis is down.
        let sentinel = matches!(target, RedisTarget::Sentinel { .. });
        let mut failure = None;
        if strong.current.load().is_none() || (!strong.is_up() && sentinel) {
            match tokio::time::timeout(PROBE_TIMEOUT * 4, connect(&target, &tls)).await {
                Ok(Ok(conn)) => strong.current.store(Some(Arc::new(conn))),
                Ok(Err(e)) => failure = Some(format!("cannot connect: {e}")),
                Err(_) => failure = Some(format!("no connection within {:?}", PROBE_TIMEOUT * 4)),
            }
        }
        let healthy = match strong.current.load_full() {
            Some(conn) => {
                let mut conn = (*conn).clone();
                match tokio::time::timeout(PROBE_TIMEOUT, conn.time_ns()).await {
                    Ok(Ok(now_ns)) => {
                        time(now_ns);
                        true
                    }
                    Ok(Err(e)) => {
                        failure.get_or_insert(format!("TIME failed: {e}"));
                        false
                    }
                    Err(_) => {
                        failure
                            .get_or_insert(format!("no answer to TIME within {PROBE_TIMEOUT:?}"));
                        false
                    }
                }
            }
            None => false,
        };
        strong.set_up(healthy, failure);
        if healthy {
            // Holding `strong` here delays dropping the link by at most one probe period.
            tokio::select! {
                _ = strong.wake.notified() => {}
                _ = tokio::time::sleep(HEALTHY_PROBE) => {}
            }
        } else {
            drop(strong);
            tokio::time::sleep(DOWN_RETRY).await;
        }
    }
}

async fn connect(target: &RedisTarget, tls: &RedisTls) -> redis::RedisResult<Conn> {
    let manager_config = || {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(PROBE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(DOWN_RETRY)
    };
    match target {
        RedisTarget::Sentinel {
            master,
            sentinels,
            credentials,
        } => {
            let sentinels = sentinels
                .iter()
                .map(|url| Ok(url.as_str().into_connection_info()?.addr().clone()))
                .collect::<redis::RedisResult<Vec<_>>>()?;
            let over_tls = sentinels
                .iter()
                .any(|addr| matches!(addr, redis::ConnectionAddr::TcpTls { .. }));
            let mut builder =
                SentinelClientBuilder::new(sentinels, master.clone(), SentinelServerType::Master)?;
            if let Some(login) = credentials {
                if let Some(user) = &login.user {
                    builder = builder.set_client_to_redis_username(user);
                }
                builder = builder.set_client_to_redis_password(&login.password);
            }
            if over_tls {
                // The master is reached the way the Sentinels are.
                builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
                if tls.is_custom() {
                    builder = builder
                        .set_client_to_sentinel_certificates(tls.certificates())
                        .set_client_to_redis_certificates(tls.certificates());
                }
            }
            let client = builder.build()?.async_get_client().await?;
            Ok(Conn::Single(ConnectionManager::new_lazy_with_config(
                client,
                manager_config(),
            )?))
        }
        RedisTarget::Cluster { nodes } => {
            let mut builder = ClusterClient::builder(nodes.clone())
                .connection_timeout(PROBE_TIMEOUT)
                .retries(2)
                .danger_accept_invalid_hostnames(tls.skip_hostname_verification);
            if tls.is_custom() {
                builder = builder.certs(tls.certificates());
            }
            Ok(Conn::Cluster(
                builder.build()?.get_async_connection().await?,
            ))
        }
        RedisTarget::Single { url } => {
            let client = match tls.is_custom() && url.starts_with("rediss://") {
                true => redis::Client::build_with_tls(url.as_str(), tls.certificates())?,
                false => redis::Client::open(url.as_str())?,
            };
            let client = match tls.skip_hostname_verification {
                true => {
                    let info = client.get_connection_info().clone();
                    let mut addr = info.addr().clone();
                    addr.set_danger_accept_invalid_hostnames(true);
                    redis::Client::open(info.set_addr(addr))?
                }
                false => client,
            };
            Ok(Conn::Single(ConnectionManager::new_lazy_with_config(
                client,
                manager_config(),
            )?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(url: &str) -> RedisTarget {
        RedisTarget::Single { url: url.into() }
    }

    #[test]
    fn reference_forms_and_urls_are_understood() {
        let parse = |url, kind, auth| RedisTarget::parse(url, kind, auth, false);
        assert_eq!(
            parse("localhost:6379", RedisKind::Single, None),
            Ok(single("redis://localhost:6379"))
        );
        assert_eq!(
            parse("redis://h:1", RedisKind::Single, Some("user:p@ss")),
            Ok(single("redis://user:p%40ss@h:1"))
        );
        assert_eq!(
            parse("redis://u:x@h:1", RedisKind::Single, Some("other")),
            Ok(single("redis://u:x@h:1")),
            "credentials in the URL win"
        );
        assert_eq!(
            parse("a:1, b:2,c:3", RedisKind::Cluster, Some("pw")),
            Ok(RedisTarget::Cluster {
                nodes: vec![
                    "redis://:pw@a:1".into(),
                    "redis://:pw@b:2".into(),
                    "redis://:pw@c:3".into()
                ]
            })
        );
        assert_eq!(
            parse(
                "mymaster,s1:26379,s2:26379",
                RedisKind::Sentinel,
                Some("pw")
            ),
            Ok(RedisTarget::Sentinel {
                master: "mymaster".into(),
                sentinels: vec!["redis://s1:26379".into(), "redis://s2:26379".into()],
                credentials: Some(Credentials {
                    user: None,
                    password: "pw".into()
                }),
            })
        );
        assert_eq!(
            RedisTarget::parse("h:1", RedisKind::Single, None, true),
            Ok(single("rediss://h:1"))
        );
    }

    #[test]
    fn bad_forms_are_clear_errors() {
        let err = RedisTarget::parse("s1:26379", RedisKind::Sentinel, None, false)
            .expect_err("no master name");
        assert!(err.to_string().contains("master-name"), "{err}");
        assert_eq!(
            RedisTarget::parse("", RedisKind::Single, None, false),
            Err(TargetError::Empty)
        );
        let err = RedisTarget::parse("redis://h:notaport", RedisKind::Single, None, false)
            .expect_err("bad port");
        assert!(err.to_string().contains("invalid Redis address"), "{err}");
    }
}
