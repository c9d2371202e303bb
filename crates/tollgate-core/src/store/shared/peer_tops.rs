//! The heavy keys other instances published through the store (`top/snapshot.rs`), the
//! latest of each, kept while fresh: the fleet's part of `/top?scope=fleet`.
//!
//! Whoever can publish on the store can publish a snapshot, so what is kept is bounded:
//! only what [`snapshot::receive`] believes of each, and at most [`MAX_PEERS`] instances.
//! What is dropped is counted. Entries of rules this instance does not have are left out
//! where the rules are known (`limiter/top.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Timestamp;
use crate::lock::lock;
use crate::top::snapshot::{self, Received};

/// How long a snapshot counts once heard: three publishing periods, so that one lost
/// announcement does not drop an instance from the view, and a stopped one soon leaves.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(15);
/// The most instances whose snapshots are kept at once (at most 7.8 MB of them): a
/// snapshot of one more is dropped until one of them goes stale.
pub(crate) const MAX_PEERS: usize = 1_000;

/// The latest snapshot of each instance, with when it was heard, and what was dropped.
#[derive(Debug, Default)]
pub(crate) struct PeerTops {
    peers: Mutex<HashMap<u64, (Timestamp, String)>>,
    dropped: Dropped,
}

/// Snapshots and entries heard and not kept, by why.
#[derive(Debug, Default)]
struct Dropped {
    /// Snapshots past the size or the entries an instance sends.
    oversized: AtomicU64,
    /// Snapshots of an instance past [`MAX_PEERS`].
    crowded: AtomicU64,
    /// Entries whose counts no instance could reach.
    implausible: AtomicU64,
}

/// What [`PeerTops`] dropped so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopsDropped {
    pub(crate) oversized: u64,
    pub(crate) crowded: u64,
    pub(crate) implausible: u64,
}

impl PeerTops {
    /// Keeps what is believed of `text`, heard at `now`, as its instance's latest;
    /// forgets stale ones.
    pub(crate) fn heard(&self, text: &str, now: Timestamp) {
        let (instance, entries) = match snapshot::receive(text) {
            Received::Kept {
                instance,
                entries,
                implausible,
            } => {
                let implausible = u64::try_from(implausible).unwrap_or(u64::MAX);
                self.dropped
                    .implausible
                    .fetch_add(implausible, Ordering::Relaxed);
                (instance, entries)
            }
            Received::Oversized => {
                self.dropped.oversized.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Received::Unreadable => return,
        };
        let mut peers = lock(&self.peers);
        peers.retain(|_, (at, _)| now.since(*at) < FRESH_FOR);
        if peers.len() >= MAX_PEERS && !peers.contains_key(&instance) {
            self.dropped.crowded.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Written afresh from what is believed: no more than an instance sends.
        peers.insert(instance, (now, snapshot::encode(instance, entries)));
    }

    /// The snapshots heard within [`FRESH_FOR`] of `now`.
    pub(crate) fn fresh(&self, now: Timestamp) -> Vec<String> {
        lock(&self.peers)
            .values()
            .filter(|(at, _)| now.since(*at) < FRESH_FOR)
            .map(|(_, text)| text.clone())
            .collect()
    }

    /// What was dropped so far.
    pub(crate) fn dropped(&self) -> TopsDropped {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        TopsDropped {
            oversized: load(&self.dropped.oversized),
            crowded: load(&self.dropped.crowded),
            implausible: load(&self.dropped.implausible),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::snapshot::{MAX_BYTES, Published};
    use crate::top::{TopBy, TopEntry, TopWindow};

    fn snapshot_of(instance: u64, count: u64) -> String {
        let entry = TopEntry {
            domain: "web".into(),
            rule: "ip".into(),
            descriptor: "ip=a".into(),
            count,
            error: 0,
        };
        let by = TopBy::Hits;
        let window = TopWindow::Hour;
        snapshot::encode(instance, vec![Published { by, window, entry }])
    }

    /// Forged snapshots cost nothing kept: an oversized one is dropped whole, an
    /// implausible count left out, and instances past the bound are not kept; all counted.
    #[test]
    fn what_is_kept_stays_within_bounds_and_the_rest_is_counted() {
        let tops = PeerTops::default();
        let now = Timestamp::from_micros(1_790_000_000_000_000);
        let big = format!("{}\n{}", snapshot_of(1, 3), "x".repeat(1 << 20));
        for _ in 0..300 {
            tops.heard(&big, now);
        }
        assert!(tops.fresh(now).is_empty());
        tops.heard(&snapshot_of(2, u64::MAX), now);
        assert_eq!(tops.fresh(now), [snapshot::encode(2, Vec::new())]);
        for instance in 0..2 * MAX_PEERS as u64 {
            tops.heard(&snapshot_of(instance, 3), now);
        }
        let kept = tops.fresh(now);
        assert_eq!(kept.len(), MAX_PEERS);
        assert!(kept.iter().all(|text| text.len() <= MAX_BYTES));
        assert_eq!(
            tops.dropped(),
            TopsDropped {
                oversized: 300,
                crowded: MAX_PEERS as u64,
                implausible: 1
            }
        );
        // Once the crowd is stale, a new instance is kept again.
        let later = now + FRESH_FOR;
        tops.heard(&snapshot_of(u64::MAX, 3), later);
        assert_eq!(tops.fresh(later), [snapshot_of(u64::MAX, 3)]);
    }
}
