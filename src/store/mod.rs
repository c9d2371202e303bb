//! Where counters live. `memory` is the embedded default; a shared store plugs in here as
//! another variant, so the request path stays statically dispatched.

mod memory;

pub use memory::{MemoryStats, MemoryStore};

use crate::limiter::{Hits, Limit, Outcome};

/// A counter store.
#[derive(Debug)]
pub enum Store {
    Memory(MemoryStore),
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
        }
    }
}
