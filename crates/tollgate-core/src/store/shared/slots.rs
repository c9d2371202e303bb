//! In-flight rules on a shared store. Every instance must see a release at once, so these
//! counters skip the local view, leases and debts: each hit, release or check is one call
//! to the store (`redis/slots.lua`, `postgres/slots.sql`), which keeps the slots in its
//! own clock and answers the slots held before the call. The verdict is the memory
//! store's algorithm on those slots; the store's own decision wins where they differ.

use std::sync::Arc;
use std::time::Instant;

use super::protocol::{RawReply, ReplyError, units};
use super::slot_call::SlotCall;
use super::{SharedStore, bump};
use crate::algo::{Hits, LimitState, LimitVerdict, Slots, Verdict, apply};
use crate::clock::Timestamp;
use crate::limit::{Algorithm, Limit};
use crate::store::peek::{CounterView, Peek};
use crate::store::{DecidedBy, OnStoreError, StoreError};

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

impl SharedStore {
    /// Decides `hits` on the in-flight counter `key` by one call to the store; without an
    /// answer in time, per `--on-store-error` (`local` admits: no view holds slots).
    pub(super) async fn slots(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        let (verdict, _) = match self.slot_call(key, limits, hits).await {
            Ok(answer) => answer,
            Err(e) => {
                bump(&self.counts.fallbacks);
                let admitted = match self.behaviour.on_error {
                    OnStoreError::Error => return Err(e),
                    OnStoreError::Deny => false,
                    OnStoreError::Allow | OnStoreError::Local => true,
                };
                let decision = LimitVerdict {
                    admitted,
                    remaining: 0,
                    reset: limits.first().map(Limit::window).unwrap_or_default(),
                };
                let verdict = Verdict {
                    limit_index: 0,
                    decision,
                    in_flight: None,
                };
                return Ok((verdict, DecidedBy::Fallback));
            }
        };
        Ok((verdict, DecidedBy::Store))
    }

    /// The in-flight counter `key` as the store holds it, read with a check.
    pub(super) async fn peek_slots(&self, key: &str, limits: &[Limit], hits: u64) -> Peek {
        let shared = self
            .slot_call(key, limits, Hits::Check)
            .await
            .map(|(_, (now, before))| {
                let states = [LimitState::Slots(before)];
                CounterView::of(Some(&states), limits, now, hits)
            });
        Peek {
            local: None,
            stored_key: None,
            shared: Some(shared),
            lease: None,
        }
    }

    /// One call for `hits`, waited for at most the store timeout: the verdict, the
    /// store's clock and the slots held before.
    async fn slot_call(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<(Verdict, (Timestamp, Slots)), StoreError> {
        let Some(limit) = in_flight(limits) else {
            return Err(StoreError::Failed(Arc::new(ReplyError::Short(0))));
        };
        let timeout = self.behaviour.timeout;
        let now = self.local.now();
        let call = SlotCall::new(key, limit, hits, self.local.deadline(now, timeout));
        let started = Instant::now();
        let trip = self.backend.slots(call);
        let answer = match self.wait(trip, timeout, started).await {
            Err(_) => return Err(StoreError::Timeout),
            Ok(raw) => self.raw_reply(raw)?,
        };
        let reply = match decode(&answer) {
            Ok(Some(reply)) => reply,
            Ok(None) => {
                bump(&self.counts.timeouts);
                return Err(StoreError::Timeout);
            }
            Err(why) => return Err(self.unreadable(why)),
        };
        bump(&self.counts.round_trips);
        self.local.learn_time(reply.now);
        let mut states = [LimitState::Slots(reply.before.clone())];
        let mut verdict = apply(&mut states, limits, reply.now, hits);
        if let Hits::Consume(n) = hits
            && verdict.decision.admitted != reply.admitted
        {
            bump(&self.counts.disagreements);
            verdict.decision.admitted = reply.admitted;
            let taken = if reply.admitted { units(n) } else { 0 };
            if let Some(f) = &mut verdict.in_flight {
                f.held = reply.before.count(reply.now).saturating_add(taken);
            }
        }
        // The store dropped the expired slots before answering: `before` holds none.
        if let Some(f) = &mut verdict.in_flight {
            f.expired = reply.expired;
        }
        Ok((verdict, (reply.now, reply.before)))
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
