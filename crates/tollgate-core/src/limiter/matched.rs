//! What a descriptor matched and what it asks of the store (together, the descriptor
//! resolved): the words resolving, explaining, deciding and weighing groups share, in a
//! file of their own so that none of them imports another for them.

use crate::algo::Hits;
use crate::counter::Counter;
use crate::overrides::CompiledOverride;
use crate::request::LimitOverride;
use crate::rules::Rule;

/// Why a descriptor matched no rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMatch {
    /// The rules have no such domain.
    NoDomain,
    /// The domain has no rule for the descriptor's entries.
    NoRule,
}

/// What one descriptor matched.
#[derive(Debug, Clone, Copy)]
pub(super) enum Match<'r> {
    /// A rule: its limits are counted (or it is unlimited).
    Rule(&'r Rule),
    /// A rule whose limit another matched rule `replaces`: nothing is counted.
    Replaced(&'r Rule),
    /// No rule: the request's own limit is counted.
    Override(LimitOverride),
    /// A rule, with a runtime override's limit for exactly this descriptor.
    Overridden(&'r Rule, &'r CompiledOverride),
    /// Nothing: the descriptor is not limited.
    Nothing(NoMatch),
}

/// What one descriptor asks of the store.
#[derive(Debug)]
pub(super) enum Count<'r> {
    /// Nothing: no rule matched, or the rule was replaced.
    NoLimit,
    /// Nothing: the rule is unlimited.
    Unlimited,
    /// `hits` on `counter`, under the limits of `rule` (none: the request's own limit); a
    /// budget's consumption is a charge.
    Limited {
        rule: Option<&'r Rule>,
        counter: Counter,
        hits: Hits,
    },
}

/// One descriptor of a request, resolved.
#[derive(Debug)]
pub(super) struct Resolved<'r> {
    /// What it matched, or why nothing.
    pub(super) matched: Match<'r>,
    /// What it asks of the store.
    pub(super) count: Count<'r>,
    /// Whether it is a budget for the request's overall answer (quota mode).
    pub(super) quota: bool,
}
