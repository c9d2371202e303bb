//! The in-process store, the embedded default: counters in a [`Shards`] map.

use std::sync::Arc;
use std::time::Duration;

use super::StoreStats;
use super::shards::{Counter, Shards};
use crate::algo::{Hits, Verdict, apply};
use crate::clock::{Clock, SystemClock};
use crate::limit::Limit;

/// Counters the memory store keeps unless told otherwise.
pub const DEFAULT_MAX_COUNTERS: usize = 1_000_000;

/// The memory store; cheap to clone (shared inside).
#[derive(Clone)]
pub struct MemoryStore {
    counters: Arc<Shards<Counter>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for MemoryStore {
    /// [`DEFAULT_MAX_COUNTERS`] on the system clock.
    fn default() -> Self {
        Self::new(DEFAULT_MAX_COUNTERS, Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// A store holding at most about `max_counters` counters, on `clock`.
    pub fn new(max_counters: usize, clock: Arc<dyn Clock>) -> Self {
        Self {
            counters: Arc::new(Shards::new(max_counters)),
            clock,
        }
    }

    /// Applies `hits` to counter `key`, creating it if needed.
    pub(crate) fn apply(&self, key: &str, limits: &[Limit], hits: Hits) -> Verdict {
        let now = self.clock.now_ns();
        let mut shard = self.counters.lock(key);
        if let Some(counter) = shard.get_mut(key) {
            let outcome = apply(&mut counter.states, limits, now, hits);
            counter.touch(limits, now);
            return outcome;
        }
        let mut counter = Counter::new(limits);
        let outcome = apply(&mut counter.states, limits, now, hits);
        // Only counted units need remembering; a check or refund of nothing leaves no trace.
        let counted = match hits {
            Hits::Consume(n) => outcome.decision.admitted && n > 0,
            Hits::Charge(n) => n > 0,
            Hits::Check | Hits::Refund(_) => false,
        };
        if counted {
            counter.touch(limits, now);
            self.counters.insert(&mut shard, key, counter);
        }
        outcome
    }

    /// Drops expired counters every `period`, from a task on the current tokio runtime,
    /// until the store is dropped.
    pub fn spawn_sweeper(&self, period: Duration) {
        self.counters.spawn_sweeper(self.clock.clone(), period);
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let shards = self.counters.stats();
        StoreStats {
            up: true,
            counters: shards.entries,
            evictions: shards.evictions,
            expired: shards.expired,
            shared: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{FIXED, SECOND, SLIDING, limit};
    use crate::clock::ManualClock;

    fn store(cap: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new(1_000 * SECOND);
        (MemoryStore::new(cap, Arc::new(clock.clone())), clock)
    }

    #[test]
    fn counters_are_independent_per_key() {
        let (s, _) = store(100);
        let limits = [limit(SLIDING, 1, SECOND)];
        assert!(s.apply("a", &limits, Hits::Consume(1)).decision.admitted);
        assert!(!s.apply("a", &limits, Hits::Consume(1)).decision.admitted);
        assert!(s.apply("b", &limits, Hits::Consume(1)).decision.admitted);
    }

    #[test]
    fn denied_checks_and_refunds_create_no_counter() {
        let (s, _) = store(100);
        let zero = [limit(SLIDING, 0, SECOND)];
        assert!(!s.apply("a", &zero, Hits::Consume(1)).decision.admitted);
        let one = [limit(SLIDING, 1, SECOND)];
        s.apply("b", &one, Hits::Check);
        s.apply("c", &one, Hits::Refund(3));
        assert_eq!(s.stats().counters, 0);
    }

    #[test]
    fn expired_counters_are_swept() {
        let (s, clock) = store(100);
        let limits = [limit(SLIDING, 5, SECOND)];
        s.apply("a", &limits, Hits::Consume(1));
        s.counters.sweep(s.clock.now_ns());
        assert_eq!(s.stats().counters, 1);
        clock.advance(2 * SECOND);
        s.counters.sweep(s.clock.now_ns());
        let stats = s.stats();
        assert_eq!((stats.counters, stats.evictions, stats.expired), (0, 0, 1));
    }

    #[test]
    fn a_flood_of_keys_is_capped_by_evicting() {
        let (s, _) = store(64);
        let limits = [limit(FIXED, 1, 60 * SECOND)];
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
        let limits = [limit(SLIDING, 5, SECOND)];
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
