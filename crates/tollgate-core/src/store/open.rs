//! Where a shared store is put together: the local view, ledger and leases of
//! `SharedStore` in front of a Redis or PostgreSQL backend. The one module that names both
//! sides; neither side names the other.

use std::sync::Arc;
use std::time::Duration;

use super::shared::SharedStore;
use crate::clock::Clock;

#[cfg(feature = "postgres")]
use super::postgres::{PgBackend, PgConfig, TlsError};
#[cfg(feature = "redis")]
use super::redis::{RedisBackend, RedisConfig};

impl SharedStore {
    /// A store in Redis, connecting in the background (on the current tokio runtime);
    /// requests are decided per `on_error` until Redis answers.
    #[cfg(feature = "redis")]
    pub fn redis(config: RedisConfig, clock: Arc<dyn Clock>, sweep_period: Duration) -> Arc<Self> {
        let behaviour = config.behaviour;
        let backend = |time| Box::new(RedisBackend::start(config, time)) as _;
        Self::start(backend, behaviour, clock, sweep_period)
    }

    /// A store in PostgreSQL, connecting in the background (on the current tokio
    /// runtime); requests are decided per `on_error` until PostgreSQL answers. Fails only
    /// on TLS files that cannot be read.
    #[cfg(feature = "postgres")]
    pub fn postgres(
        config: PgConfig,
        clock: Arc<dyn Clock>,
        sweep_period: Duration,
    ) -> Result<Arc<Self>, TlsError> {
        let tls = config.target.tls_connector()?;
        let behaviour = config.behaviour;
        let backend = |time| Box::new(PgBackend::start(config, tls, time)) as _;
        Ok(Self::start(backend, behaviour, clock, sweep_period))
    }
}
