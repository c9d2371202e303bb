//! One call on an in-flight counter, as a backend sends it (`slots.lua`, `slots.sql`),
//! and its reply as the store gives it.

use super::protocol::{RawReply, ReplyError, units};
use super::ran::{Ran, counted};
use crate::algo::{Hits, Slots};
use crate::clock::Timestamp;
use crate::limit::{Algorithm, Limit};

/// One call on an in-flight counter: owned, so that it can outlive its request.
#[derive(Debug, Clone)]
pub(crate) struct SlotCall {
    /// The counter.
    pub(crate) key: String,
    /// `a` acquire, `r` release, `k` check.
    pub(crate) mode: &'static str,
    /// Slots acquired or released.
    pub(crate) n: u64,
    /// Slots held at most.
    pub(crate) max: u64,
    /// How long a slot lives unless released, in microseconds.
    pub(crate) expire_after_us: u64,
    /// Store time in microseconds after which the store changes nothing (0: none).
    pub(crate) deadline_us: u64,
    /// Slots this instance admitted without the store, taken first even past `max`.
    pub(crate) debt: u64,
}

impl SlotCall {
    pub(crate) fn new(key: &str, limit: &Limit, hits: Hits, deadline: Option<Timestamp>) -> Self {
        let (mode, n) = match hits {
            // A charge is refused on in-flight rules (rules/compile.rs); taken as a hit.
            Hits::Consume(n) | Hits::Charge(n) => ("a", n),
            Hits::Refund(n) => ("r", n),
            Hits::Check => ("k", 0),
        };
        Self {
            key: key.to_owned(),
            mode,
            n: units(n),
            max: u64::from(limit.requests_per_unit),
            expire_after_us: limit.window().as_micros().try_into().unwrap_or(u64::MAX),
            deadline_us: deadline.map_or(0, Timestamp::as_micros),
            debt: 0,
        }
    }
}

/// The one limit of an in-flight counter, if `limits` are one.
pub(crate) fn in_flight(limits: &[Limit]) -> Option<&Limit> {
    match limits {
        [limit] if limit.algorithm == Algorithm::Slots => Some(limit),
        _ => None,
    }
}

/// A store's answer to a [`SlotCall`]: whether it admitted, its clock, the slots it
/// found past their time and dropped, the slots held before the call.
pub(crate) struct SlotReply {
    pub(crate) admitted: bool,
    pub(crate) now: Timestamp,
    pub(crate) expired: u64,
    pub(crate) before: Slots,
}

/// Reads the raw reply: the flag (1 admitted, 0 denied, -1 late), the store's clock in
/// microseconds, the slots expired, then per group of live slots when it frees itself
/// (microseconds) and how many. `None` for a late call, which changed nothing.
pub(crate) fn decode(raw: &RawReply) -> Result<Option<SlotReply>, ReplyError> {
    let number = |n: i64| u64::try_from(n).map_err(|_| ReplyError::Negative(n));
    let (flag, now) = (&raw.flag, &raw.now_us);
    if *flag == -1 {
        return Ok(None);
    }
    let Some((expired, held)) = raw.state.split_first() else {
        return Err(ReplyError::Short(2));
    };
    if held.len() % 2 != 0 {
        return Err(ReplyError::Short(3 + held.len()));
    }
    let held = held
        .chunks_exact(2)
        .map(|pair| Ok((Timestamp::from_micros(number(pair[0])?), number(pair[1])?)))
        .collect::<Result<Vec<_>, ReplyError>>()?;
    Ok(Some(SlotReply {
        admitted: *flag == 1,
        now: Timestamp::from_micros(number(*now)?),
        expired: number(*expired)?,
        before: Slots::from_held(held),
    }))
}

/// What a slot call for `hits` did, by its reply `raw`: slots taken (an acquisition the
/// store admitted), slots released (negative), or nothing.
pub(crate) fn ran(raw: &RawReply, hits: Hits) -> Ran {
    match decode(raw) {
        Ok(None) => Ran::Not,
        Err(_) => Ran::InDoubt,
        Ok(Some(reply)) => Ran::Counted(counted(hits, reply.admitted)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(numbers: &[i64]) -> Result<Option<SlotReply>, ReplyError> {
        super::decode(&RawReply::from_numbers(numbers.to_vec())?)
    }

    #[test]
    fn a_reply_reads_as_the_slots_held_before() {
        let reply = decode(&[1, 5_000_000, 3, 70_000_000, 1, 65_000_000, 2])
            .expect("readable")
            .expect("ran");
        assert!(reply.admitted);
        assert_eq!(reply.now, Timestamp::from_micros(5_000_000));
        assert_eq!(reply.expired, 3);
        let in_order = vec![
            (Timestamp::from_micros(65_000_000), 2),
            (Timestamp::from_micros(70_000_000), 1),
        ];
        assert_eq!(reply.before, Slots::from_held(in_order));
        assert!(decode(&[-1, 5]).expect("readable").is_none(), "late");
        assert!(decode(&[1]).is_err());
        assert!(decode(&[1, 5]).is_err(), "no count of expired slots");
        assert!(decode(&[1, 5, 0, 7]).is_err(), "a group without its count");
        assert!(decode(&[1, 5, 0, -7, 1]).is_err());
        assert!(decode(&[1, 5, -1]).is_err());
    }
}
