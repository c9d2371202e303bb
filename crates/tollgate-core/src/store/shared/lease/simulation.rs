//! A fleet larger than any test machine: 100 instances with leases share one counter at
//! 1,000,000 requests a second in all, on the injected clock, against the store's own
//! algorithms. The figures print with `--nocapture` (docs/BENCHMARKS.md records them).

use std::collections::BTreeMap;

use super::tests::{Fleet, SECOND};
use crate::clock::Clock;
use crate::limit::{Algorithm, Limit};
use crate::unit::Unit;

const INSTANCES: usize = 100;
/// Requests a second over the fleet, one a step, the instances in turn.
const RATE: u64 = 1_000_000;
const STEP_NS: u64 = SECOND / RATE;
/// Virtual seconds before the measured ones: the first periods have no rate yet.
const WARM_UP: u64 = 1;
/// Virtual seconds measured.
const MEASURED: u64 = 2;

/// What the fleet did over the measured seconds.
struct Tally {
    admitted: u64,
    calls: u64,
    /// Admissions per second-long window, aligned as the store aligns its windows.
    per_window: BTreeMap<u64, u64>,
}

/// The fleet's steady load on one counter of `limit`, leases at 1 % of it.
fn simulate(limit: &Limit) -> Tally {
    let mut fleet = Fleet::new(vec![limit.clone()], 0.01, INSTANCES, 7 * SECOND);
    let warm = WARM_UP * RATE;
    let mut tally = Tally {
        admitted: 0,
        calls: 0,
        per_window: BTreeMap::new(),
    };
    // Step k comes k µs after the start: the measured ones fill whole windows.
    for step in 1..(WARM_UP + MEASURED) * RATE {
        if step == warm {
            tally.calls = fleet.counter.calls;
        }
        let admitted = fleet.request(step as usize % INSTANCES, 1, STEP_NS);
        if admitted && step >= warm {
            tally.admitted += 1;
            let window = fleet.counter.clock.now().as_nanos() / SECOND;
            *tally.per_window.entry(window).or_default() += 1;
        }
    }
    tally.calls = fleet.counter.calls - tally.calls;
    let per_second = |n: u64| n as f64 / MEASURED as f64;
    println!(
        "{INSTANCES} instances, {RATE} requests/s, {:?} of {}/s: {:.0} admitted/s, {:.0} \
         store calls/s, {:.4} calls per admission; admitted per window {:?}",
        limit.algorithm,
        limit.requests_per_unit,
        per_second(tally.admitted),
        per_second(tally.calls),
        tally.calls as f64 / tally.admitted.max(1) as f64,
        tally.per_window.values().collect::<Vec<_>>(),
    );
    tally
}

fn limit(requests: u32, algorithm: Algorithm) -> Limit {
    Limit::new(requests, Unit::Second)
        .with_algorithm(algorithm)
        .expect("limit")
}

#[test]
fn a_hot_counter_under_its_limit_costs_a_store_call_per_hundred_admissions_at_most() {
    let tally = simulate(&limit(
        100_000_000,
        Algorithm::SlidingWindow { precision: 10 },
    ));
    assert_eq!(tally.admitted, MEASURED * RATE);
    // Blocks of a period's traffic (200 units an instance), renewed at sub-window ends.
    assert!(
        tally.calls * 100 <= tally.admitted,
        "{} calls for {} admissions",
        tally.calls,
        tally.admitted
    );
}

#[test]
fn a_hot_counter_over_its_limit_never_passes_it_and_uses_it() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow { precision: 10 },
    ] {
        let limit = limit(500_000, algorithm);
        let tally = simulate(&limit);
        // Leases never cost calls: at most one a request, as without them.
        assert!(tally.calls <= MEASURED * RATE, "{} calls", tally.calls);
        assert_eq!(tally.per_window.len() as u64, MEASURED);
        for (window, &admitted) in &tally.per_window {
            let requests = u64::from(limit.requests_per_unit);
            assert!(admitted <= requests, "window {window}: {admitted}");
            // Under-use: no more than 1 % of the limit in a window whose demand never stops.
            assert!(
                admitted * 100 >= requests * 99,
                "window {window}: {admitted}"
            );
        }
    }
}
