//! Admissions decided without PostgreSQL are a debt: charged to the shared counter once
//! the database answers again, whether it was down, restarting or only slow.

use std::time::Duration;

use tollgate_testkit::load::{Load, assert_admitted_within, tally};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::shared_store::admitted;
use tollgate_testkit::tollgate::Serve;

use crate::support::{DOMAIN, RECOVERY, RULES, YEARLY_LIMIT, blocking};

/// One instance, PostgreSQL stopped and started again: what the instance admitted from
/// its local view meanwhile counts once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_during_a_restart_are_charged_when_postgres_is_back() {
    let mut postgres = PostgresServer::start();
    let server = Serve::rules(RULES)
        .postgres(&postgres.url())
        .args(["--store-timeout", "1s"])
        .start_connected()
        .await;
    let mut rls = server.client().await;

    assert_eq!(
        admitted(&mut rls, DOMAIN, ("yearly", "restart"), 1).await,
        1
    );
    blocking(|| postgres.stop());
    server.await_store_health(503, RECOVERY).await;
    let during = admitted(&mut rls, DOMAIN, ("yearly", "restart"), YEARLY_LIMIT + 3).await;
    assert_eq!(during, YEARLY_LIMIT - 1, "the local view holds the limit");
    blocking(|| postgres.restart());
    server.await_store_health(200, RECOVERY).await;

    let after = admitted(&mut rls, DOMAIN, ("yearly", "restart"), YEARLY_LIMIT + 3).await;
    assert_eq!(
        1 + during + after,
        YEARLY_LIMIT,
        "admitted {after} more after the restart"
    );
}

/// The case: PostgreSQL at its durable defaults (every commit waits for a flush,
/// requests queue on the counter's row lock), a store timeout most calls miss, one key,
/// three times its limit offered: calls that time out are decided from the local view
/// and charged later, so the instance admits no more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_durable_store_never_admits_past_the_limit() {
    let _timing = tollgate_testkit::serial::timing().await;
    let postgres = PostgresServer::start_durable();
    let server = Serve::rules(RULES)
        .postgres(&postgres.url())
        .args(["--store-timeout", "1ms", "--on-store-error", "local"])
        .start_connected()
        .await;
    let clients = vec![server.client().await];
    // `hundred`: 100 per hour; 300 requests at 400 a second.
    let load = Load::on_one_counter(&clients, DOMAIN, "hundred", 400).await;
    load.await_answers_since(std::time::UNIX_EPOCH, 300, Duration::from_secs(60))
        .await;
    let answers = load.finish().await;
    let fallbacks = server
        .metric("tollgate_store_fallbacks_total")
        .await
        .unwrap_or(0.0);
    eprintln!("{:?}, {fallbacks} fallbacks", tally(&answers));
    // Once the counter is full the local view denies without asking the store, so only
    // the first hundred calls can time out: on a quiet host a few dozen do.
    assert!(
        fallbacks >= 10.0,
        "the store must be slow for this test to mean anything: {fallbacks} fallbacks"
    );
    assert_admitted_within(&answers, 100);
}
