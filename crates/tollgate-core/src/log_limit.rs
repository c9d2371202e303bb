//! One log line per period for an event that can repeat many times a second (a client
//! sending bad messages, a store refusing every call): the first line is logged, the
//! others are counted and their number reported with the next line logged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// At most one log line per period, the lines held back counted; shared by every task
/// that may log the event, so it works through `&self`.
#[derive(Debug)]
pub struct LogLimit {
    period_ns: u64,
    next_ns: AtomicU64,
    held: AtomicU64,
}

impl LogLimit {
    /// At most one line per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period_ns: u64::try_from(period.as_nanos()).unwrap_or(u64::MAX),
            next_ns: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// Whether to log at `now_ns` (the caller's clock): `Some(lines held back since the
    /// last one logged)`, or `None` to stay quiet.
    pub fn admit(&self, now_ns: u64) -> Option<u64> {
        let next = self.next_ns.load(Ordering::Relaxed);
        let due = now_ns.saturating_add(self.period_ns);
        if now_ns >= next
            && self
                .next_ns
                .compare_exchange(next, due, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_and_the_rest_counted() {
        let limit = LogLimit::new(Duration::from_secs(10));
        let s = 1_000_000_000;
        assert_eq!(limit.admit(100 * s), Some(0), "the first is logged");
        assert_eq!(limit.admit(100 * s), None);
        assert_eq!(limit.admit(109 * s), None);
        assert_eq!(limit.admit(110 * s), Some(2), "two held back");
        assert_eq!(limit.admit(115 * s), None);
        assert_eq!(limit.admit(200 * s), Some(1));
    }
}
