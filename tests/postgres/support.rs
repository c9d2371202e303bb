//! The rules the PostgreSQL suites serve, and how they start Tollgate on a server.

use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::tollgate::{Serve, Server};

pub const DOMAIN: &str = "pg";

pub const RULES: &str = r#"
domain: pg
descriptors:
  # 5 per minute, the default sliding window.
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  # 4 per hour: recovery probes, a fresh value per round.
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 4}
  # 5 per year: no sub-window closes while a test runs.
  - key: yearly
    rate_limit: {unit: year, requests_per_unit: 5}
  # 100 per hour: a limit a test reaches under load.
  - key: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
  # Never reached: every request for it needs the store.
  - key: busy
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  # Expires within seconds: the sweeper's work.
  - key: brief
    rate_limit: {unit: second, requests_per_unit: 3}
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
/// How long recovery to exact limiting may take on a loaded machine.
pub const RECOVERY: Duration = Duration::from_secs(30);

/// `tollgate serve` on [`RULES`] with counters in `postgres`, a store timeout long
/// enough for a loaded machine, and `extra` arguments.
pub fn serve(postgres: &PostgresServer, extra: &[&str]) -> Serve {
    Serve::rules(RULES)
        .postgres(&postgres.url())
        .args(["--store-timeout", "1s"])
        .args(extra)
}

/// [`serve`], once the store is connected.
pub async fn connected(postgres: &PostgresServer, extra: &[&str]) -> Server {
    serve(postgres, extra).start_connected().await
}

/// Runs a blocking call (a server start or stop, psql) without stalling the runtime's
/// other tasks, such as a background load.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}
