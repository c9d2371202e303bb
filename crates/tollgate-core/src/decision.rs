//! The answer to a [`crate::Request`]: one outcome per descriptor, in request order, each
//! carrying the limit it came from. Every protocol builds its reply from this.

use std::sync::Arc;
use std::time::Duration;

use crate::limit::{Algorithm, Limit};
use crate::rules::Metadata;

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request as a whole is denied (after shadow modes).
    pub over_limit: bool,
    /// One outcome per descriptor, in request order.
    pub descriptors: Vec<Outcome>,
}

/// What one descriptor got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No rule matched, or the matched rule was replaced: nothing was counted.
    NoLimit,
    /// The matched rule is unlimited.
    Unlimited,
    /// The descriptor was counted against its limits.
    Limited(Limited),
}

/// A counted descriptor: the tightest of its limits and where the counter stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// The limit reported (of several, the tightest).
    pub limit: Limit,
    /// Whether the counter admitted the hits.
    pub admitted: bool,
    /// The rule is in shadow mode: a denial is reported but never enforced.
    pub shadow: bool,
    /// The descriptor is a budget (quota mode): being over denies the request only when
    /// every budget of it is.
    pub quota: bool,
    /// Units left after this request (for a denial: left now).
    pub remaining: u64,
    /// Admitted: until the counted units are forgotten. Denied: until the same request
    /// would be admitted, if nothing else is counted.
    pub reset: Duration,
    /// Units counted for this descriptor (0 for a check or a refund, or when the request
    /// was over on another descriptor and all-or-nothing counting gave them back).
    pub hits: u64,
    /// The rule's metadata, for answers that carry it.
    pub metadata: Option<Arc<Metadata>>,
    /// The descriptor's quota group is over (another budget of the group is): its
    /// metadata is not answered.
    pub group_over: bool,
    /// For an in-flight rule answered by its store: what the call did to the slots.
    pub in_flight: Option<InFlight>,
}

/// What one call did to the slots of an in-flight counter, as its store answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Slots held after the call.
    pub held: u64,
    /// Slots the call released (a refund).
    pub released: u64,
    /// Slots the call found past their `expire_after` and dropped.
    pub expired: u64,
}

impl Limited {
    /// Whether this descriptor denies the request (a shadow-mode denial does not).
    pub fn is_over(&self) -> bool {
        !self.admitted && !self.shadow
    }

    /// The rule's metadata to answer with, if any: none when this descriptor or its quota
    /// group is over, and on an in-flight rule none unless a slot is held for the request,
    /// so that a release written to need the metadata frees only a slot its acquisition
    /// took. A slot is held when the hit took one that its store confirmed (decided
    /// without the store, it holds none) and was not given back (the request over on
    /// another descriptor).
    pub fn answered_metadata(&self) -> Option<&Arc<Metadata>> {
        let slot_held = self.hits > 0 && self.in_flight.is_some();
        let holds = self.limit.algorithm() != Algorithm::Slots || slot_held;
        self.metadata
            .as_ref()
            .filter(|_| !self.is_over() && !self.group_over && holds)
    }

    /// The wait a client is told, in whole seconds rounded up: a client that waits the
    /// advertised time must then be admitted.
    pub fn reset_seconds(&self) -> u64 {
        let second = u128::from(crate::clock::NANOS_PER_SECOND);
        u64::try_from(self.reset.as_nanos().div_ceil(second)).unwrap_or(u64::MAX)
    }
}

impl Outcome {
    /// The counted outcome, if the descriptor was counted.
    pub fn limited(&self) -> Option<&Limited> {
        match self {
            Self::Limited(l) => Some(l),
            Self::NoLimit | Self::Unlimited => None,
        }
    }

    /// Whether this descriptor denies the request.
    pub fn is_over(&self) -> bool {
        self.limited().is_some_and(Limited::is_over)
    }
}

impl Decision {
    /// The descriptor response headers describe, as the reference picks it: the last one
    /// over its limit (budgets aside), else the first with the fewest units left.
    pub fn tightest(&self) -> Option<(usize, &Limited)> {
        let mut tightest = None;
        let mut fewest = u64::MAX;
        for (i, limited) in self.descriptors.iter().enumerate() {
            let Some(limited) = limited.limited() else {
                continue;
            };
            if limited.is_over() && !limited.quota {
                tightest = Some((i, limited));
                fewest = 0;
            } else if limited.remaining < fewest {
                tightest = Some((i, limited));
                fewest = limited.remaining;
            }
        }
        tightest
    }
}
