//! The x86 builds of the dense (float) GEMM body.
//!
//! AVX2 and AVX-512 each have a tile of their own for calls of three rows or more
//! ([`panels_avx2`], [`panels_avx512`]), and run the portable body of `crate::dense` inside a
//! `#[target_feature]` wrapper below that, so the compiler vectorizes its 16-channel inner loop
//! with their registers. Left to the compiler, the portable tiles of four rows and two panels
//! spill their sixteen accumulators on AVX2, widen the weights once per row tile instead of
//! once per K value, and on AVX-512 reach about a third of the separate multiply and add
//! units' rate.
//!
//! Every build keeps separate multiplies and adds, sums each output in ascending k from 0 and
//! never mixes lanes, so every build gives the same bits as the scalar reference.

use std::arch::x86_64::*;
use std::ops::Range;

use half::bf16;

use crate::Isa;
use crate::dense::{DenseBodies, DenseJob, Widen, panels_body};
use crate::packed::PANEL;

/// Most rows of one AVX2 tile: twelve accumulators (six rows × two 8-channel halves), the
/// widened weights of one K value and an activation broadcast fill the sixteen registers.
const TILE_ROWS: usize = 6;

/// Fewest rows that take the AVX2 tile. With one or two rows a panel gives two or four chains
/// of dependent adds, too few to hide the adder's latency; the portable body's groups of four
/// panels give eight or sixteen.
const TILE_MIN_ROWS: usize = 3;

/// A weight element the AVX2 tile loads and widens sixteen at a time.
trait WidenYmm: Widen {
    /// The 16 weights of one K value of a panel as f32, channels 0..8 and 8..16.
    ///
    /// # Safety
    /// - The CPU supports AVX2.
    unsafe fn widen_step(step: &[Self; PANEL]) -> [__m256; 2];

    /// The sums of channels 0..8 and 8..16 from the two accumulators of a row, whose lanes
    /// hold the channels in the order [`Self::widen_step`] gives them.
    ///
    /// # Safety
    /// - The CPU supports AVX2.
    unsafe fn channel_order(acc: [__m256; 2]) -> [__m256; 2];
}

impl WidenYmm for f32 {
    #[inline(always)]
    unsafe fn widen_step(step: &[f32; PANEL]) -> [__m256; 2] {
        let (halves, _) = step.as_chunks::<8>();
        // SAFETY: AVX2 by our contract.
        let lo = unsafe { load_f32x8(&halves[0]) };
        // SAFETY: as above.
        let hi = unsafe { load_f32x8(&halves[1]) };
        [lo, hi]
    }

    #[inline(always)]
    unsafe fn channel_order(acc: [__m256; 2]) -> [__m256; 2] {
        acc
    }
}

impl WidenYmm for bf16 {
    #[inline(always)]
    unsafe fn widen_step(step: &[bf16; PANEL]) -> [__m256; 2] {
        // SAFETY: AVX2 by our contract.
        unsafe { widen_bf16x16(step) }
    }

    #[inline(always)]
    unsafe fn channel_order(acc: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: AVX2 by our contract.
        unsafe { interleaved_quads_in_order(acc) }
    }
}

/// Loads 8 f32.
#[target_feature(enable = "avx2")]
#[inline]
fn load_f32x8(v: &[f32; 8]) -> __m256 {
    // SAFETY: the reference covers 8 readable f32; the load is unaligned.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// Widens 16 bf16 to f32, exactly (bf16 is the high half of an f32), one unpack per eight:
/// channels 0..4 and 8..12 in the first vector, 4..8 and 12..16 in the second.
#[target_feature(enable = "avx2")]
#[inline]
fn widen_bf16x16(v: &[bf16; PANEL]) -> [__m256; 2] {
    // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
    let bits = unsafe { _mm256_loadu_si256(v.as_ptr().cast()) };
    let zero = _mm256_setzero_si256();
    [
        _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, bits)),
        _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, bits)),
    ]
}

/// Channels 0..8 and 8..16 from vectors in [`widen_bf16x16`]'s order (the order is its own
/// inverse).
#[target_feature(enable = "avx2")]
#[inline]
fn interleaved_quads_in_order([a, b]: [__m256; 2]) -> [__m256; 2] {
    [
        _mm256_permute2f128_ps::<0x20>(a, b),
        _mm256_permute2f128_ps::<0x31>(a, b),
    ]
}

/// Rows `m0..m0 + R` of panel `p`: each K value's 16 weights widened once and multiplied by
/// the `R` rows' activations, each (row, half) its own chain of adds in ascending k.
///
/// # Safety
/// - The CPU supports AVX2.
/// - `job.out` holds `m·N` writable f32, and rows `m0..m0 + R` of panel `p` are written by this
///   call alone; `m0 + R ≤ m` and `p` is a panel of the weights.
#[target_feature(enable = "avx2")]
unsafe fn tile<T: WidenYmm, const R: usize>(job: &DenseJob<'_, T>, p: usize, m0: usize) {
    let k = job.k;
    let steps = &job.w[p * k * PANEL..][..k * PANEL].as_chunks::<PANEL>().0[..k];
    // Filled in a loop rather than by `array::from_fn`, whose call hides from the compiler
    // that every row is `k` long and so leaves a bounds check per row in the loop below.
    let mut rows: [&[f32]; R] = [&[]; R];
    for (r, row) in rows.iter_mut().enumerate() {
        *row = &job.x[(m0 + r) * k..][..k];
    }
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for (kk, step) in steps.iter().enumerate() {
        // SAFETY: AVX2 by our contract.
        let [lo, hi] = unsafe { T::widen_step(step) };
        for r in 0..R {
            let xv = _mm256_set1_ps(rows[r][kk]);
            acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(xv, lo));
            acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(xv, hi));
        }
    }
    let valid = PANEL.min(job.n - p * PANEL);
    for (r, &pair) in acc.iter().enumerate() {
        // SAFETY: AVX2 by our contract.
        let [lo, hi] = unsafe { T::channel_order(pair) };
        let mut sums = [0f32; PANEL];
        // SAFETY: `sums` holds 16 f32; these unaligned stores cover elements 0..8 and 8..16.
        unsafe { _mm256_storeu_ps(sums.as_mut_ptr(), lo) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(sums[8..].as_mut_ptr(), hi) };
        let dst = job.out.wrapping_add((m0 + r) * job.n + p * PANEL);
        // SAFETY: row `m0 + r < m` and channels `16p..16p + valid ≤ N` address elements of
        // the caller's `m·N` output that belong to this call alone.
        unsafe { std::ptr::copy_nonoverlapping(sums.as_ptr(), dst, valid) };
    }
}

/// The AVX2 build: the portable body for one or two rows; otherwise each panel in turn, its
/// rows in tiles of three to six (as even as they divide), so the panel's weights are read
/// from cache once per tile.
///
/// # Safety
/// - As [`crate::dense::DensePanelsFn`], on a CPU with AVX2.
#[target_feature(enable = "avx2")]
unsafe fn panels_avx2<T: WidenYmm>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    if job.m < TILE_MIN_ROWS {
        panels_body(job, panels);
        return;
    }
    let tiles = job.m.div_ceil(TILE_ROWS);
    for p in panels {
        let mut m0 = 0;
        for t in 0..tiles {
            let rows = (job.m - m0).div_ceil(tiles - t);
            let body: unsafe fn(&DenseJob<'_, T>, usize, usize) = match rows {
                3 => tile::<T, 3>,
                4 => tile::<T, 4>,
                5 => tile::<T, 5>,
                _ => tile::<T, TILE_ROWS>,
            };
            // SAFETY: AVX2 by our contract; `m0 + rows ≤ m` (the tiles split the rows into
            // `tiles` runs of at most six) and panel `p` lies in the caller's range, whose
            // outputs are ours alone.
            unsafe { body(job, p, m0) };
            m0 += rows;
        }
    }
}

/// Most rows of one AVX-512 tile: sixteen accumulators (eight rows × two panels), the two
/// panels' widened weights of one K value and their products fit the 32 registers, and each
/// activation is broadcast once for both panels.
const ZMM_TILE_ROWS: usize = 8;

/// A weight element the AVX-512 tile loads and widens sixteen at a time.
trait WidenZmm: Widen {
    /// The 16 weights of one K value of a panel as f32, in channel order.
    ///
    /// # Safety
    /// - The CPU supports AVX-512 F.
    unsafe fn widen_zmm(step: &[Self; PANEL]) -> __m512;
}

impl WidenZmm for f32 {
    #[inline(always)]
    unsafe fn widen_zmm(step: &[f32; PANEL]) -> __m512 {
        // SAFETY: AVX-512 F by our contract.
        unsafe { load_f32x16(step) }
    }
}

impl WidenZmm for bf16 {
    #[inline(always)]
    unsafe fn widen_zmm(step: &[bf16; PANEL]) -> __m512 {
        // SAFETY: AVX-512 F by our contract.
        unsafe { widen_bf16x16_zmm(step) }
    }
}

/// Loads 16 f32.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_f32x16(v: &[f32; PANEL]) -> __m512 {
    // SAFETY: the reference covers 16 readable f32; the load is unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// Widens 16 bf16 to f32 in channel order, exactly (each bf16 becomes the high half of its
/// f32).
#[target_feature(enable = "avx512f")]
#[inline]
fn widen_bf16x16_zmm(v: &[bf16; PANEL]) -> __m512 {
    // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
    let bits = unsafe { _mm256_loadu_si256(v.as_ptr().cast()) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// Rows `m0..m0 + R` of panels `p..p + NP`: each K value's weights widened once per panel and
/// multiplied by the `R` rows' activations (one broadcast per row for all panels), each
/// (row, panel) its own chain of adds in ascending k.
///
/// # Safety
/// - The CPU supports AVX-512 F.
/// - `job.out` holds `m·N` writable f32, and rows `m0..m0 + R` of panels `p..p + NP` are
///   written by this call alone; `m0 + R ≤ m` and `p + NP` is at most the weights' panels.
#[target_feature(enable = "avx512f")]
unsafe fn tile_zmm<T: WidenZmm, const R: usize, const NP: usize>(
    job: &DenseJob<'_, T>,
    p: usize,
    m0: usize,
) {
    let k = job.k;
    let mut steps: [&[[T; PANEL]]; NP] = [&[]; NP];
    for (j, panel) in steps.iter_mut().enumerate() {
        *panel = &job.w[(p + j) * k * PANEL..][..k * PANEL]
            .as_chunks::<PANEL>()
            .0[..k];
    }
    // Filled in a loop, as in the AVX2 tile, so that every row is known to be `k` long.
    let mut rows: [&[f32]; R] = [&[]; R];
    for (r, row) in rows.iter_mut().enumerate() {
        *row = &job.x[(m0 + r) * k..][..k];
    }
    let mut acc = [[_mm512_setzero_ps(); NP]; R];
    for kk in 0..k {
        let mut w = [_mm512_setzero_ps(); NP];
        for j in 0..NP {
            // SAFETY: AVX-512 F by our contract.
            w[j] = unsafe { T::widen_zmm(&steps[j][kk]) };
        }
        for r in 0..R {
            let xv = _mm512_set1_ps(rows[r][kk]);
            for j in 0..NP {
                acc[r][j] = _mm512_add_ps(acc[r][j], _mm512_mul_ps(xv, w[j]));
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (j, &sums) in acc_row.iter().enumerate() {
            let valid = PANEL.min(job.n - (p + j) * PANEL);
            let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
            let dst = job.out.wrapping_add((m0 + r) * job.n + (p + j) * PANEL);
            // SAFETY: row `m0 + r < m` and the masked-in channels `16(p + j)..16(p + j) +
            // valid ≤ N` address elements of the caller's `m·N` output that belong to this
            // call alone; masked-out lanes are not accessed.
            unsafe { _mm512_mask_storeu_ps(dst, keep, sums) };
        }
    }
}

/// The AVX-512 build: the portable body for one or two rows (whose groups of four panels keep
/// enough chains of adds in flight); otherwise pairs of panels (a lone last panel alone),
/// their rows in tiles of three to eight, as even as they divide, so that each pair's weights
/// are read from cache once per tile and each activation once per pair.
///
/// # Safety
/// - As [`crate::dense::DensePanelsFn`], on a CPU with AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn panels_avx512<T: WidenZmm>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    if job.m < TILE_MIN_ROWS {
        panels_body(job, panels);
        return;
    }
    let tiles = job.m.div_ceil(ZMM_TILE_ROWS);
    let mut p = panels.start;
    while p < panels.end {
        let pair = p + 1 < panels.end;
        let mut m0 = 0;
        for t in 0..tiles {
            let rows = (job.m - m0).div_ceil(tiles - t);
            let body: unsafe fn(&DenseJob<'_, T>, usize, usize) = match (rows, pair) {
                (3, true) => tile_zmm::<T, 3, 2>,
                (4, true) => tile_zmm::<T, 4, 2>,
                (5, true) => tile_zmm::<T, 5, 2>,
                (6, true) => tile_zmm::<T, 6, 2>,
                (7, true) => tile_zmm::<T, 7, 2>,
                (_, true) => tile_zmm::<T, ZMM_TILE_ROWS, 2>,
                (3, false) => tile_zmm::<T, 3, 1>,
                (4, false) => tile_zmm::<T, 4, 1>,
                (5, false) => tile_zmm::<T, 5, 1>,
                (6, false) => tile_zmm::<T, 6, 1>,
                (7, false) => tile_zmm::<T, 7, 1>,
                (_, false) => tile_zmm::<T, ZMM_TILE_ROWS, 1>,
            };
            // SAFETY: AVX-512 F by our contract; `m0 + rows ≤ m` (the tiles split the rows
            // into `tiles` runs of at most eight) and panels `p..p + 1 + pair` lie in the
            // caller's range, whose outputs are ours alone.
            unsafe { body(job, p, m0) };
            m0 += rows;
        }
        p += 1 + usize::from(pair);
    }
}

/// The AVX2 builds, reported as the AVX2 rung's.
pub(crate) const AVX2: DenseBodies = DenseBodies {
    isa: Isa::Avx2,
    f32: panels_avx2::<f32>,
    bf16: panels_avx2::<bf16>,
};

/// The AVX-512 builds, reported as the AVX-512 VNNI rung's (they need AVX-512 F only).
pub(crate) const AVX512: DenseBodies = DenseBodies {
    isa: Isa::Avx512Vnni,
    f32: panels_avx512::<f32>,
    bf16: panels_avx512::<bf16>,
};
