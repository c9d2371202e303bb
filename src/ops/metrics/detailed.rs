//! The series of a `detailed_metric` rule, one per request value up to a cap, found on
//! the request path without a lock or an allocation: an open-addressing table of slots
//! that are each set once. Only a value seen for the first time allocates its names.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One value's names (the rule's keys with the request's values) and its series.
struct Slot<T> {
    names: Box<[(Box<str>, Box<str>)]>,
    stats: T,
}

/// Series by request value, at most `cap` of them.
pub(crate) struct ByValue<T> {
    /// Twice the cap, so that a probe always ends at an empty slot.
    slots: Box<[OnceLock<Slot<T>>]>,
    used: AtomicUsize,
    cap: usize,
    hasher: RandomState,
}

impl<T> ByValue<T> {
    /// Room for `cap` values.
    pub(super) fn new(cap: usize) -> Self {
        let len = cap.saturating_mul(2).next_power_of_two().max(2);
        Self {
            slots: (0..len).map(|_| OnceLock::new()).collect(),
            used: AtomicUsize::new(0),
            cap,
            hasher: RandomState::new(),
        }
    }

    /// The series of the value named by `names` (a fresh iterator each call), made by
    /// `make` the first time while there is room; none past the cap.
    pub(super) fn get<'n, I>(&self, names: impl Fn() -> I, make: impl FnOnce() -> T) -> Option<&T>
    where
        I: Iterator<Item = (&'n str, &'n str)>,
    {
        let mut hasher = self.hasher.build_hasher();
        for (key, value) in names() {
            key.hash(&mut hasher);
            value.hash(&mut hasher);
        }
        let mask = self.slots.len() - 1;
        let mut at = usize::try_from(hasher.finish()).unwrap_or(usize::MAX) & mask;
        let mut make = Some(make);
        let mut made = None;
        for _ in 0..self.slots.len() {
            let slot = &self.slots[at];
            match slot.get() {
                Some(held) if same(&held.names, names()) => return Some(&held.stats),
                Some(_) => at = (at + 1) & mask,
                None => {
                    if self.used.fetch_add(1, Ordering::Relaxed) >= self.cap {
                        self.used.fetch_sub(1, Ordering::Relaxed);
                        return None;
                    }
                    let stats = match made.take() {
                        Some(stats) => stats,
                        None => make.take()?(),
                    };
                    let owned = names().map(|(k, v)| (k.into(), v.into())).collect();
                    if let Err(lost) = slot.set(Slot {
                        names: owned,
                        stats,
                    }) {
                        // Another request filled this slot first: look at it again.
                        self.used.fetch_sub(1, Ordering::Relaxed);
                        made = Some(lost.stats);
                        continue;
                    }
                    return slot.get().map(|held| &held.stats);
                }
            }
        }
        None
    }
}

fn same<'n>(
    held: &[(Box<str>, Box<str>)],
    mut names: impl Iterator<Item = (&'n str, &'n str)>,
) -> bool {
    held.iter().all(|(k, v)| {
        names
            .next()
            .is_some_and(|(nk, nv)| nk == &**k && nv == &**v)
    }) && names.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_keeps_its_series_and_the_cap_holds() {
        let by_value: ByValue<u32> = ByValue::new(2);
        let a = [("user", "ann")];
        let b = [("user", "bob")];
        let first = by_value.get(|| a.iter().copied(), || 1).copied();
        let again = by_value.get(|| a.iter().copied(), || 99).copied();
        assert_eq!((first, again), (Some(1), Some(1)));
        assert_eq!(by_value.get(|| b.iter().copied(), || 2).copied(), Some(2));
        let c = [("user", "cyd")];
        assert_eq!(
            by_value.get(|| c.iter().copied(), || 3),
            None,
            "past the cap"
        );
        // Names are compared whole: a prefix is another value.
        let longer = [("user", "ann"), ("path", "/")];
        assert_eq!(by_value.get(|| longer.iter().copied(), || 4), None);
        assert_eq!(by_value.get(|| b.iter().copied(), || 5).copied(), Some(2));
    }
}
