//! One info line when a counter goes over its limit, not one per denial: counters known to
//! be over (until they would admit again) are remembered, boundedly, and the lines
//! themselves are capped per second, so a flood of denials cannot fill a disk.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::clock::{NANOS_PER_SECOND, Timestamp};

/// Counters remembered as over at once; past it, the expired are dropped first, and a
/// counter that finds no room is logged again at its next denial (within the line cap).
const MAX_TRACKED: usize = 10_000;
/// Lines written in one second of the store's clock; the rest are counted and the count
/// is told in the next line written.
const MAX_LINES_PER_SECOND: u32 = 10;

/// The counters now over their limits, by a hash of their key, and the line budget.
#[derive(Debug, Default)]
pub(super) struct OverLimitLog {
    hasher: RandomState,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Key hash → when the counter would admit again (store clock).
    over_until: HashMap<u64, Timestamp>,
    /// The second the line budget counts in, and the lines written in it.
    second: u64,
    lines: u32,
    /// The second expired entries were last dropped in.
    purged: u64,
    /// Transitions not logged since the last line.
    unlogged: u64,
}

impl OverLimitLog {
    /// A denial of counter `key` at `now` that denies until `until`: Some(lines not
    /// logged since the last one) when this is the counter going over and a line is due.
    pub(super) fn went_over(&self, key: &str, now: Timestamp, until: Timestamp) -> Option<u64> {
        let hash = self.hasher.hash_one(key);
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(over) = inner.over_until.get_mut(&hash)
            && *over > now
        {
            *over = (*over).max(until);
            return None;
        }
        let second = now.as_nanos() / NANOS_PER_SECOND;
        if inner.over_until.len() >= MAX_TRACKED && inner.purged != second {
            inner.purged = second;
            inner.over_until.retain(|_, over| *over > now);
        }
        if inner.over_until.len() < MAX_TRACKED || inner.over_until.contains_key(&hash) {
            inner.over_until.insert(hash, until);
        }
        if inner.second != second {
            inner.second = second;
            inner.lines = 0;
        }
        if inner.lines >= MAX_LINES_PER_SECOND {
            inner.unlogged += 1;
            return None;
        }
        inner.lines += 1;
        Some(std::mem::take(&mut inner.unlogged))
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
        for i in 0..MAX_TRACKED + 500 {
            log.went_over(&format!("k{i}"), at(5), at(60));
        }
        let inner = log.inner.lock().expect("not poisoned");
        assert_eq!(inner.over_until.len(), MAX_TRACKED);
    }
}
