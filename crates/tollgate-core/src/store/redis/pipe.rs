//! A connection of our own for the counter calls on one node (a single Redis, or a
//! Sentinel set's master) over plain TCP. A batch's EVALSHA is written to the socket by
//! the task that batches, and its reply read from the bytes into one reply per call: no
//! driver task between the batcher and the socket, no tree of values. redis-rs's
//! multiplexed connection cost a tenth of Tollgate's CPU per admission
//! (docs/BENCHMARKS.md). Everything else (probes, resets, overrides, reference mode,
//! Cluster, TLS) stays on redis-rs.
//!
//! Calls are pipelined: each waits for its reply in order. Whichever call is polled
//! writes what is buffered and reads what arrived, and wakes the calls it answered.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::resp::{self, Reply};
use super::script::Replies;

/// Bytes read from the socket at a time at least.
const READ_CHUNK: usize = 16 * 1024;

/// The counter calls' connection to one node, made when first needed and again after it
/// failed.
pub(super) struct Pipe {
    host: String,
    port: u16,
    /// AUTH and SELECT, as the node's URL asks: sent first on every connection.
    hello: Vec<u8>,
    /// How many commands `hello` holds.
    hellos: usize,
    connect_timeout: Duration,
    /// Held while connecting, so that concurrent calls make one connection.
    connecting: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

/// The connection and the calls on it.
#[derive(Default)]
struct State {
    stream: Option<TcpStream>,
    /// Commands not yet written to the socket.
    out: Vec<u8>,
    /// Bytes read and not yet parsed.
    input: Vec<u8>,
    /// One per command sent, in order; the first `answered` have their reply.
    calls: VecDeque<Slot>,
    answered: usize,
    /// The number of `calls[0]`.
    first: u64,
}

/// One call's place in line.
#[derive(Default)]
struct Slot {
    reply: Option<redis::RedisResult<Replies>>,
    waker: Option<Waker>,
    /// Its reply was taken, or nobody waits for it any more.
    gone: bool,
}

impl Pipe {
    /// The pipe to the node `client` connects to; none when it is not reached over plain
    /// TCP (TLS or a Unix socket), where redis-rs carries the counter calls too.
    pub(super) fn of(client: &redis::Client, connect_timeout: Duration) -> Option<Self> {
        let info = client.get_connection_info();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        let (mut hello, mut hellos) = (Vec::new(), 0);
        if let Some(password) = settings.password() {
            let mut auth = vec![b"AUTH".as_slice()];
            auth.extend(settings.username().map(str::as_bytes));
            auth.push(password.as_bytes());
            resp::command(&mut hello, &auth);
            hellos += 1;
        }
        if settings.db() != 0 {
            let db = settings.db().to_string();
            resp::command(&mut hello, &[b"SELECT", db.as_bytes()]);
            hellos += 1;
        }
        Some(Self {
            host: host.clone(),
            port: *port,
            hello,
            hellos,
            connect_timeout,
            connecting: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
        })
    }

    /// Sends `command` (an EVALSHA of the check-and-count script) and reads its reply.
    pub(super) async fn call(&self, command: &[u8]) -> redis::RedisResult<Replies> {
        self.connect().await?;
        let seq = self.lock().send(command)?;
        Answer {
            pipe: self,
            seq,
            done: false,
        }
        .await
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock::lock(&self.state)
    }

    /// Connects, unless connected.
    async fn connect(&self) -> redis::RedisResult<()> {
        if self.lock().stream.is_some() {
            return Ok(());
        }
        let _one = self.connecting.lock().await;
        if self.lock().stream.is_some() {
            return Ok(());
        }
        let stream = tokio::time::timeout(self.connect_timeout, self.handshake())
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {:?}", self.connect_timeout),
                )
            })??;
        let mut state = self.lock();
        state.input.clear();
        state.out.clear();
        state.stream = Some(stream);
        Ok(())
    }

    /// A new connection, past AUTH and SELECT.
    async fn handshake(&self) -> redis::RedisResult<TcpStream> {
        let mut stream = TcpStream::connect((self.host.as_str(), self.port)).await?;
        stream.set_nodelay(true)?;
        if self.hellos == 0 {
            return Ok(stream);
        }
        stream.write_all(&self.hello).await?;
        let (mut input, mut answered) = (Vec::new(), 0);
        while answered < self.hellos {
            if stream.read_buf(&mut input).await? == 0 {
                return Err(closed().into());
            }
            while let Some((reply, used)) = resp::status(&input).map_err(out_of_step)? {
                input.drain(..used);
                match reply {
                    Reply::Value(()) => answered += 1,
                    Reply::Error(e) => return Err(e),
                }
            }
        }
        Ok(stream)
    }
}

impl State {
    /// `command` buffered for writing; its number in line.
    fn send(&mut self, command: &[u8]) -> io::Result<u64> {
        if self.stream.is_none() {
            return Err(closed());
        }
        self.out.extend_from_slice(command);
        self.calls.push_back(Slot::default());
        Ok(self.first + self.calls.len() as u64 - 1)
    }

    /// Writes what is buffered and reads what arrived, as far as the socket allows
    /// without waiting; the socket wakes `cx` when it allows more.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Err(e) = self.write(cx).and_then(|()| self.read(cx)) {
            self.fail(&e);
        }
    }

    fn write(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        while !self.out.is_empty() {
            match stream.try_write(&self.out) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match stream.poll_write_ready(cx) {
                        Poll::Ready(ready) => ready?,
                        Poll::Pending => return Ok(()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn read(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            let Some(stream) = &self.stream else {
                return Ok(());
            };
            self.input.reserve(READ_CHUNK);
            match stream.try_read_buf(&mut self.input) {
                Ok(0) => return Err(closed()),
                Ok(_) => self.parse()?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    match stream.poll_read_ready(cx) {
                        Poll::Ready(ready) => ready?,
                        Poll::Pending => return Ok(()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every whole reply read, given to its call in line.
    fn parse(&mut self) -> io::Result<()> {
        let mut at = 0;
        while let Some((reply, used)) = resp::replies(&self.input[at..]).map_err(out_of_step)? {
            at += used;
            let Some(slot) = self.calls.get_mut(self.answered) else {
                return Err(out_of_step("a reply nobody asked for"));
            };
            slot.reply = Some(match reply {
                Reply::Value(replies) => Ok(replies),
                Reply::Error(e) => Err(e),
            });
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
            self.answered += 1;
        }
        self.input.drain(..at);
        Ok(())
    }

    /// Closes the connection: every call waiting gets `error`.
    fn fail(&mut self, error: &io::Error) {
        self.stream = None;
        self.out.clear();
        self.input.clear();
        for slot in self.calls.iter_mut().skip(self.answered) {
            slot.reply = Some(Err(io::Error::new(error.kind(), error.to_string()).into()));
            if let Some(waker) = slot.waker.take() {
                waker.wake();
            }
        }
        self.answered = self.calls.len();
    }

    /// Call `seq`'s reply, if it came.
    fn take(&mut self, seq: u64) -> Option<redis::RedisResult<Replies>> {
        let slot = self
            .calls
            .get_mut(usize::try_from(seq - self.first).ok()?)?;
        let reply = slot.reply.take()?;
        slot.gone = true;
        self.forget();
        Some(reply)
    }

    /// Call `seq` no longer waited for. Its reply would come, and the replies after it,
    /// only when the node answers again: the connection is closed, so that the next calls
    /// do not wait behind it.
    fn give_up(&mut self, seq: u64) {
        let Some(slot) = usize::try_from(seq - self.first)
            .ok()
            .and_then(|i| self.calls.get_mut(i))
        else {
            return;
        };
        slot.gone = true;
        if slot.reply.is_none() {
            let e = io::Error::new(
                io::ErrorKind::TimedOut,
                "a call on the connection was given up",
            );
            self.fail(&e);
        }
        self.forget();
    }

    /// Drops the answered calls nobody waits for from the front of the line; the first
    /// call still waiting is woken, to take over watching the socket.
    fn forget(&mut self) {
        while self.answered > 0 && self.calls.front().is_some_and(|slot| slot.gone) {
            self.calls.pop_front();
            self.answered -= 1;
            self.first += 1;
        }
        if let Some(waker) = self.calls.get(self.answered).and_then(|s| s.waker.as_ref()) {
            waker.wake_by_ref();
        }
    }
}

/// Waits for call `seq`'s reply, driving the connection meanwhile.
struct Answer<'a> {
    pipe: &'a Pipe,
    seq: u64,
    done: bool,
}

impl Future for Answer<'_> {
    type Output = redis::RedisResult<Replies>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let seq = self.seq;
        let mut state = self.pipe.lock();
        let mut reply = state.take(seq);
        if reply.is_none() {
            state.drive(cx);
            reply = state.take(seq);
        }
        if let Some(reply) = reply {
            drop(state);
            self.done = true;
            return Poll::Ready(reply);
        }
        let first = state.first;
        if let Some(slot) = usize::try_from(seq - first)
            .ok()
            .and_then(|i| state.calls.get_mut(i))
            && !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()))
        {
            slot.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Answer<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pipe.lock().give_up(self.seq);
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "Redis closed the connection",
    )
}

/// The connection reads what it cannot make sense of: it is of no more use.
fn out_of_step(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::future::join_all;
    use tollgate_testkit::redis::RedisServer;

    use super::*;
    use crate::algo::Hits;
    use crate::clock::Timestamp;
    use crate::limit::{Algorithm, Limit};
    use crate::store::redis::resp;
    use crate::store::redis::script::{self, Check, Packed};
    use crate::store::shared::protocol::Ask;
    use crate::unit::Unit;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn pipe(url: &str) -> Pipe {
        let client = redis::Client::open(url).expect("a URL");
        Pipe::of(&client, TIMEOUT).expect("plain TCP")
    }

    fn limits() -> Vec<Limit> {
        let sliding = Algorithm::SlidingWindow { precision: 10 };
        vec![
            Limit::new(3, Unit::Minute)
                .with_algorithm(sliding)
                .expect("a limit"),
        ]
    }

    /// Call `n` on counter `key` (of `prefix`), at a fixed time.
    fn packed(prefix: &str, key: &str, limits: &[Limit], n: u64) -> Packed {
        let now = Timestamp::from_micros(1_700_000_000_000_000 + n);
        let check = Check {
            key,
            limits,
            ask: Ask::Hits(Hits::Consume(n % 3 + 1)),
            debt: 0,
            deadline: None,
            now: Some(now),
            around: now,
        };
        script::pack(prefix, &check)
    }

    /// The batch's EVALSHA, as the pipe sends it.
    fn command(script: &redis::Script, calls: &[Packed]) -> Vec<u8> {
        let mut out = Vec::new();
        resp::array(&mut out, 3 + 2 * calls.len());
        script::batch_parts(script.get_hash(), calls.iter(), |part| {
            resp::bulk(&mut out, part)
        });
        out
    }

    fn loaded(redis: &RedisServer, password: Option<&str>) -> redis::Script {
        let script = script::script();
        let loaded = script.load(&mut redis.connection_as(password));
        assert!(loaded.is_ok(), "{loaded:?}");
        script
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_batches_get_the_replies_redis_rs_gets() {
        let redis = RedisServer::start();
        let script = loaded(&redis, None);
        let pipe = pipe(&redis.url());
        let limits = limits();
        let batches: Vec<Vec<u64>> = (0..40)
            .map(|b| (0..=b % 7).map(|i| b * 10 + i).collect())
            .collect();
        let batch = |prefix: &str, calls: &[u64]| -> Vec<Packed> {
            calls
                .iter()
                .map(|&n| packed(prefix, &format!("k{}", n % 13), &limits, n))
                .collect()
        };
        let piped = join_all(batches.iter().map(|calls| {
            let command = command(&script, &batch("pipe:", calls));
            let pipe = &pipe;
            async move { pipe.call(&command).await.map(|Replies(r)| r) }
        }))
        .await;

        let mut conn = redis.connection_as(None);
        for (calls, piped) in batches.iter().zip(piped) {
            let piped = piped.expect("a reply");
            let Replies(direct) = script::batch(&script, batch("rs:", calls).iter())
                .query(&mut conn)
                .expect("a reply");
            assert_eq!(piped, direct, "batch {calls:?}");
        }
    }

    #[tokio::test]
    async fn a_password_and_a_database_are_sent_first() {
        let redis = RedisServer::start_with("auth", &["--requirepass", "s3cret"]);
        let script = loaded(&redis, Some("s3cret"));
        let call = packed("", "in-db-3", &limits(), 1);
        let url = format!("redis://:s3cret@{}/3", redis.host_port());
        let Replies(replies) = pipe(&url)
            .call(&command(&script, std::slice::from_ref(&call)))
            .await
            .expect("a reply");
        assert_eq!(replies[0].flag, 1);
        let mut conn = redis.connection_as(Some("s3cret"));
        let exists = |db: i64, conn: &mut redis::Connection| -> bool {
            let () = redis::cmd("SELECT").arg(db).query(conn).expect("SELECT");
            redis::cmd("EXISTS")
                .arg(&call.key)
                .query(conn)
                .expect("EXISTS")
        };
        assert!(exists(3, &mut conn), "counted in database 3");
        assert!(!exists(0, &mut conn));

        let wrong = format!("redis://:wrong@{}", redis.host_port());
        let refused = pipe(&wrong).call(&command(&script, &[call])).await;
        let e = refused.expect_err("a wrong password");
        assert!(e.to_string().contains("WRONGPASS"), "{e}");
    }

    #[tokio::test]
    async fn a_killed_connection_fails_its_call_and_the_next_call_connects_again() {
        let redis = RedisServer::start();
        let script = loaded(&redis, None);
        let pipe = pipe(&redis.url());
        let command = command(&script, &[packed("", "kill", &limits(), 1)]);
        assert!(pipe.call(&command).await.is_ok());

        let killed: i64 = redis.query(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert_eq!(killed, 1, "the pipe's connection");
        let e = pipe.call(&command).await.expect_err("a closed connection");
        assert!(e.is_io_error(), "{e:?}");
        assert!(pipe.call(&command).await.is_ok(), "connected again");
    }

    #[tokio::test]
    async fn a_call_given_up_closes_the_connection_so_that_later_calls_do_not_wait_behind_it() {
        let mut redis = RedisServer::start();
        let script = loaded(&redis, None);
        let pipe = pipe(&redis.url());
        let command = command(&script, &[packed("", "given-up", &limits(), 1)]);
        assert!(pipe.call(&command).await.is_ok());
        let connections = |redis: &RedisServer| -> u64 {
            let stats = redis.info("stats");
            let line = stats
                .lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"));
            line.and_then(|n| n.trim().parse().ok()).expect("a count")
        };
        let before = connections(&redis);

        redis.freeze();
        let given_up = tokio::time::timeout(Duration::from_millis(100), pipe.call(&command)).await;
        assert!(given_up.is_err(), "no reply from a frozen server");
        redis.thaw();

        let Replies(replies) = pipe.call(&command).await.expect("a reply");
        assert_eq!(replies.len(), 1);
        // The query's own connection, and the pipe's new one.
        assert_eq!(connections(&redis), before + 2, "on a new connection");
    }
}
