//! Turns one domain's rules into a compiled [`Domain`], collecting every problem on the way.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::Defaults;
use super::config_error::ConfigError;
use super::duration::parse_expire_after;
use super::pattern::Pattern;
use super::spec::{DescriptorSpec, DomainSpec, InFlightSpec, RateLimitSpec};
use super::tree::{Domain, KeyNodes, Level, Node, Policy, Rule};
use crate::calendar::Calendar;
use crate::limit::{Algorithm, AlgorithmKind, Limit};
use crate::unit::Unit;

mod quota_group;

/// A compiled domain and how many rules it holds.
pub(super) struct Compiled {
    pub(super) domain: Domain,
    pub(super) rules: usize,
}

/// Compiles `spec` from `origin`, numbering its rules from `first_id`; problems are appended
/// to `errors`. In a `budget_domain`, every rule is a budget.
pub(super) fn compile(
    origin: &str,
    spec: DomainSpec,
    defaults: Defaults,
    budget_domain: bool,
    first_id: usize,
    errors: &mut Vec<ConfigError>,
) -> Option<Compiled> {
    let mut ctx = Context {
        origin,
        domain: spec.domain.as_str().into(),
        defaults,
        budget_domain,
        next_id: first_id,
        errors,
        failed: false,
    };
    if spec.domain.is_empty() {
        ctx.error("domain", "config file cannot have empty domain".into());
    }
    let root = ctx.level(spec.descriptors, "descriptors", &Path::default());
    (!ctx.failed).then(|| Compiled {
        domain: Domain {
            origins: vec![origin.to_owned()],
            root,
        },
        rules: ctx.next_id - first_id,
    })
}

/// Compiles one limit written as in a rule, outside any rules file (a runtime override):
/// the problem names the field under `path`.
pub(super) fn compile_limit(
    spec: RateLimitSpec,
    defaults: Defaults,
    path: &str,
) -> Result<Limit, ConfigError> {
    let mut errors = Vec::new();
    let mut ctx = Context {
        origin: "",
        domain: "".into(),
        defaults,
        budget_domain: false,
        next_id: 0,
        errors: &mut errors,
        failed: false,
    };
    let limit = ctx.limit(spec, path);
    match (limit, errors.into_iter().next()) {
        (Some(limit), _) => Ok(limit),
        (None, Some(error)) => Err(error),
        (None, None) => Err(ConfigError::whole("", "invalid limit".into())),
    }
}

/// The levels above a descriptor: their metric names, and those matched by a
/// `share_threshold` wildcard with its pattern.
#[derive(Default, Clone)]
struct Path {
    names: Vec<String>,
    shared: Vec<(usize, Box<str>)>,
}

struct Context<'a> {
    origin: &'a str,
    domain: Arc<str>,
    defaults: Defaults,
    /// Every rule of the domain is a budget.
    budget_domain: bool,
    next_id: usize,
    errors: &'a mut Vec<ConfigError>,
    failed: bool,
}

impl Context<'_> {
    fn error(&mut self, path: &str, message: String) {
        self.failed = true;
        self.errors.push(ConfigError {
            origin: self.origin.to_owned(),
            path: path.to_owned(),
            message,
        });
    }

    /// Compiles one level below `parents`.
    fn level(&mut self, specs: Vec<DescriptorSpec>, path: &str, parents: &Path) -> Level {
        let mut level = Level::default();
        // Where each (key, value) was first seen, to name both places of a duplicate.
        let mut seen: std::collections::HashMap<(String, Option<String>), String> =
            Default::default();
        for (i, spec) in specs.into_iter().enumerate() {
            let here = format!("{path}[{i}]");
            if spec.key.is_empty() {
                self.error(&here, "descriptor has empty key".into());
                continue;
            }
            let key = spec.key.clone();
            // An empty value is the key-only default, as in the reference.
            let value = spec.value.clone().filter(|v| !v.is_empty());
            match seen.entry((key.clone(), value.clone())) {
                Entry::Occupied(first) => {
                    let what = match &value {
                        Some(v) => format!("key '{key}' value '{v}'"),
                        None => format!("key '{key}' with no value"),
                    };
                    let message = format!("duplicate descriptor {what} (first at {})", first.get());
                    self.error(&here, message);
                    continue;
                }
                Entry::Vacant(slot) => {
                    slot.insert(here.clone());
                }
            }
            let pattern = value.as_deref().and_then(Pattern::new);
            let mut below = parents.clone();
            if spec.share_threshold {
                match (&pattern, &value) {
                    (Some(_), Some(v)) => {
                        below.shared.push((parents.names.len(), v.as_str().into()))
                    }
                    _ => self.error(
                        &format!("{here}.share_threshold"),
                        "share_threshold applies only to a wildcard value (one with `*`)".into(),
                    ),
                }
            }
            below.names.push(match &value {
                Some(v) => format!("{key}_{v}"),
                None => key.clone(),
            });
            let node = self.node(spec, &here, &below);
            let nodes: &mut KeyNodes = level.keys.entry(key).or_default();
            match (value, pattern) {
                (None, _) => nodes.default = Some(node),
                (Some(_), Some(pattern)) => nodes.wildcards.push((pattern, node)),
                (Some(v), None) => {
                    nodes.exact.insert(v, node);
                }
            }
        }
        level
    }

    fn node(&mut self, mut spec: DescriptorSpec, path: &str, here: &Path) -> Node {
        let quota_group = self.quota_group(&mut spec, path);
        let (limits, limits_path) = match (spec.rate_limit, spec.rate_limits) {
            (Some(_), Some(_)) => {
                self.error(
                    path,
                    "use either rate_limit or rate_limits, not both".into(),
                );
                (Vec::new(), String::new())
            }
            (Some(one), None) => (vec![one], format!("{path}.rate_limit")),
            (None, Some(many)) => (many, format!("{path}.rate_limits")),
            (None, None) => (Vec::new(), String::new()),
        };
        let listed = limits_path.ends_with('s');
        if self.defaults.reference {
            self.reference_only(spec.budget, path, listed);
        }
        let counting = (spec.budget, spec.quota_mode, !limits.is_empty());
        let in_flight = match spec.in_flight {
            Some(f) => self.in_flight(f, counting, path),
            None => None,
        };
        let mut replaces = Vec::new();
        for (i, limit) in limits.iter().enumerate() {
            let here = if listed {
                format!("{limits_path}[{i}]")
            } else {
                limits_path.clone()
            };
            for r in &limit.replaces {
                if r.name.is_empty() {
                    self.error(
                        &format!("{here}.replaces"),
                        "should not have an empty replaces entry".into(),
                    );
                } else if limits
                    .iter()
                    .any(|l| l.name.as_deref() == Some(r.name.as_str()))
                {
                    let message = "replaces should not contain name of same descriptor".into();
                    self.error(&format!("{here}.replaces"), message);
                } else {
                    replaces.push(r.name.clone());
                }
            }
        }
        let policy = match (in_flight, limits_path.is_empty()) {
            (Some(policy), _) => Some(policy),
            (None, true) => None,
            (None, false) => self.policy(limits, &limits_path, listed),
        };
        // A slot is taken only if it fits, in a budget domain too.
        let charged = (spec.quota_mode || spec.budget || self.budget_domain)
            && !policy.as_ref().is_some_and(Policy::in_flight);
        let rule = {
            policy.map(|policy| {
                self.next_id += 1;
                Rule {
                    id: self.next_id - 1,
                    domain: self.domain.clone(),
                    path: here.names.as_slice().into(),
                    policy,
                    shadow_mode: spec.shadow_mode,
                    detailed_metric: spec.detailed_metric || spec.value_to_metric,
                    replaces: replaces.into(),
                    quota_mode: spec.quota_mode,
                    quota_group,
                    charged,
                    metadata: spec.metadata.map(Arc::new),
                    shared: here.shared.as_slice().into(),
                }
            })
        };
        let children = self.level(spec.descriptors, &format!("{path}.descriptors"), here);
        Node { rule, children }
    }

    /// The policy of an `in_flight` limit; `counting` says whether the descriptor is also
    /// a budget, in quota mode, or has rate limits, none of which go with it.
    fn in_flight(
        &mut self,
        spec: InFlightSpec,
        (budget, quota_mode, limited): (bool, bool, bool),
        path: &str,
    ) -> Option<Policy> {
        let here = format!("{path}.in_flight");
        if self.defaults.reference {
            let message = "REFERENCE_MODE counts requests as the reference does; `in_flight` is \
                           Tollgate's";
            self.error(&here, message.into());
            return None;
        }
        let clash = [
            (limited, "rate_limit"),
            (budget, "budget"),
            (quota_mode, "quota_mode"),
        ];
        if let Some((_, other)) = clash.into_iter().find(|(set, _)| *set) {
            let message = format!("in_flight counts slots, not usage: it cannot go with {other}");
            self.error(path, message);
            return None;
        }
        let Some(max) = spec.max else {
            self.error(
                &here,
                "in_flight needs max: the slots held at most at once".into(),
            );
            return None;
        };
        let Some(text) = spec.expire_after else {
            let message = "in_flight needs expire_after: how long a slot not released is held \
                           (e.g. 60s)";
            self.error(&here, message.into());
            return None;
        };
        let expire_after = match parse_expire_after(&text) {
            Ok(d) => d,
            Err(message) => {
                self.error(&format!("{here}.expire_after"), message);
                return None;
            }
        };
        let limit = match Limit::in_flight(max, expire_after) {
            Ok(limit) => limit,
            Err(e) => {
                self.error(&format!("{here}.{}", e.field()), e.to_string());
                return None;
            }
        };
        let limit = match spec.name {
            Some(name) => limit.with_name(name),
            None => limit,
        };
        let limits = [limit];
        let shape = Limit::shape_of(&limits).into();
        Some(Policy::Limited {
            limits: limits.into(),
            shape,
        })
    }

    /// Reference mode's refusal of what only Tollgate's rules can say.
    fn reference_only(&mut self, budget: bool, path: &str, listed: bool) {
        if listed {
            let message = "REFERENCE_MODE has one rate_limit per descriptor, as the reference; \
                           `rate_limits` is Tollgate's";
            self.error(&format!("{path}.rate_limits"), message.into());
        }
        if budget {
            let message = "REFERENCE_MODE counts every hit as the reference does; `budget` is \
                           Tollgate's (quota_mode is the reference's)";
            self.error(&format!("{path}.budget"), message.into());
        }
    }

    fn policy(&mut self, specs: Vec<RateLimitSpec>, path: &str, listed: bool) -> Option<Policy> {
        if specs.is_empty() {
            self.error(path, "rate_limits must hold at least one limit".into());
            return None;
        }
        if specs.iter().any(|s| s.unlimited) {
            if specs.len() > 1 {
                self.error(
                    path,
                    "an unlimited limit cannot be combined with others".into(),
                );
                return None;
            }
            let here = if listed {
                format!("{path}[0]")
            } else {
                path.to_owned()
            };
            let spec = specs.into_iter().next()?;
            // `UNKNOWN` is the protocol's "no unit", which the reference accepts here.
            let unit = spec
                .unit
                .as_deref()
                .filter(|u| !u.eq_ignore_ascii_case("unknown"));
            if unit.is_some() {
                self.error(
                    &here,
                    "should not specify rate limit unit when unlimited".into(),
                );
                return None;
            }
            return Some(Policy::Unlimited { name: spec.name });
        }
        let mut limits = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let here = if listed {
                format!("{path}[{i}]")
            } else {
                path.to_owned()
            };
            if let Some(limit) = self.limit(spec, &here) {
                limits.push(limit);
            }
        }
        if self.failed {
            return None;
        }
        let shape = Limit::shape_of(&limits).into();
        Some(Policy::Limited {
            limits: limits.into(),
            shape,
        })
    }

    fn limit(&mut self, spec: RateLimitSpec, path: &str) -> Option<Limit> {
        let unit = match spec.unit.as_deref().map(|u| (u, Unit::parse(u))) {
            Some((_, Some(unit))) => unit,
            Some((name, None)) => {
                self.error(
                    &format!("{path}.unit"),
                    format!("invalid rate limit unit '{name}'"),
                );
                return None;
            }
            None => {
                self.error(
                    path,
                    "missing rate limit unit (second, minute, hour, day, week, month or year)"
                        .into(),
                );
                return None;
            }
        };
        let kind = match spec.algorithm.as_deref().map(str::parse::<AlgorithmKind>) {
            None if self.defaults.reference => AlgorithmKind::FixedWindow,
            // A calendar window is a fixed window: saying so again is not needed.
            None if spec.calendar == Some(true) => AlgorithmKind::FixedWindow,
            None => self.defaults.algorithm,
            Some(Ok(AlgorithmKind::FixedWindow)) => AlgorithmKind::FixedWindow,
            Some(Ok(kind)) if self.defaults.reference => {
                let message = format!(
                    "REFERENCE_MODE counts fixed windows, as the reference does; `{}` is Tollgate's",
                    kind.as_str()
                );
                self.error(&format!("{path}.algorithm"), message);
                return None;
            }
            Some(Ok(kind)) => kind,
            Some(Err(unknown)) => {
                self.error(&format!("{path}.algorithm"), unknown.to_string());
                return None;
            }
        };
        if self.defaults.reference && spec.unit_multiplier.is_some() {
            let message =
                "REFERENCE_MODE has the reference's units only; `unit_multiplier` is Tollgate's";
            self.error(&format!("{path}.unit_multiplier"), message.into());
            return None;
        }
        if self.defaults.reference && (spec.calendar.is_some() || spec.time_zone.is_some()) {
            let message = "REFERENCE_MODE has the reference's epoch-aligned windows only; \
                           calendar windows are Tollgate's";
            let field = if spec.calendar.is_some() {
                "calendar"
            } else {
                "time_zone"
            };
            self.error(&format!("{path}.{field}"), message.into());
            return None;
        }
        let bucket = matches!(
            kind,
            AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket
        );
        if spec.burst.is_some() && !bucket {
            self.error(
                &format!("{path}.burst"),
                "burst applies only to token_bucket and leaky_bucket".into(),
            );
            return None;
        }
        if spec.time_zone.is_some() && spec.calendar != Some(true) {
            self.error(
                &format!("{path}.time_zone"),
                "time_zone applies only to a calendar window (calendar: true)".into(),
            );
            return None;
        }
        if spec.precision.is_some() && kind != AlgorithmKind::SlidingWindow {
            self.error(
                &format!("{path}.precision"),
                "precision applies only to sliding_window".into(),
            );
            return None;
        }
        // A bucket's capacity defaults to its rate; a zero rate keeps a zero bucket, which
        // denies everything as the rate does.
        let burst = spec.burst.unwrap_or(spec.requests_per_unit.max(1));
        let algorithm = match kind {
            AlgorithmKind::SlidingWindow => Algorithm::SlidingWindow {
                precision: spec.precision.unwrap_or(self.defaults.precision),
            },
            AlgorithmKind::FixedWindow => Algorithm::FixedWindow,
            AlgorithmKind::TokenBucket => Algorithm::TokenBucket { burst },
            AlgorithmKind::LeakyBucket => Algorithm::LeakyBucket { burst },
            AlgorithmKind::Slots => Algorithm::Slots,
        };
        let multiplier = spec.unit_multiplier.unwrap_or(1);
        let zone = match (spec.calendar, spec.time_zone) {
            (Some(true), Some(zone)) => Some(zone.into()),
            (Some(true), None) => self.defaults.calendar_zone.clone(),
            // The settings' calendar covers the fixed windows it can place, unless refused.
            (None, None) if kind == AlgorithmKind::FixedWindow && unit >= Unit::Day => {
                self.defaults.calendar_zone.clone()
            }
            _ => None,
        };
        let limit = Limit::new(spec.requests_per_unit, unit)
            .with_multiplier(multiplier)
            .and_then(|l| l.with_algorithm(algorithm))
            .and_then(|l| match zone {
                Some(zone) => l.with_calendar(Calendar::new(unit, multiplier, &zone)?),
                None if spec.calendar == Some(true) => {
                    l.with_calendar(Calendar::new(unit, multiplier, "UTC")?)
                }
                None => Ok(l),
            })
            .map(|l| match spec.name {
                Some(name) => l.with_name(name),
                None => l,
            });
        match limit {
            Ok(limit) => Some(limit),
            Err(e) => {
                self.error(&format!("{path}.{}", e.field()), e.to_string());
                None
            }
        }
    }
}
