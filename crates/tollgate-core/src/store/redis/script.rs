//! The one round trip of the Redis store: arguments in, the counter's state out. The
//! counter's layout lives only in `check_and_count.lua`; its reply carries the state as
//! the script stored it.

use redis::RedisWrite as _;

use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::protocol::{Ask, limit_args, mode, units};

/// Ends every counter's key: the version of the layout the script keeps there. A build
/// with another layout (hashes, before this one) counts in other keys instead of failing
/// on these, so a rolling upgrade never runs two layouts on one key.
const LAYOUT: &str = ":v2";

/// The check-and-count script, loaded once and run with EVALSHA.
pub(super) fn script() -> redis::Script {
    redis::Script::new(include_str!("check_and_count.lua"))
}

/// The script's reply: the flag, Redis' clock in microseconds, the state as stored
/// (MessagePack integers; empty for a new counter), and "KEY held a TYPE" when the key
/// held another type than a string (empty otherwise).
pub(super) type ScriptReply = (i64, i64, Vec<u8>, String);

/// A stored state that is not a run of MessagePack unsigned integers below 2^63.
#[derive(Debug, thiserror::Error)]
#[error("the script replied with a state that is not MessagePack integers (at byte {0})")]
pub(super) struct BadState(usize);

/// `reply` as the numbers of [`crate::store::shared::protocol::decode`].
pub(super) fn numbers((flag, now_us, state, _): ScriptReply) -> Result<Vec<i64>, BadState> {
    let mut numbers = Vec::with_capacity(2 + state.len());
    numbers.extend([flag, now_us]);
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
    Ok(numbers)
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

/// The EVALSHA of `script` for `check`, its Redis key made of `prefix`, the counter key
/// as the Cluster hash tag, and the layout; the rest of the call is one argument of
/// MessagePack values, which the script reads with one unpack.
pub(super) fn call(script: &redis::Script, prefix: &str, check: &Check<'_>) -> redis::Cmd {
    let (mode, n, extra) = mode(check.ask);
    let limits = check.limits;
    let mut args = Packed(Vec::with_capacity(38 + 21 * limits.len()));
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
    let mut cmd = redis::Cmd::with_capacity(5, 64 + prefix.len() + check.key.len() + args.0.len());
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(1);
    cmd.write_arg_fmt(format_args!("{prefix}{{{}}}{LAYOUT}", check.key));
    cmd.arg(args.0.as_slice());
    cmd
}

/// The Redis key of counter `key`: the prefix, the counter key as the Cluster hash tag,
/// and the layout.
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}{LAYOUT}")
}

/// MessagePack values, written in the shortest form `cmsgpack` reads.
struct Packed(Vec<u8>);

impl Packed {
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
        let mut packed = Packed(Vec::new());
        for n in edges {
            packed.number(n);
        }
        let read = numbers((0, 0, packed.0, String::new())).ok();
        let mut expected = vec![0, 0];
        expected.extend(edges.map(|n| n as i64));
        assert_eq!(read, Some(expected));

        let mut packed = Packed(Vec::new());
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
            numbers((1, 7, state, String::new())).ok(),
            Some(vec![1, 7, 5, 200, 300, 100_000, 1 << 32])
        );
        assert_eq!(
            numbers((0, 7, Vec::new(), String::new())).ok(),
            Some(vec![0, 7])
        );
        // A negative number, a float, a cut-off integer, a number past i64.
        for state in [
            vec![0xff],
            vec![0xcb, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![0x01, 0xcd, 0x01],
            vec![0xcf, 0xff, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(
                numbers((1, 7, state.clone(), String::new())).is_err(),
                "{state:?}"
            );
        }
    }
}
