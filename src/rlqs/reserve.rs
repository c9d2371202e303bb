//! Grants live in the counter store: a grant is reserved (counted as if spent) when it is
//! handed out, and settled against the usage reported for it — what was used beyond it is
//! charged, what was left unused is given back. So other Tollgate instances on the same
//! Redis, and `ShouldRateLimit` on the same counter, see every grant.

use tollgate_core::{Hits, Limit, Store, StoreError};

use super::report::BucketKey;
use super::table::{Action, Reservation, Send, Strategy, StreamId};

/// One rule's counter for one bucket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counter<'a> {
    pub(crate) key: &'a str,
    pub(crate) limits: &'a [Limit],
}

/// A report settled against its reservations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    /// Units neither counted nor reserved now.
    pub(crate) remaining: u64,
    /// Reported admissions beyond the reservations that did not fit the limit.
    pub(crate) over: u64,
    /// The window of the limit that `remaining` is about.
    pub(crate) window_ns: u64,
}

impl Counter<'_> {
    /// Settles `allowed` reported admissions against the stream's `reservations`: the
    /// reservations made in the current window (of every limit) cover that much usage,
    /// and what they leave unused is given back; usage beyond them is charged now. Usage of
    /// a grant from a window that has since ended is charged again: it may have been spent
    /// after the boundary, so the new window counts it (conservative; it only matters for
    /// grants that straddle a boundary).
    pub(crate) async fn settle(
        &self,
        store: &Store,
        reservations: &[Reservation],
        allowed: u64,
        now_ns: u64,
    ) -> Result<Settled, StoreError> {
        let current: u64 = reservations
            .iter()
            .filter(|r| self.same_windows(r.at_ns, now_ns))
            .map(|r| r.tokens)
            .sum();
        let beyond = allowed.saturating_sub(current);
        let hits = match current.saturating_sub(allowed) {
            0 => Hits::Charge(beyond),
            unused => Hits::Refund(unused),
        };
        let verdict = store.apply(self.key, self.limits, hits).await?;
        let decision = verdict.decision;
        let (remaining, over) = match decision.admitted {
            true => (decision.remaining, 0),
            false => (0, beyond.saturating_sub(decision.remaining)),
        };
        let window_ns = self.limits.get(verdict.limit_index).map_or(0, |l| {
            u64::try_from(l.window().as_nanos()).unwrap_or(u64::MAX)
        });
        Ok(Settled {
            remaining,
            over,
            window_ns,
        })
    }

    /// Reserves `tokens`, all or none (another instance may have taken the room).
    pub(crate) async fn reserve(&self, store: &Store, tokens: u64) -> Result<bool, StoreError> {
        let verdict = store
            .apply(self.key, self.limits, Hits::Consume(tokens))
            .await?;
        Ok(verdict.decision.admitted)
    }

    fn same_windows(&self, a_ns: u64, b_ns: u64) -> bool {
        self.limits.iter().all(|l| {
            let window = u64::try_from(l.window().as_nanos())
                .unwrap_or(u64::MAX)
                .max(1);
            a_ns / window == b_ns / window
        })
    }
}

/// Reserves the token buckets among `sends` on their buckets' counters (`counter_of`: key
/// and limits, if the bucket is counted); one that no longer fits (another instance took
/// the room) is `revoke`d and becomes a denial until the stream's next report.
pub(crate) async fn reserve_grants<'r>(
    store: &Store,
    mut sends: Vec<Send>,
    counter_of: impl Fn(&BucketKey) -> Option<(String, &'r [Limit])>,
    mut revoke: impl FnMut(StreamId, &BucketKey),
) -> Vec<Send> {
    for send in &mut sends {
        let Action::Assign {
            strategy: Strategy::TokenBucket { max_tokens, .. },
            ttl_s,
        } = send.action
        else {
            continue;
        };
        let reserved = match counter_of(&send.bucket) {
            Some((key, limits)) => Counter { key: &key, limits }
                .reserve(store, u64::from(max_tokens))
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "RLQS grant not reserved: the counter store failed");
                    false
                }),
            None => false,
        };
        if !reserved {
            tracing::debug!(
                max_tokens,
                "RLQS grant no longer fits; denied until the next report"
            );
            revoke(send.stream, &send.bucket);
            send.action = Action::Assign {
                strategy: Strategy::DenyAll,
                ttl_s,
            };
        }
    }
    sends
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::{Algorithm, Capacity, ManualClock, MemoryStore, Unit};

    use super::*;

    const S: u64 = 1_000_000_000;

    #[tokio::test]
    async fn unused_grants_come_back_within_their_window_only() {
        let clock = ManualClock::new(600 * S);
        let store = Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ));
        let limits = [Limit::new(10, Unit::Minute)
            .with_algorithm(Algorithm::FixedWindow)
            .expect("a valid limit")];
        let counter = Counter {
            key: "k",
            limits: &limits,
        };
        assert!(counter.reserve(&store, 8).await.expect("memory"));
        assert!(
            !counter.reserve(&store, 3).await.expect("memory"),
            "only 2 left"
        );
        // Settles `used` of `tokens` reserved at `at` seconds, now being `now` seconds.
        let settle = async |at: u64, tokens: u64, used: u64, now: u64| {
            let grant = [Reservation {
                at_ns: at * S,
                tokens,
            }];
            let settled = counter.settle(&store, &grant, used, now * S).await;
            settled.expect("memory")
        };
        // 5 of 8 used: 3 come back.
        let settled = settle(600, 8, 5, 610).await;
        assert_eq!((settled.remaining, settled.over), (5, 0));
        assert_eq!(settled.window_ns, 60 * S);
        // 6 used of 5 in a full window: the one beyond does not fit.
        assert!(counter.reserve(&store, 5).await.expect("memory"));
        let settled = settle(620, 5, 6, 630).await;
        assert_eq!((settled.remaining, settled.over), (0, 1));
        // A grant from the window before is not given back into the new one, and what was
        // used of it is counted in the new one (it may have been spent after the boundary).
        clock.advance(60 * S);
        assert_eq!(settle(650, 4, 0, 660).await.remaining, 10);
        assert_eq!(settle(650, 4, 3, 661).await.remaining, 7);
    }
}
