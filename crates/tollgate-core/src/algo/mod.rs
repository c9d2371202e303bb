//! Rate-limit algorithms as pure functions of (state, now, hits, limit) → verdict.
//!
//! Stores own the states and call [`apply`]; nothing here does I/O or reads the clock.

mod fixed;
mod gcra;
mod sliding;
mod slots;

pub(crate) use fixed::FixedWindow;
pub(crate) use gcra::Gcra;
pub(crate) use sliding::SlidingWindow;
pub(crate) use slots::Slots;

use std::time::Duration;

use crate::clock::Timestamp;
use crate::decision::InFlight;
use crate::limit::{Algorithm, Limit};

/// The most units one ask carries into a store, and the most a count holds: 2^53 − 1.
/// The Redis script computes in Lua's numbers, exact only below 2^53, so no larger count
/// may reach it; every store takes the same ceiling so that all answer alike. No limit
/// comes near it (`requests_per_unit` is a u32): hits held at it are over every limit,
/// as the true ones would be; a refund of it empties any count; a charge of it fills one.
pub const MAX_UNITS: u64 = (1 << 53) - 1;

/// What a request asks of its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hits {
    /// Count this many units if every limit admits them.
    Consume(u64),
    /// Count this many units whether or not they fit (a budget's usage, reported after
    /// the fact): the answer says whether they fitted, and a debt past the limit denies
    /// later requests until it has aged out.
    Charge(u64),
    /// Answer whether the counter is within its limits (at a limit is within, as the
    /// reference service answers `hits_addend: 0`); count nothing.
    Check,
    /// Give back this many units (Envoy's `is_negative_hits`).
    Refund(u64),
}

impl Hits {
    /// Units this asks to count (0 for a check or a refund).
    pub fn counted(self) -> u64 {
        match self {
            Self::Consume(n) | Self::Charge(n) => n,
            Self::Check | Self::Refund(_) => 0,
        }
    }

    /// The same ask with its units held at [`MAX_UNITS`], as every store takes it.
    pub fn saturated(self) -> Self {
        match self {
            Self::Consume(n) => Self::Consume(n.min(MAX_UNITS)),
            Self::Charge(n) => Self::Charge(n.min(MAX_UNITS)),
            Self::Refund(n) => Self::Refund(n.min(MAX_UNITS)),
            Self::Check => Self::Check,
        }
    }
}

/// The verdict of one limit at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitVerdict {
    /// Whether the units fit.
    pub(crate) admitted: bool,
    /// Units left after this request (for a denial: left now).
    pub(crate) remaining: u64,
    /// Admitted: until the counted units are forgotten. Denied: until the same request
    /// would be admitted, assuming no other traffic.
    pub(crate) reset: Duration,
}

/// The state of one limit of one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LimitState {
    Sliding(SlidingWindow),
    Fixed(FixedWindow),
    Gcra(Gcra),
    Slots(Slots),
}

impl LimitState {
    pub(crate) fn new(limit: &Limit) -> Self {
        match limit.algorithm {
            Algorithm::SlidingWindow { precision } => Self::Sliding(SlidingWindow::new(precision)),
            Algorithm::FixedWindow => Self::Fixed(FixedWindow::default()),
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                Self::Gcra(Gcra::default())
            }
            Algorithm::Slots => Self::Slots(Slots::default()),
        }
    }

    /// Whether `hits` units would be admitted now; changes nothing.
    pub(crate) fn evaluate(&self, limit: &Limit, now: Timestamp, hits: u64) -> LimitVerdict {
        match self {
            Self::Sliding(s) => s.evaluate(limit, now, hits),
            Self::Fixed(s) => s.evaluate(limit, now, hits),
            Self::Gcra(s) => s.evaluate(limit, now, hits),
            Self::Slots(s) => s.evaluate(limit, now, hits),
        }
    }

    /// Counts `hits` admitted units.
    pub(crate) fn record(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        match self {
            Self::Sliding(s) => s.record(limit, now, hits),
            Self::Fixed(s) => s.record(limit, now, hits),
            Self::Gcra(s) => s.record(limit, now, hits),
            Self::Slots(s) => s.record(limit, now, hits),
        }
    }

    /// Gives back up to `hits` units counted earlier.
    pub(crate) fn refund(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        match self {
            Self::Sliding(s) => s.refund(limit, now, hits),
            Self::Fixed(s) => s.refund(limit, now, hits),
            Self::Gcra(s) => s.refund(limit, now, hits),
            Self::Slots(s) => s.refund(now, hits),
        }
    }

    /// Gives back up to `hits` units of a lease taken at `taken` to where they were
    /// counted, if that still counts; GCRA gives nothing back (see `store/shared/lease.rs`).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn give_back(&mut self, limit: &Limit, now: Timestamp, hits: u64, taken: Timestamp) {
        match self {
            Self::Sliding(s) => s.give_back(limit, now, hits, taken),
            Self::Fixed(s) => s.give_back(limit, now, hits, taken),
            // Slots are never leased (in-flight rules always ask the store).
            Self::Gcra(_) | Self::Slots(_) => {}
        }
    }

    /// Heap bytes the state holds beyond its own size.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Self::Sliding(s) => s.heap_bytes(),
            Self::Slots(s) => s.heap_bytes(),
            Self::Fixed(_) | Self::Gcra(_) => 0,
        }
    }

    /// When this state no longer affects any decision and can be dropped.
    pub(crate) fn expires_at(&self, limit: &Limit) -> Timestamp {
        match self {
            Self::Sliding(s) => s.expires_at(limit),
            Self::Fixed(s) => s.expires_at(limit),
            Self::Gcra(s) => s.expires_at(),
            Self::Slots(s) => s.expires_at(limit),
        }
    }
}

/// The verdict of a counter with several limits: its tightest limit's, and which that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Index of the reported limit among the counter's limits.
    pub(crate) limit_index: usize,
    /// That limit's verdict.
    pub(crate) decision: LimitVerdict,
    /// For an in-flight counter: what the call did to its slots.
    pub(crate) in_flight: Option<InFlight>,
}

/// Applies `hits` to the states of all `limits` of one counter, all or nothing: consumed
/// units are counted only if every limit admits them (charged ones always are). Reports the
/// tightest limit: of the denying ones the one with the longest wait, else the one with the
/// fewest units left.
pub(crate) fn apply(
    states: &mut [LimitState],
    limits: &[Limit],
    now: Timestamp,
    hits: Hits,
) -> Verdict {
    // An in-flight counter drops its slots past their time first, counted for the metrics.
    let expired = slots::of_mut(states).map(|s| s.expire(now));
    let held = |states: &[LimitState]| slots::of(states).map_or(0, |s| s.count(now));
    let before = held(states);
    let asked = match hits {
        Hits::Consume(n) | Hits::Charge(n) => n,
        Hits::Check => 0,
        Hits::Refund(n) => {
            for (state, limit) in states.iter_mut().zip(limits) {
                state.refund(limit, now, n);
            }
            0
        }
    };
    let released = before.saturating_sub(held(states));
    let mut outcome = evaluate(states, limits, now, asked);
    let counted = match hits {
        Hits::Consume(n) if outcome.decision.admitted => n,
        Hits::Charge(n) => n,
        _ => 0,
    };
    if counted > 0 {
        for (state, limit) in states.iter_mut().zip(limits) {
            state.record(limit, now, counted);
        }
    }
    outcome.in_flight = expired.map(|expired| InFlight {
        held: held(states),
        released,
        expired,
    });
    outcome
}

/// What [`apply`] would answer for `hits` units, changing nothing.
pub(crate) fn evaluate(
    states: &[LimitState],
    limits: &[Limit],
    now: Timestamp,
    hits: u64,
) -> Verdict {
    let mut best: Option<Verdict> = None;
    for (limit_index, (state, limit)) in states.iter().zip(limits).enumerate() {
        let decision = state.evaluate(limit, now, hits);
        let candidate = Verdict {
            limit_index,
            decision,
            in_flight: None,
        };
        best = Some(match best {
            None => candidate,
            Some(b) if tighter(&candidate.decision, &b.decision) => candidate,
            Some(b) => b,
        });
    }
    // A counter always has at least one limit; an empty list admits, as no limit would.
    best.unwrap_or(Verdict {
        limit_index: 0,
        decision: LimitVerdict {
            admitted: true,
            remaining: u64::MAX,
            reset: Duration::ZERO,
        },
        in_flight: None,
    })
}

fn tighter(a: &LimitVerdict, b: &LimitVerdict) -> bool {
    match (a.admitted, b.admitted) {
        (false, true) => true,
        (true, false) => false,
        (false, false) => a.reset > b.reset,
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
    use std::time::Duration;

    use crate::clock::Timestamp;
    use crate::limit::{Algorithm, Limit};
    use crate::unit::Unit;

    /// Tests write times as integer nanoseconds, as the scripts they check compute.
    pub(crate) const SECOND: u64 = crate::clock::NANOS_PER_SECOND;

    /// The instant `ns` nanoseconds after the epoch.
    pub(crate) fn at(ns: u64) -> Timestamp {
        Timestamp::from_nanos(ns)
    }

    /// A limit of `requests_per_unit` per `window_ns`, unchecked (tests pick odd windows).
    pub(crate) fn limit(algorithm: Algorithm, requests_per_unit: u32, window_ns: u64) -> Limit {
        Limit {
            requests_per_unit,
            unit: Unit::Second,
            window: Duration::from_nanos(window_ns),
            algorithm,
            name: None,
            calendar: None,
        }
    }

    pub(crate) const SLIDING: Algorithm = Algorithm::SlidingWindow { precision: 10 };
    pub(crate) const FIXED: Algorithm = Algorithm::FixedWindow;

    /// A token bucket whose burst is its rate.
    pub(crate) fn bucket(requests_per_unit: u32) -> Algorithm {
        Algorithm::TokenBucket {
            burst: requests_per_unit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{FIXED, SECOND, SLIDING, at, limit};
    use super::*;

    #[test]
    fn several_limits_count_only_when_all_admit() {
        let limits = [limit(FIXED, 10, SECOND), limit(FIXED, 3, 60 * SECOND)];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        for _ in 0..3 {
            assert!(
                apply(&mut states, &limits, at(0), Hits::Consume(1))
                    .decision
                    .admitted
            );
        }
        let denied = apply(&mut states, &limits, at(0), Hits::Consume(1));
        assert!(!denied.decision.admitted);
        assert_eq!(denied.limit_index, 1);
        // The denied hit was not counted by the per-second limit either.
        let next_second = apply(&mut states, &limits, at(SECOND), Hits::Check);
        assert!(next_second.decision.admitted, "at the limit, not over it");
        assert_eq!(next_second.decision.remaining, 0);
        assert_eq!(
            states[0].evaluate(&limits[0], at(SECOND - 1), 7).remaining,
            0,
            "7 more fit in the first second: exactly 3 were counted"
        );
    }

    #[test]
    fn tightest_admitted_limit_is_the_one_with_fewest_left() {
        let limits = [limit(FIXED, 10, SECOND), limit(FIXED, 5, 60 * SECOND)];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        let outcome = apply(&mut states, &limits, at(0), Hits::Consume(2));
        assert_eq!(outcome.limit_index, 1);
        assert_eq!(outcome.decision.remaining, 3);
    }

    #[test]
    fn check_counts_nothing_and_refund_gives_back() {
        let limits = [limit(SLIDING, 2, SECOND)];
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        let fresh = apply(&mut states, &limits, at(0), Hits::Check);
        assert!(fresh.decision.admitted);
        assert_eq!(
            fresh.decision.remaining, 2,
            "nothing used, as the reference says"
        );
        assert!(
            apply(&mut states, &limits, at(0), Hits::Consume(2))
                .decision
                .admitted
        );
        // At the limit a check is OK, as the reference answers; a charge past it is not.
        assert!(
            apply(&mut states, &limits, at(0), Hits::Check)
                .decision
                .admitted
        );
        apply(&mut states, &limits, at(0), Hits::Charge(1));
        assert!(
            !apply(&mut states, &limits, at(0), Hits::Check)
                .decision
                .admitted
        );
        let refunded = apply(&mut states, &limits, at(0), Hits::Refund(2));
        assert!(refunded.decision.admitted);
        assert_eq!(refunded.decision.remaining, 1);
        assert!(
            apply(&mut states, &limits, at(0), Hits::Consume(1))
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

#[cfg(test)]
mod charge_tests;
