//! The store's words every part of it speaks (how counters are named, who decided, what
//! failed, what to do then, the figures it reports), in a leaf file: the stores and the
//! dispatch in `mod.rs` import them, and they import none of those.

use std::sync::Arc;

use crate::limit::UnknownName;
use crate::stats::HistogramSnapshot;

/// How a store names counters: what the limiter writes as a counter's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyLayout {
    /// Tollgate's injective key of domain, entries and the limits' shape.
    Tollgate,
    /// The reference service's `domain_key_value_…_`, which its store completes with the
    /// window.
    Reference,
}

/// Where a store's verdict came from, for logs that explain a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The memory store's counter.
    Memory,
    /// A shared store's local view, without a round trip.
    LocalView,
    /// A shared store's round trip.
    Store,
    /// The local view per `--on-store-error`, the shared store not answering in time.
    Fallback,
    /// A block this instance leased from the shared store (counted there already).
    Lease,
}

impl DecidedBy {
    /// How logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::LocalView => "local view",
            Self::Store => "store",
            Self::Fallback => "fallback",
            Self::Lease => "lease",
        }
    }
}

/// Why a store could not decide.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within the store timeout.
    #[error("counter store timed out")]
    Timeout,
    /// The store is believed down; nothing was sent.
    #[error("counter store is not connected")]
    NotConnected,
    /// The store answered with an error, or the connection failed.
    #[error("counter store failed: {0}")]
    Failed(#[source] Arc<dyn std::error::Error + Send + Sync>),
}

/// What a request gets when the shared store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// Decide from the local view, as the memory store would.
    #[default]
    Local,
    /// Admit.
    Allow,
    /// Deny.
    Deny,
    /// Answer with the error, so the caller (Envoy's `failure_mode_deny`) decides.
    Error,
}

impl OnStoreError {
    /// Every mode.
    pub const ALL: [OnStoreError; 4] = [Self::Local, Self::Allow, Self::Deny, Self::Error];

    /// The setting's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Error => "error",
        }
    }
}

impl std::str::FromStr for OnStoreError {
    type Err = UnknownName;

    fn from_str(text: &str) -> Result<Self, UnknownName> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(text))
            .ok_or_else(|| UnknownName {
                what: "store error mode",
                given: text.to_owned(),
                expected: "local, allow, deny or error",
            })
    }
}

/// A store's figures at one instant, for metrics and health.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStats {
    /// Whether the store answers now (the memory store always does).
    pub up: bool,
    /// Counters held in memory (for a shared store: in the local view).
    pub counters: usize,
    /// Bytes they take.
    pub bytes: usize,
    /// Counters evicted to stay under the cap.
    pub evictions: u64,
    /// Counters dropped after their windows passed.
    pub expired: u64,
    /// The shared store's own figures.
    pub shared: Option<SharedStats>,
}

/// Figures of a shared store (Redis, PostgreSQL).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedStats {
    /// Requests decided by a round trip.
    pub round_trips: u64,
    /// Requests denied from the local view, without a round trip.
    pub local_denials: u64,
    /// Round trips that timed out.
    pub timeouts: u64,
    /// Round trips that failed on the connection.
    pub connection_errors: u64,
    /// Round trips answered with an error or an unreadable reply.
    pub script_errors: u64,
    /// Requests decided per [`OnStoreError`].
    pub fallbacks: u64,
    /// Background reads of locally denied counters.
    pub refreshes: u64,
    /// Times the connection came up.
    pub reconnects: u64,
    /// Round trips where the store's decision and the local algorithm's differed (the
    /// store's wins); zero unless their arithmetic parted ways.
    pub disagreements: u64,
    /// Decreases (refunds, units given back) this instance announced to the others.
    pub decreases_announced: u64,
    /// Announcements (resets, decreases) heard from every instance, this one included.
    pub announcements_heard: u64,
    /// Counters for which units admitted without the store are still owed to it.
    pub debts: usize,
    /// Units admitted without the store and not yet counted there.
    pub debt_units: u64,
    /// Owed units that reached the store.
    pub debt_charged: u64,
    /// Owed or credited units forgiven: their windows passed before the store answered
    /// again, too many counters owed at once, or a refund in doubt taken as made.
    pub debt_forgiven: u64,
    /// Units the store counted that this instance gave back without it (refunds decided
    /// without the store, calls it ran after their requests were refused, slots it took
    /// for requests answered without one), still to be given back to it.
    pub credit_units: u64,
    /// Credited units the store gave back.
    pub credited: u64,
    /// Calls that may or may not have run (their connection broke after they were sent):
    /// each is taken as whichever leaves the store's count higher.
    pub calls_in_doubt: u64,
    /// Blocks of units leased from the store by hot counters.
    pub leases_taken: u64,
    /// Units in those blocks (counted in the store when taken).
    pub lease_units_leased: u64,
    /// Leased units not spent and given back to the store.
    pub lease_units_returned: u64,
    /// Requests admitted from a leased block, without a round trip.
    pub lease_local_admissions: u64,
    /// Round-trip latency.
    pub latency: HistogramSnapshot,
}

/// What a shared store's instance heard from the store and did not believe, by why
/// (docs/SHARED-STORE.md, Announcements).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IgnoredAnnouncements {
    /// Decreases stamped far from the store's clock.
    pub stamps: u64,
    /// Top-keys snapshots larger than any instance sends, dropped whole.
    pub oversized_tops: u64,
    /// Top-keys snapshots of instances past the number kept.
    pub crowded_tops: u64,
    /// Top-keys entries whose counts no instance could reach.
    pub implausible_top_entries: u64,
}
