//! Per-rule series: the reference's per-descriptor counters, recorded by [`RuleMetrics`],
//! the core's recorder, through handles resolved when rules are installed.

use super::detailed::ByValue;
use super::in_flight::{InFlightFamilies, InFlightStats};
use super::types::PlainCounter;
use crate::ops::unmatched::Unmatched;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use tollgate_core::{Descriptor, Limited, NoMatch, Recorder, Rule};

/// The reference's per-descriptor labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DescriptorLabels {
    pub(super) domain: String,
    pub(super) key1: String,
    pub(super) key2: String,
}

impl DescriptorLabels {
    /// The reference's labels for a descriptor: its domain, its first level as `key` or
    /// `key_value`, and the levels below joined with dots.
    pub(super) fn new(domain: &str, names: &[String]) -> Self {
        Self {
            domain: domain.to_owned(),
            key1: names.first().cloned().unwrap_or_default(),
            key2: names
                .get(1..)
                .map(|rest| rest.join("."))
                .unwrap_or_default(),
        }
    }
}

/// The per-descriptor counter families.
#[derive(Debug, Clone, Default)]
pub(super) struct DescriptorFamilies {
    pub(super) total_hits: Family<DescriptorLabels, PlainCounter>,
    pub(super) over_limit: Family<DescriptorLabels, PlainCounter>,
    pub(super) near_limit: Family<DescriptorLabels, PlainCounter>,
    pub(super) within_limit: Family<DescriptorLabels, PlainCounter>,
    pub(super) shadow_mode: Family<DescriptorLabels, PlainCounter>,
    pub(super) overspend: Family<DescriptorLabels, PlainCounter>,
    pub(super) in_flight: InFlightFamilies,
}

impl DescriptorFamilies {
    /// The handles of one label set; the in-flight ones only for an in-flight rule.
    pub(super) fn stats(&self, labels: &DescriptorLabels, in_flight: bool) -> DescriptorStats {
        DescriptorStats {
            in_flight: in_flight.then(|| self.in_flight.stats(labels)),
            total_hits: self.total_hits.get_or_create(labels).clone(),
            over_limit: self.over_limit.get_or_create(labels).clone(),
            near_limit: self.near_limit.get_or_create(labels).clone(),
            within_limit: self.within_limit.get_or_create(labels).clone(),
            shadow_mode: self.shadow_mode.get_or_create(labels).clone(),
            overspend: self.overspend.get_or_create(labels).clone(),
        }
    }
}

/// The counters of one descriptor (one rule, or one request value of a detailed rule).
#[derive(Debug, Clone, Default)]
pub(crate) struct DescriptorStats {
    pub(super) total_hits: PlainCounter,
    pub(super) over_limit: PlainCounter,
    pub(super) near_limit: PlainCounter,
    pub(super) within_limit: PlainCounter,
    pub(super) shadow_mode: PlainCounter,
    /// Units charged past a budget's limit (ours).
    pub(super) overspend: PlainCounter,
    /// Slots of an in-flight rule (ours).
    pub(super) in_flight: Option<InFlightStats>,
}

impl DescriptorStats {
    /// Counts one decision the way the reference does: hits above `near_ratio × limit`
    /// are near the limit.
    pub(super) fn record(&self, outcome: &Limited, charged: bool, near_ratio: f64) {
        if let (Some(stats), Some(slots)) = (&self.in_flight, outcome.in_flight) {
            stats.record(outcome, slots);
        }
        let hits = outcome.hits;
        self.total_hits.inc_by(hits);
        if !outcome.admitted {
            // A denied budget charge is recorded anyway: what went past the limit.
            if charged {
                self.overspend
                    .inc_by(hits.saturating_sub(outcome.remaining));
            }
            self.over_limit.inc_by(hits);
            if outcome.shadow {
                self.shadow_mode.inc_by(hits);
            }
            return;
        }
        self.within_limit.inc_by(hits);
        let limit = u64::from(outcome.limit.requests_per_unit());
        let threshold = (limit as f64 * near_ratio).floor() as u64;
        let after = limit.saturating_sub(outcome.remaining);
        let before = after.saturating_sub(hits);
        if after > threshold {
            self.near_limit.inc_by(after - before.max(threshold));
        }
    }
}

/// What a rule counts into: its own series, or for a `detailed_metric` rule one series per
/// request value, up to a cap past which values share one `key2="other"` series.
pub(crate) enum RuleStats {
    Fixed(DescriptorStats),
    Detailed {
        by_value: ByValue<DescriptorStats>,
        overflow: DescriptorStats,
    },
}

/// The core's recorder: per-descriptor series of the reference, and descriptors no rule
/// matched.
pub(crate) struct RuleMetrics {
    pub(super) families: DescriptorFamilies,
    pub(super) unmatched: Unmatched,
    pub(super) near_ratio: f64,
    pub(super) detailed_cap: usize,
}

impl Recorder for RuleMetrics {
    type Rule = RuleStats;

    fn prepare(&self, rule: &Rule) -> RuleStats {
        let labels = DescriptorLabels::new(rule.domain(), rule.path());
        if !rule.detailed_metric() {
            return RuleStats::Fixed(self.families.stats(&labels, rule.in_flight()));
        }
        let overflow = DescriptorLabels {
            key2: "other".into(),
            ..labels
        };
        RuleStats::Detailed {
            by_value: ByValue::new(self.detailed_cap),
            overflow: self.families.stats(&overflow, rule.in_flight()),
        }
    }

    fn record(
        &self,
        rule: &Rule,
        stats: &RuleStats,
        descriptor: &Descriptor<'_>,
        outcome: &Limited,
    ) {
        match stats {
            RuleStats::Fixed(s) => s.record(outcome, rule.charged(), self.near_ratio),
            RuleStats::Detailed { by_value, overflow } => {
                let names = || {
                    let pairs = descriptor.pairs().enumerate();
                    pairs.map(|(i, (k, v))| (k, rule.key_value(i, v)))
                };
                let make = || {
                    let names: Vec<String> = names().map(|(k, v)| format!("{k}_{v}")).collect();
                    let labels = DescriptorLabels::new(rule.domain(), &names);
                    self.families.stats(&labels, rule.in_flight())
                };
                let stats = by_value.get(names, make).unwrap_or(overflow);
                stats.record(outcome, rule.charged(), self.near_ratio);
            }
        }
    }

    fn unmatched(&self, domain: &str, descriptor: &Descriptor<'_>, why: NoMatch) {
        self.unmatched.record(domain, descriptor, why);
    }
}
