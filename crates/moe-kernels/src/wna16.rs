//! The weight-only int4/int8 GEMM (WNA16): `out[M, N] = x[M, K] · wᵀ (+ bias)` on
//! [`PackedWna16`] weights, f32 activations, f32 compute, no activation quantization.
//!
//! The definition (the scalar reference, [`wna16_reference`]): for each row and channel,
//! `out = Σ_g s_g · (Σ_{k ∈ g} x[k]·(v(c_k) − z_g)) (+ bias)`, with `v(c) = c` for integer codes
//! and the e2m1 value for MXFP4 ([`crate::Int4Values`], zero 0). Each group's partial sum starts
//! at 0 and adds `x·(v(c) − z)` in ascending packed K order (a multiply, then an add); the group
//! sums are then added in ascending group order into an accumulator starting at 0
//! (`acc + part·s`, a multiply, then an add), and the bias is added last. `v(c) − z` is exact in
//! f32 (a small integer, or an e2m1 value). 8-bit codes are integers, or e4m3 values for FP8
//! block-quantized weights ([`crate::Int8Values`], zero 0, groups of 128), equally exact.
//!
//! The portable body computes exactly these operations in exactly this order, one lane per
//! channel, so its scalar build and its AVX2+FMA build (the compiler never contracts a
//! separate multiply and add) equal the reference bit for bit. The AVX-512 body
//! (`x86::wna16`) fuses every multiply-add (`vfmadd`), which rounds once where the reference
//! rounds twice: its outputs differ from the reference by a few units in the last place of the
//! magnitudes summed, and the tests bound the difference by `1e-5·Σ|x·w|`.
//!
//! Where the rung has a bf16 path, [`wna16_gemm`] runs it instead, with other numerics: the
//! activations rounded to bf16 and f32 sums, over code values kept exact by the int4 dot-product
//! body of AVX-512 BF16 (at every row count), or over weights dequantized to bf16 by the
//! bf16 tiles (from their row threshold on). x86 rungs without the AVX-512 BF16 body run int4
//! integer codes below the tiles' rows on integer dot products instead, with each row's
//! activations quantized to 15 bits ([`crate::wna16_i15`]). `KernelSet::without_bf16_path`
//! keeps every call on the definition above.
//!
//! Output channels are split over threads by panel and every output is computed by one thread
//! in a fixed order, so results never depend on the thread count.

use std::ops::Range;

use crate::aligned::AlignedVec;
use half::{bf16, f16};

use crate::packed::wna16::{
    E2M1_VALUES, Int4Values, K_STEP, K_STEP8, Wna16ScaleValues, e4m3_value,
};
use crate::packed::{PANEL, PackedWna16, check_len};
use crate::par::split_panels;
use crate::ukernel::{Bf16Weights, W4Bf16Job};
use crate::{GemmScratch, Isa, KernelError, KernelSet, Par};

/// Rows per register tile of the portable body.
const MR: usize = 4;

/// One WNA16 GEMM as the bodies see it.
pub(crate) struct Wna16Job<'a> {
    /// The weights.
    pub(crate) w: &'a PackedWna16,
    /// Rows.
    pub(crate) m: usize,
    /// Activations `[m, K]`, already in the packed K order.
    pub(crate) x: &'a [f32],
    /// Output `[m, N]`.
    pub(crate) out: *mut f32,
}

// SAFETY: the raw output pointer is only written through by bodies working on disjoint panel
// ranges (the split), so sharing the job between threads creates no data race.
unsafe impl Sync for Wna16Job<'_> {}

/// A rung's entry point for the WNA16 GEMM over a range of panels.
///
/// # Safety (for callers)
/// - The CPU supports the entry's rung; `job.x` holds `m·K` values; `job.out` is valid for
///   writes of rows `0..m` in the channels of `panels`, which no other thread accesses
///   meanwhile; `panels` lies within `0..w.n_panels()`.
pub(crate) type Wna16PanelsFn = unsafe fn(&Wna16Job<'_>, Range<usize>);

/// One WNA16 GEMM on a bf16 dot-product body for int4 codes: the activations already laid out
/// by the body's fill function.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct Int4DotJob<'a> {
    /// The weights (4-bit codes, or 8-bit ones for a body that takes them).
    pub(crate) w: &'a PackedWna16,
    /// Rows.
    pub(crate) m: usize,
    /// The activations in the body's layout (see [`Int4DotLayout`]).
    pub(crate) pairs: &'a [u8],
    /// Bytes per row of `pairs`, for a row-major layout.
    pub(crate) row_bytes: usize,
    /// Per-row activation sums made by the body's fill: per scale group of the activations as
    /// a bf16 body rounded them (`m · n_groups`, weights with zero points only), or per block
    /// of the integer body's quantized activations.
    pub(crate) group_sums: &'a [f32],
    /// Output `[m, N]`.
    pub(crate) out: *mut f32,
}

// SAFETY: as for `Wna16Job`: bodies write through `out` only in disjoint panel ranges.
unsafe impl Sync for Int4DotJob<'_> {}

/// One row-count instance of a dot-product body's tile: `(job, p, m0)` computes the rows
/// `m0..` of panel `p` (or of panels `p` and `p + 1`, for a body that tiles pairs of panels).
pub(crate) type Int4DotTileFn = unsafe fn(&Int4DotJob<'_>, usize, usize);

/// Runs a dot-product body's GEMM over `panels`: rows in blocks of `row_block`, each block
/// over all of `panels` (so its activations stay in cache while the panels stream), each panel
/// in row tiles of up to `mr`, each tile by the instance `tiles[asym](rows)`, where `asym` says
/// whether the weights have zero points.
///
/// # Safety
/// - The CPU supports every instance that `tiles` gives for 1 to `mr` rows, and each may be
///   called with `job`, any panel of `panels` and rows within `0..job.m`: as
///   [`Int4DotPanelsFn`] for `job` and the panels the instances write.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) unsafe fn run_row_blocks(
    job: &Int4DotJob<'_>,
    panels: impl Iterator<Item = usize> + Clone,
    row_block: usize,
    mr: usize,
    tiles: [fn(usize) -> Int4DotTileFn; 2],
) {
    let tile_for = tiles[usize::from(job.w.zeros().is_some())];
    for b0 in (0..job.m).step_by(row_block) {
        let block = b0..job.m.min(b0 + row_block);
        for p in panels.clone() {
            for rows in crate::ukernel::row_tiles(block.len(), mr) {
                // SAFETY: rows `b0 + rows` lie within `0..m` (the block), `p` is one of
                // `panels`, and the instance is one the caller vouches for.
                unsafe { tile_for(rows.len())(job, p, b0 + rows.start) };
            }
        }
    }
}

/// A bf16 dot-product body's entry over a range of panels.
///
/// # Safety (for callers)
/// - The CPU supports the body's rung; `job.pairs` holds `m` rows laid out by the same body's
///   [`Int4DotFillFn`] for `job.w`'s K (and `job.group_sums` its sums when `job.w` has zero
///   points); `job.out` is valid for writes of rows `0..m` in the channels of `panels`, which
///   no other thread accesses meanwhile; `panels` lies within `0..w.n_panels()`.
pub(crate) type Int4DotPanelsFn = unsafe fn(&Int4DotJob<'_>, Range<usize>);

/// A dot-product body's activation layout: lays `m` rows of `x` (K values of `w` each) into
/// `dst` (grown as needed) and says where they went; writes into `sums` the per-row sums the
/// body needs (the bf16 bodies: per scale group of the rounded activations, for weights with
/// zero points; the integer body: per block, always).
///
/// # Safety (for callers)
/// - The CPU supports the body's rung; `x` holds `m·K` values.
pub(crate) type Int4DotFillFn = unsafe fn(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout;

/// Where an [`Int4DotFillFn`] put a GEMM's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct Int4DotLayout {
    /// Bytes the layout takes at the start of the buffer.
    pub(crate) len: usize,
    /// Bytes per row, for a row-major layout (0 for one made of tiles).
    pub(crate) row_bytes: usize,
}

/// The distance in bytes between rows of a row-major activation layout whose rows take
/// `bytes`: whole cache lines, an odd number of them. A tile reads the same step of each of its
/// rows, so rows a multiple of 4 KiB apart (K = 2048 in bf16 pairs) would all fall into one set
/// of a 4 KiB-per-way L1 and, from as many rows as the cache has ways, evict each other at every
/// step; an odd number of lines puts up to 64 rows' steps into 64 different sets.
pub(crate) fn row_stride(bytes: usize) -> usize {
    const LINE: usize = 64;
    let lines = bytes.div_ceil(LINE);
    (lines | 1) * LINE
}

/// Bytes the activation layout of any dot-product body or bf16 tile path takes for `rows` rows
/// of `w`, whichever of them a kernel set runs: the row-major layouts (the bf16 pairs, two bytes
/// per K value in whole steps, rows [`row_stride`] apart; the integer bodies' rows, the same
/// bytes after a header) and the tiled ones ([`crate::gemm::bf16_tile_bytes`], and on x86 the
/// integer rows followed by their int8 tiles). Reserving this
/// once lets every GEMM of up to `rows` rows run without allocating.
pub(crate) fn activation_layout_bytes(w: &PackedWna16, rows: usize) -> usize {
    let step_bytes = 2 * crate::packed::wna16::K_STEP;
    let steps = w.k().div_ceil(crate::packed::wna16::K_STEP);
    let by_row = crate::wna16_i15::HEADER_BYTES + row_stride(steps * step_bytes);
    let tiled = crate::gemm::bf16_tile_bytes(rows, w.k());
    #[cfg(target_arch = "x86_64")]
    let tiled = tiled.max(crate::x86::amx::i15_tile_layout_bytes(w.k(), rows));
    rows.saturating_mul(by_row).max(tiled)
}

/// Per-row activation sums any dot-product body keeps for `w`: one per scale group (the bf16
/// bodies, with zero points) or one per block of the integer bodies.
pub(crate) fn activation_sums_per_row(w: &PackedWna16) -> usize {
    let blocks = crate::wna16_i15::Blocks::of(w).count(w.n_groups());
    blocks.max(w.n_groups())
}

/// A scale element the bodies widen to f32 (exactly).
pub(crate) trait Widen: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// A `u8` scale is an e8m0 exponent (MXFP4): `2^(e − 127)`, exact.
impl Widen for u8 {
    #[inline(always)]
    fn widen(self) -> f32 {
        crate::packed::wna16::e8m0_to_f32(self)
    }
}

impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Computes rows `m0..m0 + R` of panel `p` in the reference order (`BITS` = 4 or 8; `E2M1`:
/// int4 codes are e2m1 values, `E4M3`: int8 codes are e4m3 values, both with no zero point).
#[inline(always)]
fn tile<
    S: Widen,
    const BITS: u32,
    const ASYM: bool,
    const E2M1: bool,
    const E4M3: bool,
    const R: usize,
>(
    job: &Wna16Job<'_>,
    scales: &[S],
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
    let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let (gscales, _) = scales[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>();
    let zeros = w
        .zeros()
        .map(|z| z[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>().0);
    let rows: [&[f32]; R] = std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
    let mut acc = [[0f32; PANEL]; R];
    for g in 0..ng {
        let kr = g * gs..k.min((g + 1) * gs);
        let zero: [f32; PANEL] = match zeros {
            Some(z) if ASYM => std::array::from_fn(|c| f32::from(z[g][c])),
            _ => [if BITS == 4 { 8.0 } else { 128.0 }; PANEL],
        };
        let mut part = [[0f32; PANEL]; R];
        for kk in kr {
            let wv: [f32; PANEL] = if E2M1 {
                let step = &steps[kk / K_STEP];
                let shift = 4 * (kk % K_STEP) as u32;
                std::array::from_fn(|c| E2M1_VALUES[((step[c] >> shift) & 0xF) as usize])
            } else if BITS == 4 {
                let step = &steps[kk / K_STEP];
                let shift = 4 * (kk % K_STEP) as u32;
                std::array::from_fn(|c| ((step[c] >> shift) & 0xF) as f32 - zero[c])
            } else if E4M3 {
                let step = &steps[kk / K_STEP8];
                let words = &step[(kk % K_STEP8) * 4..][..4];
                std::array::from_fn(|c| e4m3_value((words[c / 4] >> (8 * (c % 4))) as u8))
            } else {
                // K value `j` of the step is 16 bytes: four words of four channels each.
                let step = &steps[kk / K_STEP8];
                let words = &step[(kk % K_STEP8) * 4..][..4];
                std::array::from_fn(|c| ((words[c / 4] >> (8 * (c % 4))) & 0xFF) as f32 - zero[c])
            };
            for r in 0..R {
                let xv = rows[r][kk];
                for c in 0..PANEL {
                    part[r][c] += xv * wv[c];
                }
            }
        }
        let s: [f32; PANEL] = std::array::from_fn(|c| gscales[g][c].widen());
        for r in 0..R {
            for c in 0..PANEL {
                acc[r][c] += part[r][c] * s[c];
            }
        }
    }
    if let Some(b) = w.bias() {
        let b = &b[p * PANEL..][..PANEL];
        for acc_row in acc.iter_mut() {
            for c in 0..PANEL {
                acc_row[c] += b[c];
            }
        }
    }
    let valid = PANEL.min(w.n() - p * PANEL);
    for (r, acc_row) in acc.iter().enumerate() {
        let at = (m0 + r) * w.n() + p * PANEL;
        for (c, v) in acc_row.iter().enumerate().take(valid) {
            // SAFETY: row `m0 + r < m` and channel `16p + c < N` address an element of the
            // caller's `m·N` output that belongs to this panel alone (disjoint split).
            unsafe { job.out.wrapping_add(at + c).write(*v) };
        }
    }
}

/// Walks the row tiles of `panels` for one code width, scale type, symmetry and code kind.
#[inline(always)]
fn panels_typed<S: Widen, const BITS: u32, const ASYM: bool, const E2M1: bool, const E4M3: bool>(
    job: &Wna16Job<'_>,
    s: &[S],
    panels: Range<usize>,
) {
    for p in panels {
        let mut m0 = 0;
        while m0 < job.m {
            match job.m - m0 {
                1 => tile::<S, BITS, ASYM, E2M1, E4M3, 1>(job, s, p, m0),
                2 => tile::<S, BITS, ASYM, E2M1, E4M3, 2>(job, s, p, m0),
                3 => tile::<S, BITS, ASYM, E2M1, E4M3, 3>(job, s, p, m0),
                _ => tile::<S, BITS, ASYM, E2M1, E4M3, MR>(job, s, p, m0),
            }
            m0 += MR.min(job.m - m0);
        }
    }
}

/// Picks the code width, symmetry and code kind for one scale type.
#[inline(always)]
fn panels_scaled<S: Widen>(job: &Wna16Job<'_>, s: &[S], panels: Range<usize>) {
    if job.w.values() == Int4Values::E2m1 {
        return panels_typed::<S, 4, false, true, false>(job, s, panels);
    }
    if job.w.is_e4m3() {
        return panels_typed::<S, 8, false, false, true>(job, s, panels);
    }
    match (job.w.bits(), job.w.zeros().is_some()) {
        (4, false) => panels_typed::<S, 4, false, false, false>(job, s, panels),
        (4, true) => panels_typed::<S, 4, true, false, false>(job, s, panels),
        (_, false) => panels_typed::<S, 8, false, false, false>(job, s, panels),
        (_, true) => panels_typed::<S, 8, true, false, false>(job, s, panels),
    }
}

/// The portable body: every code width, scale type and symmetry.
#[inline(always)]
pub(crate) fn panels_body(job: &Wna16Job<'_>, panels: Range<usize>) {
    match job.w.scales() {
        Wna16ScaleValues::F16(s) => panels_scaled(job, s, panels),
        Wna16ScaleValues::Bf16(s) => panels_scaled(job, s, panels),
        Wna16ScaleValues::F32(s) => panels_scaled(job, s, panels),
        Wna16ScaleValues::E8m0(s) => panels_scaled(job, s, panels),
    }
}

/// The portable entry (the scalar rung, and every rung without a body of its own).
///
/// # Safety
/// - As [`Wna16PanelsFn`]; it needs no CPU feature.
pub(crate) unsafe fn panels_portable(job: &Wna16Job<'_>, panels: Range<usize>) {
    panels_body(job, panels);
}

/// `out[M, N] = x[M, K] · wᵀ (+ bias)` in f32 with the kernels of `ks` (see the module docs).
///
/// Act-order weights gather each row's activations into the packed K order in `scratch`
/// first (grown once, then reused). NaN and infinities in `x` propagate to the outputs they
/// touch.
pub fn wna16_gemm(
    ks: &KernelSet,
    m: usize,
    x: &[f32],
    w: &PackedWna16,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let (n, k) = (w.n(), w.k());
    check_len("x", m.saturating_mul(k), x.len())?;
    check_len("out", m.saturating_mul(n), out.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let int4_dot = ks.wna16_int4_dot_for(w, m);
    let bf16_tiles = ks.wna16_bf16_for(m).filter(|_| w.has_bf16_fill());
    let (rows, tiles, group_sums) =
        scratch.f32_rows_tiles_and_sums(if w.perm().is_some() { m * k } else { 0 });
    let x = match w.perm() {
        Some(perm) => {
            for (dst, src) in rows.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
                for (d, &j) in dst.iter_mut().zip(perm) {
                    *d = src[j as usize];
                }
            }
            &*rows
        }
        None => x,
    };
    if let Some(d) = int4_dot {
        // SAFETY: the fill function comes from the same `KernelSet` as the entry, registered
        // only where its features are available; `x` holds `m·K` values (checked or gathered).
        let layout = unsafe { (d.fill)(x, m, w, group_sums, tiles) };
        let job = Int4DotJob {
            w,
            m,
            pairs: &tiles[..layout.len],
            row_bytes: layout.row_bytes,
            group_sums: group_sums.as_slice(),
            out: out.as_mut_ptr(),
        };
        split_panels(w.n_panels(), par, m * n * k, |panels| {
            // SAFETY: `pairs` and `group_sums` were just laid out by the same body's fill for
            // this K; `out` holds `m·N` (checked above) and the panel ranges are disjoint and in
            // bounds.
            unsafe { (d.entry)(&job, panels) }
        });
        return Ok(());
    }
    if let Some(t) = bf16_tiles {
        // SAFETY: the layout function comes from the same `KernelSet` as the entry,
        // registered only where its features are available.
        unsafe { (t.tile_a)(x, m, k, tiles) };
        let job = W4Bf16Job {
            w: Bf16Weights::Wna16(w),
            a_tiles: tiles,
            m,
            out: out.as_mut_ptr(),
            ld: n,
        };
        split_panels(w.n_panels(), par, m * n * k, |panels| {
            // SAFETY: the entry comes from the same set as the layout function; `a_tiles`
            // holds `m` rows of K, `out` holds `m·N` (checked above) and the panel ranges are
            // disjoint and in bounds.
            unsafe { (t.entry)(&job, panels) }
        });
        return Ok(());
    }
    let job = Wna16Job {
        w,
        m,
        x,
        out: out.as_mut_ptr(),
    };
    let entry = ks.wna16_entry();
    split_panels(w.n_panels(), par, m * n * k, |panels| {
        // SAFETY: the set registered `entry` with its rung's token (or it is the portable
        // one), `x` holds `m·K` values (checked or gathered above), `out` holds `m·N` and
        // `split_panels` hands every panel to exactly one call.
        unsafe { entry(&job, panels) }
    });
    Ok(())
}

/// The rung whose code runs the WNA16 GEMM with kernel set `ks` (reports).
pub fn wna16_isa(ks: &KernelSet) -> Isa {
    ks.wna16_isa()
}

/// The literal definition of the module docs on the unpacked weights (the oracle of the tests).
pub fn wna16_reference(m: usize, x: &[f32], w: &PackedWna16) -> Vec<f32> {
    let (n, k, gs) = (w.n(), w.k(), w.group_size());
    let (codes, scales, zeros) = w.unpack();
    let ng = w.n_groups();
    let bias = w.bias();
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        let xr = &x[r * k..][..k];
        for c in 0..n {
            let mut acc = 0f32;
            for g in 0..ng {
                let z = f32::from(zeros[c * ng + g]);
                let mut part = 0f32;
                for kk in g * gs..k.min((g + 1) * gs) {
                    let xv = w.perm().map_or(xr[kk], |p| xr[p[kk] as usize]);
                    part += xv * (w.code_value(codes[c * k + kk]) - z);
                }
                acc += part * scales[c * ng + g];
            }
            if let Some(b) = bias {
                acc += b[c];
            }
            out[r * n + c] = acc;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::wna16::{
        FP8_BLOCK, Fp8Desc, Fp8Rows, Fp8Scales, Mxfp4Desc, Wna16Desc, Wna16Scales,
    };
    use moe_testutil::SplitMix64;

    /// Random weights of every kind for one shape.
    struct Case {
        n: usize,
        k: usize,
        g: Option<usize>,
        codes: Vec<u8>,
        zeros: Vec<u8>,
        s16: Vec<f16>,
        sb: Vec<bf16>,
        s32: Vec<f32>,
        bias: Vec<f32>,
        perm: Vec<u32>,
        codes8: Vec<u8>,
        zeros8: Vec<u8>,
        /// MXFP4 blocks `[n, ceil(k/32), 16]` and e8m0 scales `[n, ceil(k/32)]`.
        blocks: Vec<u8>,
        e8m0: Vec<u8>,
        /// e4m3 codes `[n, k]` (no NaN; subnormals and both zeros included) and f32 block
        /// scales for the whole matrix as one run, then as two runs split at `n / 2`.
        fp8: Vec<u8>,
        fp8_scales: Vec<f32>,
        fp8_split: [Vec<f32>; 2],
        /// One FP8 scale per channel.
        fp8_channels: Vec<f32>,
    }

    /// Random e4m3 bytes: any non-NaN byte, and often a subnormal or a signed zero.
    fn e4m3_codes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                let b = rng.below(256) as u8;
                let b = if rng.below(4) == 0 { b & 0x87 } else { b };
                if b & 0x7F == 0x7F { b & 0xF0 } else { b }
            })
            .collect()
    }

    impl Case {
        fn new(rng: &mut SplitMix64, n: usize, k: usize, g: Option<usize>) -> Self {
            let ng = g.map_or(1, |g| k.div_ceil(g));
            let codes = (0..n * k).map(|_| rng.below(16) as u8).collect();
            let zeros = (0..n * ng).map(|_| rng.below(16) as u8).collect();
            let s32: Vec<f32> = rng.vec_uniform(n * ng, 0.001, 0.05);
            let s16 = s32.iter().map(|&v| f16::from_f32(v)).collect();
            let sb = s32.iter().map(|&v| bf16::from_f32(v)).collect();
            let bias = rng.vec_uniform(n, -1.0, 1.0);
            let mut perm: Vec<u32> = (0..k as u32).collect();
            for i in (1..k).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            let codes8 = (0..n * k).map(|_| rng.below(256) as u8).collect();
            let zeros8 = (0..n * ng).map(|_| rng.below(256) as u8).collect();
            let nb = k.div_ceil(32);
            let blocks = (0..n * nb * 16).map(|_| rng.below(256) as u8).collect();
            // Scales 2^-10..2^2, and now and then 2^-127 (e8m0 0, a subnormal in f32 and bf16).
            let e8m0 = (0..n * nb)
                .map(|_| match rng.below(40) {
                    0 => 0,
                    _ => 117 + rng.below(13) as u8,
                })
                .collect();
            let kb = k.div_ceil(FP8_BLOCK);
            let fp8 = e4m3_codes(rng, n * k);
            let fp8_scales = rng.vec_uniform(n.div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2);
            let h = n / 2;
            let fp8_split = [
                rng.vec_uniform(h.div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2),
                rng.vec_uniform((n - h).div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2),
            ];
            let fp8_channels = rng.vec_uniform(n, 1e-4, 1e-2);
            Self {
                fp8,
                fp8_scales,
                fp8_split,
                fp8_channels,
                blocks,
                e8m0,
                codes8,
                zeros8,
                n,
                k,
                g,
                codes,
                zeros,
                s16,
                sb,
                s32,
                bias,
                perm,
            }
        }

        /// Every variant: bits × scale dtype × symmetry × bias and permutation, then the
        /// floating-point codes ([`Case::fp_variants`]).
        fn variants(&self) -> Vec<PackedWna16> {
            let mut all = Vec::new();
            for variant in 0..24 {
                let (bits, codes, zeros) = if variant < 12 {
                    (4, &self.codes, &self.zeros)
                } else {
                    (8, &self.codes8, &self.zeros8)
                };
                let scales = match variant % 3 {
                    0 => Wna16Scales::Bf16(&self.sb),
                    1 => Wna16Scales::F16(&self.s16),
                    _ => Wna16Scales::F32(&self.s32),
                };
                let asym = variant / 3 % 2 == 1;
                let extras = variant / 6 % 2 == 1;
                all.push(
                    PackedWna16::pack(Wna16Desc {
                        n: self.n,
                        k: self.k,
                        bits,
                        codes,
                        group_size: moe_quant::WeightGroups::from_group_size(self.g).unwrap(),
                        scales,
                        zeros: asym.then_some(&zeros[..]),
                        bias: extras.then_some(&self.bias[..]),
                        perm: extras.then_some(&self.perm[..]),
                    })
                    .unwrap(),
                );
            }
            all.extend(self.fp_variants());
            all
        }

        /// MXFP4 without and with bias, then FP8: block scales as one run without bias and as
        /// two runs with bias, channel scales as one run, and a channel-scaled run beside a
        /// tensor-scaled one with bias (the channelwise packings).
        fn fp_variants(&self) -> Vec<PackedWna16> {
            let mut all = Vec::new();
            for bias in [None, Some(&self.bias[..])] {
                all.push(
                    PackedWna16::pack_mxfp4(Mxfp4Desc {
                        n: self.n,
                        k: self.k,
                        blocks: &self.blocks,
                        scales: &self.e8m0,
                        bias,
                    })
                    .unwrap(),
                );
            }
            let (n, k, h) = (self.n, self.k, self.n / 2);
            let one = [Fp8Rows {
                channels: n,
                codes: &self.fp8,
                scales: Fp8Scales::Blocks(&self.fp8_scales),
            }];
            let two = [
                Fp8Rows {
                    channels: h,
                    codes: &self.fp8[..h * k],
                    scales: Fp8Scales::Blocks(&self.fp8_split[0]),
                },
                Fp8Rows {
                    channels: n - h,
                    codes: &self.fp8[h * k..],
                    scales: Fp8Scales::Blocks(&self.fp8_split[1]),
                },
            ];
            let channels = [Fp8Rows {
                channels: n,
                codes: &self.fp8,
                scales: Fp8Scales::Channels(&self.fp8_channels),
            }];
            let mixed = [
                Fp8Rows {
                    channels: h,
                    codes: &self.fp8[..h * k],
                    scales: Fp8Scales::Channels(&self.fp8_channels[..h]),
                },
                Fp8Rows {
                    channels: n - h,
                    codes: &self.fp8[h * k..],
                    scales: Fp8Scales::Tensor(self.fp8_channels[h]),
                },
            ];
            for (rows, bias) in [
                (&one[..], None),
                (&two[..], Some(&self.bias[..])),
                (&channels[..], None),
                (&mixed[..], Some(&self.bias[..])),
            ] {
                all.push(PackedWna16::pack_fp8(Fp8Desc { n, k, rows, bias }).unwrap());
            }
            all
        }
    }

    /// Every rung's f32 body (the bf16 paths are tested with their own reference).
    fn sets() -> Vec<KernelSet> {
        let mut sets = vec![KernelSet::scalar()];
        sets.extend(
            crate::available_isas()
                .into_iter()
                .filter_map(KernelSet::for_isa)
                .map(KernelSet::without_bf16_path),
        );
        sets
    }

    /// `Σ_k |x·w|` per output: the magnitude the tolerance scales with.
    fn magnitudes(m: usize, x: &[f32], w: &PackedWna16) -> Vec<f64> {
        let (n, k) = (w.n(), w.k());
        let wd = w.dequantize_f64();
        let mut out = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k)
                    .map(|kk| (f64::from(x[r * k + kk]) * wd[c * k + kk]).abs())
                    .sum::<f64>()
                    + w.bias().map_or(0.0, |b| f64::from(b[c]).abs());
            }
        }
        out
    }

    /// The f64 product of the dequantized weights.
    fn f64_reference(m: usize, x: &[f32], w: &PackedWna16) -> Vec<f64> {
        let (n, k) = (w.n(), w.k());
        let wd = w.dequantize_f64();
        let mut out = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k)
                    .map(|kk| f64::from(x[r * k + kk]) * wd[c * k + kk])
                    .sum::<f64>()
                    + w.bias().map_or(0.0, |b| f64::from(b[c]));
            }
        }
        out
    }

    const SHAPES: &[(usize, usize, usize, Option<usize>)] = &[
        (0, 5, 8, None),
        (1, 1, 1, None),
        (1, 17, 33, Some(32)),
        (2, 16, 64, Some(32)),
        (3, 31, 100, Some(64)),
        (5, 33, 70, Some(8)),
        (8, 16, 128, Some(128)),
        (9, 47, 129, Some(32)),
        (17, 20, 257, Some(128)),
        (12, 48, 96, None),
    ];

    /// Every rung against the scalar reference (the scalar rung bit for bit, FMA bodies within
    /// `1e-5·Σ|x·w|`) and the f64 product (within `1e-5·Σ|x·w|`), both `Par` modes.
    #[test]
    fn every_rung_matches_the_reference() {
        let mut rng = SplitMix64::new(11);
        for &(m, n, k, g) in SHAPES {
            let case = Case::new(&mut rng, n, k, g);
            let x = rng.vec_uniform(m * k, -2.0, 2.0);
            for w in case.variants() {
                assert_every_rung_matches(m, &x, &w);
            }
        }
    }

    /// MXFP4 and FP8 weights (without and with bias) at every row count from 0 to 17, so every
    /// tile of every rung and its two-pass split run them, on odd N and K values that end
    /// inside a step (and inside a scale group).
    #[test]
    fn fp_codes_match_the_reference_at_every_row_count() {
        let mut rng = SplitMix64::new(17);
        for (n, k) in [(19, 75), (33, 133)] {
            let case = Case::new(&mut rng, n, k, None);
            for m in 0..=17 {
                let x = rng.vec_uniform(m * k, -2.0, 2.0);
                for w in case.fp_variants() {
                    assert_every_rung_matches(m, &x, &w);
                }
            }
        }
    }

    /// One GEMM on every rung against the reference, and the reference against the f64
    /// product (see [`every_rung_matches_the_reference`]).
    fn assert_every_rung_matches(m: usize, x: &[f32], w: &PackedWna16) {
        let (n, k, g) = (w.n(), w.k(), w.group_size());
        let want = wna16_reference(m, x, w);
        let exact = f64_reference(m, x, w);
        let mag = magnitudes(m, x, w);
        for (i, (&a, &b)) in want.iter().zip(&exact).enumerate() {
            assert!(
                (f64::from(a) - b).abs() <= 1e-5 * mag[i] + 1e-30,
                "reference vs f64 m={m} n={n} k={k}"
            );
        }
        for ks in &sets() {
            let fused = ks.wna16_isa() != Isa::Scalar;
            for par in [Par::Seq, Par::Rayon] {
                let mut out = vec![f32::NAN; m * n];
                let mut scratch = GemmScratch::new();
                wna16_gemm(ks, m, x, w, &mut out, &mut scratch, par).unwrap();
                for (i, (&a, &b)) in out.iter().zip(&want).enumerate() {
                    let ok = if fused {
                        f64::from((a - b).abs()) <= 1e-5 * mag[i] + 1e-30
                    } else {
                        a.to_bits() == b.to_bits()
                    };
                    assert!(
                        ok,
                        "{} m={m} n={n} k={k} g={g} bits={} asym={} {:?} {:?} i={i}: {a} vs {b}",
                        ks.wna16_isa(),
                        w.bits(),
                        w.is_asymmetric(),
                        w.values(),
                        w.int8_values()
                    );
                }
            }
        }
    }

    /// Every e2m1 code (MXFP4) and every non-NaN e4m3 code (FP8: subnormals and both zeros
    /// included) in every channel of a panel and at every K position, those of the ragged last
    /// step included, read back exactly by every rung: one-hot activation rows pick one K
    /// value each, so each output is one weight, with every row count of a tile from 1 to 9.
    #[test]
    fn every_fp_code_decodes_exactly_on_every_rung() {
        let n = 16;
        // MXFP4: code (k + 3c) mod 16 at [c, k]; K = 61 leaves 5 K values in the last step.
        let k4 = 61;
        let mut blocks = vec![0u8; n * 2 * 16];
        for c in 0..n {
            for kk in 0..k4 {
                let (b, e) = (kk / 32, kk % 32);
                blocks[(c * 2 + b) * 16 + e / 2] |= (((kk + 3 * c) % 16) as u8) << (4 * (e % 2));
            }
        }
        // Block scales 2^0 and 2^-1.
        let e8m0: Vec<u8> = (0..n * 2).map(|i| 127 - (i % 2) as u8).collect();
        let mxfp4 = PackedWna16::pack_mxfp4(Mxfp4Desc {
            n,
            k: k4,
            blocks: &blocks,
            scales: &e8m0,
            bias: None,
        })
        .unwrap();
        // FP8: code (k + 17c) mod 256 at [c, k], NaN codes made -0; K = 255 leaves 3 K values
        // in the last step.
        let k8 = 255;
        let codes: Vec<u8> = (0..n * k8)
            .map(|i| ((i % k8 + 17 * (i / k8)) % 256) as u8)
            .map(|b| if b & 0x7F == 0x7F { 0x80 } else { b })
            .collect();
        let fp8 = PackedWna16::pack_fp8(Fp8Desc {
            n,
            k: k8,
            rows: &[Fp8Rows {
                channels: n,
                codes: &codes,
                scales: Fp8Scales::Blocks(&[0.5, 4.0]),
            }],
            bias: None,
        })
        .unwrap();
        for w in [&mxfp4, &fp8] {
            let k = w.k();
            let wd = w.dequantize_f64();
            for ks in &sets() {
                for m in 1..=9 {
                    for k0 in (0..k).step_by(m) {
                        let rows = m.min(k - k0);
                        let mut x = vec![0f32; rows * k];
                        for r in 0..rows {
                            x[r * k + k0 + r] = 1.0;
                        }
                        let mut out = vec![f32::NAN; rows * n];
                        let mut scratch = GemmScratch::new();
                        wna16_gemm(ks, rows, &x, w, &mut out, &mut scratch, Par::Seq).unwrap();
                        for r in 0..rows {
                            for c in 0..n {
                                let want = wd[c * k + k0 + r];
                                assert!(
                                    f64::from(out[r * n + c]) == want,
                                    "{} {:?} {:?} rows={rows} k={} c={c}: {} vs {want}",
                                    ks.wna16_isa(),
                                    w.values(),
                                    w.int8_values(),
                                    k0 + r,
                                    out[r * n + c]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The extreme e8m0 scales reach every rung's body exactly: `2^-127` (e = 0, a subnormal no
    /// exponent shift makes) and `2^127` (e = 254), checked relative to the reference's own
    /// magnitude rather than against the sum of magnitudes, which would hide a scale read as 0.
    #[test]
    fn e8m0_extremes_on_every_rung() {
        let mut rng = SplitMix64::new(0xe8);
        let (m, n, k) = (3, 17, 64);
        let blocks: Vec<u8> = (0..n * 2 * 16).map(|_| rng.below(256) as u8).collect();
        for (e, x_scale) in [(0u8, 1.0f32), (254, 1.0 / 1024.0)] {
            let scales = vec![e; n * 2];
            let w = PackedWna16::pack_mxfp4(Mxfp4Desc {
                n,
                k,
                blocks: &blocks,
                scales: &scales,
                bias: None,
            })
            .unwrap();
            let x: Vec<f32> = rng
                .vec_uniform(m * k, -1.0, 1.0)
                .iter()
                .map(|v| v * x_scale)
                .collect();
            let want = f64_reference(m, &x, &w);
            for ks in &sets() {
                let mut out = vec![f32::NAN; m * n];
                wna16_gemm(ks, m, &x, &w, &mut out, &mut GemmScratch::new(), Par::Seq).unwrap();
                for (i, (&a, &b)) in out.iter().zip(&want).enumerate() {
                    // Subnormal results keep absolute precision 2^-149 only.
                    let tol = 1e-5 * b.abs() + 8.0 * f64::from(f32::from_bits(1));
                    assert!(
                        (f64::from(a) - b).abs() <= tol && b != 0.0,
                        "{} e={e} [{i}]: {a:e} vs {b:e}",
                        ks.wna16_isa()
                    );
                }
            }
        }
    }

    /// The split over threads changes nothing, bit for bit, on a shape large enough to split.
    #[cfg(feature = "rayon")]
    #[test]
    fn thread_count_does_not_change_results() {
        let mut rng = SplitMix64::new(5);
        let (m, n, k) = (7, 160, 512);
        let case = Case::new(&mut rng, n, k, Some(128));
        let x = rng.vec_uniform(m * k, -1.0, 1.0);
        for w in case.variants() {
            for ks in &sets() {
                let mut seq = vec![0f32; m * n];
                let mut scratch = GemmScratch::new();
                wna16_gemm(ks, m, &x, &w, &mut seq, &mut scratch, Par::Seq).unwrap();
                for threads in [2, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let mut par = vec![0f32; m * n];
                    pool.install(|| {
                        wna16_gemm(ks, m, &x, &w, &mut par, &mut scratch, Par::Rayon).unwrap()
                    });
                    assert_eq!(seq, par, "{} threads={threads}", ks.wna16_isa());
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_typed_errors() {
        let s = [bf16::ONE; 2];
        let w = PackedWna16::pack(Wna16Desc {
            n: 2,
            k: 3,
            bits: 4,
            codes: &[8; 6],
            group_size: moe_quant::WeightGroups::Channelwise,
            scales: Wna16Scales::Bf16(&s),
            zeros: None,
            bias: None,
            perm: None,
        })
        .unwrap();
        let ks = KernelSet::scalar();
        let mut out = vec![0f32; 4];
        let mut scratch = GemmScratch::new();
        assert!(matches!(
            wna16_gemm(&ks, 2, &[0.0; 5], &w, &mut out, &mut scratch, Par::Seq),
            Err(KernelError::LengthMismatch {
                tensor: "x",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            wna16_gemm(&ks, 2, &[0.0; 6], &w, &mut out[..3], &mut scratch, Par::Seq),
            Err(KernelError::LengthMismatch {
                tensor: "out",
                expected: 4,
                got: 3
            })
        ));
    }
}
