//! Counters in Redis from a URL: what every replica of a service points at to share its
//! limits, with the Tollgate server's defaults.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::store::redis::{RedisConfig, RedisKind, RedisTarget, RedisTls, TargetError};
use tollgate_core::store::{SharedBehaviour, SharedStore};
use tollgate_core::{Capacity, OnStoreError, Store, SystemClock};

/// How often the local view drops counters whose windows have passed.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// A Redis store to connect to, with the Tollgate server's defaults: a 10 ms timeout
/// per request, decisions from the local view while Redis fails (`local`), up to 3 s
/// waited for the first connection, no key prefix. For Cluster, Sentinel or TLS client
/// certificates, build a [`RedisConfig`] and call [`SharedStore::redis`].
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = tollgate_tower::RedisStore::new("redis://redis:6379")
///     .key_prefix("checkout:")
///     .connect()
///     .await?;
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    url: String,
    key_prefix: String,
    behaviour: SharedBehaviour,
    startup_wait: Duration,
}

impl RedisStore {
    /// Redis at `url`: `redis://[user:password@]host:port[/db]`, `rediss://…` for TLS
    /// (system roots), or `host:port`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            key_prefix: String::new(),
            behaviour: SharedBehaviour {
                // No drain in an embedding service would give held blocks back.
                leases: tollgate_core::store::LeasePolicy {
                    enabled: false,
                    ..tollgate_core::store::LeasePolicy::default()
                },
                timeout: Duration::from_millis(10),
                on_error: OnStoreError::Local,
                local_capacity: Capacity::default(),
            },
            startup_wait: Duration::from_secs(3),
        }
    }

    /// Prefix of every key (services sharing one Redis keep their counters apart).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Longest a request waits for Redis before `on_error` decides it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.behaviour.timeout = timeout;
        self
    }

    /// What a request gets when Redis does not answer in time: `Local` (the local view),
    /// `Allow`, `Deny`, or `Error` (then the layer's
    /// [`deny_on_error`](crate::RateLimitLayer::deny_on_error) decides).
    pub fn on_error(mut self, on_error: OnStoreError) -> Self {
        self.behaviour.on_error = on_error;
        self
    }

    /// How long [`connect`](Self::connect) waits for Redis's first answer.
    pub fn startup_wait(mut self, wait: Duration) -> Self {
        self.startup_wait = wait;
        self
    }

    /// The store, connecting on the current tokio runtime. Waits up to the startup wait
    /// for Redis to answer; past it, logs a warning and returns the store anyway, which
    /// keeps connecting in the background and decides per `on_error` meanwhile. An
    /// address that cannot be a Redis URL is an error.
    pub async fn connect(self) -> Result<Store, TargetError> {
        let target = RedisTarget::parse(&self.url, RedisKind::Single, None, false)?;
        let config = RedisConfig {
            target,
            tls: RedisTls::default(),
            key_prefix: self.key_prefix,
            behaviour: self.behaviour,
        };
        let store = SharedStore::redis(config, Arc::new(SystemClock), SWEEP_PERIOD);
        if !store.wait_up(self.startup_wait).await {
            let why = store.last_error().unwrap_or_else(|| "no answer".into());
            // Not the URL: it may hold a password.
            tracing::warn!(
                "Redis not reachable after {:?} ({why}); deciding per {} until it is",
                self.startup_wait,
                self.behaviour.on_error.as_str()
            );
        }
        Ok(Store::Shared(store))
    }
}
