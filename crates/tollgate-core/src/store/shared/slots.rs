//! In-flight rules on a shared store. Every instance must see a release at once, so these
//! counters skip leases and local denials: each hit, release or check is one call to the
//! store (`redis/slots.lua`, `postgres/slots.sql`), which keeps the slots in its own clock
//! and answers the slots held before the call. The verdict is the memory store's
//! algorithm on those slots; the store's own decision wins where they differ.
//!
//! Without an answer in time, `--on-store-error` decides, and the slot is not confirmed:
//! the verdict says nothing of the slots, so the answer carries no rule metadata and Envoy
//! sends no release for it (a release must never free a slot its acquisition did not
//! take). With `local` the view decides: the slots of the store's last answer and what
//! this instance decided since. What was admitted so is owed to the store as any debt,
//! carried by the next call (the store takes those slots even past `max`, and with no
//! release to come they free themselves after `expire_after`); a release decided so is
//! credited and released by the settler.

use std::sync::Arc;
use std::time::Instant;

use super::backend::CallArgs;
use super::debts::{Due, SETTLE_TIMEOUT};
use super::protocol::{Ask, Counted, RawReply, ReplyError, units};
use super::ran::{Ran, counted};
use super::slot_call::{SlotCall, SlotReply, decode, in_flight};
use super::{SharedStore, Snapshot, bump};
use crate::algo::{Hits, LimitState, Verdict};

use crate::limit::Limit;
use crate::store::peek::{CounterView, Peek};
use crate::store::{DecidedBy, OnStoreError, StoreError};

/// The slot call of `args` on an in-flight counter under `limit`: its hits, its debt.
fn slot_call(args: &CallArgs<'_>, limit: &Limit) -> SlotCall {
    let hits = match args.ask {
        Ask::Hits(hits) => hits,
        Ask::Take { .. } | Ask::GiveBack { .. } => Hits::Check,
    };
    let mut call = SlotCall::new(args.key, limit, hits, args.deadline);
    call.debt = units(args.debt);
    call
}

/// What the settler's call for `due` does besides its debt: a release of the credited
/// slots, or nothing.
fn settling_hits(due: &Due) -> Hits {
    match due.hits {
        Hits::Refund(n) => Hits::Refund(n),
        Hits::Consume(_) | Hits::Charge(_) | Hits::Check => Hits::Check,
    }
}

/// A verdict decided without the store's answer: it confirms no slot, so it says nothing
/// of the slots (`in_flight` is none) and the answer carries no rule metadata.
fn unconfirmed(mut verdict: Verdict) -> Verdict {
    verdict.in_flight = None;
    verdict
}

impl SharedStore {
    /// Decides `hits` on the in-flight counter `key` by one call to the store, carrying
    /// the slots this instance admitted without it; without an answer in time, per
    /// `on_error` (module docs).
    pub(super) async fn slots(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        on_error: OnStoreError,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        let Some(limit) = in_flight(limits) else {
            return Err(StoreError::Failed(Arc::new(ReplyError::Short(0))));
        };
        let now = self.local.now();
        if let Some(verdict) = self.decide_uncertain(key, limits, hits, now, on_error) {
            return verdict.map(|verdict| (unconfirmed(verdict), DecidedBy::Fallback));
        }
        let timeout = self.behaviour.timeout;
        let deadline = self.local.deadline(now, timeout);
        let call = self
            .ledger
            .open((key, limits), Ask::Hits(hits), now, deadline);
        let trip = self.backend.slots(slot_call(call.args(), limit));
        let pending = call.others_in_flight();
        let trip = match self.wait(trip, timeout, Instant::now()).await {
            Ok(raw) => match self.read_slots(raw) {
                Ok(reply) => {
                    let counted = Counted {
                        debt: call.args().debt,
                        hits,
                    };
                    let verdict = call.ran(|| self.adopt_slots(key, limits, counted, reply));
                    return Ok((verdict, DecidedBy::Store));
                }
                Err((e, ran)) => {
                    call.failed(ran);
                    let verdict =
                        self.fall_back(key, limits, (hits, pending), now, (e, on_error), |v| {
                            let decided = counted(hits, v.decision.admitted);
                            self.ledger.owe(key, limits, ran.owed(decided), now);
                        })?;
                    return Ok((unconfirmed(verdict), DecidedBy::Fallback));
                }
            },
            Err(trip) => trip,
        };
        let mut decided = 0;
        let timed_out = StoreError::Timeout;
        let verdict = self.fall_back(
            key,
            limits,
            (hits, pending),
            now,
            (timed_out, on_error),
            |v| {
                decided = counted(hits, v.decision.admitted);
                self.ledger
                    .expect(key, limits, u64::try_from(decided).unwrap_or(0));
            },
        );
        call.outlived(trip, Some(decided), now);
        Ok((unconfirmed(verdict?), DecidedBy::Fallback))
    }

    /// The store's answer to a slot call that `counted` as the verdict, and the slots
    /// after it as the counter's view.
    fn adopt_slots(
        &self,
        key: &str,
        limits: &[Limit],
        counted: Counted,
        reply: SlotReply,
    ) -> Verdict {
        let snapshot = Snapshot {
            admitted: reply.admitted,
            now: reply.now,
            states: vec![LimitState::Slots(reply.before.clone())],
        };
        let mut verdict = self.adopt(key, limits, counted, snapshot);
        if let Some(f) = &mut verdict.in_flight {
            if let Hits::Consume(n) = counted.hits
                && verdict.decision.admitted != reply.admitted
            {
                let taken = if reply.admitted { units(n) } else { 0 };
                let before = reply.before.count(reply.now).saturating_add(counted.debt);
                f.held = before.saturating_add(taken);
            }
            // The store dropped the expired slots before answering: `before` holds none.
            f.expired = reply.expired;
        }
        verdict
    }

    /// Settles in-flight counter `due.key`: the slots admitted without the store taken
    /// (carried by a check), or those released without it released.
    pub(super) async fn settle_slots(&self, due: &Due) {
        let Some(limit) = in_flight(&due.limits) else {
            return;
        };
        let now = self.local.now();
        let deadline = self.local.deadline(now, SETTLE_TIMEOUT);
        let call = self.ledger.settle(due, now, deadline);
        let settling = slot_call(call.args(), limit);
        let trip = self.backend.slots(settling);
        match self.wait(trip, SETTLE_TIMEOUT, Instant::now()).await {
            Err(trip) => call.outlived(trip, None, now),
            Ok(raw) => match self.read_slots(raw) {
                Ok(reply) => {
                    let debt = call.args().debt;
                    let counted = Counted {
                        debt,
                        hits: settling_hits(due),
                    };
                    call.ran(|| self.adopt_slots(&due.key, &due.limits, counted, reply));
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
