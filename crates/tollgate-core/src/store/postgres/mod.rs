//! The PostgreSQL store: counters in one table, checked and counted by one function call
//! in the database's clock, behind the local view of [`super::shared`] (denials stay
//! local, as with Redis). For teams that run PostgreSQL and would rather not run Redis
//! for rate limits alone.

mod connect;
#[cfg(test)]
mod differential;
mod schema;
mod tls;

pub use connect::PgTarget;
pub use schema::SCHEMA_VERSION;
pub use tls::{PgTls, SslMode};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use self::connect::{PgConnector, describe};
use super::shared::link::{Health, Link};
use super::shared::protocol::{Ask, NANOS_PER_MICRO, limit_args, mode};
use super::shared::{Backend, SharedBehaviour, SharedStore, Trip, TripError};
use crate::clock::Clock;
use crate::limit::Limit;

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

impl SharedStore {
    /// A store in PostgreSQL, connecting in the background (on the current tokio
    /// runtime); requests are decided per `on_error` until PostgreSQL answers. Fails only
    /// on TLS files that cannot be read.
    pub fn postgres(
        config: PgConfig,
        clock: Arc<dyn Clock>,
        sweep_period: Duration,
    ) -> Result<Arc<Self>, String> {
        let tls = config.target.tls_connector()?;
        let behaviour = config.behaviour;
        let sweep_interval = config.sweep_interval;
        let backend = |time| {
            let connector = PgConnector {
                target: config.target,
                tls,
                pool_size: config.pool_size.max(1),
                statement_timeout: config.statement_timeout,
                unlogged: config.unlogged,
                migrated: AtomicBool::new(false),
            };
            let link = Link::start(connector, time);
            tokio::spawn(sweeper(Arc::downgrade(&link), sweep_interval));
            Backend::Postgres(PgBackend {
                link,
                key_prefix: config.key_prefix,
            })
        };
        Ok(Self::start(backend, behaviour, clock, sweep_period))
    }
}

/// Creates or updates the schema at `target` (`tollgate migrate`); the version found
/// before.
pub async fn migrate(target: &PgTarget, unlogged: bool) -> Result<i32, String> {
    let connector = PgConnector {
        target: target.clone(),
        tls: target.tls_connector()?,
        pool_size: 1,
        statement_timeout: Duration::ZERO,
        unlogged,
        migrated: AtomicBool::new(false),
    };
    let mut client = connector.open().await?;
    schema::migrate(&mut client, unlogged).await
}

/// One function call per round trip over a pooled connection.
pub(crate) struct PgBackend {
    link: Arc<Link<PgConnector>>,
    key_prefix: String,
}

impl PgBackend {
    pub(crate) fn health(&self) -> &Health {
        &self.link.health
    }

    /// One `tollgate_apply`, owning all it needs; it changes nothing if it runs after
    /// `deadline_ns` (database time).
    pub(crate) fn check_and_count(
        &self,
        key: &str,
        limits: &[Limit],
        (debt, ask): (u64, Ask),
        deadline_ns: u64,
        around_ns: u64,
    ) -> Trip {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let (mode, n, extra) = mode(ask);
        let (kinds, windows, params, rpus, bounds) = limit_arrays(limits, around_ns);
        let key = format!("{}{key}", self.key_prefix);
        let deadline_us = signed(deadline_ns / NANOS_PER_MICRO);
        let link = self.link.clone();
        Box::pin(async move {
            let conn = pool.pick();
            let row = conn
                .client
                .query_one(
                    &conn.check,
                    &[
                        &key,
                        &mode,
                        &signed(n),
                        &signed(debt),
                        &deadline_us,
                        &kinds,
                        &windows,
                        &params,
                        &rpus,
                        &bounds,
                        &signed(extra),
                    ],
                )
                .await
                .map_err(|e| classify(&link, e))?;
            row.try_get(0).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }
}

fn classify(link: &Link<PgConnector>, e: tokio_postgres::Error) -> TripError {
    let lost = match e.code() {
        Some(code) if *code == SqlState::QUERY_CANCELED => return TripError::Timeout,
        // Connection exceptions, a server shutting down or starting, or a standby
        // (a former primary after a failover) that cannot write.
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::READ_ONLY_SQL_TRANSACTION,
                ]
                .contains(code)
        }
        None => true,
    };
    if lost {
        link.health.report_down(&describe(&e));
        TripError::Lost(Arc::new(e))
    } else {
        TripError::Failed(Arc::new(e))
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The limits as the function's arrays (see `limit_args`).
type LimitArrays = (String, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>);

/// The limits as the function's arrays: kind letters, windows, params, limits, and three
/// calendar boundaries per limit, placed around the store time `around_ns`.
fn limit_arrays(limits: &[Limit], around_ns: u64) -> LimitArrays {
    let mut kinds = String::with_capacity(limits.len());
    let mut windows = Vec::with_capacity(limits.len());
    let mut params = Vec::with_capacity(limits.len());
    let mut rpus = Vec::with_capacity(limits.len());
    let mut bounds = Vec::with_capacity(3 * limits.len());
    for limit in limits {
        let (kind, window_us, param, rpu, bounds_us) = limit_args(limit, around_ns);
        kinds.push_str(kind);
        windows.push(signed(window_us));
        params.push(i64::from(param));
        rpus.push(i64::from(rpu));
        bounds.extend(bounds_us.map(signed));
    }
    (kinds, windows, params, rpus, bounds)
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
