//! The one round trip of the Redis store: arguments in, the counter's state out. The
//! counter's layout lives only in `check_and_count.lua`; its reply carries the state as
//! the script stored it.

use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::protocol::{Ask, RawReply, limit_args, mode, units};

/// Ends every counter's key: the version of the layout the script keeps there. A build
/// with another layout (hashes, before this one) counts in other keys instead of failing
/// on these, so a rolling upgrade never runs two layouts on one key.
const LAYOUT: &str = ":v2";

/// The check-and-count script, loaded once and run with EVALSHA.
pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("check_and_count.lua"))
}

/// The script's reply to one call of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ScriptReply {
    /// 1 admitted, 0 denied; a take's units; -1 when it ran after its deadline.
    pub(super) flag: i64,
    /// Redis' clock in microseconds.
    pub(super) now_us: i64,
    /// The counter's state as stored (MessagePack integers; empty for a new counter).
    pub(super) state: Vec<u8>,
    /// "KEY held a TYPE" when the key held another type than a string; empty otherwise.
    pub(super) foreign: String,
}

impl redis::FromRedisValue for ScriptReply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let (flag, now_us, state, foreign) = redis::FromRedisValue::from_redis_value(v)?;
        Ok(Self {
            flag,
            now_us,
            state,
            foreign,
        })
    }
}

/// A stored state that is not a run of MessagePack unsigned integers below 2^63.
#[derive(Debug, thiserror::Error)]
#[error("the script replied with a state that is not MessagePack integers (at byte {0})")]
pub(super) struct BadState(usize);

/// `reply` as [`crate::store::shared::protocol::decode`] reads it: the stored state as
/// numbers.
pub(super) fn raw(reply: ScriptReply) -> Result<RawReply, BadState> {
    let ScriptReply {
        flag,
        now_us,
        state,
        ..
    } = reply;
    let mut numbers = Vec::with_capacity(state.len());
    let mut at = 0;
    while let Some(&marker) = state.get(at) {
        let width = match marker {
            0x00..=0x7f => 0,
            0xcc => 1,
            0xcd => 2,
            0xce => 4,
            0xcf => 8,
            _ => return Err(BadState(at)),
        };
        let bytes = state.get(at + 1..at + 1 + width).ok_or(BadState(at))?;
        let value = match width {
            0 => u64::from(marker),
            _ => bytes.iter().fold(0, |n, &b| n << 8 | u64::from(b)),
        };
        numbers.push(i64::try_from(value).map_err(|_| BadState(at))?);
        at += 1 + width;
    }
    Ok(RawReply {
        flag,
        now_us,
        state: numbers,
    })
}

/// One check-and-count: `debt` charged, then `ask` (hits, or a lease's block) under `limits` on counter `key`; Redis
/// changes nothing if it runs the check after `deadline` (in Redis time), if there is one.
/// The script reads Redis' clock unless `now` gives the time (tests replay histories);
/// `around`, the Redis time this instance expects, places calendar boundaries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Check<'a> {
    pub(super) key: &'a str,
    pub(super) limits: &'a [Limit],
    pub(super) ask: Ask,
    pub(super) debt: u64,
    pub(super) deadline: Option<Timestamp>,
    pub(super) now: Option<Timestamp>,
    pub(super) around: Timestamp,
}

/// One call packed to ride a batch: its Redis key and its arguments.
#[derive(Debug)]
pub(super) struct Packed {
    pub(super) key: String,
    pub(super) args: Vec<u8>,
}

/// `check` packed, its Redis key made of `prefix`, the counter key as the Cluster hash
/// tag, and the layout; the rest of the call is one argument of MessagePack values, which
/// the script reads with one unpack.
pub(super) fn pack(prefix: &str, check: &Check<'_>) -> Packed {
    let (mode, n, extra) = mode(check.ask);
    let limits = check.limits;
    let mut args = Values(Vec::with_capacity(38 + 21 * limits.len()));
    args.letter(mode);
    args.number(n);
    args.number(units(check.debt));
    // The script's zero is "none": it never runs at the epoch.
    args.number(check.deadline.map_or(0, Timestamp::as_micros));
    args.number(check.now.map_or(0, Timestamp::as_micros));
    args.number(extra);
    for limit in limits {
        let (kind, window_us, param, rpu, bounds_us) = limit_args(limit, check.around);
        args.letter(kind);
        if kind == "c" {
            args.numbers(&bounds_us);
        } else {
            args.number(window_us);
        }
        args.number(param.into());
        args.number(rpu.into());
    }
    Packed {
        key: redis_key(prefix, check.key),
        args: args.0,
    }
}

/// The EVALSHA of `script` for a batch of `calls`, whose reply is a [`ScriptReply`] per
/// call, in order. In a Cluster every key must be in one slot.
pub(super) fn batch<'a>(
    script: &redis::Script,
    calls: impl ExactSizeIterator<Item = &'a Packed> + Clone,
) -> redis::Cmd {
    let bytes: usize = calls.clone().map(|c| c.key.len() + c.args.len() + 32).sum();
    let mut cmd = redis::Cmd::with_capacity(3 + 2 * calls.len(), 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(calls.len());
    for call in calls.clone() {
        cmd.arg(call.key.as_str());
    }
    for call in calls {
        cmd.arg(call.args.as_slice());
    }
    cmd
}

/// The EVALSHA of `script` for `check` alone.
pub(super) fn call(script: &redis::Script, prefix: &str, check: &Check<'_>) -> redis::Cmd {
    batch(script, std::iter::once(&pack(prefix, check)))
}

/// The one reply of a batch of one call.
pub(super) fn only(mut replies: Vec<ScriptReply>) -> Result<ScriptReply, BadBatch> {
    match (replies.pop(), replies.is_empty()) {
        (Some(reply), true) => Ok(reply),
        _ => Err(BadBatch(replies.len() + 1)),
    }
}

/// A batch's reply that does not hold one reply per call.
#[derive(Debug, thiserror::Error)]
#[error("the script replied to a batch with another count of replies than calls ({0})")]
pub(super) struct BadBatch(pub(super) usize);

/// The Redis key of counter `key`: the prefix, the counter key as the Cluster hash tag,
/// and the layout.
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    // Sized at once, where `format!` would grow it several times on every call.
    [prefix, "{", key, "}", LAYOUT].concat()
}

/// MessagePack values, written in the shortest form `cmsgpack` reads.
struct Values(Vec<u8>);

impl Values {
    /// An unsigned integer (the script reads it as a double: exact below 2^53, as
    /// tonumber of its decimal text was).
    fn number(&mut self, n: u64) {
        let out = &mut self.0;
        match n {
            0..=0x7f => out.push(n as u8),
            0x80..=0xff => out.extend_from_slice(&[0xcc, n as u8]),
            0x100..=0xffff => {
                out.push(0xcd);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                out.push(0xce);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
            _ => {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
    }

    /// An array of unsigned integers (a calendar's boundaries).
    fn numbers(&mut self, numbers: &[u64; 3]) {
        self.0.push(0x90 | numbers.len() as u8);
        for &n in numbers {
            self.number(n);
        }
    }

    /// A one-letter string (a mode or a kind).
    fn letter(&mut self, letter: &'static str) {
        debug_assert_eq!(letter.len(), 1);
        self.0.push(0xa0 | letter.len() as u8);
        self.0.extend_from_slice(letter.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(flag: i64, state: Vec<u8>) -> ScriptReply {
        ScriptReply {
            flag,
            now_us: 7,
            state,
            foreign: String::new(),
        }
    }

    #[test]
    fn packed_numbers_read_back_as_written() {
        let edges = [
            0,
            0x7f,
            0x80,
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            0x1_0000_0000,
            (1 << 53) - 1,
        ];
        let mut packed = Values(Vec::new());
        for n in edges {
            packed.number(n);
        }
        let read = raw(reply(0, packed.0)).ok().map(|r| r.state);
        assert_eq!(read, Some(edges.map(|n| n as i64).to_vec()));

        let mut packed = Values(Vec::new());
        packed.letter("s");
        assert_eq!(packed.0, [0xa1, b's']);
    }

    #[test]
    fn the_stored_state_reads_as_numbers() {
        let state = vec![
            0x05, 0xcc, 0xc8, 0xcd, 0x01, 0x2c, 0xce, 0x00, 0x01, 0x86, 0xa0, 0xcf, 0, 0, 0, 0x01,
            0, 0, 0, 0,
        ];
        assert_eq!(
            raw(reply(1, state)).ok(),
            Some(RawReply {
                flag: 1,
                now_us: 7,
                state: vec![5, 200, 300, 100_000, 1 << 32]
            })
        );
        assert_eq!(
            raw(reply(0, Vec::new())).ok().map(|r| r.state),
            Some(vec![])
        );
        // A negative number, a float, a cut-off integer, a number past i64.
        for state in [
            vec![0xff],
            vec![0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![0x01, 0xcd, 0x01],
            vec![0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(raw(reply(1, state.clone())).is_err(), "{state:?}");
        }
    }
}
