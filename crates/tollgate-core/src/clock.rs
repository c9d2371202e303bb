//! Time: [`Timestamp`], a point on the one clock every instance and store shares
//! (nanoseconds since the Unix epoch, to which windows are aligned), spans as
//! [`Duration`], and the injectable [`Clock`] that reads it.
//!
//! The algorithms and the store protocols compute in integer nanoseconds and microseconds,
//! as the Lua and PL/pgSQL scripts they mirror do; [`Timestamp::as_nanos`] and the
//! constants below are where typed time becomes those integers.

use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds in a microsecond: the stores' unit of time.
pub const NANOS_PER_MICRO: u64 = 1_000;
/// Nanoseconds in a millisecond.
pub const NANOS_PER_MILLI: u64 = 1_000_000;
/// Nanoseconds in a second.
pub const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// A point in time: nanoseconds since the Unix epoch (until the year 2554). Arithmetic
/// saturates: a time before the epoch is the epoch, a span never negative.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

/// As a date in UTC (`2026-11-27T17:51:40.123456789Z`), which a log or a failed assertion
/// can be read by; the epoch's nanoseconds when out of the calendar's range.
impl std::fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match jiff::Timestamp::from_nanosecond(i128::from(self.0)) {
            Ok(at) if *self != Self::MAX => write!(f, "{at}"),
            _ if *self == Self::MAX => f.write_str("never"),
            _ => write!(f, "{}ns", self.0),
        }
    }
}

impl Timestamp {
    /// The last instant a timestamp can hold: "never", for what does not end.
    pub const MAX: Timestamp = Timestamp(u64::MAX);

    /// The time `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time `micros` microseconds after the epoch (the stores' unit); saturates.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(NANOS_PER_MICRO))
    }

    /// Whole microseconds since the epoch, rounded down.
    pub const fn as_micros(self) -> u64 {
        self.0 / NANOS_PER_MICRO
    }

    /// How long after `earlier` this is; zero if it is not after it.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;

    fn add(self, span: Duration) -> Timestamp {
        Self(self.0.saturating_add(nanos_of(span)))
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;

    fn sub(self, span: Duration) -> Timestamp {
        Self(self.0.saturating_sub(nanos_of(span)))
    }
}

/// A span in whole nanoseconds, at most `u64::MAX` (584 years).
pub fn nanos_of(span: Duration) -> u64 {
    u64::try_from(span.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of "now". Windows are aligned to the epoch, so instances sharing counters
/// agree on boundaries.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // A clock before 1970 is a broken host; treating it as the epoch keeps limiting working.
        Timestamp(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, nanos_of),
        )
    }
}

/// A clock that only moves when told to, for tests of time-dependent logic.
#[derive(Debug, Default, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(start.0)))
    }

    /// Moves the clock (and every clone of it) forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(nanos_of(by), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_debugs_as_a_date() {
        let at = Timestamp::from_nanos(1_764_265_900_123_456_789);
        assert_eq!(format!("{at:?}"), "2025-11-27T17:51:40.123456789Z");
        assert_eq!(
            format!("{:?}", Timestamp::default()),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(format!("{:?}", Timestamp::MAX), "never");
    }

    #[test]
    fn timestamps_move_by_spans_and_never_before_the_epoch() {
        let t = Timestamp::from_nanos(5 * NANOS_PER_SECOND);
        assert_eq!((t + Duration::from_millis(250)).as_nanos(), 5_250_000_000);
        assert_eq!(t - Duration::from_secs(9), Timestamp::default());
        assert_eq!(
            t.since(Timestamp::from_nanos(NANOS_PER_SECOND)),
            Duration::from_secs(4)
        );
        assert_eq!(Timestamp::default().since(t), Duration::ZERO);
        assert_eq!(
            Timestamp::from_nanos(u64::MAX) + Duration::MAX,
            Timestamp::from_nanos(u64::MAX)
        );
        let clock = ManualClock::new(t);
        clock.advance(Duration::from_secs(1));
        assert_eq!(clock.now().as_nanos(), 6 * NANOS_PER_SECOND);
    }
}
