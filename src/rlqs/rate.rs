//! An assignment as what Envoy enforces: a rate and a burst for its local token bucket,
//! derived from the limit's rate and the stream's share of demand. Pure arithmetic, no
//! time and no protocol.

use std::time::Duration;

use super::table::Strategy;

/// Weight of the newest report in a stream's smoothed demand.
const DEMAND_WEIGHT: f64 = 0.5;
/// Tokens per fill aimed at: whole tokens over whole seconds (all Envoy reads) then give a
/// rate within 1 % of the one meant.
const TOKENS_PER_FILL: f64 = 100.0;
/// The longest fill interval sent: a year.
const MAX_FILL_S: u64 = 366 * 86_400;
/// A burst holds at most this part of the limit's window of rate...
const BURST_WINDOWS: f64 = 0.25;
/// ...and at most this many seconds of it.
const BURST_MAX_S: f64 = 1.0;
/// Tokens a bucket holds at least: with one, a token that is full waits for the next
/// request while its refill goes to waste, and an Envoy whose rate is a request or two
/// a second admits a fifth less than its rate.
const MIN_BURST: f64 = 2.0;

/// A stream's demand (requests per second) after a report of `observed` per second: an
/// exponentially weighted average, so that one quiet interval does not take a busy
/// stream's share away at once.
pub(crate) fn smooth(previous: Option<f64>, observed: f64) -> f64 {
    match previous {
        None => observed,
        Some(before) => before + DEMAND_WEIGHT * (observed - before),
    }
}

/// The seconds of rate an Envoy may spend at once, for a limit whose window is `window`:
/// a quarter of the window, at most a second.
pub(crate) fn burst_s(window: Duration) -> f64 {
    (window.as_secs_f64() * BURST_WINDOWS).min(BURST_MAX_S)
}

/// Envoy's token bucket for at most `rate` tokens per second with `burst_s` seconds of it
/// to spend at once (at least [`MIN_BURST`] tokens), or a denial when no whole token fits. The rate
/// is rounded down, so that parts never add up to more than their whole.
pub(crate) fn token_bucket(rate: f64, burst_s: f64) -> Strategy {
    if !(rate.is_finite() && rate > 0.0) {
        return Strategy::DenyAll;
    }
    let fill_interval_s = ((TOKENS_PER_FILL / rate).ceil() as u64).clamp(1, MAX_FILL_S);
    let tokens_per_fill = (rate * fill_interval_s as f64).floor();
    if tokens_per_fill < 1.0 {
        return Strategy::DenyAll;
    }
    let max_tokens = (rate * burst_s).ceil().max(MIN_BURST);
    Strategy::TokenBucket {
        max_tokens: max_tokens.min(f64::from(u32::MAX)) as u32,
        tokens_per_fill: tokens_per_fill.min(f64::from(u32::MAX)) as u32,
        fill_interval_s,
    }
}

/// The rate `strategy` lets through, tokens per second (0 for a denial, infinite for
/// allow-all).
pub(crate) fn rate_of(strategy: Strategy) -> f64 {
    match strategy {
        Strategy::AllowAll => f64::INFINITY,
        Strategy::DenyAll => 0.0,
        Strategy::TokenBucket {
            tokens_per_fill,
            fill_interval_s,
            ..
        } => f64::from(tokens_per_fill) / fill_interval_s as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_smoothed_from_the_first_report_on() {
        assert_eq!(smooth(None, 40.0), 40.0);
        assert_eq!(smooth(Some(40.0), 0.0), 20.0);
        assert_eq!(smooth(Some(20.0), 100.0), 60.0);
    }

    #[test]
    fn rates_become_whole_tokens_over_whole_seconds_rounded_down() {
        let fast = token_bucket(14.0, burst_s(Duration::from_secs(1)));
        assert_eq!(
            fast,
            Strategy::TokenBucket {
                max_tokens: 4,
                tokens_per_fill: 112,
                fill_interval_s: 8,
            }
        );
        assert_eq!(rate_of(fast), 14.0);
        // 600 a minute, a third of it: a second of rate to spend at once.
        let slow = token_bucket(10.0 / 3.0, burst_s(Duration::from_secs(60)));
        assert!(matches!(slow, Strategy::TokenBucket { max_tokens: 4, .. }));
        assert!(rate_of(slow) <= 10.0 / 3.0 && rate_of(slow) > 0.99 * 10.0 / 3.0);
        // A thousand a day: two tokens at most, one refilled every 87 s or so.
        let daily = token_bucket(1_000.0 / 86_400.0, burst_s(Duration::from_secs(86_400)));
        assert!(matches!(daily, Strategy::TokenBucket { max_tokens: 2, .. }));
        assert!(rate_of(daily) <= 1_000.0 / 86_400.0);
        assert_eq!(token_bucket(0.0, 1.0), Strategy::DenyAll);
        assert_eq!(token_bucket(f64::NAN, 1.0), Strategy::DenyAll);
        assert_eq!(
            token_bucket(1e-9, 1.0),
            Strategy::DenyAll,
            "below a token a year"
        );
    }
}
