//! The PostgreSQL store: counters in one table, checked and counted by one function call
//! in the database's clock, behind the local view of [`super::shared`] (denials stay
//! local, as with Redis). For teams that run PostgreSQL and would rather not run Redis
//! for rate limits alone.

mod apply;
mod batch;
mod classify;
mod connect;
mod describe;
#[cfg(test)]
mod differential;
mod listen;
#[cfg(test)]
mod override_log_tests;
mod override_statements;
mod schema;
mod target_error;
mod tls;

pub use connect::{PgError, PgTarget};
pub use schema::{SCHEMA_VERSION, SchemaError};
pub use target_error::TargetError;
pub use tls::{PgTls, SslMode, TlsError};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use self::apply::{ApplyArgs, signed};
use self::batch::Statements;
use self::classify::classify;
use self::connect::PgConnector;
use self::describe::describe;
use self::override_statements::ALL_OVERRIDES;
use super::shared::SharedBehaviour;
use super::shared::announce::{Subscribe, announcement};
use super::shared::backend::{
    Backend, CallArgs, LogRead, OverrideChange, Pending, Sending, Trip, TripError, Written,
};
use super::shared::batch::Batcher;
use super::shared::link::{Health, Link, TimeSink};
use super::shared::protocol::RawReply;
use super::shared::slot_call::SlotCall;

/// How a PostgreSQL store is set up.
#[derive(Debug, Clone)]
pub struct PgConfig {
    /// Where PostgreSQL is.
    pub target: PgTarget,
    /// Connections kept open; each carries many requests' calls at once.
    pub pool_size: usize,
    /// Longest one statement may run in the database (`statement_timeout`).
    pub statement_timeout: Duration,
    /// Keep counters in an unlogged table: faster writes, emptied after a crash.
    pub unlogged: bool,
    /// How often expired counters are deleted.
    pub sweep_interval: Duration,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Timeout, failure mode and local view.
    pub behaviour: SharedBehaviour,
}

/// Expired counters deleted per statement, so that no sweep holds many row locks.
const SWEEP_BATCH: i32 = 1_000;

/// Creates or updates the schema at `target` (`tollgate migrate`); the version found
/// before.
pub async fn migrate(target: &PgTarget, unlogged: bool) -> Result<i32, PgError> {
    let connector = PgConnector {
        target: target.clone(),
        tls: target.tls_connector()?,
        pool_size: 1,
        statement_timeout: Duration::ZERO,
        unlogged,
        migrated: AtomicBool::new(false),
        key_prefix: String::new(),
        closed: Arc::default(),
    };
    let mut client = connector.open().await?;
    Ok(schema::migrate(&mut client, unlogged, None).await?)
}

/// Function calls over pooled connections, the calls of concurrent requests batched into
/// one statement.
pub(crate) struct PgBackend {
    link: Arc<Link<PgConnector>>,
    batcher: Batcher<Statements>,
    key_prefix: String,
    /// The channel resets are announced on, named from the key prefix.
    resets: String,
    /// Where the reset listener connects, on a connection of its own.
    subscriber: Arc<(PgTarget, Option<tokio_postgres_rustls::MakeRustlsConnect>)>,
}

/// Deletes a counter and announces it, in one statement.
const RESET: &str =
    "WITH gone AS (DELETE FROM tollgate_counters WHERE key = $1) SELECT pg_notify($2, $3)";

impl PgBackend {
    /// The backend of `config` over `tls`, connecting in the background (on the current
    /// tokio runtime), telling `time` the store's clock, and sweeping expired counters.
    pub(crate) fn start(
        config: PgConfig,
        tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
        time: TimeSink,
    ) -> Self {
        let subscriber = Arc::new((config.target.clone(), tls.clone()));
        let pool_size = config.pool_size.max(1);
        let connector = PgConnector {
            target: config.target,
            tls,
            pool_size,
            statement_timeout: config.statement_timeout,
            unlogged: config.unlogged,
            migrated: AtomicBool::new(false),
            key_prefix: config.key_prefix.clone(),
            closed: Arc::default(),
        };
        let link = Link::start(connector, time);
        tokio::spawn(sweeper(Arc::downgrade(&link), config.sweep_interval));
        // A connection runs one statement at a time: one batch out per connection.
        let statements = Statements { link: link.clone() };
        Self {
            batcher: Batcher::start(statements, pool_size, config.behaviour.timeout),
            link,
            resets: listen::channel(&config.key_prefix),
            key_prefix: config.key_prefix,
            subscriber,
        }
    }
}

impl Backend for PgBackend {
    fn health(&self) -> &Health {
        &self.link.health
    }

    /// One call in the next batch's `tollgate_apply_many`, owning all it needs; it
    /// changes nothing if it runs after `deadline` (database time).
    fn check_and_count(&self, args: &CallArgs<'_>) -> Trip {
        if self.link.conn().is_none() {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        }
        let args = ApplyArgs::new(&self.key_prefix, args);
        let batcher = self.batcher.clone();
        Box::pin(async move {
            let numbers = batcher.call(args).await?;
            RawReply::from_numbers(numbers).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    fn span(&self, limits: usize) -> tracing::Span {
        tracing::debug_span!("PostgreSQL round trip", limits)
    }

    /// One `tollgate_slots` on the counter's row (its key after the prefix).
    fn slots(&self, call: SlotCall) -> Trip {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let key = format!("{}{}", self.key_prefix, call.key);
        let numbers = [
            call.n,
            call.max,
            call.expire_after_us,
            call.deadline_us,
            call.debt,
        ]
        .map(signed);
        let link = self.link.clone();
        Box::pin(async move {
            let conn = pool.pick();
            let [n, max, expire, deadline, debt] = &numbers;
            let row = conn
                .client
                .query_one(
                    &conn.slots,
                    &[&key, &call.mode, n, max, expire, deadline, debt],
                )
                .await
                .map_err(|e| classify(&link, e))?;
            let numbers: Vec<i64> = row.try_get(0).map_err(|e| TripError::Failed(Arc::new(e)))?;
            RawReply::from_numbers(numbers).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// Deletes the counter's row and NOTIFYs its key on the reset channel.
    fn reset(&self, key: &str) -> Sending {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let stored = format!("{}{key}", self.key_prefix);
        let (channel, announced) = (self.resets.clone(), announcement(key).to_owned());
        let link = self.link.clone();
        Box::pin(async move {
            pool.pick()
                .client
                .execute(RESET, &[&stored, &channel, &announced])
                .await
                .map_err(|e| classify(&link, e))?;
            Ok(())
        })
    }

    /// A NOTIFY of `announced` on the reset channel.
    fn announce(&self, announced: String) -> Sending {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let channel = self.resets.clone();
        let link = self.link.clone();
        Box::pin(async move {
            pool.pick()
                .client
                .execute("SELECT pg_notify($1, $2)", &[&channel, &announced])
                .await
                .map_err(|e| classify(&link, e))?;
            Ok(())
        })
    }

    /// A LISTEN to the reset channel on a connection of its own.
    fn subscription(&self) -> Subscribe {
        let (target, tls) = (*self.subscriber).clone();
        listen::subscription(target, tls, self.resets.clone())
    }

    /// `tollgate_override_log`: the log after `since` (its JSON not bounded in bytes:
    /// each override's is).
    fn override_log(&self, since: u64, most: usize, _most_bytes: usize) -> Pending<LogRead> {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (prefix, link) = (self.key_prefix.clone(), self.link.clone());
        let (since, rows) = (signed(since), i32::try_from(most).unwrap_or(i32::MAX));
        Box::pin(async move {
            let conn = pool.pick();
            let row = conn
                .client
                .query_one(&conn.override_log, &[&prefix, &since, &rows])
                .await
                .map_err(|e| classify(&link, e))?;
            log_read(&row, most).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// The rows of `tollgate_overrides` under the key prefix, in the order of their ids.
    fn all_overrides(&self, most: usize) -> Pending<Vec<(String, String)>> {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (prefix, link) = (self.key_prefix.clone(), self.link.clone());
        let most = i64::try_from(most).unwrap_or(i64::MAX);
        Box::pin(async move {
            let rows = pool
                .pick()
                .client
                .query(ALL_OVERRIDES, &[&prefix, &most])
                .await
                .map_err(|e| classify(&link, e))?;
            rows.iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
                .collect::<Result<_, tokio_postgres::Error>>()
                .map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// `tollgate_override_of`, which waits for a change of the prefix under way.
    fn override_of(&self, id: &str) -> Pending<Option<String>> {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (prefix, id, link) = (self.key_prefix.clone(), id.to_owned(), self.link.clone());
        Box::pin(async move {
            let conn = pool.pick();
            let row = conn
                .client
                .query_one(&conn.override_of, &[&prefix, &id])
                .await
                .map_err(|e| classify(&link, e))?;
            row.try_get(0).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// `tollgate_override_change`, announced by its trigger.
    fn change_override(&self, change: OverrideChange<'_>) -> Pending<Written> {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (prefix, channel, link) = (
            self.key_prefix.clone(),
            self.resets.clone(),
            self.link.clone(),
        );
        let id = change.id.to_owned();
        let spec = change.set.map(|(spec, _)| spec.to_owned());
        let max = signed(change.max);
        let deadline = signed(change.deadline.as_micros().max(1));
        Box::pin(async move {
            let conn = pool.pick();
            let row = conn
                .client
                .query_one(
                    &conn.override_change,
                    &[&prefix, &id, &spec, &max, &deadline, &channel],
                )
                .await
                .map_err(|e| classify(&link, e))?;
            let reply: Vec<Option<String>> =
                row.try_get(0).map_err(|e| TripError::Failed(Arc::new(e)))?;
            written(&reply)
        })
    }
}

/// A row of `tollgate_override_log`, read for at most `most` changes.
fn log_read(row: &tokio_postgres::Row, most: usize) -> Result<LogRead, tokio_postgres::Error> {
    let versions: Vec<i64> = row.try_get("versions")?;
    let ids: Vec<String> = row.try_get("ids")?;
    let specs: Vec<Option<String>> = row.try_get("specs")?;
    let version = unsigned(row.try_get("version")?);
    Ok(LogRead {
        epoch: row.try_get("epoch")?,
        version,
        trimmed: unsigned(row.try_get("trimmed")?),
        upto: versions.last().map_or(version, |v| unsigned(*v)),
        complete: versions.len() < most,
        changed: ids.into_iter().zip(specs).collect(),
    })
}

/// A version as stored (never negative).
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A reply of `tollgate_override_change`.
fn written(reply: &[Option<String>]) -> Result<Written, TripError> {
    let word = |i: usize| reply.get(i).and_then(Option::as_deref);
    match word(0) {
        Some("late") => Ok(Written::Late),
        Some("full") => match word(1).and_then(|n| n.parse().ok()) {
            Some(live) => Ok(Written::Full(live)),
            None => Err(bad_reply(reply)),
        },
        Some("set" | "deleted") => Ok(Written::Done(word(1).map(str::to_owned))),
        _ => Err(bad_reply(reply)),
    }
}

/// A reply `tollgate_override_change` should not have made.
#[derive(Debug, thiserror::Error)]
#[error("tollgate_override_change answered {0:?}")]
struct BadReply(Vec<Option<String>>);

fn bad_reply(reply: &[Option<String>]) -> TripError {
    TripError::Failed(Arc::new(BadReply(reply.to_vec())))
}

/// Deletes expired counters every `interval`, in batches, while PostgreSQL answers.
async fn sweeper(link: std::sync::Weak<Link<PgConnector>>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(pool) = link.upgrade().and_then(|link| link.conn()) else {
            if link.strong_count() == 0 {
                return;
            }
            continue;
        };
        let client = &pool.pick().client;
        let mut swept = 0;
        loop {
            match client
                .query_one("SELECT tollgate_sweep($1)", &[&SWEEP_BATCH])
                .await
                .and_then(|row| row.try_get::<_, i32>(0))
            {
                Ok(n) => {
                    swept += n;
                    if n < SWEEP_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!("postgres sweep failed: {}", describe(&e));
                    break;
                }
            }
        }
        tracing::debug!(swept, "expired postgres counters deleted");
    }
}
