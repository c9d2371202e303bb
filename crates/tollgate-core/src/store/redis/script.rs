//! The one round trip of the Redis store: arguments in, the counter's state out. The
//! counter's layout is defined in `check_and_count.lua`; its reply carries the state as
//! the script stored it, which [`raw`] reads.

use crate::clock::Timestamp;
use crate::limit::{Algorithm, Limit};
use crate::store::shared::protocol::{Ask, RawReply, limit_args, mode, units};

/// Ends every counter's key: the version of the layout the script keeps there. A build
/// with another layout counts in other keys instead of failing on these, so a rolling
/// upgrade never runs two layouts on one key; the script reads a counter of the previous
/// layout ([`PREVIOUS_LAYOUT`]) once, when its key of this layout does not exist yet.
const LAYOUT: &str = ":v3";

/// The previous layout's ending (MessagePack integers).
#[cfg(test)]
const PREVIOUS_LAYOUT: &str = ":v2";

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
    /// The counter's state as stored (see [`raw`]; empty for a new counter).
    pub(super) state: Vec<u8>,
    /// "KEY held a TYPE" when the key held another type than a string; empty otherwise.
    pub(super) foreign: String,
}

/// The script's reply to a batch: one [`ScriptReply`] per call, in order. It comes as one
/// flat array: a value per call, then the calls whose keys held another type (each as its
/// number and a text), then Redis' clock. An admitted call's value is its state alone;
/// one value a call is what Redis answers fastest.
#[derive(Debug)]
pub(super) struct Replies(pub(super) Vec<ScriptReply>);

impl redis::FromRedisValue for Replies {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        use redis::{ParsingError, Value};
        let Value::Array(mut items) = v else {
            return Err(ParsingError::from("the script's reply is not an array"));
        };
        let Some(Value::Int(now_us)) = items.pop() else {
            return Err(ParsingError::from(
                "the script's reply ends without Redis' clock",
            ));
        };
        let Some(Value::Array(foreign)) = items.pop() else {
            return Err(ParsingError::from(
                "the script's reply ends without its foreign keys",
            ));
        };
        let mut replies = Vec::with_capacity(items.len());
        for item in items {
            replies.push(ScriptReply::read(item, now_us)?);
        }
        let mut foreign = foreign.into_iter();
        while let (Some(call), Some(text)) = (foreign.next(), foreign.next()) {
            let call = usize::from_redis_value(call)?;
            let reply = call.checked_sub(1).and_then(|i| replies.get_mut(i));
            let Some(reply) = reply else {
                return Err(ParsingError::from(
                    "the script named a foreign key of no call",
                ));
            };
            reply.foreign = String::from_redis_value(text)?;
        }
        Ok(Self(replies))
    }
}

impl ScriptReply {
    /// One call's value in the batch's reply, Redis' clock being `now_us`: the state of an
    /// admitted call; -1 for a call run after its deadline; else its flag and state, and
    /// its own now if it was given one.
    fn read(item: redis::Value, now_us: i64) -> Result<Self, redis::ParsingError> {
        use redis::{FromRedisValue as _, ParsingError, Value};
        let reply = |flag, now_us, state| Self {
            flag,
            now_us,
            state,
            foreign: String::new(),
        };
        match item {
            Value::BulkString(state) => Ok(reply(1, now_us, state)),
            Value::Int(-1) => Ok(reply(-1, now_us, Vec::new())),
            Value::Array(parts) => {
                let mut parts = parts.into_iter();
                match (parts.next(), parts.next(), parts.next(), parts.next()) {
                    (Some(flag), Some(state), given, None) => {
                        let now_us = match given {
                            Some(given) => i64::from_redis_value(given)?,
                            None => now_us,
                        };
                        let flag = i64::from_redis_value(flag)?;
                        Ok(reply(flag, now_us, Vec::from_redis_value(state)?))
                    }
                    _ => Err(ParsingError::from(
                        "the script answered a call with another array than its flag and state",
                    )),
                }
            }
            _ => Err(ParsingError::from(
                "the script answered a call with neither a state nor a flag",
            )),
        }
    }
}

/// How one limit's state lies in the stored string (see `check_and_count.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// A sliding window of `ring` sub-windows: newest and kept sum (6 bytes each), then
    /// per sub-window, newest first, count * 256 + start (5) and end (2).
    Sliding { ring: usize },
    /// A fixed or calendar window: window and count (7 bytes each).
    Window,
    /// A token or leaky bucket: the arrival time (7 bytes).
    Arrival,
}

/// How the state of `limit` lies in the stored string; none for an in-flight counter,
/// which has a script of its own (`slots.rs`).
fn part(limit: &Limit) -> Option<Part> {
    match limit.algorithm {
        Algorithm::SlidingWindow { precision } => Some(Part::Sliding {
            ring: precision as usize + 1,
        }),
        Algorithm::FixedWindow => Some(Part::Window),
        Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => Some(Part::Arrival),
        Algorithm::Slots => None,
    }
}

/// The parts of a call's limits, in order: the one limit most counters have held inline,
/// so that a call on the request path allocates nothing for them.
#[derive(Debug)]
pub(super) enum Parts {
    One(Part),
    Many(Vec<Part>),
}

impl std::ops::Deref for Parts {
    type Target = [Part];

    fn deref(&self) -> &[Part] {
        match self {
            Self::One(part) => std::slice::from_ref(part),
            Self::Many(parts) => parts,
        }
    }
}

/// The parts of the state of `limits`, in order.
pub(super) fn parts(limits: &[Limit]) -> Parts {
    match limits {
        [limit] => part(limit).map_or(Parts::Many(Vec::new()), Parts::One),
        _ => Parts::Many(limits.iter().filter_map(part).collect()),
    }
}

/// A stored state that is not the layout of the call's limits.
#[derive(Debug, thiserror::Error)]
#[error("the script replied with a state of {0} bytes, not the layout of the call's limits")]
pub(super) struct BadState(usize);

/// `reply` as [`crate::store::shared::protocol::decode`] reads it: the stored state as
/// the numbers of every limit in order, a sliding window's sub-windows indexed by number
/// modulo their count, then each sliding window's ends in the same order.
pub(super) fn raw(reply: ScriptReply, parts: &[Part]) -> Result<RawReply, BadState> {
    let ScriptReply {
        flag,
        now_us,
        state,
        ..
    } = reply;
    if state.is_empty() {
        return Ok(RawReply {
            flag,
            now_us,
            state: Vec::new(),
        });
    }
    let bad = || BadState(state.len());
    // Every limit's numbers, then the sliding windows' ends, in one allocation.
    let (count, ends_count) = parts.iter().fold((0, 0), |(n, e), part| match *part {
        Part::Sliding { ring } => (n + 1 + ring, e + ring),
        Part::Window => (n + 2, e),
        Part::Arrival => (n + 1, e),
    });
    #[expect(
        clippy::slow_vector_initialization,
        reason = "`vec![0; n]` is calloc, which glibc serves without the per-thread cache \
                  malloc uses: 0.23 µs a request against 0.03 in the profile"
    )]
    let mut numbers = Vec::with_capacity(count + ends_count);
    numbers.resize(count + ends_count, 0);
    let (mut next, mut next_end) = (0, count);
    let mut at = 0;
    let mut take = |width: usize| -> Result<i64, BadState> {
        let bytes = state.get(at..at + width).ok_or_else(bad)?;
        at += width;
        // At most seven bytes: below 2^56.
        Ok(bytes.iter().fold(0, |n, &b| n << 8 | i64::from(b)))
    };
    for part in parts {
        match *part {
            Part::Sliding { ring } => {
                let newest = take(6)?;
                take(6)?;
                numbers[next] = newest;
                let ring_i64 = i64::try_from(ring).map_err(|_| bad())?;
                for age in 0..ring_i64 {
                    let index =
                        usize::try_from((newest - age).rem_euclid(ring_i64)).map_err(|_| bad())?;
                    numbers[next + 1 + index] = take(5)?;
                    numbers[next_end + index] = take(2)?;
                }
                next += 1 + ring;
                next_end += ring;
            }
            Part::Window => {
                numbers[next] = take(7)?;
                numbers[next + 1] = take(7)?;
                next += 2;
            }
            Part::Arrival => {
                numbers[next] = take(7)?;
                next += 1;
            }
        }
    }
    if at != state.len() {
        return Err(bad());
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

/// One call packed to ride a batch: its Redis key, then its arguments, in one buffer
/// (made by the request, freed by the batch: one allocation rather than two).
#[derive(Debug)]
pub(super) struct Packed {
    bytes: Vec<u8>,
    key_len: usize,
}

impl Packed {
    /// The call's Redis key.
    pub(super) fn key(&self) -> &[u8] {
        self.bytes.get(..self.key_len).unwrap_or_default()
    }

    /// The call's arguments.
    pub(super) fn args(&self) -> &[u8] {
        self.bytes.get(self.key_len..).unwrap_or_default()
    }
}

/// `check` packed, its Redis key made of `prefix`, the counter key as the Cluster hash
/// tag, and the layout; the rest of the call is one argument of MessagePack values, which
/// the script reads with one unpack.
pub(super) fn pack(prefix: &str, check: &Check<'_>) -> Packed {
    let (mode, n, extra) = mode(check.ask);
    let limits = check.limits;
    let key = key_parts(prefix, check.key);
    let key_len = key.iter().map(|part| part.len()).sum();
    let mut args = Values(Vec::with_capacity(key_len + 38 + 21 * limits.len()));
    for part in key {
        args.0.extend_from_slice(part.as_bytes());
    }
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
        bytes: args.0,
        key_len,
    }
}

/// The EVALSHA of `script` for a batch of `calls`, whose reply is a [`ScriptReply`] per
/// call, in order. In a Cluster every key must be in one slot.
pub(super) fn batch<'a>(
    script: &redis::Script,
    calls: impl ExactSizeIterator<Item = &'a Packed> + Clone,
) -> redis::Cmd {
    let bytes: usize = calls.clone().map(|c| c.bytes.len() + 32).sum();
    let mut cmd = redis::Cmd::with_capacity(3 + 2 * calls.len(), 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(calls.len());
    for call in calls.clone() {
        cmd.arg(call.key());
    }
    for call in calls {
        cmd.arg(call.args());
    }
    cmd
}

/// The EVALSHA of `script` for `check` alone.
pub(super) fn call(script: &redis::Script, prefix: &str, check: &Check<'_>) -> redis::Cmd {
    batch(script, std::iter::once(&pack(prefix, check)))
}

/// The one reply of a batch of one call.
pub(super) fn only(Replies(mut replies): Replies) -> Result<ScriptReply, BadBatch> {
    match (replies.pop(), replies.is_empty()) {
        (Some(reply), true) => Ok(reply),
        _ => Err(BadBatch(replies.len() + 1)),
    }
}

/// A batch's reply that does not hold one reply per call.
#[derive(Debug, thiserror::Error)]
#[error("the script replied to a batch with another count of replies than calls ({0})")]
pub(super) struct BadBatch(pub(super) usize);

/// The Redis key of counter `key` (see [`key_parts`]).
pub(super) fn redis_key(prefix: &str, key: &str) -> String {
    // Sized at once, where `format!` would grow it several times on every call.
    key_parts(prefix, key).concat()
}

/// The parts of counter `key`'s Redis key: the prefix, the counter key as the Cluster hash
/// tag, and the layout.
fn key_parts<'a>(prefix: &'a str, key: &'a str) -> [&'a str; 5] {
    [prefix, "{", key, "}", LAYOUT]
}

/// The key the previous layout kept counter `key` in.
#[cfg(test)]
pub(super) fn previous_key(prefix: &str, key: &str) -> String {
    format!("{prefix}{{{key}}}{PREVIOUS_LAYOUT}")
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

    fn be(n: u64, width: usize) -> Vec<u8> {
        n.to_be_bytes()[8 - width..].to_vec()
    }

    #[test]
    fn packed_numbers_take_their_shortest_form() {
        let mut packed = Values(Vec::new());
        for n in [0x7f, 0x80, 0x100, 0x1_0000, 0x1_0000_0000] {
            packed.number(n);
        }
        let expected: Vec<u8> = [
            vec![0x7f],
            vec![0xcc, 0x80],
            vec![0xcd, 0x01, 0x00],
            vec![0xce, 0, 1, 0, 0],
            vec![0xcf, 0, 0, 0, 1, 0, 0, 0, 0],
        ]
        .concat();
        assert_eq!(packed.0, expected);
        let mut packed = Values(Vec::new());
        packed.letter("s");
        assert_eq!(packed.0, [0xa1, b's']);
    }

    #[test]
    fn a_packed_call_holds_its_key_then_its_arguments() {
        use crate::algo::Hits;
        use crate::unit::Unit;

        let limits = [Limit::new(5, Unit::Minute)];
        let check = Check {
            key: "api|user=u-1",
            limits: &limits,
            ask: Ask::Hits(Hits::Consume(2)),
            debt: 0,
            deadline: None,
            now: None,
            around: Timestamp::default(),
        };
        let packed = pack("tg_", &check);
        assert_eq!(packed.key(), redis_key("tg_", check.key).as_bytes());
        assert_eq!(packed.key(), b"tg_{api|user=u-1}:v3");
        // Mode 'c', two hits, no debt, no deadline, Redis' clock, no extra; one limit.
        assert_eq!(
            packed.args().get(..8),
            Some(&[0xa1, b'c', 2, 0, 0, 0, 0, 0xa1][..])
        );
    }

    /// A sliding window of three sub-windows (newest 7: indexes 1, 0, 2 newest first),
    /// then a fixed window and a bucket, read as `decode` reads a store's numbers.
    #[test]
    fn the_stored_state_reads_as_numbers() {
        let parts = [Part::Sliding { ring: 3 }, Part::Window, Part::Arrival];
        let state = [
            be(7, 6),
            be(5, 6),
            be(3 * 256 + 9, 5),
            be(100, 2),
            be(2 * 256, 5),
            be(65_535, 2),
            be(1 << 39, 5),
            be(0, 2),
            be(1 << 40, 7),
            be((1 << 53) - 1, 7),
            be(1_790_000_000_000_000, 7),
        ]
        .concat();
        assert_eq!(
            raw(reply(1, state.clone()), &parts).ok(),
            Some(RawReply {
                flag: 1,
                now_us: 7,
                state: vec![
                    7,
                    2 * 256,
                    3 * 256 + 9,
                    1 << 39,
                    1 << 40,
                    (1 << 53) - 1,
                    1_790_000_000_000_000,
                    65_535,
                    100,
                    0
                ]
            })
        );
        assert_eq!(
            raw(reply(0, Vec::new()), &parts).ok().map(|r| r.state),
            Some(vec![])
        );
        // Cut short, or longer than the limits' layout.
        for state in [state[..state.len() - 1].to_vec(), [state, vec![0]].concat()] {
            assert!(raw(reply(1, state), &parts).is_err());
        }
    }

    #[test]
    fn a_flat_batch_reply_reads_as_one_reply_per_call() {
        use redis::{FromRedisValue, Value};
        let text = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let flat = Value::Array(vec![
            text(""),
            Value::Array(vec![Value::Int(0), text("ab")]),
            Value::Int(-1),
            Value::Array(vec![Value::Int(3), text("cd"), Value::Int(5)]),
            Value::Array(vec![Value::Int(2), text("k held a list")]),
            Value::Int(10),
        ]);
        let read = Replies::from_redis_value(flat).map(|r| r.0);
        let expected = vec![
            ScriptReply {
                flag: 1,
                now_us: 10,
                state: Vec::new(),
                foreign: String::new(),
            },
            ScriptReply {
                flag: 0,
                now_us: 10,
                state: b"ab".to_vec(),
                foreign: "k held a list".to_owned(),
            },
            ScriptReply {
                flag: -1,
                now_us: 10,
                state: Vec::new(),
                foreign: String::new(),
            },
            ScriptReply {
                flag: 3,
                now_us: 5,
                state: b"cd".to_vec(),
                foreign: String::new(),
            },
        ];
        assert_eq!(read.ok(), Some(expected));
        let foreign = || Value::Array(vec![]);
        for bad in [
            // No clock, or no foreign keys before it.
            Value::Array(vec![text(""), foreign()]),
            Value::Array(vec![text(""), Value::Int(1)]),
            // A call's value of another shape.
            Value::Array(vec![Value::Int(0), foreign(), Value::Int(1)]),
            Value::Array(vec![
                Value::Array(vec![Value::Int(0)]),
                foreign(),
                Value::Int(1),
            ]),
            Value::Array(vec![
                Value::Array(vec![Value::Int(0), text(""), Value::Int(1), Value::Int(2)]),
                foreign(),
                Value::Int(1),
            ]),
            // A foreign key of no call.
            Value::Array(vec![
                text(""),
                Value::Array(vec![Value::Int(2), text("k held a list")]),
                Value::Int(1),
            ]),
            Value::Int(3),
        ] {
            assert!(Replies::from_redis_value(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
