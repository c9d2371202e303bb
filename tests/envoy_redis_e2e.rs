//! End to end through a real Envoy with Tollgate's Redis store: client → Envoy
//! (HTTP rate-limit filter) → upstream, Envoy asking a Tollgate that keeps its
//! counters in a real `redis-server` on a free loopback port.
//!
//! - Two Tollgates sharing one Redis, each behind its own Envoy, enforce one
//!   limit between them.
//! - With Redis stopped, each `--on-store-error` mode does what the README
//!   says, as Envoy shows it: `allow` → 200, `deny` → 429, `error` → gRPC
//!   UNAVAILABLE, so Envoy's `failure_mode_deny` decides (200 or 500), `local`
//!   → the local view still enforces the limit.
//! - Once Redis is back (restarted empty on the same port), limiting through
//!   Envoy is exact again within [`RECOVERY`].
//!
//! As in `tests/envoy_e2e.rs`, Envoy runs `examples/envoy/envoy.yaml` and
//! Tollgate serves `examples/envoy/config/rules.yaml`; the `api_key` rule
//! allows 3 requests per minute in epoch-aligned fixed windows. Every mode
//! check uses a fresh key: a counter that an instance's local view already
//! knows to be full is denied whatever the mode (only requests that need Redis
//! get the `--on-store-error` decision).
//!
//! Needs Envoy (see `tests/support/envoy.rs`) and `redis-server`
//! (`scripts/install-test-deps.sh` installs both). Without them these tests
//! fail; they do not skip.

mod common;
#[path = "support/envoy.rs"]
mod envoy;
mod redis_harness;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, request, serve_command};
use envoy::{
    EXAMPLE_RULES, Envoy, EnvoyParams, KEY_POLICY, Timed, Upstream, assert_admitted,
    assert_limited, assert_ratelimit_headers, fixed_minute_reset, minute_now, timed_get,
    within_one_minute,
};
use redis_harness::{POLL, RedisServer, await_store_health};

/// `api_key`: requests per fixed minute, named "per-api-key".
const KEY_LIMIT: usize = 3;
/// How long limiting through Envoy may take to be exact again once Redis
/// answers PING after a restart.
const RECOVERY: Duration = Duration::from_secs(5);
/// How long a Tollgate may take to report its store connected after start.
const CONNECT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------

/// Runs a blocking harness call (process start, Redis stop/restart) without
/// stalling the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn start_redis() -> RedisServer {
    blocking(RedisServer::start)
}

/// Tollgate serving the example rules with its counters in `redis`, with
/// `--on-store-error MODE` if given (else the default); returns once its store
/// reports connected.
async fn start_tollgate(redis: &RedisServer, mode: Option<&str>) -> Server {
    let url = redis.url();
    let mut cmd = serve_command(Path::new(EXAMPLE_RULES));
    cmd.args(["--backend", "redis", "--redis-url", &url]);
    if let Some(mode) = mode {
        cmd.args(["--on-store-error", mode]);
    }
    let server = blocking(|| Server::spawn(cmd).unwrap_or_else(|exit| exit.fail()));
    await_store_health(server.http_addr(), 200, CONNECT).await;
    server
}

async fn start_envoy(upstream: &Upstream, tollgate: &Server, failure_mode_deny: bool) -> Envoy {
    Envoy::start(&EnvoyParams {
        upstream: upstream.addr,
        ratelimit: tollgate.grpc_addr(),
        failure_mode_deny,
    })
    .await
}

// ---------------------------------------------------------------------------
// Requests, fixed windows and the wall clock
// ---------------------------------------------------------------------------

/// Sends `KEY_LIMIT + 2` requests for `key`, round-robin over `envoys`, and
/// returns the statuses, how many reached the upstream, and whether the run
/// stayed within one minute.
async fn probe_round(envoys: &[&Envoy], upstream: &Upstream, key: &str) -> (Vec<u16>, usize, bool) {
    let minute = minute_now();
    let hits = upstream.hits();
    let mut statuses = Vec::new();
    for i in 0..KEY_LIMIT + 2 {
        let t = timed_get(envoys[i % envoys.len()], upstream, "/probe", Some(key)).await;
        statuses.push(t.resp.status);
    }
    (statuses, upstream.hits() - hits, minute_now() == minute)
}

/// `KEY_LIMIT` admissions, then two 429s.
fn exact() -> Vec<u16> {
    let mut want = vec![200; KEY_LIMIT];
    want.extend([429, 429]);
    want
}

/// Polls, with a fresh key `PREFIX-ROUND` each round, until a round through
/// `envoys` (round-robin) admits exactly the limit — 200 × 3, then 429, with
/// exactly 3 requests reaching the upstream — within one minute. With two
/// Tollgates behind the Envoys only a working shared store gives that; with
/// one, only a working store in a mode that does not decide alone. Returns
/// the time it took, the rounds and the last key; panics after `timeout`.
async fn await_exact_limiting(
    envoys: &[&Envoy],
    upstream: &Upstream,
    prefix: &str,
    timeout: Duration,
) -> (Duration, usize, String) {
    let start = Instant::now();
    let mut round = 0;
    loop {
        round += 1;
        let key = format!("{prefix}-{round}");
        let (got, reached, one_minute) = probe_round(envoys, upstream, &key).await;
        if got == exact() && reached == KEY_LIMIT && one_minute {
            return (start.elapsed(), round, key);
        }
        assert!(
            start.elapsed() < timeout,
            "limiting through {} Envoy(s) not exact within {timeout:?} ({round} rounds); \
             last round (x-api-key: {key}): {got:?}, {reached} reached the upstream",
            envoys.len()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Restarts Redis (empty) on its port, then waits until limiting through
/// `envoys` is exact again.
async fn restart_and_await_exact(
    redis: &mut RedisServer,
    envoys: &[&Envoy],
    upstream: &Upstream,
    what: &str,
) {
    blocking(|| redis.launch());
    let (took, rounds, key) =
        await_exact_limiting(envoys, upstream, &format!("{what}-after"), RECOVERY).await;
    eprintln!("{what}: exact again {took:?} after Redis answered PING ({rounds} rounds)");
    let stored = blocking(|| redis.keys(&format!("*|api_key={key}#*")));
    assert_eq!(
        stored.len(),
        1,
        "{what}: the probe's counter must be in the restarted Redis: {stored:?}"
    );
}

// ---------------------------------------------------------------------------
// Assertions
// ---------------------------------------------------------------------------

/// The draft-03 headers of the `api_key` rule: its limit first, its policy
/// listed, `remaining` left, a reset within the current minute.
fn assert_key_headers(t: &Timed, remaining: u64) {
    let reset = fixed_minute_reset(t.before, t.after);
    assert_ratelimit_headers(t, KEY_LIMIT as u64, KEY_POLICY, remaining, reset);
}

// ---------------------------------------------------------------------------
// One limit shared through Redis
// ---------------------------------------------------------------------------

/// Two Envoys, each asking its own Tollgate, both Tollgates on one Redis:
/// requests alternating between the Envoys are admitted exactly up to the
/// limit in total (each Tollgate alone would admit the limit on its own: six
/// alternating requests would all pass), and the remaining count falls across
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tollgates_sharing_redis_enforce_one_limit() {
    let redis = start_redis();
    let upstream = Upstream::start().await;
    let (t1, t2) = tokio::join!(start_tollgate(&redis, None), start_tollgate(&redis, None));
    let (e1, e2) = tokio::join!(
        start_envoy(&upstream, &t1, false),
        start_envoy(&upstream, &t2, false)
    );
    let envoys = [&e1, &e2];

    let (key, start_hits, responses) = within_one_minute(async |n| {
        let key = format!("shared-{n}");
        let start_hits = upstream.hits();
        let mut out = Vec::new();
        // e1, e2, e1, e2, ...: twice the limit in all.
        for i in 0..2 * KEY_LIMIT {
            out.push(timed_get(envoys[i % 2], &upstream, "/shared", Some(&key)).await);
        }
        (key, start_hits, out)
    })
    .await;

    for (i, t) in responses.iter().enumerate() {
        if i < KEY_LIMIT {
            assert_admitted(t, start_hits + i + 1);
            assert_key_headers(t, (KEY_LIMIT - 1 - i) as u64);
        } else {
            assert_limited(t, start_hits + KEY_LIMIT);
            assert_key_headers(t, 0);
        }
    }
    let per_envoy: Vec<usize> = (0..2)
        .map(|e| {
            responses
                .iter()
                .skip(e)
                .step_by(2)
                .filter(|t| t.resp.status == 200)
                .count()
        })
        .collect();
    assert_eq!(
        per_envoy.iter().sum::<usize>(),
        KEY_LIMIT,
        "admitted across both Envoys: {per_envoy:?}"
    );
    assert!(
        per_envoy.iter().all(|n| *n > 0),
        "both Envoys (so both Tollgates) admitted some: {per_envoy:?}"
    );
    // The one counter both used is in Redis: a hash with the three hits.
    let stored = blocking(|| redis.keys(&format!("*|api_key={key}#*")));
    assert_eq!(
        stored.len(),
        1,
        "one Redis key for the shared counter: {stored:?}"
    );
}

// ---------------------------------------------------------------------------
// --on-store-error, seen through Envoy
// ---------------------------------------------------------------------------

/// `allow`: with Redis down a fresh key is let through every time, past its
/// limit, since no request can be counted; a key this Tollgate already knows
/// to be full is still refused. After Redis is back limiting is exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_allow_lets_fresh_keys_through() {
    let mut redis = start_redis();
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("allow")).await;
    let envoy = start_envoy(&upstream, &tollgate, false).await;

    // Redis is in use: exact limiting, and the last key is full in this
    // Tollgate's local view.
    let (_, _, full) = await_exact_limiting(&[&envoy], &upstream, "allow-before", RECOVERY).await;
    let full_minute = minute_now();

    blocking(|| redis.stop());

    let hits = upstream.hits();
    let t = timed_get(&envoy, &upstream, "/known", Some(&full)).await;
    if minute_now() == full_minute {
        assert_limited(&t, hits);
    } else {
        eprintln!("a new minute began: the full key's window was reset; not checked");
    }

    let key = "allow-down";
    for _ in 0..KEY_LIMIT + 2 {
        let hits = upstream.hits();
        let t = timed_get(&envoy, &upstream, "/down", Some(key)).await;
        assert_admitted(&t, hits + 1);
    }

    restart_and_await_exact(&mut redis, &[&envoy], &upstream, "allow").await;
}

/// `deny`: with Redis down every request that needs Redis is refused: Envoy
/// answers 429 for a fresh key, and for a request with no key at all (its
/// per-address limit needs Redis too). After Redis is back limiting is exact
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_deny_answers_429() {
    let mut redis = start_redis();
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("deny")).await;
    let envoy = start_envoy(&upstream, &tollgate, false).await;
    await_exact_limiting(&[&envoy], &upstream, "deny-before", RECOVERY).await;

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
/// `failure_mode_deny` decides: `false` lets the request through to the
/// upstream (without rate-limit headers: no service answered), `true`
/// answers 500 and the upstream sees nothing. After Redis is back limiting is
/// exact again, through both Envoys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_error_leaves_it_to_failure_mode_deny() {
    let mut redis = start_redis();
    let upstream = Upstream::start().await;
    let tollgate = start_tollgate(&redis, Some("error")).await;
    let (open, closed) = tokio::join!(
        start_envoy(&upstream, &tollgate, false),
        start_envoy(&upstream, &tollgate, true)
    );
    await_exact_limiting(&[&open, &closed], &upstream, "error-before", RECOVERY).await;

    blocking(|| redis.stop());

    // What Envoy is told: UNAVAILABLE.
    let mut rls = tollgate.client().await;
    let answer = rls
        .call(request("edge", &[&[("api_key", "error-grpc")]]))
        .await;
    match answer {
        Err(status) => assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "gRPC code with Redis down, error: {status:?}"
        ),
        Ok(resp) => panic!("expected gRPC UNAVAILABLE with Redis down, got {resp:?}"),
    }

    for i in 0..2 {
        let hits = upstream.hits();
        let t = timed_get(&open, &upstream, "/open", Some(&format!("error-open-{i}"))).await;
        assert_admitted(&t, hits + 1);
        assert_eq!(t.resp.header("x-ratelimit-limit"), None, "{t:#?}");
    }
    for i in 0..2 {
        let hits = upstream.hits();
        let t = timed_get(
            &closed,
            &upstream,
            "/closed",
            Some(&format!("error-closed-{i}")),
        )
        .await;
        assert_eq!(t.resp.status, 500, "failure_mode_deny: true: {t:#?}");
        assert_eq!(
            t.upstream_hits, hits,
            "a refused request must not reach the upstream: {t:#?}"
        );
    }

    restart_and_await_exact(&mut redis, &[&open, &closed], &upstream, "error").await;
}

/// `local` (the default): with Redis down each Tollgate decides from its own
/// local view, as the memory store would: through one Envoy a fresh key gets
/// its 3 requests and the 4th is refused; the other Tollgate, which has not
/// seen the key, still admits it (nothing is shared while Redis is down).
/// After Redis is back, limiting across both Tollgates is exact again — which
/// local decisions alone would not give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_local_still_limits_locally() {
    let mut redis = start_redis();
    let upstream = Upstream::start().await;
    let (ta, tb) = tokio::join!(
        start_tollgate(&redis, Some("local")),
        start_tollgate(&redis, Some("local"))
    );
    let (ea, eb) = tokio::join!(
        start_envoy(&upstream, &ta, false),
        start_envoy(&upstream, &tb, false)
    );
    await_exact_limiting(&[&ea, &eb], &upstream, "local-before", RECOVERY).await;

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
    for (i, t) in through_a.iter().enumerate() {
        if i < KEY_LIMIT {
            assert_admitted(t, start_hits + i + 1);
            assert_key_headers(t, (KEY_LIMIT - 1 - i) as u64);
        } else {
            assert_limited(t, start_hits + KEY_LIMIT);
            assert_key_headers(t, 0);
        }
    }
    assert_admitted(&through_b, start_hits + KEY_LIMIT + 1);
    assert_key_headers(&through_b, (KEY_LIMIT - 1) as u64);

    restart_and_await_exact(&mut redis, &[&ea, &eb], &upstream, "local").await;
}
