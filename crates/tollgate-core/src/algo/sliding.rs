//! The sliding-window approximation: N epoch-aligned sub-windows, the oldest one weighted
//! by how much of it is still inside the window.
//!
//! At time t in sub-window b, a fraction f of b elapsed, the count is
//! Σ c[b-N+1..=b] + c[b-N] × w, and a request is admitted iff count + hits ≤ limit (only
//! admitted hits are counted). The window (t − W, t] begins at the same fraction f of the
//! oldest sub-window, b − N. The weight w assumes that sub-window's hits were spread
//! evenly over [start, end], where `start` is where its count reached two and `end` where
//! its last hit landed: w is the part of [start, end] after f,
//! w = clamp((end − max(f, start)) / (end − start), 0, 1), and when start = end, 1 while
//! f < end and 0 from there on. So a hit is forgotten exactly one window after it was
//! counted (to the resolution of f), wherever in its sub-window it fell, and the wait a
//! denial is told (the first instant the hits fit) is never longer than the window.
//! Assuming the hits spread over the whole sub-window (Cloudflare's two-counter form,
//! start = 0, end = 1) under-counts when traffic begins mid-sub-window, so the first
//! window of an overload admits up to a sub-window too much, and over-counts when it
//! stops early, so a request made early in a sub-window counts up to a sub-window past
//! its window. Measuring both ends removes both (onset and steady state within 0.5 % at
//! precision 10, see the tests). The second hit, not the first, marks the start, so that
//! one stray early hit does not make a late sub-window look evenly filled. With a single
//! sub-window (precision 1) the start is not tracked (the steadier there), the end is.
//!
//! Time is measured on a grid: f in 1/65,536ths of a sub-window, rounded down, `end` on
//! the same grid (two bytes per sub-window), `start` in 1/256ths (one byte). Counts read
//! at most u32::MAX. The comparison c × (end − max(f, start)) ≤ room × (end − start) then
//! stays below 2^53, so the Redis script computes exactly the same answer in Lua's floats.

use super::{LimitVerdict, mul_div};
use crate::clock::Timestamp;
use crate::limit::Limit;

/// Fractions of a sub-window, for the time elapsed in it.
const FINE: u64 = 1 << 16;
/// Fractions of a sub-window for where its hits began: one byte.
const COARSE: u64 = 1 << 8;
/// The end of a sub-window whose last hit is not known (stored by a version that did not
/// record it): its hits count until the sub-window has almost left the window.
#[cfg(any(feature = "redis", feature = "postgres"))]
const UNKNOWN_END: u16 = u16::MAX;

/// Counts of the last N+1 sub-windows of one limit, in a ring indexed by sub-window number.
/// `newest` is the sub-window last written; slots older than `newest - N` are stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlidingWindow {
    newest: u64,
    slots: Ring,
}

/// Slots of the default precision (10 sub-windows and the weighted one), held inline: a
/// million counters must not mean a million allocations.
const INLINE_SLOTS: usize = 11;

/// One sub-window: its count, where its count reached two (in 1/256ths), and where its
/// last hit landed (in 1/65,536ths).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    count: u32,
    start: u8,
    end: u16,
}

impl Slot {
    /// How much of this sub-window's count is inside a window beginning at fraction
    /// `fine` of it, as (numerator, denominator) of a fraction of the count.
    fn weight(self, fine: u64) -> (u64, u64) {
        let start = u64::from(self.start) * (FINE / COARSE);
        let end = u64::from(self.end);
        if end <= start {
            return (u64::from(fine < end), 1);
        }
        (end.saturating_sub(fine.max(start)), end - start)
    }
}

/// The ring of sub-windows. A count holds up to u32::MAX units, far above any limit
/// (`requests_per_unit` is a u32): a saturated count still denies as the true one would.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ring {
    Inline {
        counts: [u32; INLINE_SLOTS],
        starts: [u8; INLINE_SLOTS],
        ends: [u16; INLINE_SLOTS],
    },
    Heap(Box<[Slot]>),
}

impl Ring {
    fn zeroed(len: usize) -> Self {
        if len == INLINE_SLOTS {
            Self::Inline {
                counts: [0; INLINE_SLOTS],
                starts: [0; INLINE_SLOTS],
                ends: [0; INLINE_SLOTS],
            }
        } else {
            Self::Heap(vec![Slot::default(); len].into_boxed_slice())
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Inline { .. } => INLINE_SLOTS,
            Self::Heap(slots) => slots.len(),
        }
    }

    fn get(&self, i: usize) -> Slot {
        match self {
            Self::Inline {
                counts,
                starts,
                ends,
            } => Slot {
                count: counts[i],
                start: starts[i],
                end: ends[i],
            },
            Self::Heap(slots) => slots[i],
        }
    }

    fn set(&mut self, i: usize, slot: Slot) {
        match self {
            Self::Inline {
                counts,
                starts,
                ends,
            } => {
                counts[i] = slot.count;
                starts[i] = slot.start;
                ends[i] = slot.end;
            }
            Self::Heap(slots) => slots[i] = slot,
        }
    }
}

/// A point in time as the window sees it: sub-window index, time into it, sub-window length,
/// in the integer nanoseconds the stores' scripts compute in.
#[derive(Debug, Clone, Copy)]
struct At {
    slot: u64,
    into_ns: u64,
    sub_ns: u64,
}

impl At {
    /// The time elapsed in the sub-window, in 1/65,536ths, rounded down.
    fn fine(self) -> u64 {
        mul_div(self.into_ns, FINE, self.sub_ns)
    }
}

impl SlidingWindow {
    pub(crate) fn new(precision: u32) -> Self {
        let slots = usize::try_from(precision.max(1)).unwrap_or(1) + 1;
        Self {
            newest: 0,
            slots: Ring::zeroed(slots),
        }
    }

    /// A window as stored elsewhere: the newest sub-window and the ring of sub-windows,
    /// indexed by sub-window number modulo its length (precision + 1), each packed as
    /// count × 256 + start, and the ring of their ends (none from a store written before
    /// ends were kept: each sub-window then counts until it has almost left the window).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn from_ring(
        newest: u64,
        packed: impl ExactSizeIterator<Item = u64>,
        ends: Option<impl Iterator<Item = u64>>,
    ) -> Self {
        let mut slots = Ring::zeroed(packed.len().max(2));
        let mut ends = ends.into_iter().flatten();
        for (i, value) in packed.enumerate() {
            let end = ends
                .next()
                .map_or(UNKNOWN_END, |end| u16::try_from(end).unwrap_or(UNKNOWN_END));
            let slot = Slot {
                count: u32::try_from(value / COARSE).unwrap_or(u32::MAX),
                start: (value % COARSE) as u8,
                end,
            };
            slots.set(i, slot);
        }
        Self { newest, slots }
    }

    fn precision(&self) -> u64 {
        self.slots.len() as u64 - 1
    }

    fn at(&self, limit: &Limit, now: Timestamp) -> At {
        let now_ns = now.as_nanos();
        let sub_ns = self.sub_ns(limit);
        let slot = now_ns / sub_ns;
        if slot < self.newest {
            // The clock stepped back: count from the start of the newest sub-window, where
            // the oldest one still weighs fully, which can only under-admit.
            return At {
                slot: self.newest,
                into_ns: 0,
                sub_ns,
            };
        }
        At {
            slot,
            into_ns: now_ns % sub_ns,
            sub_ns,
        }
    }

    fn index(&self, slot: u64) -> usize {
        // The remainder is below the ring's length, which is a usize.
        (slot % self.slots.len() as u64) as usize
    }

    fn slot(&self, slot: u64) -> Slot {
        let live = slot <= self.newest && self.newest - slot <= self.precision();
        if live {
            self.slots.get(self.index(slot))
        } else {
            Slot::default()
        }
    }

    /// Σ of the N sub-windows ending at `slot`, and the weighted one before them.
    fn full_and_oldest(&self, slot: u64) -> (u64, Slot) {
        let n = self.precision();
        let first = slot.saturating_sub(n - 1);
        let full = (first..=slot).map(|s| u64::from(self.slot(s).count)).sum();
        let oldest = slot
            .checked_sub(n)
            .map_or(Slot::default(), |s| self.slot(s));
        (full, oldest)
    }

    /// The count at `at` as a fraction: (numerator, denominator), the oldest sub-window
    /// weighed by [`Slot::weight`].
    fn count(&self, at: At) -> (u128, u128) {
        let (full, oldest) = self.full_and_oldest(at.slot);
        let (inside, denominator) = oldest.weight(at.fine());
        let numerator = u128::from(full) * u128::from(denominator)
            + u128::from(oldest.count) * u128::from(inside);
        (numerator, u128::from(denominator))
    }

    /// The length of a sub-window in nanoseconds.
    fn sub_ns(&self, limit: &Limit) -> u64 {
        (limit.window_nanos() / self.precision()).max(1)
    }

    pub(crate) fn evaluate(&self, limit: &Limit, now: Timestamp, hits: u64) -> LimitVerdict {
        let at = self.at(limit, now);
        let (used, scale) = self.count(at);
        let capacity = u128::from(limit.requests_per_unit) * scale;
        let after = used + u128::from(hits) * scale;
        if after <= capacity {
            // These hits are the last counted: everything is forgotten when they are (a
            // window from now, less the rounding of `at`; a clock stepped back is told
            // the window).
            return LimitVerdict {
                admitted: true,
                remaining: to_u64((capacity - after) / scale),
                reset: self.forgotten_at(at).since(now).min(limit.window),
            };
        }
        let wait_until = self
            .admitted_at(at, limit, hits)
            .unwrap_or_else(|| self.forgotten_at(at));
        LimitVerdict {
            admitted: false,
            remaining: to_u64(capacity.saturating_sub(used) / scale),
            reset: wait_until.since(now),
        }
    }

    /// When hits counted at `at` will have left the window (so every unit counted before
    /// too): the first instant at the same fraction of the sub-window one window later.
    fn forgotten_at(&self, at: At) -> Timestamp {
        self.instant(at.slot + self.precision(), at.fine(), at.sub_ns)
    }

    /// The first instant in sub-window `slot` whose fraction (rounded down) reaches `fine`.
    fn instant(&self, slot: u64, fine: u64, sub_ns: u64) -> Timestamp {
        let into = (u128::from(fine) * u128::from(sub_ns)).div_ceil(u128::from(FINE));
        Timestamp::from_nanos(slot.saturating_mul(sub_ns).saturating_add(to_u64(into)))
    }

    /// The earliest time from `at` on when `hits` fit, if no more units are counted.
    fn admitted_at(&self, at: At, limit: &Limit, hits: u64) -> Option<Timestamp> {
        let room = u64::from(limit.requests_per_unit).checked_sub(hits)?;
        // Sub-windows after `at.slot` hold nothing, so by N of them later all have fit:
        // `at.slot` is then the oldest, and its hits ended by `at`.
        for k in 0..=self.precision() {
            let slot = at.slot + k;
            let (full, oldest) = self.full_and_oldest(slot);
            let Some(left) = room.checked_sub(full) else {
                continue;
            };
            let from = if k == 0 { at.fine() } else { 0 };
            let count = u64::from(oldest.count);
            // The weight only falls over the sub-window, and reaches 0 at its end.
            let fine = if count <= left {
                from
            } else {
                let start = u64::from(oldest.start) * (FINE / COARSE);
                let end = u64::from(oldest.end);
                if end <= start {
                    end
                } else {
                    // count × (end − f) ≤ left × (end − start) ⇔ f ≥ end − ⌊left × (end − start) / count⌋
                    end - mul_div(left, end - start, count)
                }
            };
            let instant = self.instant(slot, fine.max(from), at.sub_ns);
            return Some(instant.max(Timestamp::from_nanos(at.slot * at.sub_ns + at.into_ns)));
        }
        None
    }

    /// Moves the ring forward to `slot`, clearing sub-windows that it reuses.
    fn advance(&mut self, slot: u64) {
        if slot <= self.newest {
            return;
        }
        let reused = (slot - self.newest).min(self.slots.len() as u64);
        for s in slot + 1 - reused..=slot {
            let i = self.index(s);
            self.slots.set(i, Slot::default());
        }
        self.newest = slot;
    }

    pub(crate) fn record(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        let at = self.at(limit, now);
        self.advance(at.slot);
        let i = self.index(at.slot);
        let mut slot = self.slots.get(i);
        if slot.count < 2 && self.precision() > 1 {
            // Where the count reaches two weights this sub-window once it is the oldest.
            slot.start = (at.fine() / (FINE / COARSE)) as u8;
        }
        // A fraction is below FINE; a clock stepping back never moves the end back.
        slot.end = slot.end.max(at.fine() as u16);
        slot.count = u32::try_from(u64::from(slot.count).saturating_add(hits)).unwrap_or(u32::MAX);
        self.slots.set(i, slot);
    }

    /// Takes `hits` back from the newest sub-windows first.
    pub(crate) fn refund(&mut self, limit: &Limit, now: Timestamp, hits: u64) {
        let at = self.at(limit, now);
        self.advance(at.slot);
        let mut left = hits;
        for slot in (at.slot.saturating_sub(self.precision())..=at.slot).rev() {
            let i = self.index(slot);
            let mut s = self.slots.get(i);
            let taken = left.min(u64::from(s.count));
            s.count -= taken as u32;
            left -= taken;
            self.slots.set(i, s);
        }
    }

    /// Gives back up to `hits` units counted in the sub-window holding `taken` (a
    /// lease's unspent block), while the ring still holds it.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn give_back(&mut self, limit: &Limit, now: Timestamp, hits: u64, taken: Timestamp) {
        let at = self.at(limit, now);
        self.advance(at.slot);
        let taken = taken.as_nanos() / at.sub_ns;
        if taken <= at.slot && at.slot - taken <= self.precision() {
            let i = self.index(taken);
            let mut s = self.slots.get(i);
            s.count -= hits.min(u64::from(s.count)) as u32;
            self.slots.set(i, s);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.slots {
            Ring::Inline { .. } => 0,
            Ring::Heap(slots) => std::mem::size_of_val::<[Slot]>(slots),
        }
    }

    pub(crate) fn expires_at(&self, limit: &Limit) -> Timestamp {
        Timestamp::from_nanos(
            (self.newest + self.precision() + 1).saturating_mul(self.sub_ns(limit)),
        )
    }
}

fn to_u64(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::testing::{SECOND, at, limit};
    use crate::clock::nanos_of;
    use crate::limit::Algorithm;
    use proptest::prelude::*;

    const MS: u64 = crate::clock::NANOS_PER_MILLI;

    fn sliding(requests: u32, window_ns: u64, precision: u32) -> (Limit, SlidingWindow) {
        let l = limit(Algorithm::SlidingWindow { precision }, requests, window_ns);
        (l, SlidingWindow::new(precision))
    }

    /// Offers one request; records it if admitted.
    fn offer(state: &mut SlidingWindow, l: &Limit, now: u64, hits: u64) -> LimitVerdict {
        let d = state.evaluate(l, at(now), hits);
        if d.admitted {
            state.record(l, at(now), hits);
        }
        d
    }

    /// The most units admitted in any window (t − W, t] of an exact sliding log.
    fn max_in_any_window(admitted: &[(u64, u64)], window_ns: u64) -> u64 {
        let mut best = 0;
        let mut start = 0;
        let mut sum = 0;
        for &(t, hits) in admitted {
            sum += hits;
            while admitted[start].0 + window_ns <= t {
                sum -= admitted[start].1;
                start += 1;
            }
            best = best.max(sum);
        }
        best
    }

    #[test]
    fn a_burst_gets_exactly_the_limit() {
        let (l, mut s) = sliding(10, SECOND, 10);
        let now = 5 * SECOND + 123 * MS;
        for i in 0..10 {
            let d = offer(&mut s, &l, now, 1);
            assert!(d.admitted);
            assert_eq!(d.remaining, 9 - i);
        }
        let d = offer(&mut s, &l, now, 1);
        assert!(!d.admitted);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn hits_are_all_or_nothing() {
        let (l, mut s) = sliding(10, SECOND, 10);
        assert_eq!(offer(&mut s, &l, 0, 7).remaining, 3);
        assert!(!offer(&mut s, &l, 0, 4).admitted);
        let d = offer(&mut s, &l, 0, 3);
        assert!(d.admitted);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn zero_limit_blocks_everything() {
        let (l, mut s) = sliding(0, SECOND, 10);
        assert!(!offer(&mut s, &l, 42 * SECOND, 1).admitted);
    }

    #[test]
    fn precision_one_weighs_the_previous_window_up_to_its_last_hit() {
        let (l, mut s) = sliding(50, SECOND, 1);
        // Deterministic pseudo-random arrivals over 20 windows.
        let mut t = 0u64;
        let mut seed = 7u64;
        let (mut previous, mut current, mut current_window) = (0u64, 0u64, 0u64);
        // Where the last admitted hit of each window landed, in 1/65,536ths.
        let fine = |t: u64| (t % SECOND) * 65_536 / SECOND;
        let (mut previous_end, mut current_end) = (0u64, 0u64);
        while t < 20 * SECOND {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            t += (seed >> 33) % (40 * MS);
            let hits = 1 + (seed >> 20) % 3;
            let window = t / SECOND;
            if window != current_window {
                (previous, previous_end) = if window == current_window + 1 {
                    (current, current_end)
                } else {
                    (0, 0)
                };
                (current, current_end) = (0, 0);
                current_window = window;
            }
            // The previous window's hits spread evenly over [0, end]: the part after f.
            let f = fine(t);
            let weight = if previous_end == 0 {
                0.0
            } else {
                previous_end.saturating_sub(f) as f64 / previous_end as f64
            };
            let formula = current as f64 + previous as f64 * weight + hits as f64;
            let expected = formula <= 50.0 + 1e-9;
            let d = offer(&mut s, &l, t, hits);
            assert_eq!(d.admitted, expected, "at t={t} formula={formula}");
            if d.admitted {
                current += hits;
                current_end = f;
            }
        }
    }

    /// Offers 3× the limit, evenly spaced, for `windows` windows from `start`; returns the
    /// admitted (time, hits).
    fn steady_overload(l: &Limit, start: u64, windows: u64) -> Vec<(u64, u64)> {
        let Algorithm::SlidingWindow { precision } = l.algorithm else {
            panic!("a sliding-window limit");
        };
        let mut s = SlidingWindow::new(precision);
        let gap = l.window_nanos() / (3 * u64::from(l.requests_per_unit));
        let mut admitted = Vec::new();
        let mut t = start;
        while t < start + windows * l.window_nanos() {
            if offer(&mut s, l, t, 1).admitted {
                admitted.push((t, 1));
            }
            t += gap;
        }
        admitted
    }

    /// The worst any-alignment window and the average admitted per window, for 3× steady
    /// overload starting at `start` (first window included).
    fn overload_figures(precision: u32, start: u64) -> (u64, f64) {
        let (l, _) = sliding(1_000, SECOND, precision);
        let admitted = steady_overload(&l, start, 8);
        let worst = max_in_any_window(&admitted, SECOND);
        // Whole windows after the first, so the average sees only the steady state.
        let steady = admitted
            .iter()
            .filter(|(t, _)| *t >= start + SECOND && *t < start + 8 * SECOND)
            .count();
        (worst, steady as f64 / 7.0)
    }

    #[test]
    fn an_overload_is_held_to_the_limit_from_its_first_window() {
        // Onsets at many phases of the sub-windows and of the window.
        for precision in [2, 10, 60] {
            for phase_ms in (0..1_000).step_by(73) {
                let (worst, average) = overload_figures(precision, 17 * SECOND + phase_ms * MS);
                assert!(
                    worst <= 1_005,
                    "precision {precision}, onset at +{phase_ms} ms: {worst} in one window"
                );
                assert!(
                    (970.0..=1_000.0).contains(&average),
                    "precision {precision}, onset at +{phase_ms} ms: {average} a window"
                );
            }
        }
    }

    #[test]
    fn the_two_counter_form_overshoots_only_at_the_onset() {
        // Precision 1 does not track where hits began: steady state holds, the first
        // window may admit up to a sub-window extra.
        for phase_ms in (0..1_000).step_by(73) {
            let start = 17 * SECOND + phase_ms * MS;
            let (l, _) = sliding(1_000, SECOND, 1);
            let admitted = steady_overload(&l, start, 6);
            let steady: Vec<_> = admitted
                .iter()
                .copied()
                .filter(|(t, _)| *t >= start + 2 * SECOND)
                .collect();
            assert!(max_in_any_window(&steady, SECOND) <= 1_001);
            assert!(max_in_any_window(&admitted, SECOND) <= 2_000);
        }
    }

    #[test]
    fn a_denied_request_is_told_when_it_will_fit() {
        let (l, mut s) = sliding(10, SECOND, 10);
        for _ in 0..10 {
            offer(&mut s, &l, 0, 1);
        }
        let denied = offer(&mut s, &l, 250 * MS, 1);
        assert!(!denied.admitted);
        let retry_at = 250 * MS + nanos_of(denied.reset);
        assert!(!s.evaluate(&l, at(retry_at - 1), 1).admitted);
        assert!(s.evaluate(&l, at(retry_at), 1).admitted);
        // The burst came at 0: it is forgotten one window later, all at once.
        assert_eq!(retry_at, SECOND);
        assert!(s.evaluate(&l, at(retry_at), 10).admitted);
    }

    #[test]
    fn an_admitted_request_is_told_one_window() {
        let (l, mut s) = sliding(10, SECOND, 10);
        let d = offer(&mut s, &l, 250 * MS, 1);
        assert_eq!(nanos_of(d.reset), SECOND);
        assert!(s.expires_at(&l).as_nanos() == 1_300 * MS);
    }

    #[test]
    fn a_clock_stepping_back_never_admits_more() {
        let (l, mut s) = sliding(5, SECOND, 10);
        for _ in 0..5 {
            offer(&mut s, &l, 3 * SECOND, 1);
        }
        assert!(!offer(&mut s, &l, 2 * SECOND, 1).admitted);
    }

    #[test]
    fn refunds_free_units_and_never_go_negative() {
        let (l, mut s) = sliding(3, SECOND, 10);
        for _ in 0..3 {
            offer(&mut s, &l, 0, 1);
        }
        s.refund(&l, at(0), 10);
        assert_eq!(s.evaluate(&l, at(0), 3).remaining, 0);
        assert!(s.evaluate(&l, at(0), 3).admitted);
    }

    #[test]
    fn a_window_of_silence_forgets_requests_made_early_in_a_sub_window() {
        // Issue #40: 3 per 10 s (1 s sub-windows), three requests just after a whole
        // second, then 10.1 s of silence: the next three are all admitted.
        let (l, mut s) = sliding(3, 10 * SECOND, 10);
        let t0 = 1_790_000_001 * SECOND + MS;
        for _ in 0..3 {
            assert!(offer(&mut s, &l, t0, 1).admitted);
        }
        let later = t0 + 10_100 * MS;
        for i in 0..3 {
            assert!(offer(&mut s, &l, later, 1).admitted, "request {i}");
        }
        let denied = offer(&mut s, &l, later, 1);
        assert!(!denied.admitted);
        assert!(denied.reset <= l.window, "told {:?}", denied.reset);
    }

    proptest! {
        /// At any alignment and pace: a denial's reset is never longer than the window,
        /// and waiting it admits; after a whole window of silence the whole limit fits.
        #[test]
        fn the_reset_told_is_at_most_a_window_and_waiting_it_admits(
            arrivals in prop::collection::vec((0u64..3_000, 1u64..4), 1..60),
            limit_n in 1u32..20,
            window_ms in prop::sample::select(vec![1_000u64, 10_000, 60_000]),
            precision in prop::sample::select(vec![1u32, 2, 10, 60]),
            start_ns in 0u64..10 * SECOND,
        ) {
            let window = window_ms * MS;
            let (l, mut s) = sliding(limit_n, window, precision);
            let mut t = 1_790_000_000 * SECOND + start_ns;
            let mut last = t;
            for (gap_ms, hits) in arrivals {
                t += gap_ms * MS * window_ms / 10_000;
                let d = offer(&mut s, &l, t, hits);
                if d.admitted {
                    last = t;
                    continue;
                }
                prop_assert!(d.reset <= l.window, "told {:?} at +{}", d.reset, t - last);
                if hits <= u64::from(limit_n) {
                    let retry = t + nanos_of(d.reset);
                    prop_assert!(s.evaluate(&l, at(retry), hits).admitted, "waited {:?}", d.reset);
                }
            }
            let whole = u64::from(limit_n);
            prop_assert!(s.evaluate(&l, at(last + window), whole).admitted);
        }
    }

    proptest! {
        /// Bursty traffic: whatever the arrival pattern, a true sliding window never sees
        /// more than the limit plus the units of one sub-window (the weighted one).
        #[test]
        fn bursty_traffic_is_bounded_by_one_sub_window(
            arrivals in prop::collection::vec((0u64..400, 1u64..20), 1..400),
            precision in 1u32..20,
        ) {
            let (l, mut s) = sliding(100, SECOND, precision);
            let sub = SECOND / u64::from(precision);
            let mut t = 0;
            let mut admitted = Vec::new();
            let mut per_sub = std::collections::HashMap::<u64, u64>::new();
            for (gap_ms, hits) in arrivals {
                t += gap_ms * MS;
                if offer(&mut s, &l, t, hits).admitted {
                    admitted.push((t, hits));
                    *per_sub.entry(t / sub).or_default() += hits;
                }
            }
            let largest_sub = per_sub.values().copied().max().unwrap_or(0);
            prop_assert!(max_in_any_window(&admitted, SECOND) <= 100 + largest_sub);
        }

        /// The advertised wait is exact: one nanosecond earlier the request is still denied.
        #[test]
        fn retry_time_is_the_first_admitting_instant(
            burst in 1u64..=100, at_permille in 0u64..2_000, hits in 1u64..=10,
            window_s in prop::sample::select(vec![1u64, 3_600, 31_536_000]),
            precision in prop::sample::select(vec![1u32, 10, 60]),
            start_permille in 0u64..1_000,
        ) {
            let window = window_s * SECOND;
            let (l, mut s) = sliding(100, window, precision);
            // Years of epoch time, as real clocks give, and any phase of the window.
            let t0 = 1_790_000_000 * SECOND / window * window + window / 1_000 * start_permille;
            offer(&mut s, &l, t0, burst);
            let now = t0 + window / 1_000 * at_permille;
            let d = s.evaluate(&l, at(now), hits);
            if !d.admitted {
                prop_assert!(s.evaluate(&l, at(now + nanos_of(d.reset)), hits).admitted);
                prop_assert!(!s.evaluate(&l, at(now + nanos_of(d.reset) - 1), hits).admitted);
            }
        }
    }
}

#[cfg(test)]
mod against_the_log {
    use super::*;
    use crate::algo::testing::{SECOND, at, limit};
    use crate::limit::Algorithm;

    /// An exact sliding-log limiter: admits iff the units in (t − W, t] plus these fit.
    struct Log(std::collections::VecDeque<(u64, u64)>);

    impl Log {
        fn offer(&mut self, window: u64, limit: u64, t: u64, hits: u64) -> bool {
            while self.0.front().is_some_and(|(at, _)| at + window <= t) {
                self.0.pop_front();
            }
            let used: u64 = self.0.iter().map(|(_, h)| h).sum();
            let admitted = used + hits <= limit;
            if admitted {
                self.0.push_back((t, hits));
            }
            admitted
        }
    }

    /// Admitted by the approximation over admitted by an exact log, for random arrivals
    /// (gaps up to `max_gap_ms`) and costs (1–3) over twenty windows of a 100/s limit.
    fn ratio_to_the_log(seed: u64, max_gap_ms: u64, precision: u32) -> f64 {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let l = limit(Algorithm::SlidingWindow { precision }, 100, SECOND);
        let mut approx = SlidingWindow::new(precision);
        let mut log = Log(Default::default());
        let (mut a, mut e) = (0u64, 0u64);
        let mut t = 5 * SECOND;
        // Twenty windows, so that the edges of the run do not dominate.
        while t < 25 * SECOND {
            t += next() % (max_gap_ms * crate::clock::NANOS_PER_MILLI);
            let hits = 1 + next() % 3;
            if approx.evaluate(&l, at(t), hits).admitted {
                approx.record(&l, at(t), hits);
                a += hits;
            }
            if log.offer(SECOND, 100, t, hits) {
                e += hits;
            }
        }
        a as f64 / e as f64
    }

    /// How far from the log a precision may be: the single-counter form is the coarsest.
    fn tolerance(precision: u32) -> f64 {
        if precision == 1 { 0.04 } else { 0.02 }
    }

    #[test]
    fn heavy_overload_at_precision_one_stays_within_its_bound() {
        // The inputs an earlier version failed on (kept from its regression file): 40× and
        // 2.5× overload at precision 1.
        for (seed, max_gap_ms) in [
            (12_553_838_073_019_849_343, 16),
            (9_646_803_933_334_726_842, 1),
        ] {
            let ratio = ratio_to_the_log(seed, max_gap_ms, 1);
            assert!(
                (ratio - 1.0).abs() <= tolerance(1),
                "gap {max_gap_ms}: ratio {ratio}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Random arrivals and costs, from light load to heavy overload: the approximation
        /// admits within 2 % of what an exact sliding log admits from the same traffic
        /// (4 % with precision 1, the coarse two-counter form), in total.
        #[test]
        fn admits_within_two_percent_of_an_exact_log(
            seed in 1u64..u64::MAX,
            max_gap_ms in 1u64..40,
            precision in proptest::sample::select(vec![1u32, 10, 20, 50]),
        ) {
            let ratio = ratio_to_the_log(seed, max_gap_ms, precision);
            proptest::prop_assert!((ratio - 1.0).abs() <= tolerance(precision), "ratio {}", ratio);
        }
    }
}
