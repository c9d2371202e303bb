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
use super::shared::SharedBehaviour;
use super::shared::announce::{OVERRIDES, Subscribe, announcement};
use super::shared::backend::{Backend, CallArgs, Reading, Sending, Trip, TripError};
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

/// Sets an override of the key prefix and announces it, in one statement.
const SET_OVERRIDE: &str = "WITH put AS (INSERT INTO tollgate_overrides (prefix, id, spec) \
     VALUES ($1, $2, $3) ON CONFLICT (prefix, id) DO UPDATE SET spec = excluded.spec, \
     updated_at = now()) SELECT pg_notify($4, $5)";

/// Deletes an override of the key prefix and announces it, in one statement.
const DELETE_OVERRIDE: &str = "WITH gone AS (DELETE FROM tollgate_overrides \
     WHERE prefix = $1 AND id = $2) SELECT pg_notify($3, $4)";

/// The overrides of the key prefix, at most a number of them, in the order of their ids.
const READ_OVERRIDES: &str =
    "SELECT spec FROM tollgate_overrides WHERE prefix = $1 ORDER BY id LIMIT $2";

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

    /// The rows of `tollgate_overrides` under the key prefix.
    fn overrides(&self, most: usize) -> Reading {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let prefix = self.key_prefix.clone();
        let most = i64::try_from(most).unwrap_or(i64::MAX);
        let link = self.link.clone();
        Box::pin(async move {
            let rows = pool
                .pick()
                .client
                .query(READ_OVERRIDES, &[&prefix, &most])
                .await
                .map_err(|e| classify(&link, e))?;
            rows.iter()
                .map(|row| row.try_get(0).map_err(|e| TripError::Failed(Arc::new(e))))
                .collect()
        })
    }

    /// An upsert of the override's row, and a NOTIFY of the change.
    fn set_override(&self, id: &str, spec: String) -> Sending {
        let id = id.to_owned();
        self.change_overrides(move |prefix, channel| {
            (
                SET_OVERRIDE,
                vec![prefix, id, spec, channel, OVERRIDES.to_owned()],
            )
        })
    }

    /// A delete of the override's row, and a NOTIFY of the change.
    fn delete_override(&self, id: &str) -> Sending {
        let id = id.to_owned();
        self.change_overrides(move |prefix, channel| {
            (
                DELETE_OVERRIDE,
                vec![prefix, id, channel, OVERRIDES.to_owned()],
            )
        })
    }
}

impl PgBackend {
    /// Runs the statement `change` makes of the key prefix and the reset channel.
    fn change_overrides(
        &self,
        change: impl FnOnce(String, String) -> (&'static str, Vec<String>),
    ) -> Sending {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (statement, params) = change(self.key_prefix.clone(), self.resets.clone());
        let link = self.link.clone();
        Box::pin(async move {
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
                .iter()
                .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            pool.pick()
                .client
                .execute(statement, &params)
                .await
                .map_err(|e| classify(&link, e))?;
            Ok(())
        })
    }
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
