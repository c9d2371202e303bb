//! The shared store: counters in Redis, with a local view that denies without a round trip.
//!
//! Synchronous writes, asynchronous reads: a request the local view already knows to be over
//! the limit is denied here; any other request makes one round trip that checks and counts
//! atomically in Redis and returns the counter's state, which becomes the local view. The
//! local view is only ever a past snapshot of Redis (which already holds this instance's
//! own admitted hits), so it is never above the shared count: a local denial is the
//! decision Redis would make.

mod connect;
mod script;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::metrics::AtomicHistogram;

pub use connect::Target;

use self::connect::Link;
use super::StoreError;
use super::shards::{Counter, Expiring, ShardStats, Shards};
use crate::limiter::{Algorithm, Clock, Hits, Limit, Outcome, apply, evaluate};
use crate::settings::OnStoreError;

/// How a Redis store is set up.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    pub target: Target,
    pub key_prefix: String,
    pub timeout: Duration,
    pub on_error: OnStoreError,
    /// Most counters kept in the local view.
    pub max_local: usize,
}

/// Counts for metrics.
#[derive(Debug)]
pub struct RedisStats {
    pub latency: AtomicHistogram,
    pub round_trips: AtomicU64,
    pub local_denials: AtomicU64,
    pub timeouts: AtomicU64,
    pub connection_errors: AtomicU64,
    pub script_errors: AtomicU64,
    pub fallbacks: AtomicU64,
    pub refreshes: AtomicU64,
}

impl Default for RedisStats {
    fn default() -> Self {
        Self {
            // 25 µs to ~0.4 s.
            latency: AtomicHistogram::new(0.000_025, 15),
            round_trips: AtomicU64::default(),
            local_denials: AtomicU64::default(),
            timeouts: AtomicU64::default(),
            connection_errors: AtomicU64::default(),
            script_errors: AtomicU64::default(),
            fallbacks: AtomicU64::default(),
            refreshes: AtomicU64::default(),
        }
    }
}

/// One counter's local view; `shared` is false after it counted hits Redis never saw
/// (while Redis was down), and then it may not deny on Redis' behalf. `refreshing` is set
/// while a background read of it is queued.
#[derive(Debug)]
struct Local {
    counter: Counter,
    shared: bool,
    refreshing: bool,
}

/// A counter to read again in the background once its current sub-window closes.
struct Refresh {
    key: Box<str>,
    limits: Vec<Limit>,
}

/// Refreshes queued at most; past that, denials just skip queueing one.
const REFRESH_QUEUE: usize = 4_096;

impl Expiring for Local {
    fn expires_at_ns(&self) -> u64 {
        self.counter.expires_at_ns
    }
}

/// The Redis store.
pub struct RedisStore {
    link: Arc<Link>,
    script: redis::Script,
    local: Arc<Shards<Local>>,
    config: RedisConfig,
    clock: Arc<dyn Clock>,
    /// Redis time minus local time, learned from every reply.
    offset_ns: AtomicI64,
    refresh_tx: tokio::sync::mpsc::Sender<Refresh>,
    pub stats: RedisStats,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("up", &self.link.is_up())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Starts connecting in the background; requests fail over per `on_error` until Redis
    /// answers.
    pub fn start(config: RedisConfig, clock: Arc<dyn Clock>, sweep_period: Duration) -> Arc<Self> {
        let local = Arc::new(Shards::new(config.max_local));
        local.spawn_sweeper(clock.clone(), sweep_period);
        let (refresh_tx, refresh_rx) = tokio::sync::mpsc::channel(REFRESH_QUEUE);
        let store = Arc::new(Self {
            link: Link::start(config.target.clone()),
            script: script::script(),
            local,
            config,
            clock,
            offset_ns: AtomicI64::new(0),
            refresh_tx,
            stats: RedisStats::default(),
        });
        tokio::spawn(refresher(Arc::downgrade(&store), refresh_rx));
        store
    }

    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }

    /// Waits until Redis answers, at most `limit`; whether it does. Serving before the
    /// first connection would make a fresh instance decide from an empty local view.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        self.link.wait_up(limit).await
    }

    pub fn on_error(&self) -> OnStoreError {
        self.config.on_error
    }

    pub fn reconnects(&self) -> u64 {
        self.link.reconnects.load(Ordering::Relaxed)
    }

    pub fn local_stats(&self) -> ShardStats {
        self.local.stats()
    }

    /// Local time moved onto Redis' clock.
    fn now_ns(&self) -> u64 {
        self.clock
            .now_ns()
            .saturating_add_signed(self.offset_ns.load(Ordering::Relaxed))
    }

    pub async fn apply(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<Outcome, StoreError> {
        let now = self.now_ns();
        if let Some(denied) = self.deny_locally(key, limits, now, hits) {
            self.stats.local_denials.fetch_add(1, Ordering::Relaxed);
            return Ok(denied);
        }
        match self.round_trip(key, limits, hits).await {
            Ok(reply) => {
                self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
                Ok(self.adopt(key, limits, hits, reply))
            }
            Err(e) => {
                self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                self.fall_back(key, limits, now, hits, e)
            }
        }
    }

    /// The local view's denial, if it has one: no network involved.
    fn deny_locally(&self, key: &str, limits: &[Limit], now: u64, hits: Hits) -> Option<Outcome> {
        let asked = match hits {
            Hits::Consume(n) => n,
            Hits::Check => 1,
            Hits::Refund(_) => return None,
        };
        let mut shard = self.local.lock(key);
        let local = shard.get_mut(key).filter(|l| l.shared)?;
        let outcome = evaluate(&local.counter.states, limits, now, asked);
        if outcome.decision.admitted {
            return None;
        }
        if !local.refreshing {
            let job = Refresh {
                key: key.into(),
                limits: limits.to_vec(),
            };
            local.refreshing = self.refresh_tx.try_send(job).is_ok();
        }
        Some(outcome)
    }

    async fn round_trip(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<script::Reply, StoreError> {
        let Some(mut conn) = self.link.conn() else {
            return Err(StoreError::Unavailable("redis is not connected".into()));
        };
        let redis_key = format!("{}{{{key}}}", self.config.key_prefix);
        let mut invocation = self.script.key(redis_key);
        script::add_args(&mut invocation, limits, hits);
        let started = Instant::now();
        let answer = tokio::time::timeout(self.config.timeout, conn.invoke(&invocation)).await;
        self.stats.latency.observe(started.elapsed());
        let raw = match answer {
            Err(_) => {
                self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                self.link.report_slow();
                return Err(StoreError::Timeout);
            }
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(raw)) => raw,
        };
        script::decode(raw, limits).map_err(|why| {
            self.stats.script_errors.fetch_add(1, Ordering::Relaxed);
            StoreError::Unavailable(format!("unexpected script reply: {why}"))
        })
    }

    fn classify(&self, e: redis::RedisError) -> StoreError {
        let lost = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if lost {
            // Gone, or a former master after a failover: reconnect (and re-resolve).
            self.stats.connection_errors.fetch_add(1, Ordering::Relaxed);
            self.link.report_down();
        } else {
            self.stats.script_errors.fetch_add(1, Ordering::Relaxed);
        }
        StoreError::Unavailable(e.to_string())
    }

    /// Turns Redis' answer into the decision and the new local view.
    fn adopt(&self, key: &str, limits: &[Limit], hits: Hits, reply: script::Reply) -> Outcome {
        let local_now = self.clock.now_ns();
        let offset = i128::from(reply.now_ns) - i128::from(local_now);
        self.offset_ns.store(
            offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            Ordering::Relaxed,
        );

        let mut counter = Counter {
            states: reply.states,
            expires_at_ns: 0,
        };
        let mut outcome = apply(&mut counter.states, limits, reply.now_ns, hits);
        if let Hits::Consume(n) = hits
            && outcome.decision.admitted != reply.admitted
        {
            // Redis decides; Lua's floating point can differ from ours at the exact limit.
            for (state, limit) in counter.states.iter_mut().zip(limits) {
                if reply.admitted {
                    state.record(limit, reply.now_ns, n);
                } else {
                    state.refund(limit, reply.now_ns, n);
                }
            }
            outcome.decision.admitted = reply.admitted;
            outcome.decision.remaining = 0;
        }
        counter.touch(limits, reply.now_ns);
        if counter.expires_at_ns > reply.now_ns {
            let mut shard = self.local.lock(key);
            self.local.insert(
                &mut shard,
                key,
                Local {
                    counter,
                    shared: true,
                    refreshing: false,
                },
            );
        }
        outcome
    }

    /// The answer when Redis could not give one, per `--on-store-error`.
    fn fall_back(
        &self,
        key: &str,
        limits: &[Limit],
        now: u64,
        hits: Hits,
        e: StoreError,
    ) -> Result<Outcome, StoreError> {
        let forced = match self.config.on_error {
            OnStoreError::Error => return Err(e),
            OnStoreError::Local => None,
            OnStoreError::Allow => Some(true),
            OnStoreError::Deny => Some(false),
        };
        let mut shard = self.local.lock(key);
        if let Some(admitted) = forced {
            let states = shard.get(key).map(|l| l.counter.states.clone());
            let states = states.unwrap_or_else(|| Counter::new(limits).states);
            let mut outcome = evaluate(&states, limits, now, 1);
            outcome.decision.admitted = admitted;
            if !admitted {
                outcome.decision.remaining = 0;
            }
            return Ok(outcome);
        }
        // Decide as the memory store would; the view then holds hits Redis never saw.
        let local = match shard.get_mut(key) {
            Some(local) => local,
            None => {
                self.local.insert(
                    &mut shard,
                    key,
                    Local {
                        counter: Counter::new(limits),
                        shared: false,
                        refreshing: false,
                    },
                );
                shard.get_mut(key).ok_or(StoreError::Timeout)?
            }
        };
        let outcome = apply(&mut local.counter.states, limits, now, hits);
        local.counter.touch(limits, now);
        local.shared = false;
        Ok(outcome)
    }
}

/// Reads denied counters again once their current sub-window has closed, off the request
/// path, so the local view learns other instances' hits before it next has to decide.
async fn refresher(
    store: std::sync::Weak<RedisStore>,
    mut jobs: tokio::sync::mpsc::Receiver<Refresh>,
) {
    while let Some(job) = jobs.recv().await {
        let Some(strong) = store.upgrade() else {
            return;
        };
        let wait = until_next_boundary(&job.limits, strong.now_ns());
        drop(strong);
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(store) = store.upgrade() else { return };
            if let Ok(reply) = store.round_trip(&job.key, &job.limits, Hits::Check).await {
                store.stats.refreshes.fetch_add(1, Ordering::Relaxed);
                store.adopt(&job.key, &job.limits, Hits::Check, reply);
            }
        });
    }
}

/// Time until the earliest sub-window (or window, or emission interval) boundary.
fn until_next_boundary(limits: &[Limit], now_ns: u64) -> Duration {
    let step = limits
        .iter()
        .map(|l| match l.algorithm {
            Algorithm::SlidingWindow => l.window_ns / u64::from(l.precision.max(1)),
            Algorithm::FixedWindow => l.window_ns,
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                l.window_ns / u64::from(l.requests_per_unit.max(1))
            }
        })
        .min()
        .unwrap_or(1_000_000_000)
        .max(1_000_000);
    Duration::from_nanos(step - now_ns % step)
}
