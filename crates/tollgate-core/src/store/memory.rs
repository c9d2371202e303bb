//! The in-process store, the embedded default: counters in a [`Shards`] map.

mod together;

use std::sync::Arc;
use std::time::Duration;

use super::StoreStats;
use super::peek::CounterView;
use super::shards::{CounterState, Shards};
use crate::algo::{Hits, Verdict, apply};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::limit::Limit;

/// How much a store may hold in memory: counters, and bytes they take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Counters held at most.
    pub counters: usize,
    /// Bytes the counters take at most (tables and states); the byte cap is what holds
    /// when keys are long or limits have many sub-windows.
    pub bytes: usize,
}

impl Default for Capacity {
    /// A million counters, in at most 256 MiB.
    fn default() -> Self {
        Self {
            counters: 1_000_000,
            bytes: 256 << 20,
        }
    }
}

/// The memory store; cheap to clone (shared inside).
#[derive(Clone)]
pub struct MemoryStore {
    counters: Arc<Shards<CounterState>>,
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
    /// The default [`Capacity`] on the system clock.
    fn default() -> Self {
        Self::new(Capacity::default(), Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// A store holding at most about `capacity`, on `clock`.
    pub fn new(capacity: Capacity, clock: Arc<dyn Clock>) -> Self {
        Self {
            counters: Arc::new(Shards::new(capacity.counters, capacity.bytes)),
            clock,
        }
    }

    /// Applies `hits` to counter `key`, creating it if needed: [`crate::Store::apply`]
    /// without the wait, for callers that know their store is in memory.
    pub(crate) fn apply(&self, key: &str, limits: &[Limit], hits: Hits) -> Verdict {
        let now = self.clock.now();
        let mut slot = self.counters.lock(key);
        if let Some(counter) = slot.get_mut() {
            let outcome = apply(counter.states.as_mut_slice(), limits, now, hits);
            counter.touch(limits, &outcome);
            return outcome;
        }
        let mut counter = CounterState::new(limits);
        let outcome = apply(counter.states.as_mut_slice(), limits, now, hits);
        // Only counted units need remembering; a check or refund of nothing leaves no trace.
        let counted = match hits {
            Hits::Consume(n) => outcome.decision.admitted && n > 0,
            Hits::Charge(n) => n > 0,
            Hits::Check | Hits::Refund(_) => false,
        };
        if counted {
            counter.touch(limits, &outcome);
            slot.insert(counter, now);
        }
        outcome
    }

    /// Counter `key` as held now, and what `hits` more would get; changes nothing.
    pub(crate) fn peek(&self, key: &str, limits: &[Limit], hits: u64) -> CounterView {
        let now = self.clock.now();
        let slot = self.counters.lock(key);
        let states = slot.get().map(|c| c.states.as_slice());
        CounterView::of(states, limits, now, hits)
    }

    /// Drops counter `key`: it starts again empty.
    pub fn reset(&self, key: &str) {
        self.counters.lock(key).remove();
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
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
            bytes: shards.bytes,
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
    use crate::clock::{ManualClock, Timestamp};
    use std::time::Duration;

    fn store(counters: usize) -> (MemoryStore, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_nanos(1_000 * SECOND));
        let capacity = Capacity {
            counters,
            bytes: usize::MAX,
        };
        (MemoryStore::new(capacity, Arc::new(clock.clone())), clock)
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
        s.counters.sweep(s.clock.now());
        assert_eq!(s.stats().counters, 1);
        clock.advance(Duration::from_nanos(2 * SECOND));
        s.counters.sweep(s.clock.now());
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

    #[test]
    fn memory_is_bounded_in_bytes_whatever_the_keys_and_limits() {
        let clock = ManualClock::new(Timestamp::from_nanos(1_000 * SECOND));
        let capacity = Capacity {
            counters: usize::MAX,
            bytes: 2 << 20,
        };
        let s = MemoryStore::new(capacity, Arc::new(clock));
        // A thousand sub-windows: 4 KB of state per counter; keys of 12 KiB.
        let mut fine = limit(SLIDING, 1_000, 10 * SECOND);
        fine.algorithm = crate::limit::Algorithm::SlidingWindow { precision: 1_000 };
        let limits = [fine];
        let long = "|".repeat(12 << 10);
        for i in 0..20_000 {
            s.apply(&format!("{long}{i}"), &limits, Hits::Consume(1));
        }
        let stats = s.stats();
        assert!(stats.bytes <= 2 << 20, "{stats:?}");
        assert!(
            stats.counters > 100,
            "the cap still holds counters: {stats:?}"
        );
        assert_eq!(stats.evictions as usize + stats.counters, 20_000);
    }

    #[test]
    fn a_flood_of_new_keys_evicts_light_counters_not_full_ones() {
        let (s, _) = store(1_024);
        let limits = [limit(FIXED, 100, 3_600 * SECOND)];
        for _ in 0..100 {
            assert!(
                s.apply("victim", &limits, Hits::Consume(1))
                    .decision
                    .admitted
            );
        }
        for i in 0..100_000 {
            s.apply(&format!("flood-{i}"), &limits, Hits::Consume(1));
        }
        assert!(s.stats().evictions >= 98_000);
        assert!(
            !s.apply("victim", &limits, Hits::Consume(1))
                .decision
                .admitted,
            "the full counter survived the flood"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_runs_until_the_store_is_dropped() {
        let (s, clock) = store(100);
        let limits = [limit(SLIDING, 5, SECOND)];
        s.apply("a", &limits, Hits::Consume(1));
        s.spawn_sweeper(Duration::from_secs(1));
        clock.advance(Duration::from_nanos(5 * SECOND));
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
