//! GCRA: one theoretical arrival time (TAT) per counter serves token and leaky buckets.
//!
//! Each unit advances the TAT by the emission interval T = window / requests_per_unit; a
//! request is admitted while TAT − now stays within the burst tolerance burst × T. A token
//! bucket with `burst` tokens refilling `requests_per_unit` per window, or a bucket of size
//! `burst` leaking at that rate, admit exactly the same requests.

use std::time::Duration;

use super::{LimitVerdict, mul_div};
use crate::clock::{NANOS_PER_MICRO, Timestamp, nanos_of};
use crate::limit::Limit;

/// The theoretical arrival time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Gcra {
    tat: Timestamp,
}

impl Gcra {
    /// A bucket as stored elsewhere: its theoretical arrival time.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn from_tat(tat: Timestamp) -> Self {
        Self { tat }
    }

    fn burst(limit: &Limit) -> u64 {
        u64::from(limit.capacity())
    }

    /// The time `units` occupy in the bucket, in whole microseconds: the resolution of
    /// Redis time, so that the Redis script computes the very same spans. Saturates at
    /// `u64::MAX` nanoseconds, as the script's integers do.
    pub(crate) fn span(limit: &Limit, units: u64) -> Duration {
        let window_us = limit.window_nanos() / NANOS_PER_MICRO;
        Duration::from_nanos(
            mul_div(units, window_us, u64::from(limit.requests_per_unit))
                .saturating_mul(NANOS_PER_MICRO),
        )
    }

    /// Units that fit in `free` bucket time.
    fn units(limit: &Limit, free: Duration) -> u64 {
        mul_div(
            nanos_of(free),
            u64::from(limit.requests_per_unit),
            limit.window_nanos(),
        )
    }

    /// The theoretical arrival time (a lease's block decays towards it).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn tat(&self) -> Timestamp {
        self.tat
    }

    pub(crate) fn evaluate(&self, limit: &Limit, now: Timestamp, hits: u64) -> LimitVerdict {
        if limit.requests_per_unit == 0 {
            return LimitVerdict {
                admitted: false,
                remaining: 0,
                reset: limit.window,
            };
        }
        // Spans stay below u64::MAX nanoseconds, so their sums do not overflow a Duration;
        // comparing them saturated keeps the script's answers where its integers saturate.
        let tolerance = Self::span(limit, Self::burst(limit));
        let used = self.tat.since(now);
        let after = saturate(used + Self::span(limit, hits));
        // Counted apart from the spans: a few units more than the burst can span the same
        // whole microseconds as the burst (a unit spans under one), or saturate alike.
        let fits_bucket = hits <= Self::burst(limit);
        if fits_bucket && after <= tolerance {
            return LimitVerdict {
                admitted: true,
                remaining: Self::units(limit, tolerance - after),
                reset: after,
            };
        }
        let reset = if fits_bucket {
            after - tolerance
        } else {
            // More than the bucket holds: no wait admits it. Never "retry at once": the
            // whole bucket's refill time, or until it is full again if that is later.
            used.max(tolerance)
        };
        LimitVerdict {
            admitted: false,
            remaining: Self::units(limit, tolerance.saturating_sub(used)),
            reset,
        }
    }

    pub(crate) fn record(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        self.tat = self.tat.max(now) + Self::span(limit, hits);
    }

    pub(crate) fn refund(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        self.tat = (self.tat - Self::span(limit, hits)).max(now);
    }

    pub(crate) fn expires_at(&self) -> Timestamp {
        self.tat
    }
}

/// A span as the stores' u64 nanoseconds hold it: at most `u64::MAX`.
fn saturate(span: Duration) -> Duration {
    Duration::from_nanos(nanos_of(span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{SECOND, at, bucket, limit};
    use crate::limit::Algorithm;
    use proptest::prelude::*;

    const DAY: u64 = 86_400 * SECOND;

    fn offer(g: &mut Gcra, l: &Limit, now: u64, hits: u64) -> LimitVerdict {
        let d = g.evaluate(l, at(now), hits);
        if d.admitted {
            g.record(l, at(now), hits);
        }
        d
    }

    #[test]
    fn burst_then_steady_refill() {
        let l = limit(Algorithm::TokenBucket { burst: 20 }, 10, SECOND);
        let mut g = Gcra::default();
        let t0 = 100 * SECOND;
        for i in 0..20 {
            assert_eq!(offer(&mut g, &l, t0, 1).remaining, 19 - i);
        }
        let denied = offer(&mut g, &l, t0, 1);
        assert!(!denied.admitted);
        assert_eq!(nanos_of(denied.reset), SECOND / 10);
        assert!(offer(&mut g, &l, t0 + SECOND / 10, 1).admitted);
        assert!(!offer(&mut g, &l, t0 + SECOND / 10, 1).admitted);
    }

    #[test]
    fn leaky_bucket_spending_limit_from_the_seed_article() {
        // Capacity 1000 over 30 days: spend 30, then 990 does not fit.
        let l = limit(Algorithm::LeakyBucket { burst: 1_000 }, 1_000, 30 * DAY);
        let mut g = Gcra::default();
        let now = 1_700_000_000 * SECOND;
        let first = offer(&mut g, &l, now, 30);
        assert!(first.admitted);
        assert_eq!(first.remaining, 970);
        let second = offer(&mut g, &l, now + 60 * SECOND, 990);
        assert!(!second.admitted);
        // 20 units leak out in 0.6 days (1000 per 30 days).
        assert!(nanos_of(second.reset) > DAY / 2 && nanos_of(second.reset) < DAY);
        assert!(offer(&mut g, &l, now + 60 * SECOND + nanos_of(second.reset), 990).admitted);
    }

    #[test]
    fn cost_above_capacity_is_never_admitted_and_zero_rate_blocks() {
        let l = limit(bucket(5), 5, SECOND);
        let mut g = Gcra::default();
        let never = offer(&mut g, &l, 0, 6);
        assert!(!never.admitted);
        assert_eq!(nanos_of(never.reset), SECOND, "a full refill, not 0");
        let zero = limit(bucket(0), 0, SECOND);
        assert!(!offer(&mut g, &zero, 0, 1).admitted);
    }

    /// A request larger than the bucket is never admitted, also where its span and the
    /// bucket's come out alike: a unit spanning under a microsecond (both round to the
    /// same), or a burst spanning past what a span holds (both saturate). `Limit` refuses
    /// such buckets; the algorithm holds without that.
    #[test]
    fn a_hit_past_the_burst_is_never_admitted_where_spans_come_out_alike() {
        const MOST: u32 = u32::MAX;
        for (rpu, window) in [(MOST, SECOND), (1, 3_600 * SECOND)] {
            let l = limit(Algorithm::TokenBucket { burst: MOST }, rpu, window);
            let mut g = Gcra::default();
            let now = 1_700_000_000 * SECOND;
            let over = offer(&mut g, &l, now, u64::from(MOST) + 1);
            assert!(!over.admitted, "{rpu} per {window} ns: {over:?}");
            assert!(!over.reset.is_zero(), "never \"retry at once\": {over:?}");
            assert!(
                offer(&mut g, &l, now, u64::from(MOST)).admitted,
                "{rpu} per {window} ns"
            );
        }
    }

    #[test]
    fn refund_returns_units_but_not_beyond_full() {
        let l = limit(bucket(5), 5, SECOND);
        let mut g = Gcra::default();
        offer(&mut g, &l, 0, 5);
        g.refund(&l, at(0), 2);
        assert_eq!(g.evaluate(&l, at(0), 2).remaining, 0);
        g.refund(&l, at(0), 100);
        assert_eq!(g.evaluate(&l, at(0), 0).remaining, 5);
    }

    proptest! {
        /// Against an exact token bucket with fractional tokens: GCRA admits the same
        /// requests, give or take rounding. Spans are whole microseconds (Redis's
        /// resolution), so each admission's span, and the burst's, may be short by under
        /// a microsecond: the two may differ only while they are within that drift.
        #[test]
        fn matches_an_exact_token_bucket(
            arrivals in prop::collection::vec((0u64..300, 1u64..8), 1..300),
            rate in 1u32..50, burst in 1u32..50,
        ) {
            let l = limit(Algorithm::TokenBucket { burst }, rate, SECOND);
            let mut g = Gcra::default();
            let mut tokens = f64::from(burst);
            let mut last = 0u64;
            let mut t = 0u64;
            let mut admissions = 0u32;
            for (gap_ms, cost) in arrivals {
                t += gap_ms * crate::clock::NANOS_PER_MILLI;
                tokens = (tokens + (t - last) as f64 / SECOND as f64 * f64::from(rate))
                    .min(f64::from(burst));
                last = t;
                let admitted = offer(&mut g, &l, t, cost).admitted;
                let model = tokens + 1e-6 >= cost as f64;
                if model != admitted {
                    let drift = f64::from(admissions + 2) * 1e-6 * f64::from(rate);
                    prop_assert!(
                        (tokens - cost as f64).abs() < drift + 1e-9,
                        "tokens {} cost {} after {} admissions", tokens, cost, admissions
                    );
                }
                if admitted {
                    tokens -= cost as f64;
                    admissions += 1;
                }
            }
        }
    }
}
