//! Prometheus metrics: the reference service's series under their exact names, plus ours.
//!
//! Per-rule handles are resolved when rules are installed ([`RuleMetrics`] is the core's
//! recorder), so the request path only increments atomics; the store's figures are read
//! from its snapshot at scrape time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use tollgate_core::{Descriptor, Histogram, HistogramSnapshot, Limited, Recorder, Rule, Store};

/// A counter exposed under its exact name, without the `_total` that OpenMetrics counters
/// get: the reference's statsd-mapped series (e.g. `…_rate_limit_total_hits`) have none, and
/// existing dashboards query those names.
#[derive(Debug, Clone, Default)]
pub(crate) struct PlainCounter(Counter);

impl PlainCounter {
    pub(crate) fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }
}

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// The core's lock-free histogram, shared by clones and exported as a Prometheus histogram.
#[derive(Debug, Clone)]
pub(crate) struct AtomicHistogram(Arc<Histogram>);

impl AtomicHistogram {
    /// Buckets from `first` seconds, doubling `buckets` times.
    fn new(first: f64, buckets: u16) -> Self {
        Self(Arc::new(Histogram::new(first, buckets)))
    }

    pub(crate) fn observe(&self, d: Duration) {
        self.0.observe(d);
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encode_histogram(&self.0.snapshot(), encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn encode_histogram(h: &HistogramSnapshot, mut encoder: MetricEncoder) -> std::fmt::Result {
    encoder.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)
}

/// The reference's per-descriptor labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DescriptorLabels {
    domain: String,
    key1: String,
    key2: String,
}

impl DescriptorLabels {
    /// The reference's labels for a descriptor: its domain, its first level as `key` or
    /// `key_value`, and the levels below joined with dots.
    fn new(domain: &str, names: &[String]) -> Self {
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

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    grpc_method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    err_type: String,
}

/// The per-descriptor counter families.
#[derive(Debug, Clone, Default)]
struct DescriptorFamilies {
    total_hits: Family<DescriptorLabels, PlainCounter>,
    over_limit: Family<DescriptorLabels, PlainCounter>,
    near_limit: Family<DescriptorLabels, PlainCounter>,
    within_limit: Family<DescriptorLabels, PlainCounter>,
    shadow_mode: Family<DescriptorLabels, PlainCounter>,
    overspend: Family<DescriptorLabels, Counter>,
}

impl DescriptorFamilies {
    /// The handles of one label set.
    fn stats(&self, labels: &DescriptorLabels) -> DescriptorStats {
        DescriptorStats {
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
    total_hits: PlainCounter,
    over_limit: PlainCounter,
    near_limit: PlainCounter,
    within_limit: PlainCounter,
    shadow_mode: PlainCounter,
    /// Units charged past a budget's limit (ours).
    overspend: Counter,
}

impl DescriptorStats {
    /// Counts one decision the way the reference does: hits above `near_ratio × limit`
    /// are near the limit.
    fn record(&self, outcome: &Limited, budget: bool, near_ratio: f64) {
        let hits = outcome.hits;
        self.total_hits.inc_by(hits);
        if !outcome.admitted {
            // A denied budget charge is recorded anyway: what went past the limit.
            if budget {
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
        by_value: Mutex<HashMap<DescriptorLabels, DescriptorStats>>,
        overflow: DescriptorStats,
    },
}

/// The core's recorder: per-descriptor series of the reference.
pub(crate) struct RuleMetrics {
    families: DescriptorFamilies,
    near_ratio: f64,
    detailed_cap: usize,
}

impl Recorder for RuleMetrics {
    type Rule = RuleStats;

    fn prepare(&self, rule: &Rule) -> RuleStats {
        let labels = DescriptorLabels::new(rule.domain(), rule.path());
        if !rule.detailed_metric() {
            return RuleStats::Fixed(self.families.stats(&labels));
        }
        let overflow = DescriptorLabels {
            key2: "other".into(),
            ..labels
        };
        RuleStats::Detailed {
            by_value: Mutex::default(),
            overflow: self.families.stats(&overflow),
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
            RuleStats::Fixed(s) => s.record(outcome, rule.budget(), self.near_ratio),
            RuleStats::Detailed { by_value, overflow } => {
                let names: Vec<String> = descriptor
                    .pairs()
                    .enumerate()
                    .map(|(i, (k, v))| format!("{k}_{}", rule.key_value(i, v)))
                    .collect();
                let labels = DescriptorLabels::new(rule.domain(), &names);
                let mut seen = by_value.lock().unwrap_or_else(|p| p.into_inner());
                let room = seen.len() < self.detailed_cap;
                let stats = match seen.get(&labels) {
                    Some(s) => s,
                    None if room => seen
                        .entry(labels.clone())
                        .or_insert_with(|| self.families.stats(&labels)),
                    None => overflow,
                };
                stats.record(outcome, rule.budget(), self.near_ratio);
            }
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// The Rate Limit Quota Service's series.
#[derive(Debug, Clone, Default)]
pub(crate) struct RlqsMetrics {
    pub(crate) streams: Gauge,
    pub(crate) buckets: Gauge,
    pub(crate) reports: Counter,
    assignments: Family<KindLabels, Counter>,
    allowed: Family<DescriptorLabels, Counter>,
    denied: Family<DescriptorLabels, Counter>,
    over_limit: Family<DescriptorLabels, Counter>,
    gap: Family<DescriptorLabels, Gauge>,
}

impl RlqsMetrics {
    fn register(&self, registry: &mut Registry) {
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
            "tollgate_rlqs_reports",
            "Usage reports received",
            self.reports.clone(),
        );
        r.register(
            "tollgate_rlqs_assignments",
            "Bucket actions sent, by kind (allow_all, deny_all, token_bucket, abandon)",
            self.assignments.clone(),
        );
        r.register(
            "tollgate_rlqs_usage_allowed",
            "Requests Envoys reported admitted, per rule",
            self.allowed.clone(),
        );
        r.register(
            "tollgate_rlqs_usage_denied",
            "Requests Envoys reported denied, per rule",
            self.denied.clone(),
        );
        r.register(
            "tollgate_rlqs_over_limit",
            "Reported admissions beyond their grants that did not fit the limit when counted, per rule",
            self.over_limit.clone(),
        );
        r.register(
            "tollgate_rlqs_limit_gap",
            "Room neither counted nor granted at the rule's latest report",
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

/// Request-level metrics and the registry that exports everything.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) config_load_success: PlainCounter,
    pub(crate) config_load_error: PlainCounter,
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
        for (name, family) in [
            ("total_hits", &d.total_hits),
            ("over_limit", &d.over_limit),
            ("near_limit", &d.near_limit),
            ("within_limit", &d.within_limit),
            ("shadow_mode", &d.shadow_mode),
        ] {
            let help = format!("Hits of a descriptor that were {}", name.replace('_', " "));
            registry.register(
                format!("ratelimit_service_rate_limit_{name}"),
                help,
                family.clone(),
            );
        }
        registry.register(
            "tollgate_budget_overspend",
            "Units charged to a budget past its limit (usage reported after the fact)",
            families.overspend.clone(),
        );
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
        let metrics = Self {
            registry,
            rlqs,
            config_load_success,
            config_load_error,
            should_rate_limit,
            errors,
            response_time,
        };
        let rules = RuleMetrics {
            families,
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

    pub(crate) fn error(&self, err_type: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                err_type: err_type.to_owned(),
            })
            .inc_by(1);
    }

    /// The OpenMetrics text of every metric.
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Store internals, read when scraped.
#[derive(Debug)]
struct StoreCollector(Store);

impl prometheus_client::collector::Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64| {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(metric)
        };
        let counter = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64| {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(metric)
        };
        let stats = self.0.stats();
        let entries = i64::try_from(stats.counters).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "tollgate_counters",
            "Counters held in memory (the local view for a shared store)",
            entries,
        )?;
        gauge(
            &mut encoder,
            "tollgate_counter_bytes",
            "Bytes the counters take in memory (bounded by --max-counter-memory)",
            i64::try_from(stats.bytes).unwrap_or(i64::MAX),
        )?;
        counter(
            &mut encoder,
            "tollgate_counter_evictions",
            "Counters evicted to stay under --max-counters and --max-counter-memory",
            stats.evictions,
        )?;
        counter(
            &mut encoder,
            "tollgate_counters_expired",
            "Counters dropped after their windows passed",
            stats.expired,
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_up",
            "1 while the counter store answers",
            i64::from(stats.up),
        )?;
        let Some(s) = stats.shared else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "tollgate_store_round_trips",
                "Requests decided by a round trip to the shared store",
                s.round_trips,
            ),
            (
                "tollgate_local_denials",
                "Requests denied from the local view, without a round trip",
                s.local_denials,
            ),
            (
                "tollgate_store_fallbacks",
                "Requests decided per --on-store-error",
                s.fallbacks,
            ),
            (
                "tollgate_store_refreshes",
                "Background reads of counters the local view denies",
                s.refreshes,
            ),
            (
                "tollgate_store_reconnects",
                "Times the store connection came up",
                s.reconnects,
            ),
            (
                "tollgate_store_disagreements",
                "Round trips where the store and the local algorithm decided differently (the store decided)",
                s.disagreements,
            ),
            (
                "tollgate_store_debt_charged",
                "Units admitted without the store that were then counted in it",
                s.debt_charged,
            ),
            (
                "tollgate_store_debt_forgiven",
                "Units admitted without the store and never counted in it: their windows passed first, or too many counters owed at once",
                s.debt_forgiven,
            ),
            (
                "tollgate_store_lease_taken",
                "Blocks of units hot counters leased from the shared store",
                s.leases_taken,
            ),
            (
                "tollgate_store_lease_units_leased",
                "Units in leased blocks, counted in the shared store when taken",
                s.lease_units_leased,
            ),
            (
                "tollgate_store_lease_units_returned",
                "Leased units not spent and given back to the shared store",
                s.lease_units_returned,
            ),
            (
                "tollgate_store_lease_local_admissions",
                "Requests admitted from a leased block, without a round trip",
                s.lease_local_admissions,
            ),
        ] {
            counter(&mut encoder, name, help, value)?;
        }
        gauge(
            &mut encoder,
            "tollgate_store_debts",
            "Counters owing the store units admitted without it",
            i64::try_from(s.debts).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_debt_units",
            "Units admitted without the store and not yet counted in it",
            i64::try_from(s.debt_units).unwrap_or(i64::MAX),
        )?;
        let mut metric = encoder.encode_descriptor(
            "tollgate_store_errors",
            "Store failures by kind",
            None,
            MetricType::Counter,
        )?;
        for (kind, value) in [
            ("timeout", s.timeouts),
            ("connection", s.connection_errors),
            ("script", s.script_errors),
        ] {
            let labels = [("kind", kind)];
            let family = metric.encode_family(&labels)?;
            ConstCounter::new(value).encode(family)?;
        }
        let metric = encoder.encode_descriptor(
            "tollgate_store_round_trip_seconds",
            "Latency of round trips to the shared store",
            None,
            MetricType::Histogram,
        )?;
        encode_histogram(&s.latency, metric)
    }
}

/// The xDS stream as the client sees it, updated by the client and read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct XdsStats {
    connected: AtomicBool,
    nacks: AtomicU64,
    reconnects: AtomicU64,
    /// The last version accepted and when.
    acked: Mutex<Option<(String, Instant)>>,
}

impl XdsStats {
    /// A stream opened (`again`: not the first one) or closed.
    pub(crate) fn connected(&self, up: bool, again: bool) {
        self.connected.store(up, Ordering::Relaxed);
        if up && again {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn nacked(&self) {
        self.nacks.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn acked(&self, version: &str, at: Instant) {
        *self.acked.lock().unwrap_or_else(|p| p.into_inner()) = Some((version.to_owned(), at));
    }
}

/// [`XdsStats`] in Prometheus form.
#[derive(Debug)]
struct XdsCollector(Arc<XdsStats>);

impl prometheus_client::collector::Collector for XdsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.0;
        let metric = encoder.encode_descriptor(
            "tollgate_xds_connected",
            "1 while the stream to the xDS management server is open",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(s.connected.load(Ordering::Relaxed))).encode(metric)?;
        for (name, help, value) in [
            (
                "tollgate_xds_nacks",
                "xDS responses rejected (NACKed); the previous rules kept serving",
                &s.nacks,
            ),
            (
                "tollgate_xds_reconnects",
                "Streams to the xDS management server opened again after one ended",
                &s.reconnects,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value.load(Ordering::Relaxed)).encode(metric)?;
        }
        let acked = s.acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some((version, at)) = acked else {
            return Ok(());
        };
        let mut metric = encoder.encode_descriptor(
            "tollgate_xds_config_info",
            "The version of the xDS rules in force (last ACKed), as a label",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("version", version.as_str())];
        ConstGauge::new(1).encode(metric.encode_family(&labels)?)?;
        let metric = encoder.encode_descriptor(
            "tollgate_xds_seconds_since_update",
            "Seconds since the xDS rules in force were accepted",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(at.elapsed().as_secs_f64()).encode(metric)
    }
}
