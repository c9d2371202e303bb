//! The Redis store: counters in Redis (single node, Cluster or Sentinel), checked and
//! counted by one script call, behind the local view of [`super::shared`].

mod batch;
mod classify;
mod connect;
#[cfg(test)]
mod differential;
mod overrides;
mod reference;
mod script;
mod slots;

pub use connect::{Credentials, RedisKind, RedisTarget, RedisTls, TargetError};
pub use reference::{ReferenceConfig, ReferenceStore};

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;

use self::batch::{MAX_OUT, ScriptCalls};
use self::classify::classify;
use self::connect::{Conn, RedisConnector, pubsub_client};
use super::shared::SharedBehaviour;
use super::shared::announce::{SUBSCRIBE_TIMEOUT, Subscribe, SubscribeError, announcement};
use super::shared::backend::{
    Backend, CallArgs, LogRead, OverrideChange, Pending, Sending, Trip, TripError, Written,
};
use super::shared::batch::Batcher;
use super::shared::link::{Health, Link, TimeSink};
use super::shared::protocol::RawReply;
use super::shared::slot_call::SlotCall;
use crate::clock::Timestamp;
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

/// Counter keys found holding another type are logged at most once per this period.
const FOREIGN_KEY_LOG_PERIOD: Duration = Duration::from_secs(60);

/// Script calls over the supervised connection, the calls of concurrent requests
/// batched into one.
pub(crate) struct RedisBackend {
    link: Arc<Link<RedisConnector>>,
    batcher: Batcher<ScriptCalls>,
    /// The in-flight counters' script.
    slots: Arc<redis::Script>,
    key_prefix: String,
    /// The channel resets are announced on, named from the key prefix.
    resets: String,
    /// The runtime overrides' keys, in one Cluster slot.
    override_keys: overrides::Keys,
    /// The overrides' script.
    override_script: Arc<redis::Script>,
    /// Where subscriptions connect, on connections of their own.
    subscriber: Arc<RedisConnector>,
    /// Counter keys that held something else (a list, a hash), which the script replaced.
    foreign_keys: Arc<LogLimit>,
}

impl RedisBackend {
    /// The backend of `config`, connecting in the background (on the current tokio
    /// runtime) and telling `time` the store's clock.
    pub(crate) fn start(config: RedisConfig, time: TimeSink) -> Self {
        let script = Arc::new(script::script());
        let connector = RedisConnector {
            target: config.target.clone(),
            tls: config.tls.clone(),
            script: script.clone(),
            key_prefix: config.key_prefix.clone(),
        };
        let link = Link::start(connector, time);
        Self {
            batcher: Batcher::start(
                ScriptCalls {
                    link: link.clone(),
                    script,
                },
                MAX_OUT,
                config.behaviour.timeout,
            ),
            link,
            slots: Arc::new(slots::script()),
            resets: format!("{}tollgate-reset", config.key_prefix),
            override_keys: overrides::Keys::of(&config.key_prefix),
            override_script: Arc::new(overrides::script()),
            key_prefix: config.key_prefix,
            foreign_keys: Arc::new(LogLimit::new(FOREIGN_KEY_LOG_PERIOD)),
            subscriber: Arc::new(RedisConnector {
                target: config.target,
                tls: config.tls,
                script: Arc::new(script::script()),
                key_prefix: String::new(),
            }),
        }
    }
}

impl Backend for RedisBackend {
    fn health(&self) -> &Health {
        &self.link.health
    }

    fn span(&self, limits: usize) -> tracing::Span {
        tracing::debug_span!("Redis round trip", limits)
    }

    /// One call in the next batch's EVALSHA, owning all it needs; Redis ignores it if it
    /// runs after `deadline` (Redis time).
    fn check_and_count(&self, args: &CallArgs<'_>) -> Trip {
        if self.link.conn().is_none() {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        }
        let check = script::Check {
            key: args.key,
            limits: args.limits,
            ask: args.ask,
            debt: args.debt,
            deadline: args.deadline,
            now: None,
            around: args.around,
        };
        let call = script::pack(&self.key_prefix, &check);
        let parts = script::parts(args.limits);
        let batcher = self.batcher.clone();
        let foreign_keys = self.foreign_keys.clone();
        Box::pin(async move {
            let reply = batcher.call(call).await?;
            if !reply.foreign.is_empty()
                && let Some(more) = foreign_keys.admit(Timestamp::from_micros(
                    u64::try_from(reply.now_us).unwrap_or(0),
                ))
            {
                tracing::warn!(
                    "redis counter {}, not a counter: read as an empty counter and \
                     overwritten when counted ({more} more such since the last line)",
                    reply.foreign
                );
            }
            script::raw(reply, &parts).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// One EVALSHA of the slots script.
    fn slots(&self, call: SlotCall) -> Trip {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let cmd = slots::call(&self.slots, &self.key_prefix, &call);
        let (script, link) = (self.slots.clone(), self.link.clone());
        Box::pin(async move {
            let numbers = conn
                .eval::<Vec<i64>>(&cmd, &script)
                .await
                .map_err(|e| classify(&link, e))?;
            RawReply::from_numbers(numbers).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }

    /// DEL of the counter, then PUBLISH of its key on the reset channel.
    fn reset(&self, key: &str) -> Sending {
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
    fn announce(&self, announced: String) -> Sending {
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
    fn subscription(&self) -> Subscribe {
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

    /// The overrides script's `log`.
    fn override_log(&self, since: u64, most: usize, most_bytes: usize) -> Pending<LogRead> {
        let cmd = overrides::log(
            &self.override_script,
            &self.override_keys,
            &self.resets,
            (since, most, most_bytes),
        );
        self.override_script_call(cmd, overrides::log_read)
    }

    /// HSCAN of the overrides' hash, until `most` are read.
    fn all_overrides(&self, most: usize) -> Pending<Vec<(String, String)>> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let (hash, link) = (self.override_keys.set.clone(), self.link.clone());
        Box::pin(async move {
            let mut found: Vec<(String, String)> = Vec::new();
            let mut cursor = 0_u64;
            loop {
                let mut scan = redis::cmd("HSCAN");
                scan.arg(&hash).arg(cursor).arg("COUNT").arg(1_000);
                let (next, pairs): (u64, Vec<(String, String)>) =
                    conn.query(&scan).await.map_err(|e| classify(&link, e))?;
                found.extend(pairs);
                cursor = next;
                if cursor == 0 || found.len() >= most {
                    break;
                }
            }
            // HSCAN may return a field twice.
            found.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            found.dedup_by(|a, b| a.0 == b.0);
            found.truncate(most);
            Ok(found)
        })
    }

    /// HGET of the override: Redis runs one command at a time, so one still on its way
    /// after the deadline finds the deadline passed.
    fn override_of(&self, id: &str) -> Pending<Option<String>> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let mut get = redis::cmd("HGET");
        get.arg(&self.override_keys.set).arg(id);
        let link = self.link.clone();
        Box::pin(async move { conn.query(&get).await.map_err(|e| classify(&link, e)) })
    }

    /// The overrides script's `set` or `delete`.
    fn change_override(&self, change: OverrideChange<'_>) -> Pending<Written> {
        let cmd = overrides::change(
            &self.override_script,
            &self.override_keys,
            &self.resets,
            &change,
        );
        self.override_script_call(cmd, overrides::written)
    }
}

impl RedisBackend {
    /// Runs `cmd`, an EVALSHA of the overrides script, and reads its reply with `read`.
    fn override_script_call<T: Send + 'static>(
        &self,
        cmd: redis::Cmd,
        read: fn(&[String]) -> Result<T, TripError>,
    ) -> Pending<T> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let (script, link) = (self.override_script.clone(), self.link.clone());
        Box::pin(async move {
            let reply: Vec<String> = conn
                .eval(&cmd, &script)
                .await
                .map_err(|e| classify(&link, e))?;
            read(&reply)
        })
    }
}
