//! A limit: how many units per window, counted by which algorithm. Built only through
//! constructors that check it, so every `Limit` in the program is one the stores can count.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::calendar::{Calendar, CalendarError};
use crate::clock::{NANOS_PER_MICRO, NANOS_PER_MILLI, NANOS_PER_SECOND, nanos_of};
use crate::unit::Unit;

/// Sub-windows of a sliding window when a rule names none.
pub const DEFAULT_PRECISION: u32 = 10;
/// The most sub-windows a sliding window may have.
pub const MAX_PRECISION: u32 = 1_000;

/// The longest an in-flight slot may live: a year, in milliseconds.
const MAX_EXPIRE_AFTER_MS: u128 = 365 * 86_400 * 1_000;
/// The longest a bucket may take to fill, in microseconds: 100 years. Arrival times then
/// stay far below what every store's numbers hold (2^53 µs, the year 2255); past them a
/// bucket never filled, and admitted without end.
const MAX_BUCKET_FILL_US: u128 = 100 * 365 * 86_400 * 1_000_000;

/// How a limit counts, with the parameters that only that way of counting has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Weighted sub-windows approximating a true sliding window (the default).
    SlidingWindow {
        /// Sub-windows per window: more is more exact, and more memory.
        precision: u32,
    },
    /// The reference service's epoch-aligned fixed window.
    FixedWindow,
    /// GCRA, reported as tokens left in a bucket of `burst` that refills.
    TokenBucket {
        /// Bucket capacity.
        burst: u32,
    },
    /// GCRA, reported as room left in a bucket of `burst` that leaks.
    LeakyBucket {
        /// Bucket capacity.
        burst: u32,
    },
    /// Slots held by requests in flight: `requests_per_unit` at most at once; a refund
    /// releases one, and a slot not released within the window frees itself.
    Slots,
}

/// The algorithms by name, without parameters: what a setting or a rule file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmKind {
    /// See [`Algorithm::SlidingWindow`].
    SlidingWindow,
    /// See [`Algorithm::FixedWindow`].
    FixedWindow,
    /// See [`Algorithm::TokenBucket`].
    TokenBucket,
    /// See [`Algorithm::LeakyBucket`].
    LeakyBucket,
    /// See [`Algorithm::Slots`]: an `in_flight` rule, never named by `algorithm`.
    Slots,
}

impl AlgorithmKind {
    /// Every kind, in the order documentation lists them.
    pub const ALL: [AlgorithmKind; 4] = [
        Self::SlidingWindow,
        Self::FixedWindow,
        Self::TokenBucket,
        Self::LeakyBucket,
    ];

    /// The name used in rule files and settings.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SlidingWindow => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::TokenBucket => "token_bucket",
            Self::LeakyBucket => "leaky_bucket",
            Self::Slots => "in_flight",
        }
    }
}

impl std::str::FromStr for AlgorithmKind {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == name)
            .ok_or_else(|| UnknownName {
                what: "algorithm",
                given: name.to_owned(),
                expected: "sliding_window, fixed_window, token_bucket or leaky_bucket",
            })
    }
}

/// A setting or rule value that names none of the choices.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{given}' (expected {expected})")]
pub struct UnknownName {
    /// What was being named.
    pub what: &'static str,
    /// The name given.
    pub given: String,
    /// The choices, for a person.
    pub expected: &'static str,
}

impl Algorithm {
    /// The algorithm's name.
    pub fn kind(self) -> AlgorithmKind {
        match self {
            Self::SlidingWindow { .. } => AlgorithmKind::SlidingWindow,
            Self::FixedWindow => AlgorithmKind::FixedWindow,
            Self::TokenBucket { .. } => AlgorithmKind::TokenBucket,
            Self::LeakyBucket { .. } => AlgorithmKind::LeakyBucket,
            Self::Slots => AlgorithmKind::Slots,
        }
    }

    /// Bucket capacity of token and leaky buckets.
    pub(crate) fn burst(self) -> Option<u32> {
        match self {
            Self::TokenBucket { burst } | Self::LeakyBucket { burst } => Some(burst),
            Self::SlidingWindow { .. } | Self::FixedWindow | Self::Slots => None,
        }
    }
}

/// Why a limit cannot be built; [`LimitError::field`] names the rule field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// `unit_multiplier` of 0.
    #[error("unit_multiplier must be at least 1")]
    ZeroMultiplier,
    /// A window longer than the clock can count.
    #[error("window is too long")]
    WindowTooLong,
    /// Precision outside 1..=MAX_PRECISION.
    #[error("precision must be between 1 and {MAX_PRECISION}, not {0}")]
    Precision(u32),
    /// Sub-windows that are not whole milliseconds.
    #[error("precision {0} does not split the window into whole milliseconds")]
    SubWindow(u32),
    /// A bucket of no capacity.
    #[error("burst must be at least 1")]
    ZeroBurst,
    /// A bucket refilling faster than the microseconds its time is counted in: a unit
    /// would take no time, and the bucket would admit without end.
    #[error(
        "a token or leaky bucket refills at most 1,000,000 units a second (its time is \
         counted in whole microseconds): {requests} per {seconds} s is faster"
    )]
    BucketTooFast {
        /// Requests per window.
        requests: u32,
        /// The window in seconds.
        seconds: u64,
    },
    /// A bucket taking longer to fill than the stores' arrival times reach.
    #[error(
        "a token or leaky bucket must fill within 100 years: a burst of {burst} at \
         {requests} per {seconds} s takes longer"
    )]
    BucketTooSlow {
        /// The bucket's capacity.
        burst: u32,
        /// Requests per window.
        requests: u32,
        /// The window in seconds.
        seconds: u64,
    },
    /// A calendar that cannot be: wrong unit, unknown zone, too long.
    #[error(transparent)]
    Calendar(#[from] CalendarError),
    /// Calendar windows are fixed windows; other algorithms keep fixed-length units.
    #[error("calendar windows are fixed windows: calendar cannot be combined with {0}")]
    CalendarAlgorithm(&'static str),
    /// An in-flight slot that frees itself before a millisecond, or after a year.
    #[error("expire_after must be between 1ms and 365 days")]
    ExpireAfter,
}

impl LimitError {
    /// The rule field that holds the wrong value.
    pub fn field(&self) -> &'static str {
        match self {
            Self::ZeroMultiplier | Self::WindowTooLong => "unit_multiplier",
            Self::Precision(_) | Self::SubWindow(_) => "precision",
            Self::ZeroBurst | Self::BucketTooSlow { .. } => "burst",
            Self::BucketTooFast { .. } => "requests_per_unit",
            Self::Calendar(CalendarError::Zone(_)) => "time_zone",
            Self::Calendar(CalendarError::TooLong) => "unit_multiplier",
            Self::Calendar(CalendarError::Unit(_)) | Self::CalendarAlgorithm(_) => "calendar",
            Self::ExpireAfter => "expire_after",
        }
    }
}

/// One limit: `requests_per_unit` per window, counted by an algorithm. `unit` is what Envoy
/// is told; the window is the real one (`unit × unit_multiplier`), or nominally so when a
/// calendar places it. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Unit,
    pub(crate) window: Duration,
    pub(crate) algorithm: Algorithm,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) calendar: Option<Calendar>,
}

impl Limit {
    /// `requests_per_unit` per `unit`, as a sliding window of [`DEFAULT_PRECISION`]
    /// sub-windows. A limit of 0 denies everything.
    pub fn new(requests_per_unit: u32, unit: Unit) -> Self {
        Self {
            requests_per_unit,
            unit,
            window: Duration::from_secs(unit.seconds()),
            algorithm: Algorithm::SlidingWindow {
                precision: DEFAULT_PRECISION,
            },
            name: None,
            calendar: None,
        }
    }

    /// At most `max` slots held at once by requests in flight, each freeing itself
    /// `expire_after` after it was taken unless released before; Envoy is told the unit
    /// nearest `expire_after`. Slots are counted in whole milliseconds, as the stores do.
    pub fn in_flight(max: u32, expire_after: Duration) -> Result<Self, LimitError> {
        let millis = expire_after.as_millis();
        if !(1..=MAX_EXPIRE_AFTER_MS).contains(&millis) {
            return Err(LimitError::ExpireAfter);
        }
        let window = Duration::from_millis(millis as u64);
        Ok(Self {
            requests_per_unit: max,
            unit: Unit::nearest(window.as_secs()),
            window,
            algorithm: Algorithm::Slots,
            name: None,
            calendar: None,
        })
    }

    /// The same limit over a window `multiplier` times as long; Envoy is told the nearest
    /// unit it knows.
    pub fn with_multiplier(mut self, multiplier: u32) -> Result<Self, LimitError> {
        if multiplier == 0 {
            return Err(LimitError::ZeroMultiplier);
        }
        let seconds = self
            .window
            .as_secs()
            .checked_mul(u64::from(multiplier))
            .filter(|s| s.checked_mul(NANOS_PER_SECOND).is_some())
            .ok_or(LimitError::WindowTooLong)?;
        // Checked to fit in nanoseconds: the stores count windows in u64 nanoseconds.
        self.window = Duration::from_secs(seconds);
        if multiplier > 1 {
            self.unit = Unit::nearest(seconds);
        }
        self.check()
    }

    /// The same limit counted by `algorithm`.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Result<Self, LimitError> {
        self.algorithm = algorithm;
        self.check()
    }

    /// The same limit over `calendar`'s windows (a fixed window only); its nominal window
    /// (a month of 30 days) is what Envoy and the draft headers are told.
    pub fn with_calendar(mut self, calendar: Calendar) -> Result<Self, LimitError> {
        let seconds = calendar.unit().seconds() * u64::from(calendar.multiplier());
        self.window = Duration::from_secs(seconds);
        self.unit = match calendar.multiplier() {
            1 => calendar.unit(),
            _ => Unit::nearest(seconds),
        };
        self.calendar = Some(calendar);
        self.check()
    }

    /// The same limit, named (names show in responses and `replaces` refers to them).
    pub fn with_name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    fn check(self) -> Result<Self, LimitError> {
        if self.calendar.is_some() && self.algorithm != Algorithm::FixedWindow {
            return Err(LimitError::CalendarAlgorithm(
                self.algorithm.kind().as_str(),
            ));
        }
        match self.algorithm {
            Algorithm::SlidingWindow { precision } => {
                if !(1..=MAX_PRECISION).contains(&precision) {
                    return Err(LimitError::Precision(precision));
                }
                // Whole milliseconds keep sub-window boundaries identical in every store.
                if !self
                    .window_nanos()
                    .is_multiple_of(u64::from(precision) * NANOS_PER_MILLI)
                {
                    return Err(LimitError::SubWindow(precision));
                }
            }
            Algorithm::TokenBucket { burst } | Algorithm::LeakyBucket { burst } => {
                self.check_bucket(burst)?;
            }
            _ => {}
        }
        Ok(self)
    }

    /// A bucket's time is counted in whole microseconds, and its arrival times must stay
    /// within what the stores hold (`algo/gcra.rs`). A rate of 0 denies everything.
    fn check_bucket(&self, burst: u32) -> Result<(), LimitError> {
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        let (requests, seconds) = (self.requests_per_unit, self.window.as_secs());
        let window_us = u128::from(self.window_nanos() / NANOS_PER_MICRO);
        if u128::from(requests) > window_us {
            return Err(LimitError::BucketTooFast { requests, seconds });
        }
        if requests > 0 && u128::from(burst) * window_us / u128::from(requests) > MAX_BUCKET_FILL_US
        {
            return Err(LimitError::BucketTooSlow {
                burst,
                requests,
                seconds,
            });
        }
        Ok(())
    }

    /// Units admitted per window.
    pub fn requests_per_unit(&self) -> u32 {
        self.requests_per_unit
    }

    /// Units the limit holds at once: a bucket's burst, a window's requests.
    pub fn capacity(&self) -> u32 {
        self.algorithm.burst().unwrap_or(self.requests_per_unit)
    }

    /// The unit Envoy is told (the nearest one when the window is a multiple).
    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// The real window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The window in nanoseconds, as the algorithms and the stores' scripts count it
    /// (never 0, and exact: constructors refuse windows longer than 584 years).
    pub(crate) fn window_nanos(&self) -> u64 {
        nanos_of(self.window).max(1)
    }

    /// How the limit counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The limit's name, if it has one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The calendar placing its windows, if one does.
    pub fn calendar(&self) -> Option<&Calendar> {
        self.calendar.as_ref()
    }

    /// For a fixed window, the window holding `now`: the calendar's, else epoch-aligned.
    /// `None` for other algorithms.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn fixed_window_at(
        &self,
        now: crate::clock::Timestamp,
    ) -> Option<std::ops::Range<crate::clock::Timestamp>> {
        use crate::calendar::Window;

        if self.algorithm != Algorithm::FixedWindow {
            return None;
        }
        let Window { start, end } = match &self.calendar {
            Some(calendar) => calendar.window_at(now),
            None => {
                let since_start = now.as_nanos() % self.window_nanos();
                let start = now - Duration::from_nanos(since_start);
                Window {
                    start,
                    end: start + self.window,
                }
            }
        };
        Some(start..end)
    }

    /// Appends what identifies this limit's counter state: algorithm, window and precision.
    /// The quota is left out so that a reload changing only the quota keeps the counts.
    pub(crate) fn write_shape(&self, out: &mut String) {
        use fmt::Write as _;
        if let Some(calendar) = &self.calendar {
            // Named by the rule's zone, not by any instance's: every instance counts here.
            out.push('c');
            calendar.write_shape(out);
            return;
        }
        let code = match self.algorithm {
            Algorithm::SlidingWindow { .. } => 's',
            Algorithm::FixedWindow => 'f',
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => 'g',
            Algorithm::Slots => 'i',
        };
        // Writing to a String cannot fail.
        let _ = write!(out, "{code}{}", self.window_nanos());
        if let Algorithm::SlidingWindow { precision } = self.algorithm {
            let _ = write!(out, ".{precision}");
        }
    }

    /// The shape of a counter holding `limits` (see [`Limit::write_shape`]).
    pub(crate) fn shape_of(limits: &[Limit]) -> String {
        let mut shape = String::new();
        for (i, limit) in limits.iter().enumerate() {
            if i > 0 {
                shape.push(',');
            }
            limit.write_shape(&mut shape);
        }
        shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multiple_window_tells_envoy_the_nearest_unit() {
        let l = Limit::new(5, Unit::Second)
            .with_multiplier(30)
            .expect("30 s is a valid window");
        assert_eq!(l.window(), Duration::from_secs(30));
        assert_eq!(l.unit(), Unit::Minute);
        assert_eq!(
            Limit::new(5, Unit::Second).with_multiplier(0),
            Err(LimitError::ZeroMultiplier)
        );
    }

    #[test]
    fn impossible_parameters_are_refused_with_their_field() {
        let err = Limit::new(5, Unit::Second)
            .with_algorithm(Algorithm::SlidingWindow { precision: 3 })
            .expect_err("a third of a second is not whole milliseconds");
        assert_eq!(err.field(), "precision");
        let err = Limit::new(5, Unit::Second)
            .with_algorithm(Algorithm::TokenBucket { burst: 0 })
            .expect_err("an empty bucket");
        assert_eq!(err, LimitError::ZeroBurst);
        assert!(
            Limit::new(5, Unit::Year)
                .with_multiplier(u32::MAX)
                .is_err_and(|e| e == LimitError::WindowTooLong)
        );
    }

    /// A bucket is counted in whole microseconds, up to arrival times the stores hold:
    /// one refilling faster than a unit a microsecond, or filling in more than 100 years,
    /// is refused with its field; the edges and a rate of 0 are not.
    #[test]
    fn buckets_outside_what_their_arithmetic_holds_are_refused() {
        let bucket = |requests, unit, burst| {
            Limit::new(requests, unit).with_algorithm(Algorithm::TokenBucket { burst })
        };
        let fast = bucket(u32::MAX, Unit::Second, u32::MAX).expect_err("2^32 − 1 a second");
        assert_eq!(
            (fast.field(), fast.to_string().as_str()),
            (
                "requests_per_unit",
                "a token or leaky bucket refills at most 1,000,000 units a second (its time is \
                 counted in whole microseconds): 4294967295 per 1 s is faster"
            )
        );
        assert!(bucket(1_000_001, Unit::Second, 10).is_err());
        assert!(bucket(1_000_000, Unit::Second, 10).is_ok());
        assert!(bucket(60_000_000, Unit::Minute, 10).is_ok());
        let slow = bucket(1, Unit::Year, 101).expect_err("101 years to fill");
        assert_eq!(slow.field(), "burst");
        assert!(bucket(1, Unit::Year, 100).is_ok());
        assert!(
            bucket(0, Unit::Second, u32::MAX).is_ok(),
            "a rate of 0 denies all"
        );
        assert!(
            Limit::new(1, Unit::Hour)
                .with_algorithm(Algorithm::LeakyBucket { burst: u32::MAX })
                .is_err_and(|e| e.field() == "burst")
        );
    }

    #[test]
    fn the_shape_names_algorithm_window_and_precision_but_not_the_quota() {
        let a = Limit::new(5, Unit::Minute);
        let b = Limit::new(50, Unit::Minute).with_name("other");
        let one = std::slice::from_ref(&a);
        assert_eq!(Limit::shape_of(one), "s60000000000.10");
        assert_eq!(Limit::shape_of(one), Limit::shape_of(&[b]));
        let g = a
            .with_algorithm(Algorithm::LeakyBucket { burst: 9 })
            .expect("valid");
        assert_eq!(Limit::shape_of(&[g]), "g60000000000");
    }
}
