//! The decreases a local view has heard of, so that it adopts no answer older than one.
//!
//! A call that ran in the store before another instance's refund may be answered after the
//! refund's announcement was heard: adopting it would bring back the count the refund
//! took away. Each key hashes to one of a fixed number of slots holding the store time of
//! the latest decrease heard for any key there; an answer stamped at or before it is not
//! adopted. Keys sharing a slot only cost that a few answers in flight are not adopted
//! (the next request asks the store); memory stays fixed whatever the keys.

use std::hash::{BuildHasher as _, BuildHasherDefault, DefaultHasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Timestamp;

/// Slots: 8 KiB, far more than the keys decreased while an answer is on its way.
const SLOTS: usize = 1024;

/// The store time of the latest decrease heard, per slot of keys.
pub(crate) struct Decreases {
    slots: Box<[AtomicU64]>,
}

impl Default for Decreases {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Decreases {
    fn slot(&self, key: &str) -> &AtomicU64 {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        // The remainder is below SLOTS, a usize.
        &self.slots[(hash % SLOTS as u64) as usize]
    }

    /// Counter `key` went down at store time `at`.
    pub(crate) fn heard(&self, key: &str, at: Timestamp) {
        self.slot(key).fetch_max(at.as_nanos(), Ordering::Relaxed);
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
        d.heard("k", t);
        assert!(d.predates("k", Timestamp::from_micros(4_999_999)));
        assert!(d.predates("k", t), "the same microsecond may be before it");
        assert!(!d.predates("k", Timestamp::from_micros(5_000_001)));
        // An older decrease heard late never lowers the mark.
        d.heard("k", Timestamp::from_micros(1_000));
        assert!(d.predates("k", t));
    }
}
