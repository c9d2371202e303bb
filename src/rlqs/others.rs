//! What other clients of a bucket's counter take of its limit: `ShouldRateLimit` callers
//! (and anything else) count on the very counter RLQS usage is charged on. RLQS usage is
//! charged a second time on a companion with the same limits, so the counter's count
//! beyond the companion's is theirs, and the rate the Envoys divide is what they leave.

use tollgate_core::{Counter, Reading, Store, StoreError};

/// The companion's name beside the bucket's counter.
const USAGE_TAG: &str = "rlqs-usage";

/// What a charge of RLQS usage found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charged {
    /// The counter's answer, all clients counted.
    pub(crate) reading: Reading,
    /// The part of the limit (0 to 1) that other clients hold now.
    pub(crate) others: f64,
}

/// Charges `units` of RLQS usage on `counter` (on `store`) and on its companion.
pub(crate) async fn charge(
    store: &Store,
    counter: &Counter,
    units: u64,
) -> Result<Charged, StoreError> {
    let companion = counter.companion(USAGE_TAG, counter.limits());
    let (reading, rlqs) =
        tokio::try_join!(counter.charge(store, units), companion.charge(store, units))?;
    Ok(Charged {
        others: taken_by_others(counter, &reading, &rlqs),
        reading,
    })
}

/// The part of `counter`'s tightest limit that is counted on it (`all`) and not on the
/// RLQS companion (`rlqs`). The companion's room under its own tightest limit is at most
/// its room under the counter's, so this never counts more than the others took. Under
/// steady load it settles where the Envoys' rate and the others' add up to the limit: a
/// window holds what both admitted over it, a bucket drains while they take more.
fn taken_by_others(counter: &Counter, all: &Reading, rlqs: &Reading) -> f64 {
    let capacity = counter
        .limits()
        .get(all.limit_index)
        .map_or(0, |l| l.capacity());
    if capacity == 0 {
        return 0.0;
    }
    let theirs = rlqs.remaining.saturating_sub(all.remaining);
    (theirs as f64 / f64::from(capacity)).min(1.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tollgate_core::{
        Capacity, Limit, ManualClock, MemoryStore, NANOS_PER_SECOND, Timestamp, Unit,
    };

    use super::*;

    #[tokio::test]
    async fn the_part_other_clients_count_is_left_out_of_the_rate() {
        let clock = ManualClock::new(Timestamp::from_nanos(600 * NANOS_PER_SECOND));
        let store = Store::Memory(MemoryStore::new(Capacity::default(), Arc::new(clock)));
        let counter = Counter::for_limits("d", [("k", "v")], &[Limit::new(100, Unit::Minute)]);
        let charged = charge(&store, &counter, 10).await.expect("memory");
        assert_eq!((charged.reading.remaining, charged.others), (90, 0.0));
        // ShouldRateLimit takes 40 on the same counter.
        counter.consume(&store, 40).await.expect("memory");
        let charged = charge(&store, &counter, 10).await.expect("memory");
        assert_eq!((charged.reading.remaining, charged.others), (40, 0.4));
        // Past the limit, the others hold what the Envoys do not.
        counter.charge(&store, 500).await.expect("memory");
        assert_eq!(
            charge(&store, &counter, 0).await.expect("memory").others,
            0.8
        );
    }
}
