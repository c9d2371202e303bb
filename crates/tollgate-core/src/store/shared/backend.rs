//! What the shared store needs of a store it sits in front of (Redis, PostgreSQL): one
//! call sent, a reset, an announcement, a subscription to the others' announcements, the
//! runtime overrides kept there, and the connection's health. A backend never sees the local view, the ledger or leases.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::announce::Subscribe;
use super::link::Health;
use super::protocol::{Ask, PROBE_CALL, PROBE_KEY, RawReply};
use super::ran::Ran;
use super::slot_call::SlotCall;
use crate::clock::Timestamp;
use crate::limit::Limit;

/// What one check-and-count asks of the store: the one argument of every backend's call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallArgs<'a> {
    /// The counter.
    pub(crate) key: &'a str,
    pub(crate) limits: &'a [Limit],
    /// Units owed, charged before the ask (counted even past the limit).
    pub(crate) debt: u64,
    pub(crate) ask: Ask,
    /// Store time after which the store ignores the call (its request has been answered
    /// without it); none before the store's clock is known.
    pub(crate) deadline: Option<Timestamp>,
    /// The store time expected when it runs, which places calendar windows' boundaries.
    pub(crate) around: Timestamp,
}

/// The health probe's call on its own counter, under `limits` (`probe_limits`).
pub(crate) fn probe_call(limits: &[Limit]) -> CallArgs<'_> {
    CallArgs {
        key: PROBE_KEY,
        limits,
        debt: PROBE_CALL.debt,
        ask: Ask::Hits(PROBE_CALL.hits),
        deadline: None,
        around: Timestamp::default(),
    }
}

/// Why one round trip failed, as the store saw it.
#[derive(Debug, Clone)]
pub(crate) enum TripError {
    /// Nothing was sent: the store is believed down.
    NotConnected,
    /// The store's own time limit cut the call (PostgreSQL's statement timeout): it
    /// changed nothing.
    #[cfg(feature = "postgres")]
    Timeout,
    /// The connection failed, or the store can no longer write (a former primary): the
    /// backend has reported the link down.
    Lost(Arc<dyn std::error::Error + Send + Sync>),
    /// The store answered with an error.
    Failed(Arc<dyn std::error::Error + Send + Sync>),
}

impl TripError {
    /// What a finished trip's error says of whether it ran.
    pub(crate) fn ran(&self) -> Ran {
        match self {
            Self::NotConnected => Ran::Not,
            #[cfg(feature = "postgres")]
            Self::Timeout => Ran::Not,
            Self::Lost(_) | Self::Failed(_) => Ran::InDoubt,
        }
    }
}

/// One round trip, owning all it needs, so that a call the request stopped waiting for
/// can still be heard from.
pub(crate) type Trip = Pin<Box<dyn Future<Output = Result<RawReply, TripError>> + Send>>;

/// A reset or an announcement under way, owning all it needs.
pub(crate) type Sending = Pin<Box<dyn Future<Output = Result<(), TripError>> + Send>>;

/// A call on the stored overrides under way, owning all it needs.
pub(crate) type Pending<T> = Pin<Box<dyn Future<Output = Result<T, TripError>> + Send>>;

/// A change of one stored override, made by the store only if it runs by `deadline`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverrideChange<'a> {
    /// The descriptor's id.
    pub(crate) id: &'a str,
    /// The override's JSON and its expiry (Unix seconds), or none to delete it.
    pub(crate) set: Option<(&'a str, Option<u64>)>,
    /// The most live overrides a new id may make.
    pub(crate) max: u64,
    /// Store time after which the store makes no change.
    pub(crate) deadline: Timestamp,
}

/// What the store did with an [`OverrideChange`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    /// Made; the live override it replaced or deleted, if any (JSON).
    Done(Option<String>),
    /// Refused: a new id would make more than the maximum of live overrides (the count).
    Full(u64),
    /// Refused: the store ran it after its deadline.
    Late,
}

/// A read of the change log of stored overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogRead {
    /// Names the log: another epoch is another log, versions not comparable.
    pub(crate) epoch: String,
    /// The version of the last change.
    pub(crate) version: u64,
    /// The newest version dropped from the log: a reader behind it has missed changes.
    pub(crate) trimmed: u64,
    /// The version the changes read reach.
    pub(crate) upto: u64,
    /// Whether they reach `version`.
    pub(crate) complete: bool,
    /// Each descriptor changed after the version asked, oldest change first, with its
    /// override's JSON as stored now (none: deleted).
    pub(crate) changed: Vec<(String, Option<String>)>,
}

/// A store the shared store talks to. The call behind every request is already boxed
/// (it may outlive its request), so dispatching through the trait costs one indirect call.
pub(crate) trait Backend: Send + Sync {
    /// The supervised connection's health.
    fn health(&self) -> &Health;

    /// The span of one round trip: a child of the request's span when tracing is on;
    /// with it off the callsite is disabled and this costs one check.
    fn span(&self, limits: usize) -> tracing::Span;

    /// One atomic check-and-count of `args`, under way once first polled.
    fn check_and_count(&self, args: &CallArgs<'_>) -> Trip;

    /// One call on an in-flight counter (`slots.rs`), under way once first polled.
    fn slots(&self, call: SlotCall) -> Trip;

    /// Deletes counter `key` in the store and announces it to every instance.
    fn reset(&self, key: &str) -> Sending;

    /// Publishes `announced` on the channel every instance listens to.
    fn announce(&self, announced: String) -> Sending;

    /// How to subscribe to the announcements.
    fn subscription(&self) -> Subscribe;

    /// The change log of the stored overrides after version `since`: at most `most`
    /// changes and about `most_bytes` of JSON. Overrides expired by the store's clock are
    /// purged first (a batch at most), each logged as a change, and announced.
    fn override_log(&self, since: u64, most: usize, most_bytes: usize) -> Pending<LogRead>;

    /// Every stored override, at most `most`: (descriptor id, JSON).
    fn all_overrides(&self, most: usize) -> Pending<Vec<(String, String)>>;

    /// The stored override of descriptor `id` (JSON), once every change that could still
    /// be made before now has been made or refused.
    fn override_of(&self, id: &str) -> Pending<Option<String>>;

    /// Makes `change` in one atomic call, logged and announced as
    /// [`super::announce::OVERRIDES`].
    fn change_override(&self, change: OverrideChange<'_>) -> Pending<Written>;
}
