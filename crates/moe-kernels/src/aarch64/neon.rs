//! The baseline NEON rung (every aarch64 CPU): 4 rows × 16 channels with widening multiplies.
//!
//! Activations stay signed (`ActEncoding::I8`; W4A8 `ActEncoding::I8BlockCorrected`). One packed
//! 16-byte vector holds 4 channels × 4 K values; each row's 4 matching activation bytes are
//! repeated over a vector, `smull`/`smull2` give the i16 products of 2 channels each, `addp`
//! adds neighbouring products and `sadalp` widens the pair sums into one i32 lane per channel,
//! so the accumulators need no final
//! reduction. The i16 stages cannot overflow:
//!
//! - W4A8 multiplies the weight codes `c = w + 8` (`0..=15`, see `common::unpack_codes`) and
//!   adds the low- and high-nibble products first (`smlal`): `|q·c| ≤ 128·15`, so a lane holds
//!   at most `2·1920`, and after `addp` at most `7680`;
//! - W8A8 products are at most `128·127 = 16256` in magnitude (the driver rejects the code
//!   `−128`), so after `addp` at most `32512 < 2^15`.
//!
//! Block sums are then exact, and the shared epilogue (`common.rs`) makes the f32 outputs equal
//! the scalar reference bit for bit.

use std::arch::aarch64::*;

use super::Neon;
use super::common::{
    RowAccF, RowSums, dup4, load_i8x16, load_u8x16, recount_code_sums, unpack_codes,
    w4a8_block_end, w4a8_store, w8a8_store, zero_sums,
};
use crate::ukernel::{W4A8Job, W8A8Job};

/// Rows per tile.
const MR: usize = 4;

/// `sums + Σ` of 4 channels × 4 K values (`w`) against the 4 bytes repeated in `a`, for both
/// nibble halves of a W4A8 step (see the module docs for the i16 bounds).
#[target_feature(enable = "neon")]
#[inline]
fn w4_dot(
    sums: int32x4_t,
    lo: int8x16_t,
    a_lo: int8x16_t,
    hi: int8x16_t,
    a_hi: int8x16_t,
) -> int32x4_t {
    let ch01 = vmlal_s8(
        vmull_s8(vget_low_s8(lo), vget_low_s8(a_lo)),
        vget_low_s8(hi),
        vget_low_s8(a_hi),
    );
    let ch23 = vmlal_high_s8(vmull_high_s8(lo, a_lo), hi, a_hi);
    vpadalq_s16(sums, vpaddq_s16(ch01, ch23))
}

/// `sums + Σ` of 4 channels × 4 K values (`w`) against the 4 bytes repeated in `a` (W8A8).
#[target_feature(enable = "neon")]
#[inline]
fn w8_dot(sums: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let ch01 = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    let ch23 = vmull_high_s8(w, a);
    vpadalq_s16(sums, vpaddq_s16(ch01, ch23))
}

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon")]
#[cfg_attr(feature = "arm-cost", inline(never))]
unsafe fn w4a8_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
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
        let mut sums: [RowSums; R] = [zero_sums(); R];
        for (i, step) in w_block.iter().enumerate() {
            let a: [[int8x16_t; 2]; R] = std::array::from_fn(|r| {
                let [a0, a1, a2, a3, a4, a5, a6, a7] = a_block[r][i];
                [dup4([a0, a1, a2, a3]), dup4([a4, a5, a6, a7])]
            });
            let (quarters, _) = step.as_chunks::<16>();
            for (q, quarter) in quarters.iter().enumerate() {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                for (row, [a_lo, a_hi]) in sums.iter_mut().zip(a) {
                    row[q] = w4_dot(row[q], lo, a_lo, hi, a_hi);
                }
            }
        }
        let cs = recount_code_sums::<4>(w, p, b, 0);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_block_end::<R, 4, ACC>(job, p, m0, 0, b, &sums, &cs, &mut acc_f) };
    }
    // SAFETY: as above.
    unsafe { w4a8_store::<R, 4>(job, p, m0, 0, &acc_f) };
}

/// The W8A8 tile body for `R` rows.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon")]
#[cfg_attr(feature = "arm-cost", inline(never))]
unsafe fn w8a8_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    let w = job.w;
    let k_pad = w.k_pad();
    let (weight_steps, _) = w.panel_bytes(p).as_chunks::<64>();
    let row_steps: [&[[u8; 4]]; R] =
        std::array::from_fn(|r| job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<4>().0);
    for a in &row_steps {
        assert_eq!(a.len(), weight_steps.len());
    }
    let mut sums: [RowSums; R] = [zero_sums(); R];
    for (i, step) in weight_steps.iter().enumerate() {
        let a: [int8x16_t; R] = std::array::from_fn(|r| dup4(row_steps[r][i]));
        let (quarters, _) = step.as_chunks::<16>();
        for (q, quarter) in quarters.iter().enumerate() {
            let v = load_i8x16(quarter);
            for (row, &a) in sums.iter_mut().zip(&a) {
                row[q] = w8_dot(row[q], v, a);
            }
        }
    }
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w8a8_store::<R, 4>(job, p, m0, 0, &sums) };
}

crate::ukernel::impl_microkernels! {
    token: Neon,
    features: "NEON",
    mr: MR,
    rows: [1 2 3 4],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the NEON rung.",
    token: Neon,
    isa: crate::Isa::Neon,
    w4a8: I8BlockCorrected,
    w8a8: I8,
}
