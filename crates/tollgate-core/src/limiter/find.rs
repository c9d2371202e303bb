//! The counter API's way in: the counter a rule's limits share for a descriptor, or for a
//! bucket of entries in no order (RLQS). [`Limiter::decide`] names its counters with the
//! same function ([`super::counter_key::rule_counter`]), so both APIs name the same counter.

use super::counter_key::rule_counter;
use super::{Limiter, Recorder};
use crate::counter::Counter;
use crate::request::Descriptor;
use crate::rules::{Rule, Rules};
use crate::store::KeyLayout;

/// What the rules say about one descriptor or bucket: whether a rule applies, and if it
/// limits, the counter its limits are counted on for these entries.
#[derive(Debug, Clone)]
pub enum Found {
    /// No rule of the domain applies (or there is no such domain).
    NoRule,
    /// The rule is unlimited: nothing is counted.
    Unlimited(Rule),
    /// The rule's limits, counted on `counter`.
    Limited {
        /// The rule that applies.
        rule: Rule,
        /// Where its limits are counted for these entries.
        counter: Counter,
    },
}

impl<R: Recorder> Limiter<R> {
    /// The rule and counter of `descriptor` in `domain`, as [`Limiter::decide`] counts it
    /// when the descriptor carries no limit of its own (`replaces` across a request's
    /// descriptors aside: that is a matter of the whole request).
    pub fn find_descriptor(&self, domain: &str, descriptor: &Descriptor<'_>) -> Found {
        let rules = self.rules();
        let rule = rules
            .domain(domain)
            .and_then(|d| d.find(descriptor.pairs()));
        found(self.store().key_layout(), domain, descriptor.pairs(), rule)
    }

    /// The rule and counter of `entries` in `domain`, given in no order (an RLQS bucket
    /// id): they are placed in the order the rules nest, and the counter is the one the
    /// descriptor of those entries in that order has ([`Limiter::find_descriptor`]).
    pub fn find_bucket(&self, domain: &str, entries: &[(&str, &str)]) -> Found {
        let rules: &Rules = &self.rules();
        match rules.domain(domain).and_then(|d| d.find_unordered(entries)) {
            Some((ordered, rule)) => found(
                self.store().key_layout(),
                domain,
                ordered.into_iter(),
                Some(rule),
            ),
            None => Found::NoRule,
        }
    }
}

fn found<'a>(
    layout: KeyLayout,
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    rule: Option<&'a Rule>,
) -> Found {
    let Some(rule) = rule else {
        return Found::NoRule;
    };
    match rule_counter(layout, domain, entries, rule) {
        Some(counter) => Found::Limited {
            rule: rule.clone(),
            counter,
        },
        None => Found::Unlimited(rule.clone()),
    }
}

#[cfg(test)]
mod tests;
