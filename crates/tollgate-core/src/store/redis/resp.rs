//! The little of RESP, Redis's wire protocol, that the counter calls' own connection
//! ([`super::pipe`]) speaks: commands as arrays of bulk strings, and the replies it reads
//! (a status, an error, the check-and-count script's flat array), read from the bytes as
//! they lie, without a tree of values.

use super::script::{Replies, ScriptReply};

/// Appends the command made of `parts` to `out`.
pub(super) fn command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    array(out, parts.len());
    for part in parts {
        bulk(out, part);
    }
}

/// Appends the head of a command of `len` parts to `out`; [`bulk`] appends each part.
pub(super) fn array(out: &mut Vec<u8>, len: usize) {
    header(out, b'*', len);
}

/// Appends one part of a command to `out`.
pub(super) fn bulk(out: &mut Vec<u8>, part: &[u8]) {
    header(out, b'$', part.len());
    out.extend_from_slice(part);
    out.extend_from_slice(b"\r\n");
}

/// `kind`, then `n` and the line's end.
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(itoa(n, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, written at the end of `buf`.
fn itoa(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        // A digit: below ten.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// A whole reply at the front of a buffer: what it says, and how many bytes it took.
pub(super) type Read<T> = Result<Option<(Reply<T>, usize)>, BadReply>;

/// What Redis answered.
#[derive(Debug)]
pub(super) enum Reply<T> {
    /// What was asked for.
    Value(T),
    /// An error reply (`-NOSCRIPT …`), as redis-rs names its kind.
    Error(redis::RedisError),
}

/// Bytes that are not the reply the connection waits for: the connection is out of step
/// and cannot be used any more.
#[derive(Debug, thiserror::Error)]
#[error("Redis replied with something else than {expected} (byte {at})")]
pub(super) struct BadReply {
    expected: &'static str,
    at: usize,
}

/// A status reply (`+OK`) at the front of `buf`.
pub(super) fn status(buf: &[u8]) -> Read<()> {
    let mut cursor = Cursor { buf, at: 0 };
    let Some(reply) = cursor.error_or("a status", b'+')? else {
        return Ok(None);
    };
    let reply = match reply {
        Reply::Value(_) => Reply::Value(()),
        Reply::Error(e) => Reply::Error(e),
    };
    Ok(Some((reply, cursor.at)))
}

/// The check-and-count script's reply to a batch at the front of `buf`: flag, clock and
/// state per call, then an array of the calls whose keys held another type, each as its
/// number and a text.
pub(super) fn replies(buf: &[u8]) -> Read<Replies> {
    let mut cursor = Cursor { buf, at: 0 };
    let Some(reply) = cursor.error_or("the script's array", b'*')? else {
        return Ok(None);
    };
    let items = match reply {
        Reply::Value(items) => items,
        Reply::Error(e) => return Ok(Some((Reply::Error(e), cursor.at))),
    };
    let calls = items
        .checked_sub(1)
        .filter(|n| n % 3 == 0)
        .ok_or(BadReply {
            expected: "three values per call and the foreign keys",
            at: cursor.at,
        })?
        / 3;
    let mut replies = Vec::with_capacity(calls);
    for _ in 0..calls {
        let Some(flag) = cursor.int()? else {
            return Ok(None);
        };
        let Some(now_us) = cursor.int()? else {
            return Ok(None);
        };
        let Some(state) = cursor.bulk()? else {
            return Ok(None);
        };
        replies.push(ScriptReply {
            flag,
            now_us,
            state: state.to_vec(),
            foreign: String::new(),
        });
    }
    let mut replies = Replies(replies);
    let Some(foreign) = cursor.header("the foreign keys' array", b'*')? else {
        return Ok(None);
    };
    for _ in 0..foreign / 2 {
        let Some(call) = cursor.int()? else {
            return Ok(None);
        };
        let Some(text) = cursor.bulk()? else {
            return Ok(None);
        };
        let at = cursor.at;
        replies
            .mark_foreign(call, String::from_utf8_lossy(text).into_owned())
            .map_err(|expected| BadReply { expected, at })?;
    }
    Ok(Some((Reply::Value(replies), cursor.at)))
}

/// Where reading a buffer is.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next line without its end; None when the buffer ends first.
    fn line(&mut self) -> Option<&'a [u8]> {
        let rest = self.buf.get(self.at..)?;
        let end = rest.windows(2).position(|pair| pair == b"\r\n")?;
        self.at += end + 2;
        Some(&rest[..end])
    }

    /// The number of a `kind` line (`*3`, `:42`).
    fn header(&mut self, expected: &'static str, kind: u8) -> Result<Option<i64>, BadReply> {
        let at = self.at;
        let Some(line) = self.line() else {
            return Ok(None);
        };
        match line.split_first() {
            Some((&first, digits)) if first == kind => {
                number(digits).map(Some).ok_or(BadReply { expected, at })
            }
            _ => Err(BadReply { expected, at }),
        }
    }

    /// A `kind` line's number as a count, or an error reply.
    fn error_or(
        &mut self,
        expected: &'static str,
        kind: u8,
    ) -> Result<Option<Reply<usize>>, BadReply> {
        let at = self.at;
        if self.buf.get(at) == Some(&b'-') {
            let Some(_) = self.line() else {
                return Ok(None);
            };
            return Ok(Some(Reply::Error(server_error(&self.buf[at..self.at]))));
        }
        if kind == b'+' {
            return match self.line() {
                Some([b'+', ..]) => Ok(Some(Reply::Value(0))),
                Some(_) => Err(BadReply { expected, at }),
                None => Ok(None),
            };
        }
        let Some(n) = self.header(expected, kind)? else {
            return Ok(None);
        };
        let n = usize::try_from(n).map_err(|_| BadReply { expected, at })?;
        Ok(Some(Reply::Value(n)))
    }

    /// An integer.
    fn int(&mut self) -> Result<Option<i64>, BadReply> {
        self.header("an integer", b':')
    }

    /// A bulk string; a nil one reads as empty.
    fn bulk(&mut self) -> Result<Option<&'a [u8]>, BadReply> {
        let at = self.at;
        let bad = BadReply {
            expected: "a bulk string",
            at,
        };
        let Some(len) = self.header("a bulk string", b'$')? else {
            return Ok(None);
        };
        if len == -1 {
            return Ok(Some(&[]));
        }
        let len = usize::try_from(len).map_err(|_| bad)?;
        let Some(body) = self.buf.get(self.at..self.at + len + 2) else {
            self.at = at;
            return Ok(None);
        };
        if !body.ends_with(b"\r\n") {
            return Err(BadReply {
                expected: "a bulk string",
                at,
            });
        }
        self.at += len + 2;
        Ok(Some(&body[..len]))
    }
}

/// A decimal, possibly negative, that fits an i64.
fn number(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The error reply `line` (with its end) as redis-rs reads it, so that its kind
/// (`NOSCRIPT`, `READONLY`) is told apart as on every other connection.
fn server_error(line: &[u8]) -> redis::RedisError {
    match redis::parse_redis_value(line) {
        Ok(redis::Value::ServerError(e)) => e.into(),
        Ok(_) => redis::RedisError::from((redis::ErrorKind::Client, "not an error reply")),
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        command(&mut out, parts);
        out
    }

    #[test]
    fn a_command_is_an_array_of_bulk_strings() {
        assert_eq!(
            encoded(&[b"EVALSHA", b"ab", b"1", b"", b"k\r\n"]),
            b"*5\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$0\r\n\r\n$3\r\nk\r\n\r\n"
        );
        assert_eq!(
            encoded(&[b"123456789012"]),
            b"*1\r\n$12\r\n123456789012\r\n".as_slice()
        );
    }

    /// Two calls, the second one's key held a list.
    const BATCH: &[u8] =
        b"*7\r\n:1\r\n:1700000000000000\r\n$3\r\nab\x00\r\n:0\r\n:1700000000000001\r\n$-1\r\n\
          *2\r\n:2\r\n$13\r\nk held a list\r\n";

    #[test]
    fn a_batch_reply_reads_as_one_reply_per_call() {
        let Some((Reply::Value(Replies(replies)), used)) = replies(BATCH).unwrap() else {
            panic!("not a whole reply");
        };
        assert_eq!(used, BATCH.len());
        assert_eq!(
            replies,
            vec![
                ScriptReply {
                    flag: 1,
                    now_us: 1_700_000_000_000_000,
                    state: b"ab\x00".to_vec(),
                    foreign: String::new(),
                },
                ScriptReply {
                    flag: 0,
                    now_us: 1_700_000_000_000_001,
                    state: Vec::new(),
                    foreign: "k held a list".into(),
                },
            ]
        );
    }

    #[test]
    fn a_reply_cut_anywhere_waits_for_the_rest() {
        for end in 0..BATCH.len() {
            assert!(
                replies(&BATCH[..end]).unwrap().is_none(),
                "{end} bytes read as a whole reply"
            );
            assert!(status(&b"+OK\r\n"[..end.min(4)]).unwrap().is_none());
        }
        let mut two = BATCH.to_vec();
        two.extend_from_slice(BATCH);
        let Some((_, used)) = replies(&two).unwrap() else {
            panic!("not a whole reply");
        };
        assert_eq!(used, BATCH.len(), "only the first reply is read");
    }

    #[test]
    fn an_error_reply_keeps_its_kind() {
        let line = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
        let Some((Reply::Error(e), used)) = replies(line).unwrap() else {
            panic!("not an error reply");
        };
        assert_eq!(used, line.len());
        assert_eq!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
        let Some((Reply::Error(e), _)) = status(b"-WRONGPASS invalid password\r\n").unwrap() else {
            panic!("not an error reply");
        };
        assert!(e.to_string().contains("invalid password"), "{e}");
        assert!(matches!(
            status(b"+OK\r\n").unwrap(),
            Some((Reply::Value(()), 5))
        ));
    }

    #[test]
    fn bytes_out_of_step_are_a_clear_error() {
        for bad in [
            b"+OK\r\n".as_slice(),
            b"*2\r\n:1\r\n",
            b"*4\r\n$1\r\nx\r\n",
            b"*4\r\n:1\r\n:2\r\n$2\r\nabcd",
            b"*4\r\n:x\r\n",
            b"*1\r\n:1\r\n",
            b"*4\r\n:1\r\n:2\r\n$0\r\n\r\n*2\r\n:9\r\n$1\r\nk\r\n",
        ] {
            let e = replies(bad).expect_err(&String::from_utf8_lossy(bad));
            assert!(
                e.to_string()
                    .starts_with("Redis replied with something else than")
            );
        }
    }
}
