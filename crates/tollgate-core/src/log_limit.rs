//! One log line per period for an event that can repeat many times a second (a client
//! sending bad messages, a store refusing every call): the first line is logged, the
//! others are counted and their number reported with the next line logged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;

/// At most one log line per period, the lines held back counted; shared by every task
/// that may log the event, so it works through `&self`.
#[derive(Debug)]
pub struct LogLimit {
    period: Duration,
    /// When the next line may be logged, in nanoseconds since the epoch (an atomic holds
    /// an integer).
    next: AtomicU64,
    held: AtomicU64,
}

impl LogLimit {
    /// At most one line per `period`.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            next: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// Whether to log at `now` (the caller's clock): `Some(lines held back since the last
    /// one logged)`, or `None` to stay quiet.
    pub fn admit(&self, now: Timestamp) -> Option<u64> {
        let next = self.next.load(Ordering::Relaxed);
        let due = (now + self.period).as_nanos();
        if now.as_nanos() >= next
            && self
                .next
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
        let at = |s: u64| Timestamp::default() + Duration::from_secs(s);
        assert_eq!(limit.admit(at(100)), Some(0), "the first is logged");
        assert_eq!(limit.admit(at(100)), None);
        assert_eq!(limit.admit(at(109)), None);
        assert_eq!(limit.admit(at(110)), Some(2), "two held back");
        assert_eq!(limit.admit(at(115)), None);
        assert_eq!(limit.admit(at(200)), Some(1));
    }
}
