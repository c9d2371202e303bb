//! A sketch over a sliding span of time: a ring of sketches, one per sub-window, merged
//! when read. A sub-window is forgotten whole once the span has passed it, so the span read
//! is between `SUB_WINDOWS - 1` and `SUB_WINDOWS` sub-windows long.

use super::sketch::Sketch;
use crate::clock::Timestamp;

/// Sub-windows per span.
pub const SUB_WINDOWS: u64 = 6;

/// A key's estimate over a span: its true count is at most `count` and at least
/// `count - error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Estimate {
    pub(crate) key: String,
    pub(crate) count: u64,
    pub(crate) error: u64,
}

/// One sub-window's sketch.
#[derive(Debug)]
struct Part {
    /// The sub-window's number since the epoch; `u64::MAX` before any.
    epoch: u64,
    sketch: Sketch,
}

/// Sketches of the last [`SUB_WINDOWS`] sub-windows of `sub_nanos` each.
#[derive(Debug)]
pub(crate) struct Windowed {
    sub_nanos: u64,
    parts: [Part; SUB_WINDOWS as usize],
}

impl Windowed {
    /// A span of [`SUB_WINDOWS`] sub-windows of `sub_nanos` (not zero) each.
    pub(crate) fn new(sub_nanos: u64) -> Self {
        Self {
            sub_nanos: sub_nanos.max(1),
            parts: std::array::from_fn(|_| Part {
                epoch: u64::MAX,
                sketch: Sketch::default(),
            }),
        }
    }

    /// Counts `weight` for `key` at `now`.
    pub(crate) fn add(&mut self, now: Timestamp, hash: u64, key: &str, weight: u64) {
        let epoch = now.as_nanos() / self.sub_nanos;
        let part = &mut self.parts[(epoch % SUB_WINDOWS) as usize];
        if part.epoch != epoch {
            part.sketch.clear();
            part.epoch = epoch;
        }
        part.sketch.add(hash, key, weight);
    }

    /// The sketches of the span ending at `now`.
    fn live(&self, now: Timestamp) -> impl Iterator<Item = &Sketch> + Clone {
        let current = now.as_nanos() / self.sub_nanos;
        self.parts
            .iter()
            .filter(move |p| p.epoch <= current && p.epoch + SUB_WINDOWS > current)
            .map(|p| &p.sketch)
    }

    /// Every key held in the span ending at `now`, with its estimate over the span: a
    /// sub-window that does not hold the key adds its floor to the count and the error.
    /// Heaviest first.
    pub(crate) fn estimates(&self, now: Timestamp) -> Vec<Estimate> {
        let live = self.live(now);
        let mut keys: Vec<(u64, &str)> = live
            .clone()
            .flat_map(|s| s.slots().iter().map(|slot| (slot.hash, slot.key.as_str())))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut estimates: Vec<Estimate> = keys
            .into_iter()
            .map(|(hash, key)| {
                let (mut count, mut error) = (0u64, 0u64);
                for sketch in live.clone() {
                    let (c, e) = sketch
                        .get(hash, key)
                        .map_or((sketch.floor(), sketch.floor()), |s| (s.count, s.error));
                    count = count.saturating_add(c);
                    error = error.saturating_add(e);
                }
                Estimate {
                    key: key.to_owned(),
                    count,
                    error,
                }
            })
            .collect();
        estimates.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        estimates
    }
}

#[cfg(test)]
impl Windowed {
    /// Slots held and bytes their keys reserve.
    pub(super) fn footprint(&self) -> (usize, usize) {
        self.parts.iter().fold((0, 0), |(slots, bytes), p| {
            let (s, b) = p.sketch.footprint();
            (slots + s, bytes + b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NANOS_PER_SECOND;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_nanos(seconds * NANOS_PER_SECOND)
    }

    fn add(w: &mut Windowed, now: Timestamp, key: &str) {
        w.add(now, super::super::hash_key(key), key, 1);
    }

    #[test]
    fn sub_windows_are_summed_and_old_ones_forgotten() {
        let mut w = Windowed::new(10 * NANOS_PER_SECOND);
        add(&mut w, at(1_000), "a");
        add(&mut w, at(1_015), "a");
        add(&mut w, at(1_015), "b");
        let counts = |w: &Windowed, now| {
            w.estimates(now)
                .into_iter()
                .map(|e| (e.key, e.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(counts(&w, at(1_020)), [("a".into(), 2), ("b".into(), 1)]);
        // 1_000 falls out of the span once six sub-windows have started after it.
        assert_eq!(counts(&w, at(1_060)), [("a".into(), 1), ("b".into(), 1)]);
        assert_eq!(counts(&w, at(1_070)), []);
    }
}
