//! The decision: a [`Request`] in, a [`Decision`] out, against the current rules and a
//! counter store. Every adapter (gRPC, `/json`, the tower middleware) calls [`Limiter::decide`].

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures_util::future::join_all;

use crate::algo::{Hits, Verdict};
use crate::clock::Timestamp;
use crate::decision::{Decision, Limited, Outcome};
use crate::limit::Limit;
use crate::overrides::{CompiledOverride, Override, OverrideError, Overrides};
use crate::request::{Descriptor, InvalidRequest, Request};
use crate::rules::{Defaults, Policy, Rule, Rules};
use crate::store::{DecidedBy, KeyLayout, Store, StoreError};
use crate::top::{RuleTop, TopBy};

mod all_or_none;
mod counter_key;
mod explain;
mod find;
mod groups;
mod matched;
mod over_limit_log;
mod reset;
mod resolve;
mod top;
pub use explain::{Explained, Explanation, Matched};
pub use find::Found;
pub use matched::NoMatch;
use matched::{Count, Match, Resolved};
use over_limit_log::OverLimitLog;
pub use top::TopQuery;

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

/// Records nothing.
impl Recorder for () {
    type Rule = ();

    fn prepare(&self, _: &Rule) {}

    fn record(&self, _: &Rule, _: &(), _: &Descriptor<'_>, _: &Limited) {}
}

/// How the limiter answers beyond what rules say.
#[derive(Debug, Clone)]
pub struct Options {
    /// Used for limits that requests send instead of the configured ones.
    pub defaults: Defaults,
    /// Never deny: the overall answer is OK while outcomes still tell the truth.
    pub global_shadow_mode: bool,
    /// Every descriptor, matched or not, is a budget (the reference's `QUOTA_MODE`).
    pub quota_mode: bool,
    /// A request is counted on all its descriptors or on none: a refused request leaves no
    /// counter moved but by its charges and refunds (the default). On the reference's
    /// store, its `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` instead: if a descriptor would
    /// go over, only those that would are counted. Off, each descriptor counts on its own.
    pub all_or_nothing: bool,
}

impl Default for Options {
    /// The default limits, every answer enforced, quota mode per rule, all or none.
    fn default() -> Self {
        Self {
            defaults: Defaults::default(),
            global_shadow_mode: false,
            quota_mode: false,
            all_or_nothing: true,
        }
    }
}

/// Rules with the recorder's state for each of them, swapped together.
struct Installed<P> {
    rules: Rules,
    /// By rule id.
    prepared: Box<[Option<P>]>,
    /// The heavy keys of each rule, by rule id.
    top: Box<[Option<Arc<RuleTop>>]>,
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
    overrides: ArcSwap<Overrides>,
    store: Store,
    options: Options,
    recorder: R,
    over_limit_log: OverLimitLog,
    /// This instance among those sharing a store, in the heavy keys it publishes.
    instance: u64,
}

impl<R: Recorder> std::fmt::Debug for Limiter<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// One descriptor through [`Limiter::decide`]: resolved, then answered.
struct Decided<'a, 'r> {
    resolved: &'a Resolved<'r>,
    outcome: Outcome,
    /// Where the store's verdict came from, when it was asked.
    source: Option<DecidedBy>,
}

impl<'r> Decided<'_, 'r> {
    /// How this descriptor weighs in the overall answer.
    fn weight(&self) -> groups::Weight<'r> {
        self.resolved.weight(self.outcome.is_over())
    }
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
        let installed = install(&recorder, rules, None);
        Self {
            installed: ArcSwap::from_pointee(installed),
            overrides: ArcSwap::from_pointee(Overrides::default()),
            store,
            options,
            recorder,
            over_limit_log: OverLimitLog::default(),
            instance: std::hash::BuildHasher::hash_one(
                &std::hash::RandomState::new(),
                std::process::id(),
            ),
        }
    }

    /// The rules now serving.
    pub fn rules(&self) -> RulesRef<R::Rule> {
        RulesRef(self.installed.load_full())
    }

    /// Serves `rules` from the next request on; requests in flight finish on the old ones.
    pub fn install(&self, rules: Rules) {
        let old = self.installed.load();
        let installed = install(&self.recorder, rules, Some(&old));
        self.installed.store(Arc::new(installed));
    }

    /// The runtime overrides now in force.
    pub fn overrides(&self) -> Arc<Overrides> {
        self.overrides.load_full()
    }

    /// Serves `overrides` from the next request on, in place of the ones in force.
    pub fn set_overrides(&self, overrides: Overrides) {
        self.overrides.store(Arc::new(overrides));
    }

    /// Checks `spec` against the rules now serving and compiles it with the limiter's
    /// defaults; `source` says where it came from.
    pub fn compile_override(
        &self,
        spec: Override,
        source: &str,
    ) -> Result<CompiledOverride, OverrideError> {
        let installed = self.installed.load();
        CompiledOverride::compile(spec, &installed.rules, &self.options.defaults, source)
    }

    /// Compiles `spec` as it was stored, with the limiter's defaults (see
    /// [`CompiledOverride::restore`]).
    pub fn restore_override(
        &self,
        spec: Override,
        source: &str,
    ) -> Result<CompiledOverride, OverrideError> {
        CompiledOverride::restore(spec, &self.options.defaults, source)
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
    /// or, for budgets (`quota_mode`), if every quota group of the request is. A refused
    /// request is counted on none of its descriptors (all or none), unless told otherwise.
    pub async fn decide(&self, req: &Request<'_>) -> Result<Decision, DecideError> {
        let installed = self.installed.load_full();
        let overrides = self.overrides.load_full();
        let matched = self.matches(&installed.rules, &overrides, req)?;
        for (matched, descriptor) in matched.iter().zip(&req.descriptors) {
            if let Match::Nothing(why) = matched {
                self.recorder.unmatched(&req.domain, descriptor, *why);
            }
        }
        let mut resolved = self.resolve_matches(req, matched)?;
        let reference = self.store.key_layout() == KeyLayout::Reference;
        if reference && self.options.all_or_nothing {
            self.hold_back(&mut resolved).await?;
        }
        let all_or_none = self.options.all_or_nothing && !reference;

        let (mut decided, settled) = match &self.store {
            Store::Memory(memory) if all_or_none && Self::together(&resolved) => {
                (self.decide_together(memory, &resolved), true)
            }
            _ => (self.ask_store(&resolved, all_or_none).await?, false),
        };
        // Refused as if enforced: a request in shadow mode counts as the enforced one would.
        let refused = groups::refused(decided.iter().map(Decided::weight));
        if refused && all_or_none && !settled {
            self.give_back(&mut decided).await;
        }
        let over_groups = groups::over(decided.iter().map(Decided::weight));
        for d in &mut decided {
            groups::mark(&over_groups, d.resolved, &mut d.outcome);
        }
        self.observe(&installed, req, &decided);
        let over_limit = !self.options.global_shadow_mode && refused;
        // Pushed, not collected: collecting in place would keep the larger allocation and
        // shrink it, a realloc per request.
        let mut descriptors = Vec::with_capacity(decided.len());
        descriptors.extend(decided.into_iter().map(|d| d.outcome));
        Ok(Decision {
            over_limit,
            descriptors,
        })
    }

    /// Counts every resolved descriptor that is limited (concurrently), and answers each.
    /// A request's refunds go first: a settlement in one request (a reservation refunded,
    /// the usage charged) must not find the reservation still counted. If the store fails
    /// for one descriptor, the request gets the error, and with `all_or_none` what the
    /// others consumed is given back.
    async fn ask_store<'a, 'r>(
        &self,
        resolved: &'a [Resolved<'r>],
        all_or_none: bool,
    ) -> Result<Vec<Decided<'a, 'r>>, StoreError> {
        let refund = |r: &Resolved<'_>| {
            matches!(
                r.count,
                Count::Limited {
                    hits: Hits::Refund(_),
                    ..
                }
            )
        };
        let ask = |phase: Option<bool>| {
            join_all(resolved.iter().map(move |r| async move {
                match &r.count {
                    Count::Limited { counter, hits, .. }
                        if phase.is_none_or(|refunds| refund(r) == refunds) =>
                    {
                        Some(self.store.decide(counter, *hits).await)
                    }
                    _ => None,
                }
            }))
        };
        let verdicts = if resolved.iter().any(refund) && !resolved.iter().all(refund) {
            let mut first = ask(Some(true)).await;
            for (verdict, then) in first.iter_mut().zip(ask(Some(false)).await) {
                *verdict = verdict.take().or(then);
            }
            first
        } else {
            ask(None).await
        };
        let mut decided = Vec::with_capacity(resolved.len());
        let mut failed = None;
        for (resolved, verdict) in resolved.iter().zip(verdicts) {
            let verdict = verdict.transpose().unwrap_or_else(|e| {
                failed.get_or_insert(e);
                None
            });
            let (outcome, source) = match (&resolved.count, verdict) {
                (Count::Unlimited, _) => (Outcome::Unlimited, None),
                (
                    Count::Limited {
                        rule,
                        counter,
                        hits,
                    },
                    Some((verdict, source)),
                ) => {
                    let limits = counter.limits();
                    let outcome = outcome(limits, *rule, verdict, hits.counted(), resolved.quota);
                    (outcome, Some(source))
                }
                (Count::NoLimit | Count::Limited { .. }, _) => (Outcome::NoLimit, None),
            };
            decided.push(Decided {
                resolved,
                outcome,
                source,
            });
        }
        match failed {
            None => Ok(decided),
            Some(e) => {
                if all_or_none {
                    self.give_back(&mut decided).await;
                }
                Err(e)
            }
        }
    }

    /// Tells the recorder and the rule's heavy keys of every counted descriptor, and logs
    /// each descriptor's decision.
    fn observe(
        &self,
        installed: &Installed<R::Rule>,
        req: &Request<'_>,
        decided: &[Decided<'_, '_>],
    ) {
        let now = self.store.now();
        for (d, descriptor) in decided.iter().zip(&req.descriptors) {
            let (
                Count::Limited {
                    rule: Some(rule),
                    counter,
                    ..
                },
                Outcome::Limited(limited),
            ) = (&d.resolved.count, &d.outcome)
            else {
                continue;
            };
            if let Some(Some(state)) = installed.prepared.get(rule.id()) {
                self.recorder.record(rule, state, descriptor, limited);
            }
            if let Some(Some(top)) = installed.top.get(rule.id()) {
                let denied = match limited.admitted {
                    true => None,
                    false if limited.shadow || self.options.global_shadow_mode => {
                        Some(TopBy::Shadow)
                    }
                    false => Some(TopBy::Denied),
                };
                top.record(now, counter.key(), denied);
            }
        }
        for (d, descriptor) in decided.iter().zip(&req.descriptors) {
            self.log(&req.domain, descriptor, d, now);
        }
    }

    /// One descriptor's decision at debug level, and at info the counter going over.
    fn log(
        &self,
        domain: &str,
        descriptor: &Descriptor<'_>,
        decided: &Decided<'_, '_>,
        now: Timestamp,
    ) {
        let entries = Entries(descriptor);
        let (rule, key) = match &decided.resolved.count {
            Count::Limited { rule, counter, .. } => (RuleName(*rule), counter.key()),
            Count::NoLimit | Count::Unlimited => (RuleName(None), ""),
        };
        let Outcome::Limited(limited) = &decided.outcome else {
            let outcome = &decided.outcome;
            let decision = match outcome {
                Outcome::Unlimited => "OK (unlimited rule)",
                _ => "OK (no rule matched)",
            };
            tracing::debug!(domain, descriptor = %entries, decision, "decision");
            return;
        };
        let limit = limited.limit.requests_per_unit();
        let used = u64::from(limit).saturating_sub(limited.remaining);
        let decided_by = decided.source.map_or("", DecidedBy::as_str);
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
                "counter went over its limit ({limit} per {window:?}; {} {entries}, rule {rule}); its further denials are logged at debug only",
                Escaped(domain)
            );
        }
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
            group_over: false,
            in_flight: verdict.in_flight,
        }),
        None => Outcome::NoLimit,
    }
}

/// A descriptor's entries as `k=v,k2=v2`, each [`Escaped`].
struct Entries<'a, 'd>(&'a Descriptor<'d>);

impl std::fmt::Display for Entries<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, v)) in self.0.pairs().enumerate() {
            let comma = if i > 0 { "," } else { "" };
            write!(f, "{comma}{}={}", Escaped(k), Escaped(v))?;
        }
        Ok(())
    }
}

/// Text a client chose, as a log line shows it: line ends, control and bidirectional
/// characters and backslashes escaped as Rust escapes them (`\n`, `\u{1b}`, `\u{202e}`),
/// so that a value can neither end the line and forge the next nor paint a terminal.
/// Quotes stay as they are: the text is not quoted.
struct Escaped<'a>(&'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\'' | '"' => f.write_char(c)?,
                c => write!(f, "{}", c.escape_debug())?,
            }
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

/// `rules` with the recorder's state and their heavy keys: a rule that `old` rules had
/// too (same domain, same place) keeps its heavy keys.
fn install<R: Recorder>(
    recorder: &R,
    rules: Rules,
    old: Option<&Installed<R::Rule>>,
) -> Installed<R::Rule> {
    let mut prepared: Vec<Option<R::Rule>> = (0..rules.rule_count()).map(|_| None).collect();
    let mut tops: Vec<Option<Arc<RuleTop>>> = vec![None; rules.rule_count()];
    let kept = old.map(top::by_place).unwrap_or_default();
    for rule in rules.rules() {
        if let Some(slot) = prepared.get_mut(rule.id()) {
            *slot = Some(recorder.prepare(rule));
        }
        if let Some(slot) = tops.get_mut(rule.id()) {
            let place = (rule.domain(), rule.path());
            *slot = Some(kept.get(&place).cloned().unwrap_or_default());
        }
    }
    Installed {
        rules,
        prepared: prepared.into(),
        top: tops.into(),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod all_or_none_tests;

#[cfg(test)]
mod quota_group_tests;

#[cfg(test)]
mod calendar_tests;
#[cfg(test)]
mod slots_tests;
