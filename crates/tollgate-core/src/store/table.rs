//! An open-addressing hash table for counters, made for memory per entry and for eviction:
//! entries live inline in one array (no allocation per entry), the array grows by a fifth
//! rather than doubling (so it is 73–88 % full, not 44–88 %), and any slot can be read
//! directly, so eviction samples truly random entries.
//!
//! Keys are already uniform random 128-bit hashes (see `shards.rs`), so a slot is found by
//! scaling the key onto the array and probing linearly. A byte per slot (empty, or seven
//! bits of the key) lets a probe skim a cache line of slots per read, so the long probes of
//! a full linear-probing table stay cheap; removal shifts the entries after it back, so the
//! table never holds tombstones.

/// A counter's key: a keyed 128-bit hash of its name; never all zeros.
pub(crate) type Key = [u64; 2];

/// The fullest the table gets before it grows.
const MAX_LOAD: (usize, usize) = (7, 8);
/// The smallest array a table allocates.
const MIN_SLOTS: usize = 16;

/// A value and the hash of its key, as a slot holds them.
#[derive(Debug)]
struct Keyed<V> {
    key: Key,
    value: V,
}

/// The table; see the module documentation.
#[derive(Debug)]
pub(crate) struct Table<V> {
    /// Per slot: 0 when empty, else [`tag`] of its key.
    tags: Vec<u8>,
    slots: Vec<Option<Keyed<V>>>,
    len: usize,
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Self {
            tags: Vec::new(),
            slots: Vec::new(),
            len: 0,
        }
    }
}

/// Seven bits of a key, never 0, for the slot's tag byte.
fn tag(key: &Key) -> u8 {
    (key[1] >> 57) as u8 | 0x80
}

impl<V> Table<V> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes the slot array takes.
    pub(crate) fn bytes(&self) -> usize {
        Self::bytes_for(self.slots.len())
    }

    /// Bytes an array of `slots` slots takes.
    pub(crate) fn bytes_for(slots: usize) -> usize {
        slots.saturating_mul(std::mem::size_of::<Option<Keyed<V>>>() + 1)
    }

    /// The array size the next insert needs, if it needs the table to grow.
    pub(crate) fn growth_needed(&self) -> Option<usize> {
        let full = self.slots.len() * MAX_LOAD.0 / MAX_LOAD.1;
        (self.len + 1 > full).then(|| (self.slots.len() + self.slots.len() / 5).max(MIN_SLOTS))
    }

    fn home(&self, key: &Key) -> usize {
        // Scales the uniform key onto the array without a division.
        ((u128::from(key[0]) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() { 0 } else { i + 1 }
    }

    /// The slot holding `key`.
    fn find(&self, key: &Key) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(key);
        let wanted = tag(key);
        // There is always an empty slot, which ends every probe.
        loop {
            match self.tags[i] {
                0 => return None,
                t if t == wanted && self.slots[i].as_ref().is_some_and(|e| e.key == *key) => {
                    return Some(i);
                }
                _ => i = self.next(i),
            }
        }
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        let i = self.find(key)?;
        self.slots[i].as_ref().map(|e| &e.value)
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        let i = self.find(key)?;
        self.slots[i].as_mut().map(|e| &mut e.value)
    }

    /// Inserts or replaces; grows the array first if it is full.
    pub(crate) fn insert(&mut self, key: Key, value: V) {
        if let Some(i) = self.find(&key) {
            self.slots[i] = Some(Keyed { key, value });
            return;
        }
        if let Some(slots) = self.growth_needed() {
            self.resize(slots);
        }
        self.place(Keyed { key, value });
    }

    /// Puts an absent entry in the first empty slot from its home.
    fn place(&mut self, entry: Keyed<V>) {
        let mut i = self.home(&entry.key);
        while self.tags[i] != 0 {
            i = self.next(i);
        }
        self.tags[i] = tag(&entry.key);
        self.slots[i] = Some(entry);
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        let i = self.find(key)?;
        self.remove_at(i)
    }

    /// Empties slot `i` and shifts the entries after it back, so that every entry stays
    /// reachable from its home slot without passing an empty one.
    fn remove_at(&mut self, i: usize) -> Option<V> {
        let removed = self.slots[i].take()?;
        self.tags[i] = 0;
        self.len -= 1;
        let mut hole = i;
        let mut j = self.next(i);
        while let Some(entry) = &self.slots[j] {
            let home = self.home(&entry.key);
            // The entry may stay if its home lies cyclically in (hole, j].
            let stays = if hole < j {
                hole < home && home <= j
            } else {
                home > hole || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j].take();
                self.tags[hole] = std::mem::take(&mut self.tags[j]);
                hole = j;
            }
            j = self.next(j);
        }
        Some(removed.value)
    }

    fn resize(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.slots, (0..slots).map(|_| None).collect());
        self.tags = vec![0; slots];
        self.len = 0;
        for entry in old.into_iter().flatten() {
            self.place(entry);
        }
    }

    /// The first entry at or after slot `start` (any number; it is reduced onto the array).
    pub(crate) fn sample(&self, start: u64) -> Option<(Key, &V)> {
        if self.len == 0 {
            return None;
        }
        let mut i = ((u128::from(start) * self.slots.len() as u128) >> 64) as usize;
        while self.tags[i] == 0 {
            i = self.next(i);
        }
        self.slots[i].as_ref().map(|e| (e.key, &e.value))
    }

    /// Removes every entry `keep` refuses; how many went.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) -> usize {
        let Some(start) = self.tags.iter().position(|t| *t == 0) else {
            return 0;
        };
        // From an empty slot once round the ring: entries only ever shift back towards
        // their homes, never across that empty slot, so each is seen once.
        let before = self.len;
        let mut i = self.next(start);
        let mut seen = 0;
        while seen < self.slots.len() - 1 {
            match &self.slots[i] {
                Some(e) if !keep(&e.value) => {
                    self.remove_at(i);
                    // The slot may now hold a shifted entry: look at it again.
                }
                _ => {
                    i = self.next(i);
                    seen += 1;
                }
            }
        }
        before - self.len
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn key(n: u64) -> Key {
        // Spread like a hash would be, but predictable.
        [n.wrapping_mul(0x9E37_79B9_7F4A_7C15), n | 1]
    }

    #[test]
    fn grows_by_a_fifth_and_keeps_everything() {
        let mut t = Table::default();
        for n in 0..1_000 {
            t.insert(key(n), n);
        }
        assert_eq!(t.len(), 1_000);
        assert!(t.slots.len() * 7 / 8 >= 1_000 && t.slots.len() * 72 / 100 <= 1_000);
        assert!((0..1_000).all(|n| t.get(&key(n)) == Some(&n)));
        assert_eq!(t.get(&key(5_000)), None);
    }

    #[test]
    fn sampling_reaches_every_entry() {
        let mut t = Table::default();
        for n in 0..50 {
            t.insert(key(n), n);
        }
        let mut seen = std::collections::HashSet::new();
        for start in 0..10_000u64 {
            if let Some((_, v)) = t.sample(start.wrapping_mul(0x2545_F491_4F6C_DD1D)) {
                seen.insert(*v);
            }
        }
        assert_eq!(seen.len(), 50);
        assert_eq!(Table::<u64>::default().sample(7), None);
    }

    proptest! {
        /// Any mix of inserts, removals and retains leaves the table agreeing with a map.
        #[test]
        fn behaves_like_a_map(
            ops in prop::collection::vec((0u8..4, 0u64..64, any::<u64>()), 1..400),
        ) {
            let mut t = Table::default();
            let mut model = HashMap::new();
            for (op, n, v) in ops {
                // Few distinct homes: long clusters that wrap round the array.
                let k = [n << 58, n + 1];
                match op {
                    0 | 1 => {
                        t.insert(k, v);
                        model.insert(n, v);
                    }
                    2 => prop_assert_eq!(t.remove(&k), model.remove(&n)),
                    _ => {
                        let removed = t.retain(|value| value % 3 != 0);
                        let before = model.len();
                        model.retain(|_, value| *value % 3 != 0);
                        prop_assert_eq!(removed, before - model.len());
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                for m in 0..64u64 {
                    prop_assert_eq!(t.get(&[m << 58, m + 1]), model.get(&m));
                }
            }
        }
    }
}
