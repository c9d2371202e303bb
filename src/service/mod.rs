//! The one decision core: a `RateLimitRequest` in, a `RateLimitResponse` out.
//!
//! gRPC (and later HTTP `/json`) are thin adapters over [`Service::decide`].

pub mod grpc;
mod validate;

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

use crate::config::{Defaults, Policy, Rule, Rules};
use crate::key::write_counter_key;
use crate::limiter::{Hits, Limit, Outcome, Unit};
use crate::store::{Store, StoreError};

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    /// The request is malformed; the text says how.
    InvalidArgument(String),
    /// The counter store failed.
    Store(StoreError),
}

/// The rate-limit service: current rules, the counter store, and defaults for overrides.
pub struct Service {
    rules: Arc<ArcSwap<Rules>>,
    store: Store,
    defaults: Defaults,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// What one descriptor resolved to before counting.
enum Plan<'a> {
    NoLimit,
    Unlimited,
    /// Limits from a rule (or a request override), and whether the rule is in shadow mode.
    Limited {
        limits: std::borrow::Cow<'a, [Limit]>,
        shape: std::borrow::Cow<'a, str>,
        shadow_mode: bool,
    },
}

impl Service {
    pub fn new(rules: Arc<ArcSwap<Rules>>, store: Store, defaults: Defaults) -> Self {
        Self {
            rules,
            store,
            defaults,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, DecideError> {
        validate::request(req).map_err(DecideError::InvalidArgument)?;
        let rules = self.rules.load_full();
        let domain = rules.domain(&req.domain);
        let matched: Vec<Option<&Rule>> = req
            .descriptors
            .iter()
            .map(|d| domain.and_then(|dom| dom.find(entries(d))))
            .collect();
        let matched = drop_replaced(matched);

        let mut statuses = Vec::with_capacity(req.descriptors.len());
        let mut key = String::new();
        let mut over = false;
        for (descriptor, rule) in req.descriptors.iter().zip(matched) {
            let plan = self.plan(descriptor, rule, domain.is_some())?;
            let status = match plan {
                Plan::NoLimit => ok_status(),
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok.into(),
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Plan::Limited {
                    limits,
                    shape,
                    shadow_mode,
                } => {
                    write_counter_key(&mut key, &req.domain, entries(descriptor), &shape);
                    let hits = hits(req, descriptor);
                    let outcome = self
                        .store
                        .apply(&key, &limits, hits)
                        .await
                        .map_err(DecideError::Store)?;
                    limited_status(&limits, outcome, shadow_mode)
                }
            };
            over |= status.code == i32::from(Code::OverLimit);
            statuses.push(status);
        }
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            ..Default::default()
        })
    }

    /// Resolves one descriptor: its matched rule, or the limit the request sent instead.
    fn plan<'a>(
        &self,
        descriptor: &RateLimitDescriptor,
        rule: Option<&'a Rule>,
        domain_known: bool,
    ) -> Result<Plan<'a>, DecideError> {
        if let Some(requested) = descriptor.limit.filter(|_| domain_known) {
            let limit = self.override_limit(requested.requests_per_unit, requested.unit)?;
            let mut shape = String::new();
            limit.write_shape(&mut shape);
            return Ok(Plan::Limited {
                limits: vec![limit].into(),
                shape: shape.into(),
                shadow_mode: rule.is_some_and(|r| r.shadow_mode),
            });
        }
        Ok(match rule.map(|r| (r, &r.policy)) {
            None => Plan::NoLimit,
            Some((_, Policy::Unlimited { .. })) => Plan::Unlimited,
            Some((rule, Policy::Limited { limits, shape })) => Plan::Limited {
                limits: limits.as_slice().into(),
                shape: shape.as_str().into(),
                shadow_mode: rule.shadow_mode,
            },
        })
    }

    fn override_limit(&self, requests_per_unit: u32, unit: i32) -> Result<Limit, DecideError> {
        let unit = match RateLimitUnit::try_from(unit) {
            Ok(RateLimitUnit::Second) => Unit::Second,
            Ok(RateLimitUnit::Minute) => Unit::Minute,
            Ok(RateLimitUnit::Hour) => Unit::Hour,
            Ok(RateLimitUnit::Day) => Unit::Day,
            Ok(RateLimitUnit::Month) => Unit::Month,
            Ok(RateLimitUnit::Year) => Unit::Year,
            Ok(RateLimitUnit::Unknown) | Err(_) => {
                return Err(DecideError::InvalidArgument(format!(
                    "descriptor limit override has an unknown unit ({unit})"
                )));
            }
        };
        Ok(Limit {
            requests_per_unit,
            unit,
            window_ns: unit.seconds() * 1_000_000_000,
            algorithm: self.defaults.algorithm,
            precision: self.defaults.precision,
            burst: requests_per_unit,
            name: None,
        })
    }
}

fn entries(d: &RateLimitDescriptor) -> impl Iterator<Item = (&str, &str)> {
    d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))
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

/// The hits a descriptor asks for: its own `hits_addend` if set (0 = check only), else the
/// request's (0 = 1); `is_negative_hits` gives them back instead.
fn hits(req: &RateLimitRequest, d: &RateLimitDescriptor) -> Hits {
    let n = match &d.hits_addend {
        Some(own) => own.value,
        None => u64::from(req.hits_addend.max(1)),
    };
    match (n, d.is_negative_hits) {
        (0, _) => Hits::Check,
        (n, true) => Hits::Refund(n),
        (n, false) => Hits::Consume(n),
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        ..Default::default()
    }
}

fn limited_status(limits: &[Limit], outcome: Outcome, shadow_mode: bool) -> DescriptorStatus {
    let Some(limit) = limits.get(outcome.limit_index) else {
        return ok_status();
    };
    let d = outcome.decision;
    DescriptorStatus {
        code: if d.admitted || shadow_mode {
            Code::Ok
        } else {
            Code::OverLimit
        }
        .into(),
        current_limit: Some(RateLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: limit.requests_per_unit,
            unit: proto_unit(limit.unit).into(),
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(d.reset_ns)),
        ..Default::default()
    }
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

fn duration(ns: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ns / 1_000_000_000).unwrap_or(i64::MAX),
        // Below 1e9, so it fits.
        nanos: (ns % 1_000_000_000) as i32,
    }
}

#[cfg(test)]
mod tests;
