//! In-flight limits through a real Envoy (`examples/envoy/in-flight/`): a slot taken at
//! request time, released when the stream ends, and the slots of an Envoy killed with
//! requests in flight freeing themselves after `expire_after`. The upstream holds the
//! requests the test asks it to (a slow model) until it lets them through.

use std::time::{Duration, Instant};

use tollgate_testkit::envoy::{Envoy, Upstream, render_example, upstream};
use tollgate_testkit::http;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait;

const ENVOY_YAML: &str = include_str!("../../examples/envoy/in-flight/envoy.yaml");
const RULES: &str = include_str!("../../examples/envoy/in-flight/rules.yaml");

/// How long the release sent at stream end (fire and forget) may take to arrive.
const RELEASED: Duration = Duration::from_secs(10);

/// Tollgate on the example's rules, returning the dynamic metadata the releases need.
fn tollgate() -> Server {
    Serve::rules(RULES)
        .env("RESPONSE_DYNAMIC_METADATA", "true")
        .start()
}

async fn envoy(upstream: &Upstream, tollgate: &Server) -> Envoy {
    Envoy::start(&render_example(
        ENVOY_YAML,
        upstream.addr,
        tollgate.grpc_addr(),
    ))
    .await
}

/// A request of `user` on `path`, held by the upstream until let through.
fn slow(envoy: &Envoy, path: &'static str, user: &'static str) -> tokio::task::JoinHandle<u16> {
    let listener = envoy.listener;
    tokio::spawn(async move {
        let headers = [("x-user", user), (upstream::HOLD, "1")];
        http::get_with(listener, path, &headers).await.status
    })
}

/// Waits until the upstream holds `n` requests.
async fn await_held(upstream: &Upstream, n: usize) {
    wait::until_async(
        &format!("{n} requests held"),
        RELEASED,
        async || match upstream.held() {
            held if held == n => Ok(()),
            held => Err(format!("{held} held")),
        },
    )
    .await;
}

/// Waits until `ann` holds `n` slots.
async fn await_slots(tollgate: &Server, user_key: &str, user: &str, n: u64) {
    wait::until_async(
        &format!("{user} holds {n}"),
        RELEASED,
        async || match slots_held(tollgate, user_key, user).await {
            held if held == n => Ok(()),
            held => Err(format!("{held} held")),
        },
    )
    .await;
}

/// The slots `user` holds, as Tollgate's `/explain` says.
async fn slots_held(tollgate: &Server, user_key: &str, user: &str) -> u64 {
    let body = format!(
        r#"{{"domain":"gateway","descriptors":[{{"entries":[{{"key":"{user_key}","value":"{user}"}},{{"key":"slot","value":"held"}}]}}]}}"#
    );
    let answer = http::post_json(tollgate.http_addr(), "/explain", &body).await;
    let explained: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    explained["descriptors"][0]["local"]["limits"][0]["slotsHeld"]
        .as_u64()
        .unwrap_or_else(|| panic!("no slotsHeld: {explained}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_third_concurrent_request_is_refused_until_one_completes() {
    let tollgate = tollgate();
    let upstream = Upstream::start().await;
    let envoy = envoy(&upstream, &tollgate).await;
    let (first, second) = (slow(&envoy, "/", "ann"), slow(&envoy, "/", "ann"));
    await_held(&upstream, 2).await;
    let ann = [("x-user", "ann")];
    for _ in 0..3 {
        let third = envoy.get("/", &ann).await;
        assert_eq!(third.status, 429, "two in flight: {third:?}");
    }
    assert_eq!(
        envoy.get("/", &[("x-user", "bob")]).await.status,
        200,
        "per user"
    );
    await_slots(&tollgate, "user", "bob", 0).await;
    assert_eq!(
        slots_held(&tollgate, "user", "ann").await,
        2,
        "the refused requests released nothing"
    );

    // One completes: its slot is released, and the next request is admitted.
    upstream.let_through(1);
    await_held(&upstream, 1).await;
    await_slots(&tollgate, "user", "ann", 1).await;
    let next = slow(&envoy, "/", "ann");
    await_held(&upstream, 2).await;
    assert_eq!(
        envoy.get("/", &ann).await.status,
        429,
        "two in flight again"
    );
    upstream.let_through(2);
    for request in [first, second, next] {
        assert_eq!(request.await.ok(), Some(200));
    }
    await_slots(&tollgate, "user", "ann", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_killed_with_requests_in_flight_leaves_slots_that_free_themselves() {
    let tollgate = tollgate();
    let upstream = Upstream::start().await;
    let killed = envoy(&upstream, &tollgate).await;
    let taken = Instant::now();
    let _in_flight = (
        slow(&killed, "/brief", "ann"),
        slow(&killed, "/brief", "ann"),
    );
    await_held(&upstream, 2).await;
    drop(killed);
    let envoy = envoy(&upstream, &tollgate).await;
    let ann = [("x-user", "ann")];
    assert_eq!(
        envoy.get("/brief", &ann).await.status,
        429,
        "the slots leaked"
    );
    wait::until_async(
        "the leaked slots freed",
        Duration::from_secs(20),
        async || match envoy.get("/brief", &ann).await.status {
            200 => Ok(()),
            status => Err(format!("{status}")),
        },
    )
    .await;
    let freed_after = taken.elapsed();
    assert!(
        freed_after >= Duration::from_millis(1_800),
        "freed after {freed_after:?}, before expire_after (2 s)"
    );
}
