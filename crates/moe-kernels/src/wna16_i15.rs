//! WNA16 with 15-bit integer activations: the numerics of the integer dot-product bodies for
//! int4 codes (and, on the 256-bit x86 rungs, int8 ones), written once in plain Rust (the
//! scalar twin that the SIMD bodies equal bit for bit).
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
//! values of a longer group, [`MAX_BLOCK_INT8`] for int8 codes, so that no integer sum can
//! overflow and each activation sum is exact in f32):
//!
//! - `d = Σ c·q` over the block, exactly (as `128·Σ c·hi + Σ c·lo` where the body splits the
//!   activations in bytes);
//! - `t = f32(d) − z·S`, one fused multiply-add, with `S = Σ q` over the block (exact in f32)
//!   and `z` the zero point (8 for symmetric int4, 128 for symmetric int8);
//! - `acc = t·scale_g + acc`, one fused multiply-add, blocks in ascending K order from 0;
//!
//! and the output is `(acc · s) · post + bias`, each a separate rounding, where `post` is 1
//! except for rows so small that `16383 / amax` would overflow (they are scaled by `2^100`
//! first and `post = 2^−100` undoes it). A row holding a NaN or an infinity has no finite
//! scale: its outputs are NaN. An all-zero row gives the bias.
//!
//! MXFP4's e2m1 codes (on the bodies that take them) are integers too, after an exact change of
//! variable: twice an e2m1 value is one of `0, ±1, ±2, ±3, ±4, ±6, ±8, ±12`, so each code
//! stands for `c = 2·e2m1 + 12` ([`E2M1_INTEGERS`], `0..=24`) with the zero point `z = 12`,
//! and each group's e8m0 scale is halved (a power of two: exact). The sums above then hold
//! `2·Σ e2m1·q` exactly, and `|c·q| ≤ 24·16383` keeps a block's sum of at most [`MAX_BLOCK`]
//! K values below `2^31`.
//!
//! Against the f32 definition of `crate::wna16` the only new error is the rounding of each
//! activation to its 15-bit grid (`|x − s·q| ≤ s/2`); the tests bound the difference by
//! `2^−14 · amax · Σ|w|` per output plus the f32 sums' own rounding.

use crate::aligned::AlignedVec;
use crate::dispatch::Int4Dot;
use crate::packed::wna16::{Int4Values, K_STEP};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotFillFn, Int4DotJob, Int4DotLayout, Int4DotPanelsFn};

/// Largest activation integer: 15 bits with the sign.
pub(crate) const MAX_Q: i32 = (1 << 14) - 1;

/// Longest run of K values summed as integers before the sum is scaled: `1024 · 16383` is
/// below `2^24`, so each block's activation sum is exact in f32, and `128·Σ c·hi` stays far
/// below `2^31`.
pub(crate) const MAX_BLOCK: usize = 1024;

/// [`MAX_BLOCK`] for int8 codes: `256 · 255 · 16383` stays below `2^31` however a body splits
/// the sum (`128·Σ c·hi` too), with room to spare.
pub(crate) const MAX_BLOCK_INT8: usize = 256;

/// The integer each e2m1 code stands for in the integer sums: `2·e2m1(code) + 12` (see the
/// module docs), with [`E2M1_ZERO`] as its zero point.
pub(crate) const E2M1_INTEGERS: [u8; 16] =
    [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// The zero point of [`E2M1_INTEGERS`]: the integer of the e2m1 zero.
pub(crate) const E2M1_ZERO: u8 = 12;

/// The largest scale magnitude the integer bodies take: their f32 sums hold `Σ t·scale` with
/// `|t|` up to `K·255·16383 < 2^46` (before the row's scale brings them back), so scales up
/// to `2^64` keep them far from overflowing where the f32 definition's own sums would not.
/// Weights with larger scales (hostile ones: checkpoints scale their codes by about `2^−7`)
/// take the f32 body.
pub(crate) const MAX_SCALE: f32 = 18_446_744_073_709_551_616.0;

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
        let cap = if w.bits() == 8 {
            MAX_BLOCK_INT8
        } else {
            MAX_BLOCK
        };
        let len = group.min(cap);
        Self {
            group,
            len,
            per_group: group.div_ceil(len),
            k: w.k(),
        }
    }

    /// K values per block (the last block of a group or of K may hold fewer).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn block_len(&self) -> usize {
        self.len
    }

    /// Blocks per row.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn count(&self, n_groups: usize) -> usize {
        n_groups * self.per_group
    }

    /// The block of K value `kk` (`kk < K`).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
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
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn steps(&self, g: usize, i: usize) -> std::ops::Range<usize> {
        let r = self.k_range(g, i);
        r.start / K_STEP..r.end.div_ceil(K_STEP)
    }
}

/// Whether an integer body can take `w`: integer codes, int4 (and MXFP4's e2m1 values where
/// the body decodes them, `e2m1`) or int8 (not FP8's e4m3 values). Which widths a body takes
/// is its own ([`Int4Dot::int8`]).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn serves(w: &PackedWna16, e2m1: bool) -> bool {
    let codes = match w.bits() {
        4 => w.values() == Int4Values::Integer || e2m1,
        8 => !w.is_e4m3(),
        _ => false,
    };
    codes && w.largest_scale() <= MAX_SCALE
}

/// The environment variable that chooses the integer bodies of int4 weight-only GEMMs: `1`
/// runs one ahead of the AVX-512 BF16 body where an x86 rung has both (by default that body
/// runs on AMD cores), `0` never runs them (the f32 body, or the bf16 paths where they are on,
/// take their GEMMs). The AVX2, AVX-VNNI and aarch64 dot-product rungs, which have no bf16
/// path, run their build unless it is off.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const INTEGER_WNA16_ENV: &str = "MOE_KERNELS_WNA16_I15";

/// What [`INTEGER_WNA16_ENV`] asks for: `Some(true)` for `1`, `Some(false)` for `0`, else
/// `None`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn integer_wna16_setting() -> Option<bool> {
    match std::env::var(INTEGER_WNA16_ENV).as_deref().map(str::trim) {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

/// Bytes before a row's first step in every integer body's layout: the row's scale and post
/// factor (f32 each, see [`RowScale`]), then zeros.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const HEADER_BYTES: usize = 16;

/// Bytes of one step of a row in the byte-split layout ([`fill_byte_split`]).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const SPLIT_STEP_BYTES: usize = 16;

/// Writes a row's header: its scale and post factor (f32 each), then zeros.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn write_header(head: &mut [u8], rs: &RowScale) {
    head.fill(0);
    head[..4].copy_from_slice(&rs.scale.to_le_bytes());
    head[4..8].copy_from_slice(&rs.post.to_le_bytes());
}

/// A row's scale and post factor, from its header.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn read_header(row: &[u8]) -> (f32, f32) {
    let at = |i: usize| f32::from_le_bytes(row[i..i + 4].try_into().expect("4 bytes"));
    (at(0), at(4))
}

/// The sizes of a fill's layout: the blocks of `w`'s K, their count per row, and the bytes per
/// row ([`HEADER_BYTES`] and `step_bytes` per step of 8 K values).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct RowLayout {
    pub(crate) blocks: Blocks,
    pub(crate) nb: usize,
    pub(crate) row_bytes: usize,
}

impl RowLayout {
    /// The layout of `m` rows of `w` with `step_bytes` per step: grows `dst` to hold them and
    /// sets `sums` to `m` rows of zeroed block sums.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn prepare(
        w: &PackedWna16,
        m: usize,
        step_bytes: usize,
        sums: &mut Vec<f32>,
        dst: &mut AlignedVec<u8>,
    ) -> Self {
        let blocks = Blocks::of(w);
        let nb = blocks.count(w.n_groups());
        let row_bytes = Self::row_bytes(w.k(), step_bytes);
        dst.grow_to(m * row_bytes);
        sums.clear();
        sums.resize(m * nb, 0.0);
        Self {
            blocks,
            nb,
            row_bytes,
        }
    }

    /// Bytes per row for K values `k` and `step_bytes` per step: the header, then the steps.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn row_bytes(k: usize, step_bytes: usize) -> usize {
        HEADER_BYTES + k.div_ceil(K_STEP) * step_bytes
    }

    /// Where `m` rows of it lie in the buffer.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn of_rows(&self, m: usize) -> Int4DotLayout {
        Int4DotLayout {
            len: m * self.row_bytes,
            row_bytes: self.row_bytes,
        }
    }
}

/// Where K value `kk` of a row lies in the byte-split layout, in bytes from its first step:
/// per step of 8 K values, the high bytes of K values `8s + 0, 2, 4, 6`, of `8s + 1, 3, 5, 7`,
/// then the low bytes of both, four bytes each. The fills write whole steps at once; the tests
/// check their bytes against this.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn split_byte_offset(kk: usize, low: bool) -> usize {
    let j = kk % K_STEP;
    kk / K_STEP * SPLIT_STEP_BYTES + 8 * usize::from(low) + 4 * (j % 2) + j / 2
}

/// Lays out `m` rows of `x` in the byte-split layout of the bodies that multiply the codes by
/// signed activation bytes (`vpdpbusd`, `sdot`): per row a [`HEADER_BYTES`] header, then per
/// step of 8 K values the high bytes `hi = q >> 7` (signed) of its even K values, of its odd
/// ones, then the low bytes `lo = q & 127` of both ([`split_byte_offset`]), K past its end as
/// zeros, so that `q = 128·hi + lo`. Writes each row's exact integer sum per block into
/// `sums`, row-major. Plain Rust: the layout is `O(m·K)` against the GEMM's `O(m·N·K)`.
/// (The AVX-512 VNNI body lays out the same bytes with a vectorized fill of its own.)
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) fn fill_byte_split(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout {
    let k = w.k();
    let layout = RowLayout::prepare(w, m, SPLIT_STEP_BYTES, sums, dst);
    let (blocks, nb) = (layout.blocks, layout.nb);
    for (r, out) in dst.chunks_exact_mut(layout.row_bytes).take(m).enumerate() {
        let row = &x[r * k..][..k];
        let rs = RowScale::of_row(row);
        let (head, steps) = out.split_at_mut(HEADER_BYTES);
        write_header(head, &rs);
        // Summed in f32 exactly: every partial sum is an integer of magnitude at most
        // `MAX_BLOCK · MAX_Q < 2^24`.
        let row_sums = &mut sums[r * nb..][..nb];
        let (steps, _) = steps.as_chunks_mut::<SPLIT_STEP_BYTES>();
        for (s, step) in steps.iter_mut().enumerate() {
            // A block holds whole steps, so the step's values share one sum.
            let block = blocks.of_k((K_STEP * s).min(k.saturating_sub(1)));
            for j in 0..K_STEP {
                let kk = K_STEP * s + j;
                let q = match row.get(kk) {
                    Some(&v) => rs.quantize(v),
                    None => 0,
                };
                row_sums[block] += q as f32;
                let at = 4 * (j % 2) + j / 2;
                step[at] = (q >> 7) as u8;
                step[8 + at] = (q & 127) as u8;
            }
        }
    }
    layout.of_rows(m)
}

/// Panel `p`'s packed steps of `w`'s codes.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn panel_steps(w: &PackedWna16, p: usize) -> &[[u32; PANEL]] {
    let ks = w.k_steps();
    w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks().0
}

/// Rows `m0..m0 + R` of a job's integer layout: each row's bytes (its header first, for
/// [`read_header`]) and the row's steps of 16 bytes after the header.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn layout_rows<'a, const R: usize>(
    job: &'a Int4DotJob<'_>,
    m0: usize,
) -> ([&'a [u8]; R], [&'a [[u8; 16]]; R]) {
    let rows: [&[u8]; R] =
        std::array::from_fn(|r| &job.pairs[(m0 + r) * job.row_bytes..][..job.row_bytes]);
    let steps = std::array::from_fn(|r| rows[r][HEADER_BYTES..].as_chunks().0);
    (rows, steps)
}

/// A rung's integer body (its `fill` and `entry`, doing `unit`) as a kernel set's int4
/// dot-product body, for GEMMs of `min_m` rows up to `max_m` (exclusive) on int4 integer codes,
/// with `e2m1` also MXFP4's codes, and with `int8` int8 integer codes.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) fn integer_body(
    unit: &'static str,
    fill: Int4DotFillFn,
    entry: Int4DotPanelsFn,
    (min_m, max_m): (usize, usize),
    (int8, e2m1): (bool, bool),
) -> Int4Dot {
    Int4Dot {
        unit,
        activations: "15-bit integer activations",
        codes: if e2m1 {
            " for integer and e2m1 codes"
        } else {
            " for integer codes"
        },
        min_m,
        max_m,
        int8,
        e4m3: false,
        serves: if e2m1 {
            |w, _| serves(w, true)
        } else {
            |w, _| serves(w, false)
        },
        fill,
        entry,
    }
}

/// The outputs of the integer body, computed in the order the module docs give (the tests'
/// model of the SIMD body, which it equals bit for bit).
pub fn wna16_i15_reference(m: usize, x: &[f32], w: &PackedWna16) -> Vec<f32> {
    let (n, k, ng) = (w.n(), w.k(), w.n_groups());
    let (mut codes, mut scales, mut zeros) = w.unpack();
    if w.values() == Int4Values::E2m1 {
        // The change of variable of the module docs.
        codes
            .iter_mut()
            .for_each(|c| *c = E2M1_INTEGERS[usize::from(*c)]);
        zeros.fill(E2M1_ZERO);
        scales.iter_mut().for_each(|s| *s *= 0.5);
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use half::{bf16, f16};
    use moe_testutil::SplitMix64;

    use super::{Blocks, HEADER_BYTES, RowScale, fill_byte_split, split_byte_offset};
    use super::{SPLIT_STEP_BYTES, wna16_i15_reference};
    use crate::packed::wna16::K_STEP;
    use crate::{GemmScratch, PackedWna16, Par, Wna16Desc, Wna16Scales};

    /// Every integer body this CPU runs, each alone in its rung's set, with the code widths
    /// it takes (4, and 8 where it takes int8 codes): they share the numerics, so the same
    /// tests hold for each.
    fn bodies() -> Vec<(&'static str, crate::KernelSet, &'static [u32])> {
        bodies_and_e2m1()
            .into_iter()
            .map(|(name, ks, widths, _)| (name, ks, widths))
            .collect()
    }

    /// [`bodies`], each with whether it also takes MXFP4's e2m1 codes.
    fn bodies_and_e2m1() -> Vec<(&'static str, crate::KernelSet, &'static [u32], bool)> {
        // The int8 tile sets run their byte-code body where it serves and the AVX-512 VNNI
        // body elsewhere (int8 codes, blocks off the tiles' chunks): one set, one numerics.
        #[cfg(target_arch = "x86_64")]
        let sets = [
            (
                "avx512-vnni",
                crate::x86::wna16_i15::kernel_set(),
                &[4, 8][..],
                false,
            ),
            (
                "amx-int8 tiles, emulated",
                crate::x86::amx::emulated::i15_tile_kernel_set(),
                &[4, 8][..],
                false,
            ),
            (
                "amx-int8 tiles",
                crate::x86::amx::hardware_i15_tile_kernel_set(),
                &[4, 8][..],
                false,
            ),
            (
                "avx2",
                crate::x86::wna16_i15_avx2::kernel_set(),
                &[4, 8][..],
                true,
            ),
        ];
        #[cfg(target_arch = "aarch64")]
        let sets = [(
            "dotprod",
            crate::aarch64::wna16_i15::kernel_set(),
            &[4, 8][..],
            true,
        )];
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let sets: [(&str, Option<crate::KernelSet>, &[u32], bool); 0] = [];
        let found: Vec<_> = sets
            .into_iter()
            .filter_map(|(name, ks, bits, e2m1)| Some((name, ks?, bits, e2m1)))
            .collect();
        if found.is_empty() {
            eprintln!("note: no integer WNA16 body on this CPU");
        }
        found
    }

    /// Random weights of `bits`-bit integer codes: `g` None is channelwise; scales of each
    /// 16-bit kind and f32.
    fn weights(
        rng: &mut SplitMix64,
        (n, k, bits): (usize, usize, u32),
        g: Option<usize>,
        asym: bool,
        perm: bool,
    ) -> PackedWna16 {
        let groups = g.map_or(1, |g| k.div_ceil(g));
        let codes: Vec<u8> = (0..n * k).map(|_| rng.below(1 << bits) as u8).collect();
        let raw: Vec<f32> = (0..n * groups).map(|_| rng.uniform(0.005, 0.05)).collect();
        let (b, h): (Vec<bf16>, Vec<f16>) = (
            raw.iter().map(|&v| bf16::from_f32(v)).collect(),
            raw.iter().map(|&v| f16::from_f32(v)).collect(),
        );
        let scales = match rng.below(3) {
            0 => Wna16Scales::Bf16(&b),
            1 => Wna16Scales::F16(&h),
            _ => Wna16Scales::F32(&raw),
        };
        let zeros: Vec<u8> = (0..n * groups)
            .map(|_| rng.below(1 << bits) as u8)
            .collect();
        let bias = rng.vec_uniform(n, -1.0, 1.0);
        let mut order: Vec<u32> = (0..k as u32).collect();
        for i in (1..k).rev() {
            order.swap(i, rng.below(i + 1));
        }
        PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits,
            codes: &codes,
            group_size: moe_quant::WeightGroups::from_group_size(g).unwrap(),
            scales,
            zeros: asym.then_some(&zeros[..]),
            bias: Some(&bias),
            perm: perm.then_some(&order[..]),
        })
        .unwrap()
    }

    /// The portable byte-split layout holds each value's quantized integer as `128·hi + lo`
    /// at its place, the row's scale and post factor in the header, zeros past K, and each
    /// block's exact sum of the integers.
    #[test]
    fn byte_split_fill_lays_out_integer_halves_and_block_sums() {
        check_fill_layout(fill_byte_split, SPLIT_STEP_BYTES, |steps, kk| {
            let hi = steps[split_byte_offset(kk, false)] as i8;
            let lo = steps[split_byte_offset(kk, true)];
            assert!(lo < 128, "K value {kk}: low byte {lo}");
            128 * i32::from(hi) + i32::from(lo)
        });
    }

    /// Checks an integer body's `fill` on ragged shapes (a tiny row among them): per row the
    /// header holds its scale and post factor then zeros, `value_at(steps, kk)` reads back
    /// K value `kk` from the row's steps (`step_bytes` each) as the row's quantized integer
    /// (0 past K), and `sums` holds each block's exact sum of them.
    pub(crate) fn check_fill_layout(
        fill: crate::wna16::Int4DotFillFn,
        step_bytes: usize,
        value_at: impl Fn(&[u8], usize) -> i32,
    ) {
        let mut rng = SplitMix64::new(0x15a);
        for (m, k, group) in [
            (1usize, 8usize, 8usize),
            (3, 37, 37),
            (2, 72, 16),
            (4, 45, 40),
            (2, 2500, 2500),
            (3, 2100, 2048),
        ] {
            let mut x = rng.vec_uniform(m * k, -3.0, 3.0);
            if m > 2 {
                // A tiny row, lifted before it is quantized.
                for v in &mut x[2 * k..3 * k] {
                    *v *= 1e-33;
                }
            }
            let w = PackedWna16::int4_for_layout(k, group, false);
            let blocks = Blocks::of(&w);
            let nb = blocks.count(w.n_groups());
            let (mut dst, mut sums) = (
                crate::aligned::AlignedVec::from(vec![0xAA; 7]),
                vec![5.0; 3],
            );
            // SAFETY: the callers hold the body's kernel set, so the CPU has its features;
            // `x` holds `m·k`.
            let layout = unsafe { fill(&x, m, &w, &mut sums, &mut dst) };
            let row_bytes = layout.row_bytes;
            assert_eq!(row_bytes, HEADER_BYTES + k.div_ceil(K_STEP) * step_bytes);
            assert_eq!(layout.len, m * row_bytes);
            assert_eq!(sums.len(), m * nb);
            for r in 0..m {
                let row = &x[r * k..][..k];
                let rs = RowScale::of_row(row);
                let bytes = &dst[r * row_bytes..][..row_bytes];
                let header = |at: usize| f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                assert_eq!(header(0).to_bits(), rs.scale.to_bits());
                assert_eq!(header(4).to_bits(), rs.post.to_bits());
                assert!(bytes[8..HEADER_BYTES].iter().all(|&b| b == 0));
                let steps = &bytes[HEADER_BYTES..];
                let mut want_sums = vec![0i64; nb];
                for kk in 0..k.next_multiple_of(K_STEP) {
                    let q = if kk < k { rs.quantize(row[kk]) } else { 0 };
                    assert_eq!(value_at(steps, kk), q, "m={m} k={k} row {r} K value {kk}");
                    if kk < k {
                        want_sums[blocks.of_k(kk)] += i64::from(q);
                    }
                }
                for (b, &want) in want_sums.iter().enumerate() {
                    assert_eq!(
                        sums[r * nb + b],
                        want as f32,
                        "m={m} k={k} row {r} block {b}"
                    );
                }
            }
        }
    }

    /// Every integer kind of each width a body takes (symmetric, zero points, act-order;
    /// bf16, f16 and f32 scales) on ragged shapes equals the scalar twin bit for bit, whatever
    /// the thread split; a body that does not take int8 codes leaves them to the f32 body.
    #[test]
    fn integer_body_equals_its_scalar_twin_on_ragged_shapes() {
        for (body, ks, widths) in bodies() {
            for bits in [4, 8] {
                if widths.contains(&bits) {
                    equals_the_twin_on_ragged_shapes(body, &ks, bits);
                } else {
                    let w = weights(&mut SplitMix64::new(8), (16, 64, 8), None, false, false);
                    assert!(ks.wna16_int4_dot_for(&w, 4).is_none(), "{body} took int8");
                }
            }
        }
    }

    fn equals_the_twin_on_ragged_shapes(body: &str, ks: &crate::KernelSet, bits: u32) {
        let mut rng = SplitMix64::new(0x15b);
        // (K, group size or channelwise, zero points, act-order): odd counts of int8 steps
        // (K = 4, 12, 37), groups longer than an int8 block (512, channelwise 2100).
        let cases: [(usize, Option<usize>, bool, bool); 13] = [
            (4, None, false, false),
            (12, None, true, false),
            (520, Some(512), true, false),
            (8, None, false, false),
            (37, None, true, false),
            (72, Some(32), false, false),
            (100, Some(32), true, false),
            (256, Some(128), false, true),
            (200, Some(64), true, false),
            (120, Some(40), false, false),
            (2100, None, false, false),
            (2304, Some(2048), true, true),
            (4100, Some(128), true, false),
        ];
        for &(k, g, asym, perm) in &cases {
            // 1 to 3 panels, then 5 (a group of four and one more, ragged) and 8.
            for &n in &[1usize, 17, 33, 65, 120] {
                let w = weights(&mut rng, (n, k, bits), g, asym, perm);
                let what = format!("int{bits} k={k} g={g:?} asym={asym} perm={perm} n={n}");
                let ms = [0usize, 1, 2, 3, 4, 5, 7, 8, 9, 16, 65, 130];
                assert_equals_the_twin(body, &what, ks, &w, &ms, &mut rng);
            }
        }
    }

    /// Runs `w` on `ks` at each row count of `ms` (past 16 only for K up to 1000), both `Par`
    /// modes, and checks every output's bits against [`wna16_i15_reference`].
    fn assert_equals_the_twin(
        body: &str,
        what: &str,
        ks: &crate::KernelSet,
        w: &PackedWna16,
        ms: &[usize],
        rng: &mut SplitMix64,
    ) {
        let (n, k) = (w.n(), w.k());
        for &m in ms {
            if k > 1000 && m > 16 {
                continue;
            }
            let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
            let want = wna16_i15_reference(m, &x, w);
            for par in [Par::Seq, Par::Rayon] {
                assert!(m == 0 || ks.wna16_int4_dot_for(w, m).is_some());
                let mut got = vec![f32::NAN; m * n];
                crate::wna16_gemm(ks, m, &x, w, &mut got, &mut GemmScratch::new(), par).unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{body}: {what} m={m} {par:?}: out[{i}] = {a}, want {b}"
                    );
                }
            }
        }
    }

    /// Against the f32 definition: the only new error is each activation's rounding to its
    /// 15-bit grid, at most half a step (`amax / 32766`) times the weight it meets, plus the
    /// f32 sums' own rounding.
    #[test]
    fn integer_body_stays_within_the_grid_of_the_f32_definition() {
        for (body, ks, widths) in bodies() {
            for &bits in widths {
                within_the_grid_of_the_f32_definition(body, &ks, bits);
            }
        }
    }

    fn within_the_grid_of_the_f32_definition(body: &str, ks: &crate::KernelSet, bits: u32) {
        let mut rng = SplitMix64::new(0x15c);
        for &(k, g, asym) in &[
            (256usize, Some(128usize), false),
            (300, Some(32), true),
            (2048, None, false),
        ] {
            let w = weights(&mut rng, (40, k, bits), g, asym, false);
            assert_within_the_grid(body, &format!("int{bits} g={g:?}"), ks, &w, &mut rng);
        }
    }

    /// Checks [`integer_body_stays_within_the_grid_of_the_f32_definition`]'s bound for `w`
    /// (which has a bias) at a few row counts, an outlier in the first row.
    fn assert_within_the_grid(
        body: &str,
        what: &str,
        ks: &crate::KernelSet,
        w: &PackedWna16,
        rng: &mut SplitMix64,
    ) {
        let (n, k) = (w.n(), w.k());
        {
            let dq = w.dequantize_f64();
            for &m in &[1usize, 4, 9] {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
                // An outlier in the first row: the others' grid is finer.
                x[3] = 40.0;
                let mut got = vec![0f32; m * n];
                crate::wna16_gemm(ks, m, &x, w, &mut got, &mut GemmScratch::new(), Par::Seq)
                    .unwrap();
                for r in 0..m {
                    let row = &x[r * k..][..k];
                    let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                    for c in 0..n {
                        let b = f64::from(w.bias().unwrap()[c]);
                        let (mut want, mut mag, mut wsum) = (b, b.abs(), 0f64);
                        for kk in 0..k {
                            let t = f64::from(row[kk]) * dq[c * k + kk];
                            want += t;
                            mag += t.abs();
                            wsum += dq[c * k + kk].abs();
                        }
                        let grid = f64::from(amax) / 32766.0 * wsum;
                        let got = f64::from(got[r * n + c]);
                        assert!(
                            (got - want).abs() <= grid + 1e-5 * mag,
                            "{body}: {what} k={k} m={m}: out[{r},{c}] = {got}, want {want} \
                             (grid {grid})"
                        );
                    }
                }
            }
        }
    }

    /// Random MXFP4 weights `[n, k]` with a bias: e8m0 scales around 1 with the extremes the
    /// integer bodies take among them (0, the subnormal `2^-127`, and 191, [`super::MAX_SCALE`]),
    /// or every code `code` when given.
    fn e2m1_weights(rng: &mut SplitMix64, n: usize, k: usize, code: Option<u8>) -> PackedWna16 {
        let kb = k.div_ceil(32);
        let blocks: Vec<u8> = (0..n * kb * 16)
            .map(|_| match code {
                Some(c) => c | c << 4,
                None => rng.below(256) as u8,
            })
            .collect();
        let scales: Vec<u8> = (0..n * kb)
            .map(|i| match i % 7 {
                3 => 0,
                5 if code.is_none() => 191,
                _ => 118 + rng.below(12) as u8,
            })
            .collect();
        let bias = rng.vec_uniform(n, -1.0, 1.0);
        PackedWna16::pack_mxfp4(crate::Mxfp4Desc {
            n,
            k,
            blocks: &blocks,
            scales: &scales,
            bias: Some(&bias),
        })
        .unwrap()
    }

    /// MXFP4's e2m1 codes on each body that takes them equal the scalar twin bit for bit on
    /// ragged shapes (K past the last whole block, the largest and smallest code integers
    /// everywhere), whatever the thread split; a body that does not take them leaves them to
    /// the f32 body.
    #[test]
    fn e2m1_codes_equal_the_scalar_twin_where_a_body_takes_them() {
        let mut rng = SplitMix64::new(0x15e);
        for (body, ks, _, e2m1) in bodies_and_e2m1() {
            if !e2m1 {
                let w = e2m1_weights(&mut rng, 16, 64, None);
                assert!(ks.wna16_int4_dot_for(&w, 4).is_none(), "{body} took e2m1");
                continue;
            }
            for &(k, code) in &[
                (8usize, None),
                (32, None),
                (37, None),
                (100, None),
                (256, Some(7u8)),
                (256, Some(15)),
                (2100, None),
            ] {
                for &n in &[1usize, 17, 33, 65] {
                    let w = e2m1_weights(&mut rng, n, k, code);
                    let what = format!("e2m1 k={k} code={code:?} n={n}");
                    let ms = [0usize, 1, 2, 3, 4, 5, 9, 16, 65];
                    assert_equals_the_twin(body, &what, &ks, &w, &ms, &mut rng);
                }
            }
        }
    }

    /// MXFP4 through the integer sums against the f32 definition: as for integer codes, the
    /// only new error is each activation's rounding to its 15-bit grid.
    #[test]
    fn e2m1_codes_stay_within_the_grid_of_the_f32_definition() {
        let mut rng = SplitMix64::new(0x15f);
        for (body, ks, _, e2m1) in bodies_and_e2m1() {
            if !e2m1 {
                continue;
            }
            for &k in &[64usize, 300, 2048] {
                let n = 40;
                let kb = k.div_ceil(32);
                let blocks: Vec<u8> = (0..n * kb * 16).map(|_| rng.below(256) as u8).collect();
                let scales: Vec<u8> = (0..n * kb).map(|_| 120 + rng.below(10) as u8).collect();
                let bias = rng.vec_uniform(n, -1.0, 1.0);
                let w = PackedWna16::pack_mxfp4(crate::Mxfp4Desc {
                    n,
                    k,
                    blocks: &blocks,
                    scales: &scales,
                    bias: Some(&bias),
                })
                .unwrap();
                assert_within_the_grid(body, "e2m1", &ks, &w, &mut rng);
            }
        }
    }

    /// Scales beyond [`super::MAX_SCALE`] (an f32 `1e30`, an e8m0 254) leave the GEMM to the
    /// f32 body, whose sums do not overflow where the integer ones would: the outputs are those
    /// of the f32 set, bit for bit.
    #[test]
    fn extreme_scales_leave_the_integer_bodies() {
        let mut rng = SplitMix64::new(0x160);
        let (n, k) = (17usize, 64usize);
        let int4 = PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits: 4,
            codes: &(0..n * k).map(|i| (i % 16) as u8).collect::<Vec<_>>(),
            group_size: moe_quant::WeightGroups::groups(32).unwrap(),
            scales: Wna16Scales::F32(
                &(0..2 * n)
                    .map(|i| if i == 5 { 1e30 } else { 1e-3 })
                    .collect::<Vec<_>>(),
            ),
            zeros: None,
            bias: None,
            perm: None,
        })
        .unwrap();
        let scales: Vec<u8> = (0..2 * n).map(|i| if i == 3 { 254 } else { 120 }).collect();
        let blocks: Vec<u8> = (0..2 * n * 16).map(|i| (i % 7) as u8).collect();
        let e2m1 = PackedWna16::pack_mxfp4(crate::Mxfp4Desc {
            n,
            k,
            blocks: &blocks,
            scales: &scales,
            bias: None,
        })
        .unwrap();
        for (body, ks, _, _) in bodies_and_e2m1() {
            for (what, w) in [("int4", &int4), ("e2m1", &e2m1)] {
                assert!(ks.wna16_int4_dot_for(w, 4).is_none(), "{body} took {what}");
                let x: Vec<f32> = (0..4 * k).map(|_| rng.normal() * 1e-3).collect();
                let mut got = vec![0f32; 4 * n];
                let mut want = vec![0f32; 4 * n];
                crate::wna16_gemm(&ks, 4, &x, w, &mut got, &mut GemmScratch::new(), Par::Seq)
                    .unwrap();
                let f32_set = ks.without_bf16_path();
                crate::wna16_gemm(
                    &f32_set,
                    4,
                    &x,
                    w,
                    &mut want,
                    &mut GemmScratch::new(),
                    Par::Seq,
                )
                .unwrap();
                assert!(
                    want.iter().all(|v| v.is_finite()),
                    "{what}: the f32 body overflowed"
                );
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{body}: {what} differs from the f32 body");
            }
        }
    }

    /// The largest codes against the largest activations over a long channelwise K (blocks
    /// at the width's cap): the integer sums must not overflow.
    #[test]
    fn integer_sums_hold_the_largest_codes_and_activations() {
        for (body, ks, widths) in bodies() {
            for &bits in widths {
                let (n, k) = (3usize, 4096usize);
                let top = (1u32 << bits) - 1;
                let w = PackedWna16::pack(Wna16Desc {
                    n,
                    k,
                    bits,
                    codes: &vec![top as u8; n * k],
                    group_size: moe_quant::WeightGroups::Channelwise,
                    scales: Wna16Scales::F32(&[0.5, -0.25, 1.0]),
                    zeros: Some(&[0, 0, 0]),
                    bias: None,
                    perm: None,
                })
                .unwrap();
                for sign in [1.0f32, -1.0] {
                    let x = vec![sign * 3.0; 2 * k];
                    let mut got = vec![0f32; 2 * n];
                    crate::wna16_gemm(&ks, 2, &x, &w, &mut got, &mut GemmScratch::new(), Par::Seq)
                        .unwrap();
                    for (i, &v) in got.iter().enumerate() {
                        let scale = [0.5f64, -0.25, 1.0][i % n];
                        let want = f64::from(sign) * 3.0 * f64::from(top) * k as f64 * scale;
                        assert!(
                            (f64::from(v) - want).abs() <= 1e-5 * want.abs(),
                            "{body}: int{bits} out[{i}] = {v}, want {want}"
                        );
                    }
                }
            }
        }
    }

    /// A row holding a NaN or an infinity gives NaN outputs in that row only; an all-zero row
    /// gives the bias; a row of tiny values keeps its precision.
    #[test]
    fn integer_body_rows_of_non_finite_zero_and_tiny_values() {
        for (body, ks, widths) in bodies() {
            for &bits in widths {
                rows_of_non_finite_zero_and_tiny_values(body, &ks, bits);
            }
        }
    }

    fn rows_of_non_finite_zero_and_tiny_values(body: &str, ks: &crate::KernelSet, bits: u32) {
        let mut rng = SplitMix64::new(0x15d);
        let (n, k, m) = (20usize, 96usize, 6usize);
        let w = weights(&mut rng, (n, k, bits), Some(32), false, false);
        let mut x = rng.vec_uniform(m * k, -1.0, 1.0);
        x[k + 50] = f32::NAN;
        x[2 * k + 7] = f32::INFINITY;
        x[3 * k..4 * k].fill(0.0);
        for v in &mut x[4 * k..5 * k] {
            *v *= 1e-35;
        }
        let mut got = vec![0f32; m * n];
        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), Par::Seq).unwrap();
        let f32_def = crate::wna16_reference(m, &x, &w);
        for (r, row) in got.chunks_exact(n).enumerate() {
            assert_eq!(
                row.iter().all(|v| v.is_nan()),
                r == 1 || r == 2,
                "{body}: row {r}: {row:?}"
            );
            if r == 3 {
                assert_eq!(
                    row,
                    &w.bias().unwrap()[..n],
                    "{body}: an all-zero row gives the bias"
                );
            }
            if r == 4 {
                let bias = w.bias().unwrap();
                for c in 0..n {
                    let (a, b) = (row[c] - bias[c], f32_def[r * n + c] - bias[c]);
                    assert!(
                        (a - b).abs() <= 1e-3 * b.abs() + 1e-40,
                        "{body}: tiny row, channel {c}: {a:e} vs {b:e}"
                    );
                }
            }
        }
    }
}
