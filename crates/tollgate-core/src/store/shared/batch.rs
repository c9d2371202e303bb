//! Coalescing: the check-and-count calls of concurrent requests ride one store call per
//! turn (one script call in Redis, one statement in PostgreSQL). A call that finds fewer
//! batches out than the store allows goes at once, so an idle store adds no latency;
//! what arrives while they are out rides the next one. The store then reads, runs and
//! answers one command for many calls, which is most of what a call cost it.
//!
//! What differs between stores is how a group of calls is sent ([`Group`]); the queue,
//! the turns, giving up on a silent store and answering each caller are here.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::backend::TripError;

/// Calls in one store call at most: Redis runs a script alone, so a long one delays
/// every other client (64 calls take it about 0.5 ms); PostgreSQL holds every row a
/// statement locked until it ends.
const MAX_BATCH: usize = 64;

/// Calls waiting for a batch at most. A request that finds the queue full waits for
/// room, within its own `STORE_TIMEOUT`.
const MAX_QUEUED: usize = 4_096;

/// Whoever waits for a call waits at most `STORE_TIMEOUT` or the settler's second; a
/// batch not answered in twice the longer is given up, so that a connection that went
/// silent holds up no later batch. The store would drop its calls anyway: they are past
/// their deadlines.
fn give_up_after(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(1)) * 2
}

/// One store call under way for a group: its replies, in the group's order.
pub(crate) type Sent<R> = Pin<Box<dyn Future<Output = Result<Vec<R>, TripError>> + Send>>;

/// What a call is grouped by.
pub(crate) type KeyOf<G> = fn(&<G as Group>::Call) -> <G as Group>::Key;

/// How one store sends a group of calls.
pub(crate) trait Group: Send + Sync + 'static {
    /// One caller's call.
    type Call: Send + 'static;
    /// One caller's reply.
    type Reply: Send + 'static;
    /// What calls are grouped by (a Redis Cluster slot).
    type Key: Eq + Hash + Send;
    /// The store, as errors name it.
    const STORE: &'static str;

    /// How this batch's calls are grouped: calls under different keys never ride one
    /// store call. None: the batch is one group.
    fn grouping(&self) -> Option<KeyOf<Self>>;

    /// One store call for `calls`, under way once first polled: their replies in order.
    fn send(&self, calls: Vec<Self::Call>) -> Sent<Self::Reply>;
}

/// Where one caller waits for its reply.
type Answer<R> = oneshot::Sender<Result<R, TripError>>;

/// One call waiting for its batch.
struct Queued<G: Group> {
    call: G::Call,
    answer: Answer<G::Reply>,
}

/// The queue into the batching task of one store.
pub(crate) struct Batcher<G: Group> {
    queue: mpsc::Sender<Queued<G>>,
}

impl<G: Group> Clone for Batcher<G> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<G: Group> Batcher<G> {
    /// The batcher sending through `group`, at most `max_out` batches out at once, its
    /// calls waited for as `timeout` says (on the current tokio runtime).
    pub(crate) fn start(group: G, max_out: usize, timeout: Duration) -> Self {
        let (queue, calls) = mpsc::channel(MAX_QUEUED);
        let group = Arc::new(group);
        tokio::spawn(run(calls, group, max_out.max(1), give_up_after(timeout)));
        Self { queue }
    }

    /// `call` in the next batch; its reply.
    pub(crate) async fn call(&self, call: G::Call) -> Result<G::Reply, TripError> {
        let (answer, reply) = oneshot::channel();
        if self.queue.send(Queued { call, answer }).await.is_err() {
            return Err(TripError::NotConnected);
        }
        reply.await.unwrap_or(Err(TripError::NotConnected))
    }
}

/// Sends batches, at most `max_out` at a time, until every [`Batcher`] is gone.
async fn run<G: Group>(
    mut calls: mpsc::Receiver<Queued<G>>,
    group: Arc<G>,
    max_out: usize,
    give_up: Duration,
) {
    let mut out = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(MAX_BATCH);
    loop {
        tokio::select! {
            received = calls.recv_many(&mut batch, MAX_BATCH), if out.len() < max_out => {
                if received == 0 {
                    break;
                }
                // Sized for a full batch, so that receiving never grows it.
                let calls = std::mem::replace(&mut batch, Vec::with_capacity(MAX_BATCH));
                out.push(send_all(group.clone(), calls, give_up));
            }
            Some(()) = out.next(), if !out.is_empty() => {}
        }
    }
    while out.next().await.is_some() {}
}

/// The calls of `batch` still waited for, one store call per group.
async fn send_all<G: Group>(group: Arc<G>, mut batch: Vec<Queued<G>>, give_up: Duration) {
    // A caller that stopped listening (its request dropped) asks nothing more.
    batch.retain(|q| !q.answer.is_closed());
    let Some(key) = group.grouping() else {
        if !batch.is_empty() {
            send(&*group, batch, give_up).await;
        }
        return;
    };
    let mut groups: HashMap<G::Key, Vec<Queued<G>>> = HashMap::new();
    for queued in batch {
        groups.entry(key(&queued.call)).or_default().push(queued);
    }
    let sent = groups
        .into_values()
        .map(|calls| send(&*group, calls, give_up));
    join_all(sent).await;
}

/// One store call for `calls`, each caller answered with its own reply, or all with the
/// call's error.
async fn send<G: Group>(group: &G, calls: Vec<Queued<G>>, give_up: Duration) {
    let (calls, answers): (Vec<_>, Vec<_>) = calls.into_iter().map(|q| (q.call, q.answer)).unzip();
    let count = calls.len();
    match tokio::time::timeout(give_up, group.send(calls)).await {
        Ok(Ok(replies)) if replies.len() == count => {
            for (answer, reply) in answers.into_iter().zip(replies) {
                // A caller gone stopped waiting: nothing to tell.
                let _ = answer.send(Ok(reply));
            }
        }
        Ok(Ok(replies)) => {
            let error = Miscounted {
                store: G::STORE,
                replies: replies.len(),
                calls: count,
            };
            answer_all(answers, &TripError::Failed(Arc::new(error)));
        }
        Ok(Err(e)) => answer_all(answers, &e),
        Err(_) => {
            let error = GaveUp {
                store: G::STORE,
                after: give_up,
            };
            answer_all(answers, &TripError::Lost(Arc::new(error)));
        }
    }
}

/// A batch given up on.
#[derive(Debug, thiserror::Error)]
#[error("{store} did not answer a batch of calls in {after:?}")]
struct GaveUp {
    store: &'static str,
    after: Duration,
}

/// A batch's reply that does not hold one reply per call.
#[derive(Debug, thiserror::Error)]
#[error("{store} replied to a batch of {calls} calls with {replies} replies")]
struct Miscounted {
    store: &'static str,
    replies: usize,
    calls: usize,
}

/// Every one waiting on `answers` answered with `error`.
fn answer_all<R>(answers: Vec<Answer<R>>, error: &TripError) {
    for answer in answers {
        // A caller gone stopped waiting: nothing to tell.
        let _ = answer.send(Err(error.clone()));
    }
}
