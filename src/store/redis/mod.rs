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
use std::time::Duration;

pub use connect::Target;

use self::connect::Link;
use super::StoreError;
use super::shards::{Counter, Expiring, ShardStats, Shards};
use crate::limiter::{Clock, Hits, Limit, Outcome, apply, evaluate};
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
#[derive(Debug, Default)]
pub struct RedisStats {
    pub round_trips: AtomicU64,
    pub local_denials: AtomicU64,
    pub timeouts: AtomicU64,
    pub connection_errors: AtomicU64,
    pub script_errors: AtomicU64,
    pub fallbacks: AtomicU64,
}

/// One counter's local view; `shared` is false after it counted hits Redis never saw
/// (while Redis was down), and then it may not deny on Redis' behalf.
#[derive(Debug)]
struct Local {
    counter: Counter,
    shared: bool,
}

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
    pub fn start(config: RedisConfig, clock: Arc<dyn Clock>, sweep_period: Duration) -> Self {
        let local = Arc::new(Shards::new(config.max_local));
        local.spawn_sweeper(clock.clone(), sweep_period);
        Self {
            link: Link::start(config.target.clone()),
            script: script::script(),
            local,
            config,
            clock,
            offset_ns: AtomicI64::new(0),
            stats: RedisStats::default(),
        }
    }

    pub fn is_up(&self) -> bool {
        self.link.is_up()
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
        let shard = self.local.lock(key);
        let local = shard.get(key).filter(|l| l.shared)?;
        let outcome = evaluate(&local.counter.states, limits, now, asked);
        (!outcome.decision.admitted).then_some(outcome)
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
        let raw = match tokio::time::timeout(self.config.timeout, conn.invoke(&invocation)).await {
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
