//! This instance's part of a bucket's limit when several Tollgate instances share the
//! counter store. Without it the instance whose Envoy reports first after a window starts
//! takes all the room. Each instance takes the part of the limit that its own Envoys'
//! demand is of the whole fleet's, and grants no more than what is left of that part.
//!
//! Demand is counted twice on the same sliding window: on the shared store (every
//! instance's) and here in memory (this instance's), so that both carry the same
//! approximation. What this instance reserved and charged on a bucket's counter is
//! mirrored here too, so its spending is measured with the limit's own algorithm and
//! window.

use std::sync::Arc;

use tollgate_core::{Capacity, Clock, Hits, Limit, MemoryStore, Store, StoreError, Unit};

use super::reserve::{Counter, Settled};
use super::table::Reservation;

/// Demand is counted over this many seconds: four of Envoy's 5 s reporting intervals, so
/// that each instance's count holds several reports and one more or less moves a fraction
/// by a quarter at most.
const DEMAND_WINDOW_S: u32 = 20;
/// Keys of demand counters start with this; counter keys start with an escaped domain,
/// which never holds a bare `%`.
const DEMAND_PREFIX: &str = "%rlqs-demand|";
/// Reads a counter: unlike a check, which asks about one more unit, it reports what is
/// left as it is.
const READ: Hits = Hits::Charge(0);

/// This instance's demand and spending, per bucket counter.
pub(crate) struct Parts {
    mine: MemoryStore,
    demand: [Limit; 1],
}

impl Parts {
    /// Counters on `clock`; `capacity` bounds what they hold.
    pub(crate) fn new(clock: Arc<dyn Clock>, capacity: Capacity) -> Self {
        let mine = MemoryStore::new(capacity, clock);
        let demand = Limit::new(u32::MAX, Unit::Second)
            .with_multiplier(DEMAND_WINDOW_S)
            .unwrap_or_else(|_| Limit::new(u32::MAX, Unit::Minute));
        Self {
            mine,
            demand: [demand],
        }
    }

    /// Drops expired counters from a task on the current runtime.
    pub(crate) fn spawn_sweeper(&self) {
        self.mine
            .spawn_sweeper(std::time::Duration::from_secs(u64::from(DEMAND_WINDOW_S)));
    }

    /// Counts `requests` (allowed and denied) reported for `counter`'s bucket, here and on
    /// `store`: the fraction of the fleet's recent demand that is this instance's. With no
    /// demand anywhere it is 1: nobody else wants any.
    pub(crate) async fn fraction(
        &self,
        store: &Store,
        counter: &Counter<'_>,
        requests: u64,
    ) -> Result<f64, StoreError> {
        let key = demand_key(counter);
        let hits = Hits::Charge(requests);
        let everyone = store.apply(&key, &self.demand, hits).await?;
        let mine = self.mine.apply(&key, &self.demand, hits);
        let (everyone, mine) = (
            counted(everyone.decision.remaining),
            counted(mine.decision.remaining),
        );
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
        counter: &Counter<'_>,
    ) -> Result<(), StoreError> {
        let key = demand_key(counter);
        let mine = self.mine.apply(&key, &self.demand, READ);
        let hits = Hits::Refund(counted(mine.decision.remaining));
        self.mine.apply(&key, &self.demand, hits);
        store.apply(&key, &self.demand, hits).await.map(|_| ())
    }

    /// Records `hits` applied on `counter` in the shared store by this instance.
    pub(crate) fn mirror(&self, counter: &Counter<'_>, hits: Hits) {
        let hits = match hits {
            // Mirrored whether or not it would fit: it did fit the shared counter.
            Hits::Consume(n) => Hits::Charge(n),
            other => other,
        };
        self.mine.apply(counter.key, counter.limits, hits);
    }

    /// What is left of this instance's part, `fraction` of the limit, once what it spent
    /// (and reserved) in the window is taken off. Measured on the limit that binds this
    /// instance's spending most.
    pub(crate) fn room(&self, counter: &Counter<'_>, fraction: f64) -> u64 {
        let verdict = self.mine.apply(counter.key, counter.limits, READ);
        let Some(limit) = counter.limits.get(verdict.limit_index) else {
            return 0;
        };
        let whole = u64::from(limit.requests_per_unit());
        let spent = whole.saturating_sub(verdict.decision.remaining);
        // Rounded down: the parts never add up to more than the limit.
        let part = (whole as f64 * fraction.clamp(0.0, 1.0)).floor() as u64;
        part.saturating_sub(spent)
    }
}

/// Settles a report of `allowed` and `denied` requests on `counter` against the stream's
/// `reservations`, and says what is left for this instance: the counter's room, within
/// this instance's part when other instances share the store (`parts`).
pub(crate) async fn settle_report(
    store: &Store,
    counter: &Counter<'_>,
    parts: Option<&Parts>,
    reservations: &[Reservation],
    (allowed, denied): (u64, u64),
    now_ns: u64,
) -> Result<(Settled, u64), StoreError> {
    let settled = counter.settle(store, reservations, allowed, now_ns).await?;
    let Some(parts) = parts else {
        return Ok((settled, settled.remaining));
    };
    parts.mirror(counter, settled.hits);
    let requests = allowed.saturating_add(denied);
    let fraction = parts.fraction(store, counter, requests).await?;
    let room = settled.remaining.min(parts.room(counter, fraction));
    Ok((settled, room))
}

fn demand_key(counter: &Counter<'_>) -> String {
    format!("{DEMAND_PREFIX}{}", counter.key)
}

/// Demand counted, from what a demand counter says is left.
fn counted(remaining: u64) -> u64 {
    u64::from(u32::MAX).saturating_sub(remaining)
}

#[cfg(test)]
mod tests {
    use tollgate_core::{Algorithm, ManualClock};

    use super::*;

    const S: u64 = 1_000_000_000;

    fn setup() -> (Parts, Parts, Store, ManualClock) {
        let clock = ManualClock::new(600 * S);
        let shared = Store::Memory(MemoryStore::new(
            Capacity::default(),
            Arc::new(clock.clone()),
        ));
        let part = || Parts::new(Arc::new(clock.clone()), Capacity::default());
        (part(), part(), shared, clock)
    }

    #[tokio::test]
    async fn each_instance_gets_the_part_its_demand_is_of_the_fleets() {
        let (a, b, shared, clock) = setup();
        let limits = [Limit::new(100, Unit::Minute)
            .with_algorithm(Algorithm::FixedWindow)
            .expect("a valid limit")];
        let counter = Counter {
            key: "k",
            limits: &limits,
        };
        let fraction = async |part: &Parts, requests| {
            part.fraction(&shared, &counter, requests)
                .await
                .expect("memory")
        };
        assert_eq!(fraction(&a, 0).await, 1.0, "no demand anywhere");
        assert_eq!(fraction(&a, 30).await, 1.0, "alone so far");
        assert_eq!(fraction(&b, 90).await, 0.75);
        assert_eq!(fraction(&a, 0).await, 0.25);
        assert_eq!(a.room(&counter, 0.25), 25);
        a.mirror(&counter, Hits::Consume(20));
        assert_eq!(a.room(&counter, 0.25), 5);
        a.mirror(&counter, Hits::Refund(10));
        assert_eq!(a.room(&counter, 0.25), 15);
        a.mirror(&counter, Hits::Charge(40));
        assert_eq!(a.room(&counter, 0.25), 0, "spent beyond its part");
        assert_eq!(b.room(&counter, 0.75), 75, "b's spending is its own");
        // b's Envoys leave: a has the whole demand at once.
        b.withdraw(&shared, &counter).await.expect("memory");
        assert_eq!(fraction(&a, 0).await, 1.0);
        assert_eq!(fraction(&b, 10).await, 0.25, "b's old demand is gone");
        // The demand ages out with its window: a alone again.
        clock.advance(u64::from(DEMAND_WINDOW_S) * 2 * S);
        assert_eq!(fraction(&a, 10).await, 1.0);
    }
}
