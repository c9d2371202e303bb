//! The example configuration, the stack under test, timed requests, and the
//! `x-ratelimit-*` headers of the example's fixed one-minute `api_key` window.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_testkit::envoy::{Envoy, Params, Upstream, render, upstream};
use tollgate_testkit::http;
use tollgate_testkit::keys::{Shape, redis_key};
use tollgate_testkit::tollgate::Serve;

/// The example Envoy configuration.
pub const EXAMPLE_ENVOY_YAML: &str = include_str!("../../examples/envoy/envoy.yaml");
/// The example rules.
pub const EXAMPLE_RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/envoy/config/rules.yaml"
);
/// `api_key`: requests per fixed minute, named "per-api-key".
pub const KEY_LIMIT: usize = 3;
/// How Envoy lists the `api_key` limit in `x-ratelimit-limit`.
pub const KEY_POLICY: &str = "3;w=60;name=\"per-api-key\"";
/// The length of the example rules' fixed window.
pub const MINUTE: Duration = Duration::from_secs(60);

/// The Redis key of the example's `api_key` counter for `key` (fixed one-minute window).
pub fn api_key_counter(key: &str) -> String {
    redis_key(
        "",
        "edge",
        &[("api_key", key)],
        &[Shape::Fixed { window: MINUTE }],
    )
}

/// Tollgate serving the example rules.
pub fn tollgate() -> Serve {
    Serve::path(Path::new(EXAMPLE_RULES))
}

/// An Envoy on the example configuration in front of `upstream`, asking `ratelimit`.
pub async fn envoy(upstream: &Upstream, ratelimit: SocketAddr, failure_mode_deny: bool) -> Envoy {
    let params = Params {
        upstream: upstream.addr,
        ratelimit,
        failure_mode_deny,
    };
    Envoy::start(&render(EXAMPLE_ENVOY_YAML, &params)).await
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
}

/// The minute of the Unix epoch it is now.
pub fn minute_now() -> u64 {
    unix_now().as_secs() / 60
}

/// One response with the wall-clock times just before and after it.
#[derive(Debug)]
pub struct Timed {
    pub before: Duration,
    pub resp: http::Response,
    pub after: Duration,
    /// The upstream's request count once the response had arrived.
    pub upstream_hits: usize,
}

/// A GET of `path` through `envoy`, with `x-api-key: KEY` if given.
pub async fn timed_get(envoy: &Envoy, upstream: &Upstream, path: &str, key: Option<&str>) -> Timed {
    let headers: Vec<(&str, &str)> = key.map(|k| ("x-api-key", k)).into_iter().collect();
    let before = unix_now();
    let resp = envoy.get(path, &headers).await;
    let after = unix_now();
    Timed {
        before,
        resp,
        after,
        upstream_hits: upstream.hits(),
    }
}

/// Runs `attempt` (given its number, to make fresh keys from) until a run starts and ends
/// in the same wall-clock minute, so that the epoch-aligned one-minute windows of the
/// `api_key` rule cannot reset in the middle of it. A run takes well under a second: a
/// second attempt is rare, a third rarer still.
pub async fn within_one_minute<T>(mut attempt: impl AsyncFnMut(u32) -> T) -> T {
    for n in 0..3 {
        let start = minute_now();
        let out = attempt(n).await;
        if minute_now() == start {
            return out;
        }
        eprintln!("attempt {n} crossed a minute boundary; again with fresh keys");
    }
    panic!("three attempts in a row crossed a minute boundary");
}

/// Two Envoys on `upstream`, asking the rate-limit services at `ratelimit`, take turns on
/// one fresh key (`shared-N`), twice [`KEY_LIMIT`] requests within one minute; the
/// answers must count down one counter ([`assert_key_sequence`]). The key, and how many
/// requests each Envoy admitted.
pub async fn take_turns_on_one_key(
    upstream: &Upstream,
    ratelimit: [SocketAddr; 2],
) -> (String, Vec<usize>) {
    let (e1, e2) = tokio::join!(
        envoy(upstream, ratelimit[0], false),
        envoy(upstream, ratelimit[1], false)
    );
    let envoys = [&e1, &e2];
    let (key, start_hits, responses) = within_one_minute(async |n| {
        let key = format!("shared-{n}");
        let start_hits = upstream.hits();
        let mut out = Vec::new();
        for i in 0..2 * KEY_LIMIT {
            out.push(timed_get(envoys[i % 2], upstream, "/shared", Some(&key)).await);
        }
        (key, start_hits, out)
    })
    .await;
    assert_key_sequence(&responses, start_hits);
    (key, admitted_per_envoy(&responses, 2))
}

/// The `x-ratelimit-reset` a one-minute fixed window may announce for a decision taken
/// between `before` and `after`: the seconds left until the next full minute, rounded
/// down (Envoy sends whole seconds) or up (the reference computes from whole seconds).
/// A Tollgate on a shared store decides on its reckoning of the store's clock, which lags
/// by up to the latency of the answer it learned it from ([`STORE_CLOCK_LAG`]).
pub fn fixed_minute_reset(before: Duration, after: Duration) -> RangeInclusive<u64> {
    let left = |t: Duration| MINUTE.as_nanos() - t.as_nanos() % MINUTE.as_nanos();
    let whole = |ns: u128| u64::try_from(ns).expect("under a minute");
    let latest = (left(before) + STORE_CLOCK_LAG.as_nanos()).min(MINUTE.as_nanos());
    whole(left(after) / 1_000_000_000)..=whole(latest.div_ceil(1_000_000_000))
}

/// The most a Tollgate's reckoning of a store's clock on this host lags behind it: a
/// store call's latency here, generously.
const STORE_CLOCK_LAG: Duration = Duration::from_millis(10);

/// The draft-03 headers Envoy builds from Tollgate's statuses: the tightest limit first,
/// then every matched limit as `N;w=SECONDS[;name="NAME"]`; the tightest remaining; its
/// reset.
pub fn assert_ratelimit_headers(
    t: &Timed,
    limit: usize,
    policy: &str,
    remaining: usize,
    reset: RangeInclusive<u64>,
) {
    let header = t
        .resp
        .header("x-ratelimit-limit")
        .unwrap_or_else(|| panic!("no x-ratelimit-limit: {t:#?}"));
    let mut parts = header.split(", ");
    assert_eq!(
        parts.next(),
        Some(limit.to_string().as_str()),
        "x-ratelimit-limit starts with the tightest limit: {t:#?}"
    );
    assert!(
        parts.any(|p| p == policy),
        "x-ratelimit-limit lists the quota policy `{policy}`: {t:#?}"
    );
    assert_eq!(
        t.resp.header_u64("x-ratelimit-remaining"),
        remaining as u64,
        "x-ratelimit-remaining: {t:#?}"
    );
    let got = t.resp.header_u64("x-ratelimit-reset");
    assert!(
        reset.contains(&got),
        "x-ratelimit-reset {got} not in {reset:?}: {t:#?}"
    );
}

/// The `api_key` rule's headers: its limit first, its policy listed, `remaining` left, a
/// reset within the current minute.
pub fn assert_key_headers(t: &Timed, remaining: usize) {
    let reset = fixed_minute_reset(t.before, t.after);
    assert_ratelimit_headers(t, KEY_LIMIT, KEY_POLICY, remaining, reset);
}

/// Admitted: the upstream answered, and had seen `upstream_hits` requests by then.
pub fn assert_admitted(t: &Timed, upstream_hits: usize) {
    assert_eq!(t.resp.status, 200, "expected 200 from the upstream: {t:#?}");
    assert_eq!(t.resp.body, upstream::BODY, "{t:#?}");
    assert_eq!(
        t.upstream_hits, upstream_hits,
        "the upstream should have seen {upstream_hits} requests: {t:#?}"
    );
}

/// Limited: Envoy's own 429, and the upstream saw nothing more than `upstream_hits`.
pub fn assert_limited(t: &Timed, upstream_hits: usize) {
    assert_eq!(t.resp.status, 429, "expected 429 from Envoy: {t:#?}");
    assert_eq!(
        t.resp.header("x-envoy-ratelimited"),
        Some("true"),
        "Envoy marks its own 429: {t:#?}"
    );
    assert_eq!(
        t.upstream_hits, upstream_hits,
        "a limited request must not reach the upstream: {t:#?}"
    );
}

/// The first `KEY_LIMIT` responses admitted and the rest refused, one counter between
/// them, the upstream having seen `start_hits` requests before; each with its headers.
pub fn assert_key_sequence(responses: &[Timed], start_hits: usize) {
    for (i, t) in responses.iter().enumerate() {
        if i < KEY_LIMIT {
            assert_admitted(t, start_hits + i + 1);
            assert_key_headers(t, KEY_LIMIT - 1 - i);
        } else {
            assert_limited(t, start_hits + KEY_LIMIT);
            assert_key_headers(t, 0);
        }
    }
}

/// How many requests each of `n` Envoys, used in turn, had admitted.
fn admitted_per_envoy(responses: &[Timed], n: usize) -> Vec<usize> {
    (0..n)
        .map(|e| {
            responses
                .iter()
                .skip(e)
                .step_by(n)
                .filter(|t| t.resp.status == 200)
                .count()
        })
        .collect()
}

/// Envoy's statistic `cluster.CLUSTER.NAME`, as its admin interface says.
pub async fn cluster_stat(envoy: &Envoy, cluster: &str, name: &str) -> u64 {
    let full = format!("cluster.{cluster}.{name}");
    let stats = http::get(envoy.admin, &format!("/stats?filter={full}")).await;
    stats
        .body
        .lines()
        .find_map(|line| line.strip_prefix(&full)?.strip_prefix(": "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {full} in {stats:?}"))
}
