//! The versioned schema: `schema.sql`, whose every statement is idempotent, run under an
//! advisory lock so that instances starting together do not race, whenever the database
//! is at an earlier version. The version lives in `tollgate_schema`; a database newer
//! than this Tollgate is refused, never downgraded.
//!
//! Versions: 1 `tollgate_check_and_count`; 2 `tollgate_apply`, which charges a debt before
//! the hits (1's function stays, for the instances of a rolling upgrade); 3 calendar
//! windows: `tollgate_apply` takes their boundaries (2's signature calls it without); 4
//! leases: `tollgate_apply` takes and gives back blocks, with one extra number (3's
//! signature calls it with none); 5 stored numbers held at 2^53 − 1, as in the Redis
//! script, where a charge made a bigint overflow; 6 sliding windows keep where each
//! sub-window's last hit landed, one more number per sub-window after every limit's
//! (rows written before are read as before, their sub-windows ending at their ends;
//! instances of version 5 read the new rows, ignoring what follows their limits); 7
//! in-flight counters: `tollgate_slots` of `slots.sql`, run after `schema.sql`; 8
//! runtime overrides: the table `tollgate_overrides` of `overrides.sql`, run last; 9
//! batched calls: `tollgate_apply_many` runs many calls of version 4's signature in one
//! statement (instances of version 8 keep calling that signature alone); 10 a bucket
//! refuses a request of more units than its burst, whose span could round to the burst's;
//! 11 `tollgate_slots` takes a debt, slots admitted without the database (10's signature
//! calls it with none); 12 the overrides' change log: each row's version and expiry,
//! tombstones, a meta row per key prefix, kept by triggers (so that earlier versions'
//! writes are logged too), and the functions that change and read them.
//!
//! A database at the current version missing any piece of it (the counter table or any
//! of its functions, dropped by hand) is repaired: the file is run again.

use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::describe::describe;

/// The schema at [`SCHEMA_VERSION`], from any earlier version.
const SCHEMA: &str = concat!(
    include_str!("schema.sql"),
    include_str!("slots.sql"),
    include_str!("overrides.sql")
);

/// The version this Tollgate writes and reads.
pub const SCHEMA_VERSION: i32 = 12;

/// Whether every piece the schema makes is there: the counter and override tables, the counting
/// functions this version calls, the older signatures kept for a rolling upgrade's
/// instances, the clock and the sweep. Any one missing runs the file again.
const COMPLETE: &str = "SELECT to_regclass('tollgate_counters') IS NOT NULL \
     AND to_regclass('tollgate_overrides') IS NOT NULL \
     AND to_regclass('tollgate_override_meta') IS NOT NULL \
     AND to_regclass('tollgate_override_tombstones') IS NOT NULL \
     AND to_regprocedure('tollgate_override_change(text, text, text, bigint, bigint, text)') \
     IS NOT NULL \
     AND to_regprocedure('tollgate_override_log(text, bigint, integer)') IS NOT NULL \
     AND to_regprocedure('tollgate_override_of(text, text)') IS NOT NULL \
     AND to_regprocedure('tollgate_apply_many(text[], text[], bigint[], bigint[], bigint[], \
     bigint, text[], bigint[], bigint[], bigint[], bigint[], bigint[])') IS NOT NULL \
     AND to_regprocedure('tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, \
     bigint[], bigint[], bigint[], bigint[], bigint)') IS NOT NULL \
     AND to_regprocedure('tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, \
     bigint[], bigint[], bigint[], bigint[])') IS NOT NULL \
     AND to_regprocedure('tollgate_apply(text, text, bigint, bigint, bigint, bigint, text, \
     bigint[], bigint[], bigint[])') IS NOT NULL \
     AND to_regprocedure('tollgate_slots(text, text, bigint, bigint, bigint, bigint)') \
     IS NOT NULL \
     AND to_regprocedure('tollgate_slots(text, text, bigint, bigint, bigint, bigint, \
     bigint)') IS NOT NULL \
     AND to_regprocedure('tollgate_now_us()') IS NOT NULL \
     AND to_regprocedure('tollgate_sweep(integer)') IS NOT NULL";

/// Any fixed number, the same in every Tollgate: the advisory lock of migrations.
const MIGRATION_LOCK: i64 = 0x746f_6c6c_6761_7465;

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// A statement of the migration failed.
    #[error("migrating the schema: {}", describe(.0))]
    Db(#[source] tokio_postgres::Error),
    /// A statement of the migration ran past its limit: the wait for another instance's
    /// migration, or the rewrite of a large counter table.
    #[error(
        "the schema migration did not finish within {0:?} (another instance's migration \
         holding its lock, or tollgate_counters rewritten to switch POSTGRES_UNLOGGED, or a \
         session holding that table); it is tried again, and `tollgate migrate` runs it \
         with no time limit"
    )]
    TimedOut(Duration),
    /// A newer Tollgate migrated the database; it is not downgraded.
    #[error(
        "the database's schema is version {found}, newer than this Tollgate's \
         ({SCHEMA_VERSION}); run a Tollgate at least as new"
    )]
    Newer {
        /// The database's version.
        found: i32,
    },
}

/// Brings the schema to [`SCHEMA_VERSION`], makes the counter table logged or unlogged as
/// asked, and returns the version found before. Each of its statements may run for
/// `limit` (none: no limit), whatever the connection's `statement_timeout`: waiting for
/// another instance's migration, or rewriting a large table, takes longer than a request.
pub(super) async fn migrate(
    client: &mut Client,
    unlogged: bool,
    limit: Option<Duration>,
) -> Result<i32, SchemaError> {
    let db = |e: tokio_postgres::Error| match limit {
        Some(limit) if e.code() == Some(&SqlState::QUERY_CANCELED) => SchemaError::TimedOut(limit),
        _ => SchemaError::Db(e),
    };
    let tx = client.transaction().await.map_err(db)?;
    // `IF NOT EXISTS` on what exists is a NOTICE; the log has no use for it. LOCAL: the
    // connection goes on to serve requests, under their own timeout.
    let timeout_ms = limit.map_or(0, |limit| limit.as_millis());
    tx.batch_execute(&format!(
        "SET LOCAL client_min_messages = warning; SET LOCAL statement_timeout = {timeout_ms}"
    ))
    .await
    .map_err(db)?;
    let free: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(db)?
        .get(0);
    if !free {
        let most = limit.map_or_else(
            || "no limit".to_owned(),
            |limit| format!("{limit:?} at most"),
        );
        tracing::info!("postgres schema: waiting for another instance's migration ({most})");
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS tollgate_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(db)?;
    let found: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM tollgate_schema", &[])
        .await
        .map_err(db)?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(SchemaError::Newer { found });
    }
    let complete: bool = tx.query_one(COMPLETE, &[]).await.map_err(db)?.get(0);
    if found < SCHEMA_VERSION {
        tx.batch_execute(SCHEMA).await.map_err(db)?;
        tx.execute(
            "INSERT INTO tollgate_schema (version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(db)?;
        tracing::info!("postgres schema migrated from version {found} to {SCHEMA_VERSION}");
    } else if !complete {
        tx.batch_execute(SCHEMA).await.map_err(db)?;
        tracing::warn!(
            "postgres schema repaired: version {found}, but part of it (tollgate_counters \
             or one of its functions) was missing (dropped?), so it was created again"
        );
    }
    let is_unlogged: bool = tx
        .query_one(
            "SELECT relpersistence = 'u' FROM pg_class WHERE oid = 'tollgate_counters'::regclass",
            &[],
        )
        .await
        .map_err(db)?
        .get(0);
    if is_unlogged != unlogged {
        // Rewrites the table under an exclusive lock: fine for counters, and only on change.
        let to = if unlogged { "UNLOGGED" } else { "LOGGED" };
        // Said before, since a large table takes a while.
        tracing::info!("postgres counter table: rewriting it to set it {to}");
        tx.batch_execute(&format!("ALTER TABLE tollgate_counters SET {to}"))
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(found)
}
