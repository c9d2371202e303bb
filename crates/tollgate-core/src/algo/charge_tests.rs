//! Charges (postpaid usage) on every algorithm: recorded past the limit, a debt that
//! denies until it ages out, and never more overshoot than postpaid charging implies.

use proptest::prelude::*;

use super::testing::{SECOND, at, limit};
use super::*;
use crate::clock::nanos_of;

const MS: u64 = crate::clock::NANOS_PER_MILLI;

fn state(l: &Limit) -> Vec<LimitState> {
    vec![LimitState::new(l)]
}

/// Every algorithm; buckets hold `burst`.
fn algorithms(burst: u32) -> [Algorithm; 4] {
    [
        Algorithm::SlidingWindow { precision: 10 },
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { burst },
        Algorithm::LeakyBucket { burst },
    ]
}

#[test]
fn a_charge_past_the_limit_is_recorded_and_denies_until_the_window_has_room() {
    // A budget of 1,000 tokens per minute and responses of 400: the third charge does
    // not fit, is recorded anyway, and the next check is denied.
    for algorithm in algorithms(1_000) {
        let l = limit(algorithm, 1_000, 60 * SECOND);
        let limits = [l];
        let mut s = state(&limits[0]);
        let t = 120 * SECOND;
        for (i, fits) in [true, true, false].into_iter().enumerate() {
            assert!(apply(&mut s, &limits, at(t), Hits::Check).decision.admitted);
            let charged = apply(&mut s, &limits, at(t), Hits::Charge(400));
            assert_eq!(charged.decision.admitted, fits, "{algorithm:?} charge {i}");
        }
        let check = apply(&mut s, &limits, at(t + SECOND), Hits::Check);
        assert!(
            !check.decision.admitted,
            "{algorithm:?}: 1,200 of 1,000 used"
        );
        // The same check is told when it will pass, and it does then.
        let retry = t + SECOND + nanos_of(check.decision.reset);
        assert!(!evaluate(&s, &limits, at(retry - MS), 0).decision.admitted);
        assert!(
            evaluate(&s, &limits, at(retry), 0).decision.admitted,
            "{algorithm:?}: within the limit again after the advertised wait"
        );
    }
}

#[test]
fn consumption_that_does_not_fit_is_still_not_counted() {
    for algorithm in algorithms(10) {
        let limits = [limit(algorithm, 10, SECOND)];
        let mut s = state(&limits[0]);
        assert!(
            !apply(&mut s, &limits, at(0), Hits::Consume(11))
                .decision
                .admitted
        );
        assert!(
            apply(&mut s, &limits, at(0), Hits::Consume(10))
                .decision
                .admitted,
            "{algorithm:?}: the refused 11 left no trace"
        );
    }
}

/// Units admitted per window of length `window` (any alignment), at most.
fn worst_window(admitted: &[(u64, u64)], window: u64) -> u64 {
    let (mut best, mut sum, mut start) = (0, 0, 0);
    for &(t, units) in admitted {
        sum += units;
        while admitted[start].0 + window <= t {
            sum -= admitted[start].1;
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

proptest! {
    /// Requests are checked (hits_addend 0) and, if admitted, charged their cost when
    /// they end. Whatever the costs and timing, the usage of admitted requests in any
    /// window exceeds the budget by at most what postpaid charging implies: the cost of the
    /// last request admitted while there was room (plus, for the sliding approximation,
    /// one sub-window's usage, its usual bound).
    #[test]
    fn postpaid_usage_overshoots_by_at_most_one_request(
        requests in prop::collection::vec((0u64..300, 1u64..400), 1..300),
        algorithm in prop::sample::select(algorithms(1_000).to_vec()),
    ) {
        let budget = 1_000u64;
        let window = 10 * SECOND;
        let limits = [limit(algorithm, 1_000, window)];
        let mut s = state(&limits[0]);
        let mut used: Vec<(u64, u64)> = Vec::new();
        let mut per_sub = std::collections::HashMap::<u64, u64>::new();
        let mut t = 50 * SECOND;
        let mut max_cost = 0;
        for (gap_ms, cost) in requests {
            t += gap_ms * MS;
            if apply(&mut s, &limits, at(t), Hits::Check).decision.admitted {
                apply(&mut s, &limits, at(t), Hits::Charge(cost));
                used.push((t, cost));
                *per_sub.entry(t / (window / 10)).or_default() += cost;
                max_cost = max_cost.max(cost);
            }
        }
        let slack = match algorithm {
            Algorithm::SlidingWindow { .. } => per_sub.values().copied().max().unwrap_or(0),
            Algorithm::FixedWindow => 0,
            // A bucket refills during the window: its capacity and a window's refill.
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => budget,
            Algorithm::Slots => unreachable!("in-flight limits are not budgets"),
        };
        let worst = match algorithm {
            Algorithm::FixedWindow => {
                let mut by_window = std::collections::HashMap::<u64, u64>::new();
                for (at, cost) in &used {
                    *by_window.entry(at / window).or_default() += cost;
                }
                by_window.values().copied().max().unwrap_or(0)
            }
            _ => worst_window(&used, window),
        };
        prop_assert!(
            worst <= budget + max_cost + slack,
            "{algorithm:?}: {worst} used in one window"
        );
    }

    /// A request-rate limit (no budget) under sustained 3× overload still admits its
    /// limit every window: denied requests are not counted, so they cannot starve it.
    #[test]
    fn request_rate_limits_are_not_starved_by_denied_traffic(
        start_ms in 0u64..10_000,
        algorithm in prop::sample::select(algorithms(100).to_vec()),
    ) {
        let rate = 100u64;
        let limits = [limit(algorithm, 100, SECOND)];
        let mut s = state(&limits[0]);
        let gap = SECOND / (3 * rate);
        let start = 10 * SECOND + start_ms * MS;
        let mut admitted = Vec::new();
        let mut t = start;
        while t < start + 10 * SECOND {
            if apply(&mut s, &limits, at(t), Hits::Consume(1)).decision.admitted {
                admitted.push(t);
            }
            t += gap;
        }
        // The last eight whole seconds: each admits (nearly) the limit.
        for second in 1..9 {
            let from = start + second * SECOND;
            let n = admitted.iter().filter(|&&a| a >= from && a < from + SECOND).count() as u64;
            prop_assert!(n >= rate * 97 / 100, "{algorithm:?}: {n} admitted in second {second}");
        }
    }
}
