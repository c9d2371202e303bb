//! Usage budgets through a real Envoy, in the two-call pattern of Envoy Gateway and Envoy AI
//! Gateway: a check at request time (`hits_addend: 0`), and a charge when the stream ends
//! (`apply_on_stream_done`) of the tokens the upstream reported or of a fixed cost. And the
//! reference service's quota scenarios, written afresh (configs in `configs/`). And a
//! calendar-day budget in New York, whose reset header ends at local midnight.
//!
//! The charge is fire-and-forget: Envoy sends it after the client has its response. Each
//! test therefore waits, on Tollgate's metrics, for the charge to be counted before the
//! next request.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use tollgate_testkit::envoy::{Envoy, Upstream, upstream};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait;
use tollgate_testkit::zoneinfo;

/// Tenants' token budgets (5 s windows, so that a test can watch one free up), a fixed
/// cost budget, and the reference's two quota services with metadata.
const RULES: &str = r#"
domain: ai
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 1000}
  - key: daily_tenant
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1000, calendar: true, time_zone: America/New_York}
  - key: fixed_tenant
    budget: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: service
    value: service_1
    quota_mode: true
    metadata: {service_with_quota: {name: service_1}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    metadata: {service_with_quota: {name: service_2}}
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

const BUDGETS_YAML: &str = include_str!("configs/budgets.yaml");
const MULTISERVICE_YAML: &str = include_str!("configs/multiservice.yaml");

/// How long a charge sent at stream end may take to be counted.
const CHARGED: Duration = Duration::from_secs(10);

/// `template` with each `port_value: FROM` (exactly once each) pointing at `to`.
pub(crate) fn ports(template: &str, rewrites: &[(u16, SocketAddr)]) -> String {
    let mut yaml = template.to_owned();
    for (from, to) in rewrites {
        let from = format!("port_value: {from}}}");
        assert_eq!(
            yaml.matches(&from).count(),
            1,
            "`{from}` once in the config"
        );
        assert!(to.ip().is_loopback());
        yaml = yaml.replace(&from, &format!("port_value: {}}}", to.port()));
    }
    yaml
}

async fn budgets_envoy(upstream: &Upstream, tollgate: &Server) -> Envoy {
    let yaml = ports(
        BUDGETS_YAML,
        &[(5678, upstream.addr), (8081, tollgate.grpc_addr())],
    );
    Envoy::start(&yaml).await
}

fn total_hits(key1: &str) -> String {
    format!("ratelimit_service_rate_limit_total_hits{{domain=\"ai\",key1=\"{key1}\",key2=\"\"}}")
}

/// Waits until `server` has counted `units` in total for descriptors `key1`.
async fn await_counted(server: &Server, key1: &str, units: u64) {
    let series = total_hits(key1);
    wait::until_async(
        &format!("{series} = {units}"),
        CHARGED,
        async || match server.metric(&series).await {
            Some(v) if v == units as f64 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

/// A request for `tenant` on `path`, the upstream reporting `tokens` of usage.
async fn llm(envoy: &Envoy, tenant: &str, tokens: u64) -> u16 {
    let tokens = tokens.to_string();
    let headers = [
        ("x-tenant", tenant),
        (upstream::REPORT_USAGE, tokens.as_str()),
    ];
    envoy.get("/llm", &headers).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reported_after_the_response_exhaust_the_budget_until_the_window_moves() {
    let tollgate = Serve::rules(RULES).start();
    let upstream = Upstream::start().await;
    let envoy = budgets_envoy(&upstream, &tollgate).await;

    // A budget of 1,000 tokens and responses of 400: the third response takes the count
    // past the limit, and it is recorded, not refused.
    for used in [400, 800, 1_200] {
        assert_eq!(llm(&envoy, "acme", 400).await, 200);
        await_counted(&tollgate, "tenant", used).await;
    }
    assert_eq!(llm(&envoy, "acme", 400).await, 429, "1,200 of 1,000 used");
    assert_eq!(
        upstream.hits(),
        3,
        "the denied request never reached the upstream"
    );
    assert_eq!(
        llm(&envoy, "other", 400).await,
        200,
        "budgets are per tenant"
    );
    let overspent = tollgate
        .metric("tollgate_budget_overspend_total{domain=\"ai\",key1=\"tenant\",key2=\"\"}")
        .await;
    assert_eq!(overspent, Some(200.0), "200 tokens went past the limit");

    // The debt ages out of the 5 s window, and the tenant is served again.
    let (_, waited) = wait::until_async(
        "the budget frees up",
        Duration::from_secs(15),
        async || match llm(&envoy, "acme", 1).await {
            200 => Ok(()),
            status => Err(format!("{status}")),
        },
    )
    .await;
    assert!(
        waited >= Duration::from_secs(2),
        "freed after {waited:?}, too soon"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_cost_is_charged_after_each_response() {
    let tollgate = Serve::rules(RULES).start();
    let upstream = Upstream::start().await;
    let envoy = budgets_envoy(&upstream, &tollgate).await;
    let acme = [("x-tenant", "acme")];
    // 300 per response against 1,000: checks at 0, 300, 600 and 900 pass.
    for used in [300, 600, 900, 1_200] {
        assert_eq!(envoy.get("/fixed", &acme).await.status, 200);
        await_counted(&tollgate, "fixed_tenant", used).await;
    }
    assert_eq!(envoy.get("/fixed", &acme).await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_on_one_redis_share_a_budget() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // A store timeout a busy host meets: with the default 10 ms, a call that missed it
    // let an instance decide from its view, which may not hold the other's charges yet.
    let instance = || {
        Serve::rules(RULES)
            .redis("single", &redis.url())
            .args(["--store-timeout", "2s"])
            .start_connected()
    };
    let a = instance().await;
    let b = instance().await;
    let (envoy_a, envoy_b) = (
        budgets_envoy(&upstream, &a).await,
        budgets_envoy(&upstream, &b).await,
    );
    for used in [400, 800] {
        assert_eq!(llm(&envoy_a, "shared", 400).await, 200);
        await_counted(&a, "tenant", used).await;
    }
    assert_eq!(llm(&envoy_b, "shared", 400).await, 200);
    await_counted(&b, "tenant", 400).await;
    // 1,200 used between them: both refuse.
    assert_eq!(llm(&envoy_a, "shared", 1).await, 429);
    assert_eq!(llm(&envoy_b, "shared", 1).await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_quota_scenarios() {
    // quota.sh: two quota descriptors (1 and 2 a minute) counted per request; the request
    // is refused only when both are exhausted: two pass, the third does not.
    let tollgate = Serve::rules(RULES).start();
    let upstream = Upstream::start().await;
    let envoy = budgets_envoy(&upstream, &tollgate).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(envoy.get("/quota", &[]).await.status);
    }
    assert_eq!(statuses, [200, 200, 429]);

    // token-quota.sh: a check, then one hit charged when the response ends, against
    // service_2's 2 a minute. A check passes while used <= limit, as the reference's
    // does: three pass, the fourth is refused.
    let tollgate = Serve::rules(RULES).start();
    let envoy = budgets_envoy(&upstream, &tollgate).await;
    let mut statuses = Vec::new();
    for used in 1..=3 {
        statuses.push(envoy.get("/tokenquota", &[]).await.status);
        await_counted(&tollgate, "service_service_2", used).await;
    }
    statuses.push(envoy.get("/tokenquota", &[]).await.status);
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_routes_each_request_to_a_service_with_budget_left() {
    // multiservice-tokenquota.sh: the budgets of two services are checked; the metadata of
    // those not exhausted comes back (first one wins), Envoy routes on it, and the service
    // that answered is charged one hit. Charged after the response, "a total of 2
    // requests/minute for service_1 [1 a minute] and 3 for service_2 [2] is allowed".
    let tollgate = Serve::rules(RULES)
        .env("RESPONSE_DYNAMIC_METADATA", "true")
        .start();
    let (service_1, service_2) = (Upstream::start().await, Upstream::start().await);
    let yaml = ports(
        MULTISERVICE_YAML,
        &[
            (5678, service_1.addr),
            (5679, service_2.addr),
            (8081, tollgate.grpc_addr()),
        ],
    );
    let envoy = Envoy::start(&yaml).await;
    let mut served = Vec::new();
    for charged in 1..=5 {
        let status = envoy.get("/", &[]).await.status;
        served.push((status, service_1.hits(), service_2.hits()));
        if status == 200 {
            let (s1, s2) = (service_1.hits() as u64, service_2.hits() as u64);
            await_counted(&tollgate, "service_service_1", s1).await;
            await_counted(&tollgate, "service_service_2", s2).await;
            assert_eq!(s1 + s2, charged);
        }
    }
    served.push((
        envoy.get("/", &[]).await.status,
        service_1.hits(),
        service_2.hits(),
    ));
    // service_1 (1 a minute) serves two, service_2 (2) the next three, then both are spent.
    assert_eq!(
        served,
        [
            (200, 1, 0),
            (200, 2, 0),
            (200, 2, 1),
            (200, 2, 2),
            (200, 2, 3),
            (429, 2, 3)
        ]
    );
}

/// A day's token budget in New York's calendar, overspent by a charge at stream end: the
/// next request is refused until local midnight, and the `RateLimit-Reset` Envoy passes on
/// says when, to the second, as Python's `zoneinfo` computes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_day_budget_resets_at_midnight_in_its_zone() {
    let tollgate = Serve::rules(RULES)
        .args(["--limit-response-headers"])
        .env("TZ", "Asia/Kolkata")
        .start();
    let upstream = Upstream::start().await;
    let envoy = budgets_envoy(&upstream, &tollgate).await;
    let tenant = [("x-tenant", "acme"), (upstream::REPORT_USAGE, "1200")];
    let first = envoy.get("/daily", &tenant).await;
    assert_eq!(first.status, 200);
    await_counted(&tollgate, "daily_tenant", 1_200).await;

    let before = SystemTime::now();
    let denied = envoy.get("/daily", &tenant).await;
    let after = SystemTime::now();
    assert_eq!(denied.status, 429, "1,200 of 1,000 used today");
    let (_, midnight) = zoneinfo::window("America/New_York", "day", after);
    let (_, midnight_before) = zoneinfo::window("America/New_York", "day", before);
    let left = |t: SystemTime, end: SystemTime| end.duration_since(t).unwrap_or_default();
    // Whole seconds, rounded up; a request straddling midnight may see either day.
    let reset = denied.header_u64("ratelimit-reset");
    let earliest = left(after, midnight).as_secs();
    let latest = left(before, midnight_before).as_secs_f64().ceil() as u64;
    assert!(
        (earliest..=latest).contains(&reset),
        "RateLimit-Reset {reset}, New York's midnight is {earliest}..={latest} s away"
    );
    assert_eq!(denied.header_u64("ratelimit-limit"), 1_000);
}
