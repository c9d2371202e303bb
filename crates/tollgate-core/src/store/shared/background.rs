//! A shared store's work off the request path: reading denied counters again once their
//! sub-window closes, sending debts no request carried, and telling the operator when
//! round trips keep missing the store timeout. Each task holds the store weakly and ends
//! when it is dropped.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::future::join_all;

use super::debts::{Due, SETTLE_TIMEOUT};
use super::protocol::{self, Counted};
use super::slot_call::in_flight;
use super::{Answer, SharedStore, bump};
use crate::algo::Hits;
use crate::clock::{Timestamp, nanos_of};
use crate::limit::{Algorithm, Limit};

/// Refreshes queued at most; past that, denials just skip queueing one.
pub(super) const REFRESH_QUEUE: usize = 4_096;
/// How often the settler looks for debts no request carried.
const SETTLE_PERIOD: Duration = Duration::from_millis(100);
/// Debts the settler sends at once.
const SETTLE_BATCH: usize = 256;
/// How often round trips are compared with the store timeout.
const LATENCY_WATCH: Duration = Duration::from_secs(10);
/// The share of timed-out round trips, in percent, past which the operator is told.
const SLOW_SHARE_PERCENT: u64 = 5;

/// A counter to read again in the background once its current sub-window closes.
pub(super) struct Refresh {
    key: Box<str>,
    limits: Vec<Limit>,
}

/// Starts the store's background tasks.
pub(super) fn spawn(store: &Arc<SharedStore>, refreshes: tokio::sync::mpsc::Receiver<Refresh>) {
    tokio::spawn(refresher(Arc::downgrade(store), refreshes));
    tokio::spawn(settler(Arc::downgrade(store)));
    tokio::spawn(watch_latency(Arc::downgrade(store)));
}

impl SharedStore {
    /// Queues a background read of `key`; whether it was queued (not when the queue is
    /// full).
    pub(super) fn queue_refresh(&self, key: &str, limits: &[Limit]) -> bool {
        let job = Refresh {
            key: key.into(),
            limits: limits.to_vec(),
        };
        self.refresh_tx.try_send(job).is_ok()
    }

    /// Sends the debts no request has carried and the credits; each that does not land
    /// is owed (or credited) again.
    async fn settle(self: &Arc<Self>) {
        let due = self.ledger.due(self.local.now(), SETTLE_BATCH);
        join_all(due.iter().map(|due| self.settle_one(due))).await;
    }

    /// Sends one debt (a check carrying it) or one credit (a refund), adopting the
    /// answer; a credit that landed is announced, as any decrease is.
    async fn settle_one(self: &Arc<Self>, due: &Due) {
        if in_flight(&due.limits).is_some() {
            return self.settle_slots(due).await;
        }
        let now = self.local.now();
        let deadline = self.local.deadline(now, SETTLE_TIMEOUT);
        let call = self.ledger.settle(due, now, deadline);
        let debt = call.args().debt;
        match self.round_trip(call.args(), SETTLE_TIMEOUT).await {
            Answer::Ran(snapshot) => {
                let at = snapshot.now;
                let hits = match due.hits {
                    Hits::Refund(n) => Hits::Refund(n),
                    Hits::Charge(_) | Hits::Consume(_) | Hits::Check => Hits::Check,
                };
                let counted = Counted { debt, hits };
                let lowered = protocol::lowers(&snapshot.states, &due.limits, at, counted);
                call.ran(|| self.adopt(&due.key, &due.limits, counted, snapshot));
                if lowered {
                    self.announce_decrease(&due.key, at, SETTLE_TIMEOUT).await;
                }
            }
            Answer::Failed(_, ran) => call.failed(ran),
            Answer::Pending(trip) => call.outlived(trip, None, now),
        }
    }
}

impl SharedStore {
    /// At shutdown: gives back every block held, then settles what is owed and credited
    /// and hears from the calls still out, at most `limit` in all; whether everything
    /// settled (what did not is lost with the process, and logged).
    pub async fn drain(self: &Arc<Self>, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        self.give_back_leases(limit).await;
        let mut tick = tokio::time::interval(DRAIN_POLL);
        while !self.ledger.is_settled() {
            if tokio::time::Instant::now() >= deadline {
                let stats = self.ledger.stats();
                tracing::warn!(
                    owed = stats.units,
                    credited = stats.credit_units,
                    "the store did not settle within {limit:?} of the drain: these units are not counted there"
                );
                return false;
            }
            if !self.ledger.owes_nothing() && self.is_up() {
                self.settle().await;
            }
            tick.tick().await;
        }
        true
    }
}

/// How often the drain looks whether the ledger has settled.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// Reads denied counters again once their current sub-window has closed, off the request
/// path, so the local view learns other instances' hits before it next has to decide.
async fn refresher(store: Weak<SharedStore>, mut jobs: tokio::sync::mpsc::Receiver<Refresh>) {
    while let Some(job) = jobs.recv().await {
        let Some(strong) = store.upgrade() else {
            return;
        };
        let wait = until_next_boundary(&job.limits, strong.local.now());
        drop(strong);
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(store) = store.upgrade() else { return };
            let timeout = store.behaviour.timeout;
            let call = store
                .ledger
                .read((&job.key, &job.limits), store.local.now(), None);
            match store.round_trip(call.args(), timeout).await {
                Answer::Ran(snapshot) => call.ran(|| {
                    bump(&store.counts.refreshes);
                    store.adopt(&job.key, &job.limits, Counted::READ, snapshot);
                }),
                Answer::Failed(..) | Answer::Pending(_) => store.local.refresh_failed(&job.key),
            }
        });
    }
}

/// Time until the earliest sub-window (or window, or emission interval) boundary.
fn until_next_boundary(limits: &[Limit], now: Timestamp) -> Duration {
    const LEAST: Duration = Duration::from_millis(1);
    limits
        .iter()
        .map(|l| {
            let step = match l.algorithm {
                Algorithm::SlidingWindow { precision } => l.window / precision.max(1),
                // A calendar's windows are of uneven length: ask the window itself.
                Algorithm::FixedWindow => {
                    return l
                        .fixed_window_at(now)
                        .map_or(l.window, |w| w.end.since(now));
                }
                Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                    l.window / l.requests_per_unit.max(1)
                }
                // Never refreshed: the local view holds no slots.
                Algorithm::Slots => l.window,
            }
            .max(LEAST);
            // Steps are epoch-aligned: the next boundary is a whole number of them.
            step - Duration::from_nanos(now.as_nanos() % nanos_of(step))
        })
        .min()
        .unwrap_or(Duration::from_secs(1))
        .max(LEAST)
}

/// Sends debts that no request carried, while the store answers.
async fn settler(store: Weak<SharedStore>) {
    let mut tick = tokio::time::interval(SETTLE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else { return };
        if !store.ledger.owes_nothing() && store.is_up() {
            store.settle().await;
        }
    }
}

/// Tells the operator, at most once a period, when the store is slower than the store
/// timeout: those requests are decided per `--on-store-error` (and what they admit is
/// owed to the store), which an operator should learn from a log line rather than from a
/// counter.
async fn watch_latency(store: Weak<SharedStore>) {
    let mut tick = tokio::time::interval(LATENCY_WATCH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut trips, mut timeouts) = (0, 0);
    loop {
        tick.tick().await;
        let Some(store) = store.upgrade() else { return };
        let timeout = store.behaviour.timeout;
        let health = store.backend.health();
        if let Some(probe) = health.probe_time().filter(|p| *p > timeout) {
            tracing::warn!(
                "{} answers its health probe in {probe:?}, more than --store-timeout \
                 {timeout:?}: most requests will be decided per --on-store-error; raise \
                 the store timeout",
                health.name(),
            );
        }
        let now_trips = store.counts.round_trips.load(Ordering::Relaxed);
        let now_timeouts = store.counts.timeouts.load(Ordering::Relaxed);
        let (new_trips, new_timeouts) = (now_trips - trips, now_timeouts - timeouts);
        (trips, timeouts) = (now_trips, now_timeouts);
        let sent = new_trips + new_timeouts;
        if sent > 0 && new_timeouts * 100 > sent * SLOW_SHARE_PERCENT {
            tracing::warn!(
                "{new_timeouts} of {sent} {} calls in the last {LATENCY_WATCH:?} took longer \
                 than --store-timeout {timeout:?} and were decided per --on-store-error \
                 (what they admitted is charged to the store when it answers); raise the \
                 store timeout",
                health.name(),
            );
        }
    }
}
