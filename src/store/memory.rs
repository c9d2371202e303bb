//! The in-process store: a sharded map of counter key → limit states.
//!
//! Each shard has its own lock, held only for one synchronous update, never across an
//! await. Expired counters are swept in the background; a cap on counters bounds memory
//! when a flood of distinct values arrives.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::limiter::{Clock, Hits, Limit, LimitState, Outcome, apply};

/// Counters evicted when a full shard needs room: the soonest-expiring of a few samples.
const EVICTION_SAMPLES: usize = 8;

/// The memory store; cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    per_shard_cap: usize,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    expired: AtomicU64,
}

type Shard = HashMap<Box<str>, Counter>;

/// The states of one counter's limits and when all of them stop mattering.
struct Counter {
    states: Vec<LimitState>,
    expires_at_ns: u64,
}

/// Counts for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub counters: usize,
    pub evictions: u64,
    pub expired: u64,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("stats", &self.stats())
            .finish()
    }
}

impl MemoryStore {
    /// A store holding at most about `max_counters` counters.
    pub fn new(max_counters: usize, clock: Arc<dyn Clock>) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .saturating_mul(16)
            .next_power_of_two()
            .clamp(16, 1024);
        let shards = shards.min(max_counters.max(1));
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
                hasher: RandomState::new(),
                per_shard_cap: max_counters.div_ceil(shards).max(1),
                clock,
                evictions: AtomicU64::new(0),
                expired: AtomicU64::new(0),
            }),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let inner = &self.inner;
        let index = (inner.hasher.hash_one(key) as usize) % inner.shards.len();
        // A panic while holding a shard lock cannot leave a counter half-updated (updates
        // are plain field writes), so a poisoned lock is still safe to use.
        inner.shards[index]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `hits` to counter `key`, creating it if needed.
    pub fn apply(&self, key: &str, limits: &[Limit], hits: Hits) -> Outcome {
        let now = self.inner.clock.now_ns();
        let mut shard = self.shard(key);
        if let Some(counter) = shard.get_mut(key) {
            return update(counter, limits, now, hits);
        }
        let mut counter = Counter {
            states: limits.iter().map(LimitState::new).collect(),
            expires_at_ns: 0,
        };
        let outcome = update(&mut counter, limits, now, hits);
        // Only a consumed unit needs remembering; a check or refund of nothing leaves no trace.
        if matches!(hits, Hits::Consume(n) if n > 0) && outcome.decision.admitted {
            if shard.len() >= self.inner.per_shard_cap {
                self.evict_one(&mut shard);
            }
            shard.insert(key.into(), counter);
        }
        outcome
    }

    fn evict_one(&self, shard: &mut Shard) {
        let victim = shard
            .iter()
            .take(EVICTION_SAMPLES)
            .min_by_key(|(_, c)| c.expires_at_ns)
            .map(|(k, _)| k.clone());
        if let Some(victim) = victim {
            shard.remove(&victim);
            self.inner.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops every counter that no longer affects a decision.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_ns();
        for shard in self.inner.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.len();
            shard.retain(|_, c| c.expires_at_ns > now);
            let removed = (before - shard.len()) as u64;
            self.inner.expired.fetch_add(removed, Ordering::Relaxed);
        }
    }

    /// Sweeps every `period` until the store is dropped.
    pub fn spawn_sweeper(&self, period: Duration) {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                MemoryStore { inner }.sweep();
            }
        });
    }

    pub fn stats(&self) -> MemoryStats {
        let counters = self
            .inner
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum();
        MemoryStats {
            counters,
            evictions: self.inner.evictions.load(Ordering::Relaxed),
            expired: self.inner.expired.load(Ordering::Relaxed),
        }
    }
}

fn update(counter: &mut Counter, limits: &[Limit], now: u64, hits: Hits) -> Outcome {
    let outcome = apply(&mut counter.states, limits, now, hits);
    counter.expires_at_ns = counter
        .states
        .iter()
        .zip(limits)
        .map(|(s, l)| s.expires_at_ns(l))
        .max()
        .unwrap_or(now);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::testing::{SECOND, limit};
    use crate::limiter::{Algorithm, ManualClock};

    fn store(cap: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new(1_000 * SECOND);
        (MemoryStore::new(cap, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn counters_are_independent_per_key() {
        let (s, _) = store(100);
        let limits = [limit(Algorithm::SlidingWindow, 1, SECOND)];
        assert!(s.apply("a", &limits, Hits::Consume(1)).decision.admitted);
        assert!(!s.apply("a", &limits, Hits::Consume(1)).decision.admitted);
        assert!(s.apply("b", &limits, Hits::Consume(1)).decision.admitted);
    }

    #[test]
    fn denied_checks_and_refunds_create_no_counter() {
        let (s, _) = store(100);
        let zero = [limit(Algorithm::SlidingWindow, 0, SECOND)];
        assert!(!s.apply("a", &zero, Hits::Consume(1)).decision.admitted);
        let one = [limit(Algorithm::SlidingWindow, 1, SECOND)];
        s.apply("b", &one, Hits::Check);
        s.apply("c", &one, Hits::Refund(3));
        assert_eq!(s.stats().counters, 0);
    }

    #[test]
    fn expired_counters_are_swept() {
        let (s, clock) = store(100);
        let limits = [limit(Algorithm::SlidingWindow, 5, SECOND)];
        s.apply("a", &limits, Hits::Consume(1));
        s.sweep();
        assert_eq!(s.stats().counters, 1);
        clock.advance(2 * SECOND);
        s.sweep();
        assert_eq!(
            s.stats(),
            MemoryStats {
                counters: 0,
                evictions: 0,
                expired: 1
            }
        );
    }

    #[test]
    fn a_flood_of_keys_is_capped_by_evicting() {
        let (s, _) = store(64);
        let limits = [limit(Algorithm::FixedWindow, 1, 60 * SECOND)];
        for i in 0..10_000 {
            assert!(
                s.apply(&format!("k{i}"), &limits, Hits::Consume(1))
                    .decision
                    .admitted
            );
        }
        let stats = s.stats();
        assert!(stats.counters <= 64, "{stats:?}");
        assert_eq!(stats.evictions as usize + stats.counters, 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_runs_until_the_store_is_dropped() {
        let (s, clock) = store(100);
        let limits = [limit(Algorithm::SlidingWindow, 5, SECOND)];
        s.apply("a", &limits, Hits::Consume(1));
        s.spawn_sweeper(Duration::from_secs(1));
        clock.advance(5 * SECOND);
        // Paused tokio time jumps to the sweeper's next tick whenever this task waits.
        for _ in 0..30 {
            if s.stats().counters == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(s.stats().expired, 1);
    }
}
