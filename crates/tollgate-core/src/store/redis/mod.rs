//! The Redis store: counters in Redis (single node, Cluster or Sentinel), checked and
//! counted by one script call, behind the local view of [`super::shared`].

mod connect;
#[cfg(test)]
mod differential;
mod reference;
mod script;

pub use connect::{Credentials, RedisKind, RedisTarget, RedisTls, TargetError};
pub use reference::{ReferenceConfig, ReferenceStore};

use std::sync::Arc;
use std::time::Duration;

use self::connect::{Conn, RedisConnector};
use super::shared::link::{Health, Link};
use super::shared::{Backend, SharedBehaviour, SharedStore, Trip, TripError};
use crate::clock::Clock;
use crate::limit::Limit;
use crate::store::shared::protocol::Ask;

/// How a Redis store is set up.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// Where Redis is.
    pub target: RedisTarget,
    /// TLS beyond the defaults, for `rediss://` targets.
    pub tls: RedisTls,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Timeout, failure mode and local view.
    pub behaviour: SharedBehaviour,
}

impl SharedStore {
    /// A store in Redis, connecting in the background (on the current tokio runtime);
    /// requests are decided per `on_error` until Redis answers.
    pub fn redis(config: RedisConfig, clock: Arc<dyn Clock>, sweep_period: Duration) -> Arc<Self> {
        let behaviour = config.behaviour;
        let backend = |time| {
            let connector = RedisConnector {
                target: config.target,
                tls: config.tls,
            };
            Backend::Redis(RedisBackend {
                link: Link::start(connector, time),
                script: Arc::new(script::script()),
                key_prefix: config.key_prefix,
            })
        };
        Self::start(backend, behaviour, clock, sweep_period)
    }
}

/// One script call per round trip over the supervised connection.
pub(crate) struct RedisBackend {
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    key_prefix: String,
}

impl RedisBackend {
    pub(crate) fn health(&self) -> &Health {
        &self.link.health
    }

    /// One EVALSHA, owning all it needs; Redis ignores it if it runs after `deadline_ns`
    /// (Redis time).
    pub(crate) fn check_and_count(
        &self,
        key: &str,
        limits: &[Limit],
        (debt, ask): (u64, Ask),
        deadline_ns: u64,
        around_ns: u64,
    ) -> Trip {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let check = script::Check {
            key,
            limits,
            ask,
            debt,
            deadline_ns,
            now_ns: 0,
            around_ns,
        };
        let call = script::call(&self.script, &self.key_prefix, &check);
        let (script, link) = (self.script.clone(), self.link.clone());
        Box::pin(async move {
            let reply: script::ScriptReply = conn
                .eval(&call, &script)
                .await
                .map_err(|e| classify(&link, e))?;
            script::numbers(reply).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }
}

fn classify(link: &Link<RedisConnector>, e: redis::RedisError) -> TripError {
    let lost = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
    if lost {
        // Gone, or a former master after a failover: reconnect (and re-resolve).
        link.health.report_down(&e);
        TripError::Lost(Arc::new(e))
    } else {
        TripError::Failed(Arc::new(e))
    }
}
