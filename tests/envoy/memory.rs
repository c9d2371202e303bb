//! Envoy in front of one Tollgate on the memory store: the example's limits (`api_key` 3
//! per fixed minute, `path=/login` 5 per sliding minute, `path=/static/*` unlimited),
//! shared between two Envoys, Envoy's `failure_mode_deny` with Tollgate gone, and its
//! connection to a Tollgate that stalled.

use std::time::Duration;

use futures_util::future::join_all;
use tollgate_testkit::envoy::{self, Envoy, Upstream};
use tollgate_testkit::http;
use tollgate_testkit::process::Signal;
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::wait;

use crate::support::{
    EXAMPLE_ENVOY_YAML, KEY_LIMIT, assert_admitted, assert_key_headers, assert_key_sequence,
    assert_limited, assert_ratelimit_headers, cluster_stat, envoy, take_turns_on_one_key,
    timed_get, tollgate, within_one_minute,
};

/// Long enough for Envoy to reach a Tollgate that runs again on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(30);

/// `path=/login`: requests per sliding minute.
const LOGIN_LIMIT: usize = 5;

/// An upstream, a Tollgate and one Envoy (`failure_mode_deny: false`).
struct Stack {
    upstream: Upstream,
    /// Kept running for as long as the stack lives.
    _tollgate: Server,
    envoy: Envoy,
}

impl Stack {
    async fn start() -> Self {
        let upstream = Upstream::start().await;
        let tollgate = tollgate().start();
        let envoy = envoy(&upstream, tollgate.grpc_addr(), false).await;
        Self {
            upstream,
            _tollgate: tollgate,
            envoy,
        }
    }
}

/// The example envoy.yaml, exactly as docker-compose runs it, is a valid Envoy
/// configuration.
#[test]
fn example_envoy_yaml_is_valid_as_is() {
    let (ok, output) = envoy::validate(EXAMPLE_ENVOY_YAML);
    assert!(
        ok,
        "envoy --mode validate rejected examples/envoy/envoy.yaml:\n{output}"
    );
}

/// Under the limit requests reach the upstream; over it Envoy answers 429 and the
/// upstream sees nothing; both carry headers that agree with the rule (3 per minute,
/// fixed window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_limit_admits_then_429_with_matching_headers() {
    let s = Stack::start().await;
    let (start_hits, responses) = within_one_minute(async |n| {
        let key = format!("alice-{n}");
        let start_hits = s.upstream.hits();
        let mut out = Vec::new();
        for _ in 0..KEY_LIMIT + 2 {
            out.push(timed_get(&s.envoy, &s.upstream, "/orders", Some(&key)).await);
        }
        (start_hits, out)
    })
    .await;
    assert_key_sequence(&responses, start_hits);
}

/// The default algorithm (sliding window) through Envoy: 5 per minute on /login, then 429
/// until the counted hits age out of the window; an unlimited path is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_window_limit_on_a_path() {
    let s = Stack::start().await;
    let policy = "5;w=60";
    for i in 0..LOGIN_LIMIT {
        let t = timed_get(&s.envoy, &s.upstream, "/login", None).await;
        assert_admitted(&t, i + 1);
        // For admitted hits the reset is when they are forgotten: at most a window plus
        // one sub-window (window / 10 by default).
        assert_ratelimit_headers(&t, LOGIN_LIMIT, policy, LOGIN_LIMIT - 1 - i, 1..=66);
    }
    for _ in 0..2 {
        let t = timed_get(&s.envoy, &s.upstream, "/login", None).await;
        assert_limited(&t, LOGIN_LIMIT);
        // Over the limit the reset is when the same request would be admitted: the five
        // hits were taken within a second, so that is about a window away, never more
        // than a window plus a sub-window.
        assert_ratelimit_headers(&t, LOGIN_LIMIT, policy, 0, 45..=66);
    }

    // /static/* is unlimited by path: only the per-address and per-listener limits (100
    // and 1000 per second) apply, far from exhausted here.
    for i in 0..LOGIN_LIMIT + 2 {
        let t = timed_get(&s.envoy, &s.upstream, &format!("/static/{i}.css"), None).await;
        assert_admitted(&t, LOGIN_LIMIT + i + 1);
        let limit = t.resp.header("x-ratelimit-limit").unwrap_or_default();
        assert!(
            !limit.contains(";w=60"),
            "no per-minute limit should apply to /static/*: {t:#?}"
        );
    }
}

/// Limits are per descriptor value: key A over its limit does not affect key B, nor
/// requests without a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_limited_independently() {
    let s = Stack::start().await;
    let (start_hits, a, b, none) = within_one_minute(async |n| {
        let (key_a, key_b) = (format!("a-{n}"), format!("b-{n}"));
        let start_hits = s.upstream.hits();
        let mut a = Vec::new();
        for _ in 0..=KEY_LIMIT {
            a.push(timed_get(&s.envoy, &s.upstream, "/items", Some(&key_a)).await);
        }
        let b = timed_get(&s.envoy, &s.upstream, "/items", Some(&key_b)).await;
        let none = timed_get(&s.envoy, &s.upstream, "/items", None).await;
        (start_hits, a, b, none)
    })
    .await;

    assert_key_sequence(&a, start_hits);
    assert_admitted(&b, start_hits + KEY_LIMIT + 1);
    assert_key_headers(&b, KEY_LIMIT - 1);
    assert_admitted(&none, start_hits + KEY_LIMIT + 2);
    let limit = none.resp.header("x-ratelimit-limit").unwrap_or_default();
    assert!(
        !limit.contains("per-api-key"),
        "without x-api-key there is no api_key descriptor: {none:#?}"
    );
}

/// Two Envoys asking one Tollgate enforce one limit between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_one_limit() {
    let upstream = Upstream::start().await;
    let tollgate = tollgate().start();
    // The remaining count falls across both proxies: one counter.
    let (_, per_envoy) = take_turns_on_one_key(&upstream, [tollgate.grpc_addr(); 2]).await;
    assert!(
        per_envoy.iter().all(|n| *n > 0),
        "both Envoys admitted some: {per_envoy:?}"
    );
}

/// With Tollgate gone, `failure_mode_deny: false` lets traffic through and
/// `failure_mode_deny: true` refuses it with 500 (Envoy's default `status_on_error`)
/// without reaching the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_down_fails_open_or_closed_as_configured() {
    let upstream = Upstream::start().await;
    let tollgate = tollgate().start();
    let (open, closed) = tokio::join!(
        envoy(&upstream, tollgate.grpc_addr(), false),
        envoy(&upstream, tollgate.grpc_addr(), true)
    );

    // Both consult Tollgate while it is up: one counter between them, exact.
    let (key, start_hits, responses) = within_one_minute(async |n| {
        let key = format!("k-{n}");
        let start_hits = upstream.hits();
        let mut out = Vec::new();
        for i in 0..=KEY_LIMIT {
            let envoy = if i % 2 == 0 { &open } else { &closed };
            out.push(timed_get(envoy, &upstream, "/before", Some(&key)).await);
        }
        (key, start_hits, out)
    })
    .await;
    assert_key_sequence(&responses, start_hits);

    let finished = tokio::task::spawn_blocking(move || tollgate.stop())
        .await
        .expect("stop tollgate");
    assert_eq!(
        finished.status.code(),
        None,
        "tollgate was killed by a signal: {finished:?}"
    );

    // Fail open: through to the upstream, even for the exhausted key, and without
    // rate-limit headers since no service answered.
    for path in ["/open-1", "/open-2"] {
        let hits = upstream.hits();
        let t = timed_get(&open, &upstream, path, Some(&key)).await;
        assert_admitted(&t, hits + 1);
        assert_eq!(t.resp.header("x-ratelimit-limit"), None, "{t:#?}");
    }

    // Fail closed: Envoy answers 500 itself.
    for path in ["/closed-1", "/closed-2"] {
        let hits = upstream.hits();
        let t = timed_get(&closed, &upstream, path, Some("fresh")).await;
        assert_eq!(t.resp.status, 500, "failure_mode_deny: true: {t:#?}");
        assert_eq!(
            t.upstream_hits, hits,
            "a refused request must not reach the upstream: {t:#?}"
        );
    }
}

/// The rules can come over xDS instead of files: a management server pushes the example's
/// `/login` and `/static/*` rules (domain `edge`), and Envoy enforces them through
/// Tollgate as it does with the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_pushed_over_xds_are_enforced_through_envoy() {
    use envoy_types::pb::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
    use tollgate_testkit::tollgate::{Serve, serve_from_env};
    use tollgate_testkit::xds::{XdsServer, resource};

    let path = |value: &str, rate_limit| RateLimitDescriptor {
        key: "path".into(),
        value: value.into(),
        rate_limit: Some(rate_limit),
        ..Default::default()
    };
    let login = RateLimitPolicy {
        unit: RateLimitUnit::Minute as i32,
        requests_per_unit: LOGIN_LIMIT as u32,
        ..Default::default()
    };
    let unlimited = RateLimitPolicy {
        unlimited: true,
        ..Default::default()
    };
    let xds = XdsServer::start().await;
    xds.set(
        "default",
        "1",
        vec![resource(RateLimitConfig {
            name: "edge".into(),
            domain: "edge".into(),
            descriptors: vec![path("/login", login), path("/static/*", unlimited)],
        })],
    );
    let mut cmd = serve_from_env();
    cmd.envs(xds.client_env("default"));
    // The readiness line waits for the first push: start off the async workers.
    let tollgate = tokio::task::spawn_blocking(move || Serve::custom(cmd).start())
        .await
        .expect("start tollgate");
    xds.wait_ack("default", "1").await;
    let upstream = Upstream::start().await;
    let envoy = envoy(&upstream, tollgate.grpc_addr(), false).await;

    for i in 0..LOGIN_LIMIT {
        let t = timed_get(&envoy, &upstream, "/login", None).await;
        assert_admitted(&t, i + 1);
        assert_ratelimit_headers(&t, LOGIN_LIMIT, "5;w=60", LOGIN_LIMIT - 1 - i, 1..=66);
    }
    let t = timed_get(&envoy, &upstream, "/login", None).await;
    assert_limited(&t, LOGIN_LIMIT);
    for i in 0..LOGIN_LIMIT + 2 {
        let t = timed_get(&envoy, &upstream, &format!("/static/{i}.css"), None).await;
        assert_admitted(&t, LOGIN_LIMIT + i + 1);
        assert_eq!(
            t.resp.header("x-ratelimit-limit"),
            None,
            "nothing limits /static/*: {t:#?}"
        );
    }
}

/// A Tollgate that stalls (paused here; CPU-throttled in a pod) for longer than Envoy's
/// rate-limit timeout: Envoy lets each request through without an answer
/// (`failure_mode_deny: false`) and cancels its call, and the calls reach Tollgate with
/// their cancellations when it runs again. Envoy's connection to Tollgate stays up: no
/// GOAWAY, no connection closed by Tollgate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_envoy_cancelled_while_tollgate_stalled_leave_its_connection_up() {
    const CALLS: usize = 100;
    let upstream = Upstream::start().await;
    let mut tollgate = tollgate().start();
    let envoy = envoy(&upstream, tollgate.grpc_addr(), false).await;
    let answered = |resp: &http::Response| resp.header("x-ratelimit-limit").is_some();
    let first = envoy.get("/orders", &[("x-api-key", "stall-0")]).await;
    assert!(answered(&first), "{first:#?}");

    tollgate.signal(Signal::Stop);
    let let_through = join_all((1..=CALLS).map(|i| {
        let key = format!("stall-{i}");
        let envoy = &envoy;
        async move { envoy.get("/orders", &[("x-api-key", &key)]).await }
    }))
    .await;
    for resp in &let_through {
        assert_eq!(resp.status, 200, "{resp:#?}");
        assert!(!answered(resp), "answered while stopped: {resp:#?}");
    }
    tollgate.signal(Signal::Cont);

    wait::until_async(
        "Tollgate answering through Envoy again",
        DEADLINE,
        async || {
            let resp = envoy.get("/orders", &[("x-api-key", "stall-after")]).await;
            answered(&resp).then_some(()).ok_or(format!("{resp:?}"))
        },
    )
    .await;
    let goaways = cluster_stat(&envoy, "ratelimit", "upstream_cx_close_notify").await;
    let closed = cluster_stat(&envoy, "ratelimit", "upstream_cx_destroy_remote").await;
    assert_eq!(
        (goaways, closed),
        (0, 0),
        "GOAWAYs Envoy heard, connections Tollgate closed"
    );
}
