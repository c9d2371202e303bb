//! A small seedable random number generator, for fuzzing and chaos runs that must replay
//! from a printed seed.

/// xorshift64*: fast, seedable, good enough to pick mutations and faults.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A duration between `from` and `to`, to the millisecond.
    pub fn duration(
        &mut self,
        from: std::time::Duration,
        to: std::time::Duration,
    ) -> std::time::Duration {
        let span = to.saturating_sub(from).as_millis() as usize;
        from + std::time::Duration::from_millis(self.below(span + 1) as u64)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}
