//! One info line when a counter goes over its limit, not one per denial: counters known to
//! be over (until they would admit again) are remembered, boundedly, and the lines
//! themselves are capped per second, so a flood of denials cannot fill a disk.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::clock::{NANOS_PER_SECOND, Timestamp};
use crate::lock::lock;

/// Counters remembered as over at once; past it, the expired are dropped first, and a
/// counter that finds no room is logged again at its next denial (within the line cap).
const MAX_TRACKED: usize = 10_000;
/// Shards of the remembered counters: a denial locks the one its key hashes to, so that
/// denials of different counters on different cores rarely wait for each other.
const SHARDS: usize = 16;
/// Lines written in one second of the store's clock; the rest are counted and the count
/// is told in the next line written.
const MAX_LINES_PER_SECOND: u32 = 10;

/// The counters now over their limits, by a hash of their key, and the line budget.
#[derive(Debug, Default)]
pub(super) struct OverLimitLog {
    hasher: RandomState,
    shards: [Mutex<Shard>; SHARDS],
    /// Taken only when a counter goes over, not for its further denials.
    budget: Mutex<Budget>,
}

/// Some of the counters now over.
#[derive(Debug, Default)]
struct Shard {
    /// Key hash → when the counter would admit again (store clock).
    over_until: HashMap<u64, Timestamp>,
    /// The second expired entries were last dropped in.
    purged: u64,
}

/// The lines written in the current second, and the transitions not logged.
#[derive(Debug, Default)]
struct Budget {
    second: u64,
    lines: u32,
    unlogged: u64,
}

impl OverLimitLog {
    /// A denial of counter `key` at `now` that denies until `until`: Some(lines not
    /// logged since the last one) when this is the counter going over and a line is due.
    pub(super) fn went_over(&self, key: &str, now: Timestamp, until: Timestamp) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let second = now.as_nanos() / NANOS_PER_SECOND;
        {
            // The remainder is below SHARDS.
            let shard = &self.shards[(hash % SHARDS as u64) as usize];
            // Updates here are plain field writes: a poisoned lock is still usable.
            let mut shard = lock(shard);
            if let Some(over) = shard.over_until.get_mut(&hash)
                && *over > now
            {
                *over = (*over).max(until);
                return None;
            }
            let cap = MAX_TRACKED / SHARDS;
            if shard.over_until.len() >= cap && shard.purged != second {
                shard.purged = second;
                shard.over_until.retain(|_, over| *over > now);
            }
            if shard.over_until.len() < cap || shard.over_until.contains_key(&hash) {
                shard.over_until.insert(hash, until);
            }
        }
        let mut budget = lock(&self.budget);
        if budget.second != second {
            budget.second = second;
            budget.lines = 0;
        }
        if budget.lines >= MAX_LINES_PER_SECOND {
            budget.unlogged += 1;
            return None;
        }
        budget.lines += 1;
        Some(std::mem::take(&mut budget.unlogged))
    }

    /// Counters remembered as over.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        let held = |s: &Mutex<Shard>| s.lock().map_or(0, |s| s.over_until.len());
        self.shards.iter().map(held).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `seconds` after the epoch.
    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_nanos(seconds * NANOS_PER_SECOND)
    }

    #[test]
    fn a_counter_is_logged_when_it_goes_over_and_again_only_after_it_admitted() {
        let log = OverLimitLog::default();
        assert_eq!(log.went_over("a", at(10), at(12)), Some(0));
        assert_eq!(log.went_over("a", at(11), at(12)), None);
        assert_eq!(log.went_over("b", at(11), at(12)), Some(0));
        // Past the time it would admit again, a denial is a new transition.
        assert_eq!(log.went_over("a", at(12), at(13)), Some(0));
    }

    #[test]
    fn lines_are_capped_per_second_and_the_rest_counted() {
        let log = OverLimitLog::default();
        let logged = (0..25)
            .filter(|i| log.went_over(&format!("k{i}"), at(5), at(60)).is_some())
            .count();
        assert_eq!(logged, MAX_LINES_PER_SECOND as usize);
        assert_eq!(log.went_over("next", at(6), at(60)), Some(15));
    }

    #[test]
    fn memory_is_bounded_by_the_tracked_cap() {
        let log = OverLimitLog::default();
        // Four times the cap: every shard gets far more keys than its share.
        for i in 0..4 * MAX_TRACKED {
            log.went_over(&format!("k{i}"), at(5), at(60));
        }
        assert_eq!(log.tracked(), MAX_TRACKED);
        // Once the remembered have admitted again, they make room for new ones.
        log.went_over("late", at(61), at(62));
        assert!(log.tracked() <= MAX_TRACKED);
        assert_eq!(log.went_over("late", at(61), at(62)), None, "remembered");
    }
}
