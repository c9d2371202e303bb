//! Coalesced calls: concurrent requests' check-and-count calls ride one
//! `tollgate_apply_many` statement, and a batch the database does not answer in time
//! falls back for every request in it. pg_stat_statements counts the statements.

use futures_util::future::join_all;
use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::shared_store::{a_stalled_batch_falls_back_for_every_request, admitted};
use tollgate_testkit::tollgate::Serve;

use crate::support::{DOMAIN, RULES, YEARLY_LIMIT, blocking, connected};

/// The statements that checked and counted so far: batches, and single calls (the
/// probe's; every request's, before calls were batched).
pub fn counting_statements(postgres: &PostgresServer) -> u64 {
    postgres.statement_calls("SELECT call_no, reply FROM tollgate_apply_many(")
        + postgres.statement_calls("SELECT tollgate_apply(")
}

/// Requests for `yearly=value` of each of `values` at once: each one's code.
async fn all_at_once(rls: &Rls, values: &[String]) -> Vec<Code> {
    join_all(values.iter().map(|value| {
        let mut rls = rls.clone();
        async move { code(&rls.check(DOMAIN, &[("yearly", value)]).await) }
    }))
    .await
}

/// 64 requests at once on 64 counters, one connection (so one batch out at a time): the
/// calls that arrive while a statement is out ride the next, so there are far fewer
/// statements than calls, and each call counted its own counter once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_on_many_counters_ride_fewer_statements() {
    const REQUESTS: usize = 64;
    let mut postgres = PostgresServer::start();
    postgres.count_statements();
    let server = connected(&postgres, &["--postgres-pool-size", "1"]).await;
    let mut rls = server.client().await;
    let values: Vec<String> = (0..REQUESTS).map(|i| format!("many-{i}")).collect();

    let before = blocking(|| counting_statements(&postgres));
    let codes = all_at_once(&rls, &values).await;
    let statements = blocking(|| counting_statements(&postgres)) - before;
    eprintln!("{statements} statements for {REQUESTS} calls");
    assert!(codes.iter().all(|c| *c == Code::Ok), "{codes:?}");
    let fallbacks = server.metric("tollgate_store_fallbacks_total").await;
    assert_eq!(fallbacks.unwrap_or(0.0), 0.0, "every call answered in time");
    assert!(
        statements <= REQUESTS as u64 / 2,
        "{statements} statements for {REQUESTS} calls"
    );
    let counted = blocking(|| {
        postgres.psql("SELECT count(*) FROM tollgate_counters WHERE key LIKE '%many-%'")
    });
    assert_eq!(counted, REQUESTS.to_string(), "one row per counter");
    assert_eq!(
        admitted(&mut rls, DOMAIN, ("yearly", "many-0"), YEARLY_LIMIT).await,
        YEARLY_LIMIT - 1,
        "counted once"
    );
}

/// Concurrent requests on fresh counters while another session holds the counter table
/// (`LOCK TABLE … IN EXCLUSIVE MODE`: no row can be written, the clock still reads): see
/// [`a_stalled_batch_falls_back_for_every_request`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_falls_back_for_every_request_in_it() {
    let mut postgres = PostgresServer::start();
    postgres.count_statements();
    let first = Serve::rules(RULES)
        .postgres(&postgres.url())
        .args(["--store-timeout", "10ms", "--on-store-error", "local"])
        .start_connected()
        .await;
    let second = connected(&postgres, &[]).await;
    let mut holder = None;
    let mut hold = |held: bool| {
        holder =
            held.then(|| postgres.hold("BEGIN; LOCK TABLE tollgate_counters IN EXCLUSIVE MODE;"));
    };
    a_stalled_batch_falls_back_for_every_request((&first, &second), DOMAIN, &mut hold, &|| {
        counting_statements(&postgres)
    })
    .await;
}
