//! Who reports which bucket, at what rate each may admit, and what to send: the RLQS state
//! machine, on plain types with an injected clock. The stream adapter feeds it reports
//! (with the bucket's allowance: this instance's part of the limit's rate), closed streams,
//! rule reloads and idle sweeps, and sends what it returns.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, Timestamp};

use super::rate::{burst_s, rate_of, smooth, token_bucket};
use super::report::BucketKey;

/// Identifies one open `StreamRateLimitQuotas` call.
pub(crate) type StreamId = u64;

/// Envoy's interval floor: gaps shorter than this are subscriptions of new buckets, not
/// the reporting timer.
const MIN_REPORTING_INTERVAL: Duration = Duration::from_millis(100);
/// Assumed until a stream's reporting interval has been seen.
const DEFAULT_REPORTING_INTERVAL: Duration = Duration::from_secs(5);
/// Assignments live this many reporting intervals.
const TTL_INTERVALS: u32 = 3;
/// An assigned rate within this fraction of the one due is kept: Envoy restarts a token
/// bucket whose settings change (full, a burst more), so small drifts of demand must not.
const KEEP_WITHIN: f64 = 0.05;
/// Another stream is pushed a new rate without waiting for its report when it may admit
/// at least this many times as much.
const PUSH_ABOVE: f64 = 1.1;
/// Buckets one stream may subscribe to.
pub(crate) const MAX_BUCKETS_PER_STREAM: usize = 10_000;
/// Maps this small keep their room.
const SHRINK_FLOOR: usize = 1_024;

/// How Envoy limits a bucket: the strategies Envoy 1.40 enforces (it ignores
/// `requests_per_time_unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    AllowAll,
    DenyAll,
    /// Envoy's token bucket: `max_tokens` at most, refilled continuously at
    /// `tokens_per_fill` per `fill_interval_s` (whole seconds: Envoy reads only those).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: u64,
    },
}

/// What one bucket of one stream is told: an assignment to enforce until its time to
/// live ends, or to forget the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Enforce `strategy` for `ttl_s` whole seconds (Envoy reads only the seconds);
    /// `fresh`: a token bucket other than the one the stream holds, to be started full.
    Assign {
        strategy: Strategy,
        ttl_s: u64,
        fresh: bool,
    },
    /// Forget the bucket and stop reporting it.
    Abandon,
}

/// A message for a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Message {
    pub(crate) stream: StreamId,
    pub(crate) bucket: BucketKey,
    pub(crate) action: Action,
}

/// What the rules and the store say about a bucket now: an answer for every stream, or
/// the rate this instance's streams divide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Allowance {
    /// The same answer whatever is counted: no rule, unlimited, a limit of 0, shadow mode.
    Fixed(Strategy),
    /// A limit: this instance's streams may admit `per_s` requests per second together;
    /// the limit's window is `window`.
    Rate { per_s: f64, window: Duration },
}

/// One stream's part in one bucket.
#[derive(Debug)]
struct Sub {
    /// Requests per second, smoothed; meaningful once `measured`.
    demand: f64,
    /// Reported since it subscribed: its demand is a rate, not the request that
    /// subscribed it.
    measured: bool,
    last_report: Timestamp,
    /// Last report with any request in it (or the subscription).
    last_active: Timestamp,
    assigned: Option<Strategy>,
}

#[derive(Debug)]
struct Bucket {
    allowance: Allowance,
    subs: HashMap<StreamId, Sub>,
}

#[derive(Debug, Default)]
struct StreamState {
    buckets: HashSet<BucketKey>,
    interval: Option<Duration>,
}

/// What streams leaving buckets (closed, or abandoned when idle) lead to.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Departures {
    /// Abandons, and pushes to the streams left.
    pub(crate) sends: Vec<Message>,
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
    idle: Duration,
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
            idle,
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

    /// How long the report `stream` is making for `bucket` covers: since its last report
    /// of it, if it reported it before.
    pub(crate) fn period(&self, stream: StreamId, bucket: &BucketKey) -> Option<Duration> {
        let sub = self.buckets.get(bucket)?.subs.get(&stream)?;
        Some(self.clock.now().since(sub.last_report))
    }

    /// One bucket's usage report from `stream`, with the bucket's allowance now: the answer
    /// for it, then pushes to the bucket's other streams that the change entitles to more.
    pub(crate) fn report(
        &mut self,
        stream: StreamId,
        bucket: &BucketKey,
        allowed: u64,
        denied: u64,
        allowance: Allowance,
    ) -> Result<Vec<Message>, TooManyBuckets> {
        let now = self.clock.now();
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
                allowance,
                subs: HashMap::new(),
            });
        entry.allowance = allowance;
        let requests = allowed.saturating_add(denied);
        match entry.subs.get_mut(&stream) {
            Some(sub) => {
                let gap = now.since(sub.last_report);
                // A report right after another (a new bucket's own) is counted with the next.
                if gap >= MIN_REPORTING_INTERVAL {
                    state.interval = Some(gap);
                    let observed = requests as f64 / gap.as_secs_f64();
                    sub.demand = smooth(sub.measured.then_some(sub.demand), observed);
                    sub.measured = true;
                    sub.last_report = now;
                }
                if requests > 0 {
                    sub.last_active = now;
                }
            }
            None => {
                self.subscriptions += 1;
                entry.subs.insert(
                    stream,
                    Sub {
                        demand: 0.0,
                        measured: false,
                        last_report: now,
                        last_active: now,
                        assigned: None,
                    },
                );
            }
        }
        let ttl_s = ttl_s(state.interval);
        let strategy = entry.candidate(stream);
        let fresh = entry.assign(stream, strategy);
        let mut out = vec![Message {
            stream,
            bucket: bucket.clone(),
            action: Action::Assign {
                strategy,
                ttl_s,
                fresh,
            },
        }];
        out.extend(self.rebalance(bucket, Some(stream)));
        Ok(out)
    }

    /// `stream` is gone: its rate goes to the streams left.
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
        let now = self.clock.now();
        let idle: Vec<(BucketKey, StreamId)> = self
            .buckets
            .iter()
            .flat_map(|(key, bucket)| {
                bucket
                    .subs
                    .iter()
                    .filter(|(_, sub)| now.since(sub.last_active) >= self.idle)
                    .map(move |(id, _)| (key.clone(), *id))
            })
            .collect();
        let mut out = Departures::default();
        for (bucket, stream) in idle {
            if let Some(state) = self.streams.get_mut(&stream) {
                state.buckets.remove(&bucket);
            }
            out.sends.push(Message {
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

    /// New rules give `bucket` a new allowance: its rate is divided again from nothing, and
    /// every stream whose assignment changes is told.
    pub(crate) fn replan(&mut self, bucket: &BucketKey, allowance: Allowance) -> Vec<Message> {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return Vec::new();
        };
        entry.allowance = allowance;
        let mut held: Vec<(StreamId, Option<Strategy>)> = entry
            .subs
            .iter_mut()
            .map(|(id, sub)| (*id, sub.assigned.take()))
            .collect();
        held.sort_unstable_by_key(|(id, _)| *id);
        let mut out = Vec::new();
        for (id, old) in held {
            let strategy = entry.candidate(id);
            entry.assign(id, strategy);
            if old == Some(strategy) {
                continue;
            }
            let interval = self.streams.get(&id).and_then(|s| s.interval);
            out.push(Message {
                stream: id,
                bucket: bucket.clone(),
                action: Action::Assign {
                    strategy,
                    ttl_s: ttl_s(interval),
                    fresh: matches!(strategy, Strategy::TokenBucket { .. }),
                },
            });
        }
        out
    }

    pub(crate) fn stats(&self) -> TableStats {
        TableStats {
            streams: self.streams.len(),
            buckets: self.buckets.len(),
        }
    }

    /// Takes `stream` out of `bucket`: its rate goes to the streams left.
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
            out.sends.extend(self.rebalance(bucket, None));
        }
    }

    /// Pushes to the streams of `bucket` (but `except`) that may admit more now — a denied stream
    /// that may now admit, or a rate that grows by a quarter or more. Taking rate back
    /// needs no push: every report lowers a rate that its stream's demand no longer
    /// justifies, and no stream is given rate another still holds.
    fn rebalance(&mut self, bucket: &BucketKey, except: Option<StreamId>) -> Vec<Message> {
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
            let Some(sub) = entry.subs.get(&id) else {
                continue;
            };
            let candidate = entry.candidate(id);
            let push = match (sub.assigned, candidate) {
                (Some(Strategy::DenyAll), Strategy::TokenBucket { .. }) => true,
                (Some(old @ Strategy::TokenBucket { .. }), Strategy::TokenBucket { .. }) => {
                    rate_of(candidate) >= PUSH_ABOVE * rate_of(old)
                }
                _ => false,
            };
            if push {
                let fresh = entry.assign(id, candidate);
                let interval = self.streams.get(&id).and_then(|s| s.interval);
                out.push(Message {
                    stream: id,
                    bucket: bucket.clone(),
                    action: Action::Assign {
                        strategy: candidate,
                        ttl_s: ttl_s(interval),
                        fresh,
                    },
                });
            }
        }
        out
    }
}

impl Bucket {
    /// What `stream` would be assigned now: its part of the allowance's rate by demand, but
    /// no more than the other streams leave, so that the rates assigned here never add up
    /// to more than the allowance; the rate it holds if that is close enough.
    fn candidate(&self, stream: StreamId) -> Strategy {
        let (per_s, window) = match self.allowance {
            Allowance::Fixed(strategy) => return strategy,
            Allowance::Rate { per_s, window } => (per_s, window),
        };
        let Some(sub) = self.subs.get(&stream) else {
            return Strategy::DenyAll;
        };
        let others: f64 = self
            .subs
            .iter()
            .filter(|(id, _)| **id != stream)
            .filter_map(|(_, s)| s.assigned)
            .map(rate_of)
            .filter(|rate| rate.is_finite())
            .sum();
        let room = (per_s - others).max(0.0);
        let held = sub.assigned.map_or(0.0, rate_of);
        let due = self.fair(stream).min(room);
        if let Some(held_bucket @ Strategy::TokenBucket { .. }) = sub.assigned
            && held <= room
            && (due - held).abs() <= KEEP_WITHIN * held
        {
            return held_bucket;
        }
        token_bucket(due, burst_s(window))
    }

    /// `stream`'s part of the allowance's rate, by demand. A stream that has only subscribed
    /// showed one request, not a rate: it counts as the others do on average, and twice,
    /// as if an equal newcomer followed, so that the first Envoy of a bucket does not take
    /// the whole rate before the others have subscribed.
    fn fair(&self, stream: StreamId) -> f64 {
        let Allowance::Rate { per_s, .. } = self.allowance else {
            return 0.0;
        };
        let measured: Vec<f64> = self
            .subs
            .values()
            .filter(|s| s.measured)
            .map(|s| s.demand)
            .collect();
        let typical = match measured.len() {
            0 => 1.0,
            n => (measured.iter().sum::<f64>() / n as f64).max(f64::MIN_POSITIVE),
        };
        let demand = |s: &Sub| if s.measured { s.demand } else { typical };
        let Some(sub) = self.subs.get(&stream) else {
            return 0.0;
        };
        let newcomer = if sub.measured { 0.0 } else { typical };
        let total = self.subs.values().map(demand).sum::<f64>() + newcomer;
        match total > 0.0 {
            true => per_s * demand(sub) / total,
            false => per_s / self.subs.len().max(1) as f64,
        }
    }

    /// Records that `stream` was told `strategy`; whether it is a token bucket other than
    /// the one it held (Envoy starts it full).
    fn assign(&mut self, stream: StreamId, strategy: Strategy) -> bool {
        let Some(sub) = self.subs.get_mut(&stream) else {
            return false;
        };
        let fresh =
            matches!(strategy, Strategy::TokenBucket { .. }) && sub.assigned != Some(strategy);
        sub.assigned = Some(strategy);
        fresh
    }
}

/// A few reporting intervals, in whole seconds.
fn ttl_s(interval: Option<Duration>) -> u64 {
    let ttl = interval
        .unwrap_or(DEFAULT_REPORTING_INTERVAL)
        .saturating_mul(TTL_INTERVALS);
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests;
