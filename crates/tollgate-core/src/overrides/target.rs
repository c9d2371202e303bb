//! Which rules an override may change. Not an `in_flight` rule: it counts requests
//! running at once, and a rate in its place would hold an unreleased slot for the rate's
//! window instead of `expire_after`. A value a `share_threshold` wildcard matches counts
//! on the counter every value of the pattern shares, so its override keeps that counter:
//! the rule's window and algorithm, with its own limit. Checked when it is set, and at
//! each request, since the rules may change after.

use super::CompiledOverride;
use crate::rules::{Policy, Rule};

/// Whether an override fits the rule its descriptor matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fit {
    /// It applies.
    Yes,
    /// The rule counts requests in flight.
    InFlight,
    /// The rule shares one counter among a wildcard's values, in another shape.
    OtherShape,
}

impl CompiledOverride {
    /// Whether the override may change `rule`.
    pub(super) fn fit(&self, rule: &Rule) -> Fit {
        if rule.in_flight() {
            return Fit::InFlight;
        }
        match (&rule.policy, rule.shared_level()) {
            (Policy::Limited { shape, .. }, Some(_)) if **shape != *self.shape() => Fit::OtherShape,
            _ => Fit::Yes,
        }
    }

    /// Whether the override applies to a request that matched `rule`.
    pub(crate) fn applies_to(&self, rule: &Rule) -> bool {
        self.fit(rule) == Fit::Yes
    }

    /// Why the override cannot change `rule`, for the one who set it; none if it can.
    pub(super) fn refusal(&self, rule: &Rule) -> Option<String> {
        let descriptor = self.descriptor_text();
        match self.fit(rule) {
            Fit::Yes => None,
            Fit::InFlight => Some(format!(
                "{descriptor} matches an in_flight rule, which counts requests running at \
                 once, not a rate: it cannot be overridden"
            )),
            Fit::OtherShape => {
                let (level, pattern) = rule.shared_level().unwrap_or_default();
                let value = self.spec().entries.get(level).map_or("", |e| &e.value);
                let shape = match &rule.policy {
                    Policy::Limited { limits, .. } => limits
                        .iter()
                        .map(|l| format!("{} over {:?}", l.algorithm().kind().as_str(), l.window()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    Policy::Unlimited { .. } => String::new(),
                };
                Some(format!(
                    "{value} counts on the counter every {pattern} value shares \
                     (share_threshold): an override of it keeps the rule's window and \
                     algorithm ({shape}) and may change only requests_per_unit and name"
                ))
            }
        }
    }
}
