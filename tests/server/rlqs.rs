//! The Rate Limit Quota Service over a real stream: subscription on the first report, the
//! assignment and its TTL, the counter shared with ShouldRateLimit, blanket rules, shadow
//! mode, two
//! streams dividing one limit, idle buckets abandoned, rule reloads pushed, and malformed
//! reports refused with a reason, oversized and undecodable ones too.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::raw_grpc::{RawGrpc, STREAM_RATE_LIMIT_QUOTAS, frame};
use tollgate_testkit::tollgate::{ConfigDir, Listening, Serve};

use crate::in_process::{InProcess, Running};
use tonic::Streaming;

const RULES: &str = r#"
domain: quota
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
"#;

/// How long an expected message may take.
const ANSWER: Duration = Duration::from_secs(10);

/// One `StreamRateLimitQuotas` call: reports go out through `tx`, answers come in.
pub(crate) struct QuotaStream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

impl QuotaStream {
    pub(crate) async fn open(server: &Listening) -> Self {
        let mut client = RateLimitQuotaServiceClient::new(server.channel().await);
        let (tx, reports) = mpsc::channel(16);
        let rx = client
            .stream_rate_limit_quotas(ReceiverStream::new(reports))
            .await
            .expect("the stream opens")
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, report: RateLimitQuotaUsageReports) {
        self.tx.send(report).await.expect("the stream is open");
    }

    /// Reports `allowed` and `denied` for one bucket of `domain`.
    pub(crate) async fn report(
        &self,
        domain: &str,
        bucket: &[(&str, &str)],
        allowed: u64,
        denied: u64,
    ) {
        self.send(usage_report(domain, &[bucket], allowed, denied))
            .await;
    }

    /// Whether a message (or the stream's error) comes in time; a store that failed
    /// leaves a report unanswered.
    pub(crate) async fn answered(&mut self) -> bool {
        tokio::time::timeout(ANSWER, self.rx.message())
            .await
            .is_ok()
    }

    /// The next message, or the stream's error.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        tokio::time::timeout(ANSWER, self.rx.message())
            .await
            .expect("an answer in time")
            .map(|m| m.expect("the stream goes on"))
    }

    /// The rate assigned to `user`'s bucket on its first report (one request admitted).
    async fn first_rate(&mut self, user: &str) -> f64 {
        self.report("quota", &[("user", user)], 1, 0).await;
        rate(self.strategy().await)
    }

    /// The next assignment's strategy for the one bucket it is about.
    async fn strategy(&mut self) -> Strategy {
        let response = self.next().await.expect("an answer, not an error");
        assigned(&response)
    }
}

fn usage_report(
    domain: &str,
    buckets: &[&[(&str, &str)]],
    allowed: u64,
    denied: u64,
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|pairs| BucketQuotaUsage {
                bucket_id: Some(bucket_id(pairs)),
                time_elapsed: None,
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            })
            .collect(),
    }
}

fn bucket_id(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

/// The strategy a response assigns to its one bucket: its last action's (a token bucket
/// comes after a deny-all, so that Envoy starts it full).
fn assigned(response: &RateLimitQuotaResponse) -> Strategy {
    let strategies: Vec<Strategy> = response
        .bucket_action
        .iter()
        .map(|action| match &action.bucket_action {
            Some(Kind::QuotaAssignmentAction(a)) => a
                .rate_limit_strategy
                .and_then(|s| s.strategy)
                .expect("a strategy"),
            other => panic!("an assignment expected, got {other:?}"),
        })
        .collect();
    let ids: Vec<_> = response
        .bucket_action
        .iter()
        .map(|a| &a.bucket_id)
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] == w[1]),
        "one bucket: {response:?}"
    );
    match strategies.as_slice() {
        [one] => *one,
        [first, Strategy::TokenBucket(bucket)] => {
            assert_eq!(*first, blanket(BlanketRule::DenyAll), "{response:?}");
            Strategy::TokenBucket(*bucket)
        }
        _ => panic!("one assignment expected: {response:?}"),
    }
}

/// The rate a strategy lets through, requests per second (0 for deny-all).
fn rate(strategy: Strategy) -> f64 {
    match strategy {
        Strategy::TokenBucket(bucket) => {
            let per_fill = bucket.tokens_per_fill.map_or(1, |t| t.value);
            let interval = bucket.fill_interval.map_or(0, |d| d.seconds);
            f64::from(per_fill) / interval as f64
        }
        Strategy::BlanketRule(rule) if rule == BlanketRule::DenyAll as i32 => 0.0,
        other => panic!("a token bucket or deny-all expected, got {other:?}"),
    }
}

/// Whether `rate` is `want` rounded down by at most 1 %, as Tollgate sends rates.
fn about(rate: f64, want: f64) -> bool {
    rate <= want && rate >= 0.99 * want
}

/// A server that admitted `n` requests of `user` through `ShouldRateLimit`, the client
/// that sent them, and a quota stream opened after.
async fn admitted_then_streamed(user: &str, n: usize) -> (Running, Rls, QuotaStream) {
    let server = InProcess::rules(RULES).start();
    let mut client = server.client().await;
    for _ in 0..n {
        assert_eq!(
            code(&client.check("quota", &[("user", user)]).await),
            Code::Ok
        );
    }
    let stream = QuotaStream::open(&server).await;
    (server, client, stream)
}

fn blanket(rule: BlanketRule) -> Strategy {
    Strategy::BlanketRule(rule as i32)
}

#[tokio::test]
async fn the_first_report_subscribes_and_is_answered_with_a_token_bucket_and_a_ttl() {
    let server = InProcess::rules(RULES).start();
    let mut stream = QuotaStream::open(&server).await;
    stream.report("quota", &[("user", "ann")], 1, 0).await;
    let response = stream.next().await.expect("an assignment");
    let action = response.bucket_action.last().expect("an action");
    assert_eq!(action.bucket_id, Some(bucket_id(&[("user", "ann")])));
    let Some(Kind::QuotaAssignmentAction(assignment)) = &action.bucket_action else {
        panic!("an assignment expected: {response:?}");
    };
    let ttl = assignment.assignment_time_to_live.expect("a TTL");
    assert!(ttl.seconds >= 1, "a TTL of whole seconds: {ttl:?}");
    let Strategy::TokenBucket(bucket) = assigned(&response) else {
        panic!("a token bucket expected: {response:?}");
    };
    // 10 a minute is a sixth of a request per second. The stream has only subscribed, so
    // room is kept for one more: it gets half, with two tokens to spend at once.
    let half = rate(Strategy::TokenBucket(bucket));
    assert!(about(half, 10.0 / 60.0 / 2.0), "{bucket:?}");
    assert_eq!(bucket.max_tokens, 2);
    assert_eq!(
        server.metric("tollgate_rlqs_reports_total").await,
        Some(1.0)
    );
    let series = r#"tollgate_rlqs_usage_allowed_total{domain="quota",key1="user",key2=""}"#;
    assert_eq!(server.metric(series).await, Some(1.0));
    assert_eq!(server.metric("tollgate_rlqs_streams").await, Some(1.0));
}

#[tokio::test]
async fn reported_usage_and_should_rate_limit_share_one_counter() {
    let (server, mut client, mut stream) = admitted_then_streamed("bob", 7).await;
    // Envoy reports what it admitted: charged on the counter ShouldRateLimit counts on.
    stream.report("quota", &[("user", "bob")], 1, 0).await;
    assert!(matches!(stream.strategy().await, Strategy::TokenBucket(_)));
    stream.report("quota", &[("user", "bob")], 1, 0).await;
    assert!(matches!(stream.strategy().await, Strategy::TokenBucket(_)));
    let gap = r#"tollgate_rlqs_limit_gap{domain="quota",key1="user",key2=""}"#;
    assert_eq!(server.metric(gap).await, Some(1.0), "7 + 2 of 10 counted");
    for want in [Code::Ok, Code::OverLimit] {
        assert_eq!(code(&client.check("quota", &[("user", "bob")]).await), want);
    }
}

#[tokio::test]
async fn envoys_are_given_the_rate_should_rate_limit_callers_leave() {
    let (_server, _client, mut stream) = admitted_then_streamed("dan", 4).await;
    // ShouldRateLimit holds 4 of the 10 a minute: the Envoys divide the rate of the other
    // 6, and this newly subscribed one gets half of that.
    let got = stream.first_rate("dan").await;
    assert!(about(got, 10.0 / 60.0 * 0.6 / 2.0), "{got} per second");
    // A bucket nobody else counts on gets the whole rate's half.
    let whole = stream.first_rate("eve").await;
    assert!(about(whole, 10.0 / 60.0 / 2.0), "{whole} per second");
}

#[tokio::test]
async fn zero_limits_deny_all_and_unlimited_or_unmatched_buckets_allow_all() {
    let server = InProcess::rules(RULES).start();
    let mut stream = QuotaStream::open(&server).await;
    for (bucket, want) in [
        (("blocked", "x"), BlanketRule::DenyAll),
        (("free", "x"), BlanketRule::AllowAll),
        (("nothing", "x"), BlanketRule::AllowAll),
    ] {
        stream.report("quota", &[bucket], 1, 0).await;
        assert_eq!(stream.strategy().await, blanket(want), "bucket {bucket:?}");
    }
    let strict = InProcess::rules(RULES)
        .env("RLQS_NO_RULE_ACTION", "deny")
        .start();
    let mut stream = QuotaStream::open(&strict).await;
    stream.report("quota", &[("nothing", "x")], 1, 0).await;
    assert_eq!(stream.strategy().await, blanket(BlanketRule::DenyAll));
}

/// Shadow mode, global (`SHADOW_MODE`) or a rule's (`shadow_mode: true`), never denies
/// through RLQS either: every bucket is allowed, and its usage is still counted.
#[tokio::test]
async fn shadow_mode_allows_every_bucket_and_still_counts() {
    let server = InProcess::rules(RULES).env("SHADOW_MODE", "true").start();
    let mut stream = QuotaStream::open(&server).await;
    for bucket in [("blocked", "x"), ("user", "ann"), ("nothing", "x")] {
        stream.report("quota", &[bucket], 15, 0).await;
        assert_eq!(
            stream.strategy().await,
            blanket(BlanketRule::AllowAll),
            "bucket {bucket:?}"
        );
    }
    let series = r#"tollgate_rlqs_usage_allowed_total{domain="quota",key1="user",key2=""}"#;
    assert_eq!(server.metric(series).await, Some(15.0));

    let shadowed_rule = RULES.replace(
        "rate_limit: {unit: hour, requests_per_unit: 0}",
        "shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 0}",
    );
    let server = InProcess::rules(&shadowed_rule).start();
    let mut stream = QuotaStream::open(&server).await;
    stream.report("quota", &[("blocked", "x")], 1, 0).await;
    assert_eq!(stream.strategy().await, blanket(BlanketRule::AllowAll));
    // Other rules keep their limits.
    stream.report("quota", &[("user", "ann")], 1, 0).await;
    assert!(matches!(stream.strategy().await, Strategy::TokenBucket(_)));
}

#[tokio::test]
async fn two_streams_divide_one_limit_and_more_room_is_pushed() {
    let server = InProcess::rules(RULES).start();
    let mut a = QuotaStream::open(&server).await;
    let mut b = QuotaStream::open(&server).await;
    let whole = 10.0 / 60.0;
    a.report("quota", &[("user", "cy")], 1, 0).await;
    let for_a = rate(a.strategy().await);
    assert!(about(for_a, whole / 2.0), "half, just subscribed: {for_a}");
    // b, as new as a, counts itself twice: a third, within what a leaves.
    b.report("quota", &[("user", "cy")], 1, 0).await;
    let for_b = rate(b.strategy().await);
    assert!(about(for_b, whole / 3.0), "a third: {for_b}");
    assert!(for_a + for_b <= whole);
    // a goes: b is pushed more without having reported.
    drop(a);
    let pushed = rate(b.strategy().await);
    assert!(
        about(pushed, whole / 2.0),
        "alone, just subscribed: {pushed}"
    );
}

#[tokio::test]
async fn idle_buckets_are_abandoned() {
    let server = InProcess::rules(RULES)
        .env("RLQS_BUCKET_IDLE_TIMEOUT", "1s")
        .start();
    let mut stream = QuotaStream::open(&server).await;
    stream.report("quota", &[("user", "dee")], 1, 0).await;
    assert!(matches!(stream.strategy().await, Strategy::TokenBucket(_)));
    let abandoned = stream.next().await.expect("an abandon action");
    let [action] = abandoned.bucket_action.as_slice() else {
        panic!("one action expected: {abandoned:?}");
    };
    assert_eq!(action.bucket_id, Some(bucket_id(&[("user", "dee")])));
    assert!(
        matches!(action.bucket_action, Some(Kind::AbandonAction(_))),
        "{abandoned:?}"
    );
    assert_eq!(server.metric("tollgate_rlqs_buckets").await, Some(0.0));
}

#[tokio::test]
async fn a_rule_reload_pushes_new_assignments_to_open_streams() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let server = InProcess::path(&file).keep(config).start();
    let mut stream = QuotaStream::open(&server).await;
    stream.report("quota", &[("user", "eve")], 1, 0).await;
    assert!(matches!(stream.strategy().await, Strategy::TokenBucket(_)));
    let blocked = RULES.replace("requests_per_unit: 10", "requests_per_unit: 0");
    std::fs::write(&file, blocked).expect("rewrite the rules");
    // Pushed, without a report.
    assert_eq!(stream.strategy().await, blanket(BlanketRule::DenyAll));
}

#[tokio::test]
async fn malformed_reports_end_the_stream_with_invalid_argument_and_a_reason() {
    let server = InProcess::rules(RULES).start();
    let no_domain = usage_report("", &[&[("user", "x")]], 1, 0);
    let empty_id = usage_report("quota", &[&[]], 1, 0);
    let empty_key = usage_report("quota", &[&[("", "x")]], 1, 0);
    let mut no_id = usage_report("quota", &[&[("user", "x")]], 1, 0);
    no_id.bucket_quota_usages[0].bucket_id = None;
    for (report, reason) in [
        (no_domain, "must name a domain"),
        (empty_id, "empty bucket id"),
        (empty_key, "empty key"),
        (no_id, "has no bucket id"),
    ] {
        let mut stream = QuotaStream::open(&server).await;
        stream.send(report).await;
        let status = stream.next().await.expect_err("the stream is refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(reason), "{status:?}");
    }
    // The server goes on serving.
    let mut stream = QuotaStream::open(&server).await;
    stream.report("quota", &[("free", "x")], 1, 0).await;
    assert_eq!(stream.strategy().await, blanket(BlanketRule::AllowAll));
}

/// Reports that cannot be read end the stream with an error and a reason, as
/// `ShouldRateLimit` answers them, never with OK: one larger than GRPC_MAX_MESSAGE_BYTES
/// (an Envoy with thousands of buckets) OUT_OF_RANGE, undecodable bytes INVALID_ARGUMENT;
/// each refusal is logged.
#[tokio::test]
async fn oversized_or_undecodable_reports_end_the_stream_with_an_error() {
    let server = Serve::rules(RULES).start();
    let values: Vec<String> = (0..3_000).map(|i| format!("user-{i}")).collect();
    let buckets: Vec<[(&str, &str); 1]> = values.iter().map(|v| [("user", v.as_str())]).collect();
    let buckets: Vec<&[(&str, &str)]> = buckets.iter().map(|b| b.as_slice()).collect();
    let oversized = usage_report("quota", &buckets, 1, 0);
    assert!(prost::Message::encoded_len(&oversized) > 65_536);
    let mut stream = QuotaStream::open(&server).await;
    stream.send(oversized).await;
    let status = stream.next().await.expect_err("the stream is refused");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status
            .message()
            .contains("at most 65536 bytes (GRPC_MAX_MESSAGE_BYTES)"),
        "{status:?}"
    );

    let mut raw = RawGrpc::connect(server.grpc_addr()).await;
    // A field tag of 0 is not protobuf.
    let ended = raw
        .call(STREAM_RATE_LIMIT_QUOTAS, frame(&[0, 1, 2]), true)
        .await;
    assert_eq!(
        ended.status,
        tonic::Code::InvalidArgument as i32,
        "{ended:?}"
    );
    assert!(
        ended.message.contains("not a RateLimitQuotaUsageReports"),
        "{ended:?}"
    );
    server
        .stderr()
        .wait_for(|l| l.contains("RLQS stream refused"), ANSWER)
        .expect("the refusal is logged");
}

/// Buckets are bounded over all streams (RLQS_MAX_BUCKETS): a report that would go past
/// the bound ends its stream with RESOURCE_EXHAUSTED and the reason, and what closed
/// streams held is given back, in the gauge and in the process's resident memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_are_bounded_over_all_streams_and_given_back_when_they_close() {
    const STREAMS: usize = 4;
    const PER_STREAM: usize = 9_000;
    const PER_REPORT: usize = 1_000;
    let server = Serve::rules(RULES)
        .args(["--rlqs-max-buckets", "40000"])
        .start();
    let report = |stream: usize, from: usize| {
        let values: Vec<String> = (from..from + PER_REPORT)
            .map(|i| format!("stream-{stream}-{i}"))
            .collect();
        let buckets: Vec<[(&str, &str); 1]> =
            values.iter().map(|v| [("free", v.as_str())]).collect();
        let buckets: Vec<&[(&str, &str)]> = buckets.iter().map(|b| b.as_slice()).collect();
        usage_report("quota", &buckets, 1, 0)
    };
    let held = async |want: f64| {
        tollgate_testkit::wait::until_async("the bucket gauge", ANSWER * 6, async || {
            match server.metric("tollgate_rlqs_buckets").await {
                Some(n) if n == want => Ok(()),
                other => Err(format!("{other:?} buckets, want {want}")),
            }
        })
        .await
    };
    // What serving one stream leaves allocated for good (buffers, thread caches) is in
    // the baseline.
    let warm_up = QuotaStream::open(&server).await;
    warm_up.send(report(STREAMS + 1, 0)).await;
    held(PER_REPORT as f64).await;
    drop(warm_up);
    held(0.0).await;
    let before = server.rss_bytes();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        let stream = QuotaStream::open(&server).await;
        for from in (0..PER_STREAM).step_by(PER_REPORT) {
            stream.send(report(s, from)).await;
        }
        streams.push(stream);
    }
    held((STREAMS * PER_STREAM) as f64).await;
    let peak = server.rss_bytes();

    // 36,000 held: a fifth stream gets 4,000 more, then is refused.
    let mut past = QuotaStream::open(&server).await;
    for from in (0..PER_STREAM).step_by(PER_REPORT) {
        if past.tx.send(report(STREAMS, from)).await.is_err() {
            break;
        }
    }
    let status = loop {
        match past.next().await {
            Ok(_) => continue,
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("RLQS_MAX_BUCKETS"), "{status:?}");

    drop(streams);
    held(0.0).await;
    let after = server.rss_bytes();
    eprintln!(
        "RSS: {} MiB before, {} MiB with {} buckets, {} MiB after they closed",
        before >> 20,
        peak >> 20,
        STREAMS * PER_STREAM,
        after >> 20
    );
    // The allocator keeps what fragments pin, and the usage charged on each bucket's
    // counter stays counted until its window ends; a good part still goes back (kept:
    // none of it, before the streams' memory was given back). Measured: about 45 % before
    // RLQS charged usage on counters, 32 % since.
    assert!(
        peak.saturating_sub(after) > (peak - before) / 4,
        "RSS {before} before, {peak} at the peak, {after} once every stream closed"
    );
}
