//! The shared store's clock as this instance knows it: an offset from local time, learned
//! from every answer and health probe, shared by the local view and the link's probe.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::clock::Timestamp;

/// The store's time minus local time, once learned.
#[derive(Debug, Default)]
pub(crate) struct StoreClock {
    /// The shared store's time minus local time in nanoseconds.
    offset_ns: AtomicI64,
    /// Whether an answer has taught the offset yet.
    synced: AtomicBool,
}

impl StoreClock {
    /// Learns that the store's clock read `store_now` when the local one read `local_now`.
    pub(crate) fn learn(&self, store_now: Timestamp, local_now: Timestamp) {
        let offset = i128::from(store_now.as_nanos()) - i128::from(local_now.as_nanos());
        self.offset_ns.store(
            offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            Ordering::Relaxed,
        );
        self.synced.store(true, Ordering::Relaxed);
    }

    /// Local time `local_now` moved onto the store's clock.
    pub(crate) fn shift(&self, local_now: Timestamp) -> Timestamp {
        let offset = self.offset_ns.load(Ordering::Relaxed);
        Timestamp::from_nanos(local_now.as_nanos().saturating_add_signed(offset))
    }

    /// Whether the offset has been learned.
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }
}
