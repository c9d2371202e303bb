//! Where counters live: `memory` (the embedded default), or `redis` or `postgres` (shared
//! by instances, with a local view that denies without a round trip). A closed enum keeps
//! the request path statically dispatched.

mod counting;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod decreases;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod local;
mod memory;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod open;
mod peek;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
mod shards;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod shared;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod store_clock;
mod table;
mod types;

pub use counting::Reading;
pub use memory::{Capacity, MemoryStore};
pub use peek::{CounterView, LeaseView, LimitView, Peek};
#[cfg(any(feature = "redis", feature = "postgres"))]
pub use shared::lease::LeasePolicy;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub use shared::{SharedBehaviour, SharedStore};
pub use types::{
    DecidedBy, IgnoredAnnouncements, KeyLayout, OnStoreError, SharedStats, StoreError, StoreStats,
};

#[cfg(any(feature = "redis", feature = "postgres"))]
use std::sync::Arc;

use crate::algo::{Hits, MAX_UNITS, Verdict};
use crate::clock::Timestamp;
use crate::counter::Counter;

/// A counter store; clones share it.
#[derive(Debug, Clone)]
pub enum Store {
    /// Counters in this process.
    Memory(MemoryStore),
    /// Counters in Redis or PostgreSQL, shared by every instance pointed at it.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    Shared(Arc<SharedStore>),
    /// Counters in Redis in the reference service's keys, counted its way (reference
    /// mode).
    #[cfg(feature = "redis")]
    Reference(Arc<redis::ReferenceStore>),
}

impl Store {
    /// Applies `hits` to `counter` under its limits (all or nothing).
    pub(crate) async fn apply(&self, counter: &Counter, hits: Hits) -> Result<Verdict, StoreError> {
        self.decide(counter, hits).await.map(|(verdict, _)| verdict)
    }

    /// [`Store::apply`], and where the verdict came from. Units past [`MAX_UNITS`] are
    /// held at it, on every store alike.
    pub(crate) async fn decide(
        &self,
        counter: &Counter,
        hits: Hits,
    ) -> Result<(Verdict, DecidedBy), StoreError> {
        let (key, limits) = (counter.key(), counter.limits());
        let hits = hits.saturated();
        match self {
            Self::Memory(m) => Ok((m.apply(key, limits, hits), DecidedBy::Memory)),
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.apply(key, limits, hits).await,
            #[cfg(feature = "redis")]
            Self::Reference(r) => Ok((r.apply(key, limits, hits).await?, DecidedBy::Store)),
        }
    }

    /// Gives back `n` units that a refused request consumed on `counter` (all or none):
    /// a shared store that does not answer in time gives them back to its view and
    /// credits the store, whatever `--on-store-error` says, for nobody retries this.
    pub(crate) async fn give_back(&self, counter: &Counter, n: u64) -> Result<Verdict, StoreError> {
        match self {
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => {
                let (key, limits) = (counter.key(), counter.limits());
                Ok(r.give_back(key, limits, n).await?.0)
            }
            _ => self.apply(counter, Hits::Refund(n)).await,
        }
    }

    /// How this store's counters are keyed.
    pub fn key_layout(&self) -> KeyLayout {
        match self {
            #[cfg(feature = "redis")]
            Self::Reference(_) => KeyLayout::Reference,
            _ => KeyLayout::Tollgate,
        }
    }

    /// What every holder of `counter` says of it, and what `hits` more would get, changing
    /// nothing (a shared store is asked with a check, which counts nothing).
    pub async fn peek(&self, counter: &Counter, hits: u64) -> Peek {
        let (key, limits) = (counter.key(), counter.limits());
        let hits = hits.min(MAX_UNITS);
        match self {
            Self::Memory(m) => Peek {
                local: Some(m.peek(key, limits, hits)),
                stored_key: None,
                shared: None,
                lease: None,
            },
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.peek(key, limits, hits).await,
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.peek(key, limits, hits).await,
        }
    }

    /// Sets `counter` back to empty: in memory, or in the shared store and in the local
    /// view of every instance listening to it (reference mode's keys need its limits: they
    /// name the window's start).
    pub async fn reset(&self, counter: &Counter) -> Result<(), StoreError> {
        match self {
            Self::Memory(m) => {
                m.reset(counter.key());
                Ok(())
            }
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.reset(counter.key()).await,
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.reset(counter.key(), counter.limits()).await,
        }
    }

    /// Publishes an instance's heavy keys to the others sharing the store; nothing for a
    /// store of this process alone.
    pub(crate) async fn publish_top(&self, snapshot: String) {
        #[cfg(any(feature = "redis", feature = "postgres"))]
        if let Self::Shared(r) = self {
            r.publish_top(snapshot).await;
        }
        #[cfg(not(any(feature = "redis", feature = "postgres")))]
        let _ = snapshot;
    }

    /// The heavy keys instances sharing the store published lately; none for a store of
    /// this process alone.
    pub(crate) fn peer_tops(&self) -> Vec<String> {
        match self {
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.peer_tops(),
            _ => Vec::new(),
        }
    }

    /// What the store announced and this instance did not believe; none for a store of
    /// this process alone.
    pub fn ignored_announcements(&self) -> Option<IgnoredAnnouncements> {
        match self {
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => Some(r.ignored_announcements()),
            _ => None,
        }
    }

    /// The store's clock now (for a shared store: local time moved onto the store's).
    pub(crate) fn now(&self) -> Timestamp {
        match self {
            Self::Memory(m) => m.now(),
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.now(),
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.now(),
        }
    }

    /// The store as logs name it: `memory`, or a shared store's kind and address
    /// (`redis 127.0.0.1:6379 (single)`, password never shown).
    pub fn name(&self) -> &str {
        match self {
            Self::Memory(_) => "memory",
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.name(),
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.name(),
        }
    }

    /// Whether the store can currently answer (the memory store always can).
    pub fn is_up(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.is_up(),
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.is_up(),
        }
    }

    /// Whether requests get answers: the store is up, or its failures are decided here.
    pub fn can_answer(&self) -> bool {
        match self {
            Self::Memory(_) => true,
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.is_up() || r.on_error() != OnStoreError::Error,
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.is_up() || r.on_error() != OnStoreError::Error,
        }
    }

    /// The store's figures now.
    pub fn stats(&self) -> StoreStats {
        match self {
            Self::Memory(m) => m.stats(),
            #[cfg(any(feature = "redis", feature = "postgres"))]
            Self::Shared(r) => r.stats(),
            #[cfg(feature = "redis")]
            Self::Reference(r) => r.stats(),
        }
    }
}
