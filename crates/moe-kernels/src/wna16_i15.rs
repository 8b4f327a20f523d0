//! WNA16 with 15-bit integer activations: the numerics of the integer dot-product body for int4
//! codes, written once in plain Rust (the scalar twin that the SIMD body equals bit for bit).
//!
//! Each row of activations is quantized symmetrically to integers `q ∈ [−16383, 16383]`:
//! `amax = max |x|`, `q = round_half_even(x · (16383 / amax))`, row scale `s = amax / 16383`.
//! That is 15 bits where bf16 keeps 8 of mantissa, so the relative error of a quantized
//! activation is at most `2^−15` of the row's largest one. Each `q` splits into a signed high
//! byte and a low byte of seven bits, `q = 128·hi + lo`, so that `vpdpbusd` (unsigned code
//! bytes times signed activation bytes) multiplies both halves with the unsigned 4-bit codes
//! and every sum stays an exact integer.
//!
//! Per row, channel and block of K values (a scale group, or a run of at most [`MAX_BLOCK`] K
//! values of a longer group, so that no integer sum can overflow and each activation sum is
//! exact in f32):
//!
//! - `d = Σ c·q` over the block, exactly, as `128·Σ c·hi + Σ c·lo`;
//! - `t = f32(d) − z·S`, one fused multiply-add, with `S = Σ q` over the block (exact in f32)
//!   and `z` the zero point (8 for symmetric int4);
//! - `acc = t·scale_g + acc`, one fused multiply-add, blocks in ascending K order from 0;
//!
//! and the output is `(acc · s) · post + bias`, each a separate rounding, where `post` is 1
//! except for rows so small that `16383 / amax` would overflow (they are scaled by `2^100`
//! first and `post = 2^−100` undoes it). A row holding a NaN or an infinity has no finite
//! scale: its outputs are NaN. An all-zero row gives the bias.
//!
//! Against the f32 definition of `crate::wna16` the only new error is the rounding of each
//! activation to its 15-bit grid (`|x − s·q| ≤ s/2`); the tests bound the difference by
//! `2^−14 · amax · Σ|w|` per output plus the f32 sums' own rounding.

use crate::packed::PackedWna16;
use crate::packed::wna16::{Int4Values, K_STEP};

/// Largest activation integer: 15 bits with the sign.
pub(crate) const MAX_Q: i32 = (1 << 14) - 1;

/// Longest run of K values summed as integers before the sum is scaled: `1024 · 16383` is
/// below `2^24`, so each block's activation sum is exact in f32, and `128·Σ c·hi` stays far
/// below `2^31`.
pub(crate) const MAX_BLOCK: usize = 1024;

/// Rows whose largest magnitude is below this are scaled by [`TINY_LIFT`] before they are
/// quantized, so that `16383 / amax` stays finite.
const TINY: f32 = 1.0e-30;

/// `2^100`: the lift of a tiny row (exact in f32).
const TINY_LIFT: f32 = 1_267_650_600_228_229_401_496_703_205_376.0;

/// The quantization of one row: the multiplier from `x` to `q`, and the two factors that take
/// `q` back (`s`, then `post`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RowScale {
    /// `16383 / amax` (after the lift of a tiny row), 0 for a zero or non-finite row.
    pub(crate) inv: f32,
    /// Multiplier applied to `x` before `inv` (`2^100` for a tiny row, else 1).
    pub(crate) lift: f32,
    /// `amax / 16383`: NaN for a row holding a NaN or an infinity, 0 for an all-zero row.
    pub(crate) scale: f32,
    /// `2^−100` for a tiny row, else 1.
    pub(crate) post: f32,
}

impl RowScale {
    /// The scale of a row whose largest magnitude is `amax` (NaN when the row holds a NaN).
    pub(crate) fn of_amax(amax: f32) -> Self {
        if !amax.is_finite() {
            return Self {
                inv: 0.0,
                lift: 1.0,
                scale: f32::NAN,
                post: 1.0,
            };
        }
        if amax == 0.0 {
            return Self {
                inv: 0.0,
                lift: 1.0,
                scale: 0.0,
                post: 1.0,
            };
        }
        let (lift, post) = if amax < TINY {
            (TINY_LIFT, 1.0 / TINY_LIFT)
        } else {
            (1.0, 1.0)
        };
        let amax = amax * lift;
        Self {
            inv: MAX_Q as f32 / amax,
            lift,
            scale: amax / MAX_Q as f32,
            post,
        }
    }

    /// The scale of `row`.
    pub(crate) fn of_row(row: &[f32]) -> Self {
        let amax = row.iter().fold(0f32, |m, &v| {
            if v.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(v.abs())
            }
        });
        Self::of_amax(amax)
    }

    /// The integer of one activation.
    pub(crate) fn quantize(&self, x: f32) -> i32 {
        let v = (x * self.lift * self.inv).round_ties_even();
        // `as` saturates, and the clamp only matters for a product rounded just past the grid.
        (v as i32).clamp(-MAX_Q, MAX_Q)
    }
}

/// How a matrix's K splits into blocks: `per_group` blocks of up to `len` K values per scale
/// group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocks {
    /// K values per group.
    group: usize,
    /// K values per block.
    len: usize,
    /// Blocks per group.
    pub(crate) per_group: usize,
    /// K.
    k: usize,
}

impl Blocks {
    /// The blocks of `w`.
    pub(crate) fn of(w: &PackedWna16) -> Self {
        let group = w.group_size().max(1);
        let len = group.min(MAX_BLOCK);
        Self {
            group,
            len,
            per_group: group.div_ceil(len),
            k: w.k(),
        }
    }

    /// Blocks per row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has the body
    pub(crate) fn count(&self, n_groups: usize) -> usize {
        n_groups * self.per_group
    }

    /// The block of K value `kk` (`kk < K`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has the body
    pub(crate) fn of_k(&self, kk: usize) -> usize {
        kk / self.group * self.per_group + kk % self.group / self.len
    }

    /// The K values of block `i` of group `g` (empty past K).
    pub(crate) fn k_range(&self, g: usize, i: usize) -> std::ops::Range<usize> {
        let start = (g * self.group + i * self.len).min(self.k);
        let end = (g * self.group + (i + 1) * self.len)
            .min((g + 1) * self.group)
            .min(self.k);
        start..end.max(start)
    }

    /// The packed steps that hold block `i` of group `g`: a block starts on a step (groups and
    /// [`MAX_BLOCK`] are multiples of [`K_STEP`], or the group is all of K), and only the last
    /// block of K may end inside one.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has the body
    pub(crate) fn steps(&self, g: usize, i: usize) -> std::ops::Range<usize> {
        let r = self.k_range(g, i);
        r.start / K_STEP..r.end.div_ceil(K_STEP)
    }
}

/// Whether the integer body can take `w`: int4 integer codes (not MXFP4's e2m1 values).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has the body
pub(crate) fn serves(w: &PackedWna16) -> bool {
    w.bits() == 4 && w.values() == Int4Values::Integer
}

/// The outputs of the integer body, computed in the order the module docs give (the tests'
/// model of the SIMD body, which it equals bit for bit).
pub fn wna16_i15_reference(m: usize, x: &[f32], w: &PackedWna16) -> Vec<f32> {
    let (n, k, ng) = (w.n(), w.k(), w.n_groups());
    let (codes, scales, zeros) = w.unpack();
    let blocks = Blocks::of(w);
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        let raw = &x[r * k..][..k];
        let row: Vec<f32> = match w.perm() {
            Some(p) => p.iter().map(|&j| raw[j as usize]).collect(),
            None => raw.to_vec(),
        };
        let rs = RowScale::of_row(&row);
        let q: Vec<i32> = row.iter().map(|&v| rs.quantize(v)).collect();
        for c in 0..n {
            let mut acc = 0f32;
            for g in 0..ng {
                let z = f32::from(zeros[c * ng + g]);
                for i in 0..blocks.per_group {
                    let range = blocks.k_range(g, i);
                    if range.is_empty() {
                        continue;
                    }
                    let (mut d, mut s) = (0i64, 0i64);
                    for kk in range {
                        d += i64::from(codes[c * k + kk]) * i64::from(q[kk]);
                        s += i64::from(q[kk]);
                    }
                    let t = (-z).mul_add(s as f32, d as i32 as f32);
                    acc = t.mul_add(scales[c * ng + g], acc);
                }
            }
            let mut y = acc * rs.scale * rs.post;
            if let Some(b) = w.bias() {
                y += b[c];
            }
            out[r * n + c] = y;
        }
    }
    out
}
