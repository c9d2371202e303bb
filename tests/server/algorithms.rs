//! Every limit shape over gRPC, on every store: fixed window, token and leaky buckets with
//! costs, several limits per descriptor, unit multipliers, request overrides, check-only
//! requests, refunds, calendar windows, and simultaneous bursts on every algorithm. Each
//! test runs against the memory store, a real redis-server, a real Valkey and a real
//! PostgreSQL, with the instance's own time zone (`TZ`) far from any rule's. And counts
//! far past what any store's numbers hold, which every store answers alike.

use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate_testkit::grpc::{
    Code, DescriptorStatus, RateLimitRequest, RateLimitResponse, Rls, Unit, code, descriptor,
    request, until_reset,
};
use tollgate_testkit::keys::{Shape, counter_key, redis_key};
use tollgate_testkit::load::{burst, tally};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait::room_in_window;
use tollgate_testkit::zoneinfo;

use super::rlqs::QuotaStream;

const RULES: &str = r#"
domain: shapes
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 4}
  - key: spend
    rate_limit: {unit: day, unit_multiplier: 30, requests_per_unit: 1000, algorithm: leaky_bucket}
  - key: both
    rate_limits:
      - {name: per_hour, unit: hour, requests_per_unit: 10}
      - {name: per_day, unit: day, requests_per_unit: 12}
  - key: report
    rate_limit: {unit: second, unit_multiplier: 1800, requests_per_unit: 2}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: calendar_day
    rate_limit: {unit: day, requests_per_unit: 2, calendar: true, time_zone: Pacific/Auckland}
  # Bursts: 5 per hour or day, refilling too slowly to matter during a burst.
  - key: burst_sliding
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: burst_fixed
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: burst_token
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: token_bucket}
  - key: burst_leaky
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: leaky_bucket}
  # Counts far past any limit (and the burst rules): a budget, and RLQS usage.
  - key: wide_budget
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: wide_usage
    rate_limit: {unit: hour, requests_per_unit: 1000}
"#;

const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);
/// The instances' own time zone, which no calendar window may depend on.
const INSTANCE_TZ: &str = "Pacific/Honolulu";
/// Far longer than any sequence of a few calls takes, even on a loaded machine.
const ROOM: Duration = Duration::from_secs(30);

/// The server a shared store keeps its counters in, alive as long as the Tollgate.
enum Backing {
    Memory,
    /// A redis-server or a Valkey.
    Redis(RedisServer),
    Postgres(PostgresServer),
}

/// A Tollgate on one store.
struct Instance {
    server: Server,
    backing: Backing,
}

impl Instance {
    fn memory() -> Self {
        Self {
            server: Serve::rules(RULES).env("TZ", INSTANCE_TZ).start(),
            backing: Backing::Memory,
        }
    }

    /// A server of `engine` with a store timeout long enough for a loaded machine, and
    /// store failures as errors: these tests check what the store decides, never a local
    /// fallback.
    fn redis(engine: Engine) -> Self {
        let redis = RedisServer::start_engine(engine);
        let server = Serve::rules(RULES)
            .env("TZ", INSTANCE_TZ)
            .redis("single", &redis.url())
            .args(["--store-timeout", "1s", "--on-store-error", "error"])
            .start();
        Self {
            server,
            backing: Backing::Redis(redis),
        }
    }

    /// PostgreSQL, on the same terms as [`Instance::redis`].
    fn postgres() -> Self {
        let postgres = PostgresServer::start();
        let server = Serve::rules(RULES)
            .env("TZ", INSTANCE_TZ)
            .postgres(&postgres.url())
            .args(["--store-timeout", "1s", "--on-store-error", "error"])
            .start();
        Self {
            server,
            backing: Backing::Postgres(postgres),
        }
    }

    async fn client(&self) -> Rls {
        self.server.client().await
    }
}

/// Runs `test` against the memory store, Redis, Valkey and PostgreSQL.
macro_rules! on_every_store {
    ($name:ident, $test:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn memory() {
                ($test)(Instance::memory()).await;
            }

            #[tokio::test]
            async fn redis() {
                ($test)(Instance::redis(Engine::Redis)).await;
            }

            #[tokio::test]
            async fn valkey() {
                ($test)(Instance::redis(Engine::Valkey)).await;
            }

            #[tokio::test]
            async fn postgres() {
                ($test)(Instance::postgres()).await;
            }
        }
    };
}

/// A calendar day in Auckland: the wait is the rest of the local day, as Python's
/// `zoneinfo` computes it, and a shared store names the window by its UTC start.
async fn calendar_day_resets_at_local_midnight(instance: Instance) {
    let mut rls = instance.client().await;
    let (mut start, mut end) = zoneinfo::window("Pacific/Auckland", "day", SystemTime::now());
    if let Ok(short) = end.duration_since(SystemTime::now())
        && short < ROOM
    {
        // Too close to midnight for the sequence: run it in the next local day.
        tokio::time::sleep(short).await;
        (start, end) = zoneinfo::window("Pacific/Auckland", "day", end);
    }
    for left in [1, 0] {
        let s = rls.check("shapes", &[("calendar_day", "c")]).await;
        assert_eq!((code(&s), s.limit_remaining), (Code::Ok, left));
    }
    let before = SystemTime::now();
    let denied = rls.check("shapes", &[("calendar_day", "c")]).await;
    let after = SystemTime::now();
    assert_eq!(code(&denied), Code::OverLimit);
    let limit = denied.current_limit.clone().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, i32::from(Unit::Day))
    );
    let wait = until_reset(&denied).as_secs_f64();
    assert!(
        (secs_until(end, after).floor()..=secs_until(end, before).ceil()).contains(&wait),
        "reset {wait} s, the Auckland day ends {} s after the request",
        secs_until(end, after)
    );
    let start_us = start
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros();
    let entries = [("calendar_day", "c")];
    let shape = Shape::Calendar {
        unit: "day",
        multiplier: 1,
        zone: "Pacific/Auckland",
    };
    match &instance.backing {
        Backing::Memory => {}
        Backing::Redis(redis) => {
            let key = redis_key("", "shapes", &entries, &[shape]);
            let value: Vec<u8> = redis.query(&["GET", &key]);
            // The window's start and the count, seven bytes each, big-endian.
            let seven = |n: u64| n.to_be_bytes()[1..].to_vec();
            let expected = [seven(start_us as u64), seven(2)].concat();
            assert_eq!(value, expected, "{key}");
        }
        Backing::Postgres(postgres) => {
            let state = postgres.psql(&format!(
                "SELECT state FROM tollgate_counters WHERE key = '{}'",
                counter_key("shapes", &entries, &[shape])
            ));
            assert_eq!(state, format!("{{{start_us},2}}"));
        }
    }
}
on_every_store!(calendar_day, calendar_day_resets_at_local_midnight);

/// One descriptor with its own `hits_addend`, `is_negative_hits` and limit override.
fn one(
    key: &str,
    value: &str,
    hits: Option<u64>,
    negative: bool,
    limit: Option<RateLimitOverride>,
) -> RateLimitRequest {
    let mut d = descriptor(&[(key, value)]);
    d.hits_addend = hits.map(|value| UInt64Value { value });
    d.is_negative_hits = negative;
    d.limit = limit;
    RateLimitRequest {
        domain: "shapes".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

async fn status(rls: &mut Rls, req: RateLimitRequest) -> DescriptorStatus {
    rls.ok(req).await.statuses.remove(0)
}

fn name(s: &DescriptorStatus) -> &str {
    s.current_limit.as_ref().map_or("", |l| l.name.as_str())
}

/// Seconds from `t` to `end`.
fn secs_until(end: SystemTime, t: SystemTime) -> f64 {
    end.duration_since(t).unwrap_or_default().as_secs_f64()
}

async fn fixed_window_counts_per_clock_window(instance: Instance) {
    let mut rls = instance.client().await;
    let end = room_in_window(HOUR, ROOM).await;
    for left in [2, 1, 0] {
        let s = rls.check("shapes", &[("fixed", "f")]).await;
        assert_eq!((code(&s), s.limit_remaining), (Code::Ok, left));
    }
    let before = SystemTime::now();
    let denied = rls.check("shapes", &[("fixed", "f")]).await;
    let after = SystemTime::now();
    assert!(after < end, "the sequence took longer than {ROOM:?}");
    assert_eq!(code(&denied), Code::OverLimit);
    // The window is the clock hour: the wait is the rest of it, in whole seconds.
    let wait = until_reset(&denied).as_secs_f64();
    assert!(
        (secs_until(end, after).floor()..=secs_until(end, before).ceil()).contains(&wait),
        "reset {wait} s, the hour ends {} s after the request",
        secs_until(end, after)
    );
}
on_every_store!(fixed_window, fixed_window_counts_per_clock_window);

async fn token_bucket_allows_its_burst_then_refills(instance: Instance) {
    let mut rls = instance.client().await;
    for left in [3, 2, 1, 0] {
        let s = rls.check("shapes", &[("bucket", "b")]).await;
        assert_eq!((code(&s), s.limit_remaining), (Code::Ok, left));
    }
    let denied = rls.check("shapes", &[("bucket", "b")]).await;
    assert_eq!(code(&denied), Code::OverLimit);
    // One token per second (3600 per hour): the next fits within a second.
    assert_eq!(until_reset(&denied).as_secs(), 1);
    // A cost above the burst is never admitted; the client is told a full refill (4
    // tokens at one a second), not to retry at once.
    let s = status(&mut rls, one("bucket", "other", Some(5), false, None)).await;
    assert_eq!(code(&s), Code::OverLimit);
    assert_eq!(until_reset(&s).as_secs(), 4);
}
on_every_store!(token_bucket, token_bucket_allows_its_burst_then_refills);

/// The seed article's spending limit: capacity 1000 over 30 days; spend 30, then 990 is
/// over (only 970 left), and 970 fits.
async fn leaky_bucket_spending_limit(instance: Instance) {
    let mut rls = instance.client().await;
    let s = status(&mut rls, one("spend", "acct", Some(30), false, None)).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 970));
    let over = status(&mut rls, one("spend", "acct", Some(990), false, None)).await;
    assert_eq!(code(&over), Code::OverLimit);
    assert_eq!(
        over.limit_remaining, 970,
        "units left are reported on the denial"
    );
    // 20 units leak out in 0.6 days (51,840 s), less what leaked since the first spend.
    let wait = until_reset(&over).as_secs();
    assert!((51_000..=51_840).contains(&wait), "wait {wait}");
    let s = status(&mut rls, one("spend", "acct", Some(970), false, None)).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 0));
}
on_every_store!(leaky_bucket, leaky_bucket_spending_limit);

async fn several_limits_count_all_or_nothing(instance: Instance) {
    let mut rls = instance.client().await;
    let hits = |n| one("both", "k", Some(n), false, None);
    let s = status(&mut rls, hits(8)).await;
    assert_eq!(
        (code(&s), name(&s), s.limit_remaining),
        (Code::Ok, "per_hour", 2)
    );
    // 3 more: the hourly limit (10) refuses, the daily one (12) would admit.
    let s = status(&mut rls, hits(3)).await;
    assert_eq!(
        (code(&s), name(&s), s.limit_remaining),
        (Code::OverLimit, "per_hour", 2)
    );
    // Had the daily limit counted those 3, 8 + 3 + 2 would be over its 12.
    let s = status(&mut rls, hits(2)).await;
    assert_eq!(
        (code(&s), name(&s), s.limit_remaining),
        (Code::Ok, "per_hour", 0)
    );
    let s = status(&mut rls, hits(1)).await;
    assert_eq!((code(&s), name(&s)), (Code::OverLimit, "per_hour"));
}
on_every_store!(several_limits, several_limits_count_all_or_nothing);

async fn unit_multiplier_reports_the_nearest_unit(instance: Instance) {
    let mut rls = instance.client().await;
    let s = rls.check("shapes", &[("report", "r")]).await;
    let limit = s.current_limit.clone().expect("a limit");
    // 1800 s is reported as an hour, the nearest unit Envoy knows; the window is 30 min.
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, i32::from(Unit::Hour))
    );
    assert_eq!(until_reset(&s).as_secs(), 1_800);
}
on_every_store!(unit_multiplier, unit_multiplier_reports_the_nearest_unit);

async fn a_request_override_uses_its_own_limit_and_counter(instance: Instance) {
    let mut rls = instance.client().await;
    let per_minute = RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Minute.into(),
    };
    let s = status(&mut rls, one("sliding", "o", None, false, Some(per_minute))).await;
    let limit = s.current_limit.clone().expect("a limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, i32::from(Unit::Minute))
    );
    let s = status(&mut rls, one("sliding", "o", None, false, Some(per_minute))).await;
    assert_eq!(code(&s), Code::OverLimit);
    // The configured 5/hour counter of the same value is untouched.
    let s = rls.check("shapes", &[("sliding", "o")]).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 4));
}
on_every_store!(
    limit_override,
    a_request_override_uses_its_own_limit_and_counter
);

/// As in the reference, an override of the rule's own unit counts on the rule's counter:
/// the counter is named by the window, not the quota (docs/RULES.md says so).
async fn an_override_of_the_rules_unit_shares_its_counter(instance: Instance) {
    let mut rls = instance.client().await;
    for _ in 0..3 {
        rls.check("shapes", &[("sliding", "shared")]).await;
    }
    let per_hour = RateLimitOverride {
        requests_per_unit: 10,
        unit: RateLimitUnit::Hour.into(),
    };
    let s = status(
        &mut rls,
        one("sliding", "shared", None, false, Some(per_hour)),
    )
    .await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 6));
    // And the rule sees the override's request: 5 - 4.
    let s = rls.check("shapes", &[("sliding", "shared")]).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 0));
}
on_every_store!(
    override_of_the_same_unit,
    an_override_of_the_rules_unit_shares_its_counter
);

async fn hits_zero_checks_and_negative_hits_refund(instance: Instance) {
    let mut rls = instance.client().await;
    for _ in 0..3 {
        let s = status(&mut rls, one("sliding", "c", Some(0), false, None)).await;
        assert_eq!(
            (code(&s), s.limit_remaining),
            (Code::Ok, 5),
            "a check consumes nothing"
        );
    }
    let s = status(&mut rls, one("sliding", "c", Some(5), false, None)).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 0));
    let s = status(&mut rls, one("sliding", "c", Some(0), false, None)).await;
    assert_eq!(
        (code(&s), s.limit_remaining),
        (Code::Ok, 0),
        "at the limit, a check is within it, as the reference answers"
    );
    let s = status(&mut rls, one("sliding", "c", Some(2), true, None)).await;
    assert_eq!(
        (code(&s), s.limit_remaining),
        (Code::Ok, 2),
        "two units given back"
    );
    let s = status(&mut rls, one("sliding", "c", Some(2), false, None)).await;
    assert_eq!((code(&s), s.limit_remaining), (Code::Ok, 0));
    let s = rls.check("shapes", &[("sliding", "c")]).await;
    assert_eq!(code(&s), Code::OverLimit);
}
on_every_store!(check_and_refund, hits_zero_checks_and_negative_hits_refund);

/// Requests in one simultaneous burst, over several connections.
const BURST: usize = 25;
/// The limit of every `burst_*` rule.
const BURST_LIMIT: usize = 5;

/// A burst of simultaneous requests for one counter admits exactly the limit: the
/// store's check-and-count is atomic however the requests interleave. On Redis, the
/// counter is the one key of its limit's shape.
async fn simultaneous_burst_admits_exactly_the_limit(instance: Instance, key: &str, shape: Shape) {
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(instance.client().await);
    }
    let end = room_in_window(HOUR, ROOM).await;
    let answers = burst(&clients, BURST, &request("shapes", &[&[(key, "same")]])).await;
    assert!(
        SystemTime::now() < end,
        "the burst took longer than {ROOM:?}"
    );
    let admitted = answers.iter().filter(|a| a.result == Ok(Code::Ok)).count();
    let denied = answers
        .iter()
        .filter(|a| a.result == Ok(Code::OverLimit))
        .count();
    assert_eq!(
        (admitted, denied),
        (BURST_LIMIT, BURST - BURST_LIMIT),
        "{key}: {:?}",
        tally(&answers)
    );
    // One counter in the shared store.
    let entries = [(key, "same")];
    match &instance.backing {
        Backing::Memory => {}
        Backing::Redis(redis) => assert_eq!(
            redis.keys("*"),
            [redis_key("", "shapes", &entries, &[shape])]
        ),
        Backing::Postgres(postgres) => {
            let rows = postgres.psql("SELECT key FROM tollgate_counters");
            assert_eq!(rows, counter_key("shapes", &entries, &[shape]));
        }
    }
}

macro_rules! burst_on_every_store {
    ($name:ident, $key:literal, $shape:expr) => {
        on_every_store!($name, |instance| {
            simultaneous_burst_admits_exactly_the_limit(instance, $key, $shape)
        });
    };
}
burst_on_every_store!(burst_sliding_window, "burst_sliding", Shape::sliding(HOUR));
burst_on_every_store!(
    burst_fixed_window,
    "burst_fixed",
    Shape::Fixed { window: HOUR }
);
burst_on_every_store!(
    burst_token_bucket,
    "burst_token",
    Shape::Bucket { window: DAY }
);
burst_on_every_store!(
    burst_leaky_bucket,
    "burst_leaky",
    Shape::Bucket { window: DAY }
);

/// Unit counts at the edges of what Lua's numbers (2^53) and 64-bit integers hold.
const WIDE: [u64; 7] = [
    (1 << 53) - 1,
    1 << 53,
    (1 << 53) + 1,
    (1 << 63) - 1,
    1 << 63,
    (1 << 63) + 1,
    u64::MAX,
];

/// The limits [`WIDE`] counts are sent to as hits and refunds, one of each kind (on
/// counters of their own, not the bursts').
const WIDE_KEYS: [&str; 3] = ["burst_sliding", "burst_fixed", "burst_token"];

/// One answer: what was asked, and what came back.
type Answer = (String, String);

/// A call's answer as text: its one status's code and units left, or its error.
fn said(answer: Result<RateLimitResponse, tonic::Status>) -> String {
    match answer {
        Ok(r) => format!(
            "{:?} {}",
            code(&r.statuses[0]),
            r.statuses[0].limit_remaining
        ),
        Err(e) => format!("{:?}: {}", e.code(), e.message()),
    }
}

/// What every store must answer to [`wide_transcript`]: a hit that cannot fit is over the
/// limit and counts nothing; a refund empties the counter and charges nothing; a charge
/// or RLQS usage fills it; the usage series never goes down.
fn wide_expected() -> Vec<Answer> {
    let mut want = Vec::new();
    let mut say = |what: String, answer: &str| want.push((what, answer.to_owned()));
    for n in WIDE {
        for key in WIDE_KEYS {
            say(format!("{key} consume {n}"), "OverLimit 5");
            say(format!("{key} consume 1"), "Ok 4");
            say(format!("{key} refund {n}"), "Ok 5");
            say(format!("{key} consume 1 after the refund"), "Ok 4");
        }
        say("wide_budget charge 10".into(), "Ok 990");
        say(format!("wide_budget charge {n}"), "OverLimit 990");
        say("wide_budget check".into(), "OverLimit 0");
        say(format!("wide_budget refund {n}"), "Ok 1000");
        say("wide_budget charge 1".into(), "Ok 999");
        say("wide_usage consume 10".into(), "Ok 990");
        say(format!("RLQS usage {n} answered"), "true");
        say(
            format!("wide_usage check after RLQS usage {n}"),
            "OverLimit 0",
        );
        say(format!("RLQS usage series after {n}"), "not lower");
    }
    say("RLQS usage series at the end".into(), "held at u64::MAX");
    say("tollgate_store_disagreements_total".into(), "0");
    want
}

/// Sends every count of [`WIDE`] as hits, a charge, a refund and RLQS usage, each on
/// counters of its own; the answers.
async fn wide_transcript(instance: &Instance) -> Vec<Answer> {
    let mut rls = instance.client().await;
    let stream = &mut QuotaStream::open(&instance.server).await;
    let series = r#"tollgate_rlqs_usage_allowed_total{domain="shapes",key1="wide_usage",key2=""}"#;
    let mut reported = 0.0;
    // The fixed window's hour must not end during the run.
    room_in_window(HOUR, ROOM).await;
    let mut got = Vec::new();
    for (i, n) in WIDE.into_iter().enumerate() {
        let value = format!("n{i}");
        let mut ask = async |key: &str, hits: u64, negative: bool| {
            said(rls.call(one(key, &value, Some(hits), negative, None)).await)
        };
        for key in WIDE_KEYS {
            got.push((format!("{key} consume {n}"), ask(key, n, false).await));
            got.push((format!("{key} consume 1"), ask(key, 1, false).await));
            got.push((format!("{key} refund {n}"), ask(key, n, true).await));
            let what = format!("{key} consume 1 after the refund");
            got.push((what, ask(key, 1, false).await));
        }
        let budget = "wide_budget";
        got.push((format!("{budget} charge 10"), ask(budget, 10, false).await));
        got.push((format!("{budget} charge {n}"), ask(budget, n, false).await));
        got.push((format!("{budget} check"), ask(budget, 0, false).await));
        got.push((format!("{budget} refund {n}"), ask(budget, n, true).await));
        got.push((format!("{budget} charge 1"), ask(budget, 1, false).await));
        let usage = "wide_usage";
        got.push((format!("{usage} consume 10"), ask(usage, 10, false).await));
        stream.report("shapes", &[(usage, &value)], n, 0).await;
        let answered = stream.answered().await.to_string();
        got.push((format!("RLQS usage {n} answered"), answered));
        let what = format!("{usage} check after RLQS usage {n}");
        got.push((what, ask(usage, 0, false).await));
        let now = instance.server.metric(series).await.expect("the series");
        let trend = match now >= reported {
            true => "not lower".to_owned(),
            false => format!("down from {reported} to {now}"),
        };
        got.push((format!("RLQS usage series after {n}"), trend));
        reported = now;
    }
    let end = instance.server.metric(series).await.expect("the series");
    let end = match end == u64::MAX as f64 {
        true => "held at u64::MAX".to_owned(),
        false => end.to_string(),
    };
    got.push(("RLQS usage series at the end".into(), end));
    // The shared stores' scripts and the Rust algorithms decided every call alike.
    let series = "tollgate_store_disagreements_total";
    let disagreements = instance.server.metric(series).await.unwrap_or(0.0);
    got.push((series.into(), disagreements.to_string()));
    got
}

/// Counts past 2^53 and 2^63 as hits, charges, refunds and RLQS usage: the memory store,
/// Redis, Valkey and PostgreSQL give the same answers, and none wraps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_every_stores_numbers_get_the_same_answers() {
    let want = wide_expected();
    let mut wrong = Vec::new();
    for (store, instance) in [
        ("memory", Instance::memory()),
        ("redis", Instance::redis(Engine::Redis)),
        ("valkey", Instance::redis(Engine::Valkey)),
        ("postgres", Instance::postgres()),
    ] {
        let got = wide_transcript(&instance).await;
        assert_eq!(got.len(), want.len(), "{store}");
        for ((what, answer), (_, wanted)) in got.iter().zip(&want) {
            if answer != wanted {
                wrong.push(format!("{store}: {what}: {answer}, not {wanted}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
