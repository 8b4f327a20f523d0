//! moe-quant bench areas and their shared input generator.

pub mod act;
pub mod int8;

use moe_testutil::SplitMix64;

/// `n` reproducible floats uniform in `[−2, 2)`.
pub fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}
