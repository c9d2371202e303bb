//! Rate-limit algorithms as pure functions of (state, now, hits, limit) → decision.
//!
//! Stores own the states and call [`apply`]; nothing here does I/O or reads the clock.

mod clock;
mod fixed;
mod gcra;
mod sliding;
mod unit;

pub use clock::{Clock, ManualClock, SystemClock};
pub use fixed::FixedWindow;
pub use gcra::Gcra;
pub use sliding::SlidingWindow;
pub use unit::Unit;

use std::fmt::Write as _;

/// How a limit counts requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Weighted sub-windows approximating a true sliding window (the default).
    SlidingWindow,
    /// The reference service's epoch-aligned fixed window.
    FixedWindow,
    /// GCRA, reported as tokens left in a bucket that refills.
    TokenBucket,
    /// GCRA, reported as room left in a bucket that leaks.
    LeakyBucket,
}

impl Algorithm {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "sliding_window" => Some(Self::SlidingWindow),
            "fixed_window" => Some(Self::FixedWindow),
            "token_bucket" => Some(Self::TokenBucket),
            "leaky_bucket" => Some(Self::LeakyBucket),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::SlidingWindow => "sliding_window",
            Self::FixedWindow => "fixed_window",
            Self::TokenBucket => "token_bucket",
            Self::LeakyBucket => "leaky_bucket",
        }
    }
}

/// One compiled limit: `requests_per_unit` per `window_ns`, counted by `algorithm`.
/// `unit` is what Envoy is told; `window_ns` is the real window (unit × multiplier).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub window_ns: u64,
    pub algorithm: Algorithm,
    /// Sub-windows of a sliding window.
    pub precision: u32,
    /// Bucket capacity of token/leaky buckets.
    pub burst: u32,
    pub name: Option<String>,
}

impl Limit {
    /// Appends what identifies this limit's counter state: algorithm, window and precision.
    /// The quota is left out so that a reload changing only the quota keeps the counts.
    pub fn write_shape(&self, out: &mut String) {
        let code = match self.algorithm {
            Algorithm::SlidingWindow => 's',
            Algorithm::FixedWindow => 'f',
            Algorithm::TokenBucket | Algorithm::LeakyBucket => 'g',
        };
        // Writing to a String cannot fail.
        let _ = write!(out, "{code}{}", self.window_ns);
        if self.algorithm == Algorithm::SlidingWindow {
            let _ = write!(out, ".{}", self.precision);
        }
    }
}

/// What a request asks of its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hits {
    /// Count this many units if every limit admits them.
    Consume(u64),
    /// Answer whether one more unit would be admitted; count nothing.
    Check,
    /// Give back this many units (Envoy's `is_negative_hits`).
    Refund(u64),
}

/// The answer of one limit at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub admitted: bool,
    /// Units left after this request (for a denial: left now).
    pub remaining: u64,
    /// Admitted: until the counted units are forgotten. Denied: until the same request
    /// would be admitted, assuming no other traffic.
    pub reset_ns: u64,
}

/// The state of one limit of one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitState {
    Sliding(SlidingWindow),
    Fixed(FixedWindow),
    Gcra(Gcra),
}

impl LimitState {
    pub fn new(limit: &Limit) -> Self {
        match limit.algorithm {
            Algorithm::SlidingWindow => Self::Sliding(SlidingWindow::new(limit.precision)),
            Algorithm::FixedWindow => Self::Fixed(FixedWindow::default()),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => Self::Gcra(Gcra::default()),
        }
    }

    /// Whether `hits` units would be admitted now; changes nothing.
    pub fn evaluate(&self, limit: &Limit, now_ns: u64, hits: u64) -> Decision {
        match self {
            Self::Sliding(s) => s.evaluate(limit, now_ns, hits),
            Self::Fixed(s) => s.evaluate(limit, now_ns, hits),
            Self::Gcra(s) => s.evaluate(limit, now_ns, hits),
        }
    }

    /// Counts `hits` admitted units.
    pub fn record(&mut self, limit: &Limit, now_ns: u64, hits: u64) {
        match self {
            Self::Sliding(s) => s.record(limit, now_ns, hits),
            Self::Fixed(s) => s.record(limit, now_ns, hits),
            Self::Gcra(s) => s.record(limit, now_ns, hits),
        }
    }

    /// Gives back up to `hits` units counted earlier.
    pub fn refund(&mut self, limit: &Limit, now_ns: u64, hits: u64) {
        match self {
            Self::Sliding(s) => s.refund(limit, now_ns, hits),
            Self::Fixed(s) => s.refund(limit, now_ns, hits),
            Self::Gcra(s) => s.refund(limit, now_ns, hits),
        }
    }

    /// When this state no longer affects any decision and can be dropped.
    pub fn expires_at_ns(&self, limit: &Limit) -> u64 {
        match self {
            Self::Sliding(s) => s.expires_at_ns(limit),
            Self::Fixed(s) => s.expires_at_ns(limit),
            Self::Gcra(s) => s.expires_at_ns(),
        }
    }
}

/// The decision reported for a counter with several limits: the limit it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub limit_index: usize,
    pub decision: Decision,
}

/// Applies `hits` to the states of all `limits` of one counter, all or nothing: units are
/// counted only if every limit admits them. Reports the tightest limit: of the denying ones
/// the one with the longest wait, else the one with the fewest units left.
pub fn apply(states: &mut [LimitState], limits: &[Limit], now_ns: u64, hits: Hits) -> Outcome {
    let asked = match hits {
        Hits::Consume(n) => n,
        Hits::Check => 1,
        Hits::Refund(n) => {
            for (state, limit) in states.iter_mut().zip(limits) {
                state.refund(limit, now_ns, n);
            }
            0
        }
    };
    let outcome = evaluate(states, limits, now_ns, asked);
    if outcome.decision.admitted
        && let Hits::Consume(n) = hits
    {
        for (state, limit) in states.iter_mut().zip(limits) {
            state.record(limit, now_ns, n);
        }
    }
    outcome
}

/// What [`apply`] would answer for `hits` units, changing nothing.
pub fn evaluate(states: &[LimitState], limits: &[Limit], now_ns: u64, hits: u64) -> Outcome {
    let mut best: Option<Outcome> = None;
    for (limit_index, (state, limit)) in states.iter().zip(limits).enumerate() {
        let decision = state.evaluate(limit, now_ns, hits);
        let candidate = Outcome {
            limit_index,
            decision,
        };
        best = Some(match best {
            None => candidate,
            Some(b) if tighter(&candidate.decision, &b.decision) => candidate,
            Some(b) => b,
        });
    }
    // A counter always has at least one limit; an empty list admits, as no limit would.
    best.unwrap_or(Outcome {
        limit_index: 0,
        decision: Decision {
            admitted: true,
            remaining: u64::MAX,
            reset_ns: 0,
        },
    })
}

fn tighter(a: &Decision, b: &Decision) -> bool {
    match (a.admitted, b.admitted) {
        (false, true) => true,
        (true, false) => false,
        (false, false) => a.reset_ns > b.reset_ns,
        (true, true) => a.remaining < b.remaining,
    }
}

/// `value × numerator / denominator` without overflow, rounded down; saturates at u64::MAX.
pub(crate) fn mul_div(value: u64, numerator: u64, denominator: u64) -> u64 {
    if denominator == 0 {
        return u64::MAX;
    }
    u64::try_from(u128::from(value) * u128::from(numerator) / u128::from(denominator))
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
pub(crate) mod testing {
    use super::{Algorithm, Limit, Unit};

    pub const SECOND: u64 = 1_000_000_000;

    pub fn limit(algorithm: Algorithm, requests_per_unit: u32, window_ns: u64) -> Limit {
        Limit {
            requests_per_unit,
            unit: Unit::Second,
            window_ns,
            algorithm,
            precision: 10,
            burst: requests_per_unit,
            name: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{SECOND, limit};
    use super::*;

    #[test]
    fn several_limits_count_only_when_all_admit() {
        let limits = [
            limit(Algorithm::FixedWindow, 10, SECOND),
            limit(Algorithm::FixedWindow, 3, 60 * SECOND),
        ];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        for _ in 0..3 {
            assert!(
                apply(&mut states, &limits, 0, Hits::Consume(1))
                    .decision
                    .admitted
            );
        }
        let denied = apply(&mut states, &limits, 0, Hits::Consume(1));
        assert!(!denied.decision.admitted);
        assert_eq!(denied.limit_index, 1);
        // The denied hit was not counted by the per-second limit either.
        let next_second = apply(&mut states, &limits, SECOND, Hits::Check);
        assert!(!next_second.decision.admitted);
        assert_eq!(
            states[0].evaluate(&limits[0], SECOND - 1, 7).remaining,
            0,
            "7 more fit in the first second: exactly 3 were counted"
        );
    }

    #[test]
    fn tightest_admitted_limit_is_the_one_with_fewest_left() {
        let limits = [
            limit(Algorithm::FixedWindow, 10, SECOND),
            limit(Algorithm::FixedWindow, 5, 60 * SECOND),
        ];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        let outcome = apply(&mut states, &limits, 0, Hits::Consume(2));
        assert_eq!(outcome.limit_index, 1);
        assert_eq!(outcome.decision.remaining, 3);
    }

    #[test]
    fn check_counts_nothing_and_refund_gives_back() {
        let limits = [limit(Algorithm::SlidingWindow, 2, SECOND)];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        assert!(
            apply(&mut states, &limits, 0, Hits::Check)
                .decision
                .admitted
        );
        assert!(
            apply(&mut states, &limits, 0, Hits::Consume(2))
                .decision
                .admitted
        );
        assert!(
            !apply(&mut states, &limits, 0, Hits::Check)
                .decision
                .admitted
        );
        let refunded = apply(&mut states, &limits, 0, Hits::Refund(1));
        assert!(refunded.decision.admitted);
        assert_eq!(refunded.decision.remaining, 1);
        assert!(
            apply(&mut states, &limits, 0, Hits::Consume(1))
                .decision
                .admitted
        );
    }

    #[test]
    fn mul_div_saturates_instead_of_overflowing() {
        assert_eq!(mul_div(u64::MAX, 3, 1), u64::MAX);
        assert_eq!(mul_div(7, 3, 2), 10);
        assert_eq!(mul_div(7, 3, 0), u64::MAX);
    }
}
