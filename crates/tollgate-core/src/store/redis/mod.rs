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

use std::future::Future;
use std::pin::Pin;

use futures_util::StreamExt as _;

use self::connect::{Conn, RedisConnector, pubsub_client};
use super::shared::announce::{SUBSCRIBE_TIMEOUT, Subscribe, SubscribeError, announcement};
use super::shared::ledger::CallArgs;
use super::shared::link::{Health, Link};
use super::shared::{Backend, SharedBehaviour, SharedStore, Trip, TripError};
use crate::clock::{Clock, Timestamp};
use crate::log_limit::LogLimit;

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
            let script = Arc::new(script::script());
            let connector = RedisConnector {
                target: config.target.clone(),
                tls: config.tls.clone(),
                script: script.clone(),
                key_prefix: config.key_prefix.clone(),
            };
            Backend::Redis(RedisBackend {
                link: Link::start(connector, time),
                script,
                resets: format!("{}tollgate-reset", config.key_prefix),
                key_prefix: config.key_prefix,
                foreign_keys: Arc::new(LogLimit::new(FOREIGN_KEY_LOG_PERIOD)),
                subscriber: Arc::new(RedisConnector {
                    target: config.target,
                    tls: config.tls,
                    script: Arc::new(script::script()),
                    key_prefix: String::new(),
                }),
            })
        };
        Self::start(backend, behaviour, clock, sweep_period)
    }
}

/// Counter keys found holding another type are logged at most once per this period.
const FOREIGN_KEY_LOG_PERIOD: Duration = Duration::from_secs(60);

/// One script call per round trip over the supervised connection.
pub(crate) struct RedisBackend {
    link: Arc<Link<RedisConnector>>,
    script: Arc<redis::Script>,
    key_prefix: String,
    /// The channel resets are announced on, named from the key prefix.
    resets: String,
    /// Where subscriptions connect, on connections of their own.
    subscriber: Arc<RedisConnector>,
    /// Counter keys that held something else (a list, a hash), which the script replaced.
    foreign_keys: Arc<LogLimit>,
}

impl RedisBackend {
    pub(crate) fn health(&self) -> &Health {
        &self.link.health
    }

    /// One EVALSHA, owning all it needs; Redis ignores it if it runs after `deadline`
    /// (Redis time).
    pub(crate) fn check_and_count(&self, args: &CallArgs<'_>) -> Trip {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let check = script::Check {
            key: args.key,
            limits: args.limits,
            ask: args.ask,
            debt: args.debt,
            deadline: args.deadline,
            now: None,
            around: args.around,
        };
        let call = script::call(&self.script, &self.key_prefix, &check);
        let (script, link) = (self.script.clone(), self.link.clone());
        let foreign_keys = self.foreign_keys.clone();
        Box::pin(async move {
            let reply: script::ScriptReply = conn
                .eval(&call, &script)
                .await
                .map_err(|e| classify(&link, e))?;
            let (_, now_us, _, held) = &reply;
            if !held.is_empty()
                && let Some(more) =
                    foreign_keys.admit(Timestamp::from_micros(u64::try_from(*now_us).unwrap_or(0)))
            {
                tracing::warn!(
                    "redis counter {held}, not a counter: read as an empty counter and \
                     overwritten when counted ({more} more such since the last line)"
                );
            }
            script::numbers(reply).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }
}

impl RedisBackend {
    /// DEL of the counter, then PUBLISH of its key on the reset channel.
    pub(crate) fn reset(
        &self,
        key: &str,
    ) -> Pin<Box<dyn Future<Output = Result<(), TripError>> + Send>> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let mut delete = redis::cmd("DEL");
        delete.arg(script::redis_key(&self.key_prefix, key));
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.resets).arg(announcement(key));
        let link = self.link.clone();
        Box::pin(async move {
            conn.query::<i64>(&delete)
                .await
                .map_err(|e| classify(&link, e))?;
            conn.query::<i64>(&publish)
                .await
                .map_err(|e| classify(&link, e))?;
            Ok(())
        })
    }

    /// PUBLISH of `announced` on the reset channel.
    pub(crate) fn announce(
        &self,
        announced: String,
    ) -> Pin<Box<dyn Future<Output = Result<(), TripError>> + Send>> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.resets).arg(announced);
        let link = self.link.clone();
        Box::pin(async move {
            conn.query::<i64>(&publish)
                .await
                .map_err(|e| classify(&link, e))?;
            Ok(())
        })
    }

    /// A SUBSCRIBE to the reset channel on a connection of its own.
    pub(crate) fn subscription(&self) -> Subscribe {
        let (subscriber, channel) = (self.subscriber.clone(), self.resets.clone());
        Box::new(move || {
            let (subscriber, channel) = (subscriber.clone(), channel.clone());
            Box::pin(async move {
                let subscribe = async {
                    let client = pubsub_client(&subscriber.target, &subscriber.tls).await?;
                    let mut pubsub = client.get_async_pubsub().await?;
                    pubsub.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(pubsub)
                };
                let pubsub = tokio::time::timeout(SUBSCRIBE_TIMEOUT, subscribe)
                    .await
                    .map_err(|_| SubscribeError::Timeout(SUBSCRIBE_TIMEOUT))?
                    .map_err(|e| SubscribeError::Store(e.into()))?;
                let keys = pubsub
                    .into_on_message()
                    .filter_map(|m| std::future::ready(m.get_payload::<String>().ok()));
                Ok(keys.boxed())
            })
        })
    }
}

fn classify(link: &Link<RedisConnector>, e: redis::RedisError) -> TripError {
    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
        // A replica, or a former master after a failover: the supervisor's counter-call
        // probe confirms it and takes the store down (reconnecting a Sentinel set) until
        // counter calls work again.
        link.health.report_call_failed();
        return TripError::Lost(Arc::new(e));
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        link.health.report_down(&e);
        TripError::Lost(Arc::new(e))
    } else {
        TripError::Failed(Arc::new(e))
    }
}
