//! The int8 matrix-multiply rung (`smmla`, FEAT_I8MM): up to 16 rows × 16 channels as row
//! pairs × channel pairs of 2×2 i32 blocks, signed activations.
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
//! The activation operand of a row pair (8 K values of each row) would take a load and an
//! insert per step and pair; the rung instead re-lays each GEMM's rows once as row pairs
//! ([`pair_rows`], the driver's layout hook), so one 16-byte load is one operand, and its
//! tiles start on even rows (`row_align: 2`) to match.
//!
//! The unpacking and zips cost the same whatever the rows, so the more row pairs share each
//! weight operand the more MACs per instruction: tiles are up to 16 rows (8 row pairs). Every
//! pass keeps 16 accumulators, so the taller the tile the fewer channels a pass covers: a tile
//! of up to 4 rows covers its panel in one pass of 16 channels (2 row pairs × 8 channel pairs),
//! one of 5 to 8 rows in two passes of 8 (4 × 4), and one of 9 to 16 rows in four passes of 4
//! (8 × 2), where each unpacked and zipped quarter feeds up to 16 `smmla`. Each pass closes the
//! blocks of its own channels.
//!
//! A tile of one row runs the dot-product body instead (the token implies dot product): `smmla`
//! would spend half its work on a row of zeros, and the 1-row `sdot` loop does more MACs per
//! cycle (`cargo xtask arm-cost`). An odd last row of a taller tile is paired with zero
//! activations, whose results are dropped. The 2×2 blocks are regrouped into rows
//! (`zip1`/`zip2` on 64-bit lanes), giving the exact row sums that the shared epilogue
//! (`common.rs`) turns into outputs bit-identical to the scalar reference.

use std::arch::aarch64::*;

use super::NeonI8mm;
use super::asm::smmla;
use super::common::{load_i8x16, load_u8x16, unpack_codes, w4a8_block_end, w4a8_store, w8a8_store};
use crate::ukernel::{W4A8Job, W8A8Job};

/// Rows per tile.
const MR: usize = 16;

/// Bytes of one chunk of the row-pair layout: 8 K values of each of the two rows.
const PAIR_CHUNK: usize = 16;

/// Bytes of one row pair in the layout of rows of `k_pad` values.
fn pair_stride(k_pad: usize) -> usize {
    k_pad.div_ceil(8) * PAIR_CHUNK
}

/// The size of [`pair_rows`]'s layout of `m` rows of `k_pad` values.
fn pair_rows_bytes(m: usize, k_pad: usize) -> usize {
    m.div_ceil(2) * pair_stride(k_pad)
}

/// Re-lays a GEMM's encoded rows (`[m][k_pad]`) as row pairs, the `smmla` activation operand:
/// chunk `c` of pair `j` is row `2j`'s K values `8c..8c + 8`, then row `2j + 1`'s, with zeros
/// past `k_pad` and for the missing partner of an odd last row (whose results are dropped).
/// One-row calls run the dot-product body on the rows as they are, so they get no layout.
/// `dst` only grows, and [`crate::KernelSet::layout_bytes`] lets scratch be sized up front.
fn pair_rows(a: &[u8], m: usize, k_pad: usize, dst: &mut Vec<u8>) {
    if m < 2 {
        return;
    }
    let (stride, len) = (pair_stride(k_pad), pair_rows_bytes(m, k_pad));
    if dst.len() < len {
        dst.resize(len, 0);
    }
    for (j, pair) in dst[..len].chunks_exact_mut(stride).enumerate() {
        for (c, chunk) in pair.as_chunks_mut::<PAIR_CHUNK>().0.iter_mut().enumerate() {
            for (half, out) in chunk.as_chunks_mut::<8>().0.iter_mut().enumerate() {
                let (r, k0) = (2 * j + half, 8 * c);
                let n = if r < m {
                    let n = 8.min(k_pad - k0);
                    out[..n].copy_from_slice(&a[r * k_pad + k0..][..n]);
                    n
                } else {
                    0
                };
                out[n..].fill(0);
            }
        }
    }
}

/// [`pair_rows`] as the W4A8 layout hook.
fn w4a8_pair_rows(
    a: &[u8],
    _corr: &[i32],
    m: usize,
    w: &crate::packed::PackedW4A8,
    dst: &mut Vec<u8>,
) {
    pair_rows(a, m, w.k_pad(), dst);
}

/// The layout chunks of the `P` row pairs of a tile of `R` rows at row `m0` (even), each
/// `[chunk][16 bytes]`; pairs past the tile's rows are empty.
fn tile_pairs<const R: usize, const P: usize>(
    a_tiles: &[u8],
    m0: usize,
    k_pad: usize,
) -> [&[[u8; PAIR_CHUNK]]; P] {
    debug_assert!(m0.is_multiple_of(2));
    let stride = pair_stride(k_pad);
    std::array::from_fn(|j| {
        if j < R.div_ceil(2) {
            a_tiles[(m0 / 2 + j) * stride..][..stride]
                .as_chunks::<PAIR_CHUNK>()
                .0
        } else {
            &[]
        }
    })
}

/// The activation operands of the `P` row pairs at chunk `c`; zeros past the tile's rows.
#[target_feature(enable = "neon")]
#[inline]
fn pair_operands<const R: usize, const P: usize>(
    pairs: &[&[[u8; PAIR_CHUNK]]; P],
    c: usize,
) -> [int8x16_t; P] {
    std::array::from_fn(|j| {
        if j < R.div_ceil(2) {
            vreinterpretq_s8_u8(load_u8x16(&pairs[j][c]))
        } else {
            vdupq_n_s8(0)
        }
    })
}

/// Adds 4 channels (the pass's quarter `q`) × 8 K values to the accumulators
/// `[row pair][channel pair]` (each `[r0·c0, r0·c1, r1·c0, r1·c1]`): `first` holds the 4
/// channels' K values 0..4, `second` their K values 4..8.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_quarter<const R: usize, const P: usize, const CP: usize>(
    mm: &mut [[int32x4_t; CP]; P],
    a: &[int8x16_t; P],
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

/// Regroups the 2×2 blocks into the sums of each of the `R` rows over the pass's `NQ`
/// quarters (lane `i` of vector `q` is channel `4q + i` of the pass).
#[target_feature(enable = "neon")]
#[inline]
fn rows_of<const R: usize, const P: usize, const CP: usize, const NQ: usize>(
    mm: &[[int32x4_t; CP]; P],
) -> [[int32x4_t; NQ]; R] {
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

/// One pass of a W4A8 tile: rows `m0..m0 + R` as `P` row pairs, channel quarters
/// `Q0..Q0 + NQ` of panel `p` (`CP = 2·NQ` channel pairs), every block, then the outputs of
/// those channels; `ACC` selects block-accumulator output.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn w4a8_pass<
    const R: usize,
    const P: usize,
    const NQ: usize,
    const CP: usize,
    const Q0: usize,
    const ACC: bool,
>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
) {
    debug_assert!(CP == 2 * NQ && R <= 2 * P && Q0 + NQ <= 4);
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let (weight_steps, _) = w.panel_nibbles(p).as_chunks::<64>();
    // A W4A8 step is 8 K values: one chunk of the row-pair layout.
    let pair_steps = tile_pairs::<R, P>(job.a_tiles, m0, k_pad);
    let mut acc_f: [[float32x4_t; NQ]; R] = [[vdupq_n_f32(0.0); NQ]; R];
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        let a_block: [&[[u8; PAIR_CHUNK]]; P] = std::array::from_fn(|j| {
            let pair = pair_steps[j];
            if pair.is_empty() {
                pair
            } else {
                &pair[steps.clone()]
            }
        });
        for a in a_block.iter().take(R.div_ceil(2)) {
            assert_eq!(a.len(), w_block.len());
        }
        let mut mm = [[vdupq_n_s32(0); CP]; P];
        for (i, step) in w_block.iter().enumerate() {
            let a = pair_operands::<R, P>(&a_block, i);
            let (quarters, _) = step.as_chunks::<16>();
            for (q, quarter) in quarters[Q0..Q0 + NQ].iter().enumerate() {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                mm_quarter::<R, P, CP>(&mut mm, &a, q, lo, hi);
            }
        }
        let sums = rows_of::<R, P, CP, NQ>(&mm);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_block_end::<R, NQ, ACC>(job, p, m0, Q0, b, &sums, &mut acc_f) };
    }
    // SAFETY: as above.
    unsafe { w4a8_store::<R, NQ>(job, p, m0, Q0, &acc_f) };
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
    if R <= 4 {
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_pass::<R, 2, 4, 8, 0, ACC>(job, p, m0) };
    } else if R <= 8 {
        // SAFETY: as above; the two passes write disjoint channels.
        unsafe { w4a8_pass::<R, 4, 2, 4, 0, ACC>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w4a8_pass::<R, 4, 2, 4, 2, ACC>(job, p, m0) };
    } else {
        // SAFETY: as above; the four passes write disjoint channels.
        unsafe { w4a8_pass::<R, 8, 1, 2, 0, ACC>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w4a8_pass::<R, 8, 1, 2, 1, ACC>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w4a8_pass::<R, 8, 1, 2, 2, ACC>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w4a8_pass::<R, 8, 1, 2, 3, ACC>(job, p, m0) };
    }
}

/// One pass of a W8A8 tile: rows `m0..m0 + R` as `P` row pairs, channel quarters
/// `Q0..Q0 + NQ` of panel `p` (`CP = 2·NQ` channel pairs).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn w8a8_pass<
    const R: usize,
    const P: usize,
    const NQ: usize,
    const CP: usize,
    const Q0: usize,
>(
    job: &W8A8Job<'_>,
    p: usize,
    m0: usize,
) {
    debug_assert!(CP == 2 * NQ && R <= 2 * P && Q0 + NQ <= 4);
    let w = job.w;
    let k_pad = w.k_pad();
    let (step_pairs, odd_step) = w.panel_bytes(p).as_chunks::<128>();
    // Two W8A8 steps are 8 K values: one chunk of the row-pair layout; an odd last step is a
    // last chunk whose second 4 bytes of each row are zeros.
    let pairs = tile_pairs::<R, P>(job.a_tiles, m0, k_pad);
    for pair in pairs.iter().take(R.div_ceil(2)) {
        assert_eq!(pair.len(), k_pad.div_ceil(8));
        assert_eq!(pair.len() - step_pairs.len(), odd_step.len() / 64);
    }
    let mut mm = [[vdupq_n_s32(0); CP]; P];
    for (t, two_steps) in step_pairs.iter().enumerate() {
        let a = pair_operands::<R, P>(&pairs, t);
        let (first, second) = two_steps.split_at(64);
        let (first, second) = (first.as_chunks::<16>().0, second.as_chunks::<16>().0);
        for q in 0..NQ {
            let v0 = load_i8x16(&first[Q0 + q]);
            let v1 = load_i8x16(&second[Q0 + q]);
            mm_quarter::<R, P, CP>(&mut mm, &a, q, v0, v1);
        }
    }
    if let Ok(last) = <&[i8; 64]>::try_from(odd_step) {
        let a = pair_operands::<R, P>(&pairs, step_pairs.len());
        let (quarters, _) = last.as_chunks::<16>();
        for (q, quarter) in quarters[Q0..Q0 + NQ].iter().enumerate() {
            mm_quarter::<R, P, CP>(&mut mm, &a, q, load_i8x16(quarter), vdupq_n_s8(0));
        }
    }
    let sums = rows_of::<R, P, CP, NQ>(&mm);
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w8a8_store::<R, NQ>(job, p, m0, Q0, &sums) };
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
    if R <= 4 {
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w8a8_pass::<R, 2, 4, 8, 0>(job, p, m0) };
    } else if R <= 8 {
        // SAFETY: as above; the two passes write disjoint channels.
        unsafe { w8a8_pass::<R, 4, 2, 4, 0>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w8a8_pass::<R, 4, 2, 4, 2>(job, p, m0) };
    } else {
        // SAFETY: as above; the four passes write disjoint channels.
        unsafe { w8a8_pass::<R, 8, 1, 2, 0>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w8a8_pass::<R, 8, 1, 2, 1>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w8a8_pass::<R, 8, 1, 2, 2>(job, p, m0) };
        // SAFETY: as above.
        unsafe { w8a8_pass::<R, 8, 1, 2, 3>(job, p, m0) };
    }
}

crate::ukernel::impl_microkernels! {
    token: NeonI8mm,
    features: "NEON, dot-product and i8mm",
    mr: MR,
    row_align: 2,
    rows: [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

/// The kernels of the int8 matrix-multiply rung, reading their activations as row pairs
/// ([`pair_rows`]).
pub(crate) fn kernel_set(_token: NeonI8mm) -> crate::KernelSet {
    use crate::ukernel::{ActEncoding, W4A8PanelsFn, W8A8PanelsFn};
    let isa = crate::Isa::NeonI8mm;
    let w4a8 = (
        isa,
        ActEncoding::I8BlockCorrected,
        w4a8_entry as W4A8PanelsFn,
    );
    let w8a8 = (isa, ActEncoding::I8, w8a8_entry as W8A8PanelsFn);
    // SAFETY: the token proves this rung's CPU features, all its two entries need.
    let set = unsafe { crate::KernelSet::from_entries(isa, w4a8, w8a8) };
    set.with_layouts(w4a8_pair_rows, pair_rows, pair_rows_bytes)
}
