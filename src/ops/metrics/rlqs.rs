//! The Rate Limit Quota Service's series.

use super::rules::DescriptorLabels;
use super::types::PlainCounter;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tollgate_core::Rule;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
}

/// The Rate Limit Quota Service's series.
#[derive(Debug, Clone, Default)]
pub(crate) struct RlqsMetrics {
    pub(crate) streams: Gauge,
    pub(crate) buckets: Gauge,
    pub(crate) reports: PlainCounter,
    pub(super) assignments: Family<KindLabels, PlainCounter>,
    pub(super) allowed: Family<DescriptorLabels, PlainCounter>,
    pub(super) denied: Family<DescriptorLabels, PlainCounter>,
    pub(super) over_limit: Family<DescriptorLabels, PlainCounter>,
    pub(super) gap: Family<DescriptorLabels, Gauge>,
}

impl RlqsMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "tollgate_rlqs_streams",
            "Open StreamRateLimitQuotas streams",
            self.streams.clone(),
        );
        r.register(
            "tollgate_rlqs_buckets",
            "Buckets some stream reports",
            self.buckets.clone(),
        );
        r.register(
            "tollgate_rlqs_reports_total",
            "Usage reports received",
            self.reports.clone(),
        );
        r.register(
            "tollgate_rlqs_assignments_total",
            "Bucket actions sent, by kind (allow_all, deny_all, token_bucket, abandon)",
            self.assignments.clone(),
        );
        r.register(
            "tollgate_rlqs_usage_allowed_total",
            "Requests Envoys reported admitted, per rule",
            self.allowed.clone(),
        );
        r.register(
            "tollgate_rlqs_usage_denied_total",
            "Requests Envoys reported denied, per rule",
            self.denied.clone(),
        );
        r.register(
            "tollgate_rlqs_over_limit_total",
            "Reported admissions that did not fit the limit when charged, per rule",
            self.over_limit.clone(),
        );
        r.register(
            "tollgate_rlqs_limit_gap",
            "Room left on the rule's counter at its latest report",
            self.gap.clone(),
        );
    }

    /// Counts one bucket action sent.
    pub(crate) fn assignment(&self, kind: &'static str) {
        self.assignments.get_or_create(&KindLabels { kind }).inc();
    }

    /// One report's usage under `rule`: `over` of the allowed did not fit; `gap` units of
    /// the limit are left.
    pub(crate) fn usage(&self, rule: &Rule, allowed: u64, denied: u64, over: u64, gap: u64) {
        let labels = DescriptorLabels::new(rule.domain(), rule.path());
        self.allowed.get_or_create(&labels).inc_by(allowed);
        self.denied.get_or_create(&labels).inc_by(denied);
        self.over_limit.get_or_create(&labels).inc_by(over);
        self.gap
            .get_or_create(&labels)
            .set(i64::try_from(gap).unwrap_or(i64::MAX));
    }
}
