//! SplitMix64, the tests' and benches' small deterministic generator (the library's thinning
//! has its own; these need only a reproducible stream of numbers).

/// A SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator in the given raw state: the plain SplitMix64 sequence from it.
    pub fn from_state(state: u64) -> Self {
        SplitMix(state)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
