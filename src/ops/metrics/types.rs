//! The metric types the registry exports beyond the library's: counters under their exact
//! names, and the core's lock-free histogram.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tollgate_core::{Histogram, HistogramSnapshot};

/// A counter exposed under exactly the name it is registered with: the reference's series
/// (e.g. `…_rate_limit_total_hits`) have no `_total`, and dashboards query those names.
/// The page is the Prometheus text format, where a counter may be named so.
#[derive(Debug, Clone, Default)]
pub(crate) struct PlainCounter(Counter);

impl PlainCounter {
    /// Adds `n`, holding at u64::MAX: a counter that wrapped would read as a reset to
    /// Prometheus (units reported by clients have no bound).
    pub(crate) fn inc_by(&self, n: u64) {
        // The closure always returns Some: the update cannot fail.
        let _ = self
            .0
            .inner()
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
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

#[cfg(test)]
mod tests {
    use super::PlainCounter;

    #[test]
    fn a_counter_holds_at_its_largest_value_rather_than_wrap() {
        let counter = PlainCounter::default();
        counter.inc_by(1 << 63);
        counter.inc_by(1 << 63);
        counter.inc_by(7);
        assert_eq!(counter.0.get(), u64::MAX);
    }
}
