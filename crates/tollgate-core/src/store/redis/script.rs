//! The one round trip of the Redis store: arguments in, the counter's state out. The hash
//! layout lives only in `check_and_count.lua`; its reply carries the state positionally.

use crate::algo::Hits;
use crate::limit::Limit;
use crate::store::shared::protocol::{NANOS_PER_MICRO, limit_args, mode};

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
    let (mode, n) = mode(hits);
    invocation
        .arg(mode)
        .arg(n)
        .arg(deadline_ns / NANOS_PER_MICRO)
        .arg(now_ns / NANOS_PER_MICRO)
        .arg(limits.len());
    for limit in limits {
        let (kind, window_us, param, rpu) = limit_args(limit);
        invocation.arg(kind).arg(window_us).arg(param).arg(rpu);
    }
}
