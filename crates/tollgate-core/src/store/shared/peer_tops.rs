//! The heavy keys other instances published through the store (`top/snapshot.rs`), the
//! latest of each, kept while fresh: the fleet's part of `/top?scope=fleet`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::lock::lock;
use crate::top::snapshot;

/// How long a snapshot counts once heard: three publishing periods, so that one lost
/// announcement does not drop an instance from the view, and a stopped one soon leaves.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(15);

/// The latest snapshot of each instance, with when it was heard.
#[derive(Debug, Default)]
pub(crate) struct PeerTops(Mutex<HashMap<u64, (Timestamp, String)>>);

impl PeerTops {
    /// Keeps `text`, heard at `now`, as its instance's latest; forgets stale ones.
    pub(crate) fn heard(&self, text: &str, now: Timestamp) {
        let Some((instance, _)) = snapshot::decode(text.lines().next().unwrap_or("")) else {
            return;
        };
        let mut peers = lock(&self.0);
        peers.retain(|_, (at, _)| now.since(*at) < FRESH_FOR);
        peers.insert(instance, (now, text.to_owned()));
    }

    /// The snapshots heard within [`FRESH_FOR`] of `now`.
    pub(crate) fn fresh(&self, now: Timestamp) -> Vec<String> {
        lock(&self.0)
            .values()
            .filter(|(at, _)| now.since(*at) < FRESH_FOR)
            .map(|(_, text)| text.clone())
            .collect()
    }
}
