//! The decreases a local view has heard of, so that it adopts no answer older than one.
//!
//! A call that ran in the store before another instance's refund may be answered after the
//! refund's announcement was heard: adopting it would bring back the count the refund
//! took away. Each key hashes to one of a fixed number of slots holding the store time of
//! the latest decrease heard for any key there; an answer stamped at or before it is not
//! adopted. Keys sharing a slot only cost that a few answers in flight are not adopted
//! (the next request asks the store); memory stays fixed whatever the keys.
//!
//! A stamp is believed only near the store's clock: a decrease is announced as soon as
//! the store ran it, and heard within milliseconds. One stamped far ahead would keep its
//! slot's answers from being adopted until a restart (a stamp of 2^64 − 1 did, and with
//! the store then unreachable the empty views admitted a limit twice over); one far
//! behind describes nothing this instance still holds. Both are ignored, and counted.

use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;

/// Slots: 8 KiB, far more than the keys decreased while an answer is on its way.
const SLOTS: usize = 1024;
/// How far ahead of the store's clock, as this instance knows it, a stamp may be: the
/// clock is learned from answers a round trip old, and instances learn it apart.
pub(crate) const STAMP_AHEAD: Duration = Duration::from_secs(5);
/// How far behind it a stamp may be: an announcement an hour late is none of ours.
pub(crate) const STAMP_BEHIND: Duration = Duration::from_secs(3_600);

/// The store time of the latest decrease heard, per slot of keys.
pub(crate) struct Decreases {
    slots: Box<[AtomicU64]>,
    /// Decreases ignored for a stamp far from the store's clock.
    ignored: AtomicU64,
}

impl Default for Decreases {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ignored: AtomicU64::new(0),
        }
    }
}

impl Decreases {
    fn slot(&self, key: &str) -> &AtomicU64 {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        // The remainder is below SLOTS, a usize.
        &self.slots[(hash % SLOTS as u64) as usize]
    }

    /// Counter `key` went down at store time `at`, heard at store time `now`; false, and
    /// counted, if `at` is too far from `now` to be believed.
    pub(crate) fn heard(&self, key: &str, at: Timestamp, now: Timestamp) -> bool {
        if at > now + STAMP_AHEAD || at < now - STAMP_BEHIND {
            self.ignored.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.slot(key).fetch_max(at.as_nanos(), Ordering::Relaxed);
        true
    }

    /// Decreases ignored so far for their stamps.
    pub(crate) fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }

    /// Whether an answer for `key` stamped `at` may predate a decrease heard of.
    pub(crate) fn predates(&self, key: &str, at: Timestamp) -> bool {
        at.as_nanos() <= self.slot(key).load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_stale_up_to_the_latest_decrease_of_its_slot() {
        let d = Decreases::default();
        let t = Timestamp::from_micros(5_000_000);
        assert!(!d.predates("k", Timestamp::from_micros(1)));
        assert!(d.heard("k", t, t));
        assert!(d.predates("k", Timestamp::from_micros(4_999_999)));
        assert!(d.predates("k", t), "the same microsecond may be before it");
        assert!(!d.predates("k", Timestamp::from_micros(5_000_001)));
        // An older decrease heard late never lowers the mark.
        assert!(d.heard("k", Timestamp::from_micros(1_000), t));
        assert!(d.predates("k", t));
        assert_eq!(d.ignored(), 0);
    }

    /// A stamp far ahead of the store's clock (2^64 − 1 µs, say) would mark its slot for
    /// good; one far behind means nothing. Both are ignored, counted; the edges are kept.
    #[test]
    fn stamps_far_from_the_stores_clock_are_ignored_and_counted() {
        let d = Decreases::default();
        let now = Timestamp::from_micros(1_790_000_000_000_000);
        let far_ahead = [Timestamp::from_micros(u64::MAX), now + STAMP_AHEAD * 2];
        let far_behind = [Timestamp::from_micros(0), now - STAMP_BEHIND * 2];
        for at in far_ahead.into_iter().chain(far_behind) {
            assert!(!d.heard("k", at, now), "{at:?}");
        }
        assert_eq!(d.ignored(), 4);
        assert!(
            !d.predates("k", now),
            "no answer is kept from being adopted"
        );
        assert!(d.heard("k", now + STAMP_AHEAD, now));
        assert!(d.heard("j", now - STAMP_BEHIND, now));
        assert_eq!(d.ignored(), 4);
    }
}
