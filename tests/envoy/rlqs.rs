//! RLQS end to end: two real Envoys with the `rate_limit_quota` filter (the example
//! `examples/envoy/rlqs/envoy.yaml`, one bucket per `x-tenant` value; Envoy 1.40 reports
//! every 5 s whatever `reporting_interval` says) in front of one upstream, one Tollgate
//! dividing a global limit between them. Load comes from one paced client per Envoy, one
//! request in flight each.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_testkit::envoy::{Envoy, Upstream, render_rlqs};
use tollgate_testkit::http;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{ConfigDir, Serve, Server};
use tollgate_testkit::wait;

const RLQS_ENVOY_YAML: &str = include_str!("../../examples/envoy/rlqs/envoy.yaml");

/// The limit: 100 per fixed 20-second window (four reporting intervals), so that a window is
/// measured exactly on the client's clock; tenant `blocked` has a limit of 0.
const LIMIT: usize = 100;
const WINDOW: Duration = Duration::from_secs(20);
const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    value: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: second, unit_multiplier: 20, requests_per_unit: 100, algorithm: fixed_window}
"#;
/// Each client's pace: 40 requests per second per Envoy, far above the limit's 5.
const PACE: Duration = Duration::from_millis(25);
/// The stated bound beyond the limit, per window: Envoy's refill of one token per Envoy per
/// window, plus what an Envoy admits from its previous assignment while a report's answer
/// is on its way (a few ms at this pace: a request or so per Envoy).
const SLACK: usize = 2 + 2;

async fn rlqs_envoy(upstream: &Upstream, tollgate: &Server) -> Envoy {
    Envoy::start(&render_rlqs(
        RLQS_ENVOY_YAML,
        upstream.addr,
        tollgate.grpc_addr(),
    ))
    .await
}

/// One answer through an Envoy.
struct Sent {
    at: SystemTime,
    status: u16,
    body: String,
}

/// Requests for `tenant` through `listener` every [`PACE`] until `until`.
async fn drive(listener: SocketAddr, tenant: &'static str, until: SystemTime) -> Vec<Sent> {
    let mut ticks = tokio::time::interval(PACE);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = Vec::new();
    while SystemTime::now() < until {
        ticks.tick().await;
        let at = SystemTime::now();
        let resp = http::get_with(listener, "/", &[("x-tenant", tenant)]).await;
        sent.push(Sent {
            at,
            status: resp.status,
            body: resp.body,
        });
    }
    sent
}

fn epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).expect("a clock after 1970")
}

/// The start of the epoch-aligned window after `t`.
fn next_window(t: SystemTime) -> SystemTime {
    let into = epoch(t).as_nanos() % WINDOW.as_nanos();
    t + (WINDOW - Duration::from_nanos(u64::try_from(into).expect("within a window")))
}

/// Admitted requests per whole window from `from` (a window start) to `to`, per client.
fn admitted_per_window(clients: &[&[Sent]], from: SystemTime, to: SystemTime) -> Vec<Vec<usize>> {
    let mut windows = Vec::new();
    let mut start = from;
    while start + WINDOW <= to {
        let end = start + WINDOW;
        windows.push(
            clients
                .iter()
                .map(|sent| {
                    sent.iter()
                        .filter(|s| s.status == 200 && s.at >= start && s.at < end)
                        .count()
                })
                .collect(),
        );
        start = end;
    }
    windows
}

/// Admitted requests per second since the first request, per client: what a failure
/// needs to be read.
fn per_second(clients: &[&[Sent]]) -> Vec<Vec<usize>> {
    let Some(first) = clients.iter().filter_map(|c| c.first()).map(|s| s.at).min() else {
        return Vec::new();
    };
    let second = |s: &Sent| {
        s.at.duration_since(first)
            .map_or(0, |d| d.as_secs() as usize)
    };
    let seconds = clients
        .iter()
        .flat_map(|c| c.iter().map(second))
        .max()
        .unwrap_or(0)
        + 1;
    let mut out = vec![vec![0; clients.len()]; seconds];
    for (i, client) in clients.iter().enumerate() {
        for sent in client.iter().filter(|s| s.status == 200) {
            out[second(sent)][i] += 1;
        }
    }
    out
}

fn assert_under_bound(windows: &[Vec<usize>], what: &str) {
    for (i, per_client) in windows.iter().enumerate() {
        let total: usize = per_client.iter().sum();
        assert!(
            total <= LIMIT + SLACK,
            "{what}: window {i} admitted {total} > {LIMIT} + {SLACK}: {windows:?}"
        );
    }
}

fn assert_within_bound(windows: &[Vec<usize>], what: &str) {
    assert_under_bound(windows, what);
    for (i, per_client) in windows.iter().enumerate() {
        let total: usize = per_client.iter().sum();
        assert!(
            total >= LIMIT * 8 / 10,
            "{what}: window {i} admitted only {total} of {LIMIT}: {windows:?}"
        );
    }
}

/// Drives both Envoys at full pace for two whole windows; checks the admitted total per
/// window against the bound and the limit, and that both got a comparable share; the
/// windows before them, in which both subscribed, are held to the bound too. Returns Envoy
/// a's answers.
async fn hold_the_limit_together(a: &Envoy, b: &Envoy, what: &str) -> Vec<Sent> {
    // Both Envoys subscribe in the first second; measure the two windows after that.
    let start = SystemTime::now();
    let from = next_window(start + Duration::from_secs(1));
    let to = from + 2 * WINDOW;
    let (sent_a, sent_b) =
        tokio::join!(drive(a.listener, "acme", to), drive(b.listener, "acme", to));
    let windows = admitted_per_window(&[&sent_a, &sent_b], from, to);
    let lead_in = admitted_per_window(&[&sent_a, &sent_b], next_window(start) - WINDOW, from);
    println!("{what}: admitted in the windows of the subscriptions (a, b): {lead_in:?}");
    println!("{what}: admitted per {WINDOW:?} window (a, b), limit {LIMIT}: {windows:?}");
    println!(
        "{what}: admitted per second (a, b): {:?}",
        per_second(&[&sent_a, &sent_b])
    );
    assert_under_bound(&lead_in, &format!("{what}, subscribing"));
    assert_within_bound(&windows, what);
    let (total_a, total_b): (usize, usize) = windows
        .iter()
        .fold((0, 0), |(x, y), w| (x + w[0], y + w[1]));
    assert!(
        total_a * 4 >= total_b && total_b * 4 >= total_a,
        "{what}: equal demand, comparable shares: {total_a} and {total_b}"
    );
    sent_a
}

#[tokio::test]
async fn two_envoys_hold_one_global_limit_and_a_survivor_takes_the_whole() {
    let upstream = Upstream::start().await;
    let tollgate = Serve::rules(RULES).start();
    let a = rlqs_envoy(&upstream, &tollgate).await;
    let b = rlqs_envoy(&upstream, &tollgate).await;
    let sent_a = hold_the_limit_together(&a, &b, "two Envoys, one Tollgate").await;
    let denied = sent_a.iter().find(|s| s.status == 429).expect("denials");
    assert_eq!(
        denied.body, "quota exhausted\n",
        "the filter's deny response"
    );
    a_survivor_takes_the_whole(a, b, "one Tollgate").await;
}

/// Envoy b goes (holding no grant: the limit was spent); from the next window on, a gets
/// the whole limit.
async fn a_survivor_takes_the_whole(a: Envoy, b: Envoy, what: &str) {
    drop(b);
    let from = next_window(SystemTime::now());
    let to = from + WINDOW;
    let sent_a = drive(a.listener, "acme", to).await;
    let windows = admitted_per_window(&[&sent_a], from, to);
    println!("{what}, one Envoy left, admitted per window: {windows:?}");
    assert_within_bound(&windows, &format!("{what}, one Envoy left"));
}

#[tokio::test(flavor = "multi_thread")]
async fn two_tollgates_on_one_redis_hold_one_global_limit() {
    let redis = tokio::task::block_in_place(RedisServer::start);
    let upstream = Upstream::start().await;
    let serve = || Serve::rules(RULES).redis("single", &redis.url());
    let (t1, t2) = tokio::join!(serve().start_connected(), serve().start_connected());
    let a = rlqs_envoy(&upstream, &t1).await;
    let b = rlqs_envoy(&upstream, &t2).await;
    // Each Tollgate takes the part of the limit its Envoy's demand is of both.
    hold_the_limit_together(&a, &b, "two Envoys, two Tollgates on one Redis").await;
    // b's Tollgate withdraws its demand when b's stream closes.
    a_survivor_takes_the_whole(a, b, "two Tollgates").await;
}

#[tokio::test]
async fn a_zero_limit_answers_429_with_the_filters_deny_response() {
    let upstream = Upstream::start().await;
    let tollgate = Serve::rules(RULES).start();
    let envoy = rlqs_envoy(&upstream, &tollgate).await;
    // The bucket's first requests pass until Tollgate's first answer (no_assignment_behavior).
    let (first, _) = wait::until_async(
        "a 429 for tenant blocked",
        Duration::from_secs(10),
        async || {
            let resp = envoy.get("/", &[("x-tenant", "blocked")]).await;
            match resp.status {
                429 => Ok(resp),
                other => Err(format!("status {other}")),
            }
        },
    )
    .await;
    assert_eq!(first.body, "quota exhausted\n");
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
    let config = ConfigDir::with_file("rules.yaml", RULES);
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
    let blocked = RULES.replace("requests_per_unit: 100", "requests_per_unit: 0");
    std::fs::write(&file, blocked).expect("rewrite the rules");
    // The reload pushes DENY_ALL at once: Envoy stops long before it has spent the 49
    // tokens it was granted (half of 99, as it had just subscribed; 48 left after the
    // request above), without waiting for its next report.
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
        admitted < 40,
        "the grant was cut short: {admitted} admitted"
    );
    for _ in 0..5 {
        assert_eq!(get().await, 429);
    }
}
