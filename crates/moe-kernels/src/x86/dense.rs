//! The x86 builds of the dense (float) GEMM body.
//!
//! AVX-512 runs the portable body of `crate::dense` inside a `#[target_feature]` wrapper, so
//! the compiler vectorizes its 16-channel inner loop with 512-bit registers. AVX2 has a tile
//! of its own for calls of three rows or more ([`panels_avx2`]): left to the compiler, the
//! portable tiles of four rows and two panels keep sixteen accumulators and spill them, and
//! the weights are widened once per row tile instead of once per K value.
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

/// The AVX-512 build.
///
/// # Safety
/// - As [`crate::dense::DensePanelsFn`], on a CPU with AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn panels_avx512<T: Widen>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    panels_body(job, panels);
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
