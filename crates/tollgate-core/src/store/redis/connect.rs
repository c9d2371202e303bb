//! Connections to Redis (single node, Cluster or Sentinel): where Redis is, how to reach
//! it, and how the supervisor of [`super::super::shared::link`] connects and probes.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, IntoConnectionInfo, ProtocolVersion, TlsCertificates, TlsMode};

use super::script;
use crate::clock::Timestamp;
use crate::limit::UnknownName;
use crate::redact;
use crate::store::shared::link::{Connector, DOWN_RETRY, PROBE_TIMEOUT};
use crate::store::shared::protocol::{Ask, PROBE_CALL, PROBE_KEY, probe_limits};

/// A login to Redis.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The ACL user; none for the default user.
    pub user: Option<String>,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
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
#[derive(Clone, PartialEq, Eq)]
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
    /// A Sentinel setting without the master's name (its passwords hidden).
    #[error("REDIS_URL '{0}' for sentinel must be 'master-name,sentinel-host:port[,…]'")]
    SentinelForm(String),
    /// An address the client cannot parse.
    #[error("invalid Redis address '{address}': {reason}")]
    Address {
        /// The address as given, its password hidden.
        address: String,
        /// The client's complaint.
        reason: String,
    },
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a password: the URLs as `redact::url` shows them.
        let urls = |urls: &[String]| urls.iter().map(|u| redact::url(u)).collect::<Vec<_>>();
        match self {
            Self::Single { url } => f
                .debug_struct("Single")
                .field("url", &redact::url(url))
                .finish(),
            Self::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &urls(nodes))
                .finish(),
            Self::Sentinel {
                master,
                sentinels,
                credentials,
            } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &urls(sentinels))
                .field("credentials", credentials)
                .finish(),
        }
    }
}

/// Where Redis is, as logs name it: the addresses without their logins, and the kind
/// (`h:6379 (single)`, `a:1,b:2 (cluster)`, `s1:26379 (sentinel, master mymaster)`).
impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addresses = |urls: &[String]| {
            let hosts: Vec<&str> = urls.iter().map(|u| redact::address(u)).collect();
            hosts.join(",")
        };
        match self {
            Self::Single { url } => write!(f, "{} (single)", redact::address(url)),
            Self::Cluster { nodes } => write!(f, "{} (cluster)", addresses(nodes)),
            Self::Sentinel {
                master, sentinels, ..
            } => write!(f, "{} (sentinel, master {master})", addresses(sentinels)),
        }
    }
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
                return Err(TargetError::SentinelForm(redact::url(url)));
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
            address: redact::url(addr),
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
    /// Runs `evalsha`, an EVALSHA of `script`; if Redis does not know the script (a new
    /// or restarted node), loads it and runs the call once more.
    pub(super) async fn eval<T: redis::FromRedisValue>(
        &mut self,
        evalsha: &redis::Cmd,
        script: &redis::Script,
    ) -> redis::RedisResult<T> {
        match self.query(evalsha).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                match self {
                    Self::Single(c) => script.load_async(c).await?,
                    Self::Cluster(c) => script.load_async(c).await?,
                };
                self.query(evalsha).await
            }
            other => other,
        }
    }

    /// Runs `pipe` (reference mode's `INCRBY` and `EXPIRE`).
    pub(super) async fn pipeline<T: redis::FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => pipe.query_async(c).await,
            Self::Cluster(c) => pipe.query_async(c).await,
        }
    }

    pub(super) async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// Redis's clock (`TIME`).
    async fn time(&mut self) -> redis::RedisResult<Timestamp> {
        let (secs, micros): (u64, u64) = self.query(&redis::cmd("TIME")).await?;
        Ok(Timestamp::default() + Duration::from_secs(secs) + Duration::from_micros(micros))
    }
}

/// Makes and probes connections to one Redis deployment.
pub(super) struct RedisConnector {
    pub(super) target: RedisTarget,
    pub(super) tls: RedisTls,
    /// The check-and-count script and the keys' prefix, for the counter-call probe.
    pub(super) script: Arc<redis::Script>,
    pub(super) key_prefix: String,
}

/// Why the supervisor could not connect to Redis, or a probe failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    /// No connection was made.
    #[error(transparent)]
    Connect(redis::RedisError),
    /// `TIME` failed.
    #[error("TIME: {0}")]
    Time(#[source] redis::RedisError),
    /// The probe's counter call failed.
    #[error(transparent)]
    Call(redis::RedisError),
    /// The probe's counter call replied with something else than counters.
    #[error(transparent)]
    Reply(#[from] script::BadState),
    #[error(transparent)]
    Batch(#[from] script::BadBatch),
    /// The probe's key could not be deleted.
    #[error("DEL of the probe's key: {0}")]
    Delete(#[source] redis::RedisError),
}

impl Connector for RedisConnector {
    type Conn = Conn;
    const NAME: &'static str = "redis";

    fn address(&self) -> String {
        self.target.to_string()
    }
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    type Error = LinkError;

    async fn connect(&self) -> Result<Conn, LinkError> {
        connect(&self.target, &self.tls)
            .await
            .map_err(LinkError::Connect)
    }

    async fn time(&self, conn: &Conn) -> Result<Timestamp, LinkError> {
        conn.clone().time().await.map_err(LinkError::Time)
    }

    /// The connection managers reconnect by themselves; a Sentinel set may have moved
    /// the master, which only a fresh resolution finds.
    fn reconnect_when_down(&self) -> bool {
        matches!(self.target, RedisTarget::Sentinel { .. })
    }

    async fn probe_calls(&self, conn: &Conn) -> Result<(), LinkError> {
        let limits = probe_limits();
        let check = script::Check {
            key: PROBE_KEY,
            limits: &limits,
            ask: Ask::Hits(PROBE_CALL.hits),
            debt: PROBE_CALL.debt,
            deadline: None,
            now: None,
            around: Timestamp::default(),
        };
        let call = script::call(&self.script, &self.key_prefix, &check);
        let mut conn = conn.clone();
        let replies: script::Replies = conn
            .eval(&call, &self.script)
            .await
            .map_err(LinkError::Call)?;
        script::raw(script::only(replies)?, &script::parts(&limits))?;
        // The probe leaves no key behind: one key per counter, and none that is not.
        let mut del = redis::cmd("DEL");
        del.arg(script::redis_key(&self.key_prefix, PROBE_KEY));
        conn.query::<()>(&del).await.map_err(LinkError::Delete)
    }
}

/// A client for a connection of its own (a subscription): the single node, the Sentinel
/// set's master, or the first Cluster node (a Cluster passes PUBLISH on to every node).
pub(super) async fn pubsub_client(
    target: &RedisTarget,
    tls: &RedisTls,
) -> redis::RedisResult<redis::Client> {
    match target {
        RedisTarget::Sentinel { .. } => sentinel_client(target, tls).await,
        RedisTarget::Cluster { nodes } => match nodes.first() {
            Some(first) => single_client(first, tls),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "a Redis Cluster without nodes",
            ))),
        },
        RedisTarget::Single { url } => single_client(url, tls),
    }
}

/// A client of the Sentinel set's current master.
async fn sentinel_client(
    target: &RedisTarget,
    tls: &RedisTls,
) -> redis::RedisResult<redis::Client> {
    let RedisTarget::Sentinel {
        master,
        sentinels,
        credentials,
    } = target
    else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "not a Sentinel target",
        )));
    };
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
    builder.build()?.async_get_client().await
}

/// A client of the node at `url`.
fn single_client(url: &str, tls: &RedisTls) -> redis::RedisResult<redis::Client> {
    let client = match tls.is_custom() && url.starts_with("rediss://") {
        true => redis::Client::build_with_tls(url, tls.certificates())?,
        false => redis::Client::open(url)?,
    };
    match tls.skip_hostname_verification {
        true => {
            let info = client.get_connection_info().clone();
            let mut addr = info.addr().clone();
            addr.set_danger_accept_invalid_hostnames(true);
            redis::Client::open(info.set_addr(addr))
        }
        false => Ok(client),
    }
}

async fn connect(target: &RedisTarget, tls: &RedisTls) -> redis::RedisResult<Conn> {
    match target {
        RedisTarget::Sentinel { .. } => Ok(Conn::Single(
            manager(sentinel_client(target, tls).await?).await?,
        )),
        RedisTarget::Cluster { nodes } => {
            let cluster = |protocol| {
                let mut builder = ClusterClient::builder(nodes.clone())
                    .connection_timeout(PROBE_TIMEOUT)
                    .retries(2)
                    .danger_accept_invalid_hostnames(tls.skip_hostname_verification)
                    .use_protocol(protocol);
                if tls.is_custom() {
                    builder = builder.certs(tls.certificates());
                }
                async move { builder.build()?.get_async_connection().await }
            };
            Ok(Conn::Cluster(resp3_else_resp2(cluster).await?))
        }
        RedisTarget::Single { url } => Ok(Conn::Single(manager(single_client(url, tls)?).await?)),
    }
}

/// A connection manager for `client`'s node, connected.
async fn manager(client: redis::Client) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(PROBE_TIMEOUT))
        .set_number_of_retries(1)
        .set_max_delay(DOWN_RETRY)
        // The store's own timeout (`--store-timeout`) bounds every call; redis-rs's
        // default of 500 ms would cut longer ones short and report the link lost.
        .set_response_timeout(None);
    let speaking = |protocol| {
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_protocol(protocol);
        let client = redis::Client::open(info.set_redis_settings(settings));
        let config = config.clone();
        async move { ConnectionManager::new_with_config(client?, config).await }
    };
    resp3_else_resp2(speaking).await
}

/// The connection `connect` makes speaking RESP3, where Redis does (6 and later): over
/// RESP3, redis-rs learns at once that Redis closed a connection (`CLIENT KILL`, an idle
/// `timeout`, a proxy's cut) and replaces it, so the next call does not find it dead.
/// A node or proxy that refuses `HELLO` is spoken to in RESP2.
async fn resp3_else_resp2<C, F>(connect: impl Fn(ProtocolVersion) -> F) -> redis::RedisResult<C>
where
    F: Future<Output = redis::RedisResult<C>>,
{
    match connect(ProtocolVersion::RESP3).await {
        // Only an answer can refuse RESP3; a node that cannot be reached is tried again
        // by the supervisor.
        Err(e) if !(e.is_io_error() || e.is_connection_refusal() || e.is_timeout()) => {
            connect(ProtocolVersion::RESP2).await
        }
        connected => connected,
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
        for (url, kind) in [
            ("redis://:hunter2@h:notaport", RedisKind::Single),
            ("rediss://u:hunter2@s1", RedisKind::Sentinel),
        ] {
            let err = RedisTarget::parse(url, kind, None, false).expect_err("bad form");
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn a_target_is_debugged_without_its_passwords() {
        for (url, kind) in [
            ("redis://:hunter2@h:1", RedisKind::Single),
            ("a:1,b:2", RedisKind::Cluster),
            ("m,redis://:hunter2@s1:26379", RedisKind::Sentinel),
        ] {
            let target = RedisTarget::parse(url, kind, Some("hunter2"), false).unwrap();
            assert!(!format!("{target:?}").contains("hunter2"), "{target:?}");
        }
    }

    #[test]
    fn a_target_is_named_by_its_addresses_without_logins() {
        let parse = |url, kind| RedisTarget::parse(url, kind, Some("pw"), false).unwrap();
        assert_eq!(
            parse("redis://:x@h:1", RedisKind::Single).to_string(),
            "h:1 (single)"
        );
        assert_eq!(
            parse("a:1,b:2", RedisKind::Cluster).to_string(),
            "a:1,b:2 (cluster)"
        );
        assert_eq!(
            parse("m,s1:26379", RedisKind::Sentinel).to_string(),
            "s1:26379 (sentinel, master m)"
        );
    }
}
