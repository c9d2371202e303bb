//! A shared store's check-and-count against the Rust algorithms: random limits and random
//! histories of consumptions, charges, checks, refunds, and leases' blocks taken and given
//! back at chosen instants, some with a
//! debt charged first, go through both, and every answer must agree — the admission, and what the state each side holds
//! afterwards says about the next request. Each store runs [`replay`] on a real server.
//!
//! The domain is every product below 2^53 (the Redis script is exact there): limits up to
//! 2,000, windows from a second to a day, costs up to 500; sliding windows of a few
//! requests, kept at their limit so that the oldest sub-window's weight decides; and
//! calendar windows (days to
//! years in zones either side of UTC), whose histories start shortly before a boundary of
//! the first one, on any day of a year (so across daylight-saving changes), with the
//! boundaries the store is given computed for a time up to an hour off its own.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::protocol::{self, Ask, RawReply, Reply, lease_effect};
use crate::algo::{Hits, LimitState, evaluate};
use crate::calendar::Calendar;
use crate::clock::{NANOS_PER_MICRO, Timestamp, nanos_of};
use crate::limit::{Algorithm, Limit, LimitError};
use crate::unit::Unit;

/// Zones west and east of UTC, with and without daylight saving.
const ZONES: [&str; 5] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Tokyo",
    "Pacific/Auckland",
];

/// Phases (`replay`'s `phase_us`) span a year.
pub(crate) const YEAR_US: u64 = 365 * 86_400_000_000;

pub(crate) fn limits() -> impl Strategy<Value = Vec<Limit>> {
    let one = (
        0u32..2_000,
        prop::sample::select(vec![1u64, 10, 60, 3_600, 86_400]),
        0usize..6,
        1u32..3_000,
    )
        .prop_map(|(rpu, window_s, kind, burst)| {
            let base = Limit::new(rpu, Unit::Second)
                .with_multiplier(u32::try_from(window_s).unwrap_or(1))
                .unwrap_or_else(|_| Limit::new(rpu, Unit::Second));
            let algorithm = match kind {
                0 => Algorithm::SlidingWindow { precision: 1 },
                1 => Algorithm::SlidingWindow { precision: 2 },
                2 => Algorithm::SlidingWindow { precision: 10 },
                3 => Algorithm::FixedWindow,
                4 => Algorithm::TokenBucket { burst },
                _ => Algorithm::SlidingWindow { precision: 60 },
            };
            base.clone().with_algorithm(algorithm).unwrap_or(base)
        });
    let calendar = (0u32..2_000, 0usize..5, 0usize..ZONES.len()).prop_map(|(rpu, unit, zone)| {
        let (unit, multiplier) = [
            (Unit::Day, 1),
            (Unit::Week, 1),
            (Unit::Month, 1),
            (Unit::Month, 3),
            (Unit::Year, 1),
        ][unit];
        let fixed = Limit::new(rpu, unit).with_algorithm(Algorithm::FixedWindow);
        fixed
            .clone()
            .and_then(|l| l.with_calendar(Calendar::new(unit, multiplier, ZONES[zone])?))
            .or(fixed)
            .unwrap_or_else(|_: LimitError| Limit::new(rpu, unit))
    });
    // A sliding window kept near its limit, so that the oldest sub-window's weight decides.
    let tight = (
        1u32..30,
        prop::sample::select(vec![1u32, 10]),
        prop::sample::select(vec![1u32, 2, 10, 60]),
    )
        .prop_map(|(rpu, window_s, precision)| {
            let base = Limit::new(rpu, Unit::Second)
                .with_multiplier(window_s)
                .unwrap_or_else(|_| Limit::new(rpu, Unit::Second));
            base.clone()
                .with_algorithm(Algorithm::SlidingWindow { precision })
                .unwrap_or(base)
        });
    prop::collection::vec(prop_oneof![4 => one, 1 => calendar, 2 => tight], 1..4)
}

/// One call: the gap since the last in microseconds, the debt it carries, and what it
/// asks.
pub(crate) type Operation = (u64, u64, Asked);

/// What a call asks, with a give-back's take placed relative to the call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Asked {
    /// This, as it is.
    Now(Ask),
    /// `units` of a block taken `ago` before the call.
    GiveBack { units: u64, ago: Duration },
}

pub(crate) fn operation() -> impl Strategy<Value = Operation> {
    let hits = prop_oneof![
        4 => (1u64..20).prop_map(Hits::Consume),
        1 => (1u64..500).prop_map(Hits::Consume),
        2 => (1u64..500).prop_map(Hits::Charge),
        2 => Just(Hits::Check),
        1 => (1u64..50).prop_map(Hits::Refund),
    ]
    .prop_map(|hits| Asked::Now(Ask::Hits(hits)));
    let lease = prop_oneof![
        (1u64..5, 0u64..800).prop_map(|(need, more)| Asked::Now(Ask::Take {
            need,
            want: need + more
        })),
        (1u64..800, prop_oneof![0u64..2_000_000, 0u64..200_000_000]).prop_map(|(units, ago_us)| {
            Asked::GiveBack {
                units,
                ago: Duration::from_micros(ago_us),
            }
        }),
    ];
    let asked = prop_oneof![4 => hits, 1 => lease];
    // Gaps in microseconds (the stores' resolution), from none to several of the largest
    // sub-windows of a one-minute window.
    (
        prop_oneof![3 => 0u64..1_000, 3 => 0u64..2_000_000, 1 => 0u64..200_000_000],
        prop_oneof![4 => Just(0u64), 1 => 1u64..300],
        asked,
    )
}

/// Replays `history` on a fresh counter through `call` (the store's check-and-count of a
/// debt and hits at a given instant, with the time calendar boundaries are placed around;
/// its raw reply) and through the algorithms.
pub(crate) fn replay(
    limits: &[Limit],
    history: &[Operation],
    phase_us: u64,
    mut call: impl FnMut(u64, Ask, Timestamp, Timestamp) -> Result<RawReply, String>,
) -> Result<(), TestCaseError> {
    let started = Instant::now();
    // A time of year like a real clock's; with a calendar, up to two minutes before its
    // window ends, so that the history crosses the boundary.
    let mut now = Timestamp::from_micros(1_790_000_000_000_000 + phase_us);
    if let Some(window) = limits
        .iter()
        .find(|l| l.calendar().is_some())
        .and_then(|l| l.fixed_window_at(now))
    {
        now = window.end - Duration::from_micros(phase_us % 120_000_000);
    }
    let start = now;
    // The caller's idea of the store's time: up to an hour either side.
    let skew = |now: Timestamp| {
        now + Duration::from_micros(phase_us % 7_200_000_000) - Duration::from_secs(3_600)
    };
    let mut states: Vec<LimitState> = limits.iter().map(LimitState::new).collect();
    for &(gap_us, debt, asked) in history {
        // Never behind real time since the start, in whole microseconds (the stores'
        // resolution): a store expires counters on its own clock, so a counter it drops
        // must be one the algorithm no longer needs.
        let elapsed_us = nanos_of(started.elapsed()).div_ceil(NANOS_PER_MICRO);
        now = (now + Duration::from_micros(gap_us)).max(start + Duration::from_micros(elapsed_us));

        let ask = match asked {
            Asked::Now(ask) => ask,
            Asked::GiveBack { units, ago } => Ask::GiveBack {
                units,
                taken: now - ago,
            },
        };
        let raw = call(debt, ask, now, skew(now)).map_err(TestCaseError::fail)?;
        let Ok(Reply::Ran {
            admitted,
            now: answered_at,
            states: seen,
        }) = protocol::decode(&raw, limits)
        else {
            return Err(TestCaseError::fail(format!("unreadable reply {raw:?}")));
        };
        prop_assert_eq!(answered_at, now);
        // The state the store read answers every question as the algorithm's own does.
        for asked in [1, 7, 300] {
            prop_assert_eq!(
                evaluate(&seen, limits, now, asked),
                evaluate(&states, limits, now, asked),
                "before {:?} of {} at +{} µs",
                ask,
                asked,
                now.since(start).as_micros()
            );
        }
        let ours = lease_effect(&mut states, limits, now, debt, ask);
        let at = now.since(start).as_micros();
        match ask {
            Ask::Hits(Hits::Refund(_)) => {}
            Ask::Hits(_) => prop_assert_eq!(admitted, ours == 1, "{:?} at +{} µs", ask, at),
            Ask::Take { .. } | Ask::GiveBack { .. } => {
                prop_assert_eq!(
                    Some(raw.flag),
                    i64::try_from(ours).ok(),
                    "{:?} at +{} µs",
                    ask,
                    at
                );
            }
        }
    }
    Ok(())
}

/// A counter of its own for each case.
pub(crate) fn fresh_key() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

/// A counter as a version before sub-windows' ends were kept stored it: three units of a
/// limit of 3 per 10 s (1 s sub-windows), counted at `at`. The limit, and the store's
/// numbers for it.
pub(crate) fn stored_before_ends(at: Timestamp) -> (Vec<Limit>, Vec<u64>) {
    let limit = Limit::new(3, Unit::Second)
        .with_multiplier(10)
        .unwrap_or_else(|_| Limit::new(3, Unit::Second));
    let slot = at.as_micros() / 1_000_000;
    let mut state = vec![0; 12];
    state[0] = slot;
    state[1 + usize::try_from(slot % 11).unwrap_or(0)] = 3 * 256;
    (vec![limit], state)
}

/// Reads through `call` (the store's check-and-count at an instant; its raw reply) the
/// counter [`stored_before_ends`] left at `at`: its units count as that version counted
/// them (their sub-window weighed up to its end), the store and the algorithm agree on
/// it, and the first write stores it with its ends.
pub(crate) fn read_after_upgrade(
    at: Timestamp,
    mut call: impl FnMut(Hits, Timestamp) -> Result<RawReply, String>,
) -> Result<(), String> {
    let (limits, _) = stored_before_ends(at);
    let slot_start = Timestamp::from_micros(at.as_micros() / 1_000_000 * 1_000_000);
    // Half a window later: all three count. A window and three quarters of a sub-window
    // after their sub-window began: a quarter of them.
    for (after_ms, hits, admits) in [(5_000, 1, false), (10_750, 3, false), (10_750, 2, true)] {
        let now = slot_start + Duration::from_millis(after_ms);
        let raw = call(Hits::Consume(hits), now)?;
        let Ok(Reply::Ran {
            admitted, states, ..
        }) = protocol::decode(&raw, &limits)
        else {
            return Err(format!("unreadable reply {raw:?}"));
        };
        let theirs = evaluate(&states, &limits, now, hits).decision.admitted;
        if (admitted, theirs) != (admits, admits) {
            return Err(format!(
                "{hits} at +{after_ms} ms: the store said {admitted}, its state {theirs}"
            ));
        }
    }
    let raw = call(Hits::Check, slot_start + Duration::from_millis(10_800))?;
    // Newest, 11 sub-windows and their 11 ends.
    if raw.state.len() != 23 {
        return Err(format!("not stored with its ends: {raw:?}"));
    }
    Ok(())
}

/// Buckets of burst 2^32 − 1 where one unit more than the burst could span the same
/// time as the burst (see `algo::gcra`): a unit spanning under a microsecond, and a
/// burst spanning past what a span holds. `Limit` refuses both; the stores hold without
/// that.
fn buckets_where_spans_come_out_alike() -> [Limit; 2] {
    let bucket = |requests_per_unit, window| Limit {
        requests_per_unit,
        unit: Unit::Second,
        window,
        algorithm: Algorithm::TokenBucket { burst: u32::MAX },
        name: None,
        calendar: None,
    };
    [
        bucket(u32::MAX, Duration::from_secs(1)),
        bucket(1, Duration::from_secs(3_600)),
    ]
}

/// Asks through `call` (the store's check-and-count of `hits` on a fresh counter `key` of
/// `limits` at an instant; its raw reply) one unit more than the burst of each bucket of
/// [`buckets_where_spans_come_out_alike`]: refused, as the algorithm refuses it; then the
/// whole burst: admitted.
pub(crate) fn a_hit_past_the_burst_is_refused(
    mut call: impl FnMut(&str, &[Limit], Hits, Timestamp) -> Result<RawReply, String>,
) -> Result<(), String> {
    let now = Timestamp::from_micros(1_790_000_000_000_000);
    let burst = u64::from(u32::MAX);
    for limit in buckets_where_spans_come_out_alike() {
        let limits = [limit];
        let key = fresh_key().to_string();
        for (hits, admits) in [(burst + 1, false), (burst, true)] {
            let raw = call(&key, &limits, Hits::Consume(hits), now)?;
            let Ok(Reply::Ran { admitted, .. }) = protocol::decode(&raw, &limits) else {
                return Err(format!("unreadable reply {raw:?}"));
            };
            let ours = evaluate(&[LimitState::new(&limits[0])], &limits, now, hits)
                .decision
                .admitted;
            if (admitted, ours) != (admits, admits) {
                return Err(format!(
                    "{hits} of {:?}: the store said {admitted}, the algorithm {ours}",
                    limits[0]
                ));
            }
        }
    }
    Ok(())
}
