//! A request resolved once, the same way for deciding, explaining and resetting it: per
//! descriptor, the rule it matched (or why none), and what it asks of which counter.

use std::sync::Arc;

use super::counter_key::{rule_counter, write_key};
use super::matched::{Count, Match, NoMatch, Resolved};
use super::{Limiter, Recorder};
use crate::algo::Hits;
use crate::counter::Counter;
use crate::limit::Limit;
use crate::overrides::Overrides;
use crate::request::{Descriptor, InvalidRequest, Request};
use crate::rules::{Domain, Policy, Rule, Rules};

impl<R: Recorder> Limiter<R> {
    /// Resolves every descriptor of `req` under `rules`; refused if the request is
    /// malformed or brings a limit of its own that the defaults do not allow.
    pub(super) fn resolve<'r>(
        &self,
        rules: &'r Rules,
        overrides: &'r Overrides,
        req: &Request<'_>,
    ) -> Result<Vec<Resolved<'r>>, InvalidRequest> {
        let matched = self.matches(rules, overrides, req)?;
        self.resolve_matches(req, matched)
    }

    /// The second half of [`Limiter::resolve`]: the counter of each descriptor of `req`
    /// that `matched` limits.
    pub(super) fn resolve_matches<'r>(
        &self,
        req: &Request<'_>,
        matched: Vec<Match<'r>>,
    ) -> Result<Vec<Resolved<'r>>, InvalidRequest> {
        matched
            .into_iter()
            .zip(&req.descriptors)
            .enumerate()
            .map(|(index, (matched, descriptor))| {
                let count = self.count_of(&req.domain, (index, descriptor), matched)?;
                let quota = self.options.quota_mode
                    || matches!(count, Count::Limited { rule: Some(rule), .. } if rule.quota_mode);
                Ok(Resolved {
                    matched,
                    count,
                    quota,
                })
            })
            .collect()
    }

    /// What one descriptor asks: its matched rule's limits, or the limit the request sent
    /// instead, on the counter they name.
    fn count_of<'r>(
        &self,
        domain: &str,
        (index, descriptor): (usize, &Descriptor<'_>),
        matched: Match<'r>,
    ) -> Result<Count<'r>, InvalidRequest> {
        let layout = self.store.key_layout();
        let (rule, counter) = match matched {
            Match::Nothing(_) | Match::Replaced(_) => return Ok(Count::NoLimit),
            Match::Rule(rule) => match rule_counter(layout, domain, descriptor.pairs(), rule) {
                Some(counter) => (Some(rule), counter),
                None => return Ok(Count::Unlimited),
            },
            Match::Overridden(rule, by) => {
                // Keyed as the rule keys it: a `share_threshold` value counts on the
                // counter its pattern shares (`overrides/target.rs`).
                let mut key = String::new();
                write_key(
                    &mut key,
                    layout,
                    domain,
                    descriptor.pairs(),
                    Some(rule),
                    by.shape(),
                );
                (Some(rule), Counter::new(key, Arc::clone(by.limits())))
            }
            Match::Override(requested) => {
                let limit = self
                    .options
                    .defaults
                    .limit(requested.requests_per_unit, requested.unit)
                    .map_err(|reason| InvalidRequest::BadOverride {
                        descriptor: index,
                        reason,
                    })?;
                let own = [limit];
                let mut key = String::new();
                let shape = Limit::shape_of(&own);
                write_key(&mut key, layout, domain, descriptor.pairs(), None, &shape);
                (None, Counter::new(key, Arc::from(own)))
            }
        };
        // A slot is taken only if it fits, whatever the quota mode.
        let charged = match rule {
            Some(rule) => rule.charged || (self.options.quota_mode && !rule.in_flight()),
            None => self.options.quota_mode,
        };
        let hits = match descriptor.hits {
            Hits::Consume(n) if charged => Hits::Charge(n),
            other => other,
        };
        Ok(Count::Limited {
            rule,
            counter,
            hits,
        })
    }

    /// What each descriptor of `req` matches under `rules` and `overrides`, `replaces`
    /// applied.
    pub(super) fn matches<'r>(
        &self,
        rules: &'r Rules,
        overrides: &'r Overrides,
        req: &Request<'_>,
    ) -> Result<Vec<Match<'r>>, InvalidRequest> {
        req.validate()?;
        let domain = rules.domain(&req.domain);
        let found = find_rules(domain, req);
        let replaced: Vec<&str> = found
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        // Read once, and only when an override could apply: most deployments have none.
        let now = (!overrides.is_empty()).then(|| self.store.now());
        let overridden =
            |d: &Descriptor<'_>| now.and_then(|now| overrides.find(&req.domain, d.pairs(), now));
        let matched = found.into_iter().zip(&req.descriptors).map(|(rule, d)| {
            match (rule, d.limit, domain) {
                (Some(rule), _, _) if is_replaced(rule, &replaced) => Match::Replaced(rule),
                (Some(rule), _, _) => match overridden(d).filter(|by| by.applies_to(rule)) {
                    Some(by) => Match::Overridden(rule, by),
                    None => Match::Rule(rule),
                },
                (None, Some(own), Some(_)) => Match::Override(own),
                (None, _, None) => Match::Nothing(NoMatch::NoDomain),
                (None, None, Some(_)) => Match::Nothing(NoMatch::NoRule),
            }
        });
        Ok(matched.collect())
    }
}

/// The rule each descriptor of `req` matches in `domain`, before `replaces` is applied.
fn find_rules<'r>(domain: Option<&'r Domain>, req: &Request<'_>) -> Vec<Option<&'r Rule>> {
    // A request's own limit stands in for the rule, whole: none of the rule's shadow mode,
    // replaces or quota mode apply to it, as in the reference.
    req.descriptors
        .iter()
        .map(|d| match (domain, d.limit) {
            (Some(_), Some(_)) | (None, _) => None,
            (Some(dom), None) => dom.find(d.pairs()),
        })
        .collect()
}

/// Whether another matched rule `replaces` the limit of `rule`, as the reference drops it
/// (which keeps answering an unlimited rule as unlimited, replaced or not).
fn is_replaced(rule: &Rule, replaced: &[&str]) -> bool {
    !matches!(rule.policy, Policy::Unlimited { .. })
        && replaced.iter().any(|name| rule.is_named(name))
}
