//! What this instance owes a shared store: units it admitted while the store did not
//! answer in time (decided from the local view, or admitted by `--on-store-error allow`),
//! per counter, until a call that carries them lands. Units admitted while the request's
//! own call is still out are awaited: that call may yet count them.
//!
//! A local fallback is a debt, not a gift: the next call for the counter carries the debt
//! and the store charges it before it checks the call's own hits, and a background
//! settler sends what no request carries. So the shared count catches up with what every
//! instance admitted, and one instance never admits more than its limit because the store
//! was slow. A debt whose units would no longer count (its windows have passed) is
//! forgiven instead of charged to a later window.
//!
//! The other way round is a credit: units the store counted that this instance gave back
//! without it (a refund decided while the store did not answer, a call the store ran
//! after its request was refused, a slot the store took for a request answered without
//! one). The settler sends each as a refund of its own, so that the store's count comes
//! down to what was admitted, not only up to it. A credit whose units would no longer
//! count is forgiven too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::algo::{Hits, LimitState};
use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::lock::lock;

/// The settler's calls run off the request path, so they may wait longer than requests.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Counters that may owe at once; past it a new debt is forgiven (and counted).
pub(crate) const MAX_DEBTS: usize = 100_000;

/// One counter's account: units owed (not yet sent, sent and not yet known to have
/// landed, admitted while the request's own call is out), and units credited (to give
/// back, and given back but not yet heard of).
#[derive(Debug)]
struct Debt {
    limits: Box<[Limit]>,
    owed: u64,
    sending: u64,
    awaited: u64,
    /// When the owed units would no longer count, had they been counted when admitted.
    expires: Timestamp,
    credit: u64,
    crediting: u64,
    /// When the credited units would no longer count in the store.
    credit_expires: Timestamp,
}

/// What the settler sends for one counter: owed units (`Hits::Charge`, carried by a
/// check) or credited ones (`Hits::Refund`, a refund of their own).
pub(crate) struct Due {
    pub(crate) key: Box<str>,
    pub(crate) limits: Box<[Limit]>,
    pub(crate) hits: Hits,
}

/// Figures of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DebtStats {
    /// Counters that owe.
    pub(crate) counters: usize,
    /// Units owed, on their way, or awaited.
    pub(crate) units: u64,
    /// Units that reached the store.
    pub(crate) charged: u64,
    /// Units forgiven, owed or credited: their windows passed first, or the ledger was
    /// full.
    pub(crate) forgiven: u64,
    /// Units credited: to give back to the store, or on their way.
    pub(crate) credit_units: u64,
    /// Credited units the store gave back.
    pub(crate) credited: u64,
}

/// The ledger of every counter's debt.
#[derive(Debug, Default)]
pub(crate) struct Debts {
    ledger: Mutex<HashMap<Box<str>, Debt>>,
    /// Entries in the ledger, read without its lock on every request.
    counters: AtomicUsize,
    units: AtomicU64,
    charged: AtomicU64,
    forgiven: AtomicU64,
    credit_units: AtomicU64,
    credited: AtomicU64,
}

impl Debts {
    /// Whether nothing is owed, read without the ledger's lock: the lookups a request makes
    /// ([`Debts::take`], [`Debts::unsettled`], [`Debts::uncertain`]) ask it first, so that
    /// while the store answers they are the request path's only cost.
    pub(crate) fn is_empty(&self) -> bool {
        self.counters.load(Ordering::Relaxed) == 0
    }

    /// Records what a decision made at `now` without the store counted on counter
    /// `key`: units admitted are owed (less any credit), units given back cancel owed
    /// ones and are credited beyond them.
    pub(crate) fn owe(&self, key: &str, limits: &[Limit], units: i64, now: Timestamp) {
        match u64::try_from(units) {
            Ok(owed) => self.incur(key, limits, owed, now),
            Err(_) => self.refund(key, limits, units.unsigned_abs(), now),
        }
    }

    /// Records `units` admitted without the store whose request's call is still out: not
    /// owed yet, but not in the store as far as this instance knows.
    pub(crate) fn expect(&self, key: &str, limits: &[Limit], units: u64) {
        if units == 0 {
            return;
        }
        let mut ledger = self.lock();
        // Without room they are not forgiven yet: the call may still count them, and what
        // it is heard not to have counted is owed (and forgiven) then.
        if let Some(debt) = self.entry(&mut ledger, key, limits) {
            debt.awaited = debt.awaited.saturating_add(units);
            self.units.fetch_add(units, Ordering::Relaxed);
        }
    }

    /// The call behind `expected` awaited units was heard from (or given up on): they are
    /// no longer awaited, and `owed` units (negative: given back) are owed instead.
    pub(crate) fn heard(
        &self,
        key: &str,
        limits: &[Limit],
        expected: u64,
        owed: i64,
        now: Timestamp,
    ) {
        if expected > 0 {
            let mut ledger = self.lock();
            if let Some(debt) = ledger.get_mut(key) {
                let expected = expected.min(debt.awaited);
                debt.awaited -= expected;
                self.units.fetch_sub(expected, Ordering::Relaxed);
                self.drop_if_settled(&mut ledger, key);
            }
        }
        self.owe(key, limits, owed, now);
    }

    /// The ledger's entry for `key`, made if need be; none when the ledger is full.
    fn entry<'a>(
        &self,
        ledger: &'a mut HashMap<Box<str>, Debt>,
        key: &str,
        limits: &[Limit],
    ) -> Option<&'a mut Debt> {
        if !ledger.contains_key(key) {
            if ledger.len() >= MAX_DEBTS {
                return None;
            }
            let debt = Debt {
                limits: limits.into(),
                owed: 0,
                sending: 0,
                awaited: 0,
                expires: Timestamp::default(),
                credit: 0,
                crediting: 0,
                credit_expires: Timestamp::default(),
            };
            ledger.insert(key.into(), debt);
            self.counters.store(ledger.len(), Ordering::Relaxed);
        }
        ledger.get_mut(key)
    }

    fn incur(&self, key: &str, limits: &[Limit], units: u64, now: Timestamp) {
        if units == 0 {
            return;
        }
        let mut ledger = self.lock();
        let Some(debt) = self.entry(&mut ledger, key, limits) else {
            // No room to remember them: owed units are forgiven.
            self.forgiven.fetch_add(units, Ordering::Relaxed);
            return;
        };
        self.expire(debt, now);
        // Units to give back and units to add cancel out: the store's count is right.
        let cancelled = units.min(debt.credit);
        debt.credit -= cancelled;
        self.credit_units.fetch_sub(cancelled, Ordering::Relaxed);
        let units = units - cancelled;
        if units > 0 {
            debt.owed = debt.owed.saturating_add(units);
            debt.expires = debt.expires.max(counts_until(&debt.limits, debt.owed, now));
            self.units.fetch_add(units, Ordering::Relaxed);
        }
        self.drop_if_settled(&mut ledger, key);
    }

    /// A refund decided without the store at `now` cancels owed units; what is left is
    /// credited, to be given back to the store.
    fn refund(&self, key: &str, limits: &[Limit], units: u64, now: Timestamp) {
        if units == 0 {
            return;
        }
        let mut ledger = self.lock();
        let Some(debt) = self.entry(&mut ledger, key, limits) else {
            // No room: the store keeps counting them, which can only deny more.
            self.forgiven.fetch_add(units, Ordering::Relaxed);
            return;
        };
        self.expire(debt, now);
        let cancelled = units.min(debt.owed);
        debt.owed -= cancelled;
        self.units.fetch_sub(cancelled, Ordering::Relaxed);
        let units = units - cancelled;
        if units > 0 {
            debt.credit = debt.credit.saturating_add(units);
            let until = counts_until(&debt.limits, debt.credit, now);
            debt.credit_expires = debt.credit_expires.max(until);
            self.credit_units.fetch_add(units, Ordering::Relaxed);
        }
        self.drop_if_settled(&mut ledger, key);
    }

    /// Forgives what `debt` holds, owed or credited, whose windows have passed by `now`:
    /// those units would only burden (or relieve) the current window.
    fn expire(&self, debt: &mut Debt, now: Timestamp) {
        if now >= debt.expires && debt.owed > 0 {
            self.forget(debt.owed);
            debt.owed = 0;
        }
        if now >= debt.credit_expires && debt.credit > 0 {
            self.credit_units.fetch_sub(debt.credit, Ordering::Relaxed);
            self.forgiven.fetch_add(debt.credit, Ordering::Relaxed);
            debt.credit = 0;
        }
    }

    /// What a call for `key` should carry: every owed unit, now on its way (0 if none, or
    /// if its windows have passed).
    pub(crate) fn take(&self, key: &str, now: Timestamp) -> u64 {
        if self.is_empty() {
            return 0;
        }
        let mut ledger = self.lock();
        let Some(debt) = ledger.get_mut(key) else {
            return 0;
        };
        let units = if now >= debt.expires {
            self.forget(debt.owed);
            0
        } else {
            debt.owed
        };
        debt.owed = 0;
        debt.sending = debt.sending.saturating_add(units);
        self.drop_if_settled(&mut ledger, key);
        units
    }

    /// A call carrying `sent` units of `key`'s debt landed.
    pub(crate) fn landed(&self, key: &str, sent: u64) {
        let mut ledger = self.lock();
        if let Some(debt) = ledger.get_mut(key) {
            let sent = sent.min(debt.sending);
            debt.sending -= sent;
            self.units.fetch_sub(sent, Ordering::Relaxed);
            self.charged.fetch_add(sent, Ordering::Relaxed);
            self.drop_if_settled(&mut ledger, key);
        }
    }

    /// Units of `key` not in the store as far as this instance knows.
    pub(crate) fn unsettled(&self, key: &str) -> u64 {
        if self.is_empty() {
            return 0;
        }
        self.lock().get(key).map_or(0, Debt::unsettled)
    }

    /// Units of `key` on their way to the store in calls not heard from yet (a charge
    /// being sent, a call its request stopped waiting for): the store cannot decide with
    /// them in mind.
    pub(crate) fn uncertain(&self, key: &str) -> u64 {
        if self.is_empty() {
            return 0;
        }
        self.lock()
            .get(key)
            .map_or(0, |debt| debt.sending.saturating_add(debt.awaited))
    }

    /// A call carrying `sent` units did not land (or may not have): owed again.
    pub(crate) fn restore(&self, key: &str, sent: u64) {
        if sent == 0 {
            return;
        }
        let mut ledger = self.lock();
        if let Some(debt) = ledger.get_mut(key) {
            let sent = sent.min(debt.sending);
            debt.sending -= sent;
            debt.owed = debt.owed.saturating_add(sent);
        }
    }

    /// A refund of `sent` credited units of `key` landed.
    pub(crate) fn credited(&self, key: &str, sent: u64) {
        let mut ledger = self.lock();
        if let Some(debt) = ledger.get_mut(key) {
            let sent = sent.min(debt.crediting);
            debt.crediting -= sent;
            self.credit_units.fetch_sub(sent, Ordering::Relaxed);
            self.credited.fetch_add(sent, Ordering::Relaxed);
            self.drop_if_settled(&mut ledger, key);
        }
    }

    /// A refund of `sent` credited units of `key` did not run: credited again.
    pub(crate) fn restore_credit(&self, key: &str, sent: u64) {
        let mut ledger = self.lock();
        if let Some(debt) = ledger.get_mut(key) {
            let sent = sent.min(debt.crediting);
            debt.crediting -= sent;
            debt.credit = debt.credit.saturating_add(sent);
        }
    }

    /// A refund of `sent` credited units of `key` may or may not have run (its connection
    /// broke after it was sent): taken as run, so that the store is never given back a
    /// unit twice; its count may be over by them, which can only deny more.
    pub(crate) fn credit_in_doubt(&self, key: &str, sent: u64) {
        let mut ledger = self.lock();
        if let Some(debt) = ledger.get_mut(key) {
            let sent = sent.min(debt.crediting);
            debt.crediting -= sent;
            self.credit_units.fetch_sub(sent, Ordering::Relaxed);
            self.forgiven.fetch_add(sent, Ordering::Relaxed);
            self.drop_if_settled(&mut ledger, key);
        }
    }

    /// Up to `max` debts that no request has carried, and credits, taken for the settler
    /// to send; those whose windows have passed are forgiven on the way.
    pub(crate) fn due(&self, now: Timestamp, max: usize) -> Vec<Due> {
        let mut ledger = self.lock();
        let mut due = Vec::new();
        let mut settled = Vec::new();
        for (key, debt) in ledger.iter_mut() {
            if debt.owed == 0 && debt.credit == 0 {
                continue;
            }
            self.expire(debt, now);
            if debt.is_settled() {
                settled.push(key.clone());
                continue;
            }
            if debt.owed > 0 && due.len() < max {
                due.push(Due {
                    key: key.clone(),
                    limits: debt.limits.clone(),
                    hits: Hits::Charge(debt.owed),
                });
                debt.sending = debt.sending.saturating_add(debt.owed);
                debt.owed = 0;
            }
            if debt.credit > 0 && due.len() < max {
                due.push(Due {
                    key: key.clone(),
                    limits: debt.limits.clone(),
                    hits: Hits::Refund(debt.credit),
                });
                debt.crediting = debt.crediting.saturating_add(debt.credit);
                debt.credit = 0;
            }
        }
        for key in settled {
            ledger.remove(&key);
        }
        self.counters.store(ledger.len(), Ordering::Relaxed);
        due
    }

    pub(crate) fn stats(&self) -> DebtStats {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        DebtStats {
            counters: self.counters.load(Ordering::Relaxed),
            units: load(&self.units),
            charged: load(&self.charged),
            forgiven: load(&self.forgiven),
            credit_units: load(&self.credit_units),
            credited: load(&self.credited),
        }
    }

    fn forget(&self, units: u64) {
        self.units.fetch_sub(units, Ordering::Relaxed);
        self.forgiven.fetch_add(units, Ordering::Relaxed);
    }

    fn drop_if_settled(&self, ledger: &mut HashMap<Box<str>, Debt>, key: &str) {
        if ledger.get(key).is_some_and(Debt::is_settled) {
            ledger.remove(key);
            self.counters.store(ledger.len(), Ordering::Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Debt>> {
        // Every update leaves the map whole, so a lock poisoned elsewhere is still usable.
        lock(&self.ledger)
    }
}

impl Debt {
    fn is_settled(&self) -> bool {
        self.unsettled() == 0 && self.credit == 0 && self.crediting == 0
    }

    fn unsettled(&self) -> u64 {
        self.owed
            .saturating_add(self.sending)
            .saturating_add(self.awaited)
    }
}

/// Until when `units` counted at `now` would affect a decision under `limits`.
fn counts_until(limits: &[Limit], units: u64, now: Timestamp) -> Timestamp {
    limits
        .iter()
        .map(|limit| {
            let mut state = LimitState::new(limit);
            state.record(limit, now, units);
            state.expires_at(limit)
        })
        .max()
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{FIXED, SECOND, SLIDING, at, limit};

    const T0: u64 = 1_000 * 60 * SECOND;

    #[test]
    fn a_debt_is_carried_once_and_settles_when_it_lands() {
        let debts = Debts::default();
        let limits = [limit(SLIDING, 10, 60 * SECOND)];
        assert!(debts.is_empty());
        debts.incur("k", &limits, 3, at(T0));
        debts.incur("k", &limits, 2, at(T0));
        assert!(!debts.is_empty());
        assert_eq!(debts.take("k", at(T0)), 5);
        assert_eq!(debts.take("k", at(T0)), 0, "already on its way");
        debts.incur("k", &limits, 1, at(T0));
        debts.landed("k", 5);
        assert_eq!(debts.unsettled("k"), 1, "one unit still owed");
        assert_eq!(debts.stats().charged, 5);
        assert_eq!(debts.take("k", at(T0)), 1);
        debts.landed("k", 1);
        assert!(debts.is_empty());
        assert_eq!(debts.stats().units, 0);
    }

    #[test]
    fn a_call_that_did_not_land_owes_again() {
        let debts = Debts::default();
        let limits = [limit(SLIDING, 10, 60 * SECOND)];
        debts.incur("k", &limits, 4, at(T0));
        assert_eq!(debts.take("k", at(T0)), 4);
        assert_eq!(debts.unsettled("k"), 4);
        debts.restore("k", 4);
        let due = debts.due(at(T0), 10);
        assert_eq!(due.len(), 1);
        assert!(matches!(due[0].hits, Hits::Charge(4)));
        assert!(debts.due(at(T0), 10).is_empty(), "taken by the settler");
    }

    #[test]
    fn a_debt_whose_window_passed_is_forgiven_not_charged_later() {
        let debts = Debts::default();
        let limits = [limit(FIXED, 10, 60 * SECOND)];
        debts.incur("k", &limits, 4, at(T0));
        // The next fixed window: those units no longer count anywhere.
        assert_eq!(debts.take("k", at(T0 + 60 * SECOND)), 0);
        assert!(debts.is_empty());
        assert_eq!(debts.stats().forgiven, 4);
        debts.incur("k", &limits, 2, at(T0));
        debts.incur("k", &limits, 1, at(T0 + 60 * SECOND));
        assert_eq!(
            debts.take("k", at(T0 + 60 * SECOND)),
            1,
            "only the current window's unit is owed"
        );
    }

    #[test]
    fn refunds_cancel_owed_units_and_the_ledger_is_bounded() {
        let debts = Debts::default();
        let limits = [limit(SLIDING, 10, 60 * SECOND)];
        debts.incur("k", &limits, 3, at(T0));
        debts.refund("k", &limits, 5, at(T0));
        assert_eq!(debts.unsettled("k"), 0, "the three owed are cancelled");
        assert_eq!(debts.stats().credit_units, 2, "two more are credited");
        let due = debts.due(at(T0), 10);
        assert!(matches!(
            due[..],
            [Due {
                hits: Hits::Refund(2),
                ..
            }]
        ));
        debts.credited("k", 2);
        assert!(debts.is_empty());
        debts.expect("k", &limits, 2);
        assert_eq!(
            debts.unsettled("k"),
            2,
            "awaited units are not in the store"
        );
        debts.heard("k", &limits, 2, 1, at(T0));
        assert_eq!(debts.take("k", at(T0)), 1, "the store counted one of two");
        debts.landed("k", 1);
        assert!(debts.is_empty());
        for i in 0..MAX_DEBTS {
            debts.incur(&i.to_string(), &limits, 1, at(T0));
        }
        debts.incur("one too many", &limits, 7, at(T0));
        let stats = debts.stats();
        assert_eq!(stats.counters, MAX_DEBTS);
        assert_eq!(stats.forgiven, 7);
        // Units awaited when there is no room are not forgiven yet: the call may still
        // count them. Only what it is heard not to have counted is.
        debts.expect("awaited", &limits, 5);
        assert_eq!(debts.stats().forgiven, 7);
        debts.heard("awaited", &limits, 5, 2, at(T0));
        assert_eq!(debts.stats().forgiven, 9, "the two the call did not count");
    }
}
