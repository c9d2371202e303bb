//! The service surface: health endpoints, request validation, response fields, counting
//! (bursts, `hits_addend`), units, and counter bounds.

use std::time::{Duration, SystemTime};

use tollgate_testkit::grpc::{
    Code, Unit, assert_limited, assert_unlimited, code, limit, overall, request, until_reset,
};
use tollgate_testkit::h2_rls::H2Rls;
use tollgate_testkit::load::{Call, timed};
use tollgate_testkit::tollgate::{Listening, Serve};

use crate::in_process::InProcess;
use tollgate_testkit::wait::room_in_window;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: per_user
  - key: hits
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: blocked
    rate_limit:
      unit: hour
      requests_per_unit: 0
  - key: big
    rate_limit:
      unit: day
      requests_per_unit: 1000000
"#;

const MINUTE: Duration = Duration::from_secs(60);
const DAY: u64 = 86_400;

#[tokio::test]
async fn http_healthcheck_returns_ok() {
    let server = InProcess::rules(RULES).start();
    let resp = server.get("/healthcheck").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body.trim_end(), "OK");
}

#[test]
fn readiness_line_announces_loopback_ports() {
    let server = Serve::rules(RULES).start();
    assert!(server.addrs.on_ipv4_loopback(), "{:?}", server.addrs);
}

#[tokio::test]
async fn grpc_health_check_is_serving() {
    let server = InProcess::rules(RULES).start();
    let mut health = HealthClient::new(server.channel().await);
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let resp = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("grpc.health.v1.Health/Check")
            .into_inner();
        assert_eq!(
            resp.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
}

#[tokio::test]
async fn rejects_malformed_requests_with_invalid_argument() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;

    let msg = rls.invalid(request("", &[&[("user", "a")]])).await;
    assert!(msg.contains("rate limit domain must not be empty"), "{msg}");

    let msg = rls.invalid(request("api", &[])).await;
    assert!(
        msg.contains("rate limit descriptor list must not be empty"),
        "{msg}"
    );

    // A descriptor without entries matches no rule: OK, no limit, as the reference says.
    let resp = rls.ok(request("api", &[&[("user", "a")], &[]])).await;
    assert_eq!(resp.statuses.len(), 2);
    assert_eq!(resp.statuses[1].current_limit, None);

    let msg = rls.invalid(request("api", &[&[("", "a")]])).await;
    assert!(msg.contains("empty key"), "{msg}");
}

#[tokio::test]
async fn descriptor_count_is_capped_at_64() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let one: &[(&str, &str)] = &[("unknown", "x")];

    let resp = rls.ok(request("api", &[one; 64])).await;
    assert_eq!(overall(&resp), Code::Ok);

    let msg = rls.invalid(request("api", &[one; 65])).await;
    assert!(msg.contains("too many descriptors"), "{msg}");
}

#[tokio::test]
async fn entry_count_is_capped_at_32() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let keys: Vec<String> = (0..33).map(|i| format!("k{i}")).collect();
    let entries: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();

    let status = rls.check("api", &entries[..32]).await;
    assert_unlimited(&status);

    let msg = rls.invalid(request("api", &[&entries[..]])).await;
    assert!(msg.contains("too many entries"), "{msg}");
}

#[tokio::test]
async fn keys_and_values_are_capped_at_4096_bytes() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let max = "k".repeat(4096);
    let over = "k".repeat(4097);

    let status = rls.check("api", &[("user", &max)]).await;
    assert_limited(&status, Code::Ok, &limit(5, Unit::Minute, "per_user"), 4);
    assert_unlimited(&rls.check("api", &[(&max, "v")]).await);

    let msg = rls.invalid(request("api", &[&[("user", &over)]])).await;
    assert!(msg.contains("bytes (at most 4096)"), "{msg}");
    let msg = rls.invalid(request("api", &[&[(&over, "v")]])).await;
    assert!(msg.contains("bytes (at most 4096)"), "{msg}");
}

#[tokio::test]
async fn unknown_domain_and_unmatched_descriptor_are_ok_without_limit() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    for _ in 0..10 {
        assert_unlimited(&rls.check("no-such-domain", &[("user", "alice")]).await);
        assert_unlimited(&rls.check("api", &[("nobody", "x")]).await);
    }
}

#[tokio::test]
async fn limited_status_reports_limit_remaining_and_reset() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let status = rls.check("api", &[("user", "alice")]).await;
    assert_limited(&status, Code::Ok, &limit(5, Unit::Minute, "per_user"), 4);
    let reset = until_reset(&status);
    assert!(
        reset > Duration::ZERO && reset <= MINUTE,
        "duration_until_reset {reset:?} for a fresh per-minute counter"
    );
}

#[tokio::test]
async fn statuses_follow_request_order_and_overall_code_reflects_any_over_limit() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;

    let resp = rls
        .ok(request(
            "api",
            &[&[("big", "1")], &[("nobody", "x")], &[("user", "carol")]],
        ))
        .await;
    assert_eq!(overall(&resp), Code::Ok, "{resp:?}");
    assert_limited(
        &resp.statuses[0],
        Code::Ok,
        &limit(1_000_000, Unit::Day, ""),
        999_999,
    );
    assert_unlimited(&resp.statuses[1]);
    assert_limited(
        &resp.statuses[2],
        Code::Ok,
        &limit(5, Unit::Minute, "per_user"),
        4,
    );

    let resp = rls
        .ok(request(
            "api",
            &[&[("user", "dave")], &[("blocked", "x")], &[("nobody", "x")]],
        ))
        .await;
    assert_eq!(overall(&resp), Code::OverLimit, "{resp:?}");
    // Refused, the request counted on none of its descriptors (all or none): dave's 5
    // are all left.
    assert_limited(
        &resp.statuses[0],
        Code::Ok,
        &limit(5, Unit::Minute, "per_user"),
        5,
    );
    assert_limited(
        &resp.statuses[1],
        Code::OverLimit,
        &limit(0, Unit::Hour, ""),
        0,
    );
    assert_unlimited(&resp.statuses[2]);
}

/// The load benchmark counts an answer only if it is well formed: a status with its limit
/// per descriptor, and the overall code agreeing with them. Its own client ([`H2Rls`])
/// sees every answer and every error as tonic's does.
#[tokio::test]
async fn answers_under_rules_are_well_formed_and_others_are_not() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let mut h2 = H2Rls::connect(server.grpc)
        .await
        .expect("the benchmark's client connects");
    let big: &[(&str, &str)] = &[("big", "wf")];
    let blocked: &[(&str, &str)] = &[("blocked", "wf")];
    let nobody: &[(&str, &str)] = &[("nobody", "wf")];
    let cases = [
        (vec![big], Code::Ok, true),
        (vec![big, blocked], Code::OverLimit, true),
        (vec![big, nobody], Code::Ok, false),
        (vec![nobody], Code::Ok, false),
    ];
    for (descriptors, code, well_formed) in cases {
        let want = (Ok(code), well_formed);
        let answer = timed(&mut rls, request("api", &descriptors)).await;
        assert_eq!((answer.result, answer.well_formed), want, "{descriptors:?}");
        let answer = timed(&mut h2, request("api", &descriptors)).await;
        assert_eq!(
            (answer.result, answer.well_formed),
            want,
            "H2Rls: {descriptors:?}"
        );
    }
    let invalid = Call::call(&mut h2, request("", &[big]))
        .await
        .expect_err("an empty domain is refused");
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument, "{invalid:?}");
    assert_eq!(invalid.message(), rls.invalid(request("", &[big])).await);
}

#[tokio::test]
async fn zero_requests_per_unit_blocks_every_request() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    for _ in 0..3 {
        let status = rls.check("api", &[("blocked", "anything")]).await;
        assert_limited(&status, Code::OverLimit, &limit(0, Unit::Hour, ""), 0);
    }
}

#[tokio::test]
async fn burst_admits_exactly_the_limit_then_over_limit() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let per_user = limit(5, Unit::Minute, "per_user");
    for remaining in (0..5).rev() {
        let status = rls.check("api", &[("user", "alice")]).await;
        assert_limited(&status, Code::Ok, &per_user, remaining);
    }
    for _ in 0..3 {
        let status = rls.check("api", &[("user", "alice")]).await;
        assert_limited(&status, Code::OverLimit, &per_user, 0);
        // The contract bounds the reset by the window only for a fresh
        // counter; an exhausted one must at least report a future reset.
        let reset = until_reset(&status);
        assert!(reset > Duration::ZERO, "{reset:?}");
    }
}

#[tokio::test]
async fn distinct_values_of_a_key_have_independent_counters() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let per_user = limit(5, Unit::Minute, "per_user");
    for _ in 0..5 {
        rls.check("api", &[("user", "alice")]).await;
    }
    let status = rls.check("api", &[("user", "alice")]).await;
    assert_limited(&status, Code::OverLimit, &per_user, 0);
    let status = rls.check("api", &[("user", "bob")]).await;
    assert_limited(&status, Code::Ok, &per_user, 4);
}

#[tokio::test]
async fn hits_addend_consumes_that_many_and_only_admitted_hits_count() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let ten = limit(10, Unit::Minute, "");
    let key: &[(&str, &str)] = &[("hits", "h")];

    assert_limited(&rls.check_hits("api", key, 7).await, Code::Ok, &ten, 3);
    // Denied because 4 > 3; the 3 units left are still reported (a smaller request fits).
    assert_limited(
        &rls.check_hits("api", key, 4).await,
        Code::OverLimit,
        &ten,
        3,
    );
    assert_limited(&rls.check_hits("api", key, 3).await, Code::Ok, &ten, 0);
    assert_limited(
        &rls.check_hits("api", key, 1).await,
        Code::OverLimit,
        &ten,
        0,
    );
}

#[tokio::test]
async fn hits_addend_zero_counts_as_one() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let ten = limit(10, Unit::Minute, "");
    let key: &[(&str, &str)] = &[("hits", "zero")];
    assert_limited(&rls.check_hits("api", key, 0).await, Code::Ok, &ten, 9);
    assert_limited(&rls.check_hits("api", key, 0).await, Code::Ok, &ten, 8);
    assert_limited(&rls.check_hits("api", key, 1).await, Code::Ok, &ten, 7);
}

#[tokio::test]
async fn every_unit_is_reported_case_insensitively() {
    let units = [
        ("second", Unit::Second, 1),
        ("Minute", Unit::Minute, 60),
        ("HOUR", Unit::Hour, 3_600),
        ("day", Unit::Day, DAY),
        ("WeeK", Unit::Week, 7 * DAY),
        ("month", Unit::Month, 30 * DAY),
        ("YEAR", Unit::Year, 365 * DAY),
    ];
    let mut yaml = String::from("domain: units\ndescriptors:\n");
    for (text, _, _) in &units {
        yaml.push_str(&format!(
            "  - key: {text}\n    rate_limit:\n      unit: {text}\n      requests_per_unit: 3\n"
        ));
    }
    let server = InProcess::rules(&yaml).start();
    let mut rls = server.client().await;
    let mut resets = Vec::new();
    for (text, unit, max_seconds) in units {
        let status = rls.check("units", &[(text, "x")]).await;
        assert_limited(&status, Code::Ok, &limit(3, unit, ""), 2);
        resets.push((text, until_reset(&status), Duration::from_secs(max_seconds)));
    }
    for (text, reset, window) in resets {
        assert!(
            reset > Duration::ZERO && reset <= window,
            "unit {text}: duration_until_reset {reset:?} exceeds the window {window:?}"
        );
    }
}

/// A month is 30 days and a year 365, as in the reference: fixed windows of those units
/// end where epoch-aligned windows of exactly that length end, and a fresh counter's
/// reset is the time left until then.
#[tokio::test]
async fn a_month_is_30_days_and_a_year_365() {
    let yaml = "domain: units\ndescriptors:\n\
        \x20 - {key: m, rate_limit: {unit: month, requests_per_unit: 3, algorithm: fixed_window}}\n\
        \x20 - {key: y, rate_limit: {unit: year, requests_per_unit: 3, algorithm: fixed_window}}\n";
    let server = InProcess::rules(yaml).start();
    let mut rls = server.client().await;
    for (key, days) in [("m", 30), ("y", 365)] {
        let window = Duration::from_secs(days * DAY);
        let end = room_in_window(window, MINUTE).await;
        let before = SystemTime::now();
        let status = rls.check("units", &[(key, "x")]).await;
        let after = SystemTime::now();
        assert_eq!(code(&status), Code::Ok, "{status:?}");
        let left = |t: SystemTime| end.duration_since(t).expect("before the window's end");
        let reset = until_reset(&status);
        assert!(
            left(after).as_secs() <= reset.as_secs()
                && reset <= left(before) + Duration::from_secs(1),
            "{key}: reset {reset:?}, but a {days}-day window ends in {:?}",
            left(after)
        );
    }
}

#[tokio::test]
async fn counters_beyond_max_counters_are_evicted_not_refused() {
    let server = InProcess::rules(RULES)
        .args(["--max-counters", "100"])
        .start();
    let mut rls = server.client().await;
    let per_user = limit(5, Unit::Minute, "per_user");
    for i in 0..1000 {
        let user = format!("user-{i}");
        let status = rls.check("api", &[("user", &user)]).await;
        assert_limited(&status, Code::Ok, &per_user, 4);
    }
    // The newest counter is not among the evicted old ones.
    let status = rls.check("api", &[("user", "user-999")]).await;
    assert_limited(&status, Code::Ok, &per_user, 3);
    assert_counters_accounted(&server, 100, 1000).await;
}

/// Every counter `created` is either held or was evicted (none expires while a test
/// runs), and no more than `cap` are held.
pub async fn assert_counters_accounted(server: &Listening, cap: u64, created: u64) {
    let metric = async |name: &str| {
        server
            .metric(name)
            .await
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let held = metric("tollgate_counters").await;
    let evicted = metric("tollgate_counter_evictions_total").await;
    assert_eq!(metric("tollgate_counters_expired_total").await, 0.0);
    assert_eq!(
        held + evicted,
        created as f64,
        "{created} counters: {held} held, {evicted} evicted"
    );
    assert!(
        held <= cap as f64,
        "{held} counters held under --max-counters {cap}"
    );
}

/// A flood of requests with a fresh value each keeps memory bounded by `--max-counters`
/// and counts its evictions, and it cannot reset a counter that is at its limit: eviction
/// takes the least-used of a random sample, and the flood's counters are barely used.
#[tokio::test]
async fn a_unique_key_flood_stays_within_max_counters() {
    const CAP: u64 = 50;
    const FLOOD: u64 = 2_000;
    let server = InProcess::rules(RULES)
        .args(["--max-counters", &CAP.to_string()])
        .start();
    let mut rls = server.client().await;
    for _ in 0..5 {
        assert_eq!(code(&rls.check("api", &[("user", "full")]).await), Code::Ok);
    }
    assert_eq!(
        code(&rls.check("api", &[("user", "full")]).await),
        Code::OverLimit
    );

    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..4 {
        let mut rls = rls.clone();
        tasks.spawn(async move {
            for i in (task..FLOOD).step_by(4) {
                let status = rls.check("api", &[("user", &format!("flood-{i}"))]).await;
                assert_eq!(
                    code(&status),
                    Code::Ok,
                    "a fresh counter admits: {status:?}"
                );
            }
        });
    }
    tasks.join_all().await;

    assert_counters_accounted(&server, CAP, FLOOD + 1).await;
    let after = rls.check("api", &[("user", "full")]).await;
    assert_eq!(
        code(&after),
        Code::OverLimit,
        "the full counter survived a flood of {FLOOD} fresh values under --max-counters {CAP}"
    );
}
