//! Runtime overrides kept in the shared store, which is their truth. A change is one call
//! of the store's own (the Redis script, a SQL function) that refuses to run past a
//! deadline, enforces the maximum of live overrides, purges expired ones, logs the
//! descriptor's id with a new version and announces it. An instance reads the log after
//! the version it holds, and the whole set only at start, when the log no longer reaches
//! back to it (another epoch, trimmed past it), or when asked to, now and then, to heal
//! what a change made around the log (by hand, by an older Tollgate) left out.
//!
//! A change answered with an error was not made: the store said so, or the answer did
//! not come and, once the deadline has passed in store time, the store is asked what it
//! holds. Only when that cannot be asked either is the outcome said to be unknown.

use std::time::Duration;

use super::backend::{LogRead, OverrideChange, Pending, TripError, Written};
use super::{RESET_TIMEOUT, SharedStore, operator_error};
use crate::clock::Timestamp;
use crate::overrides::{ChangeError, Changed, OverrideFeed, OverrideUpdate};
use crate::store::StoreError;

/// How long after its deadline the answer to a change is still awaited before the store
/// is asked what it holds.
const HEAR_GRACE: Duration = Duration::from_secs(1);
/// How long after the deadline the store may take to tell, by its answer or by what it
/// holds.
const SETTLE_WAIT: Duration = Duration::from_secs(2);
/// Changes read per call of the log.
const LOG_BATCH: usize = 500;
/// About the most JSON read per call of the log.
const LOG_BATCH_BYTES: usize = 1 << 20;
/// Changes read in one catch-up before reading the whole set is cheaper.
const MOST_CHANGES: usize = 20_000;
/// Tries of a whole read that the log keeps outrunning.
const WHOLE_READ_TRIES: usize = 3;

impl SharedStore {
    /// Sets `spec` (an override's JSON, expiring at `expires_at`) as the override of
    /// descriptor `id`, unless that would make more than `max` live overrides.
    pub async fn set_override(
        &self,
        id: &str,
        spec: &str,
        expires_at: Option<u64>,
        max: usize,
    ) -> Result<Changed, ChangeError> {
        self.change_override(id, Some((spec, expires_at)), max)
            .await
    }

    /// Deletes the override of descriptor `id`; the live one deleted, if any.
    pub async fn delete_override(&self, id: &str) -> Result<Changed, ChangeError> {
        self.change_override(id, None, 0).await
    }

    /// What changed in the stored overrides since `feed` (moved past it): the whole set
    /// when `whole` is asked (at most `most` overrides), else what the log tells, or
    /// [`OverrideUpdate::Behind`] when it cannot.
    pub async fn override_updates(
        &self,
        feed: &mut OverrideFeed,
        whole: bool,
        most: usize,
    ) -> Result<OverrideUpdate, StoreError> {
        let read = async {
            if whole {
                return self.read_whole(feed, most).await;
            }
            Ok(match self.catch_up(feed).await? {
                Some(changed) => OverrideUpdate::Changed(changed),
                None => OverrideUpdate::Behind,
            })
        };
        match tokio::time::timeout(self.operator_wait() * 4, read).await {
            Err(_) => Err(StoreError::Timeout),
            Ok(result) => result.map_err(operator_error),
        }
    }

    /// Waits until an announcement says the stored overrides may have changed (one heard
    /// while nobody waited counts for the next wait).
    pub async fn overrides_changed(&self) {
        self.overrides_changed.notified().await;
    }

    /// How long an operator's call waits for the store.
    fn operator_wait(&self) -> Duration {
        self.behaviour.timeout.max(RESET_TIMEOUT)
    }

    async fn change_override(
        &self,
        id: &str,
        set: Option<(&str, Option<u64>)>,
        max: usize,
    ) -> Result<Changed, ChangeError> {
        let wait = self.operator_wait();
        // Without the store's clock no deadline can bind the change: it is not sent.
        let Some(deadline) = self.local.deadline(self.now(), wait) else {
            return Err(ChangeError::NotMade(StoreError::NotConnected));
        };
        let change = OverrideChange {
            id,
            set,
            max: u64::try_from(max).unwrap_or(u64::MAX),
            deadline,
        };
        let mut sent = self.backend.change_override(change);
        let (failed, pending) = match tokio::time::timeout(wait + HEAR_GRACE, &mut sent).await {
            Ok(answer) => match heard(answer) {
                Heard::Said(outcome) => return outcome,
                Heard::Lost(lost) => (lost, None),
            },
            Err(_) => (StoreError::Timeout, Some(sent)),
        };
        let expected = set.map(|(spec, _)| spec);
        self.settle_change(id, expected, deadline, failed, pending)
            .await
    }

    /// Whether a change whose answer has not come was made: its answer is still awaited,
    /// and once its deadline has passed in store time, when nothing can change it any
    /// more, the store is asked what it holds; whichever tells first, within
    /// [`SETTLE_WAIT`] of the deadline.
    async fn settle_change(
        &self,
        id: &str,
        expected: Option<&str>,
        deadline: Timestamp,
        failed: StoreError,
        pending: Option<Pending<Written>>,
    ) -> Result<Changed, ChangeError> {
        let answer = async {
            match pending {
                Some(sent) => match heard(sent.await) {
                    Heard::Said(outcome) => outcome,
                    Heard::Lost(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        let asked = async {
            loop {
                let now = self.now();
                if now > deadline {
                    break;
                }
                tokio::time::sleep(deadline.since(now) + Duration::from_millis(1)).await;
            }
            match self.backend.override_of(id).await {
                Ok(stored) if stored.as_deref() == expected => Ok(Changed::Settled),
                Ok(_) => Err(ChangeError::NotMade(StoreError::Timeout)),
                Err(_) => std::future::pending().await,
            }
        };
        let settled = async {
            tokio::select! {
                outcome = answer => outcome,
                outcome = asked => outcome,
            }
        };
        let most = deadline.since(self.now()) + SETTLE_WAIT;
        tokio::time::timeout(most, settled)
            .await
            .unwrap_or(Err(ChangeError::Unknown(failed)))
    }

    /// The changes after `feed`, which moves past them; none when the log cannot tell
    /// them (never read, another epoch, trimmed past it, or too many).
    async fn catch_up(
        &self,
        feed: &mut OverrideFeed,
    ) -> Result<Option<Vec<(String, Option<String>)>>, TripError> {
        let Some((mut epoch, since)) = feed.at.clone() else {
            return Ok(None);
        };
        let mut changed = Vec::new();
        let mut at = since;
        loop {
            let read = self
                .backend
                .override_log(at, LOG_BATCH, LOG_BATCH_BYTES)
                .await?;
            // Read when the store had no log: its first epoch holds every change since,
            // from version 0, until trimmed.
            if epoch.is_empty() && at == 0 && read.trimmed == 0 {
                epoch.clone_from(&read.epoch);
            }
            if read.epoch != epoch || read.trimmed > at || read.version < at {
                return Ok(None);
            }
            let LogRead {
                version,
                upto,
                complete,
                changed: batch,
                ..
            } = read;
            changed.extend(batch);
            if changed.len() > MOST_CHANGES {
                return Ok(None);
            }
            // A forged entry could make the log go nowhere: it must move on.
            let next = if complete { version } else { upto };
            if next <= at && !complete {
                return Ok(None);
            }
            at = next;
            if complete {
                feed.at = Some((epoch, at));
                return Ok(Some(changed));
            }
        }
    }

    /// The whole set: the log's version first, every override, then the changes made
    /// while they were read, applied over them.
    async fn read_whole(
        &self,
        feed: &mut OverrideFeed,
        most: usize,
    ) -> Result<OverrideUpdate, TripError> {
        for _ in 0..WHOLE_READ_TRIES {
            let start = self.backend.override_log(0, 0, 0).await?;
            let mut all: std::collections::BTreeMap<String, String> = self
                .backend
                .all_overrides(most)
                .await?
                .into_iter()
                .collect();
            let mut at = OverrideFeed {
                at: Some((start.epoch, start.version)),
            };
            let Some(changed) = self.catch_up(&mut at).await? else {
                continue;
            };
            for (id, spec) in changed {
                match spec {
                    Some(spec) => all.insert(id, spec),
                    None => all.remove(&id),
                };
            }
            *feed = at;
            return Ok(OverrideUpdate::All(all.into_iter().collect()));
        }
        Err(TripError::Failed(std::sync::Arc::new(LogOutran)))
    }
}

/// What the answer to a change tells.
enum Heard {
    /// What happened.
    Said(Result<Changed, ChangeError>),
    /// Nothing: the connection failed, and the change may have been made.
    Lost(StoreError),
}

/// What `answer` tells of a change.
fn heard(answer: Result<Written, TripError>) -> Heard {
    Heard::Said(match answer {
        Ok(Written::Done(previous)) => Ok(Changed::Made(previous)),
        Ok(Written::Full(live)) => Ok(Changed::Full(live)),
        Ok(Written::Late) => Err(ChangeError::NotMade(StoreError::Timeout)),
        // Lost on its way: the store may have made it.
        Err(lost @ TripError::Lost(_)) => return Heard::Lost(operator_error(lost)),
        // Not sent, refused by the store, or cancelled by its statement timeout and
        // rolled back: not made.
        Err(e) => Err(ChangeError::NotMade(operator_error(e))),
    })
}

/// The log changed faster than the whole set could be read, try after try.
#[derive(Debug, thiserror::Error)]
#[error("the overrides changed faster than they could be read whole")]
struct LogOutran;
