//! The decision: a [`Request`] in, a [`Decision`] out, against the current rules and a
//! counter store. Every adapter (gRPC, `/json`, the tower middleware) calls [`Limiter::decide`].

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::future::join_all;

use crate::algo::Hits;
use crate::decision::{Decision, Limited, Outcome};
use crate::key::write_counter_key;
use crate::limit::Limit;
use crate::request::{Descriptor, InvalidRequest, Request};
use crate::rules::{Defaults, Policy, Rule, Rules};
use crate::store::{Store, StoreError};

/// Why a request got no decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DecideError {
    /// The request is malformed; the text says how.
    #[error(transparent)]
    InvalidArgument(#[from] InvalidRequest),
    /// The counter store failed (and its failures are errors).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Observes decisions, e.g. to count them in metrics. Per-rule state (resolved metric
/// handles) is prepared once when rules are installed, so recording needs no lookup.
pub trait Recorder: Send + Sync + 'static {
    /// What is kept per rule.
    type Rule: Send + Sync + 'static;

    /// Prepares the state of `rule`, when rules are installed.
    fn prepare(&self, rule: &Rule) -> Self::Rule;

    /// One descriptor matched `rule` and was counted.
    fn record(
        &self,
        rule: &Rule,
        state: &Self::Rule,
        descriptor: &Descriptor<'_>,
        outcome: &Limited,
    );
}

/// Records nothing.
impl Recorder for () {
    type Rule = ();

    fn prepare(&self, _: &Rule) {}

    fn record(&self, _: &Rule, _: &(), _: &Descriptor<'_>, _: &Limited) {}
}

/// How the limiter answers beyond what rules say.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Used for limits that requests send instead of the configured ones.
    pub defaults: Defaults,
    /// Never deny: the overall answer is OK while outcomes still tell the truth.
    pub global_shadow_mode: bool,
}

/// Rules with the recorder's state for each of them, swapped together.
struct Installed<P> {
    rules: Rules,
    /// By rule id.
    prepared: Box<[Option<P>]>,
}

/// The rules a [`Limiter`] serves at one instant; they stay valid while held.
pub struct RulesRef<P>(Arc<Installed<P>>);

impl<P> Deref for RulesRef<P> {
    type Target = Rules;

    fn deref(&self) -> &Rules {
        &self.0.rules
    }
}

/// The rate limiter: current rules, a counter store, and an observer of its decisions.
pub struct Limiter<R: Recorder = ()> {
    installed: ArcSwap<Installed<R::Rule>>,
    store: Store,
    options: Options,
    recorder: R,
}

impl<R: Recorder> std::fmt::Debug for Limiter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// One descriptor resolved before counting.
enum Plan<'a> {
    NoLimit,
    Unlimited,
    /// Limits from a rule (or a request override) with the counter to count them on.
    Limited {
        limits: Cow<'a, [Limit]>,
        rule: Option<&'a Rule>,
        key: String,
    },
}

impl Limiter {
    /// A limiter with default options that records nothing.
    pub fn new(rules: Rules, store: Store) -> Self {
        Self::with_recorder(rules, store, Options::default(), ())
    }
}

impl<R: Recorder> Limiter<R> {
    /// A limiter whose decisions `recorder` observes.
    pub fn with_recorder(rules: Rules, store: Store, options: Options, recorder: R) -> Self {
        let installed = install(&recorder, rules);
        Self {
            installed: ArcSwap::from_pointee(installed),
            store,
            options,
            recorder,
        }
    }

    /// The rules now serving.
    pub fn rules(&self) -> RulesRef<R::Rule> {
        RulesRef(self.installed.load_full())
    }

    /// Serves `rules` from the next request on; requests in flight finish on the old ones.
    pub fn install(&self, rules: Rules) {
        self.installed
            .store(Arc::new(install(&self.recorder, rules)));
    }

    /// The counter store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The recorder.
    pub fn recorder(&self) -> &R {
        &self.recorder
    }

    /// Decides one request: every descriptor is matched and counted (concurrently; they
    /// are independent counters), and the request is over the limit if any is.
    pub async fn decide(&self, req: &Request<'_>) -> Result<Decision, DecideError> {
        req.validate()?;
        let installed = self.installed.load_full();
        let domain = installed.rules.domain(&req.domain);
        let matched: Vec<Option<&Rule>> = req
            .descriptors
            .iter()
            .map(|d| domain.and_then(|dom| dom.find(d.pairs())))
            .collect();
        let plans = drop_replaced(matched)
            .into_iter()
            .zip(&req.descriptors)
            .map(|(rule, d)| self.plan(&req.domain, d, rule, domain.is_some()))
            .collect::<Result<Vec<_>, _>>()?;

        let verdicts = join_all(plans.iter().zip(&req.descriptors).map(
            |(plan, descriptor)| async move {
                match plan {
                    Plan::Limited { limits, key, .. } => {
                        Some(self.store.apply(key, limits, descriptor.hits).await)
                    }
                    Plan::NoLimit | Plan::Unlimited => None,
                }
            },
        ))
        .await;

        let mut outcomes = Vec::with_capacity(plans.len());
        for ((plan, verdict), descriptor) in plans.iter().zip(verdicts).zip(&req.descriptors) {
            let outcome = match (plan, verdict) {
                (Plan::Unlimited, _) => Outcome::Unlimited,
                (Plan::Limited { limits, rule, .. }, Some(verdict)) => {
                    let verdict = verdict?;
                    let Some(limit) = limits.get(verdict.limit_index) else {
                        outcomes.push(Outcome::NoLimit);
                        continue;
                    };
                    let limited = Limited {
                        limit: limit.clone(),
                        admitted: verdict.decision.admitted,
                        shadow: rule.is_some_and(|r| r.shadow_mode),
                        remaining: verdict.decision.remaining,
                        reset: std::time::Duration::from_nanos(verdict.decision.reset_ns),
                        hits: match descriptor.hits {
                            Hits::Consume(n) => n,
                            Hits::Check | Hits::Refund(_) => 0,
                        },
                    };
                    let prepared =
                        rule.and_then(|r| Some((r, installed.prepared.get(r.id())?.as_ref()?)));
                    if let Some((rule, state)) = prepared {
                        self.recorder.record(rule, state, descriptor, &limited);
                    }
                    Outcome::Limited(limited)
                }
                (Plan::NoLimit | Plan::Limited { .. }, _) => Outcome::NoLimit,
            };
            outcomes.push(outcome);
        }
        let over_limit = outcomes.iter().any(Outcome::is_over) && !self.options.global_shadow_mode;
        Ok(Decision {
            over_limit,
            descriptors: outcomes,
        })
    }

    /// Counts `hits` against each of `descriptors` of `domain` and answers whether they fit:
    /// the plain API for callers that are not HTTP services.
    pub async fn check<'a>(
        &self,
        domain: &'a str,
        descriptors: impl IntoIterator<Item = Descriptor<'a>>,
        hits: Hits,
    ) -> Result<Decision, DecideError> {
        let descriptors = descriptors.into_iter().map(|d| d.with_hits(hits)).collect();
        self.decide(&Request::new(domain, descriptors)).await
    }

    /// Resolves one descriptor: its matched rule, or the limit the request sent instead.
    fn plan<'a>(
        &self,
        domain: &str,
        descriptor: &Descriptor<'_>,
        rule: Option<&'a Rule>,
        domain_known: bool,
    ) -> Result<Plan<'a>, InvalidRequest> {
        let limits: Cow<'a, [Limit]>;
        let shape: Cow<'a, str>;
        if let Some(requested) = descriptor.limit.filter(|_| domain_known) {
            let limit = self
                .options
                .defaults
                .limit(requested.requests_per_unit, requested.unit)
                .map_err(|e| {
                    InvalidRequest::Malformed(format!("descriptor limit override: {e}"))
                })?;
            let own = [limit];
            shape = Limit::shape_of(&own).into();
            limits = Cow::Owned(own.into());
        } else {
            match rule.map(Rule::policy) {
                None => return Ok(Plan::NoLimit),
                Some(Policy::Unlimited { .. }) => return Ok(Plan::Unlimited),
                Some(Policy::Limited {
                    limits: l,
                    shape: s,
                }) => {
                    limits = Cow::Borrowed(l);
                    shape = Cow::Borrowed(s);
                }
            }
        }
        let mut key = String::new();
        write_counter_key(&mut key, domain, descriptor.pairs(), &shape);
        Ok(Plan::Limited { limits, rule, key })
    }
}

fn install<R: Recorder>(recorder: &R, rules: Rules) -> Installed<R::Rule> {
    let mut prepared: Vec<Option<R::Rule>> = (0..rules.rule_count()).map(|_| None).collect();
    for rule in rules.rules() {
        if let Some(slot) = prepared.get_mut(rule.id()) {
            *slot = Some(recorder.prepare(rule));
        }
    }
    Installed {
        rules,
        prepared: prepared.into(),
    }
}

/// Drops matched rules whose limit another matched rule `replaces`, as the reference does.
fn drop_replaced(mut matched: Vec<Option<&Rule>>) -> Vec<Option<&Rule>> {
    let replaced: Vec<&str> = matched
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    if !replaced.is_empty() {
        for slot in &mut matched {
            if slot.is_some_and(|r| replaced.iter().any(|name| r.is_named(name))) {
                *slot = None;
            }
        }
    }
    matched
}

#[cfg(test)]
mod tests;
