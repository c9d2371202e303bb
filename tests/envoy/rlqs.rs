//! RLQS end to end: two real Envoys with the `rate_limit_quota` filter (the example
//! `examples/envoy/rlqs/envoy.yaml`, one bucket per `x-tenant` value; Envoy 1.40 reports
//! every 5 s whatever `reporting_interval` says) in front of one upstream, one Tollgate or
//! two on one Redis dividing global limits between them. Load comes from paced clients,
//! one request in flight each.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_testkit::envoy::{Envoy, Upstream, render_rlqs};
use tollgate_testkit::http;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{ConfigDir, Serve, Server};
use tollgate_testkit::wait;

const RLQS_ENVOY_YAML: &str = include_str!("../../examples/envoy/rlqs/envoy.yaml");

/// Tenant `blocked` has a limit of 0; `fast` 20 per second, `slow` 600 per minute, `acme`
/// 100 per 20 s.
const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    value: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tenant
    value: fast
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: tenant
    value: slow
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: tenant
    rate_limit: {unit: second, unit_multiplier: 20, requests_per_unit: 100, algorithm: fixed_window}
"#;
/// How long the load runs.
const LOAD: Duration = Duration::from_secs(80);
/// The first report is the bucket's first request's, answered within the first second:
/// the bound holds from then on.
const FIRST_ANSWER: Duration = Duration::from_secs(1);

/// What the Tollgates' parts of a limit may add up to (docs/RLQS.md, bound (d)): the whole
/// with one Tollgate; with two, once each until every Envoy has reported twice (10 s), and
/// 1.15 times it after.
#[derive(Debug, Clone, Copy)]
enum Parts {
    One,
    Several,
}

impl Parts {
    /// What the parts add up to `since` the bucket's first request.
    fn at(self, since: Duration) -> f64 {
        match self {
            Parts::One => 1.0,
            Parts::Several if since < Duration::from_secs(10) => 2.0,
            Parts::Several => 1.15,
        }
    }

    /// Requests a rate of `per_s` times the parts admits in `[from, from + window)`, `from`
    /// counted since the bucket's first request.
    fn allowance(self, per_s: f64, from: Duration, window: Duration) -> f64 {
        let step = Duration::from_millis(100);
        let steps = (window.as_millis() / step.as_millis()) as u32;
        (0..steps)
            .map(|i| per_s * step.as_secs_f64() * self.at(from + step * i))
            .sum()
    }
}

async fn rlqs_envoy(upstream: &Upstream, tollgate: &Server) -> Envoy {
    Envoy::start(&render_rlqs(
        RLQS_ENVOY_YAML,
        upstream.addr,
        tollgate.grpc_addr(),
    ))
    .await
}

/// One answer through an Envoy: when the request was sent, and its status (200, or 429
/// from the filter).
struct Sent {
    at: SystemTime,
    status: u16,
}

/// Requests for `tenant` through `listener`, `per_s` a second, until `until`.
async fn drive(
    listener: SocketAddr,
    tenant: &'static str,
    per_s: f64,
    until: SystemTime,
) -> Vec<Sent> {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / per_s));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = Vec::new();
    while SystemTime::now() < until {
        ticks.tick().await;
        let at = SystemTime::now();
        let resp = http::get_with(listener, "/", &[("x-tenant", tenant)]).await;
        sent.push(Sent {
            at,
            status: resp.status,
        });
    }
    sent
}

fn epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).expect("a clock after 1970")
}

/// Admitted requests in `[from, from + window)`, over all clients.
fn admitted(clients: &[&[Sent]], from: SystemTime, window: Duration) -> usize {
    clients
        .iter()
        .flat_map(|c| c.iter())
        .filter(|s| s.status == 200 && s.at >= from && s.at < from + window)
        .count()
}

fn admitted_by(client: &[Sent]) -> usize {
    client.iter().filter(|s| s.status == 200).count()
}

/// Admitted per epoch-aligned second from `from` to `to`: when each second starts, and
/// its admissions.
fn per_second(clients: &[&[Sent]], from: SystemTime, to: SystemTime) -> Vec<(SystemTime, usize)> {
    let into = epoch(from).subsec_nanos();
    let mut start = from + Duration::from_nanos(u64::from((1_000_000_000 - into) % 1_000_000_000));
    let mut out = Vec::new();
    while start + Duration::from_secs(1) <= to {
        out.push((start, admitted(clients, start, Duration::from_secs(1))));
        start += Duration::from_secs(1);
    }
    out
}

/// docs/RLQS.md's bound for a limit of `limit` per `window` over `envoys` Envoys, for the
/// window that starts `from` after the bucket's first request: the limit's rate over the
/// window times what the Tollgates' parts add up to meanwhile, plus the tokens the Envoys'
/// buckets hold when the window starts, plus a bucket started full in it per Envoy (a
/// changed rate), each at most a quarter of the window's rate and a second of it, and two
/// tokens at least.
fn bound(limit: usize, window: Duration, envoys: usize, parts: Parts, from: Duration) -> usize {
    let per_s = limit as f64 / window.as_secs_f64();
    let burst_s = (window.as_secs_f64() / 4.0).min(1.0);
    let bursts = ((per_s * burst_s).ceil() as usize + envoys).max(2 * envoys);
    parts.allowance(per_s, from, window).floor() as usize + 2 * bursts
}

/// Two Envoys, 2.5 times each limit offered, 70 % through a and 30 % through b: from the
/// first answer on, no second admits more than the bound of 20 per second nor any minute
/// more than that of 600 per minute, at least 90 % of each limit is used, and a's share is
/// about its demand's. Then b goes, and a alone gets the whole limit.
async fn two_envoys_hold_per_second_and_per_minute_limits(
    a: Envoy,
    b: Envoy,
    parts: Parts,
    what: &str,
) {
    let start = SystemTime::now();
    let until = start + LOAD;
    let (fast_a, fast_b, slow_a, slow_b) = tokio::join!(
        drive(a.listener, "fast", 35.0, until),
        drive(b.listener, "fast", 15.0, until),
        drive(a.listener, "slow", 17.5, until),
        drive(b.listener, "slow", 7.5, until),
    );
    let from = start + FIRST_ANSWER;
    let seconds = per_second(&[&fast_a, &fast_b], from, until);
    let fast: Vec<usize> = seconds.iter().map(|(_, n)| *n).collect();
    let fast_bounds: Vec<usize> = seconds
        .iter()
        .map(|(at, _)| {
            let since = at.duration_since(start).unwrap_or_default();
            bound(20, Duration::from_secs(1), 2, parts, since)
        })
        .collect();
    println!("{what}: fast, admitted per second: {fast:?}, bounds {fast_bounds:?}");
    let mean = fast.iter().sum::<usize>() as f64 / fast.len() as f64;
    println!(
        "{what}: fast, mean {mean:.2} per second; a {} b {}",
        admitted_by(&fast_a),
        admitted_by(&fast_b)
    );
    assert!(
        fast.iter().zip(&fast_bounds).all(|(n, most)| n <= most),
        "{what}: {fast:?} against {fast_bounds:?}"
    );
    assert!(mean >= 18.0, "{what}: {mean} per second of 20");
    let minute = Duration::from_secs(60);
    let slow: Vec<(usize, usize)> = (0..)
        .map(Duration::from_secs)
        .take_while(|s| from + *s + minute <= until)
        .map(|s| {
            let since = FIRST_ANSWER + s;
            (
                admitted(&[&slow_a, &slow_b], from + s, minute),
                bound(600, minute, 2, parts, since),
            )
        })
        .collect();
    println!("{what}: slow, admitted per minute from each second on, and its bound: {slow:?}");
    assert!(!slow.is_empty(), "{what}: a whole minute measured");
    assert!(slow.iter().all(|(n, most)| n <= most), "{what}: {slow:?}");
    assert!(
        slow.iter().all(|(n, _)| *n >= 540),
        "{what}: {slow:?} per minute of 600"
    );
    for (x, y, tenant) in [(&fast_a, &fast_b, "fast"), (&slow_a, &slow_b, "slow")] {
        let in_a = admitted(&[x], from, LOAD) as f64;
        let share = in_a / (in_a + admitted(&[y], from, LOAD) as f64);
        assert!(
            (0.6..=0.8).contains(&share),
            "{what}: {tenant}: a's share {share}, demand 0.7"
        );
    }
    // b goes; a's Tollgate gives a the whole rate at once (or, on another Tollgate, at a's
    // next report, within 5 s).
    drop(b);
    let alone_from = SystemTime::now() + Duration::from_secs(6);
    let alone_until = alone_from + Duration::from_secs(3);
    let fast_a = drive(a.listener, "fast", 35.0, alone_until).await;
    let alone: Vec<usize> = per_second(&[&fast_a], alone_from, alone_until)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    println!("{what}: a alone, fast, admitted per second: {alone:?}");
    let alone_bound = bound(20, Duration::from_secs(1), 1, parts, LOAD);
    assert!(
        alone.iter().all(|n| (18..=alone_bound).contains(n)),
        "{what}: {alone:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_tollgate_holds_per_second_and_per_minute_limits_over_two_envoys() {
    let upstream = Upstream::start().await;
    let tollgate = Serve::rules(RULES).start();
    let a = rlqs_envoy(&upstream, &tollgate).await;
    let b = rlqs_envoy(&upstream, &tollgate).await;
    two_envoys_hold_per_second_and_per_minute_limits(a, b, Parts::One, "one Tollgate").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tollgates_on_one_redis_hold_per_second_and_per_minute_limits() {
    let redis = tokio::task::block_in_place(RedisServer::start);
    let upstream = Upstream::start().await;
    let serve = || Serve::rules(RULES).redis("single", &redis.url());
    let (t1, t2) = tokio::join!(serve().start_connected(), serve().start_connected());
    let a = rlqs_envoy(&upstream, &t1).await;
    let b = rlqs_envoy(&upstream, &t2).await;
    two_envoys_hold_per_second_and_per_minute_limits(
        a,
        b,
        Parts::Several,
        "two Tollgates on one Redis",
    )
    .await;
}

#[tokio::test]
async fn a_zero_limit_answers_429_with_the_filters_deny_response() {
    let upstream = Upstream::start().await;
    let tollgate = Serve::rules(RULES).start();
    let envoy = rlqs_envoy(&upstream, &tollgate).await;
    // The example denies the blocked tenant until Tollgate answers (no_assignment_behavior),
    // and Tollgate's first answer denies all: refused from the first request on.
    let first = envoy.get("/", &[("x-tenant", "blocked")]).await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (429, "quota exhausted\n")
    );
    let hits = upstream.hits();
    for _ in 0..5 {
        assert_eq!(envoy.get("/", &[("x-tenant", "blocked")]).await.status, 429);
    }
    assert_eq!(upstream.hits(), hits, "nothing denied reached the upstream");
    // Another tenant is limited, not blocked; no tenant header, not limited at all.
    assert_eq!(envoy.get("/", &[("x-tenant", "acme")]).await.status, 200);
    assert_eq!(envoy.get("/", &[]).await.status, 200);
}

#[tokio::test]
async fn a_rule_change_is_enforced_by_envoy_without_waiting_for_a_report() {
    let upstream = Upstream::start().await;
    // 1000 a second: without a push, Envoy would admit all the loop below sends until its
    // next report, 5 s away.
    let generous = RULES.replace(
        "unit: second, unit_multiplier: 20, requests_per_unit: 100, algorithm: fixed_window",
        "unit: second, requests_per_unit: 1000",
    );
    let config = ConfigDir::with_file("rules.yaml", &generous);
    let file = config.file("rules.yaml");
    let tollgate = Serve::path(&file).keep(config).start();
    let envoy = rlqs_envoy(&upstream, &tollgate).await;
    let get = async || envoy.get("/", &[("x-tenant", "acme")]).await.status;
    wait::until_async(
        "tenant acme admitted",
        Duration::from_secs(10),
        async || match get().await {
            200 => Ok(()),
            other => Err(format!("status {other}")),
        },
    )
    .await;
    let blocked = generous.replace("requests_per_unit: 1000", "requests_per_unit: 0");
    std::fs::write(&file, blocked).expect("rewrite the rules");
    // The reload pushes DENY_ALL at once: Envoy stops without waiting for its next report.
    let mut admitted = 0;
    let ((), took) =
        wait::until_async(
            "tenant acme denied",
            Duration::from_secs(10),
            async || match get().await {
                429 => Ok(()),
                other => {
                    admitted += 1;
                    Err(format!("status {other}"))
                }
            },
        )
        .await;
    println!("rule change enforced by Envoy after {took:?}, {admitted} requests later");
    assert!(
        took < Duration::from_secs(2),
        "enforced before the next report: {took:?}, {admitted} admitted"
    );
    for _ in 0..5 {
        assert_eq!(get().await, 429);
    }
}
