//! The rules every Redis suite serves, where their counters live in Redis, and the
//! accuracy check of a steady overload.

use std::time::Duration;

use tollgate_testkit::accuracy::{OverloadRun, assert_steady_overload_kept};
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::keys::{Shape, redis_key};
use tollgate_testkit::tollgate::{Serve, Server};

pub const DOMAIN: &str = "rl";

/// Limits of the Redis suites, each for one purpose.
pub const RULES: &str = r#"
domain: rl
descriptors:
  # 5 per minute, the default sliding window (precision 10).
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  # 5 per hour, the reference's fixed window.
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  # 4 per hour: recovery probes, a fresh value per round.
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 4}
  # 5 per year: no sub-window closes while a test runs, so the store has no reason to
  # read anything in the background.
  - key: yearly
    rate_limit: {unit: year, requests_per_unit: 5}
  # 100 per hour: a limit a test reaches under load.
  - key: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
  # Never reached: every request for it needs the store.
  - key: busy
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  # Accuracy runs: 200 per 2-second window (sub-windows of 200 ms).
  - key: acc
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 200}
"#;

pub const USER_LIMIT: usize = 5;
pub const PROBE_LIMIT: usize = 4;
pub const YEARLY_LIMIT: usize = 5;
pub const ACC_LIMIT: u64 = 200;
pub const ACC_WINDOW: Duration = Duration::from_secs(2);
pub const ACC_SUB_WINDOW: Duration = Duration::from_millis(200);
pub const HOUR: Duration = Duration::from_secs(3_600);

/// The Redis key of the counter for `rule=value` under [`RULES`].
pub fn key(prefix: &str, rule: &str, value: &str) -> String {
    let shape = match rule {
        "user" => Shape::sliding(Duration::from_secs(60)),
        "fixed" => Shape::Fixed { window: HOUR },
        "probe" | "busy" | "hundred" => Shape::sliding(HOUR),
        "yearly" => Shape::sliding(Duration::from_secs(365 * 86_400)),
        "acc" => Shape::sliding(ACC_WINDOW),
        other => panic!("no rule for `{other}` in RULES"),
    };
    redis_key(prefix, DOMAIN, &[(rule, value)], &[shape])
}

/// `tollgate serve` on [`RULES`] with counters in a Redis deployment of `redis_type` at `url`.
pub fn serve(redis_type: &str, url: &str) -> Serve {
    Serve::rules(RULES).redis(redis_type, url)
}

/// Runs a blocking call (a process start or stop, a topology change) without stalling
/// the runtime's other tasks, such as a background load.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The accuracy check of the README ([`assert_steady_overload_kept`]) on the `acc` rule
/// (value `value`), round-robin over `servers`. Run it with `--on-store-error error`, so
/// that a stalled store shows up as failed answers instead of local decisions.
pub async fn assert_accurate_under_overload(servers: &[Server], value: &str) -> OverloadRun {
    let mut clients: Vec<Rls> = Vec::new();
    for server in servers {
        clients.push(server.client().await);
    }
    assert_steady_overload_kept(
        &clients,
        DOMAIN,
        &[("acc", value)],
        ACC_LIMIT,
        ACC_WINDOW,
        ACC_SUB_WINDOW,
    )
    .await
}
