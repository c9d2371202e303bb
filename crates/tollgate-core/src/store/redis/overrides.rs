//! The Redis side of runtime overrides: `overrides.lua` on four keys in one Cluster slot
//! (the overrides' hash, where earlier versions keep them too, and the change log, the
//! expiries and the log's counters beside it), and the reading of its replies.

use std::sync::Arc;

use crate::store::shared::announce::OVERRIDES;
use crate::store::shared::backend::{LogRead, OverrideChange, TripError, Written};

/// The overrides script, loaded once and run with EVALSHA.
pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("overrides.lua"))
}

/// The four keys of the overrides of one key prefix.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    /// The hash of every override: field the descriptor's id, value its JSON.
    pub(super) set: String,
    log: String,
    expiries: String,
    meta: String,
}

impl Keys {
    /// The keys under `prefix`: the hash as earlier versions name it, the others in its
    /// Cluster slot (named with its hash tag, or with the whole hash's name as the tag).
    pub(super) fn of(prefix: &str) -> Self {
        let set = format!("{prefix}tollgate-overrides");
        let beside = |suffix: &str| match hash_tag(&set) {
            Some(_) => format!("{set}:{suffix}"),
            // A name holding '}' cannot be a tag: these keys then only share a node's
            // slots by chance, and a Cluster refuses the script (a 503 saying so).
            None if set.contains('}') => format!("{set}:{suffix}"),
            None => format!("{{{set}}}:{suffix}"),
        };
        Self {
            log: beside("log"),
            expiries: beside("expiries"),
            meta: beside("meta"),
            set,
        }
    }
}

/// The part of `key` Redis Cluster hashes to find its slot, when it is not the whole key:
/// what lies between the first `{` and the next `}`, if not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// The EVALSHA of `op` with its arguments, on `keys`, announcing on `channel`.
fn call(script: &redis::Script, keys: &Keys, channel: &str, op: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(4)
        .arg(&keys.set)
        .arg(&keys.log)
        .arg(&keys.expiries)
        .arg(&keys.meta)
        .arg(op)
        .arg(format!("{:016x}", fastrand::u64(..)))
        .arg(channel)
        .arg(OVERRIDES);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// The call making `change`.
pub(super) fn change(
    script: &redis::Script,
    keys: &Keys,
    channel: &str,
    change: &OverrideChange<'_>,
) -> redis::Cmd {
    let deadline = change.deadline.as_micros().max(1).to_string();
    match change.set {
        Some((spec, expires_at)) => {
            let expires = expires_at.unwrap_or(0).to_string();
            let max = change.max.to_string();
            let args = [deadline.as_str(), change.id, spec, &expires, &max];
            call(script, keys, channel, "set", &args)
        }
        None => call(script, keys, channel, "delete", &[&deadline, change.id]),
    }
}

/// The call reading the log after `since`.
pub(super) fn log(
    script: &redis::Script,
    keys: &Keys,
    channel: &str,
    (since, most, most_bytes): (u64, usize, usize),
) -> redis::Cmd {
    let args = [since.to_string(), most.to_string(), most_bytes.to_string()];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    call(script, keys, channel, "log", &args)
}

/// A reply the script should not have made.
#[derive(Debug, thiserror::Error)]
#[error("the overrides script answered {0:?}")]
struct BadReply(Vec<String>);

fn bad(reply: &[String]) -> TripError {
    TripError::Failed(Arc::new(BadReply(reply.to_vec())))
}

fn number(reply: &[String], i: usize) -> Result<u64, TripError> {
    reply
        .get(i)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| bad(reply))
}

/// A JSON, or none for ''.
fn json(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// The reply to a change.
pub(super) fn written(reply: &[String]) -> Result<Written, TripError> {
    match reply.first().map(String::as_str) {
        Some("late") => Ok(Written::Late),
        Some("full") => Ok(Written::Full(number(reply, 1)?)),
        Some("set" | "deleted") if reply.len() == 2 => Ok(Written::Done(json(&reply[1]))),
        _ => Err(bad(reply)),
    }
}

/// The reply to a read of the log.
pub(super) fn log_read(reply: &[String]) -> Result<LogRead, TripError> {
    if reply.len() < 5 || reply.len().is_multiple_of(2) {
        return Err(bad(reply));
    }
    Ok(LogRead {
        epoch: reply[0].clone(),
        version: number(reply, 1)?,
        trimmed: number(reply, 2)?,
        upto: number(reply, 3)?,
        complete: reply[4] == "1",
        changed: reply[5..]
            .chunks_exact(2)
            .map(|pair| (pair[0].clone(), json(&pair[1])))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_share_the_hash_slot_whatever_the_prefix() {
        let plain = Keys::of("rl:");
        assert_eq!(plain.set, "rl:tollgate-overrides");
        assert_eq!(plain.log, "{rl:tollgate-overrides}:log");
        assert_eq!(hash_tag(&plain.meta), Some(plain.set.as_str()));
        let tagged = Keys::of("{tenant}:");
        assert_eq!(hash_tag(&tagged.set), Some("tenant"));
        assert_eq!(hash_tag(&tagged.expiries), Some("tenant"));
        assert_eq!(
            hash_tag("a{}b{c}"),
            None,
            "an empty first tag hashes the whole key"
        );
    }

    #[test]
    fn replies_are_read_or_refused() {
        let strings = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(written(&strings(&["late"])).ok(), Some(Written::Late));
        assert_eq!(
            written(&strings(&["full", "5"])).ok(),
            Some(Written::Full(5))
        );
        assert_eq!(
            written(&strings(&["set", ""])).ok(),
            Some(Written::Done(None))
        );
        assert!(written(&strings(&["set"])).is_err());
        let read = log_read(&strings(&["e", "9", "2", "8", "0", "id", ""])).expect("read");
        assert_eq!((read.version, read.trimmed, read.upto), (9, 2, 8));
        assert!(!read.complete);
        assert_eq!(read.changed, vec![("id".to_owned(), None)]);
        assert!(log_read(&strings(&["e", "x", "2", "8", "1"])).is_err());
        assert!(log_read(&strings(&["e", "9", "2", "8", "1", "odd"])).is_err());
    }
}
