//! The rules the PostgreSQL suites serve, and how they start Tollgate on a server.

use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
pub use tollgate_testkit::process::blocking;
use tollgate_testkit::tollgate::{Serve, Server};

pub const DOMAIN: &str = "pg";

pub const RULES: &str = tollgate_testkit::shared_store_rules!(
    "pg",
    "  # Expires within seconds: the sweeper's work.
  - key: brief
    rate_limit: {unit: second, requests_per_unit: 3}
"
);

pub use tollgate_testkit::shared_store::{
    ACC_LIMIT, ACC_SUB_WINDOW, ACC_WINDOW, USER_LIMIT, YEARLY_LIMIT,
    assert_instances_share_exactly, await_exact_probe,
};
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
