//! The store's side of leases: a take sent for a hot counter and its answer adopted, blocks
//! given back in tasks of their own, and the sweeper that gives back idle ones.

use std::sync::Arc;

use tracing::Instrument as _;

use super::{GiveBack, Leases, Miss, PERIOD, Spend, Taken};
use crate::algo::{Hits, Verdict, evaluate};
use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::backend::{CallArgs, Trip};
use crate::store::shared::late::LATE_WAIT;
use crate::store::shared::protocol::{Ask, Counted, RawReply, Reply, decode, effect, lease_effect};
use crate::store::shared::ran::Ran;
use crate::store::shared::{SharedStore, Snapshot, StoreError, bump};

/// A take that is out. Dropped unanswered (it failed, or the request was dropped with it),
/// it lets the counter take again and the requests waiting for it go on.
pub(super) struct TakeOut<'a> {
    leases: &'a Leases,
    key: &'a str,
    answered: bool,
}

impl<'a> TakeOut<'a> {
    /// The take out for counter `key` in `leases`.
    pub(super) fn new(leases: &'a Leases, key: &'a str) -> Self {
        Self {
            leases,
            key,
            answered: false,
        }
    }

    /// The take was answered: `Leases::took` ends it.
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for TakeOut<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.leases.failed(self.key);
        }
    }
}

impl SharedStore {
    /// The request's `n` units from a lease: spent from the counter's block, or a new
    /// block taken with them; `None` when the counter does not lease now or the take
    /// failed (the request then goes the usual way).
    pub(in crate::store::shared) async fn lease(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        n: u64,
    ) -> Option<Result<Verdict, StoreError>> {
        let sent_local = self.local.local_now();
        let (miss, stale) = match self.leases.spend(key, limits, n, sent_local) {
            Spend::Spent(verdict) => return Some(Ok(verdict)),
            Spend::Missed { next, stale } => (next, stale),
        };
        if let Some(back) = stale {
            self.send_back(back);
        }
        let want = match miss {
            Miss::Usual => return None,
            Miss::Take(want) => want,
            Miss::Wait(taken) => {
                // Bounded by the store timeout, as the take is; after it the request goes
                // the usual way within what is left of its own timeout.
                let _ = tokio::time::timeout(self.behaviour.timeout, taken).await;
                let now = self.local.local_now();
                return self.leases.spend_waited(key, n, now).map(Ok);
            }
        };
        let out = TakeOut::new(&self.leases, key);
        if !self.is_up() {
            return None;
        }
        // Units of this counter in calls not heard from are unknown to the store, which
        // would grant a block past them: such a counter goes the usual way (`apply`).
        if self.ledger.uncertain(key) > 0 {
            return None;
        }
        let now = self.local.now();
        let deadline = self.local.deadline(now, self.behaviour.timeout);
        // What the counter owes is charged before the block, as a request's call does, and
        // the whole block is in flight meanwhile.
        let ask = Ask::Take { need: n, want };
        let call = self.ledger.open((key, limits), ask, now, deadline);
        let debt = call.args().debt;
        let timeout = self.behaviour.timeout;
        let span = self.backend.span(limits.len());
        // Counted, measured and read as a request's call is. One not answered in time may
        // still run: it is heard from late, and a block it took then is given back.
        let raw = match self.call(call.args(), timeout).instrument(span).await {
            Ok(raw) => raw,
            Err(trip) => {
                let trip = self.giving_back_late((key, limits), trip);
                call.outlived(trip, None, now);
                return None;
            }
        };
        let flag = raw.as_ref().ok().map(|raw| raw.flag);
        let (snapshot, flag) = match (self.read(raw, limits), flag) {
            (Ok(Snapshot { now, states, .. }), Some(flag)) => ((now, states), flag),
            (Err((_, ran)), _) => {
                call.failed(ran);
                return None;
            }
            (Ok(_), None) => {
                call.failed(Ran::InDoubt);
                return None;
            }
        };
        let (now, states) = snapshot;
        bump(&self.counts.round_trips);
        let granted = u64::try_from(flag).unwrap_or(0);
        let mut after = states.clone();
        if lease_effect(&mut after, limits, now, debt, ask) != granted {
            // The store decided; its block is counted on the state it read, after the debt.
            bump(&self.counts.disagreements);
            after = states;
            effect(&mut after, limits, now, debt, Hits::Check);
            for (state, limit) in after.iter_mut().zip(limits) {
                state.record(limit, now, granted);
            }
        }
        let within = evaluate(&after, limits, now, 0).decision.admitted;
        let snapshot = Snapshot {
            admitted: within,
            now,
            states: after.clone(),
        };
        let mut verdict = call.ran(|| self.adopt(key, limits, Counted::READ, snapshot));
        let taken = Taken {
            granted,
            to_request: n.min(granted),
            after: &after,
            now,
            sent_local,
        };
        out.answered();
        if let Some(back) = self.leases.took(key, limits, taken) {
            self.send_back(back);
        }
        verdict.decision.admitted = granted > 0;
        if granted == 0 {
            verdict = evaluate(&after, limits, now, n);
        } else {
            verdict.decision.remaining = verdict.decision.remaining.saturating_add(granted - n);
        }
        Some(Ok(verdict))
    }

    /// `trip`, a take not answered in time, which gives back the block it took should it
    /// run: no request will spend it.
    fn giving_back_late(self: &Arc<Self>, (key, limits): (&str, &[Limit]), trip: Trip) -> Trip {
        let me = Arc::downgrade(self);
        let (key, limits) = (key.to_owned(), limits.to_vec());
        Box::pin(async move {
            let raw = trip.await;
            if let (Ok(reply), Some(store)) = (&raw, me.upgrade())
                && let Ok(Reply::Ran { now, .. }) = decode(reply, &limits)
                && let Ok(units @ 1..) = u64::try_from(reply.flag)
            {
                let ask = Ask::GiveBack { units, taken: now };
                store.send_back(GiveBack { key, limits, ask });
            }
            raw
        })
    }

    /// Gives a block back in a task of its own; nothing waits for it. It carries no
    /// deadline, so one sent is awaited until heard of (as a late call is); one that did
    /// not run is sent again once the store is up, until its units no longer count.
    pub(in crate::store::shared) fn send_back(self: &Arc<Self>, back: GiveBack) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let GiveBack { key, limits, ask } = back;
            let longest = limits.iter().map(Limit::window).max().unwrap_or_default();
            loop {
                let Some(store) = me.upgrade() else { return };
                let now = store.now();
                if let Ask::GiveBack { taken, .. } = ask
                    && now > taken + longest
                {
                    // Past every window it was counted in: the store would take nothing.
                    return;
                }
                let timeout = store.behaviour.timeout;
                let trip = store
                    .backend
                    .check_and_count(&give_back(&key, &limits, ask, now));
                drop(store);
                let raw = tokio::time::timeout(LATE_WAIT, trip).await;
                let Some(store) = me.upgrade() else { return };
                let ran = match &raw {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(e.ran()),
                    Err(_) => Some(Ran::InDoubt),
                };
                match (ran, raw) {
                    (None, Ok(Ok(raw))) => {
                        if let Some(at) = store.gave_back(&key, &limits, ask, &raw) {
                            store.announce_decrease(&key, at, timeout).await;
                        }
                        return;
                    }
                    (Some(Ran::Not), _) => {
                        // Never ran: again once the store answers.
                        store.wait_up(LATE_WAIT).await;
                    }
                    _ => {
                        // It may have run: sent again it could be given back twice. The
                        // store keeps counting those units, which only denies more.
                        store.ledger.doubted();
                        return;
                    }
                }
            }
        });
    }

    /// Gives back every block held (at shutdown), waiting for the store at most `limit`.
    pub async fn give_back_leases(self: &Arc<Self>, limit: std::time::Duration) {
        let now = self.local.now();
        let calls = self
            .leases
            .sweep(self.local.local_now(), true)
            .into_iter()
            .map(|GiveBack { key, limits, ask }| {
                let trip = self
                    .backend
                    .check_and_count(&give_back(&key, &limits, ask, now));
                async move {
                    if let Ok(Ok(raw)) = tokio::time::timeout(limit, trip).await
                        && let Some(at) = self.gave_back(&key, &limits, ask, &raw)
                    {
                        self.announce_decrease(&key, at, limit).await;
                    }
                }
            });
        futures_util::future::join_all(calls).await;
    }

    /// What give-back `ask`'s reply `raw` says: the units the store took back are counted,
    /// and the counter after it becomes the local view, as a refresh's answer does (unless
    /// a later answer is there already), so the view holds no units the store gave back
    /// and denies only what the store would. The store time of the give-back when it took
    /// units back, which the other instances must hear of.
    fn gave_back(
        &self,
        key: &str,
        limits: &[Limit],
        ask: Ask,
        raw: &RawReply,
    ) -> Option<Timestamp> {
        let (units, snapshot) = given_back(raw, limits, ask)?;
        self.leases.returned(units);
        let at = snapshot.now;
        self.adopt(key, limits, Counted::READ, snapshot);
        (units > 0).then_some(at)
    }
}

/// A give-back's call: no debt (it is no request's), no deadline (units unspent are
/// returned whenever it runs), not in flight (it counts nothing).
fn give_back<'a>(key: &'a str, limits: &'a [Limit], ask: Ask, now: Timestamp) -> CallArgs<'a> {
    CallArgs {
        key,
        limits,
        debt: 0,
        ask,
        deadline: None,
        around: now,
    }
}

/// The units give-back `ask` returned to the store, and the counter after it, as its
/// reply `raw` (the state it read, and when) says: no units where it came after the
/// (sub-)window of every windowed limit had passed.
fn given_back(raw: &RawReply, limits: &[Limit], ask: Ask) -> Option<(u64, Snapshot)> {
    let (Ok(Reply::Ran { now, states, .. }), Ask::GiveBack { units, taken }) =
        (decode(raw, limits), ask)
    else {
        return None;
    };
    // A give-back of nothing rolls the windows as the real one does: only a difference
    // from it is units taken back.
    let mut rolled = states.clone();
    lease_effect(
        &mut rolled,
        limits,
        now,
        0,
        Ask::GiveBack { units: 0, taken },
    );
    let mut after = states;
    lease_effect(&mut after, limits, now, 0, ask);
    let returned = match after == rolled {
        true => 0,
        false => units,
    };
    let snapshot = Snapshot {
        admitted: evaluate(&after, limits, now, 0).decision.admitted,
        now,
        states: after,
    };
    Some((returned, snapshot))
}

/// Every period, gives back the blocks idle or past their end.
pub(in crate::store::shared) fn spawn_sweeper(store: &Arc<SharedStore>) {
    let me = Arc::downgrade(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PERIOD);
        loop {
            tick.tick().await;
            let Some(store) = me.upgrade() else { return };
            for back in store.leases.sweep(store.local.local_now(), false) {
                store.send_back(back);
            }
        }
    });
}
