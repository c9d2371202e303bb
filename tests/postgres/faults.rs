//! The PostgreSQL store when the database fails: restarted under load, refusing the
//! password, unreachable, or holding a lock past the statement timeout.

use std::time::{Duration, SystemTime};

use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::load::{Load, assert_all, exactly, in_sequence, sent_between, timed_check};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::process::Process;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::{free_port, loopback, wait};

use crate::support::{
    DOMAIN, RECOVERY, RULES, USER_LIMIT, await_exact_probe, blocking, connected, serve,
};

const STDERR_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_under_load_decides_locally_then_limits_exactly_again() {
    let _timing = tollgate_testkit::serial::timing().await;
    let mut postgres = PostgresServer::start();
    let (a, b) = (
        connected(&postgres, &[]).await,
        connected(&postgres, &[]).await,
    );
    let mut clients = vec![a.client().await, b.client().await];
    await_exact_probe(&mut clients, DOMAIN, "before", RECOVERY).await;
    let values = (0..50).map(|i| format!("load-{i}")).collect();
    let load = Load::start(&clients, DOMAIN, "busy", values, Duration::from_millis(5)).await;

    blocking(|| postgres.stop());
    let stopped = SystemTime::now();
    load.await_answers_since(stopped, 100, Duration::from_secs(30))
        .await;
    a.await_store_health(503, RECOVERY).await;

    let restarted = SystemTime::now();
    blocking(|| postgres.restart());
    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "after", RECOVERY).await;
    eprintln!("exact again {took:?} after PostgreSQL restarted, {rounds} rounds");
    let answers = load.finish().await;
    // The default --on-store-error local: every request answered, from the local view
    // while the database was down (the `busy` limit is never reached).
    let outage = sent_between(&answers, stopped, restarted);
    assert!(
        outage.len() >= 100,
        "{} answers during the outage",
        outage.len()
    );
    assert_all(answers.iter(), Ok(Code::Ok), "restart under load");
    let reconnects = a.metric("tollgate_store_reconnects_total").await;
    assert!(reconnects >= Some(2.0), "reconnects {reconnects:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_named_and_requests_get_the_chosen_failure() {
    let postgres = PostgresServer::start();
    let server = Serve::rules(RULES)
        .postgres(&postgres.url_as("postgres", "wrong"))
        .args(["--on-store-error", "error"])
        .start_without_store();
    let line = server
        .stderr()
        .wait_for(
            |l| l.contains("password authentication failed"),
            STDERR_TIMEOUT,
        )
        .expect("the reason in the log");
    assert!(line.contains("postgres"), "{line}");
    assert_eq!(server.store_health().await, 503);
    let mut rls = server.client().await;
    let answer = timed_check(&mut rls, DOMAIN, &[("user", "x")]).await;
    assert_eq!(answer.result, Err(tonic::Code::Unavailable), "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_named_and_requests_get_the_chosen_failure() {
    let url = format!(
        "postgres://postgres:x@{}/postgres?sslmode=disable",
        loopback(free_port())
    );
    let server = Serve::rules(RULES)
        .postgres(&url)
        .args(["--on-store-error", "deny"])
        .start_without_store();
    server
        .stderr()
        .wait_for(
            |l| l.to_lowercase().contains("connection refused"),
            STDERR_TIMEOUT,
        )
        .expect("the reason in the log");
    let status = server.client().await.check(DOMAIN, &[("user", "x")]).await;
    assert_eq!(code(&status), Code::OverLimit, "{status:?}");
}

#[test]
fn settings_that_cannot_work_stop_startup() {
    for (args, says) in [
        (
            vec!["--backend", "postgres"],
            "BACKEND_TYPE=postgres needs POSTGRES_URL",
        ),
        (
            vec!["--postgres-url", "postgres://h/x?sslmode=maybe"],
            "sslmode=maybe",
        ),
        (
            vec![
                "--postgres-url",
                "postgres://h/x?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            ],
            "/nonexistent/ca.pem",
        ),
    ] {
        let finished = Serve::rules(RULES).args(&args).refused("startup must fail");
        assert!(!finished.status.success());
        assert!(
            finished.stderr.contains(says),
            "{args:?}: {}",
            finished.stderr
        );
    }
}

/// A call waiting on a row lock past `--postgres-statement-timeout` is cancelled by the
/// database: the request gets the failure mode's answer long before the store timeout,
/// the store stays up, and nothing was counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_timeout_cuts_a_call_blocked_on_a_lock() {
    let postgres = PostgresServer::start();
    let server = Serve::rules(RULES)
        .postgres(&postgres.url())
        .args([
            "--postgres-statement-timeout",
            "300ms",
            "--store-timeout",
            "60s",
        ])
        .args(["--on-store-error", "error"])
        .start_connected()
        .await;
    let mut rls = server.client().await;
    let status = rls.check(DOMAIN, &[("user", "locked")]).await;
    assert_eq!(status.limit_remaining, 4, "{status:?}");

    let key = blocking(|| postgres.psql("SELECT key FROM tollgate_counters"));
    let holder = blocking(|| {
        postgres.hold(&format!(
            "BEGIN; SELECT 1 FROM tollgate_counters WHERE key = '{key}' FOR UPDATE;"
        ))
    });
    let blocked = timed_check(&mut rls, DOMAIN, &[("user", "locked")]).await;
    assert_eq!(blocked.result, Err(tonic::Code::Unavailable), "{blocked:?}");
    assert_eq!(
        server
            .metric(r#"tollgate_store_errors_total{kind="timeout"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        server.store_health().await,
        200,
        "a slow statement is not an outage"
    );

    drop(holder);
    let status = rls.check(DOMAIN, &[("user", "locked")]).await;
    assert_eq!(
        status.limit_remaining, 3,
        "the cancelled call counted nothing: {status:?}"
    );
}

/// A primary and its standby, both in the URL with `target_session_attrs=read-write`:
/// while the primary is down and the standby still read-only, requests are decided per
/// `--on-store-error`; once the standby is promoted, Tollgate finds it and limits exactly
/// across instances again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_takes_over() {
    let _timing = tollgate_testkit::serial::timing().await;
    let mut primary = PostgresServer::start();
    // The schema exists before the backup, so that the standby has it.
    let first = connected(&primary, &[]).await;
    drop(first);
    let standby = blocking(|| PostgresServer::standby_of(&primary));
    let url = format!(
        "postgres://postgres:{}@{},{}/postgres?sslmode=disable&target_session_attrs=read-write",
        tollgate_testkit::postgres::PASSWORD,
        primary.host_port(),
        standby.host_port()
    );
    let start = || {
        Serve::rules(RULES)
            .postgres(&url)
            .args(["--store-timeout", "1s"])
            .start_connected()
    };
    let (a, b) = (start().await, start().await);
    let mut clients = vec![a.client().await, b.client().await];
    await_exact_probe(&mut clients, DOMAIN, "primary", RECOVERY).await;

    blocking(|| primary.stop());
    a.await_store_health(503, RECOVERY).await;
    // The standby answers, read-only: not a store to count in.
    let status = clients[0].check(DOMAIN, &[("user", "meanwhile")]).await;
    assert_eq!(code(&status), Code::Ok, "decided locally: {status:?}");
    assert_eq!(
        a.store_health().await,
        503,
        "a read-only standby is not taken"
    );

    blocking(|| standby.promote());
    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "promoted", RECOVERY).await;
    eprintln!("exact again {took:?} after the promotion, {rounds} rounds");
    let rows = blocking(|| {
        standby.psql("SELECT count(*) FROM tollgate_counters WHERE key LIKE '%promoted-%'")
    });
    assert_ne!(rows, "0", "the counters are in the promoted standby");
}

/// The counter table dropped while serving: the database still answers its health probe,
/// but every counter call fails. The store is reported down (503, `tollgate_store_up` 0)
/// with one line naming the cause, the migration recreates the table on reconnect (held
/// back here by the migration's lock, so that the outage can be seen), and counting
/// resumes. Nothing floods the log meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_table_is_reported_down_and_recreated() {
    let (_postgres, server, mut rls, migrations) =
        dropped_while_serving("DROP TABLE tollgate_counters").await;
    assert_eq!(server.metric("tollgate_store_up").await, Some(0.0));
    let cause = server
        .stderr()
        .wait_for(|l| l.contains("counter calls fail"), STDERR_TIMEOUT)
        .expect("the cause is logged");
    assert!(cause.contains("tollgate_counters"), "{cause}");

    drop(migrations);
    let stderr = assert_counting_resumes(&server, &mut rls).await;
    let causes = stderr.matches("counter calls fail").count();
    assert!(causes <= 2, "{causes} lines for one cause:\n{stderr}");
    assert!(!stderr.contains("already exists"), "{stderr}");
}

/// Once the schema is repaired: healthy again, and a request counted in PostgreSQL; the
/// log says the schema was repaired. The log, for more checks.
async fn assert_counting_resumes(server: &Server, rls: &mut Rls) -> String {
    server.await_store_health(200, RECOVERY).await;
    let trips = server.metric("tollgate_store_round_trips_total").await;
    assert_eq!(
        code(&rls.check(DOMAIN, &[("yearly", "again")]).await),
        Code::Ok
    );
    assert!(
        server.metric("tollgate_store_round_trips_total").await > trips,
        "counted in PostgreSQL again"
    );
    let stderr = server.stderr().text();
    assert!(stderr.contains("schema repaired"), "{stderr}");
    stderr
}

/// A function of the schema dropped while serving, the table left: the store goes down,
/// and on reconnect the migration sees the piece missing and recreates it (held back by
/// the migration's lock until the outage has been seen), and counting resumes.
async fn a_dropped_function_is_recreated(drop: &str) {
    let (_postgres, server, mut rls, migrations) = dropped_while_serving(drop).await;
    std::mem::drop(migrations);
    assert_counting_resumes(&server, &mut rls).await;
}

/// A Tollgate counting in a fresh PostgreSQL, then `drop` run there while it serves, and
/// requests until it reports the store down. The lock every migration takes (schema.rs)
/// is held, so that the outage can be seen before a reconnect repairs the schema: the
/// server, the Tollgate, its client, and that lock, held until dropped.
async fn dropped_while_serving(drop: &str) -> (PostgresServer, Server, Rls, Process) {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &[]).await;
    let mut rls = server.client().await;
    assert_eq!(
        code(&rls.check(DOMAIN, &[("yearly", "before")]).await),
        Code::Ok
    );
    let migrations = postgres.hold("SELECT pg_advisory_lock(8390043843661231205)");
    blocking(|| postgres.psql(drop));
    for value in ["after-1", "after-2", "after-3"] {
        rls.check(DOMAIN, &[("yearly", value)]).await;
    }
    server.await_store_health(503, RECOVERY).await;
    (postgres, server, rls, migrations)
}

/// The counting function this version calls (not an older signature) dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_counting_function_is_recreated() {
    a_dropped_function_is_recreated(
        "DROP FUNCTION tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, \
         bigint[], bigint[], bigint[], bigint[], bigint)",
    )
    .await;
}

/// The clock function dropped: the health probe fails, and the pool's statements cannot
/// be prepared on reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_clock_function_is_recreated() {
    a_dropped_function_is_recreated("DROP FUNCTION tollgate_now_us()").await;
}

/// Tollgate's backends (the pool's, the migration's among them) that have waited on
/// `lock` (`pg_locks` wait event: `advisory`, `relation`) for longer than `at_least`.
fn waiting_on(postgres: &PostgresServer, lock: &str, at_least: Duration) -> u32 {
    let waiting = postgres.psql(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tollgate' \
         AND wait_event_type = 'Lock' AND wait_event = '{lock}' \
         AND now() - query_start > interval '{} ms'",
        at_least.as_millis()
    ));
    waiting
        .parse()
        .unwrap_or_else(|e| panic!("count of waiting backends {waiting:?}: {e}"))
}

/// Longer than both the statement timeout (1 s) and the connect timeout (5 s).
const LONG_WAIT: Duration = Duration::from_secs(6);

/// Another instance's migration holding the migration lock past the statement timeout
/// and the connect timeout, then a reader holding the counter table while this instance
/// switches it to unlogged (a rewrite, which needs the table to itself): each migration
/// waits rather than being cancelled and failing every retry, and the store comes up
/// once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_waits_past_the_statement_and_connect_timeouts() {
    let postgres = PostgresServer::start();
    let migrations = blocking(|| postgres.hold("SELECT pg_advisory_lock(8390043843661231205)"));
    let server = serve(&postgres, &[]).start_without_store();
    let waited = |lock: &'static str, server: &tollgate_testkit::tollgate::Server| {
        blocking(|| {
            wait::until(
                &format!("Tollgate's migration waiting on the {lock} lock past {LONG_WAIT:?}"),
                LONG_WAIT * 3,
                || match waiting_on(&postgres, lock, LONG_WAIT) {
                    0 => Err(format!("none; Tollgate said:\n{}", server.stderr().tail(5))),
                    _ => Ok(()),
                },
            )
        })
    };
    waited("advisory", &server);
    std::mem::drop(migrations);
    server.await_store_health(200, RECOVERY).await;
    let stderr = server.stderr().text();
    assert!(stderr.contains("waiting for another"), "{stderr}");
    assert!(!stderr.contains("statement timeout"), "{stderr}");
    drop(server);

    let reader = blocking(|| postgres.hold("BEGIN; SELECT count(*) FROM tollgate_counters;"));
    let server = serve(&postgres, &["--postgres-unlogged"]).start_without_store();
    waited("relation", &server);
    std::mem::drop(reader);
    server.await_store_health(200, RECOVERY).await;
    let persistence = blocking(|| {
        postgres.psql("SELECT relpersistence FROM pg_class WHERE relname = 'tollgate_counters'")
    });
    assert_eq!(persistence, "u", "switched to unlogged");
    let stderr = server.stderr().text();
    assert!(!stderr.contains("statement timeout"), "{stderr}");
}

/// PostgreSQL ends Tollgate's connections while they are idle (`idle_session_timeout`,
/// an operator's `pg_terminate_backend`, a proxy's cut): requests go on over the pool's
/// open connections, the closed ones are replaced at once, and the store is never
/// reported down; when every connection ends, the pool is made afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_postgres_ends_are_replaced_without_failing_requests() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &["--on-store-error", "error"]).await;
    let mut rls = server.client().await;
    assert_eq!(
        in_sequence(&mut rls, DOMAIN, &[("user", "warm")], 1).await,
        exactly(1, 0)
    );
    let ups = server.store_ups().await;
    let replaced = |n| {
        let line = |l: &str| l.contains("closed connections replaced");
        blocking(|| server.stderr().wait_for_count(line, n, RECOVERY)).expect("replaced")
    };

    let one = "SELECT count(pg_terminate_backend(pid, 5000)) FROM (SELECT pid FROM \
               pg_stat_activity WHERE backend_type = 'client backend' \
               AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%' LIMIT 1) AS one";
    assert_eq!(blocking(|| postgres.psql(one)).trim(), "1");
    let got = in_sequence(&mut rls, DOMAIN, &[("user", "one-ended")], USER_LIMIT + 1).await;
    assert_eq!(got, exactly(USER_LIMIT, 1), "over the open connections");
    replaced(1);

    let all = "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity \
               WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let ended: u32 = blocking(|| postgres.psql(all))
        .trim()
        .parse()
        .expect("a count");
    assert!(ended >= 4, "{ended} connections ended");
    replaced(2);
    let got = in_sequence(&mut rls, DOMAIN, &[("user", "all-ended")], USER_LIMIT + 1).await;
    assert_eq!(got, exactly(USER_LIMIT, 1), "over the new pool");

    server.assert_never_down_since(ups).await;
}
