//! Units this instance has asked the store to count and not yet heard about, per counter
//! (approximately: counters share a fixed set of slots by hash, so a slot may hold more
//! than one counter's units, never fewer).
//!
//! A request decided without the store must not admit what those calls are about to
//! admit too: the local view holds only the answers that have landed, so with one unit
//! left and a call for it on its way, a fallback that read the view alone would admit a
//! second request for the same unit. Counting other counters' units in a shared slot
//! only makes a fallback stricter.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algo::Hits;

/// Slots: enough that concurrent requests of different counters rarely share one.
const SLOTS: usize = 4_096;

/// The units on their way to the store, by slot.
pub(crate) struct InFlight {
    slots: Box<[AtomicU64]>,
    hasher: RandomState,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight").finish_non_exhaustive()
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }
}

/// A call's units while it is out; given back when dropped.
pub(crate) struct Sent<'a> {
    slot: &'a AtomicU64,
    units: u64,
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        if self.units > 0 {
            self.slot.fetch_sub(self.units, Ordering::Relaxed);
        }
    }
}

impl Sent<'_> {
    /// Units in flight for this call's counter besides its own.
    pub(crate) fn others(&self) -> u64 {
        self.slot.load(Ordering::Relaxed).saturating_sub(self.units)
    }
}

impl InFlight {
    /// Units on their way for counter `key` (and any sharing its slot).
    pub(crate) fn units(&self, key: &str) -> u64 {
        self.slot(key).load(Ordering::Relaxed)
    }

    fn slot(&self, key: &str) -> &AtomicU64 {
        let index = usize::try_from(self.hasher.hash_one(key) % SLOTS as u64).unwrap_or(0);
        &self.slots[index]
    }

    /// Records that a call for `hits` on counter `key` is on its way.
    pub(crate) fn send(&self, key: &str, hits: Hits) -> Sent<'_> {
        let units = match hits {
            Hits::Consume(n) | Hits::Charge(n) => n,
            Hits::Check | Hits::Refund(_) => 0,
        };
        let slot = self.slot(key);
        if units == 0 {
            return Sent { slot, units };
        }
        // Held at u64::MAX rather than wrap; the call takes back only what it added.
        let before = slot
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(units))
            })
            .unwrap_or_else(|v| v);
        Sent {
            slot,
            units: before.saturating_add(units) - before,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_sees_the_others_of_its_counter_until_they_land() {
        let in_flight = InFlight::default();
        let first = in_flight.send("k", Hits::Consume(3));
        let second = in_flight.send("k", Hits::Consume(1));
        let check = in_flight.send("k", Hits::Check);
        assert_eq!(first.others(), 1);
        assert_eq!(second.others(), 3);
        assert_eq!(check.others(), 4);
        drop(first);
        assert_eq!(second.others(), 0);
        assert_eq!(check.others(), 1);
    }

    #[test]
    fn units_in_flight_hold_at_the_top_and_come_back_to_zero() {
        let in_flight = InFlight::default();
        let first = in_flight.send("k", Hits::Charge(u64::MAX - 1));
        let second = in_flight.send("k", Hits::Charge(5));
        assert_eq!(in_flight.units("k"), u64::MAX);
        assert_eq!(second.others(), u64::MAX - 1);
        drop(first);
        assert_eq!(in_flight.units("k"), 1, "the second added only what fitted");
        drop(second);
        assert_eq!(in_flight.units("k"), 0);
    }
}
