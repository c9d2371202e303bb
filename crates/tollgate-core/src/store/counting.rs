//! A counter's operations on a store: consume, charge, refund, read and reserve, each
//! answered with a [`Reading`] of its tightest limit.

use std::time::Duration;

use super::{Store, StoreError};
use crate::algo::Hits;
use crate::counter::Counter;

/// What a counter answered to one operation, about its tightest limit: of the denying
/// limits the one with the longest wait, else the one with the fewest units left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Whether the units fit every limit (a consume counted them; a charge counted them
    /// anyway; a read or refund: whether the counter is within its limits).
    pub admitted: bool,
    /// Units left under the tightest limit (for a denial: left before it).
    pub remaining: u64,
    /// Which of [`Counter::limits`] that is.
    pub limit_index: usize,
    /// Admitted: until the counted units are forgotten; denied: until the same units would
    /// fit, with no other traffic.
    pub reset: Duration,
}

impl Counter {
    /// Counts `n` units if every limit has room for them.
    pub async fn consume(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Consume(n)).await
    }

    /// Counts `n` units whether or not they fit: usage reported after the fact.
    pub async fn charge(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Charge(n)).await
    }

    /// Gives back `n` units counted earlier.
    pub async fn refund(&self, store: &Store, n: u64) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Refund(n)).await
    }

    /// What is left, as it is (unlike a check of one more unit).
    pub async fn read(&self, store: &Store) -> Result<Reading, StoreError> {
        self.apply(store, Hits::Charge(0)).await
    }

    /// Consumes up to `n` units: all of them if they fit, else what is left, when other
    /// clients take room as this asks. Returns how many were counted.
    pub async fn reserve(&self, store: &Store, n: u64) -> Result<u64, StoreError> {
        let mut asked = n;
        // Twice at most: a second refusal means the room is being taken as we ask.
        for _ in 0..2 {
            let reading = self.consume(store, asked).await?;
            if reading.admitted {
                return Ok(asked);
            }
            asked = reading.remaining.min(asked);
            if asked == 0 {
                break;
            }
        }
        Ok(0)
    }

    async fn apply(&self, store: &Store, hits: Hits) -> Result<Reading, StoreError> {
        let verdict = store.apply(self, hits).await?;
        Ok(Reading {
            admitted: verdict.decision.admitted,
            remaining: verdict.decision.remaining,
            limit_index: verdict.limit_index,
            reset: verdict.decision.reset,
        })
    }
}
