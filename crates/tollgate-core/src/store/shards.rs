//! A sharded map of counter key → state, shared by the memory store and the Redis store's
//! local view: one lock per shard, held only for a synchronous update, never across an
//! await; expired entries swept in the background; a cap on entries.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::algo::LimitState;
use crate::clock::Clock;
use crate::limit::Limit;

/// Entries evicted when a full shard needs room: the soonest-expiring of a few samples.
const EVICTION_SAMPLES: usize = 8;

/// The limit states of one counter and when all of them stop mattering.
#[derive(Debug, Clone)]
pub(crate) struct Counter {
    pub(crate) states: Vec<LimitState>,
    pub(crate) expires_at_ns: u64,
}

impl Counter {
    pub(crate) fn new(limits: &[Limit]) -> Self {
        Self {
            states: limits.iter().map(LimitState::new).collect(),
            expires_at_ns: 0,
        }
    }

    /// Recomputes the expiry after the states changed.
    pub(crate) fn touch(&mut self, limits: &[Limit], now_ns: u64) {
        self.expires_at_ns = self
            .states
            .iter()
            .zip(limits)
            .map(|(s, l)| s.expires_at_ns(l))
            .max()
            .unwrap_or(now_ns);
    }
}

/// What the map needs of its values.
pub(crate) trait Expiring {
    fn expires_at_ns(&self) -> u64;
}

impl Expiring for Counter {
    fn expires_at_ns(&self) -> u64 {
        self.expires_at_ns
    }
}

pub(crate) type Shard<V> = HashMap<Box<str>, V>;

/// The sharded map.
pub(crate) struct Shards<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hasher: RandomState,
    per_shard_cap: usize,
    evictions: AtomicU64,
    expired: AtomicU64,
}

/// Sizes and counts for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardStats {
    pub(crate) entries: usize,
    pub(crate) evictions: u64,
    pub(crate) expired: u64,
}

impl<V: Expiring> Shards<V> {
    /// A map holding at most about `max_entries` entries.
    pub(crate) fn new(max_entries: usize) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .saturating_mul(16)
            .next_power_of_two()
            .clamp(16, 1024)
            .min(max_entries.max(1));
        Self {
            shards: (0..shards).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard_cap: max_entries.div_ceil(shards).max(1),
            evictions: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Locks the shard holding `key`.
    pub(crate) fn lock(&self, key: &str) -> MutexGuard<'_, Shard<V>> {
        let index = (self.hasher.hash_one(key) as usize) % self.shards.len();
        lock(&self.shards[index])
    }

    /// Inserts into a locked shard, evicting first if the shard is full.
    pub(crate) fn insert(&self, shard: &mut Shard<V>, key: &str, value: V) {
        if shard.len() >= self.per_shard_cap && !shard.contains_key(key) {
            let victim = shard
                .iter()
                .take(EVICTION_SAMPLES)
                .min_by_key(|(_, v)| v.expires_at_ns())
                .map(|(k, _)| k.clone());
            if let Some(victim) = victim {
                shard.remove(&victim);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        shard.insert(key.into(), value);
    }

    /// Drops every entry expired at `now_ns`.
    pub(crate) fn sweep(&self, now_ns: u64) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|_, v| v.expires_at_ns() > now_ns);
            let removed = (before - shard.len()) as u64;
            self.expired.fetch_add(removed, Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> ShardStats {
        ShardStats {
            entries: self.shards.iter().map(|s| lock(s).len()).sum(),
            evictions: self.evictions.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}

impl<V: Expiring + Send + 'static> Shards<V> {
    /// Sweeps every `period` until the map is dropped.
    pub(crate) fn spawn_sweeper(self: &Arc<Self>, clock: Arc<dyn Clock>, period: Duration) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shards) = weak.upgrade() else { return };
                shards.sweep(clock.now_ns());
            }
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Updates under these locks are plain field writes that cannot be left half-done, so a
    // lock poisoned by a panic elsewhere is still safe to use.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
