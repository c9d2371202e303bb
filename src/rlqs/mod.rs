//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoys report each
//! bucket's usage every reporting interval; the usage is charged on the counter
//! `ShouldRateLimit` uses (through the core's counter API), and each limit's rate is
//! divided among the streams that report the bucket by their demand, as token buckets.
//! The logic lives in plain modules (`report`, `plan`, `rate`, `table`, `part`, `others`);
//! this one is the stream adapter, and every path through it (a report, a departure, new
//! rules) is the same few steps: plan, lock the bucket, charge and read, update the table,
//! send.

mod others;
mod part;
mod plan;
mod rate;
mod report;
mod table;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as ProtoStrategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::google::protobuf::{Duration as ProtoDuration, UInt32Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_core::{Capacity, Clock, LogLimit, Store, StoreError};
use tonic::{Request, Response, Status, Streaming};

use crate::app::App;
use part::Parts;
use plan::{Plan, Plans};
use report::{BucketKey, Usage};
pub(crate) use table::Strategy;
use table::{Action, Allowance, Departures, Message, StreamId, Table, TooManyBuckets};
use tollgate_core::lock;

/// Answers queued for one stream; a client that reads none loses pushes, not memory (its
/// next report is answered afresh).
const STREAM_QUEUE: usize = 256;
/// Buckets are serialised (count, then divide) through this many locks.
const BUCKET_LOCKS: usize = 64;
/// Streams refused are logged at most once per this period.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// What the settings decide.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RlqsConfig {
    /// A bucket with no request for this long is abandoned.
    pub(crate) idle: Duration,
    /// What a bucket that matches no rule gets.
    pub(crate) no_rule: Strategy,
    /// The global shadow mode: every bucket allowed, usage still counted.
    pub(crate) shadow: bool,
    /// Largest report accepted (GRPC_MAX_MESSAGE_BYTES), named when one is refused.
    pub(crate) max_message_bytes: usize,
    /// Buckets held at most over all streams, a bucket once per stream reporting it.
    pub(crate) max_buckets: usize,
}

/// The service: the rate-limit service's rules and store, the subscription table, and the
/// open streams' outboxes.
pub(crate) struct Rlqs {
    app: Arc<App>,
    config: RlqsConfig,
    /// Each bucket's rule and counter, made once per rule set.
    plans: Plans,
    /// This instance's part of each limit, when other instances share the store.
    parts: Option<Parts>,
    table: Mutex<Table>,
    outboxes: Mutex<HashMap<StreamId, mpsc::Sender<Result<RateLimitQuotaResponse, Status>>>>,
    /// Held from counting a bucket's usage to recording its division, so that each
    /// division sees every count before it.
    locks: Box<[tokio::sync::Mutex<()>]>,
    hasher: RandomState,
    next_stream: AtomicU64,
    /// Streams refused for what their client sent, logged without flooding the log.
    refusals: LogLimit,
    clock: Arc<dyn Clock>,
}

impl Rlqs {
    /// The service, with its background tasks: idle sweeps and re-planning on new rules.
    pub(crate) fn start(app: Arc<App>, clock: Arc<dyn Clock>, config: RlqsConfig) -> Arc<Self> {
        let parts = match app.limiter.store() {
            Store::Memory(_) => None,
            Store::Shared(_) | Store::Reference(_) => {
                Some(Parts::new(clock.clone(), Capacity::default()))
            }
        };
        if let Some(parts) = &parts {
            parts.spawn_sweeper();
        }
        let rlqs = Arc::new(Self {
            table: Mutex::new(Table::new(clock.clone(), config.idle, config.max_buckets)),
            clock,
            parts,
            plans: Plans::default(),
            app,
            config,
            outboxes: Mutex::default(),
            locks: (0..BUCKET_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            hasher: RandomState::new(),
            next_stream: AtomicU64::new(1),
            refusals: LogLimit::new(REFUSAL_LOG_PERIOD),
        });
        tokio::spawn(sweep(Arc::downgrade(&rlqs)));
        tokio::spawn(follow_rules(Arc::downgrade(&rlqs)));
        if rlqs.parts.is_some() {
            tokio::spawn(count_demand(Arc::downgrade(&rlqs)));
        }
        rlqs
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }

    fn lock_for(&self, bucket: &BucketKey) -> &tokio::sync::Mutex<()> {
        let slot = self.hasher.hash_one(bucket) as usize % self.locks.len();
        &self.locks[slot]
    }

    /// Counts one report's usages and answers them (plus pushes to other streams).
    async fn handle(&self, stream: StreamId, usages: Vec<Usage>) -> Result<(), Status> {
        let mut sends = Vec::new();
        for usage in usages {
            let (allowed, denied) = (usage.allowed, usage.denied);
            let answer = self
                .step(
                    &usage.bucket,
                    Some(stream),
                    (allowed, denied),
                    |table, allowance| {
                        table.report(stream, &usage.bucket, allowed, denied, allowance)
                    },
                )
                .await;
            match answer {
                Ok(more) => sends.extend(more),
                Err(Step::Store(e)) => {
                    // No answer: Envoy keeps its assignment until the TTL, then falls back.
                    tracing::warn!(error = %e, "RLQS usage not counted: the counter store failed");
                }
                Err(Step::Refused(e)) => return Err(Status::resource_exhausted(e.to_string())),
            }
        }
        self.deliver(sends);
        Ok(())
    }

    /// The one way through a bucket: its plan; its lock, held from counting to dividing
    /// so that each division sees every count before it; `usage` reported by `stream`
    /// charged on its counter and the allowance read; then `op` on the table with that
    /// allowance, which says what to send.
    async fn step(
        &self,
        bucket: &BucketKey,
        stream: Option<StreamId>,
        usage: (u64, u64),
        op: impl FnOnce(&mut Table, Allowance) -> Result<Vec<Message>, TooManyBuckets>,
    ) -> Result<Vec<Message>, Step> {
        let plan = self.plans.get(&self.app.limiter, bucket);
        let _serial = self.lock_for(bucket).lock().await;
        let period = stream.and_then(|s| self.table().period(s, bucket));
        let allowance = self.allowance(&plan, usage, period).await?;
        tracing::debug!(stream, bucket = ?bucket.entries, ?usage, ?allowance, "RLQS allowance");
        Ok(op(&mut self.table(), allowance)?)
    }

    /// Charges `(allowed, denied)`, reported for the last `period`, on the plan's
    /// counter and says what the bucket's streams here may admit now: this instance's
    /// part of the rate that other clients of the counter leave.
    async fn allowance(
        &self,
        plan: &Plan,
        (allowed, denied): (u64, u64),
        period: Option<Duration>,
    ) -> Result<Allowance, StoreError> {
        let (rule, counter, per_s, window, shortest) = match plan {
            Plan::NoRule => return Ok(self.shadowed(Allowance::Fixed(self.config.no_rule))),
            Plan::Fixed(strategy) => return Ok(self.shadowed(Allowance::Fixed(*strategy))),
            Plan::Counted {
                rule,
                counter,
                per_s,
                window,
                shortest,
            } => (rule, counter, *per_s, *window, *shortest),
        };
        let store = self.app.limiter.store();
        let charged = in_window(allowed, period, shortest);
        let others::Charged { reading, others } = others::charge(store, counter, charged).await?;
        let (over, gap) = match reading.admitted {
            true => (0, reading.remaining),
            false => (charged.saturating_sub(reading.remaining), 0),
        };
        self.app
            .metrics
            .rlqs
            .usage(rule, allowed, denied, over, gap);
        let fraction = match &self.parts {
            Some(parts) => {
                parts.gather(counter, allowed.saturating_add(denied));
                parts.fraction(store, counter).await?
            }
            None => 1.0,
        };
        if rule.shadow_mode() {
            return Ok(Allowance::Fixed(Strategy::AllowAll));
        }
        Ok(self.shadowed(Allowance::Rate {
            per_s: per_s * fraction * (1.0 - others),
            window,
        }))
    }

    /// `allowance`, or allow-all under the global shadow mode (`SHADOW_MODE`): usage is
    /// still counted and reported in the metrics, nothing is ever denied.
    fn shadowed(&self, allowance: Allowance) -> Allowance {
        match self.config.shadow {
            true => Allowance::Fixed(Strategy::AllowAll),
            false => allowance,
        }
    }

    /// Sends each stream its bucket actions, in order, as one response. The gauges are
    /// set first, so that a client told of a change finds it in the metrics.
    fn deliver(&self, sends: Vec<Message>) {
        self.update_gauges();
        let mut by_stream: Vec<(StreamId, Vec<BucketAction>)> = Vec::new();
        for send in sends {
            let metrics = &self.app.metrics.rlqs;
            metrics.assignment(kind(&send.action));
            tracing::debug!(stream = send.stream, bucket = ?send.bucket.entries, action = ?send.action, "RLQS send");
            let actions = bucket_actions(&send.bucket, send.action);
            match by_stream.iter_mut().find(|(id, _)| *id == send.stream) {
                Some((_, all)) => all.extend(actions),
                None => by_stream.push((send.stream, actions)),
            }
        }
        let outboxes = lock(&self.outboxes);
        for (stream, actions) in by_stream {
            if let Some(outbox) = outboxes.get(&stream) {
                let response = RateLimitQuotaResponse {
                    bucket_action: actions,
                };
                if outbox.try_send(Ok(response)).is_err() {
                    tracing::debug!(stream, "RLQS stream not reading its answers; one dropped");
                }
            }
        }
    }

    fn update_gauges(&self) {
        let stats = self.table().stats();
        let metrics = &self.app.metrics.rlqs;
        metrics
            .streams
            .set(i64::try_from(stats.streams).unwrap_or(i64::MAX));
        metrics
            .buckets
            .set(i64::try_from(stats.buckets).unwrap_or(i64::MAX));
    }

    /// A stream ended: its buckets are divided among the others.
    async fn close(&self, stream: StreamId) {
        lock(&self.outboxes).remove(&stream);
        let departures = self.table().close(stream);
        self.depart(departures).await;
    }

    /// Streams left buckets: the demand of buckets no stream reports here any more is
    /// withdrawn from the fleet's, and the streams left get their pushes.
    async fn depart(&self, departures: Departures) {
        for bucket in &departures.emptied {
            if let Some(parts) = &self.parts
                && let Plan::Counted { counter, .. } = &*self.plans.get(&self.app.limiter, bucket)
                && let Err(e) = parts.withdraw(self.app.limiter.store(), counter).await
            {
                tracing::warn!(error = %e, "RLQS demand not withdrawn: the counter store failed");
            }
            self.plans.forget(bucket);
        }
        // After the plans of the buckets left are dropped too.
        if departures.shrunk {
            crate::ops::trim::return_freed_memory();
        }
        self.deliver(departures.sends);
    }

    /// New rules: every bucket is planned again and its streams told what changed.
    async fn replan(&self) {
        self.plans.invalidate();
        let buckets = self.table().buckets();
        let mut sends = Vec::new();
        for bucket in buckets {
            let replanned = self
                .step(&bucket, None, (0, 0), |table, allowance| {
                    Ok(table.replan(&bucket, allowance))
                })
                .await;
            match replanned {
                Ok(more) => sends.extend(more),
                Err(e) => tracing::warn!(error = %e, "RLQS bucket not re-planned"),
            }
        }
        self.deliver(sends);
    }

    /// Reads one stream until it ends or sends something invalid.
    async fn serve(
        &self,
        stream: StreamId,
        mut inbound: Streaming<RateLimitQuotaUsageReports>,
    ) -> Result<(), Status> {
        let mut domain = None;
        loop {
            let report = match inbound.message().await {
                Ok(Some(report)) => report,
                Ok(None) => return Ok(()),
                Err(status) => return self.unreadable(stream, &status),
            };
            self.app.metrics.rlqs.reports.inc();
            let (named, usages) = report::parse(report, domain.as_ref())
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            domain = Some(named);
            self.handle(stream, usages).await?;
        }
    }

    /// A report that could not be read: too large or undecodable is the client's error,
    /// told to it in our words; anything else is the client going away.
    fn unreadable(&self, stream: StreamId, status: &Status) -> Result<(), Status> {
        match status.code() {
            tonic::Code::OutOfRange => Err(Status::out_of_range(format!(
                "an RLQS report must be at most {} bytes (GRPC_MAX_MESSAGE_BYTES); report \
                 fewer buckets per message",
                self.config.max_message_bytes
            ))),
            // tonic's protobuf codec reports undecodable bytes as INTERNAL.
            tonic::Code::Internal => Err(Status::invalid_argument(format!(
                "not a RateLimitQuotaUsageReports: {}",
                status.message()
            ))),
            _ => {
                tracing::debug!(%status, stream, "RLQS stream broke");
                Ok(())
            }
        }
    }
}

/// The gRPC face of [`Rlqs`].
pub(crate) struct RlqsService(pub(crate) Arc<Rlqs>);

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let rlqs = self.0.clone();
        let stream = rlqs.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        lock(&rlqs.outboxes).insert(stream, tx.clone());
        rlqs.table().open(stream);
        rlqs.update_gauges();
        let inbound = request.into_inner();
        tokio::spawn(async move {
            let result = rlqs.serve(stream, inbound).await;
            rlqs.close(stream).await;
            if let Err(status) = result {
                if let Some(held) = rlqs.refusals.admit(rlqs.clock.now()) {
                    tracing::warn!(
                        code = ?status.code(),
                        reason = status.message(),
                        stream,
                        "RLQS stream refused ({held} more since the last such line)"
                    );
                }
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Abandons idle buckets, a few times per idle period.
async fn sweep(rlqs: std::sync::Weak<Rlqs>) {
    let period = match rlqs.upgrade() {
        Some(r) => (r.config.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
        None => return,
    };
    let mut ticks = tokio::time::interval(period);
    loop {
        ticks.tick().await;
        let Some(rlqs) = rlqs.upgrade() else { return };
        let departures = rlqs.table().sweep();
        rlqs.depart(departures).await;
    }
}

/// Counts the demand gathered from reports on the shared store, every [`part::FLUSH`].
async fn count_demand(rlqs: std::sync::Weak<Rlqs>) {
    let mut ticks = tokio::time::interval(part::FLUSH);
    loop {
        ticks.tick().await;
        let Some(rlqs) = rlqs.upgrade() else { return };
        if let Some(parts) = &rlqs.parts
            && let Err(e) = parts.flush(rlqs.app.limiter.store()).await
        {
            // Each report's own store failure is logged at warn already.
            tracing::debug!(error = %e, "RLQS demand not counted: the counter store failed");
        }
    }
}

/// Re-plans every bucket whenever rules are installed.
async fn follow_rules(rlqs: std::sync::Weak<Rlqs>) {
    let Some(mut changes) = rlqs.upgrade().map(|r| r.app.status.subscribe()) else {
        return;
    };
    while changes.changed().await.is_ok() {
        let Some(rlqs) = rlqs.upgrade() else { return };
        rlqs.replan().await;
    }
}

/// Why a step through a bucket gave no answer: the store failed (Envoy keeps what it has),
/// or the stream reports more buckets than it may (the stream ends).
#[derive(Debug, thiserror::Error)]
enum Step {
    /// The counter store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stream may not subscribe to the bucket.
    #[error(transparent)]
    Refused(#[from] TooManyBuckets),
}

/// The part of `allowed`, reported for the last `period`, that falls in the current
/// window of `window` if it was spread evenly over the period: all of it when the window
/// is the longer (or the period unknown), so that a report of 5 s does not fill a 1 s
/// window five times over.
fn in_window(allowed: u64, period: Option<Duration>, window: Duration) -> u64 {
    match period {
        Some(period) if period > window => {
            let part = u128::from(allowed) * window.as_nanos() / period.as_nanos();
            u64::try_from(part).unwrap_or(u64::MAX)
        }
        _ => allowed,
    }
}

fn kind(action: &Action) -> &'static str {
    match action {
        Action::Abandon => "abandon",
        Action::Assign { strategy, .. } => match strategy {
            Strategy::AllowAll => "allow_all",
            Strategy::DenyAll => "deny_all",
            Strategy::TokenBucket { .. } => "token_bucket",
        },
    }
}

/// The bucket actions that carry `action`. Envoy 1.40 keeps the token bucket it holds
/// (tokens and all) when sent one it deems the same, comparing only the sub-second part
/// of the fill interval; so a fresh token bucket goes after a deny-all for the same
/// bucket in the same response, which makes Envoy start it full (it applies a response's
/// actions in order before requests see them), and an unchanged one is sent alone, so
/// that it carries on as it is.
fn bucket_actions(bucket: &BucketKey, action: Action) -> Vec<BucketAction> {
    let assign = |strategy: ProtoStrategy, ttl_s: u64| BucketAction {
        bucket_id: Some(bucket.to_proto()),
        bucket_action: Some(Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(seconds(ttl_s)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    };
    let deny_all = ProtoStrategy::BlanketRule(BlanketRule::DenyAll as i32);
    match action {
        Action::Abandon => vec![BucketAction {
            bucket_id: Some(bucket.to_proto()),
            bucket_action: Some(Kind::AbandonAction(AbandonAction {})),
        }],
        Action::Assign {
            strategy,
            ttl_s,
            fresh,
        } => match strategy {
            Strategy::AllowAll => vec![assign(
                ProtoStrategy::BlanketRule(BlanketRule::AllowAll as i32),
                ttl_s,
            )],
            Strategy::DenyAll => vec![assign(deny_all, ttl_s)],
            Strategy::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_s,
            } => {
                let bucket = ProtoStrategy::TokenBucket(TokenBucket {
                    max_tokens,
                    tokens_per_fill: Some(UInt32Value {
                        value: tokens_per_fill,
                    }),
                    fill_interval: Some(seconds(fill_interval_s)),
                });
                match fresh {
                    true => vec![assign(deny_all, ttl_s), assign(bucket, ttl_s)],
                    false => vec![assign(bucket, ttl_s)],
                }
            }
        },
    }
}

fn seconds(s: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(s).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
