//! Checks queued for one Redis node go out in one script call: each call costs Redis a
//! dispatch and Tollgate an encoding, a reply to parse and a wake-up, shared by the whole
//! batch. Nothing waits on a timer: a few calls are in flight at once, and a call takes
//! whatever was queued meanwhile, so a lone check goes out at once, and under load a
//! check waits at most for one call in flight to come back. Not for a Cluster, where a
//! batch's keys would have to share a slot.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::connect::RedisConnector;
use super::{classify, script};
use crate::algo::Hits;
use crate::limit::Limit;
use crate::store::shared::TripError;
use crate::store::shared::link::Link;

/// Checks in one call at most: enough to share the call's cost, few enough that one
/// script call never holds Redis for long.
const MAX_BATCH: usize = 32;
/// Calls in flight at once: more than one, so that Redis works on one batch while the
/// next one's reply travels.
const IN_FLIGHT: usize = 2;
/// Checks waiting for a call; beyond it, callers wait (their own deadline still applies).
pub(super) const QUEUE: usize = 4_096;

/// One check waiting for its call.
pub(super) struct Job {
    /// The Redis key.
    pub(super) key: String,
    pub(super) limits: Vec<Limit>,
    pub(super) hits: Hits,
    pub(super) deadline_ns: u64,
    pub(super) reply: oneshot::Sender<Result<Vec<i64>, TripError>>,
}

/// Sends the queued checks, as many per call as are queued, until the queue closes.
pub(super) async fn send_batches(
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    mut queue: mpsc::Receiver<Job>,
) {
    let calls = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    loop {
        let Ok(permit) = calls.clone().acquire_owned().await else {
            return;
        };
        if queue.recv_many(&mut jobs, MAX_BATCH).await == 0 {
            return;
        }
        let batch = std::mem::replace(&mut jobs, Vec::with_capacity(MAX_BATCH));
        tokio::spawn(call(link.clone(), script.clone(), batch, permit));
    }
}

/// One script call for `batch`, holding one of the permits for calls in flight; each
/// check gets its own reply, or the call's error.
async fn call(
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    mut batch: Vec<Job>,
    _in_flight: OwnedSemaphorePermit,
) {
    let Some(conn) = link.conn() else {
        return fail(batch, &TripError::NotConnected);
    };
    let mut conn = (*conn).clone();
    let mut invocation = script.prepare_invoke();
    if let [job] = batch.as_slice() {
        invocation.key(&job.key);
        script::add_args(&mut invocation, &job.limits, job.hits, job.deadline_ns, 0);
    } else {
        invocation.arg("b").arg(batch.len());
        for job in &batch {
            invocation.key(&job.key);
            script::add_args(&mut invocation, &job.limits, job.hits, job.deadline_ns, 0);
        }
    }
    let raw: Vec<i64> = match conn.invoke(&invocation).await {
        Ok(raw) => raw,
        Err(e) => return fail(batch, &classify(&link, e)),
    };
    if batch.len() == 1 {
        if let Some(job) = batch.pop() {
            let _ = job.reply.send(Ok(raw));
        }
        return;
    }
    let mut rest = raw.as_slice();
    let mut jobs = batch.into_iter();
    for job in jobs.by_ref() {
        let Some((&len, after)) = rest.split_first() else {
            let _ = job.reply.send(Err(short()));
            break;
        };
        let Some(reply) = usize::try_from(len).ok().and_then(|n| after.get(..n)) else {
            let _ = job.reply.send(Err(short()));
            break;
        };
        rest = &after[reply.len()..];
        let _ = job.reply.send(Ok(reply.to_vec()));
    }
    fail(jobs.collect(), &short());
}

fn fail(batch: Vec<Job>, why: &TripError) {
    for job in batch {
        let _ = job.reply.send(Err(why.clone()));
    }
}

/// A batch reply that holds fewer replies than checks.
fn short() -> TripError {
    TripError::Failed(Arc::new(std::io::Error::other(
        "the batch reply holds fewer replies than checks",
    )))
}
