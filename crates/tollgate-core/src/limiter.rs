//! The decision: a [`Request`] in, a [`Decision`] out, against the current rules and a
//! counter store. Every adapter (gRPC, `/json`, the tower middleware) calls [`Limiter::decide`].

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::future::join_all;

use crate::algo::Hits;
use crate::algo::Verdict;
use crate::clock::Timestamp;
use crate::counter::write_key;
use crate::decision::{Decision, Limited, Outcome};
use crate::limit::Limit;
use crate::request::{Descriptor, InvalidRequest, Request};
use crate::rules::{Defaults, Domain, Policy, Rule, Rules};
use crate::store::{DecidedBy, KeyLayout, Store, StoreError};

mod explain;
mod over_limit_log;
mod reset;
pub use explain::{Explained, Explanation, Matched};
use over_limit_log::OverLimitLog;

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

    /// One descriptor of a request for `domain` matched no rule (`why`): nothing limits
    /// it, which is worth knowing, since a typo in a domain or key has this effect.
    fn unmatched(&self, domain: &str, descriptor: &Descriptor<'_>, why: NoMatch) {
        let _ = (domain, descriptor, why);
    }
}

/// Why a descriptor matched no rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMatch {
    /// The rules have no such domain.
    NoDomain,
    /// The domain has no rule for the descriptor's entries.
    NoRule,
}

/// Records nothing.
impl Recorder for () {
    type Rule = ();

    fn prepare(&self, _: &Rule) {}

    fn record(&self, _: &Rule, _: &(), _: &Descriptor<'_>, _: &Limited) {}
}

/// How the limiter answers beyond what rules say.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Used for limits that requests send instead of the configured ones.
    pub defaults: Defaults,
    /// Never deny: the overall answer is OK while outcomes still tell the truth.
    pub global_shadow_mode: bool,
    /// Every descriptor, matched or not, is a budget (the reference's `QUOTA_MODE`).
    pub quota_mode: bool,
    /// A request over on one descriptor counts nothing on its others (the reference's
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`): what they counted is given back.
    pub all_or_nothing: bool,
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
    over_limit_log: OverLimitLog,
}

impl<R: Recorder> std::fmt::Debug for Limiter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// One descriptor resolved before counting.
enum Resolved<'a> {
    NoLimit,
    Unlimited,
    /// Limits from a rule (or a request override), the counter to count them on, and what
    /// to count: a budget's consumption is a charge.
    Limited {
        limits: Cow<'a, [Limit]>,
        rule: Option<&'a Rule>,
        key: String,
        hits: Hits,
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
            over_limit_log: OverLimitLog::default(),
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
    /// are independent counters), and the request is over the limit if a descriptor is —
    /// or, for budgets (`quota_mode`), if every budget of the request is.
    pub async fn decide(&self, req: &Request<'_>) -> Result<Decision, DecideError> {
        req.validate()?;
        let installed = self.installed.load_full();
        let domain = installed.rules.domain(&req.domain);
        let matched = find_rules(domain, req);
        for (rule, descriptor) in matched.iter().zip(&req.descriptors) {
            if let Some(why) = no_match(domain, *rule, descriptor) {
                self.recorder.unmatched(&req.domain, descriptor, why);
            }
        }
        let mut plans = drop_replaced(matched)
            .into_iter()
            .zip(&req.descriptors)
            .enumerate()
            .map(|(i, (rule, d))| self.plan(&req.domain, (i, d), rule, domain.is_some()))
            .collect::<Result<Vec<_>, _>>()?;
        let reference = self.store.key_layout() == KeyLayout::Reference;
        if reference && self.options.all_or_nothing {
            self.hold_back(&mut plans).await?;
        }

        let verdicts = join_all(plans.iter().map(|plan| async move {
            match plan {
                Resolved::Limited {
                    limits, key, hits, ..
                } => Some(self.store.decide(key, limits, *hits).await),
                Resolved::NoLimit | Resolved::Unlimited => None,
            }
        }))
        .await;

        let mut outcomes = Vec::with_capacity(plans.len());
        let mut sources = Vec::with_capacity(plans.len());
        for (plan, verdict) in plans.iter().zip(verdicts) {
            let verdict = verdict.transpose()?.map(|(verdict, source)| {
                sources.push(Some(source));
                verdict
            });
            if verdict.is_none() {
                sources.push(None);
            }
            outcomes.push(match (plan, verdict) {
                (Resolved::Unlimited, _) => Outcome::Unlimited,
                (
                    Resolved::Limited {
                        limits, rule, hits, ..
                    },
                    Some(verdict),
                ) => outcome(limits, *rule, verdict, hits.counted(), self.is_quota(plan)),
                (Resolved::NoLimit, _) | (Resolved::Limited { .. }, None) => Outcome::NoLimit,
            });
        }
        if self.options.all_or_nothing && !reference && outcomes.iter().any(Outcome::is_over) {
            self.give_back(&plans, &mut outcomes).await;
        }
        for ((plan, outcome), descriptor) in plans.iter().zip(&outcomes).zip(&req.descriptors) {
            if let (
                Resolved::Limited {
                    rule: Some(rule), ..
                },
                Outcome::Limited(limited),
            ) = (plan, outcome)
                && let Some(Some(state)) = installed.prepared.get(rule.id())
            {
                self.recorder.record(rule, state, descriptor, limited);
            }
        }
        let now = self.store.now();
        for (((plan, outcome), descriptor), source) in plans
            .iter()
            .zip(&outcomes)
            .zip(&req.descriptors)
            .zip(&sources)
        {
            self.log(&req.domain, descriptor, plan, outcome, *source, now);
        }
        let quota: Vec<bool> = plans.iter().map(|p| self.is_quota(p)).collect();
        let over_limit = !self.options.global_shadow_mode && over(&outcomes, &quota);
        Ok(Decision {
            over_limit,
            descriptors: outcomes,
        })
    }

    /// Gives back what the admitted descriptors of a request counted, because another of
    /// its descriptors is over (the reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`).
    async fn give_back(&self, plans: &[Resolved<'_>], outcomes: &mut [Outcome]) {
        let refunds = join_all(plans.iter().zip(outcomes.iter()).map(|(plan, outcome)| {
            let undo = match (plan, outcome) {
                (Resolved::Limited { limits, key, .. }, Outcome::Limited(l))
                    if l.admitted && l.hits > 0 =>
                {
                    Some((limits, key, l.hits))
                }
                _ => None,
            };
            async move {
                let (limits, key, n) = undo?;
                self.store.apply(key, limits, Hits::Refund(n)).await.ok()
            }
        }))
        .await;
        for (outcome, refund) in outcomes.iter_mut().zip(refunds) {
            if let (Outcome::Limited(l), Some(verdict)) = (outcome, refund) {
                l.remaining = verdict.decision.remaining;
                l.hits = 0;
            }
        }
    }

    /// The reference's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`, for its key layout: the
    /// counts before the request decide. If any descriptor would go over its limit, only
    /// the descriptors that would are counted; the others are checked instead.
    async fn hold_back(&self, plans: &mut [Resolved<'_>]) -> Result<(), DecideError> {
        let before = join_all(plans.iter().map(|plan| async move {
            match plan {
                Resolved::Limited {
                    limits, key, hits, ..
                } => {
                    let verdict = self.store.apply(key, limits, Hits::Check).await?;
                    let over =
                        !verdict.decision.admitted || hits.counted() > verdict.decision.remaining;
                    Ok::<_, StoreError>(over)
                }
                Resolved::NoLimit | Resolved::Unlimited => Ok(false),
            }
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<bool>, _>>()?;
        if before.contains(&true) {
            for (plan, over) in plans.iter_mut().zip(before) {
                if let (Resolved::Limited { hits, .. }, false) = (plan, over) {
                    *hits = Hits::Check;
                }
            }
        }
        Ok(())
    }

    /// One descriptor's decision at debug level, and at info the counter going over.
    fn log(
        &self,
        domain: &str,
        descriptor: &Descriptor<'_>,
        plan: &Resolved<'_>,
        outcome: &Outcome,
        source: Option<DecidedBy>,
        now: Timestamp,
    ) {
        let entries = Entries(descriptor);
        let (rule, key) = match plan {
            Resolved::Limited { rule, key, .. } => (RuleName(*rule), key.as_str()),
            Resolved::NoLimit | Resolved::Unlimited => (RuleName(None), ""),
        };
        let Outcome::Limited(limited) = outcome else {
            let decision = match outcome {
                Outcome::Unlimited => "OK (unlimited rule)",
                _ => "OK (no rule matched)",
            };
            tracing::debug!(domain, descriptor = %entries, decision, "decision");
            return;
        };
        let limit = limited.limit.requests_per_unit();
        let used = u64::from(limit).saturating_sub(limited.remaining);
        let decided_by = source.map_or("", DecidedBy::as_str);
        let decision = match (limited.admitted, limited.shadow) {
            (true, _) => "OK",
            (false, true) => "OVER_LIMIT (shadow mode: admitted)",
            (false, false) => "OVER_LIMIT",
        };
        tracing::debug!(
            domain,
            descriptor = %entries,
            %rule,
            key,
            count = format_args!("{used}/{limit} per {:?}", limited.limit.window()),
            decision,
            decided_by,
            "decision"
        );
        if limited.admitted {
            return;
        }
        if let Some(unlogged) = self.over_limit_log.went_over(key, now, now + limited.reset) {
            let window = limited.limit.window();
            tracing::info!(
                key,
                unlogged,
                "counter went over its limit ({limit} per {window:?}; {domain} {entries}, rule {rule}); its further denials are logged at debug only"
            );
        }
    }

    /// Whether a descriptor counts as a budget for the request's overall answer.
    fn is_quota(&self, plan: &Resolved<'_>) -> bool {
        self.options.quota_mode
            || matches!(plan, Resolved::Limited { rule: Some(rule), .. } if rule.quota_mode)
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
        (index, descriptor): (usize, &Descriptor<'_>),
        rule: Option<&'a Rule>,
        domain_known: bool,
    ) -> Result<Resolved<'a>, InvalidRequest> {
        let limits: Cow<'a, [Limit]>;
        let shape: Cow<'a, str>;
        if let Some(requested) = descriptor.limit.filter(|_| domain_known) {
            let limit = self
                .options
                .defaults
                .limit(requested.requests_per_unit, requested.unit)
                .map_err(|reason| InvalidRequest::BadOverride {
                    descriptor: index,
                    reason,
                })?;
            let own = [limit];
            shape = Limit::shape_of(&own).into();
            limits = Cow::Owned(own.into());
        } else {
            match rule.map(Rule::policy) {
                None => return Ok(Resolved::NoLimit),
                Some(Policy::Unlimited { .. }) => return Ok(Resolved::Unlimited),
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
        let layout = self.store.key_layout();
        write_key(&mut key, layout, domain, descriptor.pairs(), rule, &shape);
        let charged = self.options.quota_mode || rule.is_some_and(|r| r.charged);
        let hits = match descriptor.hits {
            Hits::Consume(n) if charged => Hits::Charge(n),
            other => other,
        };
        Ok(Resolved::Limited {
            limits,
            rule,
            key,
            hits,
        })
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

/// Why `descriptor` is not limited, if nothing limits it: no `rule` matched and it
/// brings no limit of its own that the (known) domain would count.
fn no_match(
    domain: Option<&Domain>,
    rule: Option<&Rule>,
    descriptor: &Descriptor<'_>,
) -> Option<NoMatch> {
    let overridden = domain.is_some() && descriptor.limit.is_some();
    match (domain, rule) {
        (_, Some(_)) => None,
        _ if overridden => None,
        (None, None) => Some(NoMatch::NoDomain),
        (Some(_), None) => Some(NoMatch::NoRule),
    }
}

/// The outcome of a verdict on `limits` (a rule's, or the request's own) that counted
/// `hits`.
fn outcome(
    limits: &[Limit],
    rule: Option<&Rule>,
    verdict: Verdict,
    hits: u64,
    quota: bool,
) -> Outcome {
    match limits.get(verdict.limit_index) {
        Some(limit) => Outcome::Limited(Limited {
            limit: limit.clone(),
            admitted: verdict.decision.admitted,
            shadow: rule.is_some_and(|r| r.shadow_mode),
            quota,
            remaining: verdict.decision.remaining,
            reset: verdict.decision.reset,
            hits,
            metadata: rule.and_then(|r| r.metadata.clone()),
        }),
        None => Outcome::NoLimit,
    }
}

/// A descriptor's entries as `k=v,k2=v2`.
struct Entries<'a, 'd>(&'a Descriptor<'d>);

impl std::fmt::Display for Entries<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, v)) in self.0.pairs().enumerate() {
            let comma = if i > 0 { "," } else { "" };
            write!(f, "{comma}{k}={v}")?;
        }
        Ok(())
    }
}

/// A rule as logs name it: its domain, its place in the rules and its limits' names; a
/// request's own limit when there is no rule.
struct RuleName<'a>(Option<&'a Rule>);

impl std::fmt::Display for RuleName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(rule) = self.0 else {
            return f.write_str("(the request's own limit)");
        };
        write!(f, "{}/{}", rule.domain(), rule.path().join("/"))?;
        if let Policy::Limited { limits, .. } = rule.policy() {
            for name in limits.iter().filter_map(Limit::name) {
                write!(f, " name={name}")?;
            }
        }
        Ok(())
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

/// The overall answer: over if a descriptor that is not a budget is over, or if the request
/// has budgets and every one of them is over (the reference's quota mode).
fn over(outcomes: &[Outcome], quota: &[bool]) -> bool {
    let (mut budgets, mut budgets_over) = (0, 0);
    for (outcome, &is_quota) in outcomes.iter().zip(quota) {
        match (is_quota, outcome.is_over()) {
            (false, true) => return true,
            (true, over) => {
                budgets += 1;
                budgets_over += usize::from(over);
            }
            (false, false) => {}
        }
    }
    budgets > 0 && budgets_over == budgets
}

/// Drops matched rules whose limit another matched rule `replaces`, as the reference does
/// (which keeps answering an unlimited rule as unlimited, replaced or not).
fn drop_replaced(mut matched: Vec<Option<&Rule>>) -> Vec<Option<&Rule>> {
    let replaced: Vec<&str> = matched
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    if !replaced.is_empty() {
        for slot in &mut matched {
            let dropped = slot.is_some_and(|r| {
                !matches!(r.policy, Policy::Unlimited { .. })
                    && replaced.iter().any(|name| r.is_named(name))
            });
            if dropped {
                *slot = None;
            }
        }
    }
    matched
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod calendar_tests;
