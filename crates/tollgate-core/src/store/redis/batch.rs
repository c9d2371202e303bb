//! Coalescing: the check-and-count calls of concurrent requests ride one script call per
//! turn of the connection. A call that finds fewer than [`MAX_OUT`] batches out goes at
//! once; what arrives while they are out rides the next one. Redis then reads, runs and
//! answers one command for many calls, which is most of what a call cost it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use redis::cluster_routing::Slot;
use tokio::sync::{mpsc, oneshot};

use super::classify::classify;
use super::connect::{Conn, RedisConnector};
use super::script::{self, BadBatch, Packed, ScriptReply};
use crate::store::shared::backend::TripError;
use crate::store::shared::link::Link;

/// Calls in one script call at most: Redis runs a script alone, so a long one delays
/// every other client (64 calls take it about 0.5 ms).
const MAX_BATCH: usize = 64;

/// Batches out at once: a call that finds fewer out goes at once, so a batch is never
/// held up behind a slow one, while what arrives meanwhile still rides together.
const MAX_OUT: usize = 4;

/// Calls waiting for a batch at most. A request that finds the queue full waits for
/// room, within its own `STORE_TIMEOUT`.
const MAX_QUEUED: usize = 4_096;

/// Whoever waits for a call waits at most `STORE_TIMEOUT` or the settler's second; a
/// batch not answered in twice the longer is given up, so that a connection that went
/// silent holds up no later batch. Redis would drop its calls anyway: they are past
/// their deadlines.
fn give_up_after(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(1)) * 2
}

/// What one caller gets back.
type Answer = Result<ScriptReply, TripError>;

/// One call waiting for its batch.
struct Queued {
    call: Packed,
    answer: oneshot::Sender<Answer>,
}

/// The queue into the batching task of one store.
#[derive(Clone)]
pub(super) struct Batcher {
    queue: mpsc::Sender<Queued>,
}

impl Batcher {
    /// The batcher of the connection `link` holds, running `script`, its calls waited
    /// for as `timeout` says (on the current tokio runtime).
    pub(super) fn start(
        link: Arc<Link<RedisConnector>>,
        script: Arc<redis::Script>,
        timeout: Duration,
    ) -> Self {
        let (queue, calls) = mpsc::channel(MAX_QUEUED);
        tokio::spawn(run(calls, link, script, give_up_after(timeout)));
        Self { queue }
    }

    /// `call` in the next batch; its reply.
    pub(super) async fn call(&self, call: Packed) -> Answer {
        let (answer, reply) = oneshot::channel();
        let queued = Queued { call, answer };
        if self.queue.send(queued).await.is_err() {
            return Err(TripError::NotConnected);
        }
        reply.await.unwrap_or(Err(TripError::NotConnected))
    }
}

/// Sends batches, at most [`MAX_OUT`] at a time, until every [`Batcher`] is gone.
async fn run(
    mut calls: mpsc::Receiver<Queued>,
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    give_up: Duration,
) {
    let mut out = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            received = calls.recv_many(&mut batch, MAX_BATCH), if out.len() < MAX_OUT => {
                if received == 0 {
                    break;
                }
                // Sized for a full batch, so that receiving never grows it.
                let groups = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                out.push(send_all(link.clone(), script.clone(), groups, give_up));
            }
            Some(()) = out.next(), if !out.is_empty() => {}
        }
    }
    while out.next().await.is_some() {}
}

/// The calls of `batch` still waited for, one script call per Cluster slot.
async fn send_all(
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    mut batch: Vec<Queued>,
    give_up: Duration,
) {
    // A caller that stopped listening (its request dropped) asks nothing more.
    batch.retain(|q: &Queued| !q.answer.is_closed());
    let Some(conn) = link.conn() else {
        answer_all(batch.into_iter(), &Err(TripError::NotConnected));
        return;
    };
    match &*conn {
        Conn::Single(_) if batch.is_empty() => {}
        Conn::Single(_) => send(&link, &script, (*conn).clone(), batch, give_up).await,
        Conn::Cluster(_) => {
            let sent = by_slot(batch.into_iter())
                .into_iter()
                .map(|group| send(&link, &script, (*conn).clone(), group, give_up));
            join_all(sent).await;
        }
    }
}

/// `calls` grouped by Cluster slot: one script call touches one slot.
fn by_slot(calls: impl Iterator<Item = Queued>) -> Vec<Vec<Queued>> {
    let mut groups: HashMap<Slot, Vec<Queued>> = HashMap::new();
    for queued in calls {
        let slot = Slot::for_key(queued.call.key.as_bytes());
        groups.entry(slot).or_default().push(queued);
    }
    groups.into_values().collect()
}

/// One script call for `group`, each caller answered with its own reply, or all with the
/// call's error.
async fn send(
    link: &Link<RedisConnector>,
    script: &redis::Script,
    mut conn: Conn,
    group: Vec<Queued>,
    give_up: Duration,
) {
    let cmd = script::batch(script, group.iter().map(|q| &q.call));
    let replies = tokio::time::timeout(give_up, conn.eval::<Vec<ScriptReply>>(&cmd, script)).await;
    match replies {
        Ok(Ok(replies)) if replies.len() == group.len() => {
            for (queued, reply) in group.into_iter().zip(replies) {
                let _ = queued.answer.send(Ok(reply));
            }
        }
        Ok(Ok(replies)) => {
            let error = TripError::Failed(Arc::new(BadBatch(replies.len())));
            answer_all(group.into_iter(), &Err(error));
        }
        Ok(Err(e)) => answer_all(group.into_iter(), &Err(classify(link, e))),
        Err(_) => answer_all(
            group.into_iter(),
            &Err(TripError::Lost(Arc::new(GaveUp(give_up)))),
        ),
    }
}

/// A batch given up on.
#[derive(Debug, thiserror::Error)]
#[error("Redis did not answer a batch of calls in {0:?}")]
struct GaveUp(Duration);

/// Every caller of `calls` answered with `answer`.
fn answer_all(calls: impl Iterator<Item = Queued>, answer: &Answer) {
    for queued in calls {
        // A caller gone stopped waiting: nothing to tell.
        let _ = queued.answer.send(answer.clone());
    }
}
