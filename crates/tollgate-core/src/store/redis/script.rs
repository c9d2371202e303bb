//! The one round trip of the Redis store: arguments in, the counter's state out. The hash
//! layout lives only in `check_and_count.lua`; its reply carries the state positionally.

use crate::algo::{FixedWindow, Gcra, Hits, LimitState, SlidingWindow};
use crate::limit::{Algorithm, Limit};

const NANOS_PER_MICRO: u64 = 1_000;

/// The check-and-count script, loaded once and run with EVALSHA.
pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("check_and_count.lua"))
}

/// Adds the script's arguments for `hits` under `limits` to `invocation`; Redis changes
/// nothing if it runs the script after `deadline_ns` (in Redis time; 0 for none). The
/// script reads Redis' clock unless `now_ns` gives the time (tests replay histories).
pub(super) fn add_args(
    invocation: &mut redis::ScriptInvocation<'_>,
    limits: &[Limit],
    hits: Hits,
    deadline_ns: u64,
    now_ns: u64,
) {
    let (mode, n) = match hits {
        Hits::Consume(n) => ("c", n),
        Hits::Charge(n) => ("p", n),
        Hits::Check => ("k", 0),
        Hits::Refund(n) => ("r", n),
    };
    invocation
        .arg(mode)
        .arg(n)
        .arg(deadline_ns / NANOS_PER_MICRO)
        .arg(now_ns / NANOS_PER_MICRO)
        .arg(limits.len());
    for limit in limits {
        let (kind, param) = match limit.algorithm {
            Algorithm::SlidingWindow { precision } => ("s", precision),
            Algorithm::FixedWindow => ("f", 1),
            Algorithm::TokenBucket { burst } | Algorithm::LeakyBucket { burst } => ("g", burst),
        };
        invocation
            .arg(kind)
            .arg(limit.window_ns / NANOS_PER_MICRO)
            .arg(param)
            .arg(limit.requests_per_unit);
    }
}

/// The script's answer: its decision, Redis' clock, and the counter as it was before.
#[derive(Debug)]
pub(super) enum Reply {
    /// The script ran: whether it admitted, when, and the state it read.
    Ran {
        admitted: bool,
        now_ns: u64,
        states: Vec<LimitState>,
    },
    /// Redis ran the script at `now_ns`, after its deadline, when the request had been
    /// answered without Redis; nothing was counted.
    Late { now_ns: u64 },
}

/// Why a reply could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReplyError {
    #[error("reply holds {0} numbers, fewer than the state of the limits needs")]
    Short(usize),
    #[error("reply holds the negative number {0}")]
    Negative(i64),
}

/// Decodes the script's raw reply for `limits`.
pub(super) fn decode(raw: &[i64], limits: &[Limit]) -> Result<Reply, ReplyError> {
    let Some((&flag, rest)) = raw.split_first() else {
        return Err(ReplyError::Short(0));
    };
    let mut numbers = rest.iter().map(|&n| u64::try_from(n).map_err(|_| n));
    let mut next = || match numbers.next() {
        Some(Ok(n)) => Ok(n),
        Some(Err(n)) => Err(ReplyError::Negative(n)),
        None => Err(ReplyError::Short(raw.len())),
    };
    let now_ns = next()?.saturating_mul(NANOS_PER_MICRO);
    if flag == -1 {
        return Ok(Reply::Late { now_ns });
    }
    let admitted = flag == 1;
    let mut states = Vec::with_capacity(limits.len());
    for limit in limits {
        states.push(match limit.algorithm {
            Algorithm::SlidingWindow { precision } => {
                let newest = next()?;
                let ring = (0..=precision).map(|_| next()).collect::<Result<_, _>>()?;
                LimitState::Sliding(SlidingWindow::from_ring(newest, ring))
            }
            Algorithm::FixedWindow => {
                let window = next()?;
                LimitState::Fixed(FixedWindow::from_parts(window, next()?))
            }
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                LimitState::Gcra(Gcra::from_tat(next()?.saturating_mul(NANOS_PER_MICRO)))
            }
        });
    }
    Ok(Reply::Ran {
        admitted,
        now_ns,
        states,
    })
}
