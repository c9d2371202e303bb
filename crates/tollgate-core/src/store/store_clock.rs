//! The shared store's clock as this instance knows it: an offset from local time, learned
//! from every answer and health probe, shared by the local view and the link's probe.
//!
//! In the shared store every algorithm runs on the store's time, a plain [`Timestamp`].
//! This instance's own clock is read only to measure how long something took and how long
//! a lease's block may serve; those readings are [`LocalTime`], so that the two clocks are
//! never mixed by mistake: only [`StoreClock::shift`] moves one onto the other.

use std::ops::Add;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;

/// A reading of this instance's clock, apart from the store's time.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LocalTime(Timestamp);

impl LocalTime {
    /// The local clock's reading `at`.
    pub(crate) const fn read(at: Timestamp) -> Self {
        Self(at)
    }

    /// How long after `earlier` this is (zero if before it).
    pub(crate) fn since(self, earlier: LocalTime) -> Duration {
        self.0.since(earlier.0)
    }
}

impl Add<Duration> for LocalTime {
    type Output = LocalTime;

    fn add(self, span: Duration) -> LocalTime {
        LocalTime(self.0 + span)
    }
}

impl std::fmt::Debug for LocalTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} (local)", self.0)
    }
}

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
    pub(crate) fn learn(&self, store_now: Timestamp, local_now: LocalTime) {
        let offset = i128::from(store_now.as_nanos()) - i128::from(local_now.0.as_nanos());
        self.offset_ns.store(
            offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
            Ordering::Relaxed,
        );
        self.synced.store(true, Ordering::Relaxed);
    }

    /// Local time `local_now` moved onto the store's clock.
    pub(crate) fn shift(&self, local_now: LocalTime) -> Timestamp {
        let offset = self.offset_ns.load(Ordering::Relaxed);
        Timestamp::from_nanos(local_now.0.as_nanos().saturating_add_signed(offset))
    }

    /// Whether the offset has been learned.
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }
}
