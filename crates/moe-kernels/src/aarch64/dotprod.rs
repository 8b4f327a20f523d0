//! The dot-product rung (`sdot`, FEAT_DotProd): 4 rows × 16 channels, signed activations.
//!
//! One packed 16-byte vector holds 4 channels × 4 K values, which is exactly the operand of
//! `sdot` by element: each i32 lane (a channel) gains the dot product of its 4 weight bytes with
//! one 4-byte group of the row's activations, selected by lane index, so no activation
//! broadcast is needed. W4A8 loads 8 activation bytes per packed step (groups 0 and 1 for the
//! low and high nibbles); W8A8 loads 16 bytes per 4 steps. The W4A8 tile also counts each
//! block's code sums `Σc`, which the zero-point correction needs, with one more `sdot` per 16
//! weight bytes (against ones, shared by its rows), so its block end reads nothing again. The
//! sums are exact in i32 and the shared epilogue (`common.rs`) reproduces the scalar reference
//! bit for bit.

use std::arch::aarch64::*;

use super::NeonDot;
use super::asm::{sdot_lane, sdot_lane_d};
use super::common::{
    RowAccF, RowSums, dup4, load_i8x8, load_i8x16, load_u8x16, unpack_codes, w4a8_block_end,
    w4a8_store, w8a8_store, zero_sums,
};
use crate::ukernel::{W4A8Job, W8A8Job};

/// Rows per tile.
const MR: usize = 4;

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn w4a8_tile<const R: usize, const ACC: bool>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let (weight_steps, _) = w.panel_nibbles(p).as_chunks::<64>();
    let row_steps: [&[[u8; 8]]; R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0);
    let mut acc_f: [RowAccF; R] = [[vdupq_n_f32(0.0); 4]; R];
    let ones = vdupq_n_s8(1);
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        let a_block: [&[[u8; 8]]; R] = std::array::from_fn(|r| &row_steps[r][steps.clone()]);
        for a in &a_block {
            assert_eq!(a.len(), w_block.len());
        }
        let mut sums: [RowSums; R] = [zero_sums(); R];
        let mut codes = zero_sums();
        // Indexing by position, not zipping iterators, lets the asserted lengths remove the
        // bounds checks, and with them the panic exits that would keep the sums in memory.
        for i in 0..w_block.len() {
            let a: [int8x8_t; R] = std::array::from_fn(|r| load_i8x8(&a_block[r][i]));
            let (quarters, _) = w_block[i].as_chunks::<16>();
            for (q, quarter) in quarters.iter().enumerate() {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                // `lo + hi` is at most 30 per byte: one `sdot` with ones adds both halves'
                // codes to the channels' sums, shared by the tile's rows.
                codes[q] = sdot_lane::<0>(codes[q], vaddq_s8(lo, hi), ones);
                for (row, &a) in sums.iter_mut().zip(&a) {
                    row[q] = sdot_lane_d::<1>(sdot_lane_d::<0>(row[q], lo, a), hi, a);
                }
            }
        }
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_block_end::<R, 4, ACC>(job, p, m0, 0, b, &sums, &codes, &mut acc_f) };
    }
    // SAFETY: as above.
    unsafe { w4a8_store::<R, 4>(job, p, m0, 0, &acc_f) };
}

/// Adds one W8A8 step (4 K values × 16 channels) to `sums`, taking each row's activations from
/// 4-byte group `LANE` of `a`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn w8_step<const LANE: u32, const R: usize>(
    sums: &mut [RowSums; R],
    step: &[i8; 64],
    a: &[int8x16_t; R],
) {
    let (quarters, _) = step.as_chunks::<16>();
    for (q, quarter) in quarters.iter().enumerate() {
        let v = load_i8x16(quarter);
        for (row, &a) in sums.iter_mut().zip(a) {
            row[q] = sdot_lane::<LANE>(row[q], v, a);
        }
    }
}

/// [`w8_step`] with each row's activations from 4-byte group `LANE` (0 or 1) of 8 bytes.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn w8_step_d<const LANE: u32, const R: usize>(
    sums: &mut [RowSums; R],
    step: &[i8; 64],
    a: &[int8x8_t; R],
) {
    let (quarters, _) = step.as_chunks::<16>();
    for (q, quarter) in quarters.iter().enumerate() {
        let v = load_i8x16(quarter);
        for (row, &a) in sums.iter_mut().zip(a) {
            row[q] = sdot_lane_d::<LANE>(row[q], v, a);
        }
    }
}

/// The W8A8 tile body for `R` rows.
///
/// Up to 2 rows, groups of 4 steps share one 16-byte activation load per row. More rows take
/// groups of 2 steps (8 bytes per row): the 16 accumulators of 4 rows, 4 activation vectors
/// and a 4-step group's 16 weight vectors would need 36 vector registers, and the loop would
/// spill (`cargo xtask arm-cost`).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn w8a8_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    let sums = if R <= 2 {
        w8a8_sums_by_4::<R>(job, p, m0)
    } else {
        w8a8_sums_by_2::<R>(job, p, m0)
    };
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w8a8_store::<R, 4>(job, p, m0, 0, &sums) };
}

/// The exact sums of a W8A8 tile, in groups of 4 steps; the remaining 0..3 steps broadcast
/// their 4 activation bytes.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn w8a8_sums_by_4<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) -> [RowSums; R] {
    let w = job.w;
    let k_pad = w.k_pad();
    let (weight_groups, weight_tail) = w.panel_bytes(p).as_chunks::<256>();
    let rows: [(&[[u8; 16]], &[u8]); R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<16>());
    let (tail_steps, _) = weight_tail.as_chunks::<64>();
    for (groups, tail) in &rows {
        assert_eq!(groups.len(), weight_groups.len());
        assert_eq!(tail.len(), 4 * tail_steps.len());
    }
    let mut sums: [RowSums; R] = [zero_sums(); R];
    for (g, group) in weight_groups.iter().enumerate() {
        let a: [int8x16_t; R] =
            std::array::from_fn(|r| vreinterpretq_s8_u8(load_u8x16(&rows[r].0[g])));
        let (steps, _) = group.as_chunks::<64>();
        w8_step::<0, R>(&mut sums, &steps[0], &a);
        w8_step::<1, R>(&mut sums, &steps[1], &a);
        w8_step::<2, R>(&mut sums, &steps[2], &a);
        w8_step::<3, R>(&mut sums, &steps[3], &a);
    }
    for (i, step) in tail_steps.iter().enumerate() {
        let a: [int8x16_t; R] = std::array::from_fn(|r| {
            let t = &rows[r].1[4 * i..];
            dup4([t[0], t[1], t[2], t[3]])
        });
        w8_step::<0, R>(&mut sums, step, &a);
    }
    sums
}

/// The exact sums of a W8A8 tile, in groups of 2 steps; a remaining odd step broadcasts its 4
/// activation bytes.
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn w8a8_sums_by_2<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) -> [RowSums; R] {
    let w = job.w;
    let k_pad = w.k_pad();
    let (weight_groups, weight_tail) = w.panel_bytes(p).as_chunks::<128>();
    let rows: [(&[[u8; 8]], &[u8]); R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>());
    let (tail_steps, _) = weight_tail.as_chunks::<64>();
    for (groups, tail) in &rows {
        assert_eq!(groups.len(), weight_groups.len());
        assert_eq!(tail.len(), 4 * tail_steps.len());
    }
    let mut sums: [RowSums; R] = [zero_sums(); R];
    for (g, group) in weight_groups.iter().enumerate() {
        let a: [int8x8_t; R] = std::array::from_fn(|r| load_i8x8(&rows[r].0[g]));
        let (steps, _) = group.as_chunks::<64>();
        w8_step_d::<0, R>(&mut sums, &steps[0], &a);
        w8_step_d::<1, R>(&mut sums, &steps[1], &a);
    }
    for (i, step) in tail_steps.iter().enumerate() {
        let a: [int8x16_t; R] = std::array::from_fn(|r| {
            let t = &rows[r].1[4 * i..];
            dup4([t[0], t[1], t[2], t[3]])
        });
        w8_step::<0, R>(&mut sums, step, &a);
    }
    sums
}

crate::ukernel::impl_microkernels! {
    token: NeonDot,
    features: "NEON and dot-product",
    mr: MR,
    rows: [1 2 3 4],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the dot-product rung.",
    token: NeonDot,
    isa: crate::Isa::NeonDot,
    w4a8: I8BlockCorrected,
    w8a8: I8,
}
