//! Who reports which bucket, what each was granted, and what to send: the RLQS state
//! machine, on plain types with an injected clock. The stream adapter feeds it reports,
//! closed streams, rule reloads and idle sweeps, reserves the grants it returns in the
//! counter store (`reserve.rs`), and sends them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::Clock;

use super::report::BucketKey;
use super::share::{Split, smooth};

/// Identifies one open `StreamRateLimitQuotas` call.
pub(crate) type StreamId = u64;

/// Envoy's interval floor: gaps shorter than this are subscriptions of new buckets, not
/// the reporting timer.
const MIN_REPORTING_INTERVAL_NS: u64 = 100_000_000;
/// Assumed until a stream's reporting interval has been seen.
const DEFAULT_REPORTING_INTERVAL_NS: u64 = 5_000_000_000;
/// Assignments live this many reporting intervals.
const TTL_INTERVALS: u64 = 3;
/// Buckets one stream may subscribe to.
pub(crate) const MAX_BUCKETS_PER_STREAM: usize = 10_000;
const NS_PER_S: u64 = 1_000_000_000;
/// Maps this small keep their room.
const SHRINK_FLOOR: usize = 1_024;

/// How Envoy limits a bucket (the strategies Envoy 1.40 enforces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    AllowAll,
    DenyAll,
    /// `max_tokens` to spend, sent so that Envoy starts a full bucket; it refills one token
    /// per `fill_interval_s` (whole seconds: Envoy reads only the seconds).
    TokenBucket {
        max_tokens: u32,
        fill_interval_s: u64,
    },
}

/// What one bucket of one stream is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Enforce `strategy` for `ttl_s` whole seconds (Envoy reads only the seconds).
    Assign { strategy: Strategy, ttl_s: u64 },
    /// Forget the bucket and stop reporting it.
    Abandon,
}

/// A message for a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Send {
    pub(crate) stream: StreamId,
    pub(crate) bucket: BucketKey,
    pub(crate) action: Action,
}

/// What the rules and the counter say about a bucket now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    /// The same answer whatever is counted: no rule, unlimited, a limit of 0, shadow mode.
    Fixed(Strategy),
    /// A limit: `remaining` units neither counted nor reserved, in a window of `window_ns`.
    Counted { remaining: u64, window_ns: u64 },
}

/// Tokens granted to a stream and reserved in the counter (counted as if spent) until the
/// stream reports what it did with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reservation {
    pub(crate) at_ns: u64,
    pub(crate) tokens: u64,
    /// Its fixed window ended and the stream was given a new assignment then: nothing of
    /// it was spent after the end. Counted in the window that ended, not in the new one.
    pub(crate) cut: bool,
}

/// One stream's part in one bucket.
#[derive(Debug)]
struct Sub {
    /// Granted since its last report.
    reservations: Vec<Reservation>,
    demand: f64,
    /// Reported since it subscribed: its demand is a rate, not the request that
    /// subscribed it.
    measured: bool,
    last_report_ns: u64,
    /// Last report with any request in it (or the subscription).
    last_active_ns: u64,
    assigned: Option<Strategy>,
}

#[derive(Debug)]
struct Bucket {
    budget: Budget,
    subs: HashMap<StreamId, Sub>,
}

#[derive(Debug, Default)]
struct StreamState {
    buckets: HashSet<BucketKey>,
    interval_ns: Option<u64>,
}

/// What streams leaving buckets (closed, or abandoned when idle) lead to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Departures {
    /// Abandons, and pushes to the streams left.
    pub(crate) sends: Vec<Send>,
    /// Buckets no stream reports any more.
    pub(crate) emptied: Vec<BucketKey>,
    /// The table gave most of its room back: memory worth returning to the system.
    pub(crate) shrunk: bool,
}

/// Why a report was refused: it would subscribe more buckets than a stream, or all
/// streams together, may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TooManyBuckets {
    #[error("a stream may report at most {MAX_BUCKETS_PER_STREAM} buckets")]
    Stream,
    #[error(
        "Tollgate holds at most {0} RLQS buckets over all its streams (RLQS_MAX_BUCKETS), \
         and this report would go past it: report fewer buckets, or spread the Envoys \
         over more replicas"
    )]
    Total(usize),
}

/// Figures for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableStats {
    pub(crate) streams: usize,
    pub(crate) buckets: usize,
}

/// Every subscribed bucket of every open stream.
pub(crate) struct Table {
    clock: Arc<dyn Clock>,
    idle_ns: u64,
    buckets: HashMap<BucketKey, Bucket>,
    streams: HashMap<StreamId, StreamState>,
    /// Subscriptions held (a bucket once per stream reporting it): what memory grows with.
    subscriptions: usize,
    max_subscriptions: usize,
}

impl Table {
    /// A table that abandons buckets after `idle` without requests, and holds at most
    /// `max_subscriptions` over all streams.
    pub(crate) fn new(clock: Arc<dyn Clock>, idle: Duration, max_subscriptions: usize) -> Self {
        Self {
            clock,
            idle_ns: u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX),
            buckets: HashMap::new(),
            streams: HashMap::new(),
            subscriptions: 0,
            max_subscriptions,
        }
    }

    /// A stream opened.
    pub(crate) fn open(&mut self, stream: StreamId) {
        self.streams.entry(stream).or_default();
    }

    /// What `stream` was granted in `bucket` since its last report, handed over to be
    /// settled against the report's usage (the unused part given back) before
    /// [`Table::report`].
    pub(crate) fn take_reservations(
        &mut self,
        stream: StreamId,
        bucket: &BucketKey,
    ) -> Vec<Reservation> {
        self.buckets
            .get_mut(bucket)
            .and_then(|b| b.subs.get_mut(&stream))
            .map(|sub| std::mem::take(&mut sub.reservations))
            .unwrap_or_default()
    }

    /// One bucket's usage report from `stream`, with the budget once its usage was
    /// settled: the answer for it, then pushes to the bucket's other streams that the
    /// change entitles to more. Every token bucket returned is a new grant, to be reserved
    /// in the counter (or [`Table::shrink`]ed).
    pub(crate) fn report(
        &mut self,
        stream: StreamId,
        bucket: &BucketKey,
        allowed: u64,
        denied: u64,
        budget: Budget,
    ) -> Result<Vec<Send>, TooManyBuckets> {
        let now = self.clock.now_ns();
        let state = self.streams.entry(stream).or_default();
        if !state.buckets.contains(bucket) {
            if state.buckets.len() >= MAX_BUCKETS_PER_STREAM {
                return Err(TooManyBuckets::Stream);
            }
            if self.subscriptions >= self.max_subscriptions {
                return Err(TooManyBuckets::Total(self.max_subscriptions));
            }
            state.buckets.insert(bucket.clone());
        }
        let entry = self
            .buckets
            .entry(bucket.clone())
            .or_insert_with(|| Bucket {
                budget,
                subs: HashMap::new(),
            });
        entry.budget = budget;
        let requests = allowed.saturating_add(denied);
        match entry.subs.get_mut(&stream) {
            Some(sub) => {
                let gap = now.saturating_sub(sub.last_report_ns);
                if gap >= MIN_REPORTING_INTERVAL_NS {
                    state.interval_ns = Some(gap);
                }
                sub.demand = smooth(Some(sub.demand), requests);
                sub.measured = true;
                sub.last_report_ns = now;
                if requests > 0 {
                    sub.last_active_ns = now;
                }
            }
            None => {
                self.subscriptions += 1;
                entry.subs.insert(
                    stream,
                    Sub {
                        reservations: Vec::new(),
                        demand: smooth(None, requests),
                        measured: false,
                        last_report_ns: now,
                        last_active_ns: now,
                        assigned: None,
                    },
                );
            }
        }
        let ttl_s = ttl_s(state.interval_ns);
        let strategy = entry.candidate(stream);
        entry.assign(stream, strategy, now);
        let mut out = vec![Send {
            stream,
            bucket: bucket.clone(),
            action: Action::Assign { strategy, ttl_s },
        }];
        out.extend(self.rebalance(bucket, Some(stream), false));
        Ok(out)
    }

    /// The counter had room for only `tokens` of the grant last sent to `stream` (another
    /// instance took the rest first): that much is its grant, a denial if none, until its
    /// next report.
    pub(crate) fn shrink(&mut self, stream: StreamId, bucket: &BucketKey, tokens: u64) {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return;
        };
        if let Budget::Counted { remaining, .. } = &mut entry.budget {
            *remaining = 0;
        }
        let Some(sub) = entry.subs.get_mut(&stream) else {
            return;
        };
        let Some(last) = sub.reservations.last_mut() else {
            return;
        };
        last.tokens = tokens;
        sub.assigned = match (sub.assigned, u32::try_from(tokens)) {
            (
                Some(Strategy::TokenBucket {
                    fill_interval_s, ..
                }),
                Ok(max_tokens),
            ) if max_tokens > 0 => Some(Strategy::TokenBucket {
                max_tokens,
                fill_interval_s,
            }),
            _ => {
                sub.reservations.pop();
                Some(Strategy::DenyAll)
            }
        };
    }

    /// The fixed window of `bucket` that grants made before `end_ns` were reserved in has
    /// ended: each stream still holding one of them is given a new assignment from
    /// `budget` (the new window's) at once, which replaces its token bucket, so that it
    /// spends nothing more of the old grant.
    pub(crate) fn cut(&mut self, bucket: &BucketKey, end_ns: u64, budget: Budget) -> Vec<Send> {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        entry.budget = budget;
        let mut holders: Vec<StreamId> = Vec::new();
        for (id, sub) in &mut entry.subs {
            let mut held = false;
            for r in sub
                .reservations
                .iter_mut()
                .filter(|r| !r.cut && r.at_ns < end_ns)
            {
                r.cut = true;
                held = true;
            }
            if held {
                holders.push(*id);
            }
        }
        holders.sort_unstable();
        let now = self.clock.now_ns();
        let mut out = Vec::new();
        for id in holders {
            let strategy = entry.candidate(id);
            entry.assign(id, strategy, now);
            let interval = self.streams.get(&id).and_then(|s| s.interval_ns);
            out.push(Send {
                stream: id,
                bucket: bucket.clone(),
                action: Action::Assign {
                    strategy,
                    ttl_s: ttl_s(interval),
                },
            });
        }
        out
    }

    /// `stream` is gone: its buckets are shared among the streams left. What it was
    /// granted stays reserved (it may have been spent) until the counter's window forgets
    /// it.
    pub(crate) fn close(&mut self, stream: StreamId) -> Departures {
        let mut out = Departures::default();
        let Some(state) = self.streams.remove(&stream) else {
            return out;
        };
        for bucket in state.buckets {
            self.unsubscribe(&bucket, stream, &mut out);
        }
        out.shrunk = self.give_back_room();
        out
    }

    /// Abandons every bucket of a stream that has had no request for the idle time.
    pub(crate) fn sweep(&mut self) -> Departures {
        let now = self.clock.now_ns();
        let idle: Vec<(BucketKey, StreamId)> = self
            .buckets
            .iter()
            .flat_map(|(key, bucket)| {
                bucket
                    .subs
                    .iter()
                    .filter(|(_, sub)| now.saturating_sub(sub.last_active_ns) >= self.idle_ns)
                    .map(move |(id, _)| (key.clone(), *id))
            })
            .collect();
        let mut out = Departures::default();
        for (bucket, stream) in idle {
            if let Some(state) = self.streams.get_mut(&stream) {
                state.buckets.remove(&bucket);
            }
            out.sends.push(Send {
                stream,
                bucket: bucket.clone(),
                action: Action::Abandon,
            });
            self.unsubscribe(&bucket, stream, &mut out);
        }
        out.shrunk = self.give_back_room();
        out
    }

    /// Gives the maps' room back once most of it is empty (streams with many buckets
    /// closed), so that memory follows what is held rather than its peak; whether it did.
    fn give_back_room(&mut self) -> bool {
        let mut shrunk = false;
        if self.buckets.capacity() > 4 * self.buckets.len().max(SHRINK_FLOOR) {
            self.buckets.shrink_to(2 * self.buckets.len());
            shrunk = true;
        }
        if self.streams.capacity() > 4 * self.streams.len().max(SHRINK_FLOOR) {
            self.streams.shrink_to(2 * self.streams.len());
            shrunk = true;
        }
        shrunk
    }

    /// The buckets subscribed now, to re-plan after the rules changed.
    pub(crate) fn buckets(&self) -> Vec<BucketKey> {
        self.buckets.keys().cloned().collect()
    }

    /// New rules give `bucket` a new budget: every stream whose assignment changes is told.
    pub(crate) fn replan(&mut self, bucket: &BucketKey, budget: Budget) -> Vec<Send> {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        entry.budget = budget;
        self.rebalance(bucket, None, true)
    }

    pub(crate) fn stats(&self) -> TableStats {
        TableStats {
            streams: self.streams.len(),
            buckets: self.buckets.len(),
        }
    }

    /// Takes `stream` out of `bucket`: its share goes to the streams left.
    fn unsubscribe(&mut self, bucket: &BucketKey, stream: StreamId, out: &mut Departures) {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return;
        };
        if entry.subs.remove(&stream).is_some() {
            self.subscriptions -= 1;
        }
        if entry.subs.is_empty() {
            self.buckets.remove(bucket);
            out.emptied.push(bucket.clone());
        } else {
            out.sends.extend(self.rebalance(bucket, None, false));
        }
    }

    /// Pushes to the streams of `bucket` (but `except`) whose assignment should change:
    /// after new rules (`replan`) any change; otherwise only more room — a denied stream
    /// that may now admit, or a grant that has at least doubled. Taking room back needs no
    /// push: every report shrinks a grant that its stream's demand no longer justifies.
    fn rebalance(
        &mut self,
        bucket: &BucketKey,
        except: Option<StreamId>,
        replan: bool,
    ) -> Vec<Send> {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        let mut ids: Vec<StreamId> = entry
            .subs
            .keys()
            .copied()
            .filter(|id| Some(*id) != except)
            .collect();
        ids.sort_unstable();
        let mut out = Vec::new();
        for id in ids {
            let Some(assigned) = entry.subs.get(&id).and_then(|s| s.assigned) else {
                continue;
            };
            let candidate = entry.candidate(id);
            let push = match (assigned, candidate) {
                _ if replan => candidate != assigned,
                (Strategy::DenyAll, Strategy::TokenBucket { .. }) => true,
                (
                    Strategy::TokenBucket {
                        max_tokens: old, ..
                    },
                    Strategy::TokenBucket {
                        max_tokens: new, ..
                    },
                ) => u64::from(new) >= 2 * u64::from(old),
                _ => false,
            };
            if push {
                entry.assign(id, candidate, self.clock.now_ns());
                let interval = self.streams.get(&id).and_then(|s| s.interval_ns);
                out.push(Send {
                    stream: id,
                    bucket: bucket.clone(),
                    action: Action::Assign {
                        strategy: candidate,
                        ttl_s: ttl_s(interval),
                    },
                });
            }
        }
        out
    }
}

impl Bucket {
    /// Tokens reserved for the subscribed streams, not reported yet, and still counted.
    fn reserved(&self) -> u64 {
        self.subs
            .values()
            .flat_map(|s| &s.reservations)
            .filter(|r| !r.cut)
            .fold(0, |sum, r| sum.saturating_add(r.tokens))
    }

    /// What `stream` would be assigned now.
    fn candidate(&self, stream: StreamId) -> Strategy {
        let (remaining, window_ns) = match self.budget {
            Budget::Fixed(strategy) => return strategy,
            Budget::Counted {
                remaining,
                window_ns,
            } => (remaining, window_ns),
        };
        let Some(sub) = self.subs.get(&stream) else {
            return Strategy::DenyAll;
        };
        // The streams' reservations are theirs to divide again; the rest of the limit is
        // not (other instances' grants, ShouldRateLimit's counts).
        let reserved = self.reserved();
        // A stream that has only subscribed showed one request, not a rate: it is granted
        // as if an equal newcomer followed, so that the first Envoy of a bucket does not
        // take the whole window before the others have subscribed.
        let newcomer = !sub.measured;
        let split = Split {
            remaining: remaining.saturating_add(reserved),
            outstanding: reserved,
            demand: sub.demand,
            total_demand: self.subs.values().map(|s| s.demand).sum::<f64>()
                + if newcomer { sub.demand } else { 0.0 },
            streams: self.subs.len() + usize::from(newcomer),
        };
        match split.grant() {
            0 => Strategy::DenyAll,
            grant => Strategy::TokenBucket {
                max_tokens: u32::try_from(grant).unwrap_or(u32::MAX),
                fill_interval_s: window_ns.div_ceil(NS_PER_S).max(1),
            },
        }
    }

    /// Records that `stream` was told `strategy`; a token bucket's tokens are reserved.
    fn assign(&mut self, stream: StreamId, strategy: Strategy, now_ns: u64) {
        let Some(sub) = self.subs.get_mut(&stream) else {
            return;
        };
        if let Strategy::TokenBucket { max_tokens, .. } = strategy {
            let tokens = u64::from(max_tokens);
            sub.reservations.push(Reservation {
                at_ns: now_ns,
                tokens,
                cut: false,
            });
            if let Budget::Counted { remaining, .. } = &mut self.budget {
                *remaining = remaining.saturating_sub(tokens);
            }
        }
        sub.assigned = Some(strategy);
    }
}

/// A few reporting intervals, in whole seconds.
fn ttl_s(interval_ns: Option<u64>) -> u64 {
    let interval = interval_ns.unwrap_or(DEFAULT_REPORTING_INTERVAL_NS);
    interval
        .saturating_mul(TTL_INTERVALS)
        .div_ceil(NS_PER_S)
        .max(1)
}

#[cfg(test)]
mod tests;
