//! Why a request would get its answer, without counting anything: per descriptor the rule
//! that matched (or why none did), the counter's key, what every holder of the counter
//! says of it, and the decision it would get.

use super::matched::{Count, Match, NoMatch};
use super::{Limiter, Recorder, groups, outcome};
use crate::counter::Counter;
use crate::decision::{Decision, Outcome};
use crate::overrides::Override;
use crate::request::{InvalidRequest, Request};
use crate::rules::Rule;
use crate::store::{CounterView, Peek};

/// What a descriptor matched.
#[derive(Debug, Clone)]
pub enum Matched {
    /// A rule, and the files or xDS resources its domain came from.
    Rule {
        /// The rule.
        rule: Rule,
        /// Where the domain's rules came from.
        origins: Vec<String>,
    },
    /// A rule whose limit a runtime override replaces for exactly this descriptor.
    Overridden {
        /// The rule the descriptor matched.
        rule: Rule,
        /// The override in force.
        by: Override,
        /// Where the override came from.
        source: String,
    },
    /// A rule whose limit another matched rule `replaces`: nothing is counted on it.
    Replaced(Rule),
    /// No rule: the request's own limit (a descriptor limit override) is counted.
    Override,
    /// Nothing: the descriptor is not limited.
    Nothing(NoMatch),
}

/// One descriptor explained.
#[derive(Debug, Clone)]
pub struct Explained {
    /// What it matched.
    pub matched: Matched,
    /// The counter, when something is counted.
    pub counter: Option<Counter>,
    /// What the counter's holders say of it.
    pub peek: Option<Peek>,
}

/// A request explained: each descriptor, and the decision the request would get now.
#[derive(Debug, Clone)]
pub struct Explanation {
    /// The descriptors, in request order.
    pub descriptors: Vec<Explained>,
    /// The decision, as the shared store (or else this process) would make it now.
    pub decision: Decision,
}

impl<R: Recorder> Limiter<R> {
    /// Explains `req` as [`Limiter::decide`] would decide it, changing no counter.
    pub async fn explain(&self, req: &Request<'_>) -> Result<Explanation, InvalidRequest> {
        let installed = self.installed.load_full();
        let overrides = self.overrides.load_full();
        let resolved = self.resolve(&installed.rules, &overrides, req)?;
        let origins = installed.rules.domain(&req.domain).map(|d| d.origins());
        let mut descriptors = Vec::with_capacity(resolved.len());
        let mut outcomes = Vec::with_capacity(resolved.len());
        for r in &resolved {
            let matched = match r.matched {
                Match::Rule(rule) => Matched::Rule {
                    rule: rule.clone(),
                    origins: origins.unwrap_or_default().to_vec(),
                },
                Match::Overridden(rule, by) => Matched::Overridden {
                    rule: rule.clone(),
                    by: by.spec().clone(),
                    source: by.source().to_owned(),
                },
                Match::Replaced(rule) => Matched::Replaced(rule.clone()),
                Match::Override(_) => Matched::Override,
                Match::Nothing(why) => Matched::Nothing(why),
            };
            let Count::Limited {
                rule,
                counter,
                hits,
            } = &r.count
            else {
                outcomes.push(match r.count {
                    Count::Unlimited => Outcome::Unlimited,
                    _ => Outcome::NoLimit,
                });
                descriptors.push(Explained {
                    matched,
                    counter: None,
                    peek: None,
                });
                continue;
            };
            let limits = counter.limits();
            let peek = self.store.peek(counter, hits.counted()).await;
            let would = match (&peek.shared, &peek.local) {
                (Some(Ok(shared)), _) => shared.would,
                (_, Some(local)) => local.would,
                // Reference mode, Redis unreadable: what a fresh counter would get.
                (_, None) => CounterView::of(None, limits, self.store.now(), hits.counted()).would,
            };
            outcomes.push(outcome(limits, *rule, would, 0, r.quota));
            descriptors.push(Explained {
                matched,
                counter: Some(counter.clone()),
                peek: Some(peek),
            });
        }
        let weights = || {
            resolved
                .iter()
                .zip(&outcomes)
                .map(|(r, outcome)| r.weight(outcome.is_over()))
        };
        let over_limit = !self.options.global_shadow_mode && groups::refused(weights());
        let over_groups = groups::over(weights());
        for (r, outcome) in resolved.iter().zip(&mut outcomes) {
            groups::mark(&over_groups, r, outcome);
        }
        Ok(Explanation {
            descriptors,
            decision: Decision {
                over_limit,
                descriptors: outcomes,
            },
        })
    }
}
