//! In-flight rules on a shared store. Every instance must see a release at once, so these
//! counters skip leases and local denials: each hit, release or check is one call to the
//! store (`redis/slots.lua`, `postgres/slots.sql`), which keeps the slots in its own clock
//! and answers the slots held before the call. The verdict is the memory store's
//! algorithm on those slots; the store's own decision wins where they differ.
//!
//! A slot is held only where the store confirmed it: an acquisition decided without an
//! answer (per `--on-store-error`) is admitted without a slot, so its answer carries no
//! rule metadata and Envoy sends no release that would free another request's slot; if
//! the store took a slot for it all the same (the call ran late), the slot is credited
//! and released by the settler. A release decided without an answer is credited the same
//! way. With `local`, such an acquisition is admitted only into slots the view (the
//! store's last answer, and what this instance decided since) shows free.

use std::sync::Arc;
use std::time::Instant;

use super::background::SETTLE_TIMEOUT;
use super::debts::Due;
use super::late::Ran;
use super::protocol::{Ask, RawReply, ReplyError, units};
use super::slot_call::SlotCall;
use super::{SharedStore, Snapshot, bump};
use crate::algo::{Hits, LimitState, Slots, Verdict};
use crate::clock::Timestamp;
use crate::limit::{Algorithm, Limit};
use crate::store::peek::{CounterView, Peek};
use crate::store::{DecidedBy, StoreError};

/// The one limit of an in-flight counter, if `limits` are one.
pub(crate) fn in_flight(limits: &[Limit]) -> Option<&Limit> {
    match limits {
        [limit] if limit.algorithm == Algorithm::Slots => Some(limit),
        _ => None,
    }
}

/// A store's answer to a [`SlotCall`]: whether it admitted, its clock, the slots it
/// found past their time and dropped, the slots held before the call.
struct SlotReply {
    admitted: bool,
    now: Timestamp,
    expired: u64,
    before: Slots,
}

/// Reads the raw reply: the flag (1 admitted, 0 denied, -1 late), the store's clock in
/// microseconds, the slots expired, then per group of live slots when it frees itself
/// (microseconds) and how many. `None` for a late call, which changed nothing.
fn decode(raw: &RawReply) -> Result<Option<SlotReply>, ReplyError> {
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
pub(super) fn ran(raw: &RawReply, hits: Hits) -> Ran {
    let units = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    match decode(raw) {
        Ok(None) => Ran::Not,
        Err(_) => Ran::InDoubt,
        Ok(Some(reply)) => Ran::Counted(match hits {
            Hits::Consume(n) | Hits::Charge(n) if reply.admitted => units(n),
            Hits::Refund(n) => -units(n.min(reply.before.count(reply.now))),
            Hits::Consume(_) | Hits::Charge(_) | Hits::Check => 0,
        }),
    }
}

/// What a decision on `hits` made without the store does to the slots the store holds:
/// an acquisition takes none (its request holds no slot there), a release gives back.
fn decided(hits: Hits) -> i64 {
    match hits {
        Hits::Refund(n) => -i64::try_from(n).unwrap_or(i64::MAX),
        Hits::Consume(_) | Hits::Charge(_) | Hits::Check => 0,
    }
}

impl SharedStore {
    /// Decides `hits` on the in-flight counter `key` by one call to the store; without an
    /// answer in time, per `--on-store-error` (module docs).
    pub(super) async fn slots(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        let Some(limit) = in_flight(limits) else {
            return Err(StoreError::Failed(Arc::new(ReplyError::Short(0))));
        };
        let timeout = self.behaviour.timeout;
        let now = self.local.now();
        let deadline = self.local.deadline(now, timeout);
        let call = self
            .ledger
            .open((key, limits), Ask::Hits(hits), now, deadline);
        let started = Instant::now();
        let trip = self
            .backend
            .slots(SlotCall::new(key, limit, hits, deadline));
        let (error, outlived) = match self.wait(trip, timeout, started).await {
            Err(trip) => (StoreError::Timeout, Some(trip)),
            Ok(raw) => match self.read_slots(raw) {
                Ok(reply) => {
                    let verdict = call.ran(|| self.adopt_slots(key, limits, hits, reply));
                    return Ok((verdict, DecidedBy::Store));
                }
                Err((e, ran)) => {
                    let pending = call.others_in_flight();
                    call.failed(ran);
                    let verdict = self.slots_fall_back(key, limits, (hits, pending), now, e)?;
                    self.ledger.owe(key, limits, ran.owed(decided(hits)), now);
                    return Ok((verdict, DecidedBy::Fallback));
                }
            },
        };
        let pending = call.others_in_flight();
        if let Some(trip) = outlived {
            call.outlived(trip, Some(decided(hits)), now);
        }
        let verdict = self.slots_fall_back(key, limits, (hits, pending), now, error)?;
        Ok((verdict, DecidedBy::Fallback))
    }

    /// The verdict per `--on-store-error` on an in-flight counter, leaving room for
    /// `pending` units of other calls out. It confirms no slot: the verdict says nothing
    /// of the slots (`in_flight` is none), so the answer carries no rule metadata.
    fn slots_fall_back(
        &self,
        key: &str,
        limits: &[Limit],
        (hits, pending): (Hits, u64),
        now: Timestamp,
        error: StoreError,
    ) -> Result<Verdict, StoreError> {
        let mut verdict = self.fall_back(key, limits, (hits, pending), now, error, |_| {})?;
        verdict.in_flight = None;
        Ok(verdict)
    }

    /// The store's answer to a slot call for `hits` as the verdict, and the slots after it
    /// as the counter's view.
    fn adopt_slots(&self, key: &str, limits: &[Limit], hits: Hits, reply: SlotReply) -> Verdict {
        let snapshot = Snapshot {
            admitted: reply.admitted,
            now: reply.now,
            states: vec![LimitState::Slots(reply.before.clone())],
        };
        let mut verdict = self.adopt(key, limits, super::Counted::of(hits), snapshot);
        if let Some(f) = &mut verdict.in_flight {
            if let Hits::Consume(n) = hits
                && verdict.decision.admitted != reply.admitted
            {
                let taken = if reply.admitted { units(n) } else { 0 };
                f.held = reply.before.count(reply.now).saturating_add(taken);
            }
            // The store dropped the expired slots before answering: `before` holds none.
            f.expired = reply.expired;
        }
        verdict
    }

    /// Releases the slots credited to in-flight counter `due.key` (`due.hits` a refund):
    /// taken by the store for requests answered without one, or released without it.
    pub(super) async fn release_credited(&self, due: &Due) {
        let (Some(limit), Hits::Refund(_)) = (in_flight(&due.limits), due.hits) else {
            return;
        };
        let now = self.local.now();
        let deadline = self.local.deadline(now, SETTLE_TIMEOUT);
        let call = self.ledger.settle(due, now, deadline);
        let release = SlotCall::new(&due.key, limit, due.hits, deadline);
        match self
            .wait(self.backend.slots(release), SETTLE_TIMEOUT, Instant::now())
            .await
        {
            Err(trip) => call.outlived(trip, None, now),
            Ok(raw) => match self.read_slots(raw) {
                Ok(reply) => {
                    call.ran(|| self.adopt_slots(&due.key, &due.limits, due.hits, reply));
                }
                Err((_, ran)) => call.failed(ran),
            },
        }
    }

    /// The in-flight counter `key` as the store holds it, read with a check.
    pub(super) async fn peek_slots(&self, key: &str, limits: &[Limit], hits: u64) -> Peek {
        let shared = match in_flight(limits) {
            None => Err(StoreError::Failed(Arc::new(ReplyError::Short(0)))),
            Some(limit) => {
                let timeout = self.behaviour.timeout;
                let deadline = self.local.deadline(self.local.now(), timeout);
                let trip = self
                    .backend
                    .slots(SlotCall::new(key, limit, Hits::Check, deadline));
                match self.wait(trip, timeout, Instant::now()).await {
                    Err(_) => Err(StoreError::Timeout),
                    Ok(raw) => self.read_slots(raw).map_err(|(e, _)| e).map(|reply| {
                        let states = [LimitState::Slots(reply.before)];
                        CounterView::of(Some(&states), limits, reply.now, hits)
                    }),
                }
            }
        };
        Peek {
            local: None,
            stored_key: None,
            shared: Some(shared),
            lease: None,
        }
    }

    /// What a finished slot call says, counted by kind when it failed, with whether it
    /// ran.
    fn read_slots(
        &self,
        raw: Result<RawReply, super::TripError>,
    ) -> Result<SlotReply, (StoreError, Ran)> {
        let answer = self.raw_reply(raw)?;
        match decode(&answer) {
            Ok(Some(reply)) => {
                bump(&self.counts.round_trips);
                self.local.learn_time(reply.now);
                Ok(reply)
            }
            Ok(None) => {
                bump(&self.counts.timeouts);
                Err((StoreError::Timeout, Ran::Not))
            }
            Err(why) => Err((self.unreadable(why), Ran::InDoubt)),
        }
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
