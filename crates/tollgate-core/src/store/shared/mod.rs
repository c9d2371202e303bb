//! What the shared stores (Redis, PostgreSQL) have in common: synchronous writes and
//! asynchronous reads around a local view.
//!
//! A request the local view already knows to be over the limit is denied here; any other
//! request makes one round trip that checks and counts atomically in the store and
//! returns the counter's state, which becomes the local view (see [`super::local`] for why
//! a local denial is always the decision the store would make). Only the round trip
//! itself differs between stores ([`Backend`]).
//!
//! A request the store does not answer in time is decided per `--on-store-error`, and
//! what that admits is owed to the store ([`debts`]): the call keeps running and, once it
//! is heard from ([`late`]), only what the store did not count is charged later.

pub(crate) mod announce;
pub(crate) mod backend;
mod background;
pub(crate) mod batch;
mod debts;
#[cfg(test)]
pub(crate) mod differential;
#[cfg(all(test, feature = "redis", feature = "postgres"))]
mod fleet;
mod in_flight;
mod late;
pub(crate) mod lease;
pub(crate) mod ledger;
pub(crate) mod link;
mod overrides;
mod peer_tops;
pub(crate) mod protocol;
pub(crate) mod ran;
pub(crate) mod slot_call;
pub(crate) mod slots;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument as _;

pub(crate) use self::backend::{Backend, CallArgs, Trip, TripError};
use self::ledger::Ledger;
use self::link::TimeSink;
use self::protocol::{Ask, Counted, RawReply, Reply};
use self::ran::{Ran, counted};
use super::local::{Adopted, Fallback, LocalView, Snapshot};
use super::memory::Capacity;
use super::peek::{CounterView, Peek};
use super::{DecidedBy, IgnoredAnnouncements, OnStoreError, SharedStats, StoreError, StoreStats};
use crate::algo::{Hits, LimitState, Verdict};
use crate::clock::{Clock, Timestamp};
use crate::limit::Limit;
use crate::stats::Histogram;

/// How a round trip ended for the one waiting on it.
enum Answer {
    /// The store ran the call.
    Ran(Snapshot),
    /// It failed or was ignored: nothing was counted, or (`Ran::InDoubt`) it may have been.
    Failed(StoreError, Ran),
    /// No answer within the wait; the call may still run.
    Pending(Trip),
}

/// How a shared store (Redis or PostgreSQL) behaves towards requests.
#[derive(Debug, Clone, Copy)]
pub struct SharedBehaviour {
    /// Longest a request waits for the store.
    pub timeout: Duration,
    /// What a request gets when the store cannot answer in time.
    pub on_error: OnStoreError,
    /// What the local view may hold.
    pub local_capacity: Capacity,
    /// How hot counters lease blocks.
    pub leases: lease::LeasePolicy,
}

/// Counts behind [`SharedStats`].
#[derive(Debug)]
struct Counts {
    latency: Histogram,
    round_trips: AtomicU64,
    local_denials: AtomicU64,
    timeouts: AtomicU64,
    connection_errors: AtomicU64,
    script_errors: AtomicU64,
    fallbacks: AtomicU64,
    refreshes: AtomicU64,
    disagreements: AtomicU64,
    decreases_announced: AtomicU64,
    announcements_heard: AtomicU64,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            // 25 µs to ~0.4 s.
            latency: Histogram::new(0.000_025, 15),
            round_trips: AtomicU64::default(),
            local_denials: AtomicU64::default(),
            timeouts: AtomicU64::default(),
            connection_errors: AtomicU64::default(),
            script_errors: AtomicU64::default(),
            fallbacks: AtomicU64::default(),
            refreshes: AtomicU64::default(),
            disagreements: AtomicU64::default(),
            decreases_announced: AtomicU64::default(),
            announcements_heard: AtomicU64::default(),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A store shared by every instance pointed at it, with a local view in front.
pub struct SharedStore {
    backend: Box<dyn Backend>,
    local: LocalView,
    behaviour: SharedBehaviour,
    refresh_tx: tokio::sync::mpsc::Sender<background::Refresh>,
    counts: Counts,
    /// What this instance owes the store, its units in calls not answered yet, and its
    /// calls heard late.
    ledger: Arc<Ledger>,
    /// Blocks of hot counters held by this instance.
    leases: lease::Leases,
    /// Told when the stored overrides may have changed elsewhere.
    overrides_changed: tokio::sync::Notify,
    /// The heavy keys other instances published.
    peer_tops: peer_tops::PeerTops,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

impl SharedStore {
    /// Starts the store made by `backend` (given where to report the store's clock) on
    /// the current tokio runtime; requests are decided per `on_error` until it answers.
    pub(crate) fn start(
        backend: impl FnOnce(TimeSink) -> Box<dyn Backend>,
        behaviour: SharedBehaviour,
        clock: Arc<dyn Clock>,
        sweep_period: Duration,
    ) -> Arc<Self> {
        let local = LocalView::new(behaviour.local_capacity, clock);
        local.spawn_sweeper(sweep_period);
        let (refresh_tx, refresh_rx) = tokio::sync::mpsc::channel(background::REFRESH_QUEUE);
        // From the first probe on, every request carries a deadline in store time: the
        // probe may read the store's clock before this store is built, so the view's own
        // clock learns it, not the store (a weak reference to it would not hold yet).
        let backend = backend(local.time_sink());
        let store = Arc::new(Self {
            backend,
            local,
            behaviour,
            refresh_tx,
            counts: Counts::default(),
            ledger: Arc::default(),
            leases: lease::Leases::new(behaviour.leases),
            overrides_changed: tokio::sync::Notify::new(),
            peer_tops: peer_tops::PeerTops::default(),
        });
        background::spawn(&store, refresh_rx);
        announce::spawn(
            Arc::downgrade(&store),
            Self::hear,
            store.backend.subscription(),
        );
        lease::take::spawn_sweeper(&store);
        store
    }

    /// What an announcement heard asks of this instance: views (and leases) dropped, or
    /// a counter's view deferring to the store after a decrease.
    fn hear(&self, heard: announce::Heard<'_>) {
        match heard {
            announce::Heard::All => {
                self.local.forget_all();
                self.leases.forget(None);
                self.overrides_changed.notify_one();
            }
            announce::Heard::Overrides => self.overrides_changed.notify_one(),
            announce::Heard::Reset(key) => {
                self.local.forget(key);
                self.leases.forget(Some(key));
            }
            announce::Heard::Decrease { key, at } => self.local.decreased(key, at),
            announce::Heard::Top(text) => return self.peer_tops.heard(text, self.now()),
        }
        bump(&self.counts.announcements_heard);
    }

    /// Publishes this instance's heavy keys to every instance, waiting at most the
    /// request timeout: a snapshot lost is replaced by the next.
    pub(crate) async fn publish_top(&self, snapshot: String) {
        let sent = self.backend.announce(snapshot);
        let timeout = self.behaviour.timeout;
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("top keys were not published: {e:?}"),
            Err(_) => tracing::debug!("top keys were not published within {timeout:?}"),
        }
    }

    /// What this instance heard and did not believe: decreases stamped far from the
    /// store's clock (`decreases.rs`), top-keys snapshots and entries past what an
    /// instance sends (`peer_tops.rs`).
    pub(crate) fn ignored_announcements(&self) -> IgnoredAnnouncements {
        let tops = self.peer_tops.dropped();
        IgnoredAnnouncements {
            stamps: self.local.stamps_ignored(),
            oversized_tops: tops.oversized,
            crowded_tops: tops.crowded,
            implausible_top_entries: tops.implausible,
        }
    }

    /// The heavy keys instances published lately, this one's included.
    pub(crate) fn peer_tops(&self) -> Vec<String> {
        self.peer_tops.fresh(self.now())
    }

    /// Whether the store answers.
    pub fn is_up(&self) -> bool {
        self.backend.health().is_up()
    }

    /// Waits until the store answers, at most `limit`; whether it does. Serving before
    /// the first connection would make a fresh instance decide from an empty local view.
    pub async fn wait_up(&self, limit: Duration) -> bool {
        self.backend.health().wait_up(limit).await
    }

    /// The store's kind and address, as logs name it.
    pub fn name(&self) -> &str {
        self.backend.health().name()
    }

    /// Why the store last failed (a refused connection, a wrong password), if it has.
    pub fn last_error(&self) -> Option<String> {
        self.backend.health().last_error()
    }

    /// What requests get while the store cannot answer.
    pub fn on_error(&self) -> OnStoreError {
        self.behaviour.on_error
    }

    pub(crate) fn stats(&self) -> StoreStats {
        let local = self.local.stats();
        let c = &self.counts;
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let debts = self.ledger.stats();
        StoreStats {
            up: self.is_up(),
            counters: local.entries,
            bytes: local.bytes,
            evictions: local.evictions,
            expired: local.expired,
            shared: Some(SharedStats {
                round_trips: load(&c.round_trips),
                local_denials: load(&c.local_denials),
                timeouts: load(&c.timeouts),
                connection_errors: load(&c.connection_errors),
                script_errors: load(&c.script_errors),
                fallbacks: load(&c.fallbacks),
                refreshes: load(&c.refreshes),
                reconnects: self.backend.health().reconnects(),
                disagreements: load(&c.disagreements),
                decreases_announced: load(&c.decreases_announced),
                announcements_heard: load(&c.announcements_heard),
                debts: debts.counters,
                debt_units: debts.units,
                debt_charged: debts.charged,
                debt_forgiven: debts.forgiven,
                credit_units: debts.credit_units,
                credited: debts.credited,
                calls_in_doubt: self.ledger.in_doubt(),
                leases_taken: load(&self.leases.counts.taken),
                lease_units_leased: load(&self.leases.counts.units_leased),
                lease_units_returned: load(&self.leases.counts.units_returned),
                lease_local_admissions: load(&self.leases.counts.local_admissions),
                latency: c.latency.snapshot(),
            }),
        }
    }

    /// The local view of counter `key` and the store's value, read with a check that
    /// counts nothing and is not adopted into the view.
    pub(crate) async fn peek(&self, key: &str, limits: &[Limit], hits: u64) -> Peek {
        if slot_call::in_flight(limits).is_some() {
            return self.peek_slots(key, limits, hits).await;
        }
        let now = self.local.now();
        let local = self.local.peek(key, limits, now, hits);
        let deadline = self.local.deadline(now, self.behaviour.timeout);
        let call = self.ledger.read((key, limits), now, deadline);
        let shared = match self.round_trip(call.args(), self.behaviour.timeout).await {
            Answer::Ran(snapshot) => {
                // The reply holds no state when the store has no such counter.
                let held =
                    (snapshot.states.iter().zip(limits)).any(|(s, l)| *s != LimitState::new(l));
                let states = held.then_some(snapshot.states.as_slice());
                Ok(CounterView::of(states, limits, snapshot.now, hits))
            }
            Answer::Failed(e, _) => Err(e),
            Answer::Pending(_) => Err(StoreError::Timeout),
        };
        Peek {
            local: Some(local),
            stored_key: None,
            shared: Some(shared),
            lease: self.leases.view(key, self.local.local_now()),
        }
    }

    /// Deletes counter `key` in the store and drops it from this instance's view; the
    /// others drop theirs when they hear the announcement.
    pub(crate) async fn reset(&self, key: &str) -> Result<(), StoreError> {
        let result = tokio::time::timeout(
            self.behaviour.timeout.max(RESET_TIMEOUT),
            self.backend.reset(key),
        )
        .await;
        self.local.forget(key);
        self.leases.forget(Some(key));
        match result {
            Err(_) => Err(StoreError::Timeout),
            Ok(result) => result.map_err(operator_error),
        }
    }

    /// The store's clock now, as this instance reckons it.
    pub(crate) fn now(&self) -> Timestamp {
        self.local.now()
    }

    /// Decides `hits` on counter `key` in four steps: from this instance's lease on it;
    /// from its local view's denial; from the view while calls for it are not heard from;
    /// else by one call to the store.
    pub(crate) async fn apply(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        self.apply_as(key, limits, hits, self.behaviour.on_error)
            .await
    }

    /// Gives back `n` units (or slots) a refused request consumed (all or none). Nobody
    /// retries a give-back, so without the store's answer it is decided as
    /// `--on-store-error=local` decides, whatever that setting: the view gives the units
    /// back at once and the store is credited them once it answers.
    pub(crate) async fn give_back(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        n: u64,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        self.apply_as(key, limits, Hits::Refund(n), OnStoreError::Local)
            .await
    }

    /// [`Self::apply`], without the store's answer decided per `on_error`.
    async fn apply_as(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        on_error: OnStoreError,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        if slot_call::in_flight(limits).is_some() {
            return self.slots(key, limits, hits, on_error).await;
        }
        let began = self.local.local_now();
        if let Hits::Consume(n) = hits
            && let Some(leased) = self.lease(key, limits, n).await
        {
            return leased.map(|verdict| (verdict, DecidedBy::Lease));
        }
        // A failed take, or a wait for one, spent part of the request's timeout.
        let spent = self.local.local_now().since(began);
        let timeout = self.behaviour.timeout.saturating_sub(spent);
        let now = self.local.now();
        let queue = || self.queue_refresh(key, limits);
        if let Some(denied) = self.local.deny(key, limits, hits, now, queue) {
            bump(&self.counts.local_denials);
            return Ok((denied, DecidedBy::LocalView));
        }
        if let Some(verdict) = self.decide_uncertain(key, limits, hits, now, on_error) {
            return verdict.map(|verdict| (verdict, DecidedBy::Fallback));
        }
        self.send(key, limits, hits, now, (timeout, on_error)).await
    }

    /// Units admitted while this counter's calls are still out (a late call, a charge
    /// being sent) are unknown to the store, whose check would admit past them; until
    /// those calls are heard from, the view, which holds them, decides (with `local`) as
    /// for a store that did not answer, leaving room for the calls in flight.
    fn decide_uncertain(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        now: Timestamp,
        on_error: OnStoreError,
    ) -> Option<Result<Verdict, StoreError>> {
        if on_error != OnStoreError::Local || self.ledger.uncertain(key) == 0 {
            return None;
        }
        let pending = self.ledger.in_flight(key);
        let verdict = self.fall_back(
            key,
            limits,
            (hits, pending),
            now,
            (StoreError::Timeout, on_error),
            |v| {
                let decided = counted(hits, v.decision.admitted);
                self.ledger.owe(key, limits, decided, now);
            },
        );
        Some(verdict)
    }

    /// One call for `hits`, carrying what the counter owes, waited for at most
    /// `timeout`: the store's answer, or the verdict per `on_error` without one.
    async fn send(
        self: &Arc<Self>,
        key: &str,
        limits: &[Limit],
        hits: Hits,
        now: Timestamp,
        (timeout, on_error): (Duration, OnStoreError),
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        let deadline = self.local.deadline(now, timeout);
        let call = self
            .ledger
            .open((key, limits), Ask::Hits(hits), now, deadline);
        let span = self.backend.span(limits.len());
        match self.round_trip(call.args(), timeout).instrument(span).await {
            Answer::Ran(snapshot) => {
                bump(&self.counts.round_trips);
                let ran_at = snapshot.now;
                let debt = call.args().debt;
                let counted = Counted { debt, hits };
                let lowered = protocol::lowers(&snapshot.states, limits, ran_at, counted);
                let verdict = call.ran(|| self.adopt(key, limits, counted, snapshot));
                if lowered {
                    // Answered once every instance may know: the next request anywhere
                    // is decided on the count the refund left.
                    self.announce_decrease(key, ran_at, timeout).await;
                }
                Ok((verdict, DecidedBy::Store))
            }
            Answer::Failed(e, ran) => {
                let pending = call.others_in_flight();
                call.failed(ran);
                self.fall_back(
                    key,
                    limits,
                    (hits, pending),
                    now,
                    (e, on_error),
                    |verdict| {
                        let decided = counted(hits, verdict.decision.admitted);
                        self.ledger.owe(key, limits, ran.owed(decided), now);
                    },
                )
                .map(|verdict| (verdict, DecidedBy::Fallback))
            }
            Answer::Pending(trip) => {
                let mut decided = 0;
                let hits_and_pending = (hits, call.others_in_flight());
                let timeout = (StoreError::Timeout, on_error);
                let verdict = self.fall_back(key, limits, hits_and_pending, now, timeout, |v| {
                    decided = counted(hits, v.decision.admitted);
                    self.ledger
                        .expect(key, limits, u64::try_from(decided).unwrap_or(0));
                });
                call.outlived(trip, Some(decided), now);
                verdict.map(|verdict| (verdict, DecidedBy::Fallback))
            }
        }
    }

    /// Tells every instance that counter `key` went down at store time `at`, waiting at
    /// most `timeout`; an announcement lost only leaves views denying until their next
    /// background read.
    async fn announce_decrease(&self, key: &str, at: Timestamp, timeout: Duration) {
        let sent = self.backend.announce(announce::decrease(key, at));
        match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => bump(&self.counts.decreases_announced),
            Ok(Err(e)) => tracing::debug!(key, "a decrease was not announced: {e:?}"),
            Err(_) => tracing::debug!(key, "a decrease was not announced within {timeout:?}"),
        }
    }

    /// The verdict per `on_error` when the store gave none with `error` (`error`'s answer
    /// is the error itself), leaving room for `pending` units of other calls still out;
    /// `decided` records the decision as the view takes it.
    fn fall_back(
        &self,
        key: &str,
        limits: &[Limit],
        (hits, pending): (Hits, u64),
        now: Timestamp,
        (error, on_error): (StoreError, OnStoreError),
        decided: impl FnOnce(&Verdict),
    ) -> Result<Verdict, StoreError> {
        bump(&self.counts.fallbacks);
        let how = match on_error {
            OnStoreError::Error => return Err(error),
            OnStoreError::Local => Fallback::Local,
            OnStoreError::Allow => Fallback::Allow,
            OnStoreError::Deny => Fallback::Deny,
        };
        Ok(self
            .local
            .fall_back(key, limits, now, (hits, pending), how, decided))
    }

    /// The store's answer to `call` as the verdict and the counter's new view, which also
    /// holds what this instance admitted that the store has not counted yet.
    fn adopt(&self, key: &str, limits: &[Limit], counted: Counted, snapshot: Snapshot) -> Verdict {
        let unsettled = || self.ledger.unsettled(key);
        let Adopted { verdict, disagreed } =
            self.local.adopt(key, limits, counted, snapshot, unsettled);
        if disagreed {
            bump(&self.counts.disagreements);
            tracing::debug!(
                key,
                "the store and the local algorithm disagreed; the store decided"
            );
        }
        verdict
    }

    /// One check-and-count, waited for at most `timeout`. The store ignores it if it runs
    /// after its deadline (store time), by when its request will have been answered
    /// without it.
    async fn round_trip(&self, args: &CallArgs<'_>, timeout: Duration) -> Answer {
        match self.call(args, timeout).await {
            Err(trip) => Answer::Pending(trip),
            Ok(raw) => match self.read(raw, args.limits) {
                Ok(snapshot) => Answer::Ran(snapshot),
                Err((e, ran)) => Answer::Failed(e, ran),
            },
        }
    }

    /// One call of any kind (a request's hits, a lease's take), waited for at most
    /// `timeout` and measured as every round trip is; the call itself when it did not
    /// finish in time.
    async fn call(
        &self,
        args: &CallArgs<'_>,
        timeout: Duration,
    ) -> Result<Result<RawReply, TripError>, Trip> {
        let started = Instant::now();
        self.wait(self.backend.check_and_count(args), timeout, started)
            .await
    }

    /// `trip`, started at `started`, waited for at most `timeout` and measured as every
    /// round trip is; the trip itself when it did not finish in time.
    async fn wait(
        &self,
        mut trip: Trip,
        timeout: Duration,
        started: Instant,
    ) -> Result<Result<RawReply, TripError>, Trip> {
        let answer = tokio::time::timeout(timeout, &mut trip).await;
        self.counts.latency.observe(started.elapsed());
        answer.map_err(|_| {
            bump(&self.counts.timeouts);
            self.backend.health().check_now();
            trip
        })
    }

    /// What a finished round trip says, counted by kind when it failed, with whether the
    /// call ran.
    fn read(
        &self,
        raw: Result<RawReply, TripError>,
        limits: &[Limit],
    ) -> Result<Snapshot, (StoreError, Ran)> {
        let raw = self.raw_reply(raw)?;
        match protocol::decode(&raw, limits) {
            Ok(Reply::Ran {
                admitted,
                now,
                states,
            }) => Ok(Snapshot {
                admitted,
                now,
                states,
            }),
            Ok(Reply::Late { now }) => {
                self.local.learn_time(now);
                bump(&self.counts.timeouts);
                Err((StoreError::Timeout, Ran::Not))
            }
            Err(why) => Err((self.unreadable(why), Ran::InDoubt)),
        }
    }

    /// The numbers of a finished round trip, or its failure counted by kind, with whether
    /// the call ran.
    fn raw_reply(&self, raw: Result<RawReply, TripError>) -> Result<RawReply, (StoreError, Ran)> {
        let e = match raw {
            Ok(raw) => return Ok(raw),
            Err(e) => e,
        };
        let ran = e.ran();
        let error = match e {
            #[cfg(feature = "postgres")]
            TripError::Timeout => {
                bump(&self.counts.timeouts);
                self.backend.health().check_now();
                StoreError::Timeout
            }
            TripError::NotConnected => StoreError::NotConnected,
            TripError::Lost(e) => {
                bump(&self.counts.connection_errors);
                StoreError::Failed(e)
            }
            TripError::Failed(e) => {
                bump(&self.counts.script_errors);
                self.backend.health().report_call_failed();
                StoreError::Failed(e)
            }
        };
        Err((error, ran))
    }

    /// A reply that could not be read, counted as a failed call.
    fn unreadable(&self, why: protocol::ReplyError) -> StoreError {
        bump(&self.counts.script_errors);
        self.backend.health().report_call_failed();
        StoreError::Failed(Arc::new(why))
    }
}

/// The least a reset waits for the store: an operator's call, not a request's.
const RESET_TIMEOUT: Duration = Duration::from_secs(5);

/// What an operator's call (a reset, an override's change) is told of a failed trip.
fn operator_error(e: TripError) -> StoreError {
    match e {
        TripError::NotConnected => StoreError::NotConnected,
        #[cfg(feature = "postgres")]
        TripError::Timeout => StoreError::Timeout,
        TripError::Lost(e) | TripError::Failed(e) => StoreError::Failed(e),
    }
}
