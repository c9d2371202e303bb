//! Slots held by requests in flight (an `in_flight` rule): at most `requests_per_unit`
//! at once. A hit takes slots if they all fit, a refund releases the oldest, and a slot
//! not released within the limit's window (`expire_after`) frees itself, so that a proxy
//! that died holding slots does not hold them for ever.
//!
//! The state is the slots held, grouped by when they free themselves. Releasing the
//! oldest first keeps the slots that live longest, so a leak never makes room early.

use std::time::Duration;

use super::{LimitState, LimitVerdict, MAX_UNITS};
use crate::clock::Timestamp;
use crate::limit::Limit;

/// Slots held, as (when they free themselves, how many), oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Slots {
    held: Vec<(Timestamp, u64)>,
}

impl Slots {
    /// Slots as a store holds them: (when they free themselves, how many), in any order.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn from_held(mut held: Vec<(Timestamp, u64)>) -> Self {
        held.sort_unstable_by_key(|(expires, _)| *expires);
        Self { held }
    }

    /// Slots still held at `now`.
    pub(crate) fn count(&self, now: Timestamp) -> u64 {
        self.live(now).map(|(_, n)| *n).fold(0, u64::saturating_add)
    }

    fn live(&self, now: Timestamp) -> impl Iterator<Item = &(Timestamp, u64)> {
        self.held.iter().filter(move |(expires, _)| *expires > now)
    }

    pub(crate) fn evaluate(&self, limit: &Limit, now: Timestamp, hits: u64) -> LimitVerdict {
        let max = u64::from(limit.requests_per_unit);
        let count = self.count(now);
        let after = count.saturating_add(hits);
        if after <= max {
            return LimitVerdict {
                admitted: true,
                remaining: max - after,
                // Until the slots taken now free themselves, if never released.
                reset: limit.window,
            };
        }
        // Denied: until enough slots free themselves for `hits` to fit (a window when
        // `hits` never fits).
        let mut over = after - max;
        let mut reset = limit.window;
        for (expires, n) in self.live(now) {
            if hits > max {
                break;
            }
            over = over.saturating_sub(*n);
            if over == 0 {
                reset = expires.since(now);
                break;
            }
        }
        LimitVerdict {
            admitted: false,
            remaining: max.saturating_sub(count),
            reset: reset.max(Duration::from_millis(1)),
        }
    }

    /// Takes `hits` slots at `now`, freeing themselves a window later.
    pub(crate) fn record(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        self.forget(now);
        let expires = now + limit.window;
        match self.held.last_mut() {
            Some((last, n)) if *last == expires => *n = n.saturating_add(hits).min(MAX_UNITS),
            // A clock that stepped back places the slots among the others.
            Some((last, _)) if *last > expires => {
                let at = self.held.partition_point(|(e, _)| *e <= expires);
                self.held.insert(at, (expires, hits));
            }
            _ => self.held.push((expires, hits)),
        }
    }

    /// Releases up to `hits` slots, the oldest first.
    pub(crate) fn refund(&mut self, now: Timestamp, hits: u64) {
        self.forget(now);
        let mut left = hits;
        while left > 0 {
            let Some((_, n)) = self.held.first_mut() else {
                break;
            };
            let released = left.min(*n);
            *n -= released;
            left -= released;
            if *n == 0 {
                self.held.remove(0);
            }
        }
    }

    /// Drops the slots that freed themselves by `now`.
    fn forget(&mut self, now: Timestamp) {
        self.held.retain(|(expires, _)| *expires > now);
    }

    /// Drops the slots that freed themselves by `now`, and says how many they were.
    pub(crate) fn expire(&mut self, now: Timestamp) -> u64 {
        let before = self
            .held
            .iter()
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add);
        self.forget(now);
        before.saturating_sub(self.count(now))
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.held.capacity() * std::mem::size_of::<(Timestamp, u64)>()
    }

    /// A window after the last slot frees itself: kept that long so that a call then
    /// finds the slots never released and counts them as expired.
    pub(crate) fn expires_at(&self, limit: &Limit) -> Timestamp {
        self.held
            .last()
            .map(|(e, _)| *e + limit.window)
            .unwrap_or_default()
    }
}

/// The slots of an in-flight counter, if `states` are one.
pub(super) fn of(states: &[LimitState]) -> Option<&Slots> {
    match states {
        [LimitState::Slots(s)] => Some(s),
        _ => None,
    }
}

/// The slots of an in-flight counter, if `states` are one, to change.
pub(super) fn of_mut(states: &mut [LimitState]) -> Option<&mut Slots> {
    match states {
        [LimitState::Slots(s)] => Some(s),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{SECOND, at, limit};
    use crate::limit::Algorithm;

    fn two_slots() -> Limit {
        limit(Algorithm::Slots, 2, 60 * SECOND)
    }

    #[test]
    fn slots_fit_up_to_max_all_or_nothing() {
        let l = two_slots();
        let mut s = Slots::default();
        assert!(!s.evaluate(&l, at(0), 3).admitted, "3 never fit in 2");
        s.record(&l, at(0), 1);
        let second = s.evaluate(&l, at(SECOND), 1);
        assert!(second.admitted);
        assert_eq!(second.remaining, 0);
        s.record(&l, at(SECOND), 1);
        let third = s.evaluate(&l, at(2 * SECOND), 1);
        assert!(!third.admitted);
        assert_eq!(third.remaining, 0);
        assert_eq!(
            third.reset,
            Duration::from_secs(58),
            "the oldest slot frees itself 60 s after it was taken"
        );
    }

    #[test]
    fn a_release_frees_the_oldest_slot_at_once() {
        let l = two_slots();
        let mut s = Slots::default();
        s.record(&l, at(0), 1);
        s.record(&l, at(10 * SECOND), 1);
        s.refund(at(20 * SECOND), 1);
        assert_eq!(s.count(at(20 * SECOND)), 1);
        assert_eq!(s.held, vec![(at(70 * SECOND), 1)], "the newest is kept");
        s.refund(at(20 * SECOND), 5);
        assert_eq!(s.count(at(20 * SECOND)), 0, "a release of more frees all");
    }

    #[test]
    fn a_slot_not_released_frees_itself_after_expire_after() {
        let l = two_slots();
        let mut s = Slots::default();
        s.record(&l, at(0), 2);
        assert!(!s.evaluate(&l, at(60 * SECOND - 1), 1).admitted);
        assert!(s.evaluate(&l, at(60 * SECOND), 2).admitted);
        assert_eq!(
            s.expires_at(&l),
            at(120 * SECOND),
            "kept to count them expired"
        );
        assert_eq!(s.clone().expire(at(60 * SECOND)), 2);
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_slots_in_order() {
        let l = two_slots();
        let mut s = Slots::default();
        s.record(&l, at(10 * SECOND), 1);
        s.record(&l, at(5 * SECOND), 1);
        assert_eq!(s.held, vec![(at(65 * SECOND), 1), (at(70 * SECOND), 1)]);
    }
}
