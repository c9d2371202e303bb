//! Round trips that outlived their request's wait. The request was answered per
//! `--on-store-error`, but the call was sent and may still run: dropping it would leave
//! the store counting what it will, unknown to this instance, and the instance owing what
//! it admitted twice or not at all. So the call is awaited in the background, and what it
//! did settles the account: the debt it carried landed or is owed again, and what the
//! fallback counted beyond what the store counted is owed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::backend::{CallArgs, Trip};
use super::counted;
use super::ledger::Ledger;
use super::protocol::{self, Reply};
use crate::algo::Hits;
use crate::clock::Timestamp;
use crate::limit::Limit;

/// Round trips awaited at once; past it, a call is taken as not run (conservatively: what
/// its request admitted is owed).
const MAX_AWAITED: usize = 10_000;
/// Longest a call is awaited after its request was answered; then it is taken as not run.
const LATE_WAIT: Duration = Duration::from_secs(30);

impl Ledger {
    /// Awaits `trip`, the call of `args` (its own `hits`) whose request was decided
    /// without it at `now`, its fallback counting `decided` units (negative: given back;
    /// what it admitted is awaited in the debts meanwhile).
    pub(super) fn hear_late(
        self: &Arc<Self>,
        trip: Trip,
        args: &CallArgs<'_>,
        hits: Hits,
        decided: i64,
        now: Timestamp,
    ) {
        let (key, limits, debt) = (args.key, args.limits, args.debt);
        if self.awaited.fetch_add(1, Ordering::Relaxed) >= MAX_AWAITED {
            self.awaited.fetch_sub(1, Ordering::Relaxed);
            self.reconcile(key, limits, debt, None, decided, now);
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
            let stored = match raw {
                Ok(Ok(raw)) => match protocol::decode(&raw, &limits) {
                    Ok(Reply::Ran { admitted, .. }) => Some(counted(hits, admitted)),
                    Ok(Reply::Late { .. }) | Err(_) => None,
                },
                Ok(Err(_)) | Err(_) => None,
            };
            ledger.reconcile(&key, &limits, debt, stored, decided, now);
        });
    }

    /// Settles a call that carried `debt`, which the store ran counting `stored` units of
    /// its hits (`None`: did not run, or not known), while the request's fallback counted
    /// `decided`.
    fn reconcile(
        &self,
        key: &str,
        limits: &[Limit],
        debt: u64,
        stored: Option<i64>,
        decided: i64,
        now: Timestamp,
    ) {
        let owed = match stored {
            Some(stored) => {
                if debt > 0 {
                    self.debts.landed(key, debt);
                }
                decided - stored
            }
            None => {
                self.debts.restore(key, debt);
                decided
            }
        };
        let expected = u64::try_from(decided).unwrap_or(0);
        self.debts.heard(key, limits, expected, owed, now);
    }
}
