//! Binomial thinning of samples to a lower sampling rate, with a small seeded generator
//! (SplitMix64) so that a merge is deterministic for a given seed.

/// SplitMix64: tiny, fast, well-mixed; one stream per input.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.next_u64();
        r
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Keeps each sample independently with probability `p`.
#[derive(Clone, Debug)]
pub struct Thinner {
    pub p: f64,
    rng: Rng,
}

impl Thinner {
    pub fn new(p: f64, seed: u64, stream: u64) -> Self {
        Thinner {
            p,
            rng: Rng::new(seed, stream),
        }
    }
    /// A Binomial(n, p) draw: how many of `n` samples survive. Exact for small `n` (one
    /// Bernoulli trial each) and small `n·p` (geometric jumps between survivors); a rounded
    /// normal draw with the same mean and variance beyond that (n·p > 64), so even an absurd
    /// sample count costs constant time.
    pub fn keep(&mut self, n: u64) -> u64 {
        let p = self.p;
        if p >= 1.0 {
            return n;
        }
        if p <= 0.0 || n == 0 {
            return 0;
        }
        if n <= 64 {
            let mut k = 0;
            for _ in 0..n {
                if self.rng.next_f64() < p {
                    k += 1;
                }
            }
            return k;
        }
        let mean = n as f64 * p;
        if mean <= 64.0 {
            // survivors are Geometric(p) trials apart
            let ln_q = (1.0 - p).ln();
            let mut pos = 0u64;
            let mut k = 0u64;
            loop {
                let u = 1.0 - self.rng.next_f64(); // (0, 1]
                let skip = (u.ln() / ln_q).floor();
                if !skip.is_finite() || skip >= (n - pos) as f64 {
                    return k;
                }
                pos += skip as u64 + 1;
                k += 1;
                if pos >= n {
                    return k;
                }
            }
        }
        // Box-Muller
        let u1 = 1.0 - self.rng.next_f64();
        let u2 = self.rng.next_f64();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let x = (mean + z * (mean * (1.0 - p)).sqrt()).round();
        x.clamp(0.0, n as f64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_mean_and_variance() {
        let mut t = Thinner::new(0.01, 42, 0);
        let n = 200_000u64;
        let k: u64 = (0..n).map(|_| t.keep(1)).sum();
        let mean = n as f64 * 0.01;
        let sd = (n as f64 * 0.01 * 0.99).sqrt();
        assert!((k as f64 - mean).abs() < 5.0 * sd, "k={k} mean={mean}");
    }

    #[test]
    fn large_counts_are_fast_and_right_on_average() {
        for (n, p) in [
            (1_000u64, 0.01),
            (100_000, 0.3),
            (u64::MAX / 2, 1e-5),
            (5_000, 0.001),
        ] {
            let mut t = Thinner::new(p, 9, 0);
            let trials = 2_000;
            let total: f64 = (0..trials).map(|_| t.keep(n) as f64).sum();
            let mean = n as f64 * p;
            let sd = (n as f64 * p * (1.0 - p) / trials as f64).sqrt();
            assert!(
                (total / trials as f64 - mean).abs() < 6.0 * sd + 1e-9 * mean,
                "n={n} p={p}: {}",
                total / trials as f64
            );
        }
        let mut t = Thinner::new(0.5, 1, 1);
        let k = t.keep(u64::MAX);
        assert!(k > u64::MAX / 4 && k < u64::MAX / 4 * 3, "{k}");
    }

    #[test]
    fn deterministic_per_seed_and_stream() {
        let a: Vec<u64> = {
            let mut t = Thinner::new(0.3, 7, 1);
            (0..100).map(|_| t.keep(5)).collect()
        };
        let b: Vec<u64> = {
            let mut t = Thinner::new(0.3, 7, 1);
            (0..100).map(|_| t.keep(5)).collect()
        };
        let c: Vec<u64> = {
            let mut t = Thinner::new(0.3, 8, 1);
            (0..100).map(|_| t.keep(5)).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|&k| k <= 5));
    }
}
