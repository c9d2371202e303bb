//! Who reports which bucket, what each was granted, and what to send: the RLQS state
//! machine, on plain types with an injected clock. The stream adapter feeds it reports,
//! closed streams, rule reloads and idle sweeps, and sends what it returns.

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

/// How Envoy limits a bucket (the strategies Envoy 1.40 enforces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    AllowAll,
    DenyAll,
    /// Envoy's bucket starts full; it refills `tokens_per_fill` per `fill_interval_s`
    /// (whole seconds: Envoy reads only the seconds).
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
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
    /// A limit: `remaining` units not yet counted in a window of `window_ns`.
    Counted { remaining: u64, window_ns: u64 },
}

/// One stream's part in one bucket.
#[derive(Debug)]
struct Sub {
    /// Granted and not yet seen in a report: may be spent already.
    outstanding: u64,
    demand: f64,
    last_report_ns: u64,
    /// Last report with any request in it (or the subscription).
    last_active_ns: u64,
    assigned: Option<Strategy>,
}

/// A grant of a stream that is gone, held back because it may have been spent unreported.
#[derive(Debug)]
struct Orphan {
    until_ns: u64,
    tokens: u64,
}

#[derive(Debug)]
struct Bucket {
    budget: Budget,
    subs: HashMap<StreamId, Sub>,
    orphans: Vec<Orphan>,
}

#[derive(Debug, Default)]
struct StreamState {
    buckets: HashSet<BucketKey>,
    interval_ns: Option<u64>,
}

/// Why a report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a stream may report at most {MAX_BUCKETS_PER_STREAM} buckets")]
pub(crate) struct TooManyBuckets;

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
}

impl Table {
    /// A table that abandons buckets after `idle` without requests.
    pub(crate) fn new(clock: Arc<dyn Clock>, idle: Duration) -> Self {
        Self {
            clock,
            idle_ns: u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX),
            buckets: HashMap::new(),
            streams: HashMap::new(),
        }
    }

    /// A stream opened.
    pub(crate) fn open(&mut self, stream: StreamId) {
        self.streams.entry(stream).or_default();
    }

    /// One bucket's usage report from `stream`, with the budget after its allowed
    /// requests were counted: the answer for it, then pushes to the bucket's other streams
    /// that the change entitles to more.
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
                return Err(TooManyBuckets);
            }
            state.buckets.insert(bucket.clone());
        }
        let entry = self
            .buckets
            .entry(bucket.clone())
            .or_insert_with(|| Bucket {
                budget,
                subs: HashMap::new(),
                orphans: Vec::new(),
            });
        entry.budget = budget;
        entry.orphans.retain(|o| o.until_ns > now);
        let requests = allowed.saturating_add(denied);
        match entry.subs.get_mut(&stream) {
            Some(sub) => {
                let gap = now.saturating_sub(sub.last_report_ns);
                if gap >= MIN_REPORTING_INTERVAL_NS {
                    state.interval_ns = Some(gap);
                }
                sub.demand = smooth(Some(sub.demand), requests);
                // What it spent is counted now; the answer replaces its token bucket.
                sub.outstanding = 0;
                sub.last_report_ns = now;
                if requests > 0 {
                    sub.last_active_ns = now;
                }
            }
            None => {
                entry.subs.insert(
                    stream,
                    Sub {
                        outstanding: 0,
                        demand: smooth(None, requests),
                        last_report_ns: now,
                        last_active_ns: now,
                        assigned: None,
                    },
                );
            }
        }
        let ttl_s = ttl_s(state.interval_ns);
        let strategy = entry.candidate(stream, allowed > 0);
        entry.assign(stream, strategy);
        let mut out = vec![Send {
            stream,
            bucket: bucket.clone(),
            action: Action::Assign { strategy, ttl_s },
        }];
        out.extend(self.rebalance(bucket, Some(stream), false));
        Ok(out)
    }

    /// `stream` is gone: its buckets are shared among the streams left.
    pub(crate) fn close(&mut self, stream: StreamId) -> Vec<Send> {
        let Some(state) = self.streams.remove(&stream) else {
            return Vec::new();
        };
        let now = self.clock.now_ns();
        let mut out = Vec::new();
        for bucket in state.buckets {
            self.unsubscribe(&bucket, stream, now);
            out.extend(self.rebalance(&bucket, None, false));
        }
        out
    }

    /// Abandons every bucket of a stream that has had no request for the idle time.
    pub(crate) fn sweep(&mut self) -> Vec<Send> {
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
        let mut out = Vec::new();
        for (bucket, stream) in idle {
            self.unsubscribe(&bucket, stream, now);
            if let Some(state) = self.streams.get_mut(&stream) {
                state.buckets.remove(&bucket);
            }
            out.push(Send {
                stream,
                bucket: bucket.clone(),
                action: Action::Abandon,
            });
            out.extend(self.rebalance(&bucket, None, false));
        }
        out
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

    fn unsubscribe(&mut self, bucket: &BucketKey, stream: StreamId, now: u64) {
        let Some(entry) = self.buckets.get_mut(bucket) else {
            return;
        };
        if let (Some(sub), Budget::Counted { window_ns, .. }) =
            (entry.subs.remove(&stream), entry.budget)
            && sub.outstanding > 0
        {
            entry.orphans.push(Orphan {
                until_ns: now.saturating_add(window_ns),
                tokens: sub.outstanding,
            });
        }
        if entry.subs.is_empty() {
            self.buckets.remove(bucket);
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
            let candidate = entry.candidate(id, false);
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
                entry.assign(id, candidate);
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
    /// Units that grants may be using: every subscribed stream's and recent orphans'.
    fn outstanding(&self) -> u64 {
        let subs = self.subs.values().map(|s| s.outstanding);
        let orphans = self.orphans.iter().map(|o| o.tokens);
        subs.chain(orphans).fold(0, u64::saturating_add)
    }

    /// What `stream` would be assigned now. `spent`: it reported admitted requests, so a
    /// token bucket equal to its current one must still be a new one (Envoy keeps an
    /// unchanged bucket, emptied, instead of starting a full one).
    fn candidate(&self, stream: StreamId, spent: bool) -> Strategy {
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
        let split = Split {
            remaining,
            outstanding: self.outstanding(),
            demand: sub.demand,
            total_demand: self.subs.values().map(|s| s.demand).sum(),
            streams: self.subs.len(),
        };
        let grant = split.grant();
        if grant == 0 {
            return Strategy::DenyAll;
        }
        let mut bucket = Strategy::TokenBucket {
            max_tokens: u32::try_from(grant).unwrap_or(u32::MAX),
            tokens_per_fill: 1,
            fill_interval_s: window_ns.div_ceil(NS_PER_S).max(1),
        };
        if spent
            && let (
                Some(Strategy::TokenBucket {
                    tokens_per_fill, ..
                }),
                Strategy::TokenBucket {
                    tokens_per_fill: ours,
                    ..
                },
            ) = (
                sub.assigned.filter(|a| same_bucket(a, &bucket)),
                &mut bucket,
            )
        {
            *ours = 3 - tokens_per_fill.clamp(1, 2);
        }
        bucket
    }

    /// Records that `stream` was told `strategy`. A new token bucket adds its tokens to
    /// what the stream may spend unreported (after a report that is nothing; after a push,
    /// its old bucket may have been spent from), an unchanged one is the same tokens.
    fn assign(&mut self, stream: StreamId, strategy: Strategy) {
        let Some(sub) = self.subs.get_mut(&stream) else {
            return;
        };
        if let Strategy::TokenBucket { max_tokens, .. } = strategy {
            let tokens = u64::from(max_tokens);
            sub.outstanding = match sub.assigned == Some(strategy) {
                true => sub.outstanding.max(tokens),
                false => sub.outstanding.saturating_add(tokens),
            };
        }
        sub.assigned = Some(strategy);
    }
}

/// Token buckets that differ at most in `tokens_per_fill`.
fn same_bucket(a: &Strategy, b: &Strategy) -> bool {
    match (a, b) {
        (
            Strategy::TokenBucket {
                max_tokens: m1,
                fill_interval_s: f1,
                ..
            },
            Strategy::TokenBucket {
                max_tokens: m2,
                fill_interval_s: f2,
                ..
            },
        ) => m1 == m2 && f1 == f2,
        _ => false,
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
