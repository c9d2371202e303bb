//! The metric types the registry exports beyond the library's: counters under their exact
//! names, and the core's lock-free histogram.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Histogram, HistogramSnapshot};

/// A counter exposed under exactly the name it is registered with: the reference's series
/// (e.g. `…_rate_limit_total_hits`) have no `_total`, and dashboards query those names.
/// The page is the Prometheus text format, where a counter may be named so.
#[derive(Debug, Clone, Default)]
pub(crate) struct PlainCounter(Counter);

impl PlainCounter {
    pub(crate) fn inc_by(&self, n: u64) {
        self.0.inc_by(n);
    }

    pub(crate) fn inc(&self) {
        self.0.inc();
    }
}

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encode_plain_counter(self.0.get(), encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// One counter sample under the family's own name (prometheus-client's counters append
/// `_total`; ours are registered with it where they want it).
pub(super) fn encode_plain_counter(value: u64, mut encoder: MetricEncoder) -> std::fmt::Result {
    encoder.encode_gauge(&value)
}

/// The core's lock-free histogram, shared by clones and exported as a Prometheus histogram.
#[derive(Debug, Clone)]
pub(crate) struct AtomicHistogram(Arc<Histogram>);

impl AtomicHistogram {
    /// Buckets from `first` seconds, doubling `buckets` times.
    pub(super) fn new(first: f64, buckets: u16) -> Self {
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

pub(super) fn encode_histogram(
    h: &HistogramSnapshot,
    mut encoder: MetricEncoder,
) -> std::fmt::Result {
    encoder.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &h.buckets, None)
}
