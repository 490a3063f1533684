//! The seeded random numbers of the operations that sample (k-means' initialisation and its
//! split of empty clusters): SplitMix64, so that an answer is a function of the inputs and the
//! seed alone, on every platform and path.

/// SplitMix64 (Steele, Lea and Flood, 2014): 64 bits of state, every seed a full-period
/// stream.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream of `seed`, distinct for each `stream` (so that two uses of one seed, the
    /// initialisation and a later split say, do not replay each other's numbers).
    pub(crate) fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        rng.next_u64();
        rng
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n ≥ 1`), without modulo bias (Lemire's multiply-and-reject).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        let threshold = n.wrapping_neg() % n;
        loop {
            let wide = u128::from(self.next_u64()) * u128::from(n);
            if (wide as u64) >= threshold {
                return (wide >> 64) as u64;
            }
        }
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `m` distinct indices of `0..n` (`m ≤ n`), in the order drawn: the first `m` steps of a
    /// Fisher–Yates shuffle, in `O(m)` memory (the swaps live in a map).
    pub(crate) fn sample(&mut self, n: usize, m: usize) -> Vec<usize> {
        let mut swapped = std::collections::HashMap::with_capacity(m);
        (0..m.min(n))
            .map(|i| {
                let j = i + self.below((n - i) as u64) as usize;
                let at_j = swapped.get(&j).copied().unwrap_or(j);
                let at_i = swapped.get(&i).copied().unwrap_or(i);
                swapped.insert(j, at_i);
                at_j
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_distinct_and_cover_the_range() {
        let mut rng = SplitMix64::new(7, 0);
        let all = rng.sample(50, 50);
        let mut sorted = all.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        let some = rng.sample(1_000_000, 10);
        let mut unique = some.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 10);
        assert!(some.iter().all(|&i| i < 1_000_000));
    }

    #[test]
    fn below_is_uniform_enough_and_streams_differ() {
        let mut rng = SplitMix64::new(1, 0);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[rng.below(3) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
        let (mut a, mut b) = (SplitMix64::new(1, 0), SplitMix64::new(1, 1));
        assert_ne!(a.next_u64(), b.next_u64());
        let u = SplitMix64::new(3, 0).unit();
        assert!((0.0..1.0).contains(&u));
    }
}
