//! Why a request would get its answer, without counting anything: per descriptor the rule
//! that matched (or why none did), the counter's key, what every holder of the counter
//! says of it, and the decision it would get.

use super::{
    Limiter, NoMatch, Recorder, Resolved, drop_replaced, find_rules, no_match, outcome, over,
};
use crate::decision::{Decision, Outcome};
use crate::limit::Limit;
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
    /// The counter's key and limits, when something is counted.
    pub counter: Option<(String, Vec<Limit>)>,
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
        req.validate()?;
        let installed = self.installed.load_full();
        let domain = installed.rules.domain(&req.domain);
        let matched = find_rules(domain, req);
        let kept = drop_replaced(matched.clone());
        let origins = domain.map(|d| d.origins().to_vec()).unwrap_or_default();
        let mut descriptors = Vec::with_capacity(req.descriptors.len());
        let mut outcomes = Vec::with_capacity(req.descriptors.len());
        let mut quota = Vec::with_capacity(req.descriptors.len());
        let pairs = req.descriptors.iter().zip(&matched).zip(kept).enumerate();
        for (i, ((descriptor, found), rule)) in pairs {
            let plan = self.plan(&req.domain, (i, descriptor), rule, domain.is_some())?;
            quota.push(self.is_quota(&plan));
            let what = match (found, rule, no_match(domain, *found, descriptor)) {
                (_, _, Some(why)) => Matched::Nothing(why),
                _ if domain.is_some() && descriptor.limit.is_some() => Matched::Override,
                (Some(found), Some(_), _) => Matched::Rule {
                    rule: (*found).clone(),
                    origins: origins.clone(),
                },
                (Some(found), None, _) => Matched::Replaced((*found).clone()),
                (None, _, None) => Matched::Override,
            };
            let Resolved::Limited {
                limits,
                rule,
                key,
                hits,
            } = plan
            else {
                outcomes.push(match plan {
                    Resolved::Unlimited => Outcome::Unlimited,
                    _ => Outcome::NoLimit,
                });
                descriptors.push(Explained {
                    matched: what,
                    counter: None,
                    peek: None,
                });
                continue;
            };
            let peek = self.store.peek(&key, &limits, hits.counted()).await;
            let would = match (&peek.shared, &peek.local) {
                (Some(Ok(shared)), _) => shared.would,
                (_, Some(local)) => local.would,
                // Reference mode, Redis unreadable: what a fresh counter would get.
                (_, None) => CounterView::of(None, &limits, self.store.now(), hits.counted()).would,
            };
            outcomes.push(outcome(&limits, rule, would, 0, quota[i]));
            descriptors.push(Explained {
                matched: what,
                counter: Some((key, limits.into_owned())),
                peek: Some(peek),
            });
        }
        let over_limit = !self.options.global_shadow_mode && over(&outcomes, &quota);
        Ok(Explanation {
            descriptors,
            decision: Decision {
                over_limit,
                descriptors: outcomes,
            },
        })
    }
}
