//! All or none on PostgreSQL: a refused request moves no counter, across two instances
//! and while the counter table is locked past the store timeout.

use tollgate_testkit::all_or_none::{
    assert_hierarchy_exact, assert_refused_while_stalled_move_nothing,
};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::tollgate::Serve;

use crate::support::{DOMAIN, RULES, connected};

#[tokio::test]
async fn the_hierarchy_is_exact_across_two_instances() {
    let postgres = PostgresServer::start();
    let a = connected(&postgres, &[]).await;
    let b = connected(&postgres, &[]).await;
    let mut clients = vec![a.client().await, b.client().await];
    assert_hierarchy_exact(&mut clients, DOMAIN, "acme").await;
}

/// Refused requests while another session holds the counter table (`LOCK TABLE … IN
/// EXCLUSIVE MODE`) past a 50 ms store timeout, decided from the local view or answered
/// with an error: once the lock is gone, nothing they counted is left counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_while_the_table_is_locked_leave_no_count() {
    let postgres = PostgresServer::start();
    for (i, on_error) in ["local", "error"].into_iter().enumerate() {
        let first = Serve::rules(RULES)
            .postgres(&postgres.url())
            .args(["--store-timeout", "50ms", "--on-store-error", on_error])
            .start_connected()
            .await;
        let second = connected(&postgres, &[]).await;
        let mut holder = None;
        let mut hold = |held: bool| {
            holder = held
                .then(|| postgres.hold("BEGIN; LOCK TABLE tollgate_counters IN EXCLUSIVE MODE;"));
        };
        let org = format!("locked-{i}");
        assert_refused_while_stalled_move_nothing((&first, &second), DOMAIN, &org, &mut hold).await;
    }
}
