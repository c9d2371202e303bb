//! Grants live in the counter store: a grant is reserved (counted as if spent) when it is
//! handed out, and settled against the usage reported for it — what was used beyond it is
//! charged, what was left unused is given back. So other Tollgate instances on the same
//! Redis, and `ShouldRateLimit` on the same counter, see every grant.
//!
//! A fixed window forgets its count when it ends, so a grant must not be spent across its
//! window's end: streams holding one are given a new assignment then ("cut"), and what
//! they report afterwards of a cut grant was spent before the end.

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
    /// What was applied to the counter.
    pub(crate) hits: Hits,
}

impl Counter<'_> {
    /// Settles `allowed` reported admissions against the stream's `reservations`. The
    /// reservations still counted (made in the current fixed window; sliding windows and
    /// buckets keep a reservation counted from when it was made) cover that much usage,
    /// and what they leave unused is given back; usage is put on them first, so nothing
    /// is given back that may have been spent. Cut grants of ended windows cover usage
    /// too. Usage beyond both is charged now, as is usage of a grant from an ended window
    /// that was not cut: it may have been spent after the end.
    pub(crate) async fn settle(
        &self,
        store: &Store,
        reservations: &[Reservation],
        allowed: u64,
        now_ns: u64,
    ) -> Result<Settled, StoreError> {
        let sum = |keep: &dyn Fn(&Reservation) -> bool| -> u64 {
            reservations
                .iter()
                .filter(|r| keep(r))
                .fold(0, |sum, r| sum.saturating_add(r.tokens))
        };
        let current = sum(&|r| !r.cut && self.same_windows(r.at_ns, now_ns));
        let cut = sum(&|r| r.cut);
        let beyond = allowed.saturating_sub(current.saturating_add(cut));
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
            hits,
        })
    }

    /// Reserves up to `tokens`: all of them, or what is left if another instance took
    /// some of the room. Returns how many.
    pub(crate) async fn reserve(&self, store: &Store, tokens: u64) -> Result<u64, StoreError> {
        let mut asked = tokens;
        // Twice at most: a second refusal means the room is being taken as we ask.
        for _ in 0..2 {
            let verdict = store
                .apply(self.key, self.limits, Hits::Consume(asked))
                .await?;
            if verdict.decision.admitted {
                return Ok(asked);
            }
            asked = verdict.decision.remaining.min(asked);
            if asked == 0 {
                break;
            }
        }
        Ok(0)
    }

    /// When the current window of the counter's earliest-ending fixed-window limit ends,
    /// if it has one: grants made now must be cut then.
    pub(crate) fn window_end(&self, now_ns: u64) -> Option<u64> {
        self.limits
            .iter()
            .filter_map(|l| l.fixed_window_at(now_ns))
            .map(|window| window.end)
            .min()
    }

    fn same_windows(&self, a_ns: u64, b_ns: u64) -> bool {
        self.limits
            .iter()
            .all(|l| l.fixed_window_at(a_ns) == l.fixed_window_at(b_ns))
    }
}

/// Reserves the token buckets among `sends` on their buckets' counters (`counter_of`: key
/// and limits, if the bucket is counted), telling `reserved` of each. One that no longer
/// fits whole (another instance took the room) is `shrink`ed to what was left, a denial if
/// nothing, until the stream's next report.
pub(crate) async fn reserve_grants<'r>(
    store: &Store,
    mut sends: Vec<Send>,
    counter_of: impl Fn(&BucketKey) -> Option<(String, &'r [Limit])>,
    mut reserved: impl FnMut(&BucketKey, &Counter<'_>, u64),
    mut shrink: impl FnMut(StreamId, &BucketKey, u64),
) -> Vec<Send> {
    for send in &mut sends {
        let Action::Assign {
            strategy:
                Strategy::TokenBucket {
                    max_tokens,
                    fill_interval_s,
                },
            ttl_s,
        } = send.action
        else {
            continue;
        };
        let tokens = u64::from(max_tokens);
        let got = match counter_of(&send.bucket) {
            Some((key, limits)) => {
                let counter = Counter { key: &key, limits };
                let got = counter.reserve(store, tokens).await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "RLQS grant not reserved: the counter store failed");
                    0
                });
                if got > 0 {
                    reserved(&send.bucket, &counter, got);
                }
                got
            }
            None => 0,
        };
        if got < tokens {
            tracing::debug!(
                max_tokens,
                got,
                "RLQS grant no longer fits whole; shrunk until the next report"
            );
            shrink(send.stream, &send.bucket, got);
            let strategy = match u32::try_from(got) {
                Ok(0) | Err(_) => Strategy::DenyAll,
                Ok(max_tokens) => Strategy::TokenBucket {
                    max_tokens,
                    fill_interval_s,
                },
            };
            send.action = Action::Assign { strategy, ttl_s };
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

    fn store(clock: &ManualClock) -> Store {
        Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ))
    }

    fn ten_per_minute(algorithm: Algorithm) -> [Limit; 1] {
        [Limit::new(10, Unit::Minute)
            .with_algorithm(algorithm)
            .expect("a valid limit")]
    }

    #[tokio::test]
    async fn unused_grants_come_back_within_their_window_only() {
        let clock = ManualClock::new(600 * S);
        let store = store(&clock);
        let limits = ten_per_minute(Algorithm::FixedWindow);
        let counter = Counter {
            key: "k",
            limits: &limits,
        };
        let reserve = async |tokens| counter.reserve(&store, tokens).await.expect("memory");
        assert_eq!(reserve(8).await, 8);
        assert_eq!(reserve(3).await, 2, "shrunk to what is left");
        assert_eq!(reserve(1).await, 0);
        // Settles `used` of `tokens` reserved at `at` seconds (`cut` at its window's end),
        // now being `now` seconds.
        let settle = async |at: u64, tokens: u64, cut: bool, used: u64, now: u64| {
            let grant = [Reservation {
                at_ns: at * S,
                tokens,
                cut,
            }];
            let settled = counter.settle(&store, &grant, used, now * S).await;
            settled.expect("memory")
        };
        // 5 of 8 used: 3 come back.
        let settled = settle(600, 8, false, 5, 610).await;
        assert_eq!((settled.remaining, settled.over), (3, 0));
        assert_eq!(settled.window_ns, 60 * S);
        // 4 used of 3 in a full window: the one beyond does not fit.
        assert_eq!(reserve(3).await, 3);
        let settled = settle(620, 3, false, 4, 630).await;
        assert_eq!((settled.remaining, settled.over), (0, 1));
        // A grant from the window before is not given back into the new one, and what was
        // used of it is counted in the new one (it may have been spent after the end)...
        clock.advance(60 * S);
        assert_eq!(counter.window_end(661 * S), Some(720 * S));
        assert_eq!(settle(650, 4, false, 0, 660).await.remaining, 10);
        assert_eq!(settle(650, 4, false, 3, 661).await.remaining, 7);
        // ...unless the grant was cut at the end: then it was spent before.
        assert_eq!(settle(650, 4, true, 3, 662).await.remaining, 7);
        // Usage goes on the grant still counted first: nothing comes back of it that may
        // have been spent; beyond both grants, it is charged.
        assert_eq!(reserve(5).await, 5);
        let both = |used| {
            let grants = [
                Reservation {
                    at_ns: 650 * S,
                    tokens: 4,
                    cut: true,
                },
                Reservation {
                    at_ns: 663 * S,
                    tokens: 5,
                    cut: false,
                },
            ];
            let store = &store;
            async move { counter.settle(store, &grants, used, 664 * S).await }
        };
        assert_eq!(both(6).await.expect("memory").remaining, 2, "none back");
        assert_eq!(reserve(2).await, 2);
        assert_eq!(both(10).await.expect("memory").remaining, 0, "one charged");
    }

    #[tokio::test]
    async fn a_sliding_window_keeps_a_grant_counted_from_when_it_was_made() {
        let clock = ManualClock::new(650 * S);
        let store = store(&clock);
        let limits = ten_per_minute(Algorithm::SlidingWindow { precision: 10 });
        let counter = Counter {
            key: "k",
            limits: &limits,
        };
        assert_eq!(counter.window_end(650 * S), None, "no end to cut at");
        let reserve = async |tokens| counter.reserve(&store, tokens).await.expect("memory");
        assert_eq!(reserve(6).await, 6);
        clock.advance(15 * S);
        let grant = [Reservation {
            at_ns: 650 * S,
            tokens: 6,
            cut: false,
        }];
        let settled = counter.settle(&store, &grant, 6, 665 * S).await;
        // Charged again, 12 of 10 would leave nothing.
        assert_eq!(settled.expect("memory").remaining, 4);
    }
}
