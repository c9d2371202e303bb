//! The one round trip of the Redis store: arguments in, shared state out.

use std::collections::HashMap;

use crate::limiter::{Algorithm, FixedWindow, Gcra, Hits, Limit, LimitState, SlidingWindow};

const NANOS_PER_MICRO: u64 = 1_000;

/// The check-and-count script, loaded once and run with EVALSHA.
pub fn script() -> redis::Script {
    redis::Script::new(include_str!("check_and_count.lua"))
}

/// Adds the script's arguments for `hits` under `limits` to `invocation`.
pub fn add_args(invocation: &mut redis::ScriptInvocation<'_>, limits: &[Limit], hits: Hits) {
    let (mode, n) = match hits {
        Hits::Consume(n) => ("c", n),
        Hits::Check => ("k", 0),
        Hits::Refund(n) => ("r", n),
    };
    invocation.arg(mode).arg(n).arg(limits.len());
    for limit in limits {
        let (kind, param) = match limit.algorithm {
            Algorithm::SlidingWindow => ("s", limit.precision),
            Algorithm::FixedWindow => ("f", 1),
            Algorithm::TokenBucket | Algorithm::LeakyBucket => ("g", limit.burst),
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
pub struct Reply {
    pub admitted: bool,
    pub now_ns: u64,
    pub states: Vec<LimitState>,
}

/// Decodes the script's raw reply for `limits`.
pub fn decode(raw: (i64, i64, Vec<String>), limits: &[Limit]) -> Result<Reply, String> {
    let (admitted, now_us, flat) = raw;
    let now_us = u64::try_from(now_us).map_err(|_| format!("negative Redis time {now_us}"))?;
    let mut fields = HashMap::with_capacity(flat.len() / 2);
    let mut pairs = flat.chunks_exact(2);
    for pair in &mut pairs {
        let value: u64 = pair[1]
            .parse()
            .map_err(|_| format!("field {} holds {:?}, not a count", pair[0], pair[1]))?;
        fields.insert(pair[0].as_str(), value);
    }
    let get = |i: usize, name: &str| {
        fields
            .get(format!("{i}:{name}").as_str())
            .copied()
            .unwrap_or(0)
    };
    let states = limits
        .iter()
        .enumerate()
        .map(|(i, limit)| match limit.algorithm {
            Algorithm::SlidingWindow => {
                let ring = (0..=limit.precision)
                    .map(|pos| get(i, &pos.to_string()))
                    .collect();
                LimitState::Sliding(SlidingWindow::from_ring(get(i, "n"), ring))
            }
            Algorithm::FixedWindow => {
                LimitState::Fixed(FixedWindow::from_parts(get(i, "w"), get(i, "c")))
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                LimitState::Gcra(Gcra::from_tat(get(i, "t").saturating_mul(NANOS_PER_MICRO)))
            }
        })
        .collect();
    Ok(Reply {
        admitted: admitted == 1,
        now_ns: now_us.saturating_mul(NANOS_PER_MICRO),
        states,
    })
}
