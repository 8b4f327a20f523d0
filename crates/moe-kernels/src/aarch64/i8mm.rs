//! The int8 matrix-multiply rung (`smmla`, FEAT_I8MM): 4 rows × 16 channels as 2 row pairs ×
//! 8 channel pairs of 2×2 i32 blocks, signed activations.
//!
//! `smmla` multiplies a 2×8 block of activations (two rows, 8 consecutive K values) with an
//! 8×2 block of weights (two channels, the same K values). The packed panels are read as they
//! are, without repacking:
//!
//! - W4A8: a 16-byte quarter of a packed step holds 4 channels × 4 K values in its low nibbles
//!   (K 0..4 of the step) and its high nibbles (K 4..8). Zipping the unpacked halves by 32-bit
//!   lanes (`zip1`/`zip2`) gives channels (0, 1) and (2, 3) with their 8 K values in order:
//!   two `smmla` operands. The activation operand is 8 bytes of each of the two rows.
//! - W8A8: a step holds 4 K values, so two consecutive steps are zipped the same way; an odd
//!   last step is paired with zero weights (and its 4 activation bytes with zeros).
//!
//! A tile of one row runs the dot-product body instead (the token implies dot product): `smmla`
//! would spend half its work on a row of zeros, and the 1-row `sdot` loop does more MACs per
//! cycle (`cargo xtask arm-cost`). An odd last row of a taller tile is paired with zero
//! activations, whose results are dropped. The 2×2 blocks
//! are regrouped into rows (`zip1`/`zip2` on 64-bit lanes), giving the exact [`RowSums`] that
//! the shared epilogue (`common.rs`) turns into outputs bit-identical to the scalar reference.

use std::arch::aarch64::*;

use super::NeonI8mm;
use super::asm::smmla;
use super::common::{
    RowAccF, RowSums, load_i8x8, load_i8x16, load_u8x16, unpack_codes, w4a8_block_end, w4a8_store,
    w8a8_store,
};
use crate::ukernel::{W4A8Job, W8A8Job};

/// Rows per tile.
const MR: usize = 4;

/// Row pairs per tile.
const PAIRS: usize = MR / 2;

/// The `smmla` accumulators of a tile: `[row pair][channel pair]`, each
/// `[r0·c0, r0·c1, r1·c0, r1·c1]`.
type PairSums = [[int32x4_t; 8]; PAIRS];

/// Accumulators that start at zero.
#[target_feature(enable = "neon")]
#[inline]
fn zero_pairs() -> PairSums {
    [[vdupq_n_s32(0); 8]; PAIRS]
}

/// The activation operand of row pair `pair`: 8 bytes of row `2·pair` then of row
/// `2·pair + 1`, with zeros for rows at or past `R`.
#[target_feature(enable = "neon")]
#[inline]
fn row_pair<const R: usize>(rows: [int8x8_t; R], pair: usize) -> int8x16_t {
    let row = |r: usize| if r < R { rows[r] } else { vdup_n_s8(0) };
    vcombine_s8(row(2 * pair), row(2 * pair + 1))
}

/// Adds 4 channels (`4q..4q + 4`) × 8 K values to the accumulators: `first` holds the 4
/// channels' K values 0..4, `second` their K values 4..8.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_quarter<const R: usize>(
    mm: &mut PairSums,
    a: &[int8x16_t; PAIRS],
    q: usize,
    first: int8x16_t,
    second: int8x16_t,
) {
    let (first, second) = (vreinterpretq_s32_s8(first), vreinterpretq_s32_s8(second));
    let ch01 = vreinterpretq_s8_s32(vzip1q_s32(first, second));
    let ch23 = vreinterpretq_s8_s32(vzip2q_s32(first, second));
    for (acc, &a) in mm.iter_mut().zip(a).take(R.div_ceil(2)) {
        acc[2 * q] = smmla(acc[2 * q], a, ch01);
        acc[2 * q + 1] = smmla(acc[2 * q + 1], a, ch23);
    }
}

/// Regroups the 2×2 blocks into the sums of each of the `R` rows.
#[target_feature(enable = "neon")]
#[inline]
fn rows_of<const R: usize>(mm: &PairSums) -> [RowSums; R] {
    std::array::from_fn(|r| {
        std::array::from_fn(|q| {
            let ch01 = vreinterpretq_s64_s32(mm[r / 2][2 * q]);
            let ch23 = vreinterpretq_s64_s32(mm[r / 2][2 * q + 1]);
            let row = if r % 2 == 0 {
                vzip1q_s64(ch01, ch23)
            } else {
                vzip2q_s64(ch01, ch23)
            };
            vreinterpretq_s32_s64(row)
        })
    })
}

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,i8mm")]
unsafe fn w4a8_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    if R == 1 {
        // SAFETY: the i8mm token is only made where dot product is present too
        // (`NeonI8mm::is_available`), so the dot-product body may run here; the output
        // contract is forwarded from our caller.
        return unsafe { super::dotprod::w4a8_tile::<1, ACC>(job, p, m0) };
    }
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let (weight_steps, _) = w.panel_nibbles(p).as_chunks::<64>();
    let row_steps: [&[[u8; 8]]; R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0);
    let mut acc_f: [RowAccF; R] = [[vdupq_n_f32(0.0); 4]; R];
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        let a_block: [&[[u8; 8]]; R] = std::array::from_fn(|r| &row_steps[r][steps.clone()]);
        for a in &a_block {
            assert_eq!(a.len(), w_block.len());
        }
        let mut mm = zero_pairs();
        for (i, step) in w_block.iter().enumerate() {
            let rows: [int8x8_t; R] = std::array::from_fn(|r| load_i8x8(&a_block[r][i]));
            let a: [int8x16_t; PAIRS] = std::array::from_fn(|pair| row_pair(rows, pair));
            let (quarters, _) = step.as_chunks::<16>();
            for (q, quarter) in quarters.iter().enumerate() {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                mm_quarter::<R>(&mut mm, &a, q, lo, hi);
            }
        }
        let sums = rows_of::<R>(&mm);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_block_end::<R, ACC>(job, p, m0, b, &sums, &mut acc_f) };
    }
    // SAFETY: as above.
    unsafe { w4a8_store::<R>(job, p, m0, &acc_f) };
}

/// The W8A8 tile body for `R` rows.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon,i8mm")]
unsafe fn w8a8_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    if R == 1 {
        // SAFETY: as in `w4a8_tile`: the i8mm token implies dot product; the output contract
        // is forwarded from our caller.
        return unsafe { super::dotprod::w8a8_tile::<1>(job, p, m0) };
    }
    let w = job.w;
    let k_pad = w.k_pad();
    let (step_pairs, odd_step) = w.panel_bytes(p).as_chunks::<128>();
    let rows: [(&[[u8; 8]], &[u8]); R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>());
    for (pairs, rest) in &rows {
        assert_eq!(pairs.len(), step_pairs.len());
        assert_eq!(rest.len() * 16, odd_step.len());
    }
    let mut mm = zero_pairs();
    for (t, two_steps) in step_pairs.iter().enumerate() {
        let row_bytes: [int8x8_t; R] = std::array::from_fn(|r| load_i8x8(&rows[r].0[t]));
        let a: [int8x16_t; PAIRS] = std::array::from_fn(|pair| row_pair(row_bytes, pair));
        let (first, second) = two_steps.split_at(64);
        for q in 0..4 {
            let v0 = load_i8x16(first[16 * q..][..16].try_into().unwrap());
            let v1 = load_i8x16(second[16 * q..][..16].try_into().unwrap());
            mm_quarter::<R>(&mut mm, &a, q, v0, v1);
        }
    }
    if let Ok(last) = <&[i8; 64]>::try_from(odd_step) {
        let row_bytes: [int8x8_t; R] = std::array::from_fn(|r| {
            let t = rows[r].1;
            vcreate_s8(u64::from(u32::from_le_bytes([t[0], t[1], t[2], t[3]])))
        });
        let a: [int8x16_t; PAIRS] = std::array::from_fn(|pair| row_pair(row_bytes, pair));
        let (quarters, _) = last.as_chunks::<16>();
        for (q, quarter) in quarters.iter().enumerate() {
            mm_quarter::<R>(&mut mm, &a, q, load_i8x16(quarter), vdupq_n_s8(0));
        }
    }
    let sums = rows_of::<R>(&mm);
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w8a8_store::<R>(job, p, m0, &sums) };
}

crate::ukernel::impl_microkernels! {
    token: NeonI8mm,
    features: "NEON, dot-product and i8mm",
    mr: MR,
    rows: [1 2 3 4],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the int8 matrix-multiply rung.",
    token: NeonI8mm,
    isa: crate::Isa::NeonI8mm,
    w4a8: I8BlockCorrected,
    w8a8: I8,
}
