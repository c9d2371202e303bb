//! A latency histogram updated with atomics only, so the request path takes no lock; read
//! as a [`HistogramSnapshot`] by whoever exports it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counts of durations in buckets that double from the first bound.
#[derive(Debug)]
pub struct Histogram {
    bounds: Box<[f64]>,
    /// One count per bound, plus the +Inf bucket.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A histogram as read at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, observations in this bucket alone), ending with +Inf.
    pub buckets: Vec<(f64, u64)>,
    /// Observations.
    pub count: u64,
    /// Sum of observations, in seconds.
    pub sum_seconds: f64,
}

impl Histogram {
    /// Buckets from `first` seconds, doubling `buckets` times.
    pub fn new(first: f64, buckets: u16) -> Self {
        let bounds: Box<[f64]> = (0..buckets)
            .map(|i| first * 2f64.powi(i32::from(i)))
            .collect();
        Self {
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds,
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Counts one duration.
    pub fn observe(&self, d: Duration) {
        let i = self.bounds.partition_point(|b| *b < d.as_secs_f64());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = crate::clock::nanos_of(d);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets = self
            .bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter())
            .map(|(bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        HistogramSnapshot {
            buckets,
            count: self.count.load(Ordering::Relaxed),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_buckets() {
        let h = Histogram::new(0.001, 3);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_micros(1_500));
        h.observe(Duration::from_secs(1));
        let s = h.snapshot();
        assert_eq!(
            s.buckets,
            [(0.001, 1), (0.002, 1), (0.004, 0), (f64::INFINITY, 1)]
        );
        assert_eq!(s.count, 3);
        assert!((s.sum_seconds - 1.002).abs() < 1e-9);
    }
}
