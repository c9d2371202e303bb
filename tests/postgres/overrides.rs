//! Runtime overrides kept in PostgreSQL: set through one instance and enforced by
//! another, kept across restarts, deleted through one; refused with 503 while
//! PostgreSQL is down.

use tollgate_testkit::admin::TOKEN;
use tollgate_testkit::overrides::{
    assert_an_expired_override_frees_its_place, assert_overrides_spread,
    assert_refused_while_the_store_is_down, assert_the_maximum_holds_under_races,
};
use tollgate_testkit::postgres::PostgresServer;

use crate::support::{DOMAIN, USER_LIMIT, blocking, serve};

#[tokio::test]
async fn an_override_set_on_one_instance_is_enforced_by_the_other_and_kept() {
    let postgres = PostgresServer::start();
    let limit = u32::try_from(USER_LIMIT).expect("a small limit");
    let start = async || {
        serve(&postgres, &[])
            .env("ADMIN_TOKEN", TOKEN)
            .start_connected()
            .await
    };
    assert_overrides_spread(start, DOMAIN, ("user", "ann"), limit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_while_postgres_is_down_is_refused_with_a_reason() {
    let mut postgres = PostgresServer::start();
    let server = serve(&postgres, &[])
        .env("ADMIN_TOKEN", TOKEN)
        .start_connected()
        .await;
    blocking(|| postgres.stop());
    assert_refused_while_the_store_is_down(&server, DOMAIN).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_never_pass_the_maximum() {
    let postgres = PostgresServer::start();
    let start = async || {
        serve(&postgres, &[])
            .env("ADMIN_TOKEN", TOKEN)
            .env("OVERRIDES_MAX", "5")
            .start_connected()
            .await
    };
    let (a, b) = (start().await, start().await);
    assert_the_maximum_holds_under_races(&a, &b, DOMAIN, "user").await;
    let stored = blocking(|| postgres.psql("SELECT count(*) FROM tollgate_overrides"));
    assert_eq!(stored, "4", "the four kept, every winner deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_override_is_purged_from_postgres() {
    let postgres = PostgresServer::start();
    let server = serve(&postgres, &[])
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start_connected()
        .await;
    assert_an_expired_override_frees_its_place(&server, DOMAIN, "user").await;
    let ids = blocking(|| postgres.psql("SELECT id FROM tollgate_overrides"));
    assert!(
        ids.ends_with("=b#") && !ids.contains('\n'),
        "only the one set after: {ids}"
    );
}
