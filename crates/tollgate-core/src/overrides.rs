//! Runtime overrides: a limit set for one exact descriptor of a domain (a tenant's plan)
//! without touching the rules. The rule the descriptor matches keeps serving every other
//! value; the override's counter is keyed like the rule's (domain, entries, window shape),
//! never by the limit's value, so changing a limit within one shape keeps the count.

mod bounds;
mod feed;
mod set;
mod target;

pub use bounds::{MAX_DESCRIPTOR_BYTES, MAX_NAME_BYTES};
pub use feed::{ChangeError, Changed, OverrideFeed, OverrideUpdate};
pub use set::{Overrides, Page};

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::{NANOS_PER_SECOND, Timestamp};
use crate::key::write_counter_key;
use crate::limit::Limit;
use crate::rules::{ConfigError, Defaults, RateLimitSpec, Rules};

/// The most overrides when the settings name no other number (`OVERRIDES_MAX`).
pub const DEFAULT_MAX_OVERRIDES: usize = 100_000;

/// One entry of an overridden descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideEntry {
    /// The entry's key.
    pub key: String,
    /// The entry's exact value.
    pub value: String,
}

/// The limit an override sets, written as in a rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideLimit {
    /// Units per window.
    pub requests_per_unit: u32,
    /// second, minute, hour, day, week, month or year (any case).
    pub unit: String,
    /// The window is `unit_multiplier` units long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_multiplier: Option<u32>,
    /// sliding_window, fixed_window, token_bucket or leaky_bucket (default from the
    /// settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<String>,
    /// The name answers carry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An override as it is set, listed and stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    /// The rules' domain.
    pub domain: String,
    /// The descriptor's entries, outermost first, matched exactly and in this order.
    pub entries: Vec<OverrideEntry>,
    /// The limit in force for that descriptor.
    pub limit: OverrideLimit,
    /// Unix seconds from which the override no longer applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
}

impl Override {
    /// The descriptor's entries as (key, value) pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
    }

    /// Whether it has expired at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at
            .is_some_and(|at| at.saturating_mul(NANOS_PER_SECOND) <= now.as_nanos())
    }

    /// The identity of the overridden descriptor (domain and entries), as a map key.
    pub fn id(&self) -> String {
        descriptor_id(&self.domain, self.pairs())
    }
}

/// Why an override is refused; `field` names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct OverrideError {
    /// Like `limit.unit` or `entries[0].key`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl OverrideError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// An override checked against the rules and compiled to the limit it counts.
#[derive(Debug, Clone)]
pub struct CompiledOverride {
    spec: Override,
    limits: Arc<[Limit]>,
    shape: Box<str>,
    source: Arc<str>,
}

impl CompiledOverride {
    /// Checks `spec` against `rules` (a rule must match its descriptor) and compiles its
    /// limit with `defaults`; `source` says where it came from (explain shows it).
    pub fn compile(
        spec: Override,
        rules: &Rules,
        defaults: &Defaults,
        source: &str,
    ) -> Result<Self, OverrideError> {
        // First, so that no refusal below quotes a text past its bound.
        bounds::check(&spec)?;
        if spec.domain.is_empty() {
            return Err(OverrideError::new("domain", "must not be empty"));
        }
        if spec.entries.is_empty() {
            return Err(OverrideError::new(
                "entries",
                "must hold at least one entry",
            ));
        }
        if let Some(i) = spec.entries.iter().position(|e| e.key.is_empty()) {
            return Err(OverrideError::new(
                format!("entries[{i}].key"),
                "must not be empty",
            ));
        }
        let Some(domain) = rules.domain(&spec.domain) else {
            let message = format!("no rules for domain '{}'", spec.domain);
            return Err(OverrideError::new("domain", message));
        };
        let Some(rule) = domain.find(spec.pairs()) else {
            let message = format!(
                "no rule of domain '{}' matches the descriptor {}",
                spec.domain,
                descriptor_text(&spec)
            );
            return Err(OverrideError::new("entries", message));
        };
        let compiled = Self::restore(spec, defaults, source)?;
        match compiled.refusal(rule) {
            Some(why) => Err(OverrideError::new("entries", why)),
            None => Ok(compiled),
        }
    }

    /// Compiles `spec` as it was stored (checked against the rules when it was set; its
    /// sizes checked again, as a store or a file may hold anything): a rule it matched
    /// may not be loaded yet, and it stays dormant until one matches its descriptor again.
    pub fn restore(
        spec: Override,
        defaults: &Defaults,
        source: &str,
    ) -> Result<Self, OverrideError> {
        bounds::check(&spec)?;
        let limit = defaults
            .compile_limit(rate_limit_spec(&spec.limit), "limit")
            .map_err(|e: ConfigError| OverrideError::new(e.path, e.message))?;
        let limits: Arc<[Limit]> = Arc::from([limit]);
        let shape = Limit::shape_of(&limits).into();
        Ok(Self {
            spec,
            limits,
            shape,
            source: source.into(),
        })
    }

    /// The override as it was set.
    pub fn spec(&self) -> &Override {
        &self.spec
    }

    /// The limits counted for its descriptor.
    pub fn limits(&self) -> &Arc<[Limit]> {
        &self.limits
    }

    /// The limits' part of the counter key.
    pub(crate) fn shape(&self) -> &str {
        &self.shape
    }

    /// Where it came from: the API of an instance, a store, a file.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its descriptor as `k=v,k2=v2`.
    fn descriptor_text(&self) -> String {
        descriptor_text(&self.spec)
    }
}

/// `spec`'s descriptor as `k=v,k2=v2`.
fn descriptor_text(spec: &Override) -> String {
    let entries: Vec<String> = spec.pairs().map(|(k, v)| format!("{k}={v}")).collect();
    entries.join(",")
}

fn rate_limit_spec(limit: &OverrideLimit) -> RateLimitSpec {
    RateLimitSpec {
        unit: Some(limit.unit.clone()),
        requests_per_unit: limit.requests_per_unit,
        name: limit.name.clone(),
        unit_multiplier: limit.unit_multiplier,
        algorithm: limit.algorithm.clone(),
        ..RateLimitSpec::default()
    }
}

/// A descriptor's identity ([`Override::id`]): its counter key without a shape,
/// injective like the key.
pub fn descriptor_id<'a>(
    domain: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut id = String::new();
    write_counter_key(&mut id, domain, entries, "");
    id
}

#[cfg(test)]
mod tests;
