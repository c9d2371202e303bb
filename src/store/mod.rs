//! Where counters live: `memory` (the embedded default) or `redis` (shared by instances).
//! A closed enum keeps the request path statically dispatched.

mod memory;
pub mod redis;
mod shards;

pub use memory::MemoryStore;
pub use shards::ShardStats;

use self::redis::RedisStore;
use crate::limiter::{Hits, Limit, Outcome};
use crate::settings::OnStoreError;

/// A counter store; clones share it.
#[derive(Debug, Clone)]
pub enum Store {
    Memory(MemoryStore),
    Redis(std::sync::Arc<RedisStore>),
}

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store did not answer within the store timeout.
    Timeout,
    /// The store is unreachable or answered with an error.
    Unavailable(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => write!(f, "counter store timed out"),
            Self::Unavailable(why) => write!(f, "counter store unavailable: {why}"),
        }
    }
}

impl Store {
    /// Applies `hits` to the counter `key` under `limits` (all or nothing).
    pub async fn apply(
        &self,
        key: &str,
        limits: &[Limit],
        hits: Hits,
    ) -> Result<Outcome, StoreError> {
        match self {
            Self::Memory(m) => Ok(m.apply(key, limits, hits)),
            Self::Redis(r) => r.apply(key, limits, hits).await,
        }
    }

    /// Whether the store can currently answer (the memory store always can).
    pub fn is_up(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            Self::Redis(r) => r.is_up(),
        }
    }

    /// Whether requests get answers: the store is up, or its failures are decided locally.
    pub fn can_answer(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            Self::Redis(r) => r.is_up() || r.on_error() != OnStoreError::Error,
        }
    }
}
