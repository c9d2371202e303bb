//! One call on an in-flight counter, as a backend sends it (`slots.lua`, `slots.sql`).

use super::backend::CallArgs;
use super::protocol::{Ask, units};
use crate::algo::Hits;
use crate::clock::Timestamp;
use crate::limit::Limit;

/// One call on an in-flight counter: owned, so that it can outlive its request.
#[derive(Debug, Clone)]
pub(crate) struct SlotCall {
    /// The counter.
    pub(crate) key: String,
    /// `a` acquire, `r` release, `k` check.
    pub(crate) mode: &'static str,
    /// Slots acquired or released.
    pub(crate) n: u64,
    /// Slots held at most.
    pub(crate) max: u64,
    /// How long a slot lives unless released, in microseconds.
    pub(crate) expire_after_us: u64,
    /// Store time in microseconds after which the store changes nothing (0: none).
    pub(crate) deadline_us: u64,
    /// Slots this instance admitted without the store, taken first even past `max`.
    pub(crate) debt: u64,
}

impl SlotCall {
    /// The call of `args` on an in-flight counter under `limit`: its hits, its debt.
    pub(crate) fn of(args: &CallArgs<'_>, limit: &Limit) -> Self {
        let hits = match args.ask {
            Ask::Hits(hits) => hits,
            Ask::Take { .. } | Ask::GiveBack { .. } => Hits::Check,
        };
        let mut call = Self::new(args.key, limit, hits, args.deadline);
        call.debt = units(args.debt);
        call
    }

    pub(crate) fn new(key: &str, limit: &Limit, hits: Hits, deadline: Option<Timestamp>) -> Self {
        let (mode, n) = match hits {
            // A charge is refused on in-flight rules (rules/compile.rs); taken as a hit.
            Hits::Consume(n) | Hits::Charge(n) => ("a", n),
            Hits::Refund(n) => ("r", n),
            Hits::Check => ("k", 0),
        };
        Self {
            key: key.to_owned(),
            mode,
            n: units(n),
            max: u64::from(limit.requests_per_unit),
            expire_after_us: limit.window().as_micros().try_into().unwrap_or(u64::MAX),
            deadline_us: deadline.map_or(0, Timestamp::as_micros),
            debt: 0,
        }
    }
}
