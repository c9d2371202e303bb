//! The ledger of one instance's calls to the shared store, and the [`Call`] every
//! check-and-count is: what the instance owes the store ([`Debts`]), the units in calls
//! not answered yet ([`InFlight`]), and the calls that outlived their request's wait
//! (`late.rs`). A call is opened from the ledger, carrying what it owes, and resolved
//! exactly once: it [`ran`](Call::ran), [`failed`](Call::failed), or
//! [`outlived`](Call::outlived) its request; dropped unresolved, it is in doubt.
//!
//! Lock order: a local view's shard, then the ledger's debts (the view asks the ledger
//! under its lock, `LocalView::adopt` and `fall_back`); never the other way round.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::backend::{CallArgs, Trip};
use super::debts::{DebtStats, Debts, Due};
use super::in_flight::{InFlight, Sent};
use super::protocol::Ask;
use super::ran::Ran;
use crate::algo::Hits;
use crate::clock::Timestamp;
use crate::limit::Limit;

/// Debts, units in flight and calls awaited late, of one instance.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    pub(super) debts: Debts,
    in_flight: InFlight,
    /// Calls that outlived their request's wait and are still awaited (`late.rs`).
    pub(super) awaited: AtomicUsize,
    /// Calls that may or may not have run (`late::Ran::InDoubt`).
    pub(super) in_doubt: AtomicU64,
}

/// One check-and-count, open until resolved.
#[must_use = "a call is resolved: ran, failed or outlived"]
pub(crate) struct Call<'a> {
    ledger: &'a Arc<Ledger>,
    args: CallArgs<'a>,
    /// The call's units in flight, counted until it is resolved.
    sent: Option<Sent<'a>>,
    /// Credited units the call gives back (the settler's refund of a credit).
    credit: u64,
    open: bool,
}

impl Ledger {
    /// A call of `ask` for counter `key` at store time `now`, carrying what the counter
    /// owes; the units it may count are in flight while it is open.
    pub(crate) fn open<'a>(
        self: &'a Arc<Self>,
        (key, limits): (&'a str, &'a [Limit]),
        ask: Ask,
        now: Timestamp,
        deadline: Option<Timestamp>,
    ) -> Call<'a> {
        let debt = self.debts.take(key, now);
        let in_flight = match ask {
            Ask::Hits(hits) => hits,
            // The store may grant all of `want`: a fallback meanwhile leaves room for it.
            Ask::Take { want, .. } => Hits::Consume(want),
            Ask::GiveBack { .. } => Hits::Check,
        };
        let sent = Some(self.in_flight.send(key, in_flight));
        let args = CallArgs {
            key,
            limits,
            debt,
            ask,
            deadline,
            around: now,
        };
        Call {
            ledger: self,
            args,
            sent,
            credit: 0,
            open: true,
        }
    }

    /// The call that sends `due`, a debt no request carried (a check carrying it) or a
    /// credit (a refund of its own), to the store.
    pub(crate) fn settle<'a>(
        self: &'a Arc<Self>,
        due: &'a Due,
        now: Timestamp,
        deadline: Option<Timestamp>,
    ) -> Call<'a> {
        let counter = (&*due.key, &*due.limits);
        match due.hits {
            Hits::Refund(credit) => {
                let mut call = self.check(counter, 0, now, deadline);
                call.args.ask = Ask::Hits(due.hits);
                call.credit = credit;
                call
            }
            Hits::Charge(units) => self.check(counter, units, now, deadline),
            Hits::Consume(_) | Hits::Check => self.check(counter, 0, now, deadline),
        }
    }

    /// A read of counter `key` that counts nothing and carries no debt.
    pub(crate) fn read<'a>(
        self: &'a Arc<Self>,
        counter: (&'a str, &'a [Limit]),
        now: Timestamp,
        deadline: Option<Timestamp>,
    ) -> Call<'a> {
        self.check(counter, 0, now, deadline)
    }

    /// A check of counter `key` carrying `debt`: it counts nothing of its own, so nothing
    /// of it is in flight.
    fn check<'a>(
        self: &'a Arc<Self>,
        (key, limits): (&'a str, &'a [Limit]),
        debt: u64,
        now: Timestamp,
        deadline: Option<Timestamp>,
    ) -> Call<'a> {
        let args = CallArgs {
            key,
            limits,
            debt,
            ask: Ask::Hits(Hits::Check),
            deadline,
            around: now,
        };
        Call {
            ledger: self,
            args,
            sent: None,
            credit: 0,
            open: true,
        }
    }

    /// Units of `key` in calls not answered yet.
    pub(crate) fn in_flight(&self, key: &str) -> u64 {
        self.in_flight.units(key)
    }

    /// Units of `key` on their way in calls not heard from: the store cannot decide with
    /// them in mind.
    pub(crate) fn uncertain(&self, key: &str) -> u64 {
        self.debts.uncertain(key)
    }

    /// Units of `key` not in the store as far as this instance knows.
    pub(crate) fn unsettled(&self, key: &str) -> u64 {
        self.debts.unsettled(key)
    }

    /// Records what a decision made at `now` without the store counted on counter `key`:
    /// units admitted are owed, units given back cancel owed ones.
    pub(crate) fn owe(&self, key: &str, limits: &[Limit], units: i64, now: Timestamp) {
        self.debts.owe(key, limits, units, now);
    }

    /// Records `units` admitted without the store while the request's own call is out.
    pub(crate) fn expect(&self, key: &str, limits: &[Limit], units: u64) {
        self.debts.expect(key, limits, units);
    }

    /// Whether nothing is owed.
    pub(crate) fn owes_nothing(&self) -> bool {
        self.debts.is_empty()
    }

    /// Up to `max` debts no request carried, for the settler.
    pub(crate) fn due(&self, now: Timestamp, max: usize) -> Vec<Due> {
        self.debts.due(now, max)
    }

    pub(crate) fn stats(&self) -> DebtStats {
        self.debts.stats()
    }

    /// Counts a call taken as in doubt.
    pub(crate) fn doubted(&self) {
        self.in_doubt.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls taken as in doubt so far.
    pub(crate) fn in_doubt(&self) -> u64 {
        self.in_doubt.load(Ordering::Relaxed)
    }

    /// Whether every call is heard from and nothing is owed or credited.
    pub(crate) fn is_settled(&self) -> bool {
        self.owes_nothing() && self.awaited.load(Ordering::Relaxed) == 0
    }
}

impl<'a> Call<'a> {
    pub(crate) fn args(&self) -> &CallArgs<'a> {
        &self.args
    }

    /// Units of the counter in other calls not answered yet.
    pub(crate) fn others_in_flight(&self) -> u64 {
        self.sent.as_ref().map_or(0, Sent::others)
    }

    /// The store ran the call: the debt it carried landed (and the credit it gave back),
    /// then `adopt` takes its answer in while the call's units still count as in flight
    /// (so no fallback meanwhile misses them from both).
    pub(crate) fn ran<T>(mut self, adopt: impl FnOnce() -> T) -> T {
        self.open = false;
        if self.args.debt > 0 {
            self.ledger.debts.landed(self.args.key, self.args.debt);
        }
        if self.credit > 0 {
            self.ledger.debts.credited(self.args.key, self.credit);
        }
        adopt()
    }

    /// The call failed: it did not run, or (`Ran::InDoubt`) may have. Its debt is owed
    /// again; its credit is credited again unless it may have been given back.
    pub(crate) fn failed(mut self, ran: Ran) {
        self.open = false;
        if ran == Ran::InDoubt && self.moves_units() {
            self.ledger.doubted();
        }
        self.unresolved(ran);
    }

    /// Whether the call may change a count: it asks for more than a check, or carries a
    /// debt or a credit.
    fn moves_units(&self) -> bool {
        let asked = !matches!(self.args.ask, Ask::Hits(Hits::Check));
        asked || self.args.debt > 0 || self.credit > 0
    }

    fn unresolved(&self, ran: Ran) {
        let args = (self.args.key, self.args.limits);
        let carried = (self.args.debt, self.credit);
        self.ledger
            .reconcile(args, carried, ran, None, self.args.around);
    }

    /// The call's request was decided at `now` without it, counting `decided` units
    /// (negative: given back), or it is a call of no request (`None`); the call is
    /// awaited in the background (`late.rs`).
    pub(crate) fn outlived(mut self, trip: Trip, decided: Option<i64>, now: Timestamp) {
        self.open = false;
        let hits = match self.args.ask {
            Ask::Hits(hits) => hits,
            Ask::Take { .. } | Ask::GiveBack { .. } => Hits::Check,
        };
        let carried = (hits, self.credit);
        self.ledger
            .hear_late(trip, &self.args, carried, decided, now);
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        // Dropped unresolved (its request was dropped while it was out): it may run.
        if self.open {
            if self.moves_units() {
                self.ledger.doubted();
            }
            self.unresolved(Ran::InDoubt);
        }
    }
}
