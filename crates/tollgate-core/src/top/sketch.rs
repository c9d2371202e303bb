//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005): the heaviest keys of a stream in
//! a fixed number of slots.
//!
//! Error bound: over a stream of total weight `N` into `CAPACITY` slots, every key whose
//! true count exceeds `N / CAPACITY` holds a slot; a held key's count is never below its
//! true count and overestimates it by at most its `error`, which is at most `N / CAPACITY`;
//! a key without a slot counted at most [`Sketch::floor`].

/// Slots per sketch.
pub const CAPACITY: usize = 64;

/// One held key.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) hash: u64,
    pub(crate) count: u64,
    /// How much of `count` may belong to keys this slot held before.
    pub(crate) error: u64,
    pub(crate) key: String,
}

/// At most [`CAPACITY`] keys with their counts. Clearing keeps the slots' buffers, so a
/// sketch in use allocates only when a key is longer than any its slot held before.
#[derive(Debug, Default)]
pub(crate) struct Sketch {
    slots: Vec<Slot>,
    len: usize,
}

impl Sketch {
    /// Forgets every key, keeping the memory.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Counts `weight` for `key` (whose hash is `hash`). A key not held takes the slot of
    /// the least counted one, and inherits its count as its error.
    pub(crate) fn add(&mut self, hash: u64, key: &str, weight: u64) {
        let mut least = 0;
        let mut least_count = u64::MAX;
        for (i, slot) in self.slots[..self.len].iter_mut().enumerate() {
            if slot.hash == hash && slot.key == key {
                slot.count = slot.count.saturating_add(weight);
                return;
            }
            if slot.count < least_count {
                (least, least_count) = (i, slot.count);
            }
        }
        if self.len < CAPACITY {
            least = self.len;
            least_count = 0;
            self.len += 1;
            if least == self.slots.len() {
                self.slots.push(Slot {
                    hash,
                    count: 0,
                    error: 0,
                    key: String::new(),
                });
            }
        }
        let slot = &mut self.slots[least];
        slot.hash = hash;
        slot.count = least_count.saturating_add(weight);
        slot.error = least_count;
        slot.key.clear();
        slot.key.push_str(key);
    }

    /// The held keys.
    pub(crate) fn slots(&self) -> &[Slot] {
        &self.slots[..self.len]
    }

    /// The held slot of `key`.
    pub(crate) fn get(&self, hash: u64, key: &str) -> Option<&Slot> {
        self.slots()
            .iter()
            .find(|slot| slot.hash == hash && slot.key == key)
    }

    /// The most a key without a slot can have counted: the least held count once every
    /// slot is taken, else nothing.
    pub(crate) fn floor(&self) -> u64 {
        if self.len < CAPACITY {
            return 0;
        }
        self.slots().iter().map(|s| s.count).min().unwrap_or(0)
    }
}

#[cfg(test)]
impl Sketch {
    /// Slots allocated and bytes their keys reserve, held or not.
    pub(super) fn footprint(&self) -> (usize, usize) {
        let bytes = self.slots.iter().map(|s| s.key.capacity()).sum();
        (self.slots.len(), bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(sketch: &mut Sketch, key: &str, weight: u64) {
        sketch.add(super::super::hash_key(key), key, weight);
    }

    #[test]
    fn keys_below_capacity_are_counted_exactly() {
        let mut sketch = Sketch::default();
        for i in 0..CAPACITY {
            add(&mut sketch, &format!("k{i}"), i as u64 + 1);
        }
        add(&mut sketch, "k3", 10);
        let k3 = sketch
            .get(super::super::hash_key("k3"), "k3")
            .expect("held");
        assert_eq!((k3.count, k3.error), (14, 0));
        assert_eq!(sketch.floor(), 1);
    }

    #[test]
    fn a_new_key_takes_the_least_slot_and_its_count_as_error() {
        let mut sketch = Sketch::default();
        for i in 0..CAPACITY {
            add(&mut sketch, &format!("k{i}"), 5);
        }
        add(&mut sketch, "k0", 1);
        add(&mut sketch, "new", 2);
        let new = sketch
            .get(super::super::hash_key("new"), "new")
            .expect("held");
        assert_eq!((new.count, new.error), (7, 5));
        assert_eq!(sketch.slots().len(), CAPACITY);
        assert!(sketch.get(super::super::hash_key("k1"), "k1").is_none());
    }

    #[test]
    fn clearing_keeps_the_buffers() {
        let mut sketch = Sketch::default();
        add(&mut sketch, "a-long-key", 1);
        let buffer = sketch.slots()[0].key.as_ptr();
        sketch.clear();
        assert!(sketch.slots().is_empty());
        add(&mut sketch, "short", 1);
        assert_eq!(sketch.slots()[0].key.as_ptr(), buffer);
    }
}
