//! What the shared stores (Redis, PostgreSQL) have in common: synchronous writes and
//! asynchronous reads around a local view.
//!
//! A request the local view already knows to be over the limit is denied here; any other
//! request makes one round trip that checks and counts atomically in the store and
//! returns the counter's state, which becomes the local view (see [`super::local`] for why
//! a local denial is always the decision the store would make). Only the round trip
//! itself differs between stores ([`Backend`]).

#[cfg(test)]
pub(crate) mod differential;
pub(crate) mod link;
pub(crate) mod protocol;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument as _;

use self::link::{Health, TimeSink};
use self::protocol::Reply;
use super::local::{Fallback, LocalView, Snapshot};
use super::memory::Capacity;
use super::{OnStoreError, SharedStats, StoreError, StoreStats};
use crate::algo::{Hits, Verdict};
use crate::clock::Clock;
use crate::limit::{Algorithm, Limit};
use crate::stats::Histogram;

/// Why one round trip failed, as the store saw it.
#[derive(Debug)]
pub(crate) enum TripError {
    /// Nothing was sent: the store is believed down.
    NotConnected,
    /// The store's own time limit cut the call (PostgreSQL's statement timeout).
    #[cfg(feature = "postgres")]
    Timeout,
    /// The connection failed, or the store can no longer write (a former primary): the
    /// backend has reported the link down.
    Lost(Arc<dyn std::error::Error + Send + Sync>),
    /// The store answered with an error.
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

/// The store a [`SharedStore`] talks to: a closed set, statically dispatched.
pub(crate) enum Backend {
    #[cfg(feature = "redis")]
    Redis(super::redis::RedisBackend),
    #[cfg(feature = "postgres")]
    Postgres(super::postgres::PgBackend),
}

impl Backend {
    fn health(&self) -> &Health {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(b) => b.health(),
            #[cfg(feature = "postgres")]
            Self::Postgres(b) => b.health(),
        }
    }

    /// The span of one round trip: a child of the request's span when tracing is on;
    /// with it off the callsite is disabled and this costs one check.
    fn span(&self, limits: usize) -> tracing::Span {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(_) => tracing::debug_span!("Redis round trip", limits),
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => tracing::debug_span!("PostgreSQL round trip", limits),
        }
    }

    /// One atomic check-and-count; the raw reply of [`protocol`].
    async fn check_and_count(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        deadline_ns: u64,
    ) -> Result<Vec<i64>, TripError> {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(b) => b.check_and_count(key, limits, hits, deadline_ns).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(b) => b.check_and_count(key, limits, hits, deadline_ns).await,
        }
    }
}

/// How a shared store (Redis or PostgreSQL) behaves towards requests.
#[derive(Debug, Clone, Copy)]
pub struct SharedBehaviour {
    /// Longest a request waits for the store.
    pub timeout: Duration,
    /// What a request gets when the store cannot answer in time.
    pub on_error: OnStoreError,
    /// What the local view may hold.
    pub local_capacity: Capacity,
}

/// Counts behind [`SharedStats`].
#[derive(Debug)]
struct Counts {
    latency: Histogram,
    round_trips: AtomicU64,
    local_denials: AtomicU64,
    timeouts: AtomicU64,
    connection_errors: AtomicU64,
    script_errors: AtomicU64,
    fallbacks: AtomicU64,
    refreshes: AtomicU64,
    disagreements: AtomicU64,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            // 25 µs to ~0.4 s.
            latency: Histogram::new(0.000_025, 15),
            round_trips: AtomicU64::default(),
            local_denials: AtomicU64::default(),
            timeouts: AtomicU64::default(),
            connection_errors: AtomicU64::default(),
            script_errors: AtomicU64::default(),
            fallbacks: AtomicU64::default(),
            refreshes: AtomicU64::default(),
            disagreements: AtomicU64::default(),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A counter to read again in the background once its current sub-window closes.
struct Refresh {
    key: Box<str>,
    limits: Vec<Limit>,
}

/// Refreshes queued at most; past that, denials just skip queueing one.
const REFRESH_QUEUE: usize = 4_096;

/// A store shared by every instance pointed at it, with a local view in front.
pub struct SharedStore {
    backend: Backend,
    local: LocalView,
    behaviour: SharedBehaviour,
    refresh_tx: tokio::sync::mpsc::Sender<Refresh>,
    counts: Counts,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

impl SharedStore {
    /// Starts the store made by `backend` (given where to report the store's clock) on
    /// the current tokio runtime; requests are decided per `on_error` until it answers.
    pub(crate) fn start(
        backend: impl FnOnce(TimeSink) -> Backend,
        behaviour: SharedBehaviour,
        clock: Arc<dyn Clock>,
        sweep_period: Duration,
    ) -> Arc<Self> {
        let local = LocalView::new(behaviour.local_capacity, clock);
        local.spawn_sweeper(sweep_period);
        let (refresh_tx, refresh_rx) = tokio::sync::mpsc::channel(REFRESH_QUEUE);
        let store = Arc::new_cyclic(|me: &std::sync::Weak<Self>| {
            let me = me.clone();
            // From the first probe on, every request carries a deadline in store time.
            let learn = move |now_ns| {
                if let Some(store) = me.upgrade() {
                    store.local.learn_time(now_ns);
                }
            };
            Self {
                backend: backend(Box::new(learn)),
                local,
                behaviour,
                refresh_tx,
                counts: Counts::default(),
            }
        });
        tokio::spawn(refresher(Arc::downgrade(&store), refresh_rx));
        store
    }

    /// Whether the store answers.
    pub fn is_up(&self) -> bool {
        self.backend.health().is_up()
    }

    /// Waits until the store answers, at most `limit`; whether it does. Serving before
    /// the first connection would make a fresh instance decide from an empty local view.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        self.backend.health().wait_up(limit).await
    }

    /// Why the store last failed (a refused connection, a wrong password), if it has.
    pub fn last_error(&self) -> Option<String> {
        self.backend.health().last_error()
    }

    /// What requests get while the store cannot answer.
    pub fn on_error(&self) -> OnStoreError {
        self.behaviour.on_error
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let local = self.local.stats();
        let c = &self.counts;
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        StoreStats {
            up: self.is_up(),
            counters: local.entries,
            bytes: local.bytes,
            evictions: local.evictions,
            expired: local.expired,
            shared: Some(SharedStats {
                round_trips: load(&c.round_trips),
                local_denials: load(&c.local_denials),
                timeouts: load(&c.timeouts),
                connection_errors: load(&c.connection_errors),
                script_errors: load(&c.script_errors),
                fallbacks: load(&c.fallbacks),
                refreshes: load(&c.refreshes),
                reconnects: self.backend.health().reconnects(),
                disagreements: load(&c.disagreements),
                latency: c.latency.snapshot(),
            }),
        }
    }

    pub(crate) async fn apply(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<Verdict, StoreError> {
        let now = self.local.now_ns();
        let queue = || {
            let job = Refresh {
                key: key.into(),
                limits: limits.to_vec(),
            };
            self.refresh_tx.try_send(job).is_ok()
        };
        if let Some(denied) = self.local.deny(key, limits, hits, now, queue) {
            bump(&self.counts.local_denials);
            return Ok(denied);
        }
        let deadline = self.local.deadline_ns(now, self.behaviour.timeout);
        let span = self.backend.span(limits.len());
        match self
            .round_trip(key, limits, hits, deadline)
            .instrument(span)
            .await
        {
            Ok(snapshot) => {
                bump(&self.counts.round_trips);
                Ok(self.adopt(key, limits, hits, snapshot))
            }
            Err(e) => {
                bump(&self.counts.fallbacks);
                let how = match self.behaviour.on_error {
                    OnStoreError::Error => return Err(e),
                    OnStoreError::Local => Fallback::Local,
                    OnStoreError::Allow => Fallback::Allow,
                    OnStoreError::Deny => Fallback::Deny,
                };
                Ok(self.local.fall_back(key, limits, now, hits, how))
            }
        }
    }

    fn adopt(&self, key: &str, limits: &[Limit], hits: Hits, snapshot: Snapshot) -> Verdict {
        let (verdict, disagreed) = self.local.adopt(key, limits, hits, snapshot);
        if disagreed {
            bump(&self.counts.disagreements);
            tracing::debug!(
                key,
                "the store and the local algorithm disagreed; the store decided"
            );
        }
        verdict
    }

    /// One check-and-count. The store ignores it if it runs after `deadline_ns` (store
    /// time), by when this request will have been answered without it.
    async fn round_trip(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        deadline_ns: u64,
    ) -> Result<Snapshot, StoreError> {
        let started = Instant::now();
        let call = self.backend.check_and_count(key, limits, hits, deadline_ns);
        let answer = tokio::time::timeout(self.behaviour.timeout, call).await;
        self.counts.latency.observe(started.elapsed());
        let timed_out = || {
            bump(&self.counts.timeouts);
            self.backend.health().report_slow();
            StoreError::Timeout
        };
        let raw = match answer {
            Err(_) => return Err(timed_out()),
            #[cfg(feature = "postgres")]
            Ok(Err(TripError::Timeout)) => return Err(timed_out()),
            Ok(Err(TripError::NotConnected)) => return Err(StoreError::NotConnected),
            Ok(Err(TripError::Lost(e))) => {
                bump(&self.counts.connection_errors);
                return Err(StoreError::Failed(e));
            }
            Ok(Err(TripError::Failed(e))) => {
                bump(&self.counts.script_errors);
                return Err(StoreError::Failed(e));
            }
            Ok(Ok(raw)) => raw,
        };
        match protocol::decode(&raw, limits) {
            Ok(Reply::Ran {
                admitted,
                now_ns,
                states,
            }) => Ok(Snapshot {
                admitted,
                now_ns,
                states,
            }),
            Ok(Reply::Late { now_ns }) => {
                self.local.learn_time(now_ns);
                bump(&self.counts.timeouts);
                Err(StoreError::Timeout)
            }
            Err(why) => {
                bump(&self.counts.script_errors);
                Err(StoreError::Failed(Arc::new(why)))
            }
        }
    }
}

/// Reads denied counters again once their current sub-window has closed, off the request
/// path, so the local view learns other instances' hits before it next has to decide.
async fn refresher(
    store: std::sync::Weak<SharedStore>,
    mut jobs: tokio::sync::mpsc::Receiver<Refresh>,
) {
    while let Some(job) = jobs.recv().await {
        let Some(strong) = store.upgrade() else {
            return;
        };
        let wait = until_next_boundary(&job.limits, strong.local.now_ns());
        drop(strong);
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(store) = store.upgrade() else { return };
            let reply = store
                .round_trip(&job.key, &job.limits, Hits::Check, 0)
                .await;
            if let Ok(snapshot) = reply {
                bump(&store.counts.refreshes);
                store.adopt(&job.key, &job.limits, Hits::Check, snapshot);
            }
        });
    }
}

/// Time until the earliest sub-window (or window, or emission interval) boundary.
fn until_next_boundary(limits: &[Limit], now_ns: u64) -> Duration {
    let step = limits
        .iter()
        .map(|l| match l.algorithm {
            Algorithm::SlidingWindow { precision } => l.window_ns / u64::from(precision.max(1)),
            Algorithm::FixedWindow => l.window_ns,
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                l.window_ns / u64::from(l.requests_per_unit.max(1))
            }
        })
        .min()
        .unwrap_or(1_000_000_000)
        .max(1_000_000);
    Duration::from_nanos(step - now_ns % step)
}
