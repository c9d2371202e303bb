//! The xDS stream's state, kept by the client and read at every scrape.

use super::types::encode_plain_counter;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tollgate_core::lock;

/// The xDS stream as the client sees it, updated by the client and read at scrape time.
#[derive(Debug, Default)]
pub(crate) struct XdsStats {
    pub(super) connected: AtomicBool,
    pub(super) nacks: AtomicU64,
    pub(super) reconnects: AtomicU64,
    /// The last version accepted and when.
    pub(super) acked: Mutex<Option<(String, Instant)>>,
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
        *lock(&self.acked) = Some((version.to_owned(), at));
    }
}

/// [`XdsStats`] in Prometheus form.
#[derive(Debug)]
pub(super) struct XdsCollector(pub(super) Arc<XdsStats>);

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
                "tollgate_xds_nacks_total",
                "xDS responses rejected (NACKed); the previous rules kept serving",
                &s.nacks,
            ),
            (
                "tollgate_xds_reconnects_total",
                "Streams to the xDS management server opened again after one ended",
                &s.reconnects,
            ),
        ] {
            let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            encode_plain_counter(value.load(Ordering::Relaxed), metric)?;
        }
        let acked = lock(&s.acked).clone();
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
