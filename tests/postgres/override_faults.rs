//! A change of the overrides through a slow link to PostgreSQL (Toxiproxy between the
//! instance and the database): PostgreSQL takes it after its deadline, refuses it, and
//! the answer says so; the override is never made.

use std::time::Duration;

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::http::Method;
use tollgate_testkit::overrides::await_listed;
use tollgate_testkit::postgres::{PASSWORD, PostgresServer};
use tollgate_testkit::toxiproxy::{Direction, Toxiproxy};

use crate::support::{DOMAIN, RULES, blocking};

/// More than a change's deadline (5 s) and the second its answer is then awaited.
const SLOW: Duration = Duration::from_millis(6_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_postgres_takes_after_its_deadline_is_refused_and_never_made() {
    let postgres = blocking(PostgresServer::start);
    let toxiproxy = Toxiproxy::start().await;
    let proxy = toxiproxy.proxy("postgres", &postgres.host_port()).await;
    let url = format!(
        "postgres://postgres:{PASSWORD}@{}/postgres?sslmode=disable",
        proxy.listen()
    );
    let server = tollgate_testkit::tollgate::Serve::rules(RULES)
        .postgres(&url)
        .args(["--store-timeout", "1s"])
        .env("ADMIN_TOKEN", TOKEN)
        .start_connected()
        .await;
    let put = async |value: &str| {
        let body = override_body(DOMAIN, ("user", value), "9", "minute");
        admin::overrides(&server, Method::PUT, "/overrides", &body, Some(TOKEN)).await
    };
    let slow = proxy
        .latency(Direction::Upstream, SLOW, Duration::ZERO)
        .await;
    let refused = put("ann").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("timed out"), "{refused:?}");
    proxy.remove(&slow).await;
    server
        .await_store_health(200, Duration::from_secs(30))
        .await;
    assert_eq!(put("bob").await.status, 200);
    await_listed(&server, "bob", true).await;
    let ids = blocking(|| postgres.psql("SELECT id FROM tollgate_overrides"));
    assert!(!ids.contains("ann"), "never made: {ids}");
}
