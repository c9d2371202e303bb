//! The check-and-count protocol both shared stores speak (`redis/check_and_count.lua`,
//! `postgres/schema.sql`): the same arguments in, the same positional reply out (the
//! Redis script's stored bytes read as these numbers in `redis/script.rs`), so that the
//! layout of a counter's state is defined once per store and nowhere else.
//!
//! A call carries the request's hits and a debt: units this instance admitted while the
//! store did not answer, charged before the hits are checked ([`effect`]).

use crate::algo::{
    FixedWindow, Gcra, Hits, LimitState, MAX_UNITS, SlidingWindow, Verdict, apply, evaluate,
};
use crate::clock::{NANOS_PER_MICRO, Timestamp};
use crate::limit::{Algorithm, Limit};

/// The counter the health probe counts on, to learn whether counter calls work (a table
/// dropped, a read-only replica): no counter's key, since every counter key has a `#`.
pub(crate) const PROBE_KEY: &str = "tollgate-health-probe";
/// The probe's call: one unit, so that the store writes, as a request's would.
pub(crate) const PROBE_CALL: Counted = Counted::of(Hits::Consume(1));

/// What one call counts on a counter: `debt` units charged (counted even past the limit),
/// then `hits`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted {
    pub(crate) debt: u64,
    pub(crate) hits: Hits,
}

impl Counted {
    /// A read: nothing owed, nothing counted.
    pub(crate) const READ: Counted = Counted::of(Hits::Check);

    /// `hits` with nothing owed.
    pub(crate) const fn of(hits: Hits) -> Self {
        Self { debt: 0, hits }
    }
}

/// The probe's limit: never reached, and a window of a second, so its counter expires.
pub(crate) fn probe_limits() -> [Limit; 1] {
    [Limit::new(u32::MAX, crate::unit::Unit::Second)]
}

/// What one call asks of a counter: a request's hits, or a lease's block taken or given
/// back (see `lease.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ask {
    /// A request's hits.
    Hits(Hits),
    /// The most units up to `want`, and at least `need`, that every limit admits, counted
    /// as consumed ([`take`]).
    Take { need: u64, want: u64 },
    /// `units` of a block taken at store time `taken` that were not spent, given back
    /// where they were counted if that still counts ([`LimitState::give_back`]).
    GiveBack { units: u64, taken: Timestamp },
}

/// The mode letter, unit count and extra number for `ask`: `c` consume, `p` charge
/// (counted even past the limit), `k` check, `r` refund; `l` take (extra: the units
/// needed), `g` give back (extra: when the block was taken, in microseconds). Counts are
/// held at [`MAX_UNITS`].
pub(crate) fn mode(ask: Ask) -> (&'static str, u64, u64) {
    match ask {
        Ask::Hits(Hits::Consume(n)) => ("c", units(n), 0),
        Ask::Hits(Hits::Charge(n)) => ("p", units(n), 0),
        Ask::Hits(Hits::Check) => ("k", 0, 0),
        Ask::Hits(Hits::Refund(n)) => ("r", units(n), 0),
        Ask::Take { need, want } => ("l", units(want), units(need)),
        Ask::GiveBack { units: n, taken } => ("g", units(n), taken.as_micros()),
    }
}

/// A count of units as the stores take it (a debt sums many asks): held at
/// [`MAX_UNITS`], which the Redis script's numbers hold exactly.
pub(crate) fn units(n: u64) -> u64 {
    n.min(MAX_UNITS)
}

/// What [`Ask::Take`] gets from `states` at `now`, counted in them: `want` if it fits,
/// else the most that fits found by bisection (the stores search the same way, so they
/// find the same number), or 0 when not even `need` fits.
pub(crate) fn take(
    states: &mut [LimitState],
    limits: &[Limit],
    now: Timestamp,
    need: u64,
    want: u64,
) -> u64 {
    let fits = |k| evaluate(states, limits, now, k).decision.admitted;
    let granted = if fits(want) {
        want
    } else if need == 0 || !fits(need) {
        0
    } else {
        let (mut lo, mut hi) = (need, want);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    };
    if granted > 0 {
        apply(states, limits, now, Hits::Consume(granted));
    }
    granted
}

/// What a lease call does to `states` at `now`, as the stores do it: `debt` charged,
/// then the block taken or given back; the store's flag (units taken; 1 for a give-back).
pub(crate) fn lease_effect(
    states: &mut [LimitState],
    limits: &[Limit],
    now: Timestamp,
    debt: u64,
    ask: Ask,
) -> u64 {
    let hits = match ask {
        Ask::Hits(hits) => hits,
        Ask::Take { .. } | Ask::GiveBack { .. } => Hits::Check,
    };
    let verdict = effect(states, limits, now, debt, hits);
    match ask {
        Ask::Hits(_) => u64::from(verdict.decision.admitted),
        Ask::Take { need, want } => take(states, limits, now, need, want),
        Ask::GiveBack { units, taken } => {
            for (state, limit) in states.iter_mut().zip(limits) {
                state.give_back(limit, now, units, taken);
            }
            1
        }
    }
}

/// What one call does to a counter's `states` at `now`, as the stores do it: `debt`
/// charged (counted even past the limit), then `hits` applied; the verdict on the hits.
pub(crate) fn effect(
    states: &mut [LimitState],
    limits: &[Limit],
    now: Timestamp,
    debt: u64,
    hits: Hits,
) -> Verdict {
    if debt > 0 {
        apply(states, limits, now, Hits::Charge(units(debt)));
    }
    apply(states, limits, now, hits.saturated())
}

/// Whether a call that `counted` on `states` at `now` lowered the counter: a refund that
/// took something off (one on a counter holding nothing gives nothing back, and there is
/// no decrease to announce).
pub(crate) fn lowers(
    states: &[LimitState],
    limits: &[Limit],
    now: Timestamp,
    counted: Counted,
) -> bool {
    let Hits::Refund(n @ 1..) = counted.hits else {
        return false;
    };
    let refunded = |n| {
        let mut states = states.to_vec();
        effect(&mut states, limits, now, counted.debt, Hits::Refund(n));
        states
    };
    refunded(0) != refunded(n)
}

/// One limit as the stores take it: kind letter (`s` sliding, `f` fixed, `c` calendar,
/// `g` GCRA), window in microseconds, precision or burst, requests per window, and for a
/// calendar three window boundaries around `around` in microseconds ([`Calendar::boundaries`];
/// zeros otherwise). The store picks the calendar window holding its own now, so that it
/// decides in its clock and needs no time-zone database.
///
/// [`Calendar::boundaries`]: crate::calendar::Calendar
pub(crate) fn limit_args(
    limit: &Limit,
    around: Timestamp,
) -> (&'static str, u64, u32, u32, [u64; 3]) {
    let (kind, param) = match limit.algorithm {
        Algorithm::SlidingWindow { precision } => ("s", precision),
        Algorithm::FixedWindow if limit.calendar.is_some() => ("c", 1),
        Algorithm::FixedWindow => ("f", 1),
        Algorithm::TokenBucket { burst } | Algorithm::LeakyBucket { burst } => ("g", burst),
        // Never sent: in-flight counters have calls of their own (`slots.rs`).
        Algorithm::Slots => ("i", 1),
    };
    let bounds = limit
        .calendar
        .as_ref()
        .map_or([0; 3], |c| c.boundaries(around).map(Timestamp::as_micros));
    (
        kind,
        limit.window_nanos() / NANOS_PER_MICRO,
        param,
        limit.requests_per_unit,
        bounds,
    )
}

/// The store's answer: its decision, its clock, and the counter as it was before.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The check ran: whether it admitted, when, and the state it read.
    Ran {
        admitted: bool,
        now: Timestamp,
        states: Vec<LimitState>,
    },
    /// The store ran the check at `now`, after its deadline, when the request had been
    /// answered without it; nothing was counted.
    Late { now: Timestamp },
}

/// A store's answer to one call as it came, before it is read against the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawReply {
    /// 1 admitted, 0 denied; a take's units; -1 when it ran after its deadline.
    pub(crate) flag: i64,
    /// The store's clock in microseconds.
    pub(crate) now_us: i64,
    /// The counter's state as it was before the call, as numbers; none for a new counter.
    pub(crate) state: Vec<i64>,
}

impl RawReply {
    /// The reply of a store that answers with one run of numbers: the flag, the clock,
    /// then the state.
    pub(crate) fn from_numbers(mut numbers: Vec<i64>) -> Result<Self, ReplyError> {
        if numbers.len() < 2 {
            return Err(ReplyError::Short(numbers.len()));
        }
        let state = numbers.split_off(2);
        Ok(Self {
            flag: numbers[0],
            now_us: numbers[1],
            state,
        })
    }
}

/// Why a reply could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplyError {
    #[error("reply holds {0} numbers, fewer than the flag, the clock and the state need")]
    Short(usize),
    #[error("reply holds the negative number {0}")]
    Negative(i64),
}

/// Decodes `raw` for `limits`: its state holds the state of each limit in order, or
/// nothing when the store held no counter (every limit fresh). After every limit's
/// numbers come, per sliding window in order, the ends of its sub-windows; a counter
/// stored before ends were kept has none (see [`SlidingWindow::from_ring`]).
pub(crate) fn decode(raw: &RawReply, limits: &[Limit]) -> Result<Reply, ReplyError> {
    let rest = &raw.state;
    let now = Timestamp::from_micros(unsigned(raw.now_us)?);
    if raw.flag == -1 {
        return Ok(Reply::Late { now });
    }
    let admitted = raw.flag == 1;
    if rest.is_empty() {
        let states = limits.iter().map(LimitState::new).collect();
        return Ok(Reply::Ran {
            admitted,
            now,
            states,
        });
    }
    let without_ends = limits.iter().map(stored_numbers).sum::<usize>();
    let mut at = 0;
    let mut ends_at = (rest.len() > without_ends).then_some(without_ends);
    // Read in place: a reply is decoded on every round trip.
    let run = |from: &mut usize, len: usize| {
        let numbers = checked(rest, *from, len);
        *from += len;
        numbers
    };
    let mut states = Vec::with_capacity(limits.len());
    for limit in limits {
        states.push(match limit.algorithm {
            Algorithm::SlidingWindow { precision } => {
                let ring = precision as usize + 1;
                let newest = run(&mut at, 1)?[0];
                let counts = run(&mut at, ring)?;
                let ends = match ends_at.as_mut() {
                    Some(from) => Some(run(from, ring)?),
                    None => None,
                };
                LimitState::Sliding(SlidingWindow::from_ring(
                    newest.unsigned_abs(),
                    counts.iter().map(|n| n.unsigned_abs()),
                    ends.map(|ends| ends.iter().map(|n| n.unsigned_abs())),
                ))
            }
            Algorithm::FixedWindow => {
                let parts = run(&mut at, 2)?;
                LimitState::Fixed(FixedWindow::from_parts(
                    parts[0].unsigned_abs(),
                    parts[1].unsigned_abs(),
                ))
            }
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                let tat = run(&mut at, 1)?[0].unsigned_abs();
                LimitState::Gcra(Gcra::from_tat(Timestamp::from_micros(tat)))
            }
            Algorithm::Slots => LimitState::new(limit),
        });
    }
    Ok(Reply::Ran {
        admitted,
        now,
        states,
    })
}

/// `n`, which a store never sends negative.
fn unsigned(n: i64) -> Result<u64, ReplyError> {
    u64::try_from(n).map_err(|_| ReplyError::Negative(n))
}

/// The `len` numbers of `state` from `from`, each checked in order to be there and not
/// negative (so `unsigned_abs` reads them as they are).
fn checked(state: &[i64], from: usize, len: usize) -> Result<&[i64], ReplyError> {
    for i in from..from + len {
        match state.get(i) {
            Some(&n) => {
                unsigned(n)?;
            }
            None => return Err(ReplyError::Short(2 + state.len())),
        }
    }
    Ok(&state[from..from + len])
}

/// How many numbers a limit's state takes in a store, before the sliding windows' ends.
fn stored_numbers(limit: &Limit) -> usize {
    match limit.algorithm {
        Algorithm::SlidingWindow { precision } => precision as usize + 2,
        Algorithm::FixedWindow => 2,
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => 1,
        Algorithm::Slots => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit::Unit;

    fn states(state: Vec<i64>, limits: &[Limit]) -> Result<Vec<LimitState>, ReplyError> {
        let raw = RawReply {
            flag: 1,
            now_us: 5,
            state,
        };
        match decode(&raw, limits)? {
            Reply::Ran { states, .. } => Ok(states),
            Reply::Late { .. } => panic!("read as late"),
        }
    }

    #[test]
    fn a_state_reads_with_or_without_ends_and_bad_numbers_are_errors() {
        let sliding = Algorithm::SlidingWindow { precision: 2 };
        let limits = [
            Limit::new(10, Unit::Second)
                .with_algorithm(sliding)
                .unwrap(),
            Limit::new(10, Unit::Minute)
                .with_algorithm(Algorithm::FixedWindow)
                .unwrap(),
        ];
        let ring = [512, 256, 0];
        let expected = |ends: Option<[u64; 3]>| {
            vec![
                LimitState::Sliding(SlidingWindow::from_ring(
                    7,
                    ring.into_iter(),
                    ends.map(IntoIterator::into_iter),
                )),
                LimitState::Fixed(FixedWindow::from_parts(3, 4)),
            ]
        };
        let without_ends = states(vec![7, 512, 256, 0, 3, 4], &limits);
        assert_eq!(without_ends.ok(), Some(expected(None)));
        let with_ends = states(vec![7, 512, 256, 0, 3, 4, 10, 20, 30], &limits);
        assert_eq!(with_ends.ok(), Some(expected(Some([10, 20, 30]))));

        let negative = states(vec![7, 512, -1, 0, 3, 4], &limits);
        assert!(matches!(negative, Err(ReplyError::Negative(-1))));
        let short = states(vec![7, 512], &limits);
        assert!(matches!(short, Err(ReplyError::Short(4))));
        let ends_cut = states(vec![7, 512, 256, 0, 3, 4, 10], &limits);
        assert!(matches!(ends_cut, Err(ReplyError::Short(9))));
    }
}
