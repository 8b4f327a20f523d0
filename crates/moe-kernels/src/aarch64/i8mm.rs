//! The int8 matrix-multiply rung (`smmla`, FEAT_I8MM): up to 16 rows × 16 channels as row
//! pairs × channel pairs of 2×2 i32 blocks, signed activations.
//!
//! `smmla` multiplies a 2×8 block of activations (two rows, 8 consecutive K values) with an
//! 8×2 block of weights (two channels, the same K values). The rung asks for its weights in the
//! pair order ([`crate::PanelOrder::Pairs`], `KernelSet::panel_order`), where each 16 bytes of
//! a step pair are one channel pair's operands:
//!
//! - W4A8: the low nibbles (`and`) are the operand of the step pair's first 8 K values, the
//!   high nibbles (`ushr`) that of the next 8: one instruction per operand, no `zip`
//!   ([`w4a8_pairs_tile`]).
//! - W8A8: the 16 bytes are the operand as loaded ([`w8a8_pairs_tile`]).
//!
//! An odd last step of either order, and weights in the lane order, are read as they are:
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
//! The unpacking (and zips) cost the same whatever the rows, so the more row pairs share each
//! weight operand the more MACs per instruction: tiles are up to 16 rows (8 row pairs). Every
//! pass keeps 16 accumulators, so the taller the tile the fewer channels a pass covers: a tile
//! of up to 4 rows covers its panel in one pass of 16 channels (2 row pairs × 8 channel pairs),
//! one of 5 to 8 rows in two passes of 8 (4 × 4), and one of 9 to 16 rows in four passes of 4
//! (8 × 2), where each unpacked and zipped quarter feeds up to 16 `smmla`. Each pass closes the
//! blocks of its own channels.
//!
//! On the lane order a tile of one row runs the dot-product body instead (the token implies dot
//! product): `smmla` would spend half its work on a padding row and its zips, and the 1-row
//! `sdot` loop does more MACs per cycle (`cargo xtask arm-cost`). On the pair order a padding
//! row costs no more per useful MAC than `sdot` does, so one row runs as a row pair, read
//! straight from the encoded row (one-row calls get no layout). The partner of a lone row (one
//! row, or the odd last row of a taller tile) is a row of ones: its products are the codes'
//! sums `Σc` of each channel, which the W4A8 block end needs for the zero-point correction
//! (W8A8 drops them). Tiles of an even number of rows count those sums beside their products,
//! one `smmla` per 4 channels and 16 K values against a constant that picks each channel's
//! bytes (after a pairwise byte add that brings two channel pairs into the lane order). The
//! 2×2 blocks are regrouped into rows (`zip1`/`zip2` on 64-bit lanes), giving the exact row
//! sums that the shared epilogue (`common.rs`) turns into outputs bit-identical to the scalar
//! reference.

use std::arch::aarch64::*;

use super::NeonI8mm;
use super::asm::smmla;
use super::common::{
    load_f32x4, load_i8x8, load_i8x16, load_u8x16, unpack_codes, w4a8_block_end, w4a8_store,
    w8a8_store,
};
use crate::aligned::AlignedVec;
use crate::packed::PanelOrder;
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
/// past `k_pad`, and ones for the missing partner of an odd last row (whose products are the
/// code sums of [`code_sums`]).
/// One-row calls run the dot-product body on the rows as they are, so they get no layout.
/// `dst` only grows, and [`crate::KernelSet::layout_bytes`] lets scratch be sized up front.
fn pair_rows(a: &[u8], m: usize, k_pad: usize, dst: &mut AlignedVec<u8>) {
    if m < 2 {
        return;
    }
    let (stride, len) = (pair_stride(k_pad), pair_rows_bytes(m, k_pad));
    dst.grow_to(len);
    for (j, pair) in dst[..len].chunks_exact_mut(stride).enumerate() {
        let (chunks, _) = pair.as_chunks_mut::<PAIR_CHUNK>();
        for half in 0..2 {
            let r = 2 * j + half;
            // Whole 8-byte pieces move as fixed-size copies (a load and a store each), not as
            // calls to `memcpy` and `memset`.
            let (whole, tail) = if r < m {
                a[r * k_pad..][..k_pad].as_chunks::<8>()
            } else {
                (&[][..], &[][..])
            };
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            for (c, chunk) in chunks.iter_mut().enumerate() {
                chunk.as_chunks_mut::<8>().0[half] = match whole.get(c) {
                    Some(piece) => *piece,
                    None if r < m => last,
                    // The missing partner's products are dropped, except as a W4A8 tile's
                    // code sums (see `code_sums`).
                    None => [1; 8],
                };
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
    dst: &mut AlignedVec<u8>,
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
/// channels' K values 0..4, `second` their K values 4..8. A W4A8 tile with an even number of
/// rows also counts their codes into the quarter's code sums `cs` (see [`count_codes`]).
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_quarter<const R: usize, const P: usize, const CP: usize>(
    mm: &mut [[int32x4_t; CP]; P],
    cs: Option<&mut int32x4_t>,
    a: &[int8x16_t; P],
    q: usize,
    first: int8x16_t,
    second: int8x16_t,
) {
    let (lanes0, lanes1) = (vreinterpretq_s32_s8(first), vreinterpretq_s32_s8(second));
    let ch01 = vreinterpretq_s8_s32(vzip1q_s32(lanes0, lanes1));
    let ch23 = vreinterpretq_s8_s32(vzip2q_s32(lanes0, lanes1));
    for (acc, &a) in mm.iter_mut().zip(a).take(R.div_ceil(2)) {
        acc[2 * q] = smmla(acc[2 * q], a, ch01);
        acc[2 * q + 1] = smmla(acc[2 * q + 1], a, ch23);
    }
    if let Some(cs) = cs {
        // Both halves are in the lane order: their sum holds each channel's 4 bytes in turn.
        count_codes::<R>(cs, vaddq_s8(first, second));
    }
}

/// Adds the codes of 4 channels, given in the lane order (4 bytes of each channel in turn,
/// each byte at most 60 and the sum of up to 4 codes), to their sums `cs` (lane `i`: channel
/// `i`), for a tile of an even number of rows (see [`code_sums`]); a tile of an odd number
/// counts them in its padding row and adds nothing here. One `smmla` against a constant does
/// it: as a 2×8 operand the bytes are channels (0, 1) and (2, 3), and the constant's rows pick
/// each row's first and last 4 bytes.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn count_codes<const R: usize>(cs: &mut int32x4_t, codes: int8x16_t) {
    if counts_code_sums::<R>() {
        const PICK: [i8; 16] = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1];
        *cs = smmla(*cs, codes, load_i8x16(&PICK));
    }
}

/// Regroups the 2×2 blocks into the sums of row `r` over the pass's `NQ` quarters (lane `i`
/// of vector `q` is channel `4q + i` of the pass).
#[target_feature(enable = "neon")]
#[inline]
fn row_of<const P: usize, const CP: usize, const NQ: usize>(
    mm: &[[int32x4_t; CP]; P],
    r: usize,
) -> [int32x4_t; NQ] {
    std::array::from_fn(|q| {
        let ch01 = vreinterpretq_s64_s32(mm[r / 2][2 * q]);
        let ch23 = vreinterpretq_s64_s32(mm[r / 2][2 * q + 1]);
        let row = if r.is_multiple_of(2) {
            vzip1q_s64(ch01, ch23)
        } else {
            vzip2q_s64(ch01, ch23)
        };
        vreinterpretq_s32_s64(row)
    })
}

/// [`row_of`] for each of the `R` rows.
#[target_feature(enable = "neon")]
#[inline]
fn rows_of<const R: usize, const P: usize, const CP: usize, const NQ: usize>(
    mm: &[[int32x4_t; CP]; P],
) -> [[int32x4_t; NQ]; R] {
    std::array::from_fn(|r| row_of::<P, CP, NQ>(mm, r))
}

/// The block's code sums `Σc` of the pass's channels, laid out as [`row_of`]'s rows: with an
/// odd number of rows the tile's last row pair carries a row of ones (see [`pair_rows`]), whose
/// products are the code sums; otherwise `cs` holds them, counted by [`count_codes`] beside
/// the products.
#[target_feature(enable = "neon")]
#[inline]
fn code_sums<const R: usize, const P: usize, const CP: usize, const NQ: usize>(
    mm: &[[int32x4_t; CP]; P],
    cs: &[int32x4_t; NQ],
) -> [int32x4_t; NQ] {
    if counts_code_sums::<R>() {
        *cs
    } else {
        row_of::<P, CP, NQ>(mm, R)
    }
}

/// Whether a tile of `R` rows counts its code sums beside its products (an even number of rows
/// leaves no padding row of ones to count them).
const fn counts_code_sums<const R: usize>() -> bool {
    R.is_multiple_of(2)
}

/// The f32 block accumulators of a pass. Tiles of 4 rows or more keep them in the 2×2 layout
/// of their integer sums (`pairs`, `[row pair][channel pair]`, see [`mm_quarter`]): a block
/// then closes on the layout it was summed in, and the rows are regrouped once, for the store,
/// which saves a regrouping per block and row. Shorter tiles keep rows (`rows`, as
/// [`w4a8_block_end`] takes them): on the 2×2 layout their padding rows and the repeated
/// channel values would cost more than the regrouping. The layout a tile does not use is
/// never read, and the compiler drops it.
struct PassAccF<const R: usize, const P: usize, const CP: usize, const NQ: usize> {
    rows: [[float32x4_t; NQ]; R],
    pairs: [[float32x4_t; CP]; P],
}

impl<const R: usize, const P: usize, const CP: usize, const NQ: usize> PassAccF<R, P, CP, NQ> {
    /// Whether the tile keeps the 2×2 layout.
    const ON_PAIRS: bool = R >= 4;

    /// Accumulators that start at zero.
    #[target_feature(enable = "neon")]
    #[inline]
    fn zero() -> Self {
        Self {
            rows: [[vdupq_n_f32(0.0); NQ]; R],
            pairs: [[vdupq_n_f32(0.0); CP]; P],
        }
    }
}

/// The values of channel pair `L` of a quarter (lanes `2L` and `2L + 1` of `v`, one value per
/// channel) repeated for both rows of a row pair, as the 2×2 layout holds them.
#[target_feature(enable = "neon")]
#[inline]
fn channel_pair<const L: i32>(v: int32x4_t) -> int32x4_t {
    vreinterpretq_s32_s64(vdupq_laneq_s64::<L>(vreinterpretq_s64_s32(v)))
}

/// The `CP` channel pairs of `NQ` quarters in the 2×2 layout (see [`channel_pair`]).
#[target_feature(enable = "neon")]
#[inline]
fn channel_pairs<const NQ: usize, const CP: usize>(v: &[int32x4_t; NQ]) -> [int32x4_t; CP] {
    std::array::from_fn(|cp| {
        if cp.is_multiple_of(2) {
            channel_pair::<0>(v[cp / 2])
        } else {
            channel_pair::<1>(v[cp / 2])
        }
    })
}

/// Each row pair's values of `per_row` (one per row of the tile) in the 2×2 layout,
/// `[v(2j), v(2j), v(2j + 1), v(2j + 1)]`; 0 for the padding row of an odd last pair and for
/// pairs past the tile's rows.
#[target_feature(enable = "neon")]
#[inline]
fn row_pairs<const R: usize, const P: usize>(per_row: impl Fn(usize) -> i32) -> [int32x4_t; P] {
    std::array::from_fn(|j| {
        let row = |r: usize| vdup_n_s32(if r < R { per_row(r) } else { 0 });
        vcombine_s32(row(2 * j), row(2 * j + 1))
    })
}

/// Closes scale block `b` of a pass's W4A8 tile on its 2×2 sums `mm` and the block's code sums
/// `cs` (lane order, one vector per quarter, see [`code_sums`]), both taken by value so that
/// the tile's own sums never have their address taken and stay in registers through its inner
/// loop (this function is not always inlined): the same arithmetic as
/// [`w4a8_block_end`], element for element (so the same bits), on the 2×2 layout where the
/// tile keeps it ([`PassAccF`]). `zp` holds the row pairs' zero points ([`row_pairs`]), made
/// once per pass. Shorter tiles, and block-accumulator output (`ACC`, which stores rows),
/// regroup the sums into rows and run the shared block end.
///
/// # Safety
/// - As [`w4a8_block_end`]'s.
#[target_feature(enable = "neon")]
#[inline]
#[allow(clippy::too_many_arguments)] // the tile coordinates, as in the tile bodies
unsafe fn close_block<
    const R: usize,
    const P: usize,
    const CP: usize,
    const NQ: usize,
    const ACC: bool,
>(
    job: &W4A8Job<'_>,
    (p, m0, q0, b): (usize, usize, usize, usize),
    mm: [[int32x4_t; CP]; P],
    cs: [int32x4_t; NQ],
    zp: &[int32x4_t; P],
    acc: &mut PassAccF<R, P, CP, NQ>,
) {
    if ACC || !PassAccF::<R, P, CP, NQ>::ON_PAIRS {
        let sums = rows_of::<R, P, CP, NQ>(&mm);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { w4a8_block_end::<R, NQ, ACC>(job, p, m0, q0, b, &sums, &cs, &mut acc.rows) };
        return;
    }
    let n_blocks = job.w.n_blocks();
    let scales = job.w.block_scales(p, b);
    let sc: [int32x4_t; NQ] =
        std::array::from_fn(|q| vreinterpretq_s32_f32(load_f32x4(&scales[4 * (q0 + q)..])));
    let sc = channel_pairs::<NQ, CP>(&sc).map(|v| vreinterpretq_f32_s32(v));
    let cs = channel_pairs::<NQ, CP>(&cs);
    let kappa = row_pairs::<R, P>(|r| job.block_corr[(m0 + r) * n_blocks + b]);
    for (j, acc) in acc.pairs.iter_mut().enumerate().take(R.div_ceil(2)) {
        for (cp, acc) in acc.iter_mut().enumerate() {
            // `Σ q·c − zp·Σc − κ` in wrapping i32, then `+ f32(·) · scale`, multiply then add.
            let acc_i = vsubq_s32(vmlsq_s32(mm[j][cp], zp[j], cs[cp]), kappa[j]);
            *acc = vaddq_f32(*acc, vmulq_f32(vcvtq_f32_s32(acc_i), sc[cp]));
        }
    }
}

/// Writes a pass's outputs from its block accumulators ([`PassAccF`]), in rows.
///
/// # Safety
/// - As [`w4a8_store`]'s.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store_pairs<const R: usize, const P: usize, const CP: usize, const NQ: usize>(
    job: &W4A8Job<'_>,
    (p, m0, q0): (usize, usize, usize),
    acc: &PassAccF<R, P, CP, NQ>,
) {
    let rows = if PassAccF::<R, P, CP, NQ>::ON_PAIRS {
        // The regrouping only moves 64-bit halves, so it serves f32 lanes as it does i32 ones.
        let bits = acc.pairs.map(|pair| pair.map(|v| vreinterpretq_s32_f32(v)));
        rows_of::<R, P, CP, NQ>(&bits).map(|row| row.map(|v| vreinterpretq_f32_s32(v)))
    } else {
        acc.rows
    };
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w4a8_store::<R, NQ>(job, p, m0, q0, &rows) };
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
    let zp = row_pairs::<R, P>(|r| job.row_corr[m0 + r]);
    let mut acc = PassAccF::<R, P, CP, NQ>::zero();
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
        let mut cs = [vdupq_n_s32(0); NQ];
        for (i, step) in w_block.iter().enumerate() {
            let a = pair_operands::<R, P>(&a_block, i);
            let (quarters, _) = step.as_chunks::<16>();
            for ((q, quarter), cs) in quarters[Q0..Q0 + NQ].iter().enumerate().zip(&mut cs) {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                mm_quarter::<R, P, CP>(&mut mm, Some(cs), &a, q, lo, hi);
            }
        }
        let cs = code_sums::<R, P, CP, NQ>(&mm, &cs);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { close_block::<R, P, CP, NQ, ACC>(job, (p, m0, Q0, b), mm, cs, &zp, &mut acc) };
    }
    // SAFETY: as above.
    unsafe { store_pairs::<R, P, CP, NQ>(job, (p, m0, Q0), &acc) };
}

/// Runs the passes of a tile of `R` rows (`$r`) with `$pass`, whose const parameters after
/// the rows are the pass's row pairs, channel quarters, channel pairs and first quarter (then
/// `$extra`, if any): one pass of 16 channels up to 4 rows, two of 8 up to 8 rows, four of 4
/// beyond, each writing its own channels. The calls are unsafe; the caller forwards its output
/// contract.
macro_rules! passes {
    ($pass:ident::<$r:ident $(, $extra:ident)?>($($arg:expr),*)) => {
        if $r <= 4 {
            // SAFETY: the output contract is forwarded from the caller.
            unsafe { $pass::<$r, 2, 4, 8, 0 $(, $extra)?>($($arg),*) };
        } else if $r <= 8 {
            // SAFETY: as above; the two passes write disjoint channels.
            unsafe { $pass::<$r, 4, 2, 4, 0 $(, $extra)?>($($arg),*) };
            // SAFETY: as above.
            unsafe { $pass::<$r, 4, 2, 4, 2 $(, $extra)?>($($arg),*) };
        } else {
            // SAFETY: as above; the four passes write disjoint channels.
            unsafe { $pass::<$r, 8, 1, 2, 0 $(, $extra)?>($($arg),*) };
            // SAFETY: as above.
            unsafe { $pass::<$r, 8, 1, 2, 1 $(, $extra)?>($($arg),*) };
            // SAFETY: as above.
            unsafe { $pass::<$r, 8, 1, 2, 2 $(, $extra)?>($($arg),*) };
            // SAFETY: as above.
            unsafe { $pass::<$r, 8, 1, 2, 3 $(, $extra)?>($($arg),*) };
        }
    };
}

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,i8mm")]
unsafe fn w4a8_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    if job.w.order() == PanelOrder::Pairs {
        // SAFETY: the output contract is forwarded from our caller.
        return unsafe { w4a8_pairs_tile::<R, ACC>(job, p, m0) };
    }
    if R == 1 {
        // SAFETY: the i8mm token is only made where dot product is present too
        // (`NeonI8mm::is_available`), so the dot-product body may run here; the output
        // contract is forwarded from our caller.
        return unsafe { super::dotprod::w4a8_tile::<1, ACC>(job, p, m0) };
    }
    passes!(w4a8_pass::<R, ACC>(job, p, m0));
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
            mm_quarter::<R, P, CP>(&mut mm, None, &a, q, v0, v1);
        }
    }
    if let Ok(last) = <&[i8; 64]>::try_from(odd_step) {
        let a = pair_operands::<R, P>(&pairs, step_pairs.len());
        let (quarters, _) = last.as_chunks::<16>();
        for (q, quarter) in quarters[Q0..Q0 + NQ].iter().enumerate() {
            mm_quarter::<R, P, CP>(&mut mm, None, &a, q, load_i8x16(quarter), vdupq_n_s8(0));
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
    if job.w.order() == PanelOrder::Pairs {
        // SAFETY: the output contract is forwarded from our caller.
        return unsafe { w8a8_pairs_tile::<R>(job, p, m0) };
    }
    if R == 1 {
        // SAFETY: as in `w4a8_tile`: the i8mm token implies dot product; the output contract
        // is forwarded from our caller.
        return unsafe { super::dotprod::w8a8_tile::<1>(job, p, m0) };
    }
    passes!(w8a8_pass::<R>(job, p, m0));
}

/// A tile's activation operands in the pair order's passes: the row-pair layout, or for a
/// one-row tile its encoded row as it is (one-row calls get no layout), 8 K values per chunk.
#[derive(Clone, Copy)]
struct PairActs<'a, const P: usize> {
    /// The row pairs' layout chunks (tiles of 2 rows or more).
    pairs: [&'a [[u8; PAIR_CHUNK]]; P],
    /// The row's chunks (one-row tiles).
    row: &'a [[u8; 8]],
    /// The row's last 4 bytes when its length is not a multiple of 8 (a W8A8 row of an odd
    /// number of steps), else empty.
    row_tail: &'a [u8],
}

impl<'a, const P: usize> PairActs<'a, P> {
    /// The operands of rows `m0..m0 + R` of a GEMM with encoded rows `a` (`[m][k_pad]`) and
    /// row-pair layout `a_tiles`.
    fn new<const R: usize>(a: &'a [u8], a_tiles: &'a [u8], m0: usize, k_pad: usize) -> Self {
        if R == 1 {
            let (row, row_tail) = a[m0 * k_pad..][..k_pad].as_chunks::<8>();
            Self {
                pairs: [&[]; P],
                row,
                row_tail,
            }
        } else {
            Self {
                pairs: tile_pairs::<R, P>(a_tiles, m0, k_pad),
                row: &[],
                row_tail: &[],
            }
        }
    }

    /// The whole chunks `range` only (W4A8 rows, whose length is a multiple of 8).
    fn slice(&self, range: std::ops::Range<usize>) -> Self {
        Self {
            pairs: self
                .pairs
                .map(|pair| pair.get(range.clone()).unwrap_or(&[])),
            row: self.row.get(range).unwrap_or(&[]),
            row_tail: &[],
        }
    }

    /// How many chunks the operands of the tile's `R` rows have, a short last one included.
    fn chunks<const R: usize>(&self) -> usize {
        if R == 1 {
            self.row.len() + usize::from(!self.row_tail.is_empty())
        } else {
            self.pairs[0].len()
        }
    }
}

/// The activation operands of [`PairActs`] at chunk `c`; a one-row tile's row is paired with
/// ones (the code sums of [`code_sums`]), and row pairs past the tile's rows are zeros.
#[target_feature(enable = "neon")]
#[inline]
fn pair_acts_at<const R: usize, const P: usize>(
    acts: &PairActs<'_, P>,
    c: usize,
) -> [int8x16_t; P] {
    if R == 1 {
        std::array::from_fn(|j| {
            if j == 0 {
                vcombine_s8(load_i8x8(&acts.row[c]), vdup_n_s8(1))
            } else {
                vdupq_n_s8(0)
            }
        })
    } else {
        pair_operands::<R, P>(&acts.pairs, c)
    }
}

/// [`PairActs`] two chunks at a time (16 K values: one W4A8 step pair), with the odd last
/// chunk apart.
#[derive(Clone, Copy)]
struct PairActs2<'a, const P: usize> {
    pairs: [&'a [[[u8; PAIR_CHUNK]; 2]]; P],
    pairs_odd: [&'a [[u8; PAIR_CHUNK]]; P],
    row: &'a [[[u8; 8]; 2]],
    row_odd: &'a [[u8; 8]],
}

impl<'a, const P: usize> PairActs2<'a, P> {
    /// The chunks of `acts` in twos; `n` is the number of twos every row pair (or the row) of
    /// the tile's `R` rows must have, which lets the compiler drop the bounds checks.
    fn new<const R: usize>(acts: &PairActs<'a, P>, n: usize) -> Self {
        let used = if R == 1 { 0 } else { R.div_ceil(2) };
        let (row, row_odd) = acts.row.as_chunks::<2>();
        Self {
            // Cut to exactly `n`: the loops over `0..n` then index without checks.
            pairs: std::array::from_fn(|j| {
                if j < used {
                    &acts.pairs[j].as_chunks::<2>().0[..n]
                } else {
                    &[]
                }
            }),
            pairs_odd: acts.pairs.map(|pair| pair.as_chunks::<2>().1),
            row: if R == 1 { &row[..n] } else { &[] },
            row_odd,
        }
    }

    /// The activation operands of chunk `2t + HALF` (or, with `ODD`, of the odd last chunk),
    /// as [`pair_acts_at`] makes them.
    #[target_feature(enable = "neon")]
    #[inline]
    fn half<const R: usize, const ODD: bool, const HALF: usize>(&self, t: usize) -> [int8x16_t; P] {
        std::array::from_fn(|j| {
            if R == 1 {
                if j > 0 {
                    return vdupq_n_s8(0);
                }
                let chunk = if ODD {
                    &self.row_odd[0]
                } else {
                    &self.row[t][HALF]
                };
                vcombine_s8(load_i8x8(chunk), vdup_n_s8(1))
            } else if j < R.div_ceil(2) {
                let chunk = if ODD {
                    &self.pairs_odd[j][0]
                } else {
                    &self.pairs[j][t][HALF]
                };
                vreinterpretq_s8_u8(load_u8x16(chunk))
            } else {
                vdupq_n_s8(0)
            }
        })
    }
}

/// Adds one channel pair's 16 K values (a 16-byte slice `v` of a W4A8 step pair) to the
/// accumulators of channel pair `cp`: the low nibbles against the first 8 K values of each row
/// pair (`a[0]`), the high nibbles against the next 8 (`a[1]`). Returns the codes' byte sums
/// `lo + hi` (8 bytes of each channel in turn, each at most 30) for [`count_codes`].
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_slice<const R: usize, const P: usize, const CP: usize>(
    mm: &mut [[int32x4_t; CP]; P],
    a: &[[int8x16_t; P]; 2],
    cp: usize,
    v: uint8x16_t,
) -> int8x16_t {
    let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
    for (acc, (&a0, &a1)) in mm
        .iter_mut()
        .zip(a[0].iter().zip(&a[1]))
        .take(R.div_ceil(2))
    {
        acc[cp] = smmla(smmla(acc[cp], a0, lo), a1, hi);
    }
    vaddq_s8(lo, hi)
}

/// Adds one half (`HALF` 0: the low nibbles, the step pair's first 8 K values; 1: the high
/// nibbles, the next 8) of the channel pairs' slices `v` to the accumulators, against the
/// row pairs' operands `a` of that half, and counts the codes into the quarters' sums `cs`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_half<const R: usize, const P: usize, const CP: usize, const NQ: usize, const HALF: usize>(
    mm: &mut [[int32x4_t; CP]; P],
    cs: &mut [int32x4_t; NQ],
    a: &[int8x16_t; P],
    v: &[uint8x16_t; CP],
) {
    let codes: [int8x16_t; CP] = std::array::from_fn(|cp| {
        let codes = if HALF == 0 {
            vandq_u8(v[cp], vdupq_n_u8(0x0F))
        } else {
            vshrq_n_u8::<4>(v[cp])
        };
        vreinterpretq_s8_u8(codes)
    });
    for (cp, &codes) in codes.iter().enumerate() {
        for (acc, &a) in mm.iter_mut().zip(a).take(R.div_ceil(2)) {
            acc[cp] = smmla(acc[cp], a, codes);
        }
    }
    for (q, cs) in cs.iter_mut().enumerate() {
        // Adding neighbouring bytes turns a quarter's two channel pairs (8 codes of each
        // channel) into the lane order (4 sums of two codes of each channel).
        count_codes::<R>(cs, vpaddq_s8(codes[2 * q], codes[2 * q + 1]));
    }
}

/// [`pair_acts_at`] for the last chunk `c`, which for a one-row tile may be the row's last 4
/// bytes (then widened with zeros).
#[target_feature(enable = "neon")]
#[inline]
fn pair_acts_last<const R: usize, const P: usize>(
    acts: &PairActs<'_, P>,
    c: usize,
) -> [int8x16_t; P] {
    match <[u8; 4]>::try_from(acts.row_tail) {
        Ok(word) if R == 1 => std::array::from_fn(|j| {
            let word = if j == 0 { u32::from_le_bytes(word) } else { 0 };
            vreinterpretq_s8_u32(vsetq_lane_u32::<0>(word, vdupq_n_u32(0)))
        }),
        _ => pair_acts_at::<R, P>(acts, c),
    }
}

/// One pass of a W4A8 tile on panels in the pair order ([`PanelOrder::Pairs`]): rows
/// `m0..m0 + R` as `P` row pairs, channel quarters `Q0..Q0 + NQ` of panel `p` (`CP = 2·NQ`
/// channel pairs), every block, then the outputs of those channels; `ACC` selects
/// block-accumulator output. Each 16-byte slice of a step pair is one channel pair: its low
/// nibbles (`and`) are the operand of the pair's first 8 K values, its high nibbles (`ushr`)
/// that of the next 8, so each operand costs one instruction and no `zip`. Up to 4 row pairs
/// take both halves' activations at once and finish a slice before the next; 8 row pairs have
/// registers for one half's activations only, so they run the low halves of the pass's slices
/// and then the high ones. An odd last step (channelwise blocks only) is in the lane order and
/// takes the zips.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn w4a8_pairs_pass<
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
    // A W4A8 step is 8 K values: one chunk of the activation operands.
    let acts = PairActs::<P>::new::<R>(job.a, job.a_tiles, m0, k_pad);
    let zp = row_pairs::<R, P>(|r| job.row_corr[m0 + r]);
    let mut acc = PassAccF::<R, P, CP, NQ>::zero();
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        // Blocks start on even steps; only a channelwise block can end on an odd one.
        let (step_pairs, odd_step) = w_block.as_chunks::<2>();
        let a_block = PairActs2::<P>::new::<R>(&acts.slice(steps), step_pairs.len());
        let mut mm = [[vdupq_n_s32(0); CP]; P];
        let mut cs = [vdupq_n_s32(0); NQ];
        for (t, pair) in step_pairs.iter().enumerate() {
            let (slices, _) = pair.as_flattened().as_chunks::<16>();
            let slices = &slices[2 * Q0..2 * Q0 + CP];
            if P >= 8 {
                let v: [uint8x16_t; CP] = std::array::from_fn(|cp| load_u8x16(&slices[cp]));
                let a = a_block.half::<R, false, 0>(t);
                mm_half::<R, P, CP, NQ, 0>(&mut mm, &mut cs, &a, &v);
                let a = a_block.half::<R, false, 1>(t);
                mm_half::<R, P, CP, NQ, 1>(&mut mm, &mut cs, &a, &v);
            } else {
                let a = [
                    a_block.half::<R, false, 0>(t),
                    a_block.half::<R, false, 1>(t),
                ];
                let (quarters, _) = slices.as_chunks::<2>();
                for ((q, [s0, s1]), cs) in quarters.iter().enumerate().zip(&mut cs) {
                    let c0 = mm_slice::<R, P, CP>(&mut mm, &a, 2 * q, load_u8x16(s0));
                    let c1 = mm_slice::<R, P, CP>(&mut mm, &a, 2 * q + 1, load_u8x16(s1));
                    // As in `mm_half`: neighbouring bytes summed are the lane order.
                    count_codes::<R>(cs, vpaddq_s8(c0, c1));
                }
            }
        }
        if let [last] = odd_step {
            let a = a_block.half::<R, true, 0>(0);
            let (quarters, _) = last.as_chunks::<16>();
            for ((q, quarter), cs) in quarters[Q0..Q0 + NQ].iter().enumerate().zip(&mut cs) {
                let [lo, hi] = unpack_codes(load_u8x16(quarter));
                mm_quarter::<R, P, CP>(&mut mm, Some(cs), &a, q, lo, hi);
            }
        }
        let cs = code_sums::<R, P, CP, NQ>(&mm, &cs);
        // SAFETY: the output contract is forwarded from our caller.
        unsafe { close_block::<R, P, CP, NQ, ACC>(job, (p, m0, Q0, b), mm, cs, &zp, &mut acc) };
    }
    // SAFETY: as above.
    unsafe { store_pairs::<R, P, CP, NQ>(job, (p, m0, Q0), &acc) };
}

/// The W4A8 tile body for `R` rows on panels in the pair order, in the passes of
/// [`w4a8_tile`]; one row runs as a row pair with a row of ones (as fast per useful MAC as
/// the dot-product body on the lane order, with the code sums for free).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]).
#[target_feature(enable = "neon,i8mm")]
#[inline(never)]
unsafe fn w4a8_pairs_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    passes!(w4a8_pairs_pass::<R, ACC>(job, p, m0));
}

/// Adds the pass's channel pairs (slices `2·Q0..2·Q0 + CP`) of one W8A8 step pair to the
/// accumulators, against the row pairs' operands `a`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn mm_w8_pair<const R: usize, const P: usize, const CP: usize, const Q0: usize>(
    mm: &mut [[int32x4_t; CP]; P],
    a: &[int8x16_t; P],
    two_steps: &[i8; 128],
) {
    let (slices, _) = two_steps.as_chunks::<16>();
    for (cp, slice) in slices[2 * Q0..2 * Q0 + CP].iter().enumerate() {
        let v = load_i8x16(slice);
        for (acc, &a) in mm.iter_mut().zip(a).take(R.div_ceil(2)) {
            acc[cp] = smmla(acc[cp], a, v);
        }
    }
}

/// One pass of a W8A8 tile on panels in the pair order ([`PanelOrder::Pairs`]): rows
/// `m0..m0 + R` as `P` row pairs, channel quarters `Q0..Q0 + NQ` of panel `p` (`CP = 2·NQ`
/// channel pairs). Each 16-byte slice of a step pair is one channel pair's operand as it is
/// loaded; an odd last step is in the lane order and takes the zips.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn w8a8_pairs_pass<
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
    // Two W8A8 steps are 8 K values: one chunk of the activation operands.
    let acts = PairActs::<P>::new::<R>(job.a, job.a_tiles, m0, k_pad);
    assert_eq!(acts.chunks::<R>(), k_pad.div_ceil(8));
    assert_eq!(acts.chunks::<R>() - step_pairs.len(), odd_step.len() / 64);
    let mut mm = [[vdupq_n_s32(0); CP]; P];
    // Two step pairs per iteration: the loop's own instructions are spread over 16 K values.
    let (quads, last_pair) = step_pairs.as_chunks::<2>();
    for (u, [first, second]) in quads.iter().enumerate() {
        let a = pair_acts_at::<R, P>(&acts, 2 * u);
        mm_w8_pair::<R, P, CP, Q0>(&mut mm, &a, first);
        let a = pair_acts_at::<R, P>(&acts, 2 * u + 1);
        mm_w8_pair::<R, P, CP, Q0>(&mut mm, &a, second);
    }
    if let [two_steps] = last_pair {
        let a = pair_acts_at::<R, P>(&acts, 2 * quads.len());
        mm_w8_pair::<R, P, CP, Q0>(&mut mm, &a, two_steps);
    }
    if let Ok(last) = <&[i8; 64]>::try_from(odd_step) {
        let a = pair_acts_last::<R, P>(&acts, step_pairs.len());
        let (quarters, _) = last.as_chunks::<16>();
        for (q, quarter) in quarters[Q0..Q0 + NQ].iter().enumerate() {
            mm_quarter::<R, P, CP>(&mut mm, None, &a, q, load_i8x16(quarter), vdupq_n_s8(0));
        }
    }
    let sums = rows_of::<R, P, CP, NQ>(&mm);
    // SAFETY: the output contract is forwarded from our caller.
    unsafe { w8a8_store::<R, NQ>(job, p, m0, Q0, &sums) };
}

/// The W8A8 tile body for `R` rows on panels in the pair order, in the passes of
/// [`w8a8_tile`]; one row runs as a row pair with a padding row (ones, whose products are dropped).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "neon,i8mm")]
#[inline(never)]
unsafe fn w8a8_pairs_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    passes!(w8a8_pairs_pass::<R>(job, p, m0));
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
        .with_pairs_order()
}
