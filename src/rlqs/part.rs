//! This instance's part of a bucket's limit when several Tollgate instances share the
//! counter store: the part of the fleet's recent demand that its own Envoys make. Without
//! it every instance would hand out the whole rate.
//!
//! Demand is counted twice on the same sliding window, a companion of the bucket's
//! counter: on the shared store (every instance's) and here in memory (this instance's),
//! so that both carry the same approximation. Reports are not counted as they come but
//! gathered and counted on both every [`FLUSH`]: so every instance's count holds the
//! reports of the fleet up to about the same moment, and none counts its own newest
//! report ahead of the others' (which made the parts add up to more than the whole).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tollgate_core::lock;
use tollgate_core::{Capacity, Clock, Counter, Limit, MemoryStore, Store, StoreError, Unit};

/// Demand is counted over this many seconds: four of Envoy's 5 s reporting intervals, so
/// that each instance's count holds several reports and one more or less moves a fraction
/// by a quarter at most.
const DEMAND_WINDOW_S: u32 = 20;
/// The demand counter's name beside the bucket's counter.
const DEMAND_TAG: &str = "rlqs-demand";
/// Gathered demand is counted this often: well within the shortest reporting interval
/// that matters (a second), so that a report is counted before the next one comes.
pub(crate) const FLUSH: Duration = Duration::from_millis(250);

/// This instance's demand per bucket counter, in local memory, beside the fleet's on the
/// shared store.
pub(crate) struct Parts {
    memory: MemoryStore,
    mine: Store,
    demand: [Limit; 1],
    /// Requests reported since the last flush, by the bucket's counter key; at most one
    /// entry per bucket held.
    gathered: Mutex<HashMap<String, (Counter, u64)>>,
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
            gathered: Mutex::default(),
        }
    }

    /// Drops expired counters from a task on the current runtime.
    pub(crate) fn spawn_sweeper(&self) {
        self.memory
            .spawn_sweeper(Duration::from_secs(u64::from(DEMAND_WINDOW_S)));
    }

    /// Gathers `requests` (allowed and denied) reported for `counter`'s bucket, to be
    /// counted at the next flush.
    pub(crate) fn gather(&self, counter: &Counter, requests: u64) {
        if requests == 0 {
            return;
        }
        let mut gathered = self.gathered();
        let (_, sum) = gathered
            .entry(counter.key().to_owned())
            .or_insert_with(|| (counter.clone(), 0));
        *sum = sum.saturating_add(requests);
    }

    /// Counts what was gathered, on `store` first and then here, so that a fraction read
    /// meanwhile errs towards less for this instance, never more. A bucket the store
    /// fails for is left out, not the others; the first failure is returned.
    pub(crate) async fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let gathered = std::mem::take(&mut *self.gathered());
        let mut failed = Ok(());
        for (_, (counter, requests)) in gathered {
            let demand = counter.companion(DEMAND_TAG, &self.demand);
            let counted = match demand.charge(store, requests).await {
                Ok(_) => demand.charge(&self.mine, requests).await,
                Err(e) => Err(e),
            };
            if let Err(e) = counted
                && failed.is_ok()
            {
                failed = Err(e);
            }
        }
        failed
    }

    /// The fraction of the fleet's demand for `counter`'s bucket that is this instance's,
    /// as counted at the last flushes; with no demand anywhere it is 1: nobody else wants
    /// any. An instance's first report of the bucket (none of its demand counted) is
    /// counted at once, so that the first reports other instances get meanwhile find it.
    pub(crate) async fn fraction(
        &self,
        store: &Store,
        counter: &Counter,
    ) -> Result<f64, StoreError> {
        let demand = counter.companion(DEMAND_TAG, &self.demand);
        let (everyone, mine) = match counted(demand.read(&self.mine).await?.remaining) {
            0 => {
                let new = self.gathered().remove(counter.key()).map_or(0, |(_, n)| n);
                let everyone = counted(demand.charge(store, new).await?.remaining);
                (
                    everyone,
                    counted(demand.charge(&self.mine, new).await?.remaining),
                )
            }
            mine => (counted(demand.read(store).await?.remaining), mine),
        };
        Ok(match everyone.max(mine) {
            0 => 1.0,
            all => mine as f64 / all as f64,
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
        self.gathered().remove(counter.key());
        let demand = counter.companion(DEMAND_TAG, &self.demand);
        let mine = counted(demand.read(&self.mine).await?.remaining);
        demand.refund(&self.mine, mine).await?;
        demand.refund(store, mine).await.map(|_| ())
    }

    fn gathered(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Counter, u64)>> {
        lock(&self.gathered)
    }
}

/// Demand counted, from what a demand counter says is left.
fn counted(remaining: u64) -> u64 {
    u64::from(u32::MAX).saturating_sub(remaining)
}

#[cfg(test)]
mod tests {
    use tollgate_core::{ManualClock, NANOS_PER_SECOND, Timestamp};

    use super::*;

    #[tokio::test]
    async fn each_instance_gets_the_part_its_demand_is_of_the_fleets() {
        let clock = ManualClock::new(Timestamp::from_nanos(600 * NANOS_PER_SECOND));
        let shared = Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ));
        let part = || Parts::new(Arc::new(clock.clone()), Capacity::default());
        let (a, b) = (part(), part());
        let counter = Counter::for_limits("d", [("k", "v")], &[Limit::new(100, Unit::Minute)]);
        let fraction = async |part: &Parts| part.fraction(&shared, &counter).await.expect("memory");
        let flush = async |part: &Parts| part.flush(&shared).await.expect("memory");
        assert_eq!(fraction(&a).await, 1.0, "no demand anywhere");
        // First reports are counted at once.
        a.gather(&counter, 30);
        assert_eq!(fraction(&a).await, 1.0, "alone so far");
        b.gather(&counter, 10);
        assert_eq!(fraction(&b).await, 0.25);
        // a's newest report is not counted ahead of b's: 30 of 40 until it is flushed.
        a.gather(&counter, 50);
        assert_eq!(fraction(&a).await, 0.75);
        flush(&a).await;
        assert_eq!(fraction(&a).await, 80.0 / 90.0);
        assert_eq!(fraction(&b).await, 10.0 / 90.0);
        // b's Envoys leave: a has the whole demand at once.
        b.withdraw(&shared, &counter).await.expect("memory");
        assert_eq!(fraction(&a).await, 1.0);
        // The demand ages out with its window: each report is a first again.
        clock.advance(Duration::from_secs(u64::from(DEMAND_WINDOW_S) * 2));
        b.gather(&counter, 10);
        assert_eq!(fraction(&b).await, 1.0);
        a.gather(&counter, 10);
        assert_eq!(fraction(&a).await, 0.5, "beside b's");
    }
}
