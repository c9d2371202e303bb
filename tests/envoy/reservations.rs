//! Budget reservations through a real Envoy (`examples/envoy/in-flight/`): a request
//! reserves its declared maximum when it is admitted, and when its stream ends the
//! reservation is refunded and the usage the upstream reported is charged. Concurrent
//! requests on a nearly spent budget can no longer all pass.

use std::collections::BTreeSet;
use std::time::Duration;

use tollgate_testkit::envoy::{Envoy, Upstream, render_example, upstream};
use tollgate_testkit::http;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait;

const ENVOY_YAML: &str = include_str!("../../examples/envoy/in-flight/envoy.yaml");
const RULES: &str = include_str!("../../examples/envoy/in-flight/rules.yaml");

/// How long the settlement sent at stream end (fire and forget) may take to arrive.
const SETTLED: Duration = Duration::from_secs(10);

/// A request of tenant `acme` declaring 100 tokens at most and using 40, held by the
/// upstream until let through: its status and `x-ratelimit-remaining`.
fn reserve(envoy: &Envoy) -> tokio::task::JoinHandle<(u16, Option<u64>)> {
    let listener = envoy.listener;
    tokio::spawn(async move {
        let headers = [
            ("x-tenant", "acme"),
            ("x-max-tokens", "100"),
            (upstream::REPORT_USAGE, "40"),
            (upstream::HOLD, "1"),
        ];
        let answer = http::get_with(listener, "/llm", &headers).await;
        let remaining = answer
            .header("x-ratelimit-remaining")
            .and_then(|v| v.parse().ok());
        (answer.status, remaining)
    })
}

/// Tokens counted on `acme`'s budget, as Tollgate's `/explain` says.
async fn used(tollgate: &Server) -> u64 {
    let body = r#"{"domain":"gateway","descriptors":[{"entries":[{"key":"tenant","value":"acme"},{"key":"reserved","value":"yes"}]}]}"#;
    let answer = http::post_json(tollgate.http_addr(), "/explain", body).await;
    let explained: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    explained["descriptors"][0]["local"]["limits"][0]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count: {explained}"))
}

/// Sends `n` reservations at once and waits until each is held by the upstream or
/// refused: the refused ones' answers, and the held ones still running.
async fn reserve_many(
    envoy: &Envoy,
    upstream: &Upstream,
    n: usize,
    admitted: usize,
) -> Vec<tokio::task::JoinHandle<(u16, Option<u64>)>> {
    let mut requests: Vec<_> = (0..n).map(|_| reserve(envoy)).collect();
    wait::until_async("reservations decided", SETTLED, async || {
        let refused = requests.iter().filter(|r| r.is_finished()).count();
        match (upstream.held(), refused) {
            (held, refused) if held == admitted && refused == n - admitted => Ok(()),
            other => Err(format!("held and refused: {other:?}")),
        }
    })
    .await;
    let mut held = Vec::new();
    for request in requests.drain(..) {
        if request.is_finished() {
            let (status, remaining) = request.await.expect("a refused request answered");
            assert_eq!((status, remaining), (429, Some(0)));
        } else {
            held.push(request);
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_reserve_their_maximum_and_settle_at_their_usage() {
    let tollgate = Serve::rules(RULES)
        .env("RESPONSE_DYNAMIC_METADATA", "true")
        .start();
    let upstream = Upstream::start().await;
    let envoy = Envoy::start(&render_example(
        ENVOY_YAML,
        upstream.addr,
        tollgate.grpc_addr(),
    ))
    .await;

    // 20 at once, reserving 100 each of 1,000: 10 admitted, 10 refused.
    let admitted = reserve_many(&envoy, &upstream, 20, 10).await;
    assert_eq!(used(&tollgate).await, 1_000, "ten reservations held");
    upstream.let_through(10);
    let mut remaining = BTreeSet::new();
    for request in admitted {
        let (status, left) = request.await.expect("answered");
        assert_eq!(status, 200);
        remaining.insert(left.expect("x-ratelimit-remaining"));
    }
    let moved: BTreeSet<u64> = (0..10).map(|i| i * 100).collect();
    assert_eq!(
        remaining, moved,
        "the remaining header moved with each reservation"
    );

    // Settled at 40 each: 400 used, and room for 6 more reservations.
    wait::until_async("the usage settled", SETTLED, async || {
        match used(&tollgate).await {
            400 => Ok(()),
            other => Err(format!("{other} used")),
        }
    })
    .await;
    let six = reserve_many(&envoy, &upstream, 7, 6).await;
    upstream.let_through(6);
    for request in six {
        assert_eq!(request.await.expect("answered").0, 200);
    }
    wait::until_async("the six settled", SETTLED, async || {
        match used(&tollgate).await {
            640 => Ok(()),
            other => Err(format!("{other} used")),
        }
    })
    .await;
}
