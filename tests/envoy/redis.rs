//! Envoy in front of Tollgates that keep their counters in a real redis-server:
//! - two Tollgates sharing one Redis, each behind its own Envoy, enforce one limit;
//! - with Redis stopped, each `--on-store-error` mode does what docs/STORES.md says, as Envoy
//!   shows it: `allow` → 200, `deny` → 429, `error` → gRPC UNAVAILABLE, so that Envoy's
//!   `failure_mode_deny` decides (200 or 500), `local` → the local view still limits;
//! - once Redis is back (restarted empty on the same port), limiting through Envoy is
//!   exact again within [`RECOVERY`].
//!
//! Every mode check uses a fresh key: a counter that an instance's local view already
//! knows to be full is denied whatever the mode (only requests that need Redis get the
//! `--on-store-error` decision).

use std::time::{Duration, SystemTime};

use tollgate_testkit::envoy::{Envoy, Upstream};
use tollgate_testkit::grpc::request;
use tollgate_testkit::process::blocking;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::wait::{self, room_in_window};

use crate::support::{
    KEY_LIMIT, MINUTE, api_key_counter, assert_admitted, assert_key_headers, assert_key_sequence,
    assert_limited, envoy, minute_now, take_turns_on_one_key, timed_get, tollgate,
    within_one_minute,
};

/// How long limiting through Envoy may take to be exact again once Redis answers
/// after a restart.
const RECOVERY: Duration = Duration::from_secs(5);

/// Tollgate serving the example rules with its counters in `redis`, with
/// `--on-store-error MODE` if given (else the default); ready once its store is connected.
/// A stopped Redis refuses connections at once, so a store timeout long enough for a
/// loaded machine changes nothing in the outage checks.
async fn start_tollgate(redis: &RedisServer, mode: Option<&str>) -> Server {
    let mut serve = tollgate()
        .redis("single", &redis.url())
        .args(["--store-timeout", "1s"]);
    if let Some(mode) = mode {
        serve = serve.args(["--on-store-error", mode]);
    }
    serve.start_connected().await
}

/// `KEY_LIMIT` admissions, then two 429s.
fn exact() -> Vec<u16> {
    let mut want = vec![200; KEY_LIMIT];
    want.extend([429, 429]);
    want
}

/// Polls, with a fresh key `PREFIX-ROUND` each round, until a round of `KEY_LIMIT + 2`
/// requests through `envoys` (in turn) gives 200 × 3 and then 429, with exactly 3 reaching
/// the upstream, within one minute. With two Tollgates behind the Envoys only a working
/// shared store gives that; with one, only a working store in a mode that does not decide
/// alone. Returns the last key.
async fn await_exact_limiting(envoys: &[&Envoy], upstream: &Upstream, prefix: &str) -> String {
    let what = format!("exact limiting through {} Envoy(s)", envoys.len());
    let mut round = 0;
    let (key, took) = wait::until_async(&what, RECOVERY, async || {
        round += 1;
        let key = format!("{prefix}-{round}");
        let (minute, hits) = (minute_now(), upstream.hits());
        let mut statuses = Vec::new();
        for i in 0..KEY_LIMIT + 2 {
            let t = timed_get(envoys[i % envoys.len()], upstream, "/probe", Some(&key)).await;
            statuses.push(t.resp.status);
        }
        let reached = upstream.hits() - hits;
        if statuses == exact() && reached == KEY_LIMIT && minute_now() == minute {
            Ok(key)
        } else {
            Err(format!(
                "x-api-key {key}: {statuses:?}, {reached} reached the upstream"
            ))
        }
    })
    .await;
    eprintln!("{prefix}: exact after {took:?}, {round} rounds");
    key
}

/// Restarts Redis (empty) on its port, then waits until limiting through `envoys` is
/// exact again, with the probe's counter in the restarted Redis.
async fn restart_and_await_exact(
    redis: &mut RedisServer,
    envoys: &[&Envoy],
    upstream: &Upstream,
    what: &str,
) {
    blocking(|| redis.launch());
    let key = await_exact_limiting(envoys, upstream, &format!("{what}-after")).await;
    let counter = api_key_counter(&key);
    assert!(
        blocking(|| redis.exists(&counter)),
        "{what}: the probe's counter {counter} must be in the restarted Redis"
    );
}

/// Two Envoys, each asking its own Tollgate, both Tollgates on one Redis: requests
/// alternating between the Envoys are admitted exactly up to the limit in total (each
/// Tollgate alone would admit the limit: six alternating requests would all pass), and
/// the remaining count falls across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_sharing_redis_enforce_one_limit() {
    let redis = blocking(RedisServer::start);
    let upstream = Upstream::start().await;
    let (t1, t2) = tokio::join!(start_tollgate(&redis, None), start_tollgate(&redis, None));
    let (key, per_envoy) = take_turns_on_one_key(&upstream, [t1.grpc_addr(), t2.grpc_addr()]).await;
    assert!(
        per_envoy.iter().all(|n| *n > 0),
        "both Envoys (so both Tollgates) admitted some: {per_envoy:?}"
    );
    // The one counter both used is in Redis.
    let counter = api_key_counter(&key);
    assert!(
        blocking(|| redis.exists(&counter)),
        "the shared counter {counter} is in Redis"
    );
}

/// `allow`: with Redis down a fresh key is let through every time, past its limit, since
/// no request can be counted; a key this Tollgate already knows to be full is still
/// refused. After Redis is back limiting is exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_allow_lets_fresh_keys_through() {
    let mut redis = blocking(RedisServer::start);
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("allow")).await;
    let envoy = envoy(&upstream, tollgate.grpc_addr(), false).await;

    // The full key must still be in its fixed minute when it is asked again: start with
    // room for the whole sequence (a few seconds at most) left in the minute.
    let minute_ends = room_in_window(MINUTE, Duration::from_secs(15)).await;
    // Redis is in use: exact limiting, and the last key is full in this Tollgate's view.
    let full = await_exact_limiting(&[&envoy], &upstream, "allow-before").await;

    blocking(|| redis.stop());

    let hits = upstream.hits();
    let t = timed_get(&envoy, &upstream, "/known", Some(&full)).await;
    assert!(
        SystemTime::now() < minute_ends,
        "filling the key and asking again took longer than 15 s"
    );
    assert_limited(&t, hits);

    for _ in 0..KEY_LIMIT + 2 {
        let hits = upstream.hits();
        let t = timed_get(&envoy, &upstream, "/down", Some("allow-down")).await;
        assert_admitted(&t, hits + 1);
    }

    restart_and_await_exact(&mut redis, &[&envoy], &upstream, "allow").await;
}

/// `deny`: with Redis down every request that needs Redis is refused: Envoy answers 429
/// for a fresh key, and for a request with no key at all (its per-address limit needs
/// Redis too). After Redis is back limiting is exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_deny_answers_429() {
    let mut redis = blocking(RedisServer::start);
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("deny")).await;
    let envoy = envoy(&upstream, tollgate.grpc_addr(), false).await;
    await_exact_limiting(&[&envoy], &upstream, "deny-before").await;

    blocking(|| redis.stop());

    let hits = upstream.hits();
    for i in 0..2 {
        let t = timed_get(&envoy, &upstream, "/down", Some(&format!("deny-down-{i}"))).await;
        assert_limited(&t, hits);
    }
    let t = timed_get(&envoy, &upstream, "/no-key", None).await;
    assert_limited(&t, hits);

    restart_and_await_exact(&mut redis, &[&envoy], &upstream, "deny").await;
}

/// `error`: with Redis down Tollgate answers gRPC UNAVAILABLE, so Envoy's
/// `failure_mode_deny` decides: `false` lets the request through to the upstream (without
/// rate-limit headers: no service answered), `true` answers 500 and the upstream sees
/// nothing. After Redis is back limiting is exact again, through both Envoys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_error_leaves_it_to_failure_mode_deny() {
    let mut redis = blocking(RedisServer::start);
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("error")).await;
    let (open, closed) = tokio::join!(
        envoy(&upstream, tollgate.grpc_addr(), false),
        envoy(&upstream, tollgate.grpc_addr(), true)
    );
    await_exact_limiting(&[&open, &closed], &upstream, "error-before").await;

    blocking(|| redis.stop());

    // What Envoy is told: UNAVAILABLE.
    let mut rls = tollgate.client().await;
    let answer = rls
        .call(request("edge", &[&[("api_key", "error-grpc")]]))
        .await;
    let status = answer.expect_err("no answer with Redis down and --on-store-error error");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    for i in 0..2 {
        let hits = upstream.hits();
        let t = timed_get(&open, &upstream, "/open", Some(&format!("error-open-{i}"))).await;
        assert_admitted(&t, hits + 1);
        assert_eq!(t.resp.header("x-ratelimit-limit"), None, "{t:#?}");
    }
    for i in 0..2 {
        let hits = upstream.hits();
        let key = format!("error-closed-{i}");
        let t = timed_get(&closed, &upstream, "/closed", Some(&key)).await;
        assert_eq!(t.resp.status, 500, "failure_mode_deny: true: {t:#?}");
        assert_eq!(
            t.upstream_hits, hits,
            "a refused request must not reach the upstream: {t:#?}"
        );
    }

    restart_and_await_exact(&mut redis, &[&open, &closed], &upstream, "error").await;
}

/// `local` (the default): with Redis down each Tollgate decides from its own local view,
/// as the memory store would: through one Envoy a fresh key gets its 3 requests and the
/// 4th is refused; the other Tollgate, which has not seen the key, still admits it
/// (nothing is shared while Redis is down). After Redis is back, limiting across both
/// Tollgates is exact again — which local decisions alone would not give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_local_still_limits_locally() {
    let mut redis = blocking(RedisServer::start);
    let upstream = Upstream::start().await;
    let (ta, tb) = tokio::join!(
        start_tollgate(&redis, Some("local")),
        start_tollgate(&redis, Some("local"))
    );
    let (ea, eb) = tokio::join!(
        envoy(&upstream, ta.grpc_addr(), false),
        envoy(&upstream, tb.grpc_addr(), false)
    );
    await_exact_limiting(&[&ea, &eb], &upstream, "local-before").await;

    blocking(|| redis.stop());

    let (start_hits, through_a, through_b) = within_one_minute(async |n| {
        let key = format!("local-down-{n}");
        let start_hits = upstream.hits();
        let mut through_a = Vec::new();
        for _ in 0..=KEY_LIMIT {
            through_a.push(timed_get(&ea, &upstream, "/down", Some(&key)).await);
        }
        let through_b = timed_get(&eb, &upstream, "/down", Some(&key)).await;
        (start_hits, through_a, through_b)
    })
    .await;
    assert_key_sequence(&through_a, start_hits);
    assert_admitted(&through_b, start_hits + KEY_LIMIT + 1);
    assert_key_headers(&through_b, KEY_LIMIT - 1);

    restart_and_await_exact(&mut redis, &[&ea, &eb], &upstream, "local").await;
}
