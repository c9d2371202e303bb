//! Round trips that outlived their request's wait. The request was answered per
//! `--on-store-error`, but the call was sent and may still run: dropping it would leave
//! the store counting what it will, unknown to this instance, and the instance owing what
//! it decided twice or not at all. So the call is awaited in the background, and what it
//! did settles the account: the debt it carried landed or is owed again, a credit it gave
//! back landed or is credited again, and the difference between what the fallback decided
//! and what the store counted is owed (or credited, when the store counted more).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::backend::{CallArgs, Trip, TripError};
use super::ledger::Ledger;
use super::protocol::{self, RawReply, Reply};
use super::ran::{Ran, counted};
use super::slot_call;
use crate::algo::Hits;
use crate::clock::Timestamp;
use crate::limit::Limit;

/// Round trips awaited at once; past it, a call is taken as in doubt.
const MAX_AWAITED: usize = 10_000;
/// Longest a call is awaited after its request was answered; then it is taken as in doubt.
pub(super) const LATE_WAIT: Duration = Duration::from_secs(30);

/// What the reply `raw` of a call for `hits` on a counter under `limits` says it did.
fn heard(raw: Result<RawReply, TripError>, limits: &[Limit], hits: Hits) -> Ran {
    let raw = match raw {
        Ok(raw) => raw,
        Err(e) => return e.ran(),
    };
    if slot_call::in_flight(limits).is_some() {
        return slot_call::ran(&raw, hits);
    }
    match protocol::decode(&raw, limits) {
        Ok(Reply::Ran { admitted, .. }) => Ran::Counted(counted(hits, admitted)),
        Ok(Reply::Late { .. }) => Ran::Not,
        Err(_) => Ran::InDoubt,
    }
}

impl Ledger {
    /// Awaits `trip`, the call of `args` (its own `hits`, giving back `credit` credited
    /// units) that was not answered in time at `now`. For a request's call, its fallback
    /// counted `decided` units (negative: given back; what it admitted is awaited in the
    /// debts meanwhile); a call of no request (the settler's) has none.
    pub(super) fn hear_late(
        self: &Arc<Self>,
        trip: Trip,
        args: &CallArgs<'_>,
        (hits, credit): (Hits, u64),
        decided: Option<i64>,
        now: Timestamp,
    ) {
        let (key, limits, debt) = (args.key, args.limits, args.debt);
        if self.awaited.fetch_add(1, Ordering::Relaxed) >= MAX_AWAITED {
            self.awaited.fetch_sub(1, Ordering::Relaxed);
            self.doubted();
            self.reconcile((key, limits), (debt, credit), Ran::InDoubt, decided, now);
            return;
        }
        let ledger = Arc::downgrade(self);
        let (key, limits): (Box<str>, Box<[Limit]>) = (key.into(), limits.into());
        tokio::spawn(async move {
            let raw = tokio::time::timeout(LATE_WAIT, trip).await;
            let Some(ledger) = ledger.upgrade() else {
                return;
            };
            ledger.awaited.fetch_sub(1, Ordering::Relaxed);
            let ran = match raw {
                Ok(raw) => heard(raw, &limits, hits),
                Err(_) => Ran::InDoubt,
            };
            if ran == Ran::InDoubt {
                ledger.doubted();
            }
            ledger.reconcile((&key, &limits), (debt, credit), ran, decided, now);
        });
    }

    /// Settles a call on counter `key` that carried `debt` and gave back `credit`, which
    /// the store `ran` as it says, while its request's fallback (if it had one) counted
    /// `decided`.
    pub(super) fn reconcile(
        &self,
        (key, limits): (&str, &[Limit]),
        (debt, credit): (u64, u64),
        ran: Ran,
        decided: Option<i64>,
        now: Timestamp,
    ) {
        match ran {
            Ran::Counted(_) => {
                if debt > 0 {
                    self.debts.landed(key, debt);
                }
                if credit > 0 {
                    self.debts.credited(key, credit);
                }
            }
            Ran::Not => {
                self.debts.restore(key, debt);
                if credit > 0 {
                    self.debts.restore_credit(key, credit);
                }
            }
            Ran::InDoubt => {
                self.debts.restore(key, debt);
                if credit > 0 {
                    self.debts.credit_in_doubt(key, credit);
                }
            }
        }
        if let Some(decided) = decided {
            let expected = u64::try_from(decided).unwrap_or(0);
            self.debts
                .heard(key, limits, expected, ran.owed(decided), now);
        }
    }
}
