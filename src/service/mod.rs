//! The one decision core: a `RateLimitRequest` in, a `RateLimitResponse` out.
//!
//! gRPC and HTTP `/json` are thin adapters over [`Service::decide`].

pub mod grpc;
pub mod headers;
pub mod json;
mod status;
mod validate;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use futures_util::future::join_all;

use self::headers::HeaderStyle;
use crate::config::{Defaults, Policy, Rule, Rules, metric_labels};
use crate::key::write_counter_key;
use crate::limiter::{Hits, Limit, Unit};
use crate::metrics::{DescriptorStats, Metrics};
use crate::store::{Store, StoreError};

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideError {
    /// The request is malformed; the text says how.
    InvalidArgument(String),
    /// The counter store failed.
    Store(StoreError),
}

/// How the service answers, beyond what rules say.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub defaults: Defaults,
    /// Hits above this fraction of a limit count as near the limit.
    pub near_limit_ratio: f64,
    /// Never deny: the overall code is OK, statuses still tell the truth.
    pub global_shadow_mode: bool,
    pub headers: HeaderStyle,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            defaults: Defaults::default(),
            near_limit_ratio: 0.8,
            global_shadow_mode: false,
            headers: HeaderStyle::Off,
        }
    }
}

/// The rate-limit service: current rules, the counter store, metrics and options.
pub struct Service {
    rules: ArcSwap<Rules>,
    store: Store,
    metrics: Arc<Metrics>,
    options: Options,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// One descriptor resolved before counting.
enum Plan<'a> {
    NoLimit,
    Unlimited,
    /// Limits from a rule (or a request override) with what to count and where.
    Limited {
        limits: Cow<'a, [Limit]>,
        rule: Option<&'a Rule>,
        key: String,
        hits: Hits,
    },
}

impl Service {
    pub fn new(rules: Rules, store: Store, metrics: Arc<Metrics>, options: Options) -> Self {
        Self {
            rules: ArcSwap::from_pointee(rules),
            store,
            metrics,
            options,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The rules now serving.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// Serves `rules` from the next request on; requests in flight finish on the old ones.
    pub fn swap_rules(&self, rules: Rules) {
        self.rules.store(Arc::new(rules));
    }

    /// Decides one request, counting it in the request metrics.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, DecideError> {
        let started = Instant::now();
        self.metrics.request();
        let result = self.decide_uncounted(req).await;
        self.metrics.response_time.observe(started.elapsed());
        if let Err(e) = &result {
            self.metrics.error(match e {
                DecideError::InvalidArgument(_) => "invalid_argument",
                DecideError::Store(_) => "store",
            });
        }
        result
    }

    async fn decide_uncounted(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, DecideError> {
        validate::request(req).map_err(DecideError::InvalidArgument)?;
        let rules = self.rules.load_full();
        let domain = rules.domain(&req.domain);
        let matched: Vec<Option<&Rule>> = req
            .descriptors
            .iter()
            .map(|d| domain.and_then(|dom| dom.find(entries(d))))
            .collect();
        let plans = drop_replaced(matched)
            .into_iter()
            .zip(&req.descriptors)
            .map(|(rule, d)| self.plan(req, d, rule, domain.is_some()))
            .collect::<Result<Vec<_>, _>>()?;

        // Descriptors are independent counters: ask the store about all of them at once.
        let outcomes = join_all(plans.iter().map(|plan| async move {
            match plan {
                Plan::Limited {
                    limits, key, hits, ..
                } => Some(self.store.apply(key, limits, *hits).await),
                _ => None,
            }
        }))
        .await;

        let mut statuses = Vec::with_capacity(plans.len());
        for ((plan, outcome), descriptor) in plans.iter().zip(outcomes).zip(&req.descriptors) {
            let status = match (plan, outcome) {
                (Plan::NoLimit, _) => status::no_limit(),
                (Plan::Unlimited, _) => status::unlimited(),
                (
                    Plan::Limited {
                        limits, rule, hits, ..
                    },
                    Some(outcome),
                ) => {
                    let outcome = outcome.map_err(DecideError::Store)?;
                    let shadow = rule.is_some_and(|r| r.shadow_mode);
                    let status = status::limited(limits, outcome, shadow);
                    if let Some(rule) = rule {
                        let limit = limits
                            .get(outcome.limit_index)
                            .map_or(0, |l| l.requests_per_unit);
                        self.record(
                            rule,
                            &req.domain,
                            descriptor,
                            *hits,
                            limit,
                            &outcome.decision,
                        );
                    }
                    status
                }
                (Plan::Limited { .. }, None) => status::no_limit(),
            };
            statuses.push(status);
        }
        let over = statuses.iter().any(status::is_over) && !self.options.global_shadow_mode;
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            response_headers_to_add: headers::headers(self.options.headers, &statuses),
            statuses,
            ..Default::default()
        })
    }

    /// Resolves one descriptor: its matched rule, or the limit the request sent instead.
    fn plan<'a>(
        &self,
        req: &RateLimitRequest,
        descriptor: &RateLimitDescriptor,
        rule: Option<&'a Rule>,
        domain_known: bool,
    ) -> Result<Plan<'a>, DecideError> {
        let limits: Cow<'a, [Limit]>;
        let shape: Cow<'a, str>;
        if let Some(requested) = descriptor.limit.filter(|_| domain_known) {
            let limit = self.override_limit(requested.requests_per_unit, requested.unit)?;
            let mut own_shape = String::new();
            limit.write_shape(&mut own_shape);
            limits = vec![limit].into();
            shape = own_shape.into();
        } else {
            match rule.map(|r| &r.policy) {
                None => return Ok(Plan::NoLimit),
                Some(Policy::Unlimited { .. }) => return Ok(Plan::Unlimited),
                Some(Policy::Limited {
                    limits: l,
                    shape: s,
                }) => {
                    limits = l.as_slice().into();
                    shape = s.as_str().into();
                }
            }
        }
        let mut key = String::new();
        write_counter_key(&mut key, &req.domain, entries(descriptor), &shape);
        Ok(Plan::Limited {
            limits,
            rule,
            key,
            hits: hits(req, descriptor),
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
        let defaults = self.options.defaults;
        Ok(Limit {
            requests_per_unit,
            unit,
            window_ns: unit.seconds() * 1_000_000_000,
            algorithm: defaults.algorithm,
            precision: defaults.precision,
            burst: requests_per_unit,
            name: None,
        })
    }

    /// Counts a decision in the rule's metrics; detailed rules are labelled with the
    /// request's values, resolved here since they are not known before.
    fn record(
        &self,
        rule: &Rule,
        domain: &str,
        descriptor: &RateLimitDescriptor,
        hits: Hits,
        limit: u32,
        decision: &crate::limiter::Decision,
    ) {
        let n = match hits {
            Hits::Consume(n) => n,
            Hits::Check | Hits::Refund(_) => 0,
        };
        let detailed;
        let stats: &DescriptorStats = if rule.detailed_metric {
            let names: Vec<String> = entries(descriptor)
                .map(|(k, v)| format!("{k}_{v}"))
                .collect();
            detailed = self
                .metrics
                .descriptors
                .stats(&metric_labels(domain, &names));
            &detailed
        } else {
            &rule.stats
        };
        stats.record(
            n,
            u64::from(limit),
            decision.remaining,
            decision.admitted,
            rule.shadow_mode,
            self.options.near_limit_ratio,
        );
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

#[cfg(test)]
mod tests;
