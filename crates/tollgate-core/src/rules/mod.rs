//! Rules: the reference's YAML format (or the same model built in code or received over
//! xDS), validated and compiled into matchable [`Rules`].

mod compile;
mod config_error;
mod dump;
mod duration;
mod files;
mod meta;
mod pattern;
mod spec;
mod tree;
mod yaml;

pub use config_error::{ConfigError, ConfigErrors};
pub use files::{MAX_FILE_BYTES, MAX_TOTAL_BYTES};
pub use meta::{MetaValue, Metadata, merge as merge_metadata};
pub use spec::{DescriptorSpec, DomainSpec, RateLimitSpec, ReplaceSpec};
pub use tree::{Domain, Policy, Rule, Rules};

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::calendar::Calendar;
use crate::limit::{Algorithm, AlgorithmKind, DEFAULT_PRECISION, Limit, LimitError};
use crate::unit::Unit;

/// Settings-level defaults for what a rule leaves out.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Algorithm of limits that name none.
    pub algorithm: AlgorithmKind,
    /// Sub-windows of sliding windows that name no precision.
    pub precision: u32,
    /// Reference mode: every limit is the reference's fixed window, and rules may use
    /// nothing the reference does not have (`algorithm`, `rate_limits`, `unit_multiplier`,
    /// `budget`, `calendar`).
    pub reference: bool,
    /// The IANA zone whose calendar places every fixed window of a day or longer that
    /// does not say `calendar: false`, and calendar windows that name no zone; `None`:
    /// only rules that say `calendar: true` are calendar windows, in UTC by default.
    pub calendar_zone: Option<Arc<str>>,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            algorithm: AlgorithmKind::SlidingWindow,
            precision: DEFAULT_PRECISION,
            reference: false,
            calendar_zone: None,
        }
    }
}

impl Defaults {
    /// A limit of `requests_per_unit` per `unit` counted the default way (what a request's
    /// limit override gets).
    pub fn limit(&self, requests_per_unit: u32, unit: Unit) -> Result<Limit, LimitError> {
        let burst = requests_per_unit.max(1);
        let kind = match self.reference {
            true => AlgorithmKind::FixedWindow,
            false => self.algorithm,
        };
        let algorithm = match kind {
            AlgorithmKind::SlidingWindow => Algorithm::SlidingWindow {
                precision: self.precision,
            },
            AlgorithmKind::FixedWindow => Algorithm::FixedWindow,
            AlgorithmKind::TokenBucket => Algorithm::TokenBucket { burst },
            AlgorithmKind::LeakyBucket => Algorithm::LeakyBucket { burst },
            AlgorithmKind::Slots => Algorithm::Slots,
        };
        let limit = Limit::new(requests_per_unit, unit).with_algorithm(algorithm)?;
        match &self.calendar_zone {
            Some(zone) if self.algorithm == AlgorithmKind::FixedWindow && unit >= Unit::Day => {
                limit.with_calendar(Calendar::new(unit, 1, zone)?)
            }
            _ => Ok(limit),
        }
    }
}

impl Defaults {
    /// One limit as a rule would write it, compiled with these defaults outside any rules
    /// file (a runtime override); the problem's path names the field under `path`.
    pub(crate) fn compile_limit(
        &self,
        spec: RateLimitSpec,
        path: &str,
    ) -> Result<Limit, ConfigError> {
        compile::compile_limit(spec, self.clone(), path)
    }
}

impl Rules {
    /// Compiles the rules of one YAML document, as if read from `origin`.
    pub fn from_yaml(origin: &str, text: &str) -> Result<Rules, ConfigErrors> {
        let mut builder = RulesBuilder::new(Defaults::default());
        builder.add_yaml(origin, text);
        builder.finish()
    }

    /// Loads the rules at `path`: a file, or every `*.yaml`/`*.yml` below a directory.
    /// Blocking file I/O: async callers should run it on a blocking thread.
    pub fn load(path: &Path, defaults: Defaults) -> Result<Rules, ConfigErrors> {
        let mut builder = RulesBuilder::new(defaults);
        builder.add_path(path);
        builder.finish()
    }
}

/// Rules being assembled from several origins, with every problem found so far.
#[derive(Debug)]
pub struct RulesBuilder {
    defaults: Defaults,
    merge_domains: bool,
    budget_domains: Vec<String>,
    rules: Rules,
    errors: Vec<ConfigError>,
    /// The origin each domain came from first, to name both of a duplicate.
    seen: HashMap<String, String>,
}

impl RulesBuilder {
    /// An empty set of rules filling gaps from `defaults`.
    pub fn new(defaults: Defaults) -> Self {
        Self {
            defaults,
            merge_domains: false,
            budget_domains: Vec::new(),
            rules: Rules::default(),
            errors: Vec::new(),
            seen: HashMap::new(),
        }
    }

    /// Whether several origins may hold the same domain (the reference's
    /// `MERGE_DOMAIN_CONFIG`): their descriptors merge, and a descriptor defined twice is
    /// still an error. Off, a second origin for a domain is an error.
    pub fn merge_domains(mut self, merge: bool) -> Self {
        self.merge_domains = merge;
        self
    }

    /// Domains whose every rule is a budget (`*`: all), for rules that cannot say so
    /// themselves (xDS has no field for it).
    pub fn budget_domains(mut self, domains: Vec<String>) -> Self {
        self.budget_domains = domains;
        self
    }

    /// Adds every rules file at `path` (see [`Rules::load`]).
    pub fn add_path(&mut self, path: &Path) {
        match files::read_rule_files(path) {
            Ok(found) => {
                for file in found {
                    match file.text {
                        Ok(text) => self.add_yaml(&file.origin, &text),
                        Err(e) => self.errors.push(e),
                    }
                }
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// Adds the rules of one YAML document read from `origin`, with every problem in it.
    pub fn add_yaml(&mut self, origin: &str, text: &str) {
        let (spec, parse_errors) = yaml::parse_all(origin, text);
        let Some(spec) = spec else {
            return self.errors.extend(parse_errors);
        };
        let before = self.errors.len();
        self.add_spec(origin, spec);
        // A place whose entry was blanked after a parse error reads as missing; that is
        // the parse error again, not a second problem.
        let found = self.errors.split_off(before);
        self.errors.extend(parse_errors.iter().cloned());
        self.errors.extend(
            found
                .into_iter()
                .filter(|e| !parse_errors.iter().any(|p| same_place(&p.path, &e.path))),
        );
    }

    /// Adds one domain's rules, built in code or converted from another format.
    pub fn add_spec(&mut self, origin: &str, spec: DomainSpec) {
        let name = spec.domain.clone();
        let first = self.seen.get(&name).cloned();
        if let (Some(first), false) = (&first, self.merge_domains) {
            let message = format!("duplicate domain '{name}' (also in {first})");
            return self.errors.push(ConfigError {
                origin: origin.to_owned(),
                path: "domain".into(),
                message,
            });
        }
        if first.is_none() {
            self.seen.insert(name.clone(), origin.to_owned());
        }
        let budget = self.budget_domains.iter().any(|d| d == "*" || *d == name);
        let next_id = self.rules.rule_count;
        let compiled = compile::compile(
            origin,
            spec,
            self.defaults.clone(),
            budget,
            next_id,
            &mut self.errors,
        );
        let Some(compiled) = compiled else { return };
        self.rules.rule_count += compiled.rules;
        match self.rules.domains.get_mut(&name) {
            Some(existing) => existing.merge(compiled.domain, origin, &mut self.errors),
            None => {
                self.rules.domains.insert(name, compiled.domain);
            }
        }
    }

    /// The rules, or every problem found.
    pub fn finish(self) -> Result<Rules, ConfigErrors> {
        if self.errors.is_empty() {
            Ok(self.rules)
        } else {
            Err(ConfigErrors(self.errors))
        }
    }
}

/// Whether one of two places in the rules (`descriptors[0].rate_limit`) is the other or
/// inside it.
fn same_place(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long.strip_prefix(short)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod in_flight_tests;

#[cfg(test)]
mod quota_group_tests;
