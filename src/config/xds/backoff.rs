//! How long to wait before the next stream: doubling from an initial wait up to a maximum,
//! each wait spread by a random factor so that many instances restarted together do not
//! reconnect in step. Randomness is passed in, so tests fix it.

use std::time::Duration;

/// The reference's `XDS_CLIENT_BACKOFF_*` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BackoffPolicy {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    /// Each wait is drawn from `[d × (1 − f), d × (1 + f)]`, capped at `max`.
    pub(crate) random_factor: f64,
    pub(crate) jitter: bool,
}

/// Consecutive failures and the wait they call for.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    policy: BackoffPolicy,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            failures: 0,
        }
    }

    /// A stream did its job (delivered a response): the next failure waits the least.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// The wait before the next attempt; `random` yields values in `[0, 1)`.
    pub(crate) fn next(&mut self, random: &mut impl FnMut() -> f64) -> Duration {
        let p = &self.policy;
        let base = p
            .initial
            .saturating_mul(2u32.saturating_pow(self.failures.min(31)))
            .min(p.max);
        self.failures = self.failures.saturating_add(1);
        if !p.jitter {
            return base;
        }
        spread(base, p.random_factor, random).min(p.max)
    }
}

/// `d` spread uniformly over `[d × (1 − factor), d × (1 + factor)]` (factor at most 1);
/// `random` yields values in `[0, 1)`.
pub(crate) fn spread(d: Duration, factor: f64, random: &mut impl FnMut() -> f64) -> Duration {
    let factor = factor.clamp(0.0, 1.0);
    if factor == 0.0 {
        return d;
    }
    d.mul_f64(1.0 + (random() * 2.0 - 1.0) * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(jitter: bool) -> BackoffPolicy {
        BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter,
        }
    }

    #[test]
    fn waits_double_up_to_the_maximum_and_start_over_after_a_reset() {
        let mut b = Backoff::new(policy(false));
        let mut never = || -> f64 { panic!("no randomness without jitter") };
        let waits: Vec<u64> = (0..5).map(|_| b.next(&mut never).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 60, 60]);
        b.reset();
        assert_eq!(b.next(&mut never), Duration::from_secs(10));
        for _ in 0..100 {
            b.next(&mut never);
        }
        assert_eq!(b.next(&mut never), Duration::from_secs(60), "no overflow");
    }

    #[test]
    fn jitter_spreads_each_wait_by_the_random_factor() {
        let mut low = Backoff::new(policy(true));
        assert_eq!(low.next(&mut || 0.0), Duration::from_secs(5));
        assert_eq!(low.next(&mut || 0.0), Duration::from_secs(10));
        let mut high = Backoff::new(policy(true));
        let wait = high.next(&mut || 0.999_999);
        assert!(
            wait > Duration::from_millis(14_999) && wait < Duration::from_secs(15),
            "{wait:?}"
        );
        let mut mid = Backoff::new(policy(true));
        assert_eq!(mid.next(&mut || 0.5), Duration::from_secs(10));
        // Spread above the maximum is capped.
        let mut capped = Backoff::new(policy(true));
        for _ in 0..3 {
            capped.next(&mut || 0.5);
        }
        assert_eq!(capped.next(&mut || 0.999), Duration::from_secs(60));
        assert_eq!(
            spread(Duration::from_secs(3), 0.0, &mut || 0.0),
            Duration::from_secs(3)
        );
        assert_eq!(
            spread(Duration::from_secs(3), 0.5, &mut || 0.0),
            Duration::from_millis(1500)
        );
    }
}
