//! This instance's part of a bucket's limit when several Tollgate instances share the
//! counter store: the part of the fleet's recent demand that its own Envoys make. Without
//! it every instance would hand out the whole rate.
//!
//! Demand is counted twice on the same sliding window, a companion of the bucket's
//! counter: on the shared store (every instance's) and here in memory (this instance's),
//! so that both carry the same approximation.

use std::sync::Arc;

use tollgate_core::{Capacity, Clock, Counter, Limit, MemoryStore, Store, StoreError, Unit};

/// Demand is counted over this many seconds: four of Envoy's 5 s reporting intervals, so
/// that each instance's count holds several reports and one more or less moves a fraction
/// by a quarter at most.
const DEMAND_WINDOW_S: u32 = 20;
/// The demand counter's name beside the bucket's counter.
const DEMAND_TAG: &str = "rlqs-demand";

/// This instance's demand per bucket counter, in local memory, beside the fleet's on the
/// shared store.
pub(crate) struct Parts {
    memory: MemoryStore,
    mine: Store,
    demand: [Limit; 1],
}

impl Parts {
    /// Counters on `clock`; `capacity` bounds what they hold.
    pub(crate) fn new(clock: Arc<dyn Clock>, capacity: Capacity) -> Self {
        let memory = MemoryStore::new(capacity, clock);
        let demand = Limit::new(u32::MAX, Unit::Second)
            .with_multiplier(DEMAND_WINDOW_S)
            .unwrap_or_else(|_| Limit::new(u32::MAX, Unit::Minute));
        Self {
            mine: Store::Memory(memory.clone()),
            memory,
            demand: [demand],
        }
    }

    /// Drops expired counters from a task on the current runtime.
    pub(crate) fn spawn_sweeper(&self) {
        self.memory
            .spawn_sweeper(std::time::Duration::from_secs(u64::from(DEMAND_WINDOW_S)));
    }

    /// Counts `requests` (allowed and denied) reported for `counter`'s bucket, here and on
    /// `store`: the fraction of the fleet's recent demand that is this instance's. With no
    /// demand anywhere it is 1: nobody else wants any.
    pub(crate) async fn fraction(
        &self,
        store: &Store,
        counter: &Counter,
        requests: u64,
    ) -> Result<f64, StoreError> {
        let demand = counter.companion(DEMAND_TAG, &self.demand);
        let everyone = counted(demand.charge(store, requests).await?.remaining);
        let mine = counted(demand.charge(&self.mine, requests).await?.remaining);
        // Each instance asks right after counting its own latest report, which the others
        // count only at some point of their own interval: half of it on average. So half
        // of it is left out here, or every instance would count itself ahead of the rest
        // and their parts add up to more than the whole.
        let ahead = requests / 2;
        let (everyone, mine) = (everyone.saturating_sub(ahead), mine.saturating_sub(ahead));
        Ok(match everyone {
            0 => 1.0,
            _ => (mine as f64 / everyone as f64).min(1.0),
        })
    }

    /// No stream reports `counter`'s bucket to this instance any more: its demand is taken
    /// back from the fleet's, so that the others get the whole limit now rather than when
    /// the demand window has forgotten it.
    pub(crate) async fn withdraw(
        &self,
        store: &Store,
        counter: &Counter,
    ) -> Result<(), StoreError> {
        let demand = counter.companion(DEMAND_TAG, &self.demand);
        let mine = counted(demand.read(&self.mine).await?.remaining);
        demand.refund(&self.mine, mine).await?;
        demand.refund(store, mine).await.map(|_| ())
    }
}

/// Demand counted, from what a demand counter says is left.
fn counted(remaining: u64) -> u64 {
    u64::from(u32::MAX).saturating_sub(remaining)
}

#[cfg(test)]
mod tests {
    use tollgate_core::ManualClock;

    use super::*;

    const S: u64 = 1_000_000_000;

    #[tokio::test]
    async fn each_instance_gets_the_part_its_demand_is_of_the_fleets() {
        let clock = ManualClock::new(600 * S);
        let shared = Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ));
        let part = || Parts::new(Arc::new(clock.clone()), Capacity::default());
        let (a, b) = (part(), part());
        let counter = Counter::for_limits("d", [("k", "v")], &[Limit::new(100, Unit::Minute)]);
        let fraction = async |part: &Parts, requests| {
            part.fraction(&shared, &counter, requests)
                .await
                .expect("memory")
        };
        assert_eq!(fraction(&a, 0).await, 1.0, "no demand anywhere");
        assert_eq!(fraction(&a, 30).await, 1.0, "alone so far");
        // Half of b's own report is left out: (90 - 45) of (120 - 45).
        assert_eq!(fraction(&b, 90).await, 0.6);
        assert_eq!(fraction(&a, 0).await, 0.25);
        // b's Envoys leave: a has the whole demand at once.
        b.withdraw(&shared, &counter).await.expect("memory");
        assert_eq!(fraction(&a, 0).await, 1.0);
        assert_eq!(fraction(&b, 10).await, 5.0 / 35.0, "b's old demand is gone");
        // The demand ages out with its window: a alone again.
        clock.advance(u64::from(DEMAND_WINDOW_S) * 2 * S);
        assert_eq!(fraction(&a, 10).await, 1.0);
    }
}
