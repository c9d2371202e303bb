//! Reference mode's store: counters in the reference service's Redis keys, counted with its
//! commands, so that reference instances and Tollgates share every counter during a
//! rolling migration.
//!
//! The reference keeps one integer per descriptor and window at
//! `CACHE_KEY_PREFIX + domain_key_value_…_` + the window's start in seconds on the
//! instance's own clock, and counts with a pipelined `INCRBY key hits` + `EXPIRE key unit +
//! jitter`: increment first, over the limit when the new count is above it. So does this
//! store, for the one fixed-window limit a descriptor has in reference mode. With
//! `LOCAL_CACHE_SIZE_IN_BYTES`, counters found over their limit are answered from memory
//! until their window ends, without incrementing, as the reference's local cache does.
//! A failing Redis is an error, as in the reference (or a fixed answer, per
//! `--on-store-error`); there is no local view to decide from. Unlike the reference, a
//! refund (`is_negative_hits`) stops at zero, and a count at the top of Redis' integers
//! is over the limit rather than an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::connect::{Conn, RedisConnector, RedisTarget, RedisTls};
use crate::algo::{Hits, LimitVerdict, Verdict};
use crate::clock::{Clock, NANOS_PER_SECOND, Timestamp};
use crate::limit::Limit;
use crate::lock::lock;
use crate::stats::Histogram;
use crate::store::shared::link::{Health, Link};
use crate::store::{
    CounterView, LimitView, OnStoreError, Peek, SharedStats, StoreError, StoreStats,
};

/// How a reference-mode store is set up.
#[derive(Debug, Clone)]
pub struct ReferenceConfig {
    /// Where Redis is.
    pub target: RedisTarget,
    /// TLS beyond the defaults, for `rediss://` targets.
    pub tls: RedisTls,
    /// `CACHE_KEY_PREFIX`.
    pub key_prefix: String,
    /// Longest a request waits for Redis (the reference's `REDIS_TIMEOUT`).
    pub timeout: Duration,
    /// What a request gets when Redis fails: an error (the reference's behaviour), or a
    /// fixed answer. Reference mode has no local view, so `Local` is not one of them.
    pub on_error: OnStoreError,
    /// `EXPIRATION_JITTER_MAX_SECONDS`: each key lives its window plus a random part of
    /// this, so that keys of one window do not all expire at once.
    pub expiration_jitter: Duration,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`: memory for counters known to be over their limit (0:
    /// none).
    pub local_cache_bytes: usize,
}

/// Counters in the reference's layout; see the module documentation.
pub struct ReferenceStore {
    link: Arc<Link<RedisConnector>>,
    config: ReferenceConfig,
    clock: Arc<dyn Clock>,
    over: Option<OverCache>,
    counts: Counts,
}

impl std::fmt::Debug for ReferenceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceStore")
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Counts {
    latency: Histogram,
    round_trips: AtomicU64,
    cached_denials: AtomicU64,
    timeouts: AtomicU64,
    connection_errors: AtomicU64,
    command_errors: AtomicU64,
    fallbacks: AtomicU64,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            latency: Histogram::new(0.000_025, 15),
            round_trips: AtomicU64::default(),
            cached_denials: AtomicU64::default(),
            timeouts: AtomicU64::default(),
            connection_errors: AtomicU64::default(),
            command_errors: AtomicU64::default(),
            fallbacks: AtomicU64::default(),
        }
    }
}

impl ReferenceStore {
    /// Connects in the background (on the current tokio runtime); requests get
    /// `on_error`'s answer until Redis answers.
    pub fn start(config: ReferenceConfig, clock: Arc<dyn Clock>) -> Arc<Self> {
        // Health is probed as for the Redis store, on a probe counter of its own.
        let connector = RedisConnector {
            target: config.target.clone(),
            tls: config.tls.clone(),
            script: Arc::new(super::script::script()),
            key_prefix: config.key_prefix.clone(),
        };
        let link = Link::start(connector, Box::new(|_| {}));
        let over = (config.local_cache_bytes > 0).then(|| OverCache::new(config.local_cache_bytes));
        Arc::new(Self {
            link,
            config,
            clock,
            over,
            counts: Counts::default(),
        })
    }

    /// Whether Redis answers.
    pub fn is_up(&self) -> bool {
        self.health().is_up()
    }

    /// Waits until Redis answers, at most `limit`; whether it does.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        self.health().wait_up(limit).await
    }

    /// Why Redis last failed, if it has.
    pub fn last_error(&self) -> Option<String> {
        self.health().last_error()
    }

    /// What requests get while Redis fails.
    pub fn on_error(&self) -> OnStoreError {
        self.config.on_error
    }

    /// The store's kind and address, as logs name it.
    pub fn name(&self) -> &str {
        self.health().name()
    }

    fn health(&self) -> &Health {
        &self.link.health
    }

    /// The store's clock: the instance's, as the reference keys windows by its own.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The current window's count as Redis holds it (past the limit too: every hit is
    /// counted), read without counting, under its key, and what `hits` more would get.
    /// Reference mode has no local view.
    pub(crate) async fn peek(&self, key: &str, limits: &[Limit], hits: u64) -> Peek {
        let Some(limit) = limits.first() else {
            return Peek {
                local: None,
                stored_key: None,
                shared: None,
                lease: None,
            };
        };
        let window = Window::of(limit, self.now());
        let full_key = format!("{}{key}{}", self.config.key_prefix, window.start_s);
        let read = async {
            let mut conn: Conn = (*self.link.conn().ok_or(StoreError::NotConnected)?).clone();
            let get = redis::cmd("GET").arg(&full_key).clone();
            match tokio::time::timeout(self.config.timeout, conn.query::<Option<u64>>(&get)).await {
                Err(_) => Err(StoreError::Timeout),
                Ok(Err(e)) => Err(StoreError::Failed(Arc::new(e))),
                Ok(Ok(count)) => Ok(count),
            }
        };
        let shared = read.await.map(|count| {
            let allowed = u64::from(limit.requests_per_unit());
            let count = count.unwrap_or(0);
            let remaining = allowed.saturating_sub(count);
            let reset = window.reset;
            CounterView {
                held: count > 0,
                limits: vec![LimitView {
                    count,
                    remaining,
                    reset,
                }],
                would: Verdict {
                    limit_index: 0,
                    decision: LimitVerdict {
                        admitted: count.saturating_add(hits) <= allowed,
                        remaining: remaining.saturating_sub(hits),
                        reset,
                    },
                    in_flight: None,
                },
            }
        });
        Peek {
            local: None,
            stored_key: Some(full_key),
            shared: Some(shared),
            lease: None,
        }
    }

    /// Deletes the current window's key of counter `key` (the reference's own local caches
    /// are not reached), and forgets it was over.
    pub(crate) async fn reset(&self, key: &str, limits: &[Limit]) -> Result<(), StoreError> {
        let Some(limit) = limits.first() else {
            return Ok(());
        };
        let window = Window::of(limit, self.now());
        let full_key = format!("{}{key}{}", self.config.key_prefix, window.start_s);
        if let Some(over) = &self.over {
            over.forget(&full_key);
        }
        let mut conn: Conn = (*self.link.conn().ok_or(StoreError::NotConnected)?).clone();
        let del = redis::cmd("DEL").arg(&full_key).clone();
        match tokio::time::timeout(self.config.timeout, conn.query::<i64>(&del)).await {
            Err(_) => Err(StoreError::Timeout),
            Ok(Err(e)) => Err(StoreError::Failed(Arc::new(e))),
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// Counts `hits` on the counter whose key, up to the window, is `key`, under its one
    /// fixed-window limit, increment first.
    pub(crate) async fn apply(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<Verdict, StoreError> {
        let Some(limit) = limits.first() else {
            return Ok(unlimited());
        };
        let now = self.clock.now();
        let unit_s = limit.unit().seconds();
        let Window {
            start_s: window_s,
            reset,
        } = Window::of(limit, now);
        let full_key = format!("{}{key}{window_s}", self.config.key_prefix);
        let allowed = u64::from(limit.requests_per_unit());
        let over = |remaining| Verdict {
            limit_index: 0,
            decision: LimitVerdict {
                admitted: false,
                remaining,
                reset,
            },
            in_flight: None,
        };
        if self
            .over
            .as_ref()
            .is_some_and(|cache| cache.holds(&full_key, now))
        {
            self.counts.cached_denials.fetch_add(1, Ordering::Relaxed);
            return Ok(over(0));
        }
        let added: i64 = match hits {
            Hits::Consume(n) | Hits::Charge(n) => i64::try_from(n).unwrap_or(i64::MAX),
            Hits::Check => 0,
            Hits::Refund(n) => -i64::try_from(n).unwrap_or(i64::MAX),
        };
        let mut count = match self.increment(&full_key, added, unit_s).await {
            Ok(count) => count,
            Err(e) => return self.fall_back(e, reset, allowed),
        };
        if count < 0 && added < 0 {
            // A refund stops at zero: what it took below zero is put back, and what
            // others counted meanwhile stays.
            let below = count.max(added).saturating_neg();
            count = match self.increment(&full_key, below, unit_s).await {
                Ok(count) => count,
                Err(e) => return self.fall_back(e, reset, allowed),
            };
        }
        let count = u64::try_from(count).unwrap_or(0);
        if count > allowed {
            if let Some(cache) = &self.over {
                cache.insert(&full_key, now + reset, now);
            }
            return Ok(over(0));
        }
        Ok(Verdict {
            limit_index: 0,
            decision: LimitVerdict {
                admitted: true,
                remaining: allowed - count,
                reset,
            },
            in_flight: None,
        })
    }

    /// `INCRBY key added` and `EXPIRE key`, pipelined; the new count.
    async fn increment(&self, key: &str, added: i64, unit_s: u64) -> Result<i64, StoreError> {
        let Some(conn) = self.link.conn() else {
            return Err(StoreError::NotConnected);
        };
        let mut conn: Conn = (*conn).clone();
        let jitter_s = self.config.expiration_jitter.as_secs();
        let ttl = unit_s
            + if jitter_s > 0 {
                fastrand::u64(0..jitter_s)
            } else {
                0
            };
        let mut pipe = redis::pipe();
        pipe.cmd("INCRBY").arg(key).arg(added);
        pipe.cmd("EXPIRE").arg(key).arg(ttl).ignore();
        let started = Instant::now();
        let answer = tokio::time::timeout(self.config.timeout, conn.pipeline(&pipe)).await;
        self.counts.latency.observe(started.elapsed());
        match answer {
            Err(_) => {
                self.counts.timeouts.fetch_add(1, Ordering::Relaxed);
                self.health().check_now();
                Err(StoreError::Timeout)
            }
            Ok(Ok((count,))) => {
                self.counts.round_trips.fetch_add(1, Ordering::Relaxed);
                Ok(count)
            }
            // Said in the error's detail, or inside a pipeline failure's text.
            Ok(Err(e)) if e.to_string().contains("would overflow") => {
                // Redis refused to count past its largest integer: the count is there,
                // far past any limit.
                self.counts.round_trips.fetch_add(1, Ordering::Relaxed);
                Ok(i64::MAX)
            }
            Ok(Err(e)) => {
                let lost =
                    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal();
                if lost {
                    self.counts
                        .connection_errors
                        .fetch_add(1, Ordering::Relaxed);
                    self.health().report_down(&e);
                } else {
                    self.counts.command_errors.fetch_add(1, Ordering::Relaxed);
                }
                Err(StoreError::Failed(Arc::new(e)))
            }
        }
    }

    fn fall_back(
        &self,
        error: StoreError,
        reset: Duration,
        allowed: u64,
    ) -> Result<Verdict, StoreError> {
        self.counts.fallbacks.fetch_add(1, Ordering::Relaxed);
        let admitted = match self.config.on_error {
            OnStoreError::Allow => true,
            OnStoreError::Deny => false,
            OnStoreError::Error | OnStoreError::Local => return Err(error),
        };
        Ok(Verdict {
            limit_index: 0,
            decision: LimitVerdict {
                admitted,
                remaining: if admitted { allowed } else { 0 },
                reset,
            },
            in_flight: None,
        })
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let c = &self.counts;
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let (counters, bytes) = self.over.as_ref().map_or((0, 0), OverCache::size);
        StoreStats {
            up: self.is_up(),
            counters,
            bytes,
            evictions: 0,
            expired: 0,
            shared: Some(SharedStats {
                round_trips: load(&c.round_trips),
                local_denials: load(&c.cached_denials),
                timeouts: load(&c.timeouts),
                connection_errors: load(&c.connection_errors),
                script_errors: load(&c.command_errors),
                fallbacks: load(&c.fallbacks),
                refreshes: 0,
                reconnects: self.health().reconnects(),
                disagreements: 0,
                decreases_announced: 0,
                announcements_heard: 0,
                debts: 0,
                debt_units: 0,
                debt_charged: 0,
                debt_forgiven: 0,
                credit_units: 0,
                credited: 0,
                calls_in_doubt: 0,
                leases_taken: 0,
                lease_units_leased: 0,
                lease_units_returned: 0,
                lease_local_admissions: 0,
                latency: c.latency.snapshot(),
            }),
        }
    }
}

/// The reference's window of a limit at a time: its start in whole seconds since the
/// epoch (the key's last part) and the time left until its end.
struct Window {
    start_s: u64,
    reset: Duration,
}

impl Window {
    fn of(limit: &Limit, now: Timestamp) -> Self {
        let unit_s = limit.unit().seconds();
        let start_s = now.as_nanos() / NANOS_PER_SECOND / unit_s * unit_s;
        let end = Timestamp::from_nanos((start_s + unit_s).saturating_mul(NANOS_PER_SECOND));
        Self {
            start_s,
            reset: end.since(now),
        }
    }
}

fn unlimited() -> Verdict {
    Verdict {
        limit_index: 0,
        decision: LimitVerdict {
            admitted: true,
            remaining: u64::MAX,
            reset: Duration::ZERO,
        },
        in_flight: None,
    }
}

/// Keys found over their limit, until their window ends: the reference's local cache.
struct OverCache {
    keys: Mutex<HashMap<Box<str>, Timestamp>>,
    /// Keys held at most: the configured bytes over what one key takes, roughly.
    capacity: usize,
}

/// Bytes one cached key takes besides its text: the map's entry and allocation.
const ENTRY_BYTES: usize = 64;

impl OverCache {
    fn new(bytes: usize) -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
            capacity: (bytes / (ENTRY_BYTES + 64)).max(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Timestamp>> {
        // Inserts and removals leave the map whole: a poisoned lock is still usable.
        lock(&self.keys)
    }

    fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    fn holds(&self, key: &str, now: Timestamp) -> bool {
        self.lock().get(key).is_some_and(|&until| until > now)
    }

    fn insert(&self, key: &str, until: Timestamp, now: Timestamp) {
        let mut keys = self.lock();
        if keys.len() >= self.capacity {
            // The cache only saves round trips: making room by forgetting is always safe.
            keys.retain(|_, until| *until > now);
            if keys.len() >= self.capacity {
                keys.clear();
            }
        }
        keys.insert(key.into(), until);
    }

    fn size(&self) -> (usize, usize) {
        let keys = self.lock();
        let bytes = keys.keys().map(|k| k.len() + ENTRY_BYTES).sum();
        (keys.len(), bytes)
    }
}
