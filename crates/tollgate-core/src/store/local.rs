//! The local view of a shared store: what this instance last learned of each counter, so
//! that a request the shared store would deny is denied here, without a round trip.
//!
//! The view of a counter is only ever a snapshot the shared store returned, replayed with
//! this instance's own admitted hits, which the shared store holds too. So it is never
//! above the shared count: a local denial is the decision the shared store would make.
//! A view that counted hits the shared store never saw (decided locally while it was down)
//! is marked not shared and never denies on the store's behalf.
//!
//! Synchronous and free of I/O: the shared store calls it around its round trips.

use std::sync::Arc;
use std::time::Duration;

use super::decreases::Decreases;
use super::memory::Capacity;
use super::peek::CounterView;
use super::shards::{CounterState, ShardStats, ShardValue, Shards};
use super::shared::protocol::{Counted, effect};
use super::store_clock::{LocalTime, StoreClock};
use crate::algo::{Hits, LimitState, Verdict, apply, evaluate};
use crate::clock::{Clock, Timestamp};
use crate::limit::Limit;

/// What the shared store answered: its decision, its clock, and the counter's state as it
/// was before the call.
#[derive(Debug)]
pub(crate) struct Snapshot {
    pub(crate) admitted: bool,
    pub(crate) now: Timestamp,
    pub(crate) states: Vec<LimitState>,
}

/// How a request is decided when the shared store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// As the memory store would, from the local view.
    Local,
    /// Admit.
    Allow,
    /// Deny.
    Deny,
}

/// One counter's view; `refreshing` is set while a background read of it is queued.
#[derive(Debug)]
struct View {
    counter: CounterState,
    shared: bool,
    refreshing: bool,
    /// The counter went down since this view began (a refund, here or announced): the
    /// view may be over the store's count and no longer denies; the store decides.
    decreased: bool,
    /// The store's clock when it returned the state this view was built from (the
    /// epoch: none). The store runs one counter's calls one at a time, so an answer
    /// stamped earlier is older and knows less: adopting it would forget calls the view
    /// already holds.
    stamp: Timestamp,
}

impl ShardValue for View {
    fn state(&self) -> &CounterState {
        &self.counter
    }
}

/// A store answer adopted: the verdict, and whether the local algorithm decided otherwise
/// on the same state (the store's decision wins).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Adopted {
    pub(crate) verdict: Verdict,
    pub(crate) disagreed: bool,
}

/// The views of every counter this instance has seen lately.
pub(crate) struct LocalView {
    views: Arc<Shards<View>>,
    clock: Arc<dyn Clock>,
    /// The shared store's clock, learned from every answer and probe.
    store_clock: Arc<StoreClock>,
    /// Decreases heard from other instances: answers older than one are not adopted.
    decreases: Decreases,
}

impl LocalView {
    /// A view of at most about `capacity`.
    pub(crate) fn new(capacity: Capacity, clock: Arc<dyn Clock>) -> Self {
        Self {
            views: Arc::new(Shards::new(capacity.counters, capacity.bytes)),
            clock,
            store_clock: Arc::default(),
            decreases: Decreases::default(),
        }
    }

    /// Drops expired views every `period` until the view is dropped.
    pub(crate) fn spawn_sweeper(&self, period: Duration) {
        self.views.spawn_sweeper(self.clock.clone(), period);
    }

    /// Local time, unshifted (a lease measures time elapsed since its take on it).
    pub(crate) fn local_now(&self) -> LocalTime {
        LocalTime::read(self.clock.now())
    }

    /// Local time moved onto the shared store's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.store_clock.shift(self.local_now())
    }

    /// Learns the shared store's clock from an answer it gave at `store_now`.
    pub(crate) fn learn_time(&self, store_now: Timestamp) {
        self.store_clock.learn(store_now, self.local_now());
    }

    /// Where a health probe tells the store's clock: the view learns it even from a probe
    /// that reads it before the store that holds the view is fully built.
    pub(crate) fn time_sink(&self) -> Box<dyn Fn(Timestamp) + Send + Sync> {
        let (store_clock, clock) = (self.store_clock.clone(), self.clock.clone());
        Box::new(move |store_now| store_clock.learn(store_now, LocalTime::read(clock.now())))
    }

    /// The instant on the shared store's clock after which a request started at `now`
    /// has been answered without it; none while the store's clock is not known yet.
    pub(crate) fn deadline(&self, now: Timestamp, timeout: Duration) -> Option<Timestamp> {
        self.store_clock.synced().then(|| now + timeout)
    }

    /// The view of counter `key` at `now`, and what `hits` more would get.
    pub(crate) fn peek(
        &self,
        key: &str,
        limits: &[Limit],
        now: Timestamp,
        hits: u64,
    ) -> CounterView {
        let slot = self.views.lock(key);
        let states = slot.get().map(|v| v.counter.states.as_slice());
        CounterView::of(states, limits, now, hits)
    }

    /// A background read of counter `key` ended without an answer to adopt: the view's next
    /// denial may queue another, so that one failed read does not leave the view
    /// unrefreshed until it expires.
    pub(crate) fn refresh_failed(&self, key: &str) {
        if let Some(view) = self.views.lock(key).get_mut() {
            view.refreshing = false;
        }
    }

    /// Drops the view of counter `key`: the next request for it asks the store.
    pub(crate) fn forget(&self, key: &str) {
        self.views.lock(key).remove();
    }

    /// Counter `key` went down in the store at store time `at` (another instance's refund,
    /// say): its view may be over the store's count, so it denies no more while it lives,
    /// and no answer to a call that ran before the decrease is adopted. A counter that goes
    /// down once (a budget settled by refunds) usually does again: every later request for
    /// it is decided by the store, whether or not an announcement arrives in time.
    /// A stamp too far from the store's clock to be one is ignored (`decreases.rs`).
    pub(crate) fn decreased(&self, key: &str, at: Timestamp) {
        if !self.decreases.heard(key, at, self.now()) {
            return;
        }
        if let Some(view) = self.views.lock(key).get_mut() {
            view.decreased = true;
        }
    }

    /// Decreases ignored so far for stamps far from the store's clock.
    pub(crate) fn stamps_ignored(&self) -> u64 {
        self.decreases.ignored()
    }

    /// Drops every view.
    pub(crate) fn forget_all(&self) {
        self.views.clear();
    }

    /// The view's denial at `now`, if it has one. The first denial of a view calls
    /// `queue_refresh` (under the view's lock, so it must not block), which tells whether a
    /// background read of the counter was queued; until that read is adopted, no other is.
    pub(crate) fn deny(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        now: Timestamp,
        queue_refresh: impl FnOnce() -> bool,
    ) -> Option<Verdict> {
        let asked = match hits {
            Hits::Consume(n) => n,
            Hits::Check => 0,
            // A charge must reach the store even when over: it records usage that happened.
            Hits::Charge(_) | Hits::Refund(_) => return None,
        };
        let mut slot = self.views.lock(key);
        let view = slot.get_mut().filter(|v| v.shared && !v.decreased)?;
        let verdict = evaluate(view.counter.states.as_slice(), limits, now, asked);
        if verdict.decision.admitted {
            return None;
        }
        if !view.refreshing {
            view.refreshing = queue_refresh();
        }
        Some(verdict)
    }

    /// Turns the shared store's answer to a call that `counted` into the verdict and the
    /// counter's new view, which also holds the units this instance admitted that the
    /// store has not counted yet (`unsettled`, asked under the view's lock, so that no
    /// fallback decided meanwhile is lost from the view).
    pub(crate) fn adopt(
        &self,
        key: &str,
        limits: &[Limit],
        counted: Counted,
        snapshot: Snapshot,
        unsettled: impl FnOnce() -> u64,
    ) -> Adopted {
        let Counted { debt, hits } = counted;
        let now = snapshot.now;
        self.learn_time(now);

        let mut counter = CounterState::from_states(snapshot.states);
        let mut verdict = effect(counter.states.as_mut_slice(), limits, now, debt, hits);
        let compared = !matches!(hits, Hits::Refund(_));
        let disagreed = compared && verdict.decision.admitted != snapshot.admitted;
        if disagreed {
            // A charge was counted either way; a consumption only where it was admitted.
            if let Hits::Consume(n) = hits {
                for (state, limit) in counter.states.as_mut_slice().iter_mut().zip(limits) {
                    if snapshot.admitted {
                        state.record(limit, now, n);
                    } else {
                        state.refund(limit, now, n);
                    }
                }
            }
            verdict.decision.admitted = snapshot.admitted;
            verdict.decision.remaining = 0;
        }
        let mut slot = self.views.lock(key);
        if slot.get().is_some_and(|view| view.stamp > now) {
            return Adopted { verdict, disagreed };
        }
        if self.decreases.predates(key, now) {
            // The counter went down after this call ran: its count is too high to deny on.
            return Adopted { verdict, disagreed };
        }
        let decreased =
            matches!(hits, Hits::Refund(_)) || slot.get().is_some_and(|view| view.decreased);
        let unsettled = unsettled();
        if unsettled > 0 {
            apply(
                counter.states.as_mut_slice(),
                limits,
                now,
                Hits::Charge(unsettled),
            );
        }
        if counter.touch(limits, &verdict) > now {
            let view = View {
                counter,
                shared: true,
                refreshing: false,
                decreased,
                stamp: now,
            };
            slot.insert(view, now);
        } else {
            // Nothing counted any more (a full refund, say): an old view must not outlive it.
            slot.remove();
        }
        Adopted { verdict, disagreed }
    }

    /// The verdict when the shared store could not answer, decided `how`; `decided` is
    /// told the verdict under the view's lock, so that what it records about the decision
    /// and the view change together.
    pub(crate) fn fall_back(
        &self,
        key: &str,
        limits: &[Limit],
        now: Timestamp,
        (hits, pending): (Hits, u64),
        how: Fallback,
        decided: impl FnOnce(&Verdict),
    ) -> Verdict {
        let mut slot = self.views.lock(key);
        let forced = match how {
            Fallback::Local => None,
            Fallback::Allow => Some(true),
            Fallback::Deny => Some(false),
        };
        let fresh;
        let states = match slot.get() {
            Some(view) => view.counter.states.as_slice(),
            None => {
                fresh = CounterState::new(limits);
                fresh.states.as_slice()
            }
        };
        if let Some(admitted) = forced {
            let mut verdict = evaluate(states, limits, now, 1);
            verdict.decision.admitted = admitted;
            if !admitted {
                verdict.decision.remaining = 0;
            }
            decided(&verdict);
            return verdict;
        }
        // Units other calls are about to count are taken as counted: what fits beside
        // them only.
        if let (Hits::Consume(n), true) = (hits, pending > 0) {
            let beside = evaluate(states, limits, now, n.saturating_add(pending));
            if !beside.decision.admitted {
                decided(&beside);
                return beside;
            }
        }
        // Decide as the memory store would; the view then holds hits the store never saw.
        let mut view = slot.remove().unwrap_or_else(|| View {
            counter: CounterState::new(limits),
            shared: false,
            refreshing: false,
            decreased: false,
            stamp: Timestamp::default(),
        });
        let verdict = apply(view.counter.states.as_mut_slice(), limits, now, hits);
        view.counter.touch(limits, &verdict);
        view.shared = false;
        slot.insert(view, now);
        decided(&verdict);
        verdict
    }

    pub(crate) fn stats(&self) -> ShardStats {
        self.views.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{FIXED, SECOND, SLIDING, at, bucket, limit};
    use crate::clock::{ManualClock, Timestamp};
    use std::time::Duration;

    const T0: u64 = 1_000 * SECOND;

    fn view() -> (LocalView, ManualClock) {
        let clock = ManualClock::new(Timestamp::from_nanos(T0));
        let capacity = Capacity {
            counters: 100,
            bytes: usize::MAX,
        };
        (LocalView::new(capacity, Arc::new(clock.clone())), clock)
    }

    /// The shared store's answer for a counter that already holds `used` units.
    fn snapshot(limits: &[Limit], used: u64, now_ns: u64, admitted: bool) -> Snapshot {
        let mut states: Vec<_> = limits.iter().map(LimitState::new).collect();
        if used > 0 {
            for (state, limit) in states.iter_mut().zip(limits) {
                state.record(limit, at(now_ns), used);
            }
        }
        Snapshot {
            admitted,
            now: at(now_ns),
            states,
        }
    }

    #[test]
    fn an_unknown_counter_is_never_denied_locally() {
        let (v, _) = view();
        let limits = [limit(SLIDING, 0, SECOND)];
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0), || true)
                .is_none()
        );
    }

    #[test]
    fn a_full_counter_is_denied_locally_and_refreshed_once() {
        let (v, _) = view();
        let limits = [limit(FIXED, 3, 60 * SECOND)];
        let Adopted {
            verdict: admitted,
            disagreed,
        } = v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Consume(1)),
            snapshot(&limits, 2, T0, true),
            || 0,
        );
        assert!(admitted.decision.admitted && !disagreed);
        let mut queued = 0;
        for _ in 0..5 {
            let denied = v.deny("k", &limits, Hits::Consume(1), at(T0), || {
                queued += 1;
                true
            });
            assert!(denied.is_some_and(|d| !d.decision.admitted));
        }
        assert_eq!(queued, 1, "one background read until it is adopted");
        // A read that failed lets the next denial queue another.
        v.refresh_failed("k");
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0), || {
                queued += 1;
                true
            })
            .is_some()
        );
        assert_eq!(queued, 2, "a failed read is queued again");
        // A check at the limit is within it: the store answers it. A refund always goes
        // to the store.
        assert!(v.deny("k", &limits, Hits::Check, at(T0), || true).is_none());
        assert!(
            v.deny("k", &limits, Hits::Refund(1), at(T0), || true)
                .is_none()
        );
        // Once the window has passed, the view admits and the request goes to the store.
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0 + 60 * SECOND), || {
                true
            })
            .is_none()
        );
    }

    #[test]
    fn an_older_answer_never_replaces_a_newer_view() {
        let (v, _) = view();
        let limits = [limit(FIXED, 5, 60 * SECOND)];
        // The store ran call B after call A; B's answer arrives first.
        let b = snapshot(&limits, 3, T0 + 2_000, true);
        let a = snapshot(&limits, 2, T0 + 1_000, true);
        v.adopt("k", &limits, Counted::of(Hits::Consume(1)), b, || 0);
        let Adopted { verdict, .. } = v.adopt("k", &limits, Counted::of(Hits::Consume(1)), a, || 0);
        assert_eq!(verdict.decision.remaining, 2, "A's own answer");
        // The view still holds B's four units: one more request fits, two do not.
        assert!(
            v.deny("k", &limits, Hits::Consume(2), at(T0 + 3_000), || true)
                .is_some()
        );
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0 + 3_000), || true)
                .is_none()
        );
    }

    #[test]
    fn a_request_that_fits_is_left_to_the_store() {
        let (v, _) = view();
        let limits = [limit(SLIDING, 10, SECOND)];
        v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Consume(4)),
            snapshot(&limits, 0, T0, true),
            || 0,
        );
        assert!(
            v.deny("k", &limits, Hits::Consume(6), at(T0), || true)
                .is_none()
        );
        assert!(
            v.deny("k", &limits, Hits::Consume(7), at(T0), || true)
                .is_some()
        );
    }

    #[test]
    fn the_store_decides_when_the_algorithms_disagree() {
        let (v, _) = view();
        let limits = [limit(FIXED, 5, 60 * SECOND)];
        // The store denied what the local algorithm would admit: the store wins, nothing
        // is counted, and the disagreement is reported.
        let Adopted { verdict, disagreed } = v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Consume(1)),
            snapshot(&limits, 0, T0, false),
            || 0,
        );
        assert!(!verdict.decision.admitted && disagreed);
        assert!(
            v.deny("k", &limits, Hits::Consume(5), at(T0), || true)
                .is_none()
        );
    }

    #[test]
    fn a_view_emptied_by_a_refund_stops_denying() {
        let (v, _) = view();
        let limits = [limit(bucket(5), 5, 60 * SECOND)];
        v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Consume(5)),
            snapshot(&limits, 0, T0, true),
            || 0,
        );
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0), || true)
                .is_some()
        );
        // The store gives all five back and its key is gone: the view must follow.
        let Adopted {
            verdict: refunded, ..
        } = v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Refund(5)),
            snapshot(&limits, 5, T0, true),
            || 0,
        );
        assert_eq!(refunded.decision.remaining, 5);
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0), || true)
                .is_none()
        );
        assert_eq!(v.stats().entries, 0);
    }

    #[test]
    fn the_probes_time_sink_teaches_the_view_the_store_clock() {
        let (v, _) = view();
        assert_eq!(v.deadline(at(T0), Duration::from_millis(10)), None);
        // The link's probe may report before anything else holds the view.
        let sink = v.time_sink();
        sink(at(T0 + 5 * SECOND));
        assert_eq!(v.now(), at(T0 + 5 * SECOND));
        assert_eq!(
            v.deadline(v.now(), Duration::from_millis(10)),
            Some(at(T0 + 5 * SECOND + 10_000_000))
        );
    }

    #[test]
    fn a_decrease_heard_stops_denials_and_older_answers() {
        let (v, _) = view();
        let limits = [limit(FIXED, 10, 3_600 * SECOND)];
        let full = |v: &LocalView, stamp| {
            v.adopt(
                "k",
                &limits,
                Counted::of(Hits::Consume(1)),
                snapshot(&limits, 9, stamp, true),
                || 0,
            )
        };
        let denies = |v: &LocalView| {
            v.deny("k", &limits, Hits::Consume(1), at(T0 + 10_000), || true)
                .is_some()
        };
        full(&v, T0);
        assert!(denies(&v), "a full counter is denied locally");
        // Another instance refunded at T0 + 2 µs; an answer to a call that ran at T0 + 1 µs
        // arrives after the announcement.
        v.decreased("k", at(T0 + 2_000));
        assert!(!denies(&v), "the store decides a counter that went down");
        full(&v, T0 + 1_000);
        assert!(
            !denies(&v),
            "an answer older than the decrease is not adopted"
        );
        // Later answers are adopted, and the counter still goes to the store.
        full(&v, T0 + 3_000);
        assert!(
            !denies(&v),
            "a counter that went down is decided by the store"
        );
        assert_eq!(v.stats().entries, 1);
        // Unknown counters learn it from the announcement's time alone.
        v.decreased("j", at(T0 + 2_000));
        v.adopt(
            "j",
            &limits,
            Counted::of(Hits::Consume(1)),
            snapshot(&limits, 9, T0 + 1_000, true),
            || 0,
        );
        assert_eq!(
            v.stats().entries,
            1,
            "no view made from an answer older than it"
        );
    }

    #[test]
    fn decisions_follow_the_store_clock_not_the_local_one() {
        let (v, clock) = view();
        let limits = [limit(FIXED, 1, 10 * SECOND)];
        // The store's clock is 25 s ahead of this host's, in the window [1020 s, 1030 s).
        let store_now = T0 + 25 * SECOND;
        v.adopt(
            "k",
            &limits,
            Counted::of(Hits::Consume(1)),
            snapshot(&limits, 0, store_now, true),
            || 0,
        );
        assert_eq!(v.now().as_nanos(), store_now);
        // Local time has not reached that window yet; on the store's clock it is full.
        assert!(
            v.deny("k", &limits, Hits::Consume(1), v.now(), || true)
                .is_some()
        );
        clock.advance(Duration::from_nanos(5 * SECOND));
        assert_eq!(v.now().as_nanos(), store_now + 5 * SECOND);
        assert!(
            v.deny("k", &limits, Hits::Consume(1), v.now(), || true)
                .is_none()
        );
    }

    #[test]
    fn a_counter_adopted_again_is_replaced_without_evicting_or_miscounting_bytes() {
        // Room for two counters, in one shard; several limits keep their states on the heap.
        let capacity = Capacity {
            counters: 2,
            bytes: usize::MAX,
        };
        let v = LocalView::new(
            capacity,
            Arc::new(ManualClock::new(Timestamp::from_nanos(T0))),
        );
        let two = [limit(SLIDING, 10, SECOND), limit(FIXED, 10, 60 * SECOND)];
        let three = [
            two[0].clone(),
            two[1].clone(),
            limit(FIXED, 20, 60 * SECOND),
        ];
        let adopt = |key, limits: &[Limit], used| {
            v.adopt(
                key,
                limits,
                Counted::of(Hits::Consume(1)),
                snapshot(limits, used, T0, true),
                || 0,
            );
        };
        adopt("a", &two, 0);
        adopt("b", &two, 0);
        let full = v.stats();
        for used in 1..5 {
            adopt("a", &two, used);
        }
        let again = v.stats();
        assert_eq!(
            (again.entries, again.bytes, again.evictions),
            (2, full.bytes, 0)
        );
        // A counter that grows (a limit added by a reload) is counted with its new bytes,
        // and shrinking back gives them up.
        adopt("a", &three, 5);
        let grown = v.stats();
        assert_eq!((grown.entries, grown.evictions), (2, 0));
        assert!(grown.bytes > full.bytes, "{grown:?} against {full:?}");
        adopt("a", &two, 6);
        assert_eq!(v.stats().bytes, full.bytes);
    }

    #[test]
    fn fallbacks_decide_without_the_store_and_never_deny_for_it_afterwards() {
        let (v, _) = view();
        let limits = [limit(FIXED, 2, 60 * SECOND)];
        for how in [Fallback::Allow, Fallback::Deny] {
            let verdict = v.fall_back("k", &limits, at(T0), (Hits::Consume(1), 0), how, |_| {});
            assert_eq!(verdict.decision.admitted, how == Fallback::Allow);
        }
        assert_eq!(v.stats().entries, 0, "forced answers remember nothing");
        let admitted: Vec<bool> = (0..3)
            .map(|_| {
                v.fall_back(
                    "k",
                    &limits,
                    at(T0),
                    (Hits::Consume(1), 0),
                    Fallback::Local,
                    |_| {},
                )
                .decision
                .admitted
            })
            .collect();
        assert_eq!(admitted, [true, true, false]);
        // Those hits are not in the store: the view may not deny on its behalf.
        assert!(
            v.deny("k", &limits, Hits::Consume(1), at(T0), || true)
                .is_none()
        );
    }

    #[test]
    fn a_local_fallback_leaves_room_for_calls_still_out() {
        let (v, _) = view();
        let limits = [limit(FIXED, 3, 60 * SECOND)];
        let local = |pending| {
            v.fall_back(
                "k",
                &limits,
                at(T0),
                (Hits::Consume(1), pending),
                Fallback::Local,
                |_| {},
            )
            .decision
            .admitted
        };
        // Two units of other calls are on their way: one more fits, a second does not.
        assert!(local(2));
        assert!(!local(2), "the last unit is the calls' to take");
        // Nothing pending: the view alone decides, up to the limit.
        assert!(local(0));
        assert!(local(0));
        assert!(!local(0));
    }
}
