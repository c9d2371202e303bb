//! Connections to Redis (single node, Cluster or Sentinel) kept alive by a supervisor task,
//! so that requests never wait for a connect and learn at once when Redis is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{IntoConnectionInfo, RedisConnectionInfo};
use tokio::sync::Notify;

use crate::settings::RedisType;

/// How long one connect or health probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Probe period while Redis answers; a request error wakes the supervisor sooner.
const HEALTHY_PROBE: Duration = Duration::from_secs(1);
/// Retry period while Redis is down: recovery is noticed within this.
const DOWN_RETRY: Duration = Duration::from_millis(100);

/// A login: optional user name and password.
type Credentials = (Option<String>, String);

/// Where Redis is, as parsed from the settings.
#[derive(Debug, Clone)]
pub struct Target {
    kind: RedisType,
    /// Node URLs; for Sentinel, the sentinels.
    urls: Vec<String>,
    /// Sentinel: the monitored master's name and how to log in to it.
    master: Option<(String, Option<Credentials>)>,
}

impl Target {
    /// Parses `--redis-url` in any of its forms (see the settings' help).
    pub fn parse(
        url: &str,
        kind: RedisType,
        auth: Option<&str>,
        tls: bool,
    ) -> Result<Self, String> {
        let mut parts: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let credentials = auth.map(|a| match a.split_once(':') {
            Some((user, password)) => (Some(user.to_owned()), password.to_owned()),
            None => (None, a.to_owned()),
        });
        let master = if kind == RedisType::Sentinel {
            if parts.len() < 2 {
                return Err(format!(
                    "REDIS_URL '{url}' for sentinel must be 'master-name,sentinel-host:port[,…]'"
                ));
            }
            Some((parts.remove(0).to_owned(), credentials.clone()))
        } else {
            None
        };
        if parts.is_empty() {
            return Err("REDIS_URL is empty".into());
        }
        // Sentinels take no credentials of the master.
        let node_credentials = if master.is_some() {
            None
        } else {
            credentials.as_ref()
        };
        let urls = parts
            .into_iter()
            .map(|p| node_url(p, node_credentials, tls))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { kind, urls, master })
    }
}

fn node_url(
    addr: &str,
    credentials: Option<&(Option<String>, String)>,
    tls: bool,
) -> Result<String, String> {
    let login = credentials.map_or(String::new(), |(user, password)| {
        format!(
            "{}:{}@",
            encode(user.as_deref().unwrap_or("")),
            encode(password)
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
        .map_err(|e| format!("invalid Redis address '{addr}': {e}"))?;
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
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub async fn invoke<T: redis::FromRedisValue>(
        &mut self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Single(c) => invocation.invoke_async(c).await,
            Self::Cluster(c) => invocation.invoke_async(c).await,
        }
    }

    async fn ping(&mut self) -> bool {
        let cmd = redis::cmd("PING");
        let answer: redis::RedisResult<String> = match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        };
        answer.is_ok()
    }
}

/// The supervised connection: the current `Conn`, whether Redis answers, and a way for
/// requests to report trouble.
#[derive(Default)]
pub struct Link {
    current: ArcSwapOption<Conn>,
    up: AtomicBool,
    wake: Notify,
    /// Notified whenever the link comes up.
    connected: Notify,
    pub reconnects: AtomicU64,
}

impl Link {
    /// Starts the supervisor; the link is down until it first connects.
    pub fn start(target: Target) -> Arc<Self> {
        let link = Arc::new(Self::default());
        tokio::spawn(supervise(Arc::downgrade(&link), target));
        link
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Waits until Redis answers, at most `limit`; whether it does.
    pub async fn wait_up(&self, limit: Duration) -> bool {
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
    pub fn conn(&self) -> Option<Conn> {
        if !self.is_up() {
            return None;
        }
        self.current.load().as_deref().cloned()
    }

    /// A request saw Redis fail: stop sending until the supervisor reconnects.
    pub fn report_down(&self) {
        self.up.store(false, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// A request was slow: have the supervisor probe now.
    pub fn report_slow(&self) {
        self.wake.notify_one();
    }

    fn set_up(&self, up: bool) {
        let was = self.up.swap(up, Ordering::Relaxed);
        if up && !was {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            self.connected.notify_waiters();
            tracing::info!("redis connected");
        } else if was && !up {
            tracing::warn!("redis unreachable; deciding per --on-store-error until it is back");
        }
    }
}

async fn supervise(link: std::sync::Weak<Link>, target: Target) {
    let mut fresh = true;
    loop {
        let Some(strong) = link.upgrade() else { return };
        // A Sentinel set may have moved the master: resolve it again whenever Redis is down.
        let reconnect =
            strong.current.load().is_none() || (!strong.is_up() && target.master.is_some());
        if reconnect {
            match tokio::time::timeout(PROBE_TIMEOUT * 4, connect(&target)).await {
                Ok(Ok(conn)) => strong.current.store(Some(Arc::new(conn))),
                Ok(Err(e)) if fresh => tracing::warn!("cannot connect to redis: {e}"),
                _ => {}
            }
            fresh = false;
        }
        let conn = strong.current.load_full();
        let healthy = match conn {
            Some(conn) => {
                let mut conn = (*conn).clone();
                tokio::time::timeout(PROBE_TIMEOUT, conn.ping())
                    .await
                    .unwrap_or(false)
            }
            None => false,
        };
        strong.set_up(healthy);
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

async fn connect(target: &Target) -> redis::RedisResult<Conn> {
    let manager_config = || {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(PROBE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(DOWN_RETRY)
    };
    match (&target.kind, &target.master) {
        (RedisType::Sentinel, Some((name, credentials))) => {
            let mut info = RedisConnectionInfo::default();
            if let Some((user, password)) = credentials {
                if let Some(user) = user {
                    info = info.set_username(user);
                }
                info = info.set_password(password);
            }
            let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
            let mut sentinel = SentinelClient::build(
                target.urls.clone(),
                name.clone(),
                Some(node),
                SentinelServerType::Master,
            )?;
            let client = sentinel.async_get_client().await?;
            Ok(Conn::Single(ConnectionManager::new_lazy_with_config(
                client,
                manager_config(),
            )?))
        }
        (RedisType::Cluster, _) => {
            let client = ClusterClient::builder(target.urls.clone())
                .connection_timeout(PROBE_TIMEOUT)
                .retries(2)
                .build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        }
        _ => {
            let url = target.urls.first().map_or("", String::as_str);
            let client = redis::Client::open(url)?;
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

    #[test]
    fn reference_forms_and_urls_are_understood() {
        let t = Target::parse("localhost:6379", RedisType::Single, None, false).expect("parses");
        assert_eq!(t.urls, ["redis://localhost:6379"]);
        let t = Target::parse("redis://h:1", RedisType::Single, Some("user:p@ss"), false)
            .expect("parses");
        assert_eq!(t.urls, ["redis://user:p%40ss@h:1"]);
        let t = Target::parse("redis://u:x@h:1", RedisType::Single, Some("other"), false)
            .expect("parses");
        assert_eq!(t.urls, ["redis://u:x@h:1"], "credentials in the URL win");
        let t =
            Target::parse("a:1, b:2,c:3", RedisType::Cluster, Some("pw"), false).expect("parses");
        assert_eq!(
            t.urls,
            ["redis://:pw@a:1", "redis://:pw@b:2", "redis://:pw@c:3"]
        );
        let t = Target::parse(
            "mymaster,s1:26379,s2:26379",
            RedisType::Sentinel,
            Some("pw"),
            false,
        )
        .expect("parses");
        assert_eq!(t.urls, ["redis://s1:26379", "redis://s2:26379"]);
        assert_eq!(t.master.map(|(name, _)| name), Some("mymaster".to_owned()));
    }

    #[test]
    fn bad_forms_are_clear_errors() {
        let err = Target::parse("s1:26379", RedisType::Sentinel, None, false)
            .expect_err("no master name");
        assert!(err.contains("master-name"), "{err}");
        assert!(Target::parse("", RedisType::Single, None, false).is_err());
        let err = Target::parse("redis://h:notaport", RedisType::Single, None, false)
            .expect_err("bad port");
        assert!(err.contains("invalid Redis address"), "{err}");
    }
}
