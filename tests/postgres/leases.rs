//! Leases against one real PostgreSQL (the testkit's [`leases`] run): two leasing
//! Tollgates call PostgreSQL far less often than they admit, never admit past the limit
//! when pushed into overload, and give what they hold back when they drain.
//! pg_stat_statements counts the statements that check and count on the server.

use tollgate_testkit::leases::{self, Store};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::serial;
use tollgate_testkit::tollgate::Serve;

use crate::batches::counting_statements;
use crate::support::blocking;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_instances_call_postgres_rarely_and_never_admit_past_the_limit() {
    let _timing = serial::timing().await;
    let mut postgres = PostgresServer::start();
    postgres.count_statements();
    let serve = |rules: &str| Serve::rules(rules).postgres(&postgres.url());
    let calls = || blocking(|| counting_statements(&postgres));
    leases::call_rarely_and_never_admit_past_the_limit(Store {
        serve: &serve,
        calls: &calls,
    })
    .await;
}
