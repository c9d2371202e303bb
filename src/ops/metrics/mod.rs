//! Prometheus metrics: the reference service's series under their exact names, plus ours.
//!
//! Per-rule handles are resolved when rules are installed ([`RuleMetrics`] is the core's
//! recorder), so the request path only increments atomics; the store's figures are read
//! from its snapshot at scrape time.

mod detailed;
mod in_flight;
mod rlqs;
mod rules;
mod store;
pub(crate) mod top;
pub(crate) mod types;
mod xds;

use self::rules::DescriptorFamilies;
use self::store::StoreCollector;
use self::xds::XdsCollector;
use crate::ops::unmatched::Unmatched;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use tollgate_core::Store;

pub(crate) use self::rlqs::RlqsMetrics;
pub(crate) use self::rules::RuleMetrics;
pub(crate) use self::types::{AtomicHistogram, PlainCounter};
pub(crate) use self::xds::XdsStats;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    err_type: &'static str,
}

/// Why a rate-limit request got no answer: the reference's `err_type` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// No rules loaded yet.
    NoConfig,
    /// The request was malformed.
    InvalidArgument,
    /// The counter store failed.
    Store,
}

impl ErrorKind {
    fn label(self) -> &'static str {
        match self {
            Self::NoConfig => "no_config",
            Self::InvalidArgument => "invalid_argument",
            Self::Store => "store",
        }
    }
}

/// Request-level metrics and the registry that exports everything.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) config_load_success: PlainCounter,
    pub(crate) config_load_error: PlainCounter,
    /// How many runtime overrides are in force.
    pub(crate) overrides: Gauge,
    /// `total_requests` of ShouldRateLimit, resolved once.
    should_rate_limit: PlainCounter,
    errors: Family<ErrorLabels, PlainCounter>,
    pub(crate) response_time: AtomicHistogram,
    pub(crate) rlqs: RlqsMetrics,
}

impl Metrics {
    /// The registry, and the recorder of per-descriptor series registered in it; a
    /// `detailed_metric` rule keeps at most `detailed_cap` label sets.
    pub(crate) fn new(near_ratio: f64, detailed_cap: usize) -> (Self, RuleMetrics) {
        let mut registry = Registry::default();
        let families = DescriptorFamilies::default();
        let d = &families;
        for (name, help, family) in [
            (
                "total_hits",
                "Hits (hits_addend) asked of a rule's descriptor, admitted or not",
                &d.total_hits,
            ),
            (
                "over_limit",
                "Hits over a rule's limit: denied, or admitted by a shadow-mode rule",
                &d.over_limit,
            ),
            (
                "near_limit",
                "Admitted hits that took a rule's count above NEAR_LIMIT_RATIO of its limit",
                &d.near_limit,
            ),
            (
                "within_limit",
                "Hits a rule's limit admitted",
                &d.within_limit,
            ),
            (
                "shadow_mode",
                "Hits over the limit of a shadow-mode rule, admitted because it only reports",
                &d.shadow_mode,
            ),
        ] {
            registry.register(
                format!("ratelimit_service_rate_limit_{name}"),
                help,
                family.clone(),
            );
        }
        registry.register(
            "tollgate_budget_overspend_total",
            "Units charged to a budget past its limit (usage reported after the fact)",
            families.overspend.clone(),
        );
        families.in_flight.register(&mut registry);
        let config_load_success = PlainCounter::default();
        let config_load_error = PlainCounter::default();
        registry.register(
            "ratelimit_service_config_load_success",
            "Rules loads that succeeded",
            config_load_success.clone(),
        );
        registry.register(
            "ratelimit_service_config_load_error",
            "Rules loads that failed; the previous rules kept serving",
            config_load_error.clone(),
        );
        let overrides = Gauge::default();
        registry.register(
            "tollgate_overrides",
            "Runtime overrides in force (PUT /overrides)",
            overrides.clone(),
        );
        let total_requests = Family::<MethodLabels, PlainCounter>::default();
        registry.register(
            "ratelimit_service_total_requests",
            "Rate-limit requests received",
            total_requests.clone(),
        );
        let errors = Family::<ErrorLabels, PlainCounter>::default();
        registry.register(
            "ratelimit_service_should_rate_limit_error",
            "Rate-limit requests answered with an error",
            errors.clone(),
        );
        // 10 µs to ~0.3 s.
        let response_time = AtomicHistogram::new(0.000_01, 15);
        registry.register(
            "ratelimit_service_response_time_seconds",
            "Time to decide one rate-limit request",
            response_time.clone(),
        );
        let should_rate_limit = total_requests
            .get_or_create(&MethodLabels {
                grpc_method: "ShouldRateLimit".to_owned(),
            })
            .clone();
        let rlqs = RlqsMetrics::default();
        rlqs.register(&mut registry);
        let unmatched = Unmatched::default();
        unmatched.register(&mut registry);
        let metrics = Self {
            registry,
            rlqs,
            config_load_success,
            config_load_error,
            overrides,
            should_rate_limit,
            errors,
            response_time,
        };
        let rules = RuleMetrics {
            families,
            unmatched,
            near_ratio,
            detailed_cap,
        };
        (metrics, rules)
    }

    /// Adds the xDS stream's figures, read at every scrape.
    pub(crate) fn watch_xds(&mut self, stats: Arc<XdsStats>) {
        self.registry
            .register_collector(Box::new(XdsCollector(stats)));
    }

    /// Adds the store's own figures, read at every scrape.
    pub(crate) fn watch_store(&mut self, store: Store) {
        self.registry
            .register_collector(Box::new(StoreCollector(store)));
    }

    /// Counts one ShouldRateLimit call (gRPC or /json, as the reference counts them).
    pub(crate) fn request(&self) {
        self.should_rate_limit.inc_by(1);
    }

    /// Counts one request answered with an error of `kind`.
    pub(crate) fn error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&ErrorLabels {
                err_type: kind.label(),
            })
            .inc_by(1);
    }

    /// Every metric in the Prometheus text format (0.0.4), the reference's: the
    /// OpenMetrics text without its `# EOF`, since every counter is named in full.
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)?;
        Ok(out)
    }
}
