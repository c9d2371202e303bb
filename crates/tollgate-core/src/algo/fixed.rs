//! The reference service's fixed window: epoch-aligned windows, over iff count + hits > limit.
//! A calendar limit's windows are the calendar's instead (`calendar.rs`); the state then
//! names its window by the window's UTC start in microseconds, as the stores do.
//!
//! Unlike the reference, denied hits are not counted. For single hits the decisions are the
//! same (the reference's counter passes the limit only on requests it denies), and it keeps
//! the count a true count of admitted units, which several limits per counter and the
//! shared-store local view both rely on.

use super::{LimitVerdict, MAX_UNITS};
use crate::clock::{NANOS_PER_MICRO, Timestamp};
use crate::limit::Limit;

/// The count of the window last written, and that window: its index since the epoch, or
/// for a calendar its UTC start in microseconds (later windows are larger either way).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FixedWindow {
    window: u64,
    count: u64,
}

impl FixedWindow {
    /// A window as stored elsewhere: its index since the epoch and its count.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn from_parts(window: u64, count: u64) -> Self {
        Self { window, count }
    }

    fn window_of(limit: &Limit, now: Timestamp) -> u64 {
        match &limit.calendar {
            Some(calendar) => calendar.window_at(now).start.as_nanos() / NANOS_PER_MICRO,
            None => now.as_nanos() / limit.window_nanos(),
        }
    }

    /// When the window named `window` ends.
    fn end_of(limit: &Limit, window: u64) -> Timestamp {
        match &limit.calendar {
            Some(calendar) => {
                calendar
                    .window_at(Timestamp::from_nanos(
                        window.saturating_mul(NANOS_PER_MICRO),
                    ))
                    .end
            }
            None => Timestamp::from_nanos((window + 1).saturating_mul(limit.window_nanos())),
        }
    }

    fn count_at(&self, window: u64) -> u64 {
        // A window before the stored one means the clock stepped back: keep counting there.
        if window <= self.window { self.count } else { 0 }
    }

    pub(crate) fn evaluate(&self, limit: &Limit, now: Timestamp, hits: u64) -> LimitVerdict {
        let window = Self::window_of(limit, now);
        let count = self.count_at(window);
        let limit_units = u64::from(limit.requests_per_unit);
        let after = count.saturating_add(hits);
        let window_end = Self::end_of(limit, window.max(self.window));
        LimitVerdict {
            admitted: after <= limit_units,
            remaining: if after <= limit_units {
                limit_units - after
            } else {
                limit_units.saturating_sub(count)
            },
            // Admitted or not, the counter starts over when the window ends.
            reset: window_end.since(now),
        }
    }

    fn roll(&mut self, limit: &Limit, now: Timestamp) {
        let window = Self::window_of(limit, now);
        if window > self.window {
            self.window = window;
            self.count = 0;
        }
    }

    pub(crate) fn record(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        self.roll(limit, now);
        // Held where the stores hold it, so that a refund after finds the same count.
        self.count = self.count.saturating_add(hits).min(MAX_UNITS);
    }

    pub(crate) fn refund(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        self.roll(limit, now);
        self.count = self.count.saturating_sub(hits);
    }

    /// Gives back up to `hits` units counted at `taken`, if that is still the window
    /// being counted (a lease's unspent block, which an ended window has forgotten). A
    /// calendar window never takes a lease, so nothing is given back there.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn give_back(&mut self, limit: &Limit, now: Timestamp, hits: u64, taken: Timestamp) {
        self.roll(limit, now);
        if limit.calendar.is_none() && Self::window_of(limit, taken) == self.window {
            self.count = self.count.saturating_sub(hits);
        }
    }

    pub(crate) fn expires_at(&self, limit: &Limit) -> Timestamp {
        Self::end_of(limit, self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{SECOND, at, limit};
    use crate::clock::nanos_of;
    use crate::limit::Algorithm;

    #[test]
    fn counts_per_epoch_aligned_window_and_reports_the_window_end() {
        let l = limit(Algorithm::FixedWindow, 2, 60 * SECOND);
        let mut w = FixedWindow::default();
        let now = 125 * SECOND;
        for left in [1, 0] {
            let d = w.evaluate(&l, at(now), 1);
            assert!(d.admitted);
            assert_eq!(d.remaining, left);
            assert_eq!(nanos_of(d.reset), 55 * SECOND);
            w.record(&l, at(now), 1);
        }
        let denied = w.evaluate(&l, at(179 * SECOND), 1);
        assert!(!denied.admitted);
        assert_eq!(nanos_of(denied.reset), SECOND);
        assert!(w.evaluate(&l, at(180 * SECOND), 2).admitted);
    }

    #[test]
    fn a_large_request_that_does_not_fit_is_not_counted() {
        let l = limit(Algorithm::FixedWindow, 10, SECOND);
        let mut w = FixedWindow::default();
        w.record(&l, at(0), 8);
        assert!(!w.evaluate(&l, at(0), 5).admitted);
        // The reference would have counted 13 and denied this one too.
        assert!(w.evaluate(&l, at(0), 2).admitted);
    }

    #[test]
    fn a_count_holds_at_max_units_as_the_stores_do() {
        let l = limit(Algorithm::FixedWindow, 10, SECOND);
        let mut w = FixedWindow::default();
        w.record(&l, at(0), 3);
        w.record(&l, at(0), MAX_UNITS);
        assert_eq!(w.count, MAX_UNITS);
        // A refund of the ceiling empties it, as it does the Redis script's count.
        w.refund(&l, at(0), MAX_UNITS);
        assert_eq!(w.evaluate(&l, at(0), 10).remaining, 0);
        assert!(w.evaluate(&l, at(0), 10).admitted);
    }

    proptest::proptest! {
        /// Against the definition: admit iff the units admitted in the same epoch-aligned
        /// window plus these fit; the advertised wait ends exactly at the window's end.
        #[test]
        fn matches_the_definition(
            arrivals in proptest::collection::vec((0u64..700, 1u64..6), 1..300),
            requests in 0u32..20,
        ) {
            let window = SECOND;
            let l = limit(Algorithm::FixedWindow, requests, window);
            let mut w = FixedWindow::default();
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            let mut t = 0u64;
            for (gap_ms, hits) in arrivals {
                t += gap_ms * crate::clock::NANOS_PER_MILLI;
                let used: u64 = admitted.iter().filter(|(at, _)| at / window == t / window).map(|(_, h)| h).sum();
                let expected = used + hits <= u64::from(requests);
                let d = w.evaluate(&l, at(t), hits);
                proptest::prop_assert_eq!(d.admitted, expected);
                proptest::prop_assert_eq!(nanos_of(d.reset), (t / window + 1) * window - t);
                if d.admitted {
                    w.record(&l, at(t), hits);
                    admitted.push((t, hits));
                }
            }
        }
    }
}
