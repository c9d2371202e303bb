//! Turns one parsed file into a compiled [`Domain`], collecting every problem on the way.

use std::collections::hash_map::Entry;
use std::path::Path;

use super::pattern::Pattern;
use super::rules::{Domain, KeyNodes, Level, Node, Policy, Rule};
use super::spec::{DescriptorSpec, FileSpec, RateLimitSpec};
use super::{ConfigError, Defaults};
use crate::limiter::{Algorithm, Limit, Unit};
use crate::metrics::{DescriptorFamilies, DescriptorLabels};

const NANOS_PER_SECOND: u64 = 1_000_000_000;
const MAX_PRECISION: u32 = 1_000;

/// Compiles `spec` read from `file`; problems are appended to `errors`.
pub fn compile(
    file: &Path,
    spec: FileSpec,
    defaults: Defaults,
    families: &DescriptorFamilies,
    errors: &mut Vec<ConfigError>,
) -> Option<Domain> {
    let mut ctx = Context {
        file,
        domain: &spec.domain,
        defaults,
        families,
        errors,
        failed: false,
    };
    if spec.domain.is_empty() {
        ctx.error("domain", "config file cannot have empty domain".into());
    }
    let root = ctx.level(spec.descriptors, "descriptors", &[]);
    (!ctx.failed).then(|| Domain {
        file: file.to_owned(),
        root,
    })
}

struct Context<'a> {
    file: &'a Path,
    domain: &'a str,
    defaults: Defaults,
    families: &'a DescriptorFamilies,
    errors: &'a mut Vec<ConfigError>,
    failed: bool,
}

impl Context<'_> {
    fn error(&mut self, path: &str, message: String) {
        self.failed = true;
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            path: path.to_owned(),
            message,
        });
    }

    /// Compiles one level; `parents` are the metric name parts of the levels above.
    fn level(&mut self, specs: Vec<DescriptorSpec>, path: &str, parents: &[String]) -> Level {
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
            let mut names = parents.to_vec();
            names.push(match &value {
                Some(v) => format!("{key}_{v}"),
                None => key.clone(),
            });
            let node = self.node(spec, &here, &names);
            let nodes: &mut KeyNodes = level.keys.entry(key).or_default();
            match value {
                None => nodes.default = Some(node),
                Some(v) => match Pattern::new(&v) {
                    Some(pattern) => nodes.wildcards.push((pattern, node)),
                    None => {
                        nodes.exact.insert(v, node);
                    }
                },
            }
        }
        level
    }

    fn node(&mut self, spec: DescriptorSpec, path: &str, names: &[String]) -> Node {
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
        let rule = if limits_path.is_empty() {
            None
        } else {
            self.policy(limits, &limits_path, listed)
                .map(|policy| Rule {
                    policy,
                    shadow_mode: spec.shadow_mode,
                    detailed_metric: spec.detailed_metric || spec.value_to_metric,
                    replaces,
                    stats: self.families.stats(&metric_labels(self.domain, names)),
                })
        };
        let children = self.level(spec.descriptors, &format!("{path}.descriptors"), names);
        Node { rule, children }
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
            if spec.unit.is_some() {
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
        let mut shape = String::new();
        for (i, limit) in limits.iter().enumerate() {
            if i > 0 {
                shape.push(',');
            }
            limit.write_shape(&mut shape);
        }
        Some(Policy::Limited { limits, shape })
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
        let multiplier = spec.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            self.error(
                &format!("{path}.unit_multiplier"),
                "unit_multiplier must be at least 1".into(),
            );
            return None;
        }
        let window_seconds = unit.seconds() * u64::from(multiplier);
        let Some(window_ns) = window_seconds.checked_mul(NANOS_PER_SECOND) else {
            self.error(
                &format!("{path}.unit_multiplier"),
                "window is too long".into(),
            );
            return None;
        };
        let algorithm = match spec.algorithm.as_deref() {
            None => self.defaults.algorithm,
            Some(name) => match Algorithm::parse(name) {
                Some(a) => a,
                None => {
                    self.error(
                        &format!("{path}.algorithm"),
                        format!(
                            "invalid algorithm '{name}' (expected sliding_window, fixed_window, token_bucket or leaky_bucket)"
                        ),
                    );
                    return None;
                }
            },
        };
        let bucket = matches!(algorithm, Algorithm::TokenBucket | Algorithm::LeakyBucket);
        if spec.burst.is_some() && !bucket {
            self.error(
                &format!("{path}.burst"),
                "burst applies only to token_bucket and leaky_bucket".into(),
            );
            return None;
        }
        if spec.burst == Some(0) {
            self.error(&format!("{path}.burst"), "burst must be at least 1".into());
            return None;
        }
        if spec.precision.is_some() && algorithm != Algorithm::SlidingWindow {
            self.error(
                &format!("{path}.precision"),
                "precision applies only to sliding_window".into(),
            );
            return None;
        }
        let precision = spec.precision.unwrap_or(self.defaults.precision);
        if !(1..=MAX_PRECISION).contains(&precision) {
            self.error(
                &format!("{path}.precision"),
                format!("precision must be between 1 and {MAX_PRECISION}, not {precision}"),
            );
            return None;
        }
        // Whole milliseconds keep sub-window boundaries identical in every store and clock.
        if algorithm == Algorithm::SlidingWindow
            && window_ns % (u64::from(precision) * 1_000_000) != 0
        {
            self.error(
                &format!("{path}.precision"),
                format!("precision {precision} does not split the window into whole milliseconds"),
            );
            return None;
        }
        Some(Limit {
            requests_per_unit: spec.requests_per_unit,
            unit: if multiplier == 1 {
                unit
            } else {
                Unit::nearest(window_seconds)
            },
            window_ns,
            algorithm,
            precision,
            burst: spec.burst.unwrap_or(spec.requests_per_unit),
            name: spec.name,
        })
    }
}

/// The reference's labels for a descriptor: its domain, its first level as `key` or
/// `key_value`, and the levels below joined with dots.
pub fn metric_labels(domain: &str, names: &[String]) -> DescriptorLabels {
    DescriptorLabels {
        domain: domain.to_owned(),
        key1: names.first().cloned().unwrap_or_default(),
        key2: names
            .get(1..)
            .map(|rest| rest.join("."))
            .unwrap_or_default(),
    }
}
