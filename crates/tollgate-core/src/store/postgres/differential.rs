//! The SQL function against the Rust algorithms on a real PostgreSQL (see
//! [`crate::store::shared::differential`]), and the table's housekeeping.

use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use tokio_postgres::{Client, NoTls};
use tollgate_testkit::postgres::PostgresServer;

use super::apply::{ApplyArgs, ManyArgs, signed};
use super::batch::in_call_order;
use super::connect::CHECK_MANY;
use super::schema;
use crate::algo::Hits;
use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::backend::CallArgs;
use crate::store::shared::differential::{
    Asked, YEAR_US, a_hit_past_the_burst_is_refused, fresh_key, limits, operation,
    read_after_upgrade, replay, stored_before_ends,
};
use crate::store::shared::protocol::{Ask, RawReply};

/// One PostgreSQL for every case of this test binary.
fn postgres() -> &'static PostgresServer {
    static POSTGRES: OnceLock<PostgresServer> = OnceLock::new();
    POSTGRES.get_or_init(PostgresServer::start)
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A connection to the test server's database `postgres`, with the schema in place.
async fn connect() -> Client {
    let mut client = open(&postgres().url()).await;
    schema::migrate(&mut client, false, None)
        .await
        .expect("migrate the schema");
    client
}

async fn open(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(connection);
    client
}

/// [`fresh_database`] with the schema in place.
pub(super) async fn fresh_schema(name: &str) -> Client {
    let mut client = fresh_database(name).await;
    schema::migrate(&mut client, false, None)
        .await
        .expect("migrate the schema");
    client
}

/// A connection to a new, empty database `name` on the test server, for a test that
/// changes what the others share.
async fn fresh_database(name: &str) -> Client {
    let client = open(&postgres().url()).await;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client.batch_execute(&sql).await.expect("create a database");
    }
    open(&postgres().url().replace("/postgres?", &format!("/{name}?"))).await
}

/// `tollgate_apply` at the instant `now`, calendar boundaries placed around it.
async fn call(
    client: &Client,
    key: &str,
    limits: &[Limit],
    call: (u64, Hits),
    deadline: Option<Timestamp>,
    now: Timestamp,
) -> Result<RawReply, String> {
    let call = (call.0, Ask::Hits(call.1));
    call_around(client, key, limits, call, deadline, (now, now)).await
}

/// `tollgate_apply` at the instant `now`, calendar boundaries placed around `around`, as a
/// batch of one.
async fn call_around(
    client: &Client,
    key: &str,
    limits: &[Limit],
    (debt, ask): (u64, Ask),
    deadline: Option<Timestamp>,
    (now, around): (Timestamp, Timestamp),
) -> Result<RawReply, String> {
    let args = CallArgs {
        key,
        limits,
        debt,
        ask,
        deadline,
        around,
    };
    let mut replies = call_many(client, &[args], now).await?;
    match (replies.pop(), replies.is_empty()) {
        (Some(reply), true) => Ok(reply),
        _ => Err(format!("{} replies to one call", replies.len() + 1)),
    }
}

/// `tollgate_apply_many` of `calls` at the instant `now`: their replies, in their order.
async fn call_many(
    client: &Client,
    calls: &[CallArgs<'_>],
    now: Timestamp,
) -> Result<Vec<RawReply>, String> {
    let many = ManyArgs::new(calls.iter().map(|call| ApplyArgs::new("", call)).collect());
    let statement = client
        .prepare(CHECK_MANY)
        .await
        .map_err(|e| e.to_string())?;
    let rows = many
        .run(client, &statement, signed(now.as_micros()))
        .await
        .map_err(|e| e.to_string())?;
    in_call_order(rows, calls.len())
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|numbers| RawReply::from_numbers(numbers).map_err(|e| e.to_string()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_function_answers_as_the_algorithms_do(
        limits in limits(),
        history in prop::collection::vec(operation(), 1..40),
        phase_us in 0u64..YEAR_US,
    ) {
        let rt = runtime();
        let client = rt.block_on(connect());
        let key = format!("differential:{}", fresh_key());
        replay(&limits, &history, phase_us, |debt, ask, now, around| {
            rt.block_on(call_around(&client, &key, &limits, (debt, ask), None, (now, around)))
        })?;
    }

    /// Calls on a few counters (each with its own limits), in one statement, answer as
    /// the same calls one at a time in the order the function runs them: by key, then in
    /// their order.
    #[test]
    fn a_batch_answers_as_its_calls_one_at_a_time(
        counters in prop::collection::vec(limits(), 3),
        calls in prop::collection::vec((0usize..3, operation()), 1..24),
        phase_us in 0u64..YEAR_US,
    ) {
        let rt = runtime();
        let client = rt.block_on(connect());
        let base = format!("batch:{}", fresh_key());
        let now = Timestamp::from_micros(1_790_000_000_000_000 + phase_us);
        let asks: Vec<(usize, u64, Ask)> = calls
            .iter()
            .map(|&(counter, (_, debt, asked))| {
                let ask = match asked {
                    Asked::Now(ask) => ask,
                    Asked::GiveBack { units, ago } => Ask::GiveBack { units, taken: now - ago },
                };
                (counter, debt, ask)
            })
            .collect();
        let keys = |side: &str| -> Vec<String> {
            (0..counters.len()).map(|c| format!("{base}:{side}:{c}")).collect()
        };
        let (batched, alone) = (keys("a"), keys("b"));
        let args: Vec<CallArgs<'_>> = asks
            .iter()
            .map(|&(counter, debt, ask)| CallArgs {
                key: &batched[counter],
                limits: &counters[counter],
                debt,
                ask,
                deadline: None,
                around: now,
            })
            .collect();
        let replies = rt.block_on(call_many(&client, &args, now)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(replies.len(), asks.len());
        let mut order: Vec<usize> = (0..asks.len()).collect();
        order.sort_by_key(|&i| asks[i].0);
        for i in order {
            let (counter, debt, ask) = asks[i];
            let one = rt
                .block_on(call_around(
                    &client,
                    &alone[counter],
                    &counters[counter],
                    (debt, ask),
                    None,
                    (now, now),
                ))
                .map_err(TestCaseError::fail)?;
            prop_assert_eq!(&replies[i], &one, "call {} of {:?}", i, asks);
        }
    }
}

/// A row written before version 6 (no sub-windows' ends) still counts after the
/// migration, as that version counted it (see [`read_after_upgrade`]).
#[test]
fn a_row_stored_before_ends_were_kept_still_counts() {
    let rt = runtime();
    let client = rt.block_on(connect());
    let at = Timestamp::from_micros(1_790_000_000_250_000);
    let (limits, state) = stored_before_ends(at);
    let key = format!("upgrade:{}", fresh_key());
    let state: Vec<i64> = state.into_iter().map(signed).collect();
    let stored = rt.block_on(client.execute(
        "INSERT INTO tollgate_counters (key, shape, state, expires_us) \
         VALUES ($1, 's10,', $2, 0)",
        &[&key, &state],
    ));
    assert!(stored.is_ok(), "{stored:?}");
    let read = read_after_upgrade(at, |hits, now| {
        rt.block_on(call(&client, &key, &limits, (0, hits), None, now))
    });
    assert_eq!(read, Ok(()));
}

/// A bucket never admits a request of more units than its burst, as the algorithm
/// (see [`a_hit_past_the_burst_is_refused`]).
#[test]
fn a_hit_past_the_burst_is_never_admitted() {
    let rt = runtime();
    let client = rt.block_on(connect());
    let refused = a_hit_past_the_burst_is_refused(|key, limits, hits, now| {
        rt.block_on(call(&client, key, limits, (0, hits), None, now))
    });
    assert_eq!(refused, Ok(()));
}

fn one_per_second() -> Vec<Limit> {
    vec![Limit::new(5, crate::unit::Unit::Second)]
}

#[test]
fn a_late_call_changes_nothing_and_denials_leave_no_row() {
    runtime().block_on(async {
        let client = connect().await;
        let key = format!("late:{}", fresh_key());
        let limits = one_per_second();
        let now = Timestamp::from_micros(1_790_000_000_000_000);
        let late = call(
            &client,
            &key,
            &limits,
            (1, Hits::Consume(1)),
            Some(now - Duration::from_micros(1)),
            now,
        )
        .await
        .expect("a late call");
        assert_eq!(
            late,
            RawReply {
                flag: -1,
                now_us: 1_790_000_000_000_000,
                state: vec![]
            }
        );
        // Denied (6 > 5): nothing stored, not even the empty row the lock needed.
        let denied = call(&client, &key, &limits, (0, Hits::Consume(6)), None, now)
            .await
            .expect("a denied call");
        assert_eq!(denied.flag, 0);
        let rows: i64 = client
            .query_one(
                "SELECT count(*) FROM tollgate_counters WHERE key = $1",
                &[&key],
            )
            .await
            .expect("count rows")
            .get(0);
        assert_eq!(rows, 0);
    });
}

#[test]
fn the_sweep_deletes_expired_counters_only() {
    runtime().block_on(async {
        // The histories replayed by the other tests are long expired on the database's
        // clock: a sweep of their database would delete them under their feet.
        let client = fresh_schema("sweep").await;
        let prefix = format!("sweep:{}:", fresh_key());
        let limits = one_per_second();
        let now_us: i64 = client
            .query_one("SELECT tollgate_now_us()", &[])
            .await
            .expect("the clock")
            .get(0);
        let now = Timestamp::from_micros(u64::try_from(now_us).expect("a clock after 1970"));
        // Counted a minute ago: long expired. Counted now: expires in a second.
        for (name, at) in [("old", now - Duration::from_secs(60)), ("new", now)] {
            call(
                &client,
                &format!("{prefix}{name}"),
                &limits,
                (0, Hits::Consume(1)),
                None,
                at,
            )
            .await
            .expect("count");
        }
        let swept: i32 = client
            .query_one("SELECT tollgate_sweep(100000)", &[])
            .await
            .expect("sweep")
            .get(0);
        assert!(swept >= 1, "swept {swept}");
        let left: Vec<String> = client
            .query(
                "SELECT key FROM tollgate_counters WHERE key LIKE $1 ORDER BY key",
                &[&format!("{prefix}%")],
            )
            .await
            .expect("list rows")
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(left, vec![format!("{prefix}new")]);
    });
}

#[test]
fn a_newer_schema_is_refused_and_migration_is_idempotent() {
    runtime().block_on(async {
        let mut client = connect().await;
        let again = schema::migrate(&mut client, false, None).await;
        assert!(
            matches!(again, Ok(found) if found == schema::SCHEMA_VERSION),
            "{again:?}"
        );
        // Another database, so that the shared one keeps its version.
        let mut newer = fresh_database("newer").await;
        let first = schema::migrate(&mut newer, true, None).await;
        assert!(matches!(first, Ok(0)), "{first:?}");
        let unlogged: bool = newer
            .query_one(
                "SELECT relpersistence = 'u' FROM pg_class WHERE relname = 'tollgate_counters'",
                &[],
            )
            .await
            .expect("persistence")
            .get(0);
        assert!(unlogged);
        newer
            .batch_execute("INSERT INTO tollgate_schema (version) VALUES (99)")
            .await
            .expect("pretend a newer Tollgate ran");
        let refused = schema::migrate(&mut newer, true, None).await.unwrap_err();
        assert!(
            matches!(refused, schema::SchemaError::Newer { found: 99 }),
            "{refused:?}"
        );
        let refused = refused.to_string();
        assert!(refused.contains("version 99, newer"), "{refused}");
    });
}

/// Each piece of the schema dropped by hand from a database at the current version, the
/// counting function the current version calls among them: the next migration sees the
/// piece missing and runs the file again.
#[test]
fn a_migration_repairs_any_missing_piece_of_the_current_schema() {
    runtime().block_on(async {
        let mut client = fresh_schema("repair").await;
        let pieces = [
            ("table", "tollgate_counters"),
            ("table", "tollgate_overrides"),
            ("table", "tollgate_override_meta"),
            ("table", "tollgate_override_tombstones"),
            (
                "function",
                "tollgate_override_change(text, text, text, bigint, bigint, text)",
            ),
            ("function", "tollgate_override_log(text, bigint, integer)"),
            ("function", "tollgate_override_of(text, text)"),
            // The batch this Tollgate calls, the signature it runs (version 4's), then the
            // wrappers of 3 and 2.
            (
                "function",
                "tollgate_apply_many(text[], text[], bigint[], bigint[], bigint[], bigint, \
                 text[], bigint[], bigint[], bigint[], bigint[], bigint[])",
            ),
            (
                "function",
                "tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, bigint[], \
                 bigint[], bigint[], bigint[], bigint)",
            ),
            (
                "function",
                "tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, bigint[], \
                 bigint[], bigint[], bigint[])",
            ),
            (
                "function",
                "tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, bigint[], \
                 bigint[], bigint[])",
            ),
            ("function", "tollgate_now_us()"),
            ("function", "tollgate_sweep(integer)"),
        ];
        for (kind, piece) in pieces {
            client
                .batch_execute(&format!("DROP {kind} {piece}"))
                .await
                .unwrap_or_else(|e| panic!("drop {piece}: {e}"));
            let found = schema::migrate(&mut client, false, None).await;
            assert!(
                matches!(found, Ok(v) if v == schema::SCHEMA_VERSION),
                "{piece}: {found:?}"
            );
            let regclass = if kind == "table" {
                "regclass"
            } else {
                "regprocedure"
            };
            let back: bool = client
                .query_one(&format!("SELECT to_{regclass}($1) IS NOT NULL"), &[&piece])
                .await
                .expect("look the piece up")
                .get(0);
            assert!(
                back,
                "{piece} was dropped and not repaired by the migration"
            );
        }
    });
}
