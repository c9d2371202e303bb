//! Time as the algorithms see it: nanoseconds since the Unix epoch, from an injectable clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds in a microsecond: the stores' unit of time.
pub const NANOS_PER_MICRO: u64 = 1_000;
/// Nanoseconds in a millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;
/// Nanoseconds in a second.
pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// A source of "now" in nanoseconds since the Unix epoch.
/// Windows are aligned to the epoch, so instances sharing counters agree on boundaries.
pub trait Clock: Send + Sync + 'static {
    /// Now, in nanoseconds since the Unix epoch.
    fn now_ns(&self) -> u64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        // A clock before 1970 is a broken host; treating it as the epoch keeps limiting working.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// A clock that only moves when told to, for tests of time-dependent logic.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ns)))
    }

    /// Moves the clock (and every clone of it) forward.
    pub fn advance(&self, by_ns: u64) {
        self.0.fetch_add(by_ns, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
