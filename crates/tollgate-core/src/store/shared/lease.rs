//! Leases: a counter this instance admits often takes a block of units from the shared
//! store in one call (counted there as consumed) and admits from it locally, giving back
//! what it did not spend when demand drops or the block's window ends.
//!
//! A block may be spent only where the store counted it (docs/SHARED-STORE.md, Leases):
//! until the end of the take's window (fixed) or sub-window (sliding), and for GCRA only
//! as fast as the bucket would have refilled it. Store time is bounded from above by the
//! store's clock at the take plus the local time elapsed since the call was sent, so a
//! clock estimate never stretches a block.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::protocol::Ask;
use crate::algo::{LimitState, Verdict, evaluate};
use crate::clock::{Timestamp, nanos_of};
use crate::limit::{Algorithm, Limit};
use crate::lock::lock;
use crate::store::LeaseView;
use crate::store::store_clock::LocalTime;

/// How hot counters lease blocks of their limit.
#[derive(Debug, Clone, Copy)]
pub struct LeasePolicy {
    /// Whether counters lease at all.
    pub enabled: bool,
    /// The largest block, as a fraction of the counter's smallest limit.
    pub max_fraction: f64,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            max_fraction: 0.01,
        }
    }
}

/// A block is about one period of this instance's traffic on the counter.
pub(crate) const PERIOD: Duration = Duration::from_millis(20);
/// A counter whose largest block would be smaller never leases: a small counter.
const MIN_BLOCK: u64 = 8;
/// Hot counters tracked for leasing at once; past it, new ones go to the store per request.
const MAX_ENTRIES: usize = 10_000;
/// Slots of the table that finds the hot counters among the cold ones, by hash.
const HEAT_SLOTS: usize = 8_192;
/// A block unspent for this many periods is given back.
const IDLE_PERIODS: u32 = 3;

/// The number of the period holding local time `local`, counted from the epoch.
fn period_of(local: LocalTime) -> u64 {
    nanos_of(local.since(LocalTime::default())) / nanos_of(PERIOD)
}

/// When period number `period` begins.
fn period_start(period: u64) -> LocalTime {
    LocalTime::read(Timestamp::from_nanos(
        period.saturating_mul(nanos_of(PERIOD)),
    ))
}

/// How a GCRA limit's block decays: the arrival time the take left, the limit's window
/// and its requests per window.
#[derive(Debug, Clone, Copy)]
struct Decay {
    tat: Timestamp,
    window: Duration,
    requests: u64,
}

/// The store's answer to a take sent at local time `sent_local`: `granted` units of which
/// `to_request` go to the request that asked; `after`, the counter's states after the take
/// at store time `now`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken<'a> {
    pub(crate) granted: u64,
    pub(crate) to_request: u64,
    pub(crate) after: &'a [LimitState],
    pub(crate) now: Timestamp,
    pub(crate) sent_local: LocalTime,
}

/// A block held on one counter.
#[derive(Debug)]
struct Block {
    left: u64,
    /// Store time of the take, and the local time the take was sent.
    taken: Timestamp,
    sent_local: LocalTime,
    /// Store time from which no unit may be spent: the end of the take's window or
    /// sub-window, the earliest over the limits ([`Timestamp::MAX`] for GCRA alone).
    ends: Timestamp,
    /// Per GCRA limit, how the block decays.
    decay: Vec<Decay>,
    /// The store's answer after the take, without the block: room and reset.
    base: Verdict,
    last_spent_local: LocalTime,
    limits: Vec<Limit>,
}

impl Block {
    /// The latest the store's clock can be at local time `local`.
    fn store_time(&self, local: LocalTime) -> Timestamp {
        self.taken + local.since(self.sent_local)
    }

    /// Units that may be spent at local time `local`.
    fn spendable(&self, local: LocalTime) -> u64 {
        let store = self.store_time(local);
        if store >= self.ends {
            return 0;
        }
        self.decay.iter().fold(self.left, |most, decay| {
            let ahead = u128::from(nanos_of(decay.tat.since(store)));
            let window = u128::from(nanos_of(decay.window).max(1));
            let refilled = ahead * u128::from(decay.requests) / window;
            most.min(u64::try_from(refilled).unwrap_or(u64::MAX))
        })
    }
}

/// A counter's requests: in the period `period`, and in the whole period before it.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    period: u64,
    count: u64,
    /// Requests in the last whole period.
    rate: u64,
}

impl Seen {
    /// `n` more requests in period `period`.
    fn see(&mut self, period: u64, n: u64) {
        if period != self.period {
            self.rate = if period == self.period + 1 {
                self.count
            } else {
                0
            };
            self.period = period;
            self.count = 0;
        }
        self.count = self.count.saturating_add(n);
    }
}

/// One slot of the heat table: the counter last seen there (its key's hash) and its
/// requests.
#[derive(Debug, Default, Clone, Copy)]
struct Heat {
    tag: u64,
    seen: Seen,
}

/// The counters this instance tracks: an entry per hot counter, and the heat table every
/// other counter is counted in until it turns hot. Most counters see a few requests a
/// second; counted by hash in a fixed table, their requests copy no key, and they neither
/// fill the entries nor keep a counter that turns hot from having one. Counters sharing a
/// slot push each other out, which only delays finding a hot one by a period or two.
#[derive(Debug)]
struct Tracked {
    entries: HashMap<String, Entry>,
    heat: Box<[Heat]>,
}

impl Tracked {
    /// `n` more requests on counter `key` in period `period`; its entry, if it has one or
    /// the heat table (its key hashed by `hasher`) finds it hot with room for one.
    fn see(&mut self, key: &str, hasher: &RandomState, period: u64, n: u64) -> Option<&mut Entry> {
        if !self.entries.contains_key(key) {
            let tag = hasher.hash_one(key);
            let index = usize::try_from(tag % HEAT_SLOTS as u64).ok()?;
            let slot = self.heat.get_mut(index)?;
            if slot.tag != tag {
                *slot = Heat {
                    tag,
                    seen: Seen::default(),
                };
            }
            slot.seen.see(period, n);
            if slot.seen.rate < 2 || self.entries.len() >= MAX_ENTRIES {
                return None;
            }
            // The entry counts from here; once swept, the counter starts cold again.
            let seen = std::mem::take(slot).seen;
            let entry = Entry {
                seen,
                ..Entry::default()
            };
            return Some(self.entries.entry(key.to_owned()).or_insert(entry));
        }
        let entry = self.entries.get_mut(key)?;
        entry.seen.see(period, n);
        Some(entry)
    }
}

/// What this instance knows of one counter it may lease.
#[derive(Debug, Default)]
struct Entry {
    seen: Seen,
    /// While a take is out: woken when it is answered or fails.
    taking: Option<Arc<Notify>>,
    block: Option<Block>,
    /// The store's room after the last take, which a next block stays well within, and
    /// the local time it is known until: the end of the take's window (it only shrinks
    /// within it), or for GCRA a period (it grows as the bucket refills).
    room: Option<(u64, LocalTime)>,
}

/// Counts behind the lease metrics.
#[derive(Debug, Default)]
pub(crate) struct LeaseCounts {
    pub(crate) taken: AtomicU64,
    pub(crate) units_leased: AtomicU64,
    pub(crate) units_returned: AtomicU64,
    pub(crate) local_admissions: AtomicU64,
}

/// The leases of one shared store.
#[derive(Debug)]
pub(crate) struct Leases {
    policy: LeasePolicy,
    tracked: Mutex<Tracked>,
    /// Hashes keys for the heat table.
    hasher: RandomState,
    pub(crate) counts: LeaseCounts,
}

/// A block to give back: the counter, its limits, the call.
#[derive(Debug)]
pub(crate) struct GiveBack {
    pub(crate) key: String,
    pub(crate) limits: Vec<Limit>,
    pub(crate) ask: Ask,
}

/// What the counter's block does for a request.
pub(crate) enum Spend {
    /// Admitted from the block held.
    Spent(Verdict),
    /// The block cannot serve it: what the request does next, and a block that can serve
    /// no more, to give back.
    Missed { next: Miss, stale: Option<GiveBack> },
}

/// What a request the counter's block cannot serve does next.
pub(crate) enum Miss {
    /// Goes to the store as usual.
    Usual,
    /// Takes a block of this many units.
    Take(u64),
    /// Waits for the take that is out, then spends from its block: one take serves the
    /// requests that arrive during its round trip, instead of each going to the store.
    Wait(Pin<Box<OwnedNotified>>),
}

impl Leases {
    pub(crate) fn new(policy: LeasePolicy) -> Self {
        let slots = if policy.enabled { HEAT_SLOTS } else { 0 };
        let tracked = Tracked {
            entries: HashMap::new(),
            heat: vec![Heat::default(); slots].into_boxed_slice(),
        };
        Self {
            policy,
            tracked: Mutex::new(tracked),
            hasher: RandomState::new(),
            counts: LeaseCounts::default(),
        }
    }

    /// The largest block of `limits`, 0 if they never lease: leases off, a calendar
    /// window (its boundaries come from the caller's clock), or a small counter.
    fn max_block(&self, limits: &[Limit]) -> u64 {
        let calendar = limits.iter().any(|l| l.calendar().is_some());
        let smallest = limits
            .iter()
            .map(|l| l.requests_per_unit)
            .min()
            .unwrap_or(0);
        // A fraction of a u32 limit: the cast cannot overflow.
        let block = (f64::from(smallest) * self.policy.max_fraction) as u64;
        match self.policy.enabled && !calendar && block >= MIN_BLOCK {
            true => block,
            false => 0,
        }
    }

    /// Admits `n` units from the counter's block at local time `local` if it holds them;
    /// else, when the counter is hot, the block to ask for (marked as being taken) or the
    /// take to wait for. A block that can no longer serve is handed back for giving back.
    pub(crate) fn spend(&self, key: &str, limits: &[Limit], n: u64, local: LocalTime) -> Spend {
        let most = self.max_block(limits);
        if most == 0 || n >= most {
            return Spend::Missed {
                next: Miss::Usual,
                stale: None,
            };
        }
        let mut tracked = lock(&self.tracked);
        let Some(entry) = tracked.see(key, &self.hasher, period_of(local), n) else {
            return Spend::Missed {
                next: Miss::Usual,
                stale: None,
            };
        };
        if let Some(verdict) = self.spend_held(entry, n, local) {
            return Spend::Spent(verdict);
        }
        let stale = entry.block.take().and_then(|b| give_back(key, b));
        if let Some(taking) = &entry.taking {
            // Made under the lock, so the take's answer cannot come between.
            let next = Miss::Wait(Box::pin(taking.clone().notified_owned()));
            return Spend::Missed { next, stale };
        }
        if entry.seen.rate < 2 {
            return Spend::Missed {
                next: Miss::Usual,
                stale,
            };
        }
        // Near the limit, a quarter of the room at the last take: down to one per call.
        let room = entry.room.filter(|&(_, until)| local < until);
        let want = entry
            .seen
            .rate
            .clamp(n, most)
            .min(room.map_or(most, |(room, _)| room / 4));
        if want <= n {
            return Spend::Missed {
                next: Miss::Usual,
                stale,
            };
        }
        entry.taking = Some(Arc::new(Notify::new()));
        Spend::Missed {
            next: Miss::Take(want),
            stale,
        }
    }

    /// After waiting for a take: `n` units from the block it left, if it holds them (the
    /// request was counted in the rate when it first came).
    pub(crate) fn spend_waited(&self, key: &str, n: u64, local: LocalTime) -> Option<Verdict> {
        let mut tracked = lock(&self.tracked);
        let entries = &mut tracked.entries;
        self.spend_held(entries.get_mut(key)?, n, local)
    }

    /// `n` units from the entry's block, if it may spend them at `local`.
    fn spend_held(&self, entry: &mut Entry, n: u64, local: LocalTime) -> Option<Verdict> {
        let block = entry.block.as_mut()?;
        let spendable = block.spendable(local);
        if spendable < n {
            return None;
        }
        // Units past `spendable` (for GCRA, those the bucket has refilled) are dropped, not
        // kept for later: spent late, they would come on top of what the bucket admits anew.
        block.left = spendable - n;
        block.last_spent_local = local;
        self.counts.local_admissions.fetch_add(1, Ordering::Relaxed);
        let mut verdict = block.base;
        verdict.decision.admitted = true;
        verdict.decision.remaining = verdict.decision.remaining.saturating_add(block.left);
        Some(verdict)
    }

    /// The store's answer to a take: the block it grants, handed back when one was held.
    pub(crate) fn took(&self, key: &str, limits: &[Limit], taken: Taken<'_>) -> Option<GiveBack> {
        let Taken {
            granted,
            to_request: n,
            after,
            now,
            sent_local,
        } = taken;
        let base = evaluate(after, limits, now, 0);
        let ends = ends_at(limits, now);
        let known_until = match ends {
            Timestamp::MAX => sent_local + PERIOD,
            ends => sent_local + ends.since(now),
        };
        let mut tracked = lock(&self.tracked);
        let entries = &mut tracked.entries;
        let entry = entries.get_mut(key)?;
        let waiting = entry.taking.take();
        if granted == 0 {
            entry.room = Some((0, known_until));
            wake(waiting);
            return None;
        }
        self.counts.taken.fetch_add(1, Ordering::Relaxed);
        self.counts
            .units_leased
            .fetch_add(granted, Ordering::Relaxed);
        entry.room = Some((base.decision.remaining, known_until));
        let block = Block {
            left: granted - n,
            taken: now,
            sent_local,
            ends,
            decay: decay(after, limits),
            base,
            last_spent_local: sent_local,
            limits: limits.to_vec(),
        };
        let stale = entry.block.replace(block).and_then(|b| give_back(key, b));
        wake(waiting);
        stale
    }

    /// A take that failed: the counter may try again.
    pub(crate) fn failed(&self, key: &str) {
        let mut tracked = lock(&self.tracked);
        let entries = &mut tracked.entries;
        if let Some(entry) = entries.get_mut(key) {
            wake(entry.taking.take());
        }
    }

    /// Blocks idle for a few periods or past their end (all of them when `all`), taken
    /// out to be given back; entries idle as long are forgotten.
    pub(crate) fn sweep(&self, local: LocalTime, all: bool) -> Vec<GiveBack> {
        let idle = |since: LocalTime| all || local.since(since) >= IDLE_PERIODS * PERIOD;
        let mut out = Vec::new();
        let mut tracked = lock(&self.tracked);
        let entries = &mut tracked.entries;
        entries.retain(|key, entry| {
            let done = entry
                .block
                .as_ref()
                .is_some_and(|b| idle(b.last_spent_local) || b.spendable(local) == 0);
            if done && let Some(back) = entry.block.take().and_then(|b| give_back(key, b)) {
                out.push(back);
            }
            entry.taking.is_some()
                || entry.block.is_some()
                || !idle(period_start(entry.seen.period))
        });
        out
    }

    /// The block held on `key` at local time `local`, if any.
    pub(crate) fn view(&self, key: &str, local: LocalTime) -> Option<LeaseView> {
        let tracked = lock(&self.tracked);
        let entries = &tracked.entries;
        let block = entries.get(key)?.block.as_ref()?;
        let ends =
            (block.ends != Timestamp::MAX).then(|| block.ends.since(block.store_time(local)));
        Some(LeaseView {
            left: block.left,
            spendable: block.spendable(local),
            ends,
        })
    }

    /// Counter `key` was reset (all counters: None): the blocks held on it are dropped,
    /// not given back, since what they leased was deleted with it.
    pub(crate) fn forget(&self, key: Option<&str>) {
        let mut tracked = lock(&self.tracked);
        let entries = &mut tracked.entries;
        match key {
            Some(key) => {
                if let Some(entry) = entries.get_mut(key) {
                    entry.block = None;
                }
            }
            None => entries.values_mut().for_each(|entry| entry.block = None),
        }
    }

    /// Counts units given back.
    pub(crate) fn returned(&self, units: u64) {
        self.counts
            .units_returned
            .fetch_add(units, Ordering::Relaxed);
    }
}

/// Wakes the requests waiting for a take that is over.
fn wake(taking: Option<Arc<Notify>>) {
    if let Some(notify) = taking {
        notify.notify_waiters();
    }
}

/// The give-back of what `block` did not spend, if anything and if the store can take it
/// back: it ignores a give-back on GCRA, so one on GCRA limits alone would be a round trip
/// for nothing.
fn give_back(key: &str, block: Block) -> Option<GiveBack> {
    let units = block.left;
    let windowed = block.decay.len() < block.limits.len();
    (units > 0 && windowed).then(|| {
        let ask = Ask::GiveBack {
            units,
            taken: block.taken,
        };
        GiveBack {
            key: key.to_owned(),
            limits: block.limits,
            ask,
        }
    })
}

/// When a block taken at store time `now` stops being spendable: the end of its
/// (sub-)window, in the epoch-aligned integer nanoseconds the stores cut windows in.
fn ends_at(limits: &[Limit], now: Timestamp) -> Timestamp {
    limits
        .iter()
        .map(|l| {
            let span = match l.algorithm {
                Algorithm::SlidingWindow { precision } => {
                    l.window_nanos() / u64::from(precision.max(1))
                }
                Algorithm::FixedWindow => l.window_nanos(),
                // Slots are never leased: in-flight rules always ask the store.
                Algorithm::TokenBucket { .. }
                | Algorithm::LeakyBucket { .. }
                | Algorithm::Slots => {
                    return Timestamp::MAX;
                }
            }
            .max(1);
            Timestamp::from_nanos((now.as_nanos() / span + 1).saturating_mul(span))
        })
        .min()
        .unwrap_or(now)
}

/// Per GCRA limit of `after`: how a block taken on it decays.
fn decay(after: &[LimitState], limits: &[Limit]) -> Vec<Decay> {
    after
        .iter()
        .zip(limits)
        .filter_map(|(state, limit)| match state {
            LimitState::Gcra(g) => Some(Decay {
                tat: g.tat(),
                window: limit.window,
                requests: u64::from(limit.requests_per_unit),
            }),
            LimitState::Sliding(_) | LimitState::Fixed(_) | LimitState::Slots(_) => None,
        })
        .collect()
}

pub(super) mod take;

#[cfg(all(test, feature = "redis"))]
mod on_redis;
#[cfg(test)]
mod simulation;
#[cfg(test)]
mod tests;
