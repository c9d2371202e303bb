//! The PostgreSQL store in normal operation.

use std::time::Duration;

use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::keys::{Shape, counter_key};
use tollgate_testkit::pki::Pki;
use tollgate_testkit::postgres::{PASSWORD, PostgresServer};
use tollgate_testkit::process::run;
use tollgate_testkit::shared_store::{assert_refunds_seen_at_once, count_down_then_deny};
use tollgate_testkit::tollgate::{Serve, command};
use tollgate_testkit::{accuracy, wait};

use crate::support::{
    ACC_LIMIT, ACC_SUB_WINDOW, ACC_WINDOW, DOMAIN, RULES, YEARLY_LIMIT,
    assert_instances_share_exactly, blocking, connected, serve,
};

/// The row key of `user=value`.
fn user_key(prefix: &str, value: &str) -> String {
    let key = counter_key(
        DOMAIN,
        &[("user", value)],
        &[Shape::sliding(Duration::from_secs(60))],
    );
    format!("{prefix}{key}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_over_postgres_and_denies_without_a_round_trip() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &[]).await;
    let mut rls = server.client().await;

    count_down_then_deny(&mut rls, DOMAIN, 3).await;
    // One function call per admission; the denials were decided from the local view.
    assert_eq!(
        server.metric("tollgate_store_round_trips_total").await,
        Some(5.0)
    );
    assert_eq!(
        server.metric("tollgate_local_denials_total").await,
        Some(3.0)
    );

    // The counter lives in the database: one row, under the counter's key.
    let rows = blocking(|| postgres.psql("SELECT key FROM tollgate_counters"));
    assert_eq!(rows, user_key("", "ann"));
    assert_eq!(server.store_health().await, 200);
}

/// The startup line names the database by host, port and name, never with the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_line_names_the_database_without_its_password() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &[]).await;
    let stderr = blocking(|| server.stop()).stderr;
    let serving = format!("serving: store postgres {}/postgres;", postgres.host_port());
    assert!(stderr.contains(&serving), "no {serving:?} in:\n{stderr}");
    assert!(!stderr.contains(PASSWORD), "the password in:\n{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_share_counters_exactly() {
    let postgres = PostgresServer::start();
    let (a, b) = (
        connected(&postgres, &[]).await,
        connected(&postgres, &[]).await,
    );
    let mut clients = [a.client().await, b.client().await];
    assert_instances_share_exactly(&mut clients, DOMAIN).await;

    // A year's counter filled through A is denied by a third instance that never saw it:
    // its first request goes to the database, which denies.
    let mut a_rls = a.client().await;
    for _ in 0..YEARLY_LIMIT {
        let status = a_rls.check(DOMAIN, &[("yearly", "full")]).await;
        assert_eq!(code(&status), Code::Ok, "{status:?}");
    }
    let c = connected(&postgres, &[]).await;
    let status = c.client().await.check(DOMAIN, &[("yearly", "full")]).await;
    assert_eq!(code(&status), Code::OverLimit, "{status:?}");
}

/// Three instances on one database under a steady 3× overload: see
/// [`accuracy::assert_steady_overload_kept`] for what must hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stay_accurate_under_steady_overload() {
    let _timing = tollgate_testkit::serial::timing().await;
    let postgres = PostgresServer::start();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..3 {
        let server = connected(&postgres, &["--on-store-error", "error"]).await;
        clients.push(server.client().await);
        servers.push(server);
    }
    accuracy::assert_steady_overload_kept(
        &clients,
        DOMAIN,
        &[("acc", "steady")],
        ACC_LIMIT,
        ACC_WINDOW,
        ACC_SUB_WINDOW,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_versioned_and_the_pool_has_its_size() {
    let postgres = PostgresServer::start();
    let _server = connected(&postgres, &["--postgres-pool-size", "3"]).await;
    let version = blocking(|| postgres.psql("SELECT version FROM tollgate_schema"));
    assert_eq!(version, "12");
    let connections = blocking(|| {
        postgres.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tollgate'")
    });
    assert_eq!(connections, "3");
    let logged = blocking(|| {
        postgres.psql("SELECT relpersistence FROM pg_class WHERE relname = 'tollgate_counters'")
    });
    assert_eq!(logged, "p", "a logged table unless asked");
    let overrides = blocking(|| {
        postgres.psql("SELECT relpersistence FROM pg_class WHERE relname = 'tollgate_overrides'")
    });
    assert_eq!(overrides, "p", "overrides are kept in a logged table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_schema_and_environment_variables_select_postgres() {
    let postgres = PostgresServer::start();
    let migrate = |extra: &[&str]| {
        let mut cmd = command();
        cmd.arg("migrate")
            .args(extra)
            .env("POSTGRES_URL", postgres.url());
        let done = run("tollgate migrate", cmd, Duration::from_secs(60)).expect("migrate runs");
        assert!(done.status.success(), "{}", done.stderr);
        done.stdout
    };
    let first = blocking(|| migrate(&["--postgres-unlogged"]));
    assert_eq!(first.trim(), "schema version 12: migrated from 0");
    let again = blocking(|| migrate(&["--postgres-unlogged"]));
    assert_eq!(again.trim(), "schema version 12: up to date");
    // A database a version-1 Tollgate made: no tollgate_apply yet.
    blocking(|| {
        postgres.psql(
            "DROP FUNCTION tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, \
             bigint[], bigint[], bigint[]); DROP FUNCTION tollgate_apply(text, text, bigint, \
             bigint, bigint, bigint, text, bigint[], bigint[], bigint[], bigint[]); \
             DELETE FROM tollgate_schema; INSERT INTO tollgate_schema (version) VALUES (1)",
        )
    });
    let upgraded = blocking(|| migrate(&["--postgres-unlogged"]));
    assert_eq!(upgraded.trim(), "schema version 12: migrated from 1");
    let unlogged = blocking(|| {
        postgres.psql("SELECT relpersistence FROM pg_class WHERE relname = 'tollgate_counters'")
    });
    assert_eq!(unlogged, "u");

    let server = Serve::rules(RULES)
        .env("BACKEND_TYPE", "postgres")
        .env("POSTGRES_URL", postgres.url())
        .env("POSTGRES_UNLOGGED", "true")
        .env("CACHE_KEY_PREFIX", "team_")
        .start_connected()
        .await;
    let status = server
        .client()
        .await
        .check(DOMAIN, &[("user", "env")])
        .await;
    assert_eq!(code(&status), Code::Ok, "{status:?}");
    // On a busy host the call may outlast the store timeout; its count lands after.
    let want = user_key("team_", "env");
    blocking(|| {
        wait::until("the counter row", Duration::from_secs(10), || {
            let rows = postgres.psql("SELECT key FROM tollgate_counters");
            if rows == want { Ok(()) } else { Err(rows) }
        })
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_counters_are_swept_from_the_table() {
    let postgres = PostgresServer::start();
    let server = connected(&postgres, &["--postgres-sweep-interval", "200ms"]).await;
    let mut rls = server.client().await;
    let status = rls.check(DOMAIN, &[("brief", "x")]).await;
    assert_eq!(code(&status), Code::Ok, "{status:?}");
    let status = rls.check(DOMAIN, &[("user", "kept")]).await;
    assert_eq!(code(&status), Code::Ok, "{status:?}");
    let count = |pattern: &str| {
        postgres.psql(&format!(
            "SELECT count(*) FROM tollgate_counters WHERE key LIKE '%{pattern}%'"
        ))
    };
    assert_eq!(blocking(|| count("brief")), "1");
    // The one-second counter expires and goes; the minute's counter stays.
    blocking(|| {
        wait::until(
            "the expired counter swept",
            Duration::from_secs(30),
            || match count("brief").as_str() {
                "0" => Ok(()),
                n => Err(format!("{n} rows")),
            },
        )
    });
    assert_eq!(blocking(|| count("kept")), "1");
}

/// `sslmode` as libpq reads it: `verify-full` checks the chain and the name, `verify-ca`
/// only the chain, `require` encrypts without checking; every connection is encrypted,
/// and a certificate that fails the check is named in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_follows_sslmode() {
    let postgres = PostgresServer::start();
    let pki = Pki::new();
    let other = Pki::new();
    blocking(|| postgres.enable_tls(&pki.issue("postgres", "IP:127.0.0.1")));
    // The certificate names 127.0.0.1; `localhost` reaches the same server by a name it
    // does not carry.
    let url = |host: &str, query: &str| {
        format!(
            "postgres://postgres:{}@{host}:{}/postgres?{query}",
            tollgate_testkit::postgres::PASSWORD,
            postgres.port()
        )
    };
    let ca = pki.ca().display().to_string();
    let wrong_ca = other.ca().display().to_string();
    let trusted = [
        url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        url("localhost", &format!("sslmode=verify-ca&sslrootcert={ca}")),
        url("127.0.0.1", "sslmode=require"),
    ];
    let mut servers = Vec::new();
    for url in &trusted {
        let server = Serve::rules(RULES).postgres(url).start_connected().await;
        let status = server
            .client()
            .await
            .check(DOMAIN, &[("user", "tls")])
            .await;
        assert_eq!(code(&status), Code::Ok, "{url}: {status:?}");
        servers.push(server);
    }
    let encrypted = blocking(|| {
        postgres.psql(
            "SELECT count(*) FILTER (WHERE ssl), count(*) FROM pg_stat_ssl \
             JOIN pg_stat_activity USING (pid) WHERE application_name = 'tollgate'",
        )
    });
    assert_eq!(encrypted, "12|12", "every pooled connection over TLS");

    for (untrusted, why) in [
        (
            url(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            "notvalidforname",
        ),
        (
            url(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={wrong_ca}"),
            ),
            "badsignature",
        ),
    ] {
        let server = Serve::rules(RULES)
            .postgres(&untrusted)
            .start_without_store();
        let line = server
            .stderr()
            .wait_for(
                |l| l.contains("postgres ") && l.contains(" down: "),
                Duration::from_secs(30),
            )
            .expect("the refusal in the log");
        let said = line.to_lowercase().replace([' ', '_'], "");
        assert!(said.contains(why), "{untrusted}: {line}");
    }
}

/// A refund through one instance is seen by the other before its next request: a settled
/// budget gets no false 429 anywhere.
#[tokio::test]
async fn a_refund_on_one_instance_is_seen_by_the_other_at_once() {
    let pg = PostgresServer::start();
    let start = || {
        serve(&pg, &[])
            .env("LEASES", "false")
            .env("DEFAULT_ALGORITHM", "fixed_window")
            .start_connected()
    };
    let (a, b) = (start().await, start().await);
    let mut clients = vec![a.client().await, b.client().await];
    assert_refunds_seen_at_once(&mut clients, DOMAIN, "budget").await;
}
