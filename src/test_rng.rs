//! The random source of every test (the library's and `tests/`): splitmix64, seeded from the clock or
//! `FMHA_TEST_SEED` (tests print the seed on failure so a run can be replayed). Not part of the
//! library's interface.

pub struct Rng(pub u64);

impl Rng {
    /// Seeded from `FMHA_TEST_SEED`, else from the clock.
    pub fn fresh() -> Rng {
        let seed = std::env::var("FMHA_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as i64
    }

    /// Uniform in `lo..=hi`, for sizes.
    pub fn size(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as i64, hi as i64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.size(0, items.len() - 1)]
    }

    /// `count` sequence lengths in `1..=max`, a quarter of them (on average) 0.
    pub fn lengths(&mut self, count: usize, max: usize) -> Vec<i32> {
        (0..count).map(|_| if self.range(0, 3) == 0 { 0 } else { self.size(1, max) as i32 }).collect()
    }

    /// `count` lengths that mix zeros, short and long sequences: of ten equally likely draws,
    /// `zero_bias` give 0, the rest below 7 give 1..=400, and the last three 1..=20000.
    pub fn mixed_lengths(&mut self, count: usize, zero_bias: i64) -> Vec<i32> {
        (0..count)
            .map(|_| match self.range(0, 9) {
                x if x < zero_bias => 0,
                x if x < 7 => self.range(1, 400) as i32,
                _ => self.range(1, 20000) as i32,
            })
            .collect()
    }

    /// Uniform in [-1, 1), never exactly zero-filled tensors.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// The `[lengths.len() + 1]` starts of consecutive sequences of these lengths (seqstart arrays).
pub fn starts(lengths: &[i32]) -> Vec<i32> {
    std::iter::once(0)
        .chain(lengths.iter().scan(0, |total, &l| {
            *total += l;
            Some(*total)
        }))
        .collect()
}
