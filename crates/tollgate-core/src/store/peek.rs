//! A counter read without counting: what explaining a decision shows of each holder of
//! the counter (the memory store, a shared store's local view, the shared store itself).

use std::time::Duration;

use crate::algo::{LimitState, Verdict, evaluate};
use crate::clock::Timestamp;
use crate::limit::Limit;

/// One limit of a counter as one holder sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitView {
    /// Units counted against the limit now; past the limit where the store counts every
    /// hit (the reference's keys).
    pub count: u64,
    /// Units the limit has left now.
    pub remaining: u64,
    /// When what is counted stops mattering (admitting) or the next unit fits (denying).
    pub reset: Duration,
}

/// A counter as one holder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterView {
    /// Whether the holder has the counter at all; an absent counter is every limit fresh.
    pub held: bool,
    /// Per limit, in the rule's order.
    pub limits: Vec<LimitView>,
    /// What the request's hits would get from this holder.
    pub(crate) would: Verdict,
}

/// A block of a counter's units this instance took from the shared store ahead of use
/// and admits from locally (docs/STORES.md, Leases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView {
    /// Units of the block not admitted yet.
    pub left: u64,
    /// Of them, the units that may be admitted now (a bucket's block only as it refills).
    pub spendable: u64,
    /// Until the block's window ends and it can no longer be spent (None for a bucket's).
    pub ends: Option<Duration>,
}

/// What the holders of one counter say.
#[derive(Debug, Clone)]
pub struct Peek {
    /// The counter in this process: the memory store's, or a shared store's local view
    /// (None in reference mode, which has none).
    pub local: Option<CounterView>,
    /// The key the store holds the counter under, when it is not the counter's own key
    /// (reference mode's: the prefix, and the window's start at the end).
    pub stored_key: Option<String>,
    /// The shared store's own value (None for the memory store), or why it could not be
    /// read.
    pub shared: Option<Result<CounterView, super::StoreError>>,
    /// This instance's lease on the counter, if it holds one.
    pub lease: Option<LeaseView>,
}

impl CounterView {
    /// The view of `states` (None: not held) of `limits` at `now`, for `hits` more.
    pub(crate) fn of(
        states: Option<&[LimitState]>,
        limits: &[Limit],
        now: Timestamp,
        hits: u64,
    ) -> Self {
        let fresh: Vec<LimitState>;
        let held = states.is_some_and(|s| s.len() == limits.len());
        let states = match states.filter(|_| held) {
            Some(states) => states,
            None => {
                fresh = limits.iter().map(LimitState::new).collect();
                &fresh
            }
        };
        let views = states
            .iter()
            .zip(limits)
            .map(|(state, limit)| {
                let held = state.evaluate(limit, now, 0);
                // Full: the wait until one more unit fits, rather than until all is forgotten.
                let next = state.evaluate(limit, now, 1);
                LimitView {
                    count: u64::from(limit.requests_per_unit()).saturating_sub(held.remaining),
                    remaining: held.remaining,
                    reset: if next.admitted {
                        held.reset
                    } else {
                        next.reset
                    },
                }
            })
            .collect();
        Self {
            held,
            limits: views,
            would: evaluate(states, limits, now, hits),
        }
    }
}
