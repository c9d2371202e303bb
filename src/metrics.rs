//! Prometheus metrics: the reference service's series under their exact names, plus ours.
//!
//! Per-descriptor handles are resolved when rules load (see [`DescriptorStats`]), so the
//! request path only increments atomics; store internals are read at scrape time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::store::Store;

/// A counter exposed under its exact name, without the `_total` that OpenMetrics counters
/// get: the reference's statsd-mapped series (e.g. `…_rate_limit_total_hits`) have none, and
/// existing dashboards query those names.
#[derive(Debug, Clone, Default)]
pub struct PlainCounter(Counter);

impl PlainCounter {
    pub fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }

    pub fn get(&self) -> u64 {
        self.0.get()
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

/// A histogram updated with atomics only: the request path must not take a lock (the
/// crate's own histogram locks a mutex on every observation). Buckets double from `first`.
/// Clones share the counts.
#[derive(Debug, Clone)]
pub struct AtomicHistogram(Arc<HistogramCounts>);

#[derive(Debug)]
struct HistogramCounts {
    bounds: Vec<f64>,
    /// One count per bound, plus the +Inf bucket.
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl AtomicHistogram {
    pub fn new(first: f64, buckets: u16) -> Self {
        let bounds: Vec<f64> = (0..buckets)
            .map(|i| first * 2f64.powi(i32::from(i)))
            .collect();
        Self(Arc::new(HistogramCounts {
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds,
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }))
    }

    pub fn observe(&self, d: std::time::Duration) {
        let h = &self.0;
        let i = h.bounds.partition_point(|b| *b < d.as_secs_f64());
        h.buckets[i].fetch_add(1, Ordering::Relaxed);
        h.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        h.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &self.0;
        let buckets: Vec<(f64, u64)> = h
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(h.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let count = h.count.load(Ordering::Relaxed);
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The reference's per-descriptor labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DescriptorLabels {
    pub domain: String,
    pub key1: String,
    pub key2: String,
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
pub struct DescriptorFamilies {
    total_hits: Family<DescriptorLabels, PlainCounter>,
    over_limit: Family<DescriptorLabels, PlainCounter>,
    near_limit: Family<DescriptorLabels, PlainCounter>,
    within_limit: Family<DescriptorLabels, PlainCounter>,
    shadow_mode: Family<DescriptorLabels, PlainCounter>,
}

impl DescriptorFamilies {
    /// The handles of one label set.
    pub fn stats(&self, labels: &DescriptorLabels) -> DescriptorStats {
        DescriptorStats {
            total_hits: self.total_hits.get_or_create(labels).clone(),
            over_limit: self.over_limit.get_or_create(labels).clone(),
            near_limit: self.near_limit.get_or_create(labels).clone(),
            within_limit: self.within_limit.get_or_create(labels).clone(),
            shadow_mode: self.shadow_mode.get_or_create(labels).clone(),
        }
    }
}

/// The counters of one descriptor (one rule, or one request value of a detailed rule).
#[derive(Debug, Clone, Default)]
pub struct DescriptorStats {
    pub total_hits: PlainCounter,
    pub over_limit: PlainCounter,
    pub near_limit: PlainCounter,
    pub within_limit: PlainCounter,
    pub shadow_mode: PlainCounter,
}

impl DescriptorStats {
    /// Counts one decision of `hits` units under a limit of `limit` units that left
    /// `remaining`, the way the reference does: hits above `near_ratio × limit` are near.
    pub fn record(
        &self,
        hits: u64,
        limit: u64,
        remaining: u64,
        admitted: bool,
        shadow: bool,
        near_ratio: f64,
    ) {
        self.total_hits.inc_by(hits);
        if !admitted {
            self.over_limit.inc_by(hits);
            if shadow {
                self.shadow_mode.inc_by(hits);
            }
            return;
        }
        self.within_limit.inc_by(hits);
        let threshold = (limit as f64 * near_ratio).floor() as u64;
        let after = limit.saturating_sub(remaining);
        let before = after.saturating_sub(hits);
        if after > threshold {
            self.near_limit.inc_by(after - before.max(threshold));
        }
    }
}

/// Request-level metrics and the registry that exports everything.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub descriptors: DescriptorFamilies,
    pub config_load_success: PlainCounter,
    pub config_load_error: PlainCounter,
    /// `total_requests` of ShouldRateLimit, resolved once.
    should_rate_limit: PlainCounter,
    errors: Family<ErrorLabels, PlainCounter>,
    pub response_time: AtomicHistogram,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let descriptors = DescriptorFamilies::default();
        let d = &descriptors;
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
        Self {
            registry,
            descriptors,
            config_load_success,
            config_load_error,
            should_rate_limit,
            errors,
            response_time,
        }
    }

    /// Adds the store's own figures, read at every scrape.
    pub fn watch_store(&mut self, store: Store) {
        self.registry
            .register_collector(Box::new(StoreCollector(store)));
    }

    /// Counts one ShouldRateLimit call (gRPC or /json, as the reference counts them).
    pub fn request(&self) {
        self.should_rate_limit.inc_by(1);
    }

    pub fn error(&self, err_type: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                err_type: err_type.to_owned(),
            })
            .inc_by(1);
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
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
        let (shards, up) = match &self.0 {
            Store::Memory(m) => (m.stats(), true),
            Store::Redis(r) => (r.local_stats(), r.is_up()),
        };
        let entries = i64::try_from(shards.entries).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "tollgate_counters",
            "Counters held in memory (the local view for redis)",
            entries,
        )?;
        counter(
            &mut encoder,
            "tollgate_counter_evictions",
            "Counters evicted to stay under --max-counters",
            shards.evictions,
        )?;
        counter(
            &mut encoder,
            "tollgate_counters_expired",
            "Counters dropped after their windows passed",
            shards.expired,
        )?;
        gauge(
            &mut encoder,
            "tollgate_store_up",
            "1 while the counter store answers",
            i64::from(up),
        )?;
        let Store::Redis(r) = &self.0 else {
            return Ok(());
        };
        let s = &r.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        counter(
            &mut encoder,
            "tollgate_store_round_trips",
            "Requests decided by a Redis round trip",
            load(&s.round_trips),
        )?;
        counter(
            &mut encoder,
            "tollgate_local_denials",
            "Requests denied from the local view, without Redis",
            load(&s.local_denials),
        )?;
        counter(
            &mut encoder,
            "tollgate_store_fallbacks",
            "Requests decided per --on-store-error",
            load(&s.fallbacks),
        )?;
        counter(
            &mut encoder,
            "tollgate_store_refreshes",
            "Background reads of counters the local view denies",
            load(&s.refreshes),
        )?;
        counter(
            &mut encoder,
            "tollgate_store_reconnects",
            "Times the store connection came up",
            r.reconnects(),
        )?;
        let metric = encoder.encode_descriptor(
            "tollgate_store_errors",
            "Store failures by kind",
            None,
            MetricType::Counter,
        )?;
        let mut metric = metric;
        for (kind, value) in [
            ("timeout", load(&s.timeouts)),
            ("connection", load(&s.connection_errors)),
            ("script", load(&s.script_errors)),
        ] {
            let labels = [("kind", kind)];
            let family = metric.encode_family(&labels)?;
            ConstCounter::new(value).encode(family)?;
        }
        let metric = encoder.encode_descriptor(
            "tollgate_store_round_trip_seconds",
            "Latency of Redis round trips",
            None,
            MetricType::Histogram,
        )?;
        r.stats.latency.encode(metric)
    }
}
