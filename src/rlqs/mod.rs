//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`): Envoys report each
//! bucket's usage every reporting interval; the usage is counted on the same counters as
//! `ShouldRateLimit`, and what is left of each limit is divided among the streams that
//! report the bucket, as token buckets reserved in the counter until reported. The logic
//! lives in plain modules (`report`, `plan`, `share`, `table`, `reserve`); this one is the
//! stream adapter.

mod part;
mod plan;
mod report;
mod reserve;
mod share;
mod table;

use std::collections::{BTreeMap, HashMap, HashSet};
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
use tollgate_core::{Capacity, Clock, Hits, LogLimit, Rules, Store};
use tonic::{Request, Response, Status, Streaming};

use crate::rls::Rls;
use part::{Parts, settle_report};
use plan::{Plan, plan};
use report::{BucketKey, Usage};
use reserve::{Counter, reserve_grants};
pub(crate) use table::Strategy;
use table::{Action, Budget, Departures, Reservation, Send, StreamId, Table};

/// Answers queued for one stream; a client that reads none loses pushes, not memory (its
/// next report is answered afresh).
const STREAM_QUEUE: usize = 256;
/// Buckets are serialised (count, then divide) through this many locks.
const BUCKET_LOCKS: usize = 64;
/// Window ends waiting to be scheduled; past this, a grant is not cut and its usage is
/// counted again in the next window instead (safe, only less room).
const CUT_QUEUE: usize = 4096;
/// Streams refused are logged at most once per this period.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Cuts wait this long past a window's end, so that a store whose clock runs a little
/// behind ours (Redis uses its own) counts in the new window too.
const CUT_MARGIN: Duration = Duration::from_millis(5);

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
    rls: Arc<Rls>,
    /// The table's clock: when grants were reserved.
    clock: Arc<dyn Clock>,
    config: RlqsConfig,
    /// This instance's part of each limit, when other instances share the store.
    parts: Option<Parts>,
    table: Mutex<Table>,
    outboxes: Mutex<HashMap<StreamId, mpsc::Sender<Result<RateLimitQuotaResponse, Status>>>>,
    /// Held from counting a bucket's usage to recording its division, so that each
    /// division sees every count before it.
    locks: Box<[tokio::sync::Mutex<()>]>,
    /// Fixed-window ends at which a bucket's grants are to be cut.
    cuts: mpsc::Sender<(u64, BucketKey)>,
    hasher: RandomState,
    next_stream: AtomicU64,
    /// Streams refused for what their client sent, logged without flooding the log.
    refusals: LogLimit,
}

impl Rlqs {
    /// The service, with its background tasks: idle sweeps and re-planning on new rules.
    pub(crate) fn start(rls: Arc<Rls>, clock: Arc<dyn Clock>, config: RlqsConfig) -> Arc<Self> {
        let parts = match rls.limiter.store() {
            Store::Memory(_) => None,
            Store::Shared(_) | Store::Reference(_) => {
                Some(Parts::new(clock.clone(), Capacity::default()))
            }
        };
        if let Some(parts) = &parts {
            parts.spawn_sweeper();
        }
        let (cuts, due) = mpsc::channel(CUT_QUEUE);
        let rlqs = Arc::new(Self {
            cuts,
            table: Mutex::new(Table::new(clock.clone(), config.idle, config.max_buckets)),
            parts,
            clock,
            rls,
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
        tokio::spawn(cut_at_window_ends(Arc::downgrade(&rlqs), due));
        rlqs
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_for(&self, bucket: &BucketKey) -> &tokio::sync::Mutex<()> {
        let slot = self.hasher.hash_one(bucket) as usize % self.locks.len();
        &self.locks[slot]
    }

    /// Counts one report's usages and answers them (plus pushes to other streams).
    async fn handle(&self, stream: StreamId, usages: Vec<Usage>) -> Result<(), Status> {
        let rules = self.rls.limiter.rules();
        let mut sends = Vec::new();
        for usage in usages {
            let plan = plan(&rules, &usage.bucket);
            let _serial = self.lock_for(&usage.bucket).lock().await;
            let reservations = self.table().take_reservations(stream, &usage.bucket);
            let budget = match self.budget(&plan, &reservations, &usage).await {
                Ok(budget) => budget,
                Err(e) => {
                    // No answer: Envoy keeps its assignment until the TTL, then falls back.
                    tracing::warn!(error = %e, "RLQS usage not counted: the counter store failed");
                    continue;
                }
            };
            tracing::debug!(stream, ?usage, ?budget, "RLQS report");
            let more = self
                .table()
                .report(stream, &usage.bucket, usage.allowed, usage.denied, budget)
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            sends.extend(self.reserve(&rules, more).await);
        }
        self.deliver(sends);
        Ok(())
    }

    /// Settles `usage` on the plan's counter and says what is left.
    async fn budget(
        &self,
        plan: &Plan<'_>,
        reservations: &[Reservation],
        usage: &Usage,
    ) -> Result<Budget, tollgate_core::StoreError> {
        let (rule, counter) = match plan {
            Plan::NoRule => return Ok(self.shadowed(Budget::Fixed(self.config.no_rule))),
            Plan::Fixed(strategy) => return Ok(self.shadowed(Budget::Fixed(*strategy))),
            Plan::Counted { rule, key, limits } => (rule, Counter { key, limits }),
        };
        let store = self.rls.limiter.store();
        let (settled, remaining) = settle_report(
            store,
            &counter,
            self.parts.as_ref(),
            reservations,
            (usage.allowed, usage.denied),
            self.clock.now_ns(),
        )
        .await?;
        self.rls.metrics.rlqs.usage(
            rule,
            usage.allowed,
            usage.denied,
            settled.over,
            settled.remaining,
        );
        if rule.shadow_mode() {
            return Ok(Budget::Fixed(Strategy::AllowAll));
        }
        Ok(self.shadowed(Budget::Counted {
            remaining,
            window_ns: settled.window_ns,
        }))
    }

    /// What is left for `bucket` now, with no usage to settle.
    async fn read_budget(
        &self,
        plan: &Plan<'_>,
        bucket: &BucketKey,
    ) -> Result<Budget, tollgate_core::StoreError> {
        let read = Usage {
            bucket: bucket.clone(),
            allowed: 0,
            denied: 0,
        };
        self.budget(plan, &[], &read).await
    }

    /// `budget`, or allow-all under the global shadow mode (`SHADOW_MODE`): usage is
    /// still counted and reported in the metrics, nothing is ever denied.
    fn shadowed(&self, budget: Budget) -> Budget {
        match self.config.shadow {
            true => Budget::Fixed(Strategy::AllowAll),
            false => budget,
        }
    }

    /// Reserves the token buckets among `sends` in their counters.
    async fn reserve(&self, rules: &Rules, sends: Vec<Send>) -> Vec<Send> {
        let counter_of = |bucket: &BucketKey| match plan(rules, bucket) {
            Plan::Counted { key, limits, .. } => Some((key, limits)),
            Plan::NoRule | Plan::Fixed(_) => None,
        };
        let now = self.clock.now_ns();
        let reserved = |bucket: &BucketKey, counter: &Counter<'_>, tokens| {
            if let Some(parts) = &self.parts {
                parts.mirror(counter, Hits::Charge(tokens));
            }
            if let Some(end) = counter.window_end(now)
                && self.cuts.try_send((end, bucket.clone())).is_err()
            {
                tracing::debug!(
                    "RLQS window end not scheduled; the grant's usage will be counted again"
                );
            }
        };
        let shrink = |stream, bucket: &BucketKey, tokens| {
            self.table().shrink(stream, bucket, tokens);
        };
        let store = self.rls.limiter.store();
        reserve_grants(store, sends, counter_of, reserved, shrink).await
    }

    /// Sends each stream its bucket actions, in order, as one response.
    fn deliver(&self, sends: Vec<Send>) {
        let mut by_stream: Vec<(StreamId, Vec<BucketAction>)> = Vec::new();
        for send in sends {
            let metrics = &self.rls.metrics.rlqs;
            metrics.assignment(kind(&send.action));
            tracing::debug!(stream = send.stream, bucket = ?send.bucket.entries, action = ?send.action, "RLQS send");
            let actions = bucket_actions(&send.bucket, send.action);
            match by_stream.iter_mut().find(|(id, _)| *id == send.stream) {
                Some((_, all)) => all.extend(actions),
                None => by_stream.push((send.stream, actions)),
            }
        }
        let outboxes = self.outboxes.lock().unwrap_or_else(|p| p.into_inner());
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
        drop(outboxes);
        self.update_gauges();
    }

    fn update_gauges(&self) {
        let stats = self.table().stats();
        let metrics = &self.rls.metrics.rlqs;
        metrics
            .streams
            .set(i64::try_from(stats.streams).unwrap_or(i64::MAX));
        metrics
            .buckets
            .set(i64::try_from(stats.buckets).unwrap_or(i64::MAX));
    }

    /// A stream ended: its buckets are divided among the others.
    async fn close(&self, stream: StreamId) {
        self.outboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream);
        let departures = self.table().close(stream);
        self.depart(departures).await;
    }

    /// Streams left buckets: the demand of buckets no stream reports here any more is
    /// withdrawn from the fleet's, and the streams left get their pushes.
    async fn depart(&self, departures: Departures) {
        if departures.shrunk {
            crate::trim::return_freed_memory();
        }
        let rules = self.rls.limiter.rules();
        if let Some(parts) = &self.parts {
            for bucket in &departures.emptied {
                let Plan::Counted { key, limits, .. } = plan(&rules, bucket) else {
                    continue;
                };
                let counter = Counter { key: &key, limits };
                if let Err(e) = parts.withdraw(self.rls.limiter.store(), &counter).await {
                    tracing::warn!(error = %e, "RLQS demand not withdrawn: the counter store failed");
                }
            }
        }
        let sends = self.reserve(&rules, departures.sends).await;
        self.deliver(sends);
    }

    /// New rules: every bucket is planned again and its streams told what changed.
    async fn replan(&self) {
        let rules = self.rls.limiter.rules();
        let buckets = self.table().buckets();
        let mut sends = Vec::new();
        for bucket in buckets {
            let plan = plan(&rules, &bucket);
            let _serial = self.lock_for(&bucket).lock().await;
            match self.read_budget(&plan, &bucket).await {
                Ok(budget) => {
                    let more = self.table().replan(&bucket, budget);
                    sends.extend(self.reserve(&rules, more).await);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "RLQS bucket not re-planned: the counter store failed")
                }
            }
        }
        self.deliver(sends);
    }

    /// The fixed window of `bucket` that ended at `end_ns`: streams holding a grant of it
    /// get a new assignment from the new window.
    async fn cut(&self, bucket: &BucketKey, end_ns: u64) {
        let rules = self.rls.limiter.rules();
        let plan = plan(&rules, bucket);
        let _serial = self.lock_for(bucket).lock().await;
        match self.read_budget(&plan, bucket).await {
            Ok(budget) => {
                let more = self.table().cut(bucket, end_ns, budget);
                let sends = self.reserve(&rules, more).await;
                self.deliver(sends);
            }
            Err(e) => {
                tracing::warn!(error = %e, "RLQS grants not cut at their window's end: the counter store failed")
            }
        }
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
            self.rls.metrics.rlqs.reports.inc();
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
        rlqs.outboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stream, tx.clone());
        rlqs.table().open(stream);
        rlqs.update_gauges();
        let inbound = request.into_inner();
        tokio::spawn(async move {
            let result = rlqs.serve(stream, inbound).await;
            rlqs.close(stream).await;
            if let Err(status) = result {
                if let Some(held) = rlqs.refusals.admit(rlqs.clock.now_ns()) {
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

/// Cuts each bucket's grants at the ends of their fixed windows (`due`: end and bucket,
/// sent as grants are reserved), a few ms late (see [`CUT_MARGIN`]).
async fn cut_at_window_ends(
    rlqs: std::sync::Weak<Rlqs>,
    mut due: mpsc::Receiver<(u64, BucketKey)>,
) {
    let Some(clock) = rlqs.upgrade().map(|r| r.clock.clone()) else {
        return;
    };
    let margin = u64::try_from(CUT_MARGIN.as_nanos()).unwrap_or(0);
    let mut pending: BTreeMap<u64, HashSet<BucketKey>> = BTreeMap::new();
    loop {
        let next = pending.keys().next().map(|end| {
            let at = end.saturating_add(margin);
            Duration::from_nanos(at.saturating_sub(clock.now_ns()))
        });
        tokio::select! {
            scheduled = due.recv() => match scheduled {
                Some((end, bucket)) => {
                    pending.entry(end).or_default().insert(bucket);
                }
                None => return,
            },
            () = sleep_or_never(next) => {
                let now = clock.now_ns();
                let later = pending.split_off(&now.saturating_sub(margin).saturating_add(1));
                let ended = std::mem::replace(&mut pending, later);
                let Some(rlqs) = rlqs.upgrade() else { return };
                for (end, buckets) in ended {
                    for bucket in buckets {
                        rlqs.cut(&bucket, end).await;
                    }
                }
            }
        }
    }
}

async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Re-plans every bucket whenever rules are installed.
async fn follow_rules(rlqs: std::sync::Weak<Rlqs>) {
    let Some(mut changes) = rlqs.upgrade().map(|r| r.rls.status.subscribe()) else {
        return;
    };
    while changes.changed().await.is_ok() {
        let Some(rlqs) = rlqs.upgrade() else { return };
        rlqs.replan().await;
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

/// The bucket actions that carry `action`. A token bucket goes after a deny-all for the
/// same bucket in the same response: Envoy 1.40 starts a full token bucket only when the
/// bucket's current strategy is not a token bucket (a token bucket replacing one keeps
/// the old one's emptiness), and applies the actions in order before requests see them.
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
        Action::Assign { strategy, ttl_s } => match strategy {
            Strategy::AllowAll => vec![assign(
                ProtoStrategy::BlanketRule(BlanketRule::AllowAll as i32),
                ttl_s,
            )],
            Strategy::DenyAll => vec![assign(deny_all, ttl_s)],
            Strategy::TokenBucket {
                max_tokens,
                fill_interval_s,
            } => {
                let bucket = ProtoStrategy::TokenBucket(TokenBucket {
                    max_tokens,
                    tokens_per_fill: Some(UInt32Value { value: 1 }),
                    fill_interval: Some(seconds(fill_interval_s)),
                });
                vec![assign(deny_all, ttl_s), assign(bucket, ttl_s)]
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
