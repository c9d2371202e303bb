//! Counters by key, shared by the memory store and the Redis store's local view: shards each
//! behind a lock held only for a synchronous update, never across an await; expired entries
//! swept in the background; a bound on entries and on bytes, kept by evicting.
//!
//! A counter is found by a keyed 128-bit hash of its key (two independently keyed SipHashes,
//! with keys drawn per process), so that a counter costs no allocation for its name and a
//! 12 KiB key takes no more memory than a short one. Two keys share a counter only if
//! their hashes collide: about 1 in 10^27 for a million counters, and out of a client's
//! reach, since it cannot know the hash keys.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::table::{Key, Table};
use crate::algo::{LimitState, Verdict};
use crate::clock::{Clock, NANOS_PER_SECOND, Timestamp};
use crate::limit::Limit;
use crate::lock::lock;

/// Entries compared when one must be evicted.
const EVICTION_SAMPLES: usize = 8;
/// Shards per core: enough that concurrent requests rarely wait for one another.
const SHARDS_PER_CORE: usize = 16;
/// The fewest entries a shard is made for.
const MIN_PER_SHARD: usize = 16;

/// The limit states of one counter, when they stop mattering, and how much of its limits
/// they hold (what dropping the counter would forgive).
#[derive(Debug, Clone)]
pub(crate) struct CounterState {
    pub(crate) states: States,
    /// Seconds since the epoch, rounded up.
    expires_at_s: u32,
    /// Of the reported limit, the share in use, in 1/65,535ths.
    pressure: u16,
}

/// One limit's state inline (the common case), or several on the heap.
#[derive(Debug, Clone)]
pub(crate) enum States {
    One(LimitState),
    Many(Box<[LimitState]>),
}

impl States {
    pub(crate) fn as_mut_slice(&mut self) -> &mut [LimitState] {
        match self {
            Self::One(state) => std::slice::from_mut(state),
            Self::Many(states) => states,
        }
    }

    pub(crate) fn as_slice(&self) -> &[LimitState] {
        match self {
            Self::One(state) => std::slice::from_ref(state),
            Self::Many(states) => states,
        }
    }
}

impl CounterState {
    /// Fresh states for `limits`.
    pub(crate) fn new(limits: &[Limit]) -> Self {
        Self::from_states(limits.iter().map(LimitState::new).collect())
    }

    /// A counter of states read elsewhere.
    pub(crate) fn from_states(mut states: Vec<LimitState>) -> Self {
        let states = match (states.len(), states.pop()) {
            (1, Some(one)) => States::One(one),
            (_, last) => {
                states.extend(last);
                States::Many(states.into_boxed_slice())
            }
        };
        Self {
            states,
            expires_at_s: 0,
            pressure: 0,
        }
    }

    /// Recomputes expiry and pressure after the states changed and answered `verdict`;
    /// returns the exact expiry.
    pub(crate) fn touch(&mut self, limits: &[Limit], verdict: &Verdict) -> Timestamp {
        let expires = self
            .states
            .as_slice()
            .iter()
            .zip(limits)
            .map(|(s, l)| s.expires_at(l))
            .max()
            .unwrap_or_default();
        self.expires_at_s =
            u32::try_from(expires.as_nanos().div_ceil(NANOS_PER_SECOND)).unwrap_or(u32::MAX);
        let limit = limits
            .get(verdict.limit_index)
            .map_or(1, |l| u64::from(l.requests_per_unit.max(1)));
        let used = limit.saturating_sub(verdict.decision.remaining.min(limit));
        self.pressure = u16::try_from(used * u64::from(u16::MAX) / limit).unwrap_or(u16::MAX);
        expires
    }

    /// Whether the counter no longer affects any decision at `now`.
    pub(crate) fn expired(&self, now: Timestamp) -> bool {
        u64::from(self.expires_at_s) * NANOS_PER_SECOND <= now.as_nanos()
    }

    /// Heap bytes beyond the counter itself.
    fn heap_bytes(&self) -> usize {
        match &self.states {
            States::One(state) => state.heap_bytes(),
            States::Many(states) => {
                std::mem::size_of_val::<[LimitState]>(states)
                    + states.iter().map(LimitState::heap_bytes).sum::<usize>()
            }
        }
    }
}

/// What the map needs of its values.
pub(crate) trait ShardValue {
    /// The counter state the value holds.
    fn state(&self) -> &CounterState;
}

impl ShardValue for CounterState {
    fn state(&self) -> &CounterState {
        self
    }
}

/// Entries of one shard, with the bytes their heap parts take and the shard's sampler.
struct Shard<V> {
    table: Table<V>,
    heap_bytes: usize,
    rng: u64,
}

/// The sharded map.
pub(crate) struct Shards<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    hashers: [RandomState; 2],
    per_shard_entries: usize,
    per_shard_bytes: usize,
    evictions: AtomicU64,
    expired: AtomicU64,
}

/// Sizes and counts for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShardStats {
    pub(crate) entries: usize,
    pub(crate) bytes: usize,
    pub(crate) evictions: u64,
    pub(crate) expired: u64,
}

/// The shard of one key, locked: every operation on that key's entry.
pub(crate) struct Locked<'a, V> {
    shard: Guard<'a, V>,
    key: Key,
    owner: &'a Shards<V>,
}

/// A shard's lock: taken for one key, or borrowed from a [`LockedAll`].
enum Guard<'a, V> {
    Own(MutexGuard<'a, Shard<V>>),
    Borrowed(&'a mut Shard<V>),
}

impl<V> std::ops::Deref for Guard<'_, V> {
    type Target = Shard<V>;

    fn deref(&self) -> &Shard<V> {
        match self {
            Self::Own(guard) => guard,
            Self::Borrowed(shard) => shard,
        }
    }
}

impl<V> std::ops::DerefMut for Guard<'_, V> {
    fn deref_mut(&mut self) -> &mut Shard<V> {
        match self {
            Self::Own(guard) => guard,
            Self::Borrowed(shard) => shard,
        }
    }
}

/// The shards of several keys, locked together in the order of their places, so that two
/// such locks never wait on each other: what a request counted on several counters at
/// once holds while it decides.
pub(crate) struct LockedAll<'a, V> {
    /// Each shard once, by its place among the shards.
    shards: Vec<MutexGuard<'a, Shard<V>>>,
    /// Per key asked, in the order asked: its hash and which of `shards` holds it.
    keys: Vec<(Key, usize)>,
    owner: &'a Shards<V>,
}

impl<V: ShardValue> Shards<V> {
    /// A map holding at most about `max_entries` entries and `max_bytes` bytes.
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        // Small caps get fewer shards, so that each holds a useful number of entries.
        let shards = cores
            .saturating_mul(SHARDS_PER_CORE)
            .clamp(16, 1024)
            .min((max_entries / MIN_PER_SHARD).max(1));
        let seed = RandomState::new();
        Self {
            shards: (0..shards)
                .map(|i| {
                    Mutex::new(Shard {
                        table: Table::default(),
                        heap_bytes: 0,
                        // Any odd, distinct start serves the xorshift sampler.
                        rng: seed.hash_one(i) | 1,
                    })
                })
                .collect(),
            hashers: [RandomState::new(), RandomState::new()],
            // Rounded down: the shards together never hold more than the cap.
            per_shard_entries: (max_entries / shards).max(1),
            per_shard_bytes: max_bytes / shards,
            evictions: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }

    /// Locks the shard holding `key`.
    pub(crate) fn lock(&self, key: &str) -> Locked<'_, V> {
        let (hash, index) = self.place(key);
        Locked {
            shard: Guard::Own(lock(&self.shards[index])),
            key: hash,
            owner: self,
        }
    }

    /// Locks the shards holding `keys`, each once, in the order of their places.
    pub(crate) fn lock_all<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> LockedAll<'_, V> {
        let places: Vec<(Key, usize)> = keys.into_iter().map(|k| self.place(k)).collect();
        let mut indices: Vec<usize> = places.iter().map(|&(_, index)| index).collect();
        indices.sort_unstable();
        indices.dedup();
        let keys = places
            .into_iter()
            .map(|(hash, index)| (hash, indices.partition_point(|&i| i < index)))
            .collect();
        LockedAll {
            shards: indices.iter().map(|&i| lock(&self.shards[i])).collect(),
            keys,
            owner: self,
        }
    }

    /// The hash of `key` and the place of its shard.
    fn place(&self, key: &str) -> (Key, usize) {
        let hash = [
            self.hashers[0].hash_one(key),
            // Never all zeros.
            self.hashers[1].hash_one(key) | 1,
        ];
        let index = ((u128::from(hash[1]) * self.shards.len() as u128) >> 64) as usize;
        (hash, index)
    }

    /// Drops every entry expired at `now`.
    pub(crate) fn sweep(&self, now: Timestamp) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let mut freed = 0;
            let removed = shard.table.retain(|v| {
                let expired = v.state().expired(now);
                if expired {
                    freed += v.state().heap_bytes();
                }
                !expired
            });
            shard.heap_bytes -= freed;
            self.expired.fetch_add(removed as u64, Ordering::Relaxed);
        }
    }

    /// Drops every entry.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            shard.table.retain(|_| false);
            shard.heap_bytes = 0;
        }
    }

    pub(crate) fn stats(&self) -> ShardStats {
        let (mut entries, mut bytes) = (0, 0);
        for shard in self.shards.iter() {
            let shard = lock(shard);
            entries += shard.table.len();
            bytes += shard.table.bytes() + shard.heap_bytes;
        }
        ShardStats {
            entries,
            bytes,
            evictions: self.evictions.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
        }
    }
}

impl<V: ShardValue> Locked<'_, V> {
    pub(crate) fn get(&self) -> Option<&V> {
        self.shard.table.get(&self.key)
    }

    pub(crate) fn get_mut(&mut self) -> Option<&mut V> {
        self.shard.table.get_mut(&self.key)
    }

    pub(crate) fn remove(&mut self) -> Option<V> {
        let removed = self.shard.table.remove(&self.key)?;
        self.shard.heap_bytes -= removed.state().heap_bytes();
        Some(removed)
    }

    /// Inserts or replaces the key's entry, evicting others first while the shard would
    /// exceed its entries or bytes: expired ones first, else the least-used of a random
    /// sample (dropping it forgives the fewest units), soonest-expiring on a tie.
    pub(crate) fn insert(&mut self, value: V, now: Timestamp) {
        let heap = value.state().heap_bytes();
        if let Some(entry) = self.shard.table.get_mut(&self.key) {
            let held = entry.state().heap_bytes();
            if heap <= held {
                // Replaced in place: nothing grows, so nothing else need make room (and
                // the table is spared a removal's shifting and a second probe).
                *entry = value;
                self.shard.heap_bytes -= held - heap;
                return;
            }
        }
        self.remove();
        while self.shard.table.len() > 0 && !self.room_for(heap) {
            self.evict_one(now);
        }
        self.shard.heap_bytes += heap;
        self.shard.table.insert(self.key, value);
    }

    fn room_for(&self, heap: usize) -> bool {
        let table = &self.shard.table;
        let limits = self.owner;
        let slots_after = match table.growth_needed() {
            Some(slots) => Table::<V>::bytes_for(slots),
            None => table.bytes(),
        };
        table.len() < limits.per_shard_entries
            && slots_after + self.shard.heap_bytes + heap <= limits.per_shard_bytes
    }

    fn evict_one(&mut self, now: Timestamp) {
        let shard = &mut *self.shard;
        let mut victim: Option<(Key, (bool, u16, u32))> = None;
        for _ in 0..EVICTION_SAMPLES {
            shard.rng ^= shard.rng << 13;
            shard.rng ^= shard.rng >> 7;
            shard.rng ^= shard.rng << 17;
            let Some((key, value)) = shard.table.sample(shard.rng) else {
                return;
            };
            let c = value.state();
            let rank = (!c.expired(now), c.pressure, c.expires_at_s);
            if victim.is_none_or(|(_, best)| rank < best) {
                victim = Some((key, rank));
            }
        }
        if let Some((key, _)) = victim
            && let Some(gone) = shard.table.remove(&key)
        {
            shard.heap_bytes -= gone.state().heap_bytes();
            self.owner.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<V> LockedAll<'_, V> {
    /// The `i`th key asked, as [`Shards::lock`] would give it.
    pub(crate) fn entry(&mut self, i: usize) -> Option<Locked<'_, V>> {
        let &(key, shard) = self.keys.get(i)?;
        let shard = self.shards.get_mut(shard)?;
        Some(Locked {
            shard: Guard::Borrowed(shard),
            key,
            owner: self.owner,
        })
    }

    /// Whether the `i`th and `j`th keys asked are one counter.
    pub(crate) fn same(&self, i: usize, j: usize) -> bool {
        matches!((self.keys.get(i), self.keys.get(j)), (Some(a), Some(b)) if a.0 == b.0)
    }
}

impl<V: ShardValue + Send + 'static> Shards<V> {
    /// Sweeps every `period` until the map is dropped.
    pub(crate) fn spawn_sweeper(self: &Arc<Self>, clock: Arc<dyn Clock>, period: Duration) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(shards) = weak.upgrade() else { return };
                shards.sweep(clock.now());
            }
        });
    }
}
