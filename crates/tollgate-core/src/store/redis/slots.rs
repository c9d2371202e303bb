//! The Redis side of in-flight counters: `slots.lua`, its own script, so that the
//! counters' check-and-count script knows nothing of slots.

use crate::store::shared::slot_call::SlotCall;

use super::script::redis_key;

/// The slots script, loaded once and run with EVALSHA.
pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("slots.lua"))
}

/// The EVALSHA of `script` for `call`, on the counter's key as every counter is keyed
/// (so that a reset's DEL finds it).
pub(super) fn call(script: &redis::Script, prefix: &str, call: &SlotCall) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(1)
        .arg(redis_key(prefix, &call.key))
        .arg(call.mode)
        .arg(call.n)
        .arg(call.max)
        .arg(call.expire_after_us)
        .arg(call.deadline_us)
        .arg(call.debt);
    cmd
}
