//! The WNA16 body for int4 integer codes on AVX-512 VNNI (`vpdpbusd`), with each row of
//! activations quantized to 15-bit integers once per GEMM (the numerics of
//! [`crate::wna16_i15`], which this body equals bit for bit).
//!
//! One 64-byte int4 step holds 8 K values of the panel's 16 channels, one channel per 32-bit
//! lane, nibble `j` = K value `8s + j`. One AND with `0x0F0F0F0F` leaves the even K values of
//! the step as the lane's four bytes (`8s + 0, 2, 4, 6`), and a shift by 4 then the same AND
//! the odd ones: three instructions turn 128 codes into two `vpdpbusd` operands of unsigned
//! bytes, where the f32 body spends a shift, a table lookup and an FMA per 16 codes. The
//! activations are laid out per step as four 32-bit words ([`fill`]): the high bytes of the even
//! K values, of the odd ones, then the low bytes of both, each word broadcast to all lanes by
//! the instruction's memory operand. Four `vpdpbusd` then do the step's 128 multiply-adds per
//! row into two integer sums (high and low bytes), kept in two chains each for tiles of up to
//! four rows, so that no latency chain bounds them.
//!
//! At the end of each block (a scale group, or [`crate::wna16_i15::MAX_BLOCK`] K values of
//! a longer one) the sums become `128·Σc·hi + Σc·lo` (exact), convert to f32, lose `z · Σq`
//! (the block's activation sum, made by [`fill`]) in one fused multiply-add, and are scaled
//! into the row's f32 accumulator with another. The row's scale and the bias are applied once
//! at the end. From [`PAIR_MIN_ROWS`] rows (and K of [`PAIR_MIN_K`]) a tile covers two panels
//! ([`tile2`]), so that each activation word loaded feeds two `vpdpbusd`; otherwise, and at
//! decode, where the weights' stream from memory bounds the call, one. Rows run in blocks of
//! [`ROW_BLOCK`] over all of the call's panels, so a block's activations stay in L2 while the
//! panels stream, and weights are prefetched a page ahead as in the f32 body.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::wna16::{group_scales, load_step, load_zeros, prefetch_ahead, store_panel_rows};
use crate::dispatch::Int4Dot;
#[cfg(test)]
use crate::packed::wna16::K_STEP;
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout, Int4DotTileFn, run_row_blocks};
use crate::wna16_i15::{Blocks, MAX_Q, RowScale};

/// Rows per tile: 8 rows × 2 integer sums and an f32 accumulator each leave room for the
/// step, its two decoded halves and the block's constants. Tiles of up to 4 rows keep 4 sums
/// per row: with two `vpdpbusd` issued per cycle, a chain taking two of them per step would be
/// bound by their latency.
const MR: usize = 8;

/// Rows from which tiles cover two panels at once ([`tile2`]): each activation word loaded
/// then feeds two `vpdpbusd`. Fewer rows (decode, bound by the weights' stream) keep one panel
/// per tile and more chains per row.
const PAIR_MIN_ROWS: usize = 3;

/// K from which the two-panel tiles run. Alternated against one panel per tile at 3 to 16
/// rows, they were 1.04-1.25× faster on 4096 × 14336 experts and 0.79-0.97× as fast on
/// 2048 × 768 ones.
const PAIR_MIN_K: usize = 4096;

/// Rows per two-panel tile: 4 rows × 2 panels × 2 integer sums and 8 f32 accumulators.
const MR2: usize = 4;

/// Rows that run over all of a call's panels before the next rows start.
const ROW_BLOCK: usize = 64;

/// Bytes of one step of a row's activations: four words of four bytes.
const STEP_BYTES: usize = 16;

/// Bytes before a row's first step: its scale and post factor (f32 each), then zeros (the
/// AVX2 body's rows start the same way).
pub(super) const HEADER_BYTES: usize = 16;

/// Where K value `kk` of a row's steps lies, in bytes from the first step, for its high byte
/// (`low` false) or its low byte.
#[cfg(test)]
fn byte_offset(kk: usize, low: bool) -> usize {
    let j = kk % K_STEP;
    kk / K_STEP * STEP_BYTES + 8 * usize::from(low) + 4 * (j % 2) + j / 2
}

/// Byte order within 16 bytes of one half (high or low) of two steps: per step, the even K
/// values then the odd ones.
#[target_feature(enable = "avx512f")]
#[inline]
fn even_odd_order() -> __m128i {
    _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
}

/// Lays out `m` rows of `x` for the body: per row a [`HEADER_BYTES`] header (the row's scale
/// and post factor, see [`RowScale`]) and then, per step, the high bytes of K values `8s + 0,
/// 2, 4, 6`, of `8s + 1, 3, 5, 7`, and the low bytes of both, K past its end as zeros. Writes
/// each row's activation sums per block into `sums`, row-major.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VL; `x` holds `m·K` values of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn fill(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut Vec<u8>,
) -> Int4DotLayout {
    let (k, ks) = (w.k(), w.k_steps());
    let blocks = Blocks::of(w);
    let nb = blocks.count(w.n_groups());
    let row_bytes = HEADER_BYTES + ks * STEP_BYTES;
    if dst.len() < m * row_bytes {
        dst.resize(m * row_bytes, 0);
    }
    sums.clear();
    sums.resize(m * nb, 0.0);
    for ((row, out), row_sums) in x
        .chunks_exact(k)
        .zip(dst.chunks_exact_mut(row_bytes))
        .zip(sums.chunks_exact_mut(nb.max(1)))
        .take(m)
    {
        let rs = RowScale::of_amax(amax(row));
        let (head, steps) = out.split_at_mut(HEADER_BYTES);
        write_header(head, &rs);
        let (mut block, mut sum) = (0, _mm512_setzero_si512());
        // Sixteen K values (two steps, 32 bytes) at a time; the last may be one step.
        for (c, chunk) in steps.chunks_mut(2 * STEP_BYTES).enumerate() {
            let q = quantize16(row, 16 * c, &rs);
            let bytes = split16(q);
            chunk.copy_from_slice(&bytes[..chunk.len()]);
            // Add each step's eight integers to its block's sum (a block holds whole steps).
            for half in 0..2 {
                let kk = 16 * c + 8 * half;
                if kk >= k {
                    break;
                }
                let b = blocks.of_k(kk);
                if b != block {
                    row_sums[block] = _mm512_reduce_add_epi32(sum) as f32;
                    (block, sum) = (b, _mm512_setzero_si512());
                }
                let lanes: __mmask16 = 0xFF << (8 * half);
                sum = _mm512_mask_add_epi32(sum, lanes, sum, q);
            }
        }
        if nb > 0 {
            row_sums[block] = _mm512_reduce_add_epi32(sum) as f32;
        }
    }
    Int4DotLayout {
        len: m * row_bytes,
        row_bytes,
    }
}

/// The largest magnitude of `row`, NaN when it holds a NaN or an infinity.
#[target_feature(enable = "avx512f")]
fn amax(row: &[f32]) -> f32 {
    let (mut top, mut bad) = (_mm512_setzero_ps(), 0u16);
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    for lo in (0..row.len()).step_by(16) {
        let v = load16(row, lo);
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
        // `a` is not finite exactly when its bits reach those of infinity.
        bad |= _mm512_cmpge_epi32_mask(_mm512_castps_si512(a), _mm512_set1_epi32(0x7F80_0000));
        top = _mm512_max_ps(top, a);
    }
    if bad != 0 {
        f32::NAN
    } else {
        _mm512_reduce_max_ps(top)
    }
}

/// Values `lo..lo + 16` of `row`, zeros past its end.
#[target_feature(enable = "avx512f")]
#[inline]
fn load16(row: &[f32], lo: usize) -> __m512 {
    let n = row.len().saturating_sub(lo).min(16);
    let keep: __mmask16 = if n == 16 { !0 } else { (1 << n) - 1 };
    // SAFETY: the masked load reads only the `n` values `row[lo..lo + n]`.
    unsafe { _mm512_maskz_loadu_ps(keep, row.as_ptr().wrapping_add(lo)) }
}

/// The integers of values `lo..lo + 16` of `row` (zeros past its end), as
/// [`RowScale::quantize`] makes them: `x · lift · inv` rounded half to even, clamped.
#[target_feature(enable = "avx512f")]
#[inline]
fn quantize16(row: &[f32], lo: usize, rs: &RowScale) -> __m512i {
    let v = _mm512_mul_ps(load16(row, lo), _mm512_set1_ps(rs.lift));
    let v = _mm512_mul_ps(v, _mm512_set1_ps(rs.inv));
    let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm512_max_epi32(
        _mm512_min_epi32(q, _mm512_set1_epi32(MAX_Q)),
        _mm512_set1_epi32(-MAX_Q),
    )
}

/// The 32 bytes of two steps of 16 integers (see [`fill`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn split16(q: __m512i) -> [u8; 32] {
    let hi = _mm512_cvtepi32_epi8(_mm512_srai_epi32::<7>(q));
    let lo = _mm512_cvtepi32_epi8(_mm512_and_si512(q, _mm512_set1_epi32(127)));
    let hi = _mm_shuffle_epi8(hi, even_odd_order());
    let lo = _mm_shuffle_epi8(lo, even_odd_order());
    // Step 0 is the first 8 bytes of each half, step 1 the last 8.
    let step0 = _mm_unpacklo_epi64(hi, lo);
    let step1 = _mm_unpackhi_epi64(hi, lo);
    let mut bytes = [0u8; 32];
    // SAFETY: `bytes` is 32 writable bytes; unaligned stores.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), step0) };
    // SAFETY: as above, its second half.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().wrapping_add(16).cast(), step1) };
    bytes
}

/// Broadcasts word `j` of a step's activations to all 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast_word(step: &[u8; STEP_BYTES], j: usize) -> __m512i {
    let word: &[u8; 4] = step[4 * j..4 * j + 4].try_into().expect("4 bytes");
    _mm512_set1_epi32(i32::from_le_bytes(*word))
}

/// Writes a row's header: its scale and post factor (f32 each), then zeros. The AVX2 body's
/// rows start the same way.
pub(super) fn write_header(head: &mut [u8], rs: &RowScale) {
    head.fill(0);
    head[..4].copy_from_slice(&rs.scale.to_le_bytes());
    head[4..8].copy_from_slice(&rs.post.to_le_bytes());
}

/// A row's scale and post factor, from its header.
pub(super) fn read_header(row: &[u8]) -> (f32, f32) {
    let at = |i: usize| f32::from_le_bytes(row[i..i + 4].try_into().expect("4 bytes"));
    (at(0), at(4))
}

/// Rows `m0..m0 + R` of panel `p` (see the module docs), `C` chains per integer sum.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s
///   contract for panel `p` with this module's [`fill`], and `m0 + R ≤ job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const C: usize, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (ks, ng) = (w.k_steps(), w.n_groups());
    let blocks = Blocks::of(w);
    let nb = blocks.count(ng);
    let (codes, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let rows: [&[u8]; R] =
        std::array::from_fn(|r| &job.pairs[(m0 + r) * job.row_bytes..][..job.row_bytes]);
    let acts: [&[[u8; STEP_BYTES]]; R] =
        std::array::from_fn(|r| rows[r][HEADER_BYTES..].as_chunks().0);
    let zeros = w
        .zeros()
        .map(|z| z[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>().0);
    let nibbles = _mm512_set1_epi32(0x0F0F_0F0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..ng {
        let scale = group_scales(w.scales(), (p * ng + g) * PANEL);
        let zero = match zeros {
            Some(z) if ASYM => load_zeros(&z[g]),
            _ => _mm512_set1_ps(f32::from(w.symmetric_zero())),
        };
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            let mut hi = [[_mm512_setzero_si512(); R]; C];
            let mut lo = [[_mm512_setzero_si512(); R]; C];
            for s in steps {
                prefetch_ahead(&codes[s]);
                let v = load_step(&codes[s]);
                let even = _mm512_and_si512(v, nibbles);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibbles);
                for r in 0..R {
                    let a = &acts[r][s];
                    hi[0][r] = _mm512_dpbusd_epi32(hi[0][r], even, broadcast_word(a, 0));
                    hi[C - 1][r] = _mm512_dpbusd_epi32(hi[C - 1][r], odd, broadcast_word(a, 1));
                    lo[0][r] = _mm512_dpbusd_epi32(lo[0][r], even, broadcast_word(a, 2));
                    lo[C - 1][r] = _mm512_dpbusd_epi32(lo[C - 1][r], odd, broadcast_word(a, 3));
                }
            }
            let b = g * blocks.per_group + i;
            for r in 0..R {
                let (mut h, mut l) = (hi[0][r], lo[0][r]);
                for c in 1..C {
                    h = _mm512_add_epi32(h, hi[c][r]);
                    l = _mm512_add_epi32(l, lo[c][r]);
                }
                let d = _mm512_add_epi32(_mm512_slli_epi32::<7>(h), l);
                let xsum = _mm512_set1_ps(job.group_sums[(m0 + r) * nb + b]);
                let t = _mm512_fnmadd_ps(zero, xsum, _mm512_cvtepi32_ps(d));
                acc[r] = _mm512_fmadd_ps(t, scale, acc[r]);
            }
        }
    }
    for r in 0..R {
        let (scale, post) = read_header(rows[r]);
        let scaled = _mm512_mul_ps(acc[r], _mm512_set1_ps(scale));
        acc[r] = _mm512_mul_ps(scaled, _mm512_set1_ps(post));
    }
    // SAFETY: rows `m0..m0 + R` of panel `p` are ours to write (our contract).
    unsafe { store_panel_rows(w, job.out, p, m0, acc) };
}

/// Rows `m0..m0 + R` of panels `p` and `p + 1` at once: each broadcast activation word feeds
/// both panels' `vpdpbusd`, halving the loads per multiply-add of [`tile`].
///
/// # Safety
/// - As [`tile`], for panels `p` and `p + 1`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile2<const R: usize, const ASYM: bool>(job: &Int4DotJob<'_>, p: usize, m0: usize) {
    let w = job.w;
    let (ks, ng) = (w.k_steps(), w.n_groups());
    let blocks = Blocks::of(w);
    let nb = blocks.count(ng);
    let codes: [&[[u32; PANEL]]; 2] = std::array::from_fn(|j| {
        w.codes()[(p + j) * ks * PANEL..][..ks * PANEL]
            .as_chunks::<PANEL>()
            .0
    });
    let rows: [&[u8]; R] =
        std::array::from_fn(|r| &job.pairs[(m0 + r) * job.row_bytes..][..job.row_bytes]);
    let acts: [&[[u8; STEP_BYTES]]; R] =
        std::array::from_fn(|r| rows[r][HEADER_BYTES..].as_chunks().0);
    let nibbles = _mm512_set1_epi32(0x0F0F_0F0F);
    let mut acc = [[_mm512_setzero_ps(); R]; 2];
    for g in 0..ng {
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            let mut hi = [[_mm512_setzero_si512(); R]; 2];
            let mut lo = [[_mm512_setzero_si512(); R]; 2];
            for s in steps {
                let mut even = [_mm512_setzero_si512(); 2];
                let mut odd = [_mm512_setzero_si512(); 2];
                for j in 0..2 {
                    prefetch_ahead(&codes[j][s]);
                    let v = load_step(&codes[j][s]);
                    even[j] = _mm512_and_si512(v, nibbles);
                    odd[j] = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibbles);
                }
                for r in 0..R {
                    let a = &acts[r][s];
                    let words: [__m512i; 4] = std::array::from_fn(|k| broadcast_word(a, k));
                    for j in 0..2 {
                        hi[j][r] = _mm512_dpbusd_epi32(hi[j][r], even[j], words[0]);
                        hi[j][r] = _mm512_dpbusd_epi32(hi[j][r], odd[j], words[1]);
                        lo[j][r] = _mm512_dpbusd_epi32(lo[j][r], even[j], words[2]);
                        lo[j][r] = _mm512_dpbusd_epi32(lo[j][r], odd[j], words[3]);
                    }
                }
            }
            let b = g * blocks.per_group + i;
            for j in 0..2 {
                let q = p + j;
                let scale = group_scales(w.scales(), (q * ng + g) * PANEL);
                let zero = match w.zeros() {
                    Some(z) if ASYM => {
                        load_zeros(z[(q * ng + g) * PANEL..][..PANEL].try_into().expect("16"))
                    }
                    _ => _mm512_set1_ps(f32::from(w.symmetric_zero())),
                };
                for r in 0..R {
                    let d = _mm512_add_epi32(_mm512_slli_epi32::<7>(hi[j][r]), lo[j][r]);
                    let xsum = _mm512_set1_ps(job.group_sums[(m0 + r) * nb + b]);
                    let t = _mm512_fnmadd_ps(zero, xsum, _mm512_cvtepi32_ps(d));
                    acc[j][r] = _mm512_fmadd_ps(t, scale, acc[j][r]);
                }
            }
        }
    }
    for j in 0..2 {
        for r in 0..R {
            let (scale, post) = read_header(rows[r]);
            let scaled = _mm512_mul_ps(acc[j][r], _mm512_set1_ps(scale));
            acc[j][r] = _mm512_mul_ps(scaled, _mm512_set1_ps(post));
        }
        // SAFETY: rows `m0..m0 + R` of panel `p + j` are ours to write (our contract).
        unsafe { store_panel_rows(w, job.out, p + j, m0, acc[j]) };
    }
}

/// The instance of [`tile2`] for `rows` rows (1 to [`MR2`]).
fn tile2_fn<const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile2::<1, ASYM>,
        2 => tile2::<2, ASYM>,
        3 => tile2::<3, ASYM>,
        _ => tile2::<MR2, ASYM>,
    }
}

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]).
fn tile_fn<const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile::<1, 2, ASYM>,
        2 => tile::<2, 2, ASYM>,
        3 => tile::<3, 2, ASYM>,
        4 => tile::<4, 2, ASYM>,
        5 => tile::<5, 1, ASYM>,
        6 => tile::<6, 1, ASYM>,
        7 => tile::<7, 1, ASYM>,
        _ => tile::<MR, 1, ASYM>,
    }
}

/// The entry (see [`crate::wna16::Int4DotPanelsFn`]): rows in blocks of [`ROW_BLOCK`], each
/// block over `panels`; from [`PAIR_MIN_ROWS`] rows and K of [`PAIR_MIN_K`], pairs of panels
/// in row tiles of up to [`MR2`] ([`tile2`]) and a lone last panel alone, otherwise each panel
/// in row tiles of up to [`MR`] ([`tile`]).
///
/// # Safety
/// - As [`crate::wna16::Int4DotPanelsFn`], on a CPU with AVX-512 F/BW/VNNI, `job.pairs` and
///   `job.group_sums` made by this module's [`fill`].
pub(crate) unsafe fn entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    let pairs = if job.m >= PAIR_MIN_ROWS && job.w.k() >= PAIR_MIN_K {
        panels.len() / 2
    } else {
        0
    };
    let paired = (panels.start..panels.start + 2 * pairs).step_by(2);
    let tiles = [tile2_fn::<false>, tile2_fn::<true>];
    // SAFETY: every instance is a pair tile of this module, which needs the features and the
    // layout the caller vouches for; each walked `p` starts a pair of the caller's panels
    // (`2·pairs ≤` their count).
    unsafe { run_row_blocks(job, paired, ROW_BLOCK, MR2, tiles) };
    let singles = panels.start + 2 * pairs..panels.end;
    let tiles = [tile_fn::<false>, tile_fn::<true>];
    // SAFETY: as above, one panel of the caller's per tile.
    unsafe { run_row_blocks(job, singles, ROW_BLOCK, MR, tiles) };
}

/// This body as a kernel set's int4 dot-product body, for GEMMs of `min_m` rows up to
/// `max_m` (exclusive) on int4 integer codes.
pub(crate) fn body(min_m: usize, max_m: usize) -> Int4Dot {
    let unit = "avx512-vnni dot products on codes decoded in registers";
    integer_body(unit, fill, entry, min_m, max_m)
}

/// A rung's integer body (its `fill` and `entry`, doing `unit`) as a kernel set's int4
/// dot-product body, for GEMMs of `min_m` rows up to `max_m` (exclusive) on int4 integer codes.
pub(super) fn integer_body(
    unit: &'static str,
    fill: crate::wna16::Int4DotFillFn,
    entry: crate::wna16::Int4DotPanelsFn,
    min_m: usize,
    max_m: usize,
) -> Int4Dot {
    Int4Dot {
        unit,
        activations: "15-bit integer activations",
        codes: " for integer codes",
        min_m,
        max_m,
        serves: |w, _| crate::wna16_i15::serves(w),
        fill,
        entry,
    }
}

/// The AVX-512 VNNI set with this body at every row count, where the CPU has AVX-512 VNNI
/// (tests).
#[cfg(test)]
pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
    let token = super::Avx512Vnni::try_new()?;
    let ks = super::avx512vnni_kernel_set(token).without_wna16_int4_dot();
    // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all the body and its layout need.
    Some(unsafe { ks.with_wna16_int4_dot(body(1, usize::MAX)) })
}

#[cfg(test)]
pub(in crate::x86) mod tests {
    use half::{bf16, f16};
    use moe_testutil::SplitMix64;

    use super::{HEADER_BYTES, byte_offset, kernel_set};
    use crate::packed::wna16::K_STEP;
    use crate::wna16_i15::{Blocks, RowScale, wna16_i15_reference};
    use crate::{GemmScratch, PackedWna16, Par, Wna16Desc, Wna16Scales};

    fn set() -> Option<crate::KernelSet> {
        let ks = kernel_set();
        if ks.is_none() {
            eprintln!("note: skipping the integer WNA16 body: no AVX-512 VNNI");
        }
        ks
    }

    /// Every integer body this CPU runs (AVX-512 VNNI, AVX2), each alone in its rung's set:
    /// they share the numerics, so the same tests hold for each.
    fn bodies() -> Vec<(&'static str, crate::KernelSet)> {
        let sets = [
            ("avx512-vnni", set()),
            ("avx2", crate::x86::wna16_i15_avx2::kernel_set()),
        ];
        sets.into_iter()
            .filter_map(|(name, ks)| Some((name, ks?)))
            .collect()
    }

    /// Random int4 weights: `g` None is channelwise; scales of each 16-bit kind and f32.
    fn weights(
        rng: &mut SplitMix64,
        n: usize,
        k: usize,
        g: Option<usize>,
        asym: bool,
        perm: bool,
    ) -> PackedWna16 {
        let groups = g.map_or(1, |g| k.div_ceil(g));
        let codes: Vec<u8> = (0..n * k).map(|_| rng.below(16) as u8).collect();
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
        let zeros: Vec<u8> = (0..n * groups).map(|_| rng.below(16) as u8).collect();
        let bias = rng.vec_uniform(n, -1.0, 1.0);
        let mut order: Vec<u32> = (0..k as u32).collect();
        for i in (1..k).rev() {
            order.swap(i, rng.below(i + 1));
        }
        PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits: 4,
            codes: &codes,
            group_size: moe_quant::WeightGroups::from_group_size(g).unwrap(),
            scales,
            zeros: asym.then_some(&zeros[..]),
            bias: Some(&bias),
            perm: perm.then_some(&order[..]),
        })
        .unwrap()
    }

    /// The layout holds each value's quantized integer as `128·hi + lo` at its place, the
    /// row's scale and post factor in the header, zeros past K, and each block's exact sum of
    /// the integers.
    #[test]
    fn fill_lays_out_integer_halves_and_block_sums() {
        if set().is_none() {
            return;
        }
        check_fill_layout(super::fill, 16, |steps, kk| {
            let hi = steps[byte_offset(kk, false)] as i8;
            let lo = steps[byte_offset(kk, true)];
            assert!(lo < 128, "K value {kk}: low byte {lo}");
            128 * i32::from(hi) + i32::from(lo)
        });
    }

    /// Checks an integer body's `fill` on ragged shapes (a tiny row among them): per row the
    /// header holds its scale and post factor then zeros, `value_at(steps, kk)` reads back
    /// K value `kk` from the row's steps (`step_bytes` each) as the row's quantized integer
    /// (0 past K), and `sums` holds each block's exact sum of them.
    pub(in crate::x86) fn check_fill_layout(
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
            let (mut dst, mut sums) = (vec![0xAA; 7], vec![5.0; 3]);
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

    /// Every int4 integer kind (symmetric, zero points, act-order; bf16, f16 and f32 scales)
    /// on ragged shapes equals the scalar twin bit for bit, whatever the thread split.
    #[test]
    fn integer_body_equals_its_scalar_twin_on_ragged_shapes() {
        for (body, ks) in bodies() {
            equals_the_twin_on_ragged_shapes(body, &ks);
        }
    }

    fn equals_the_twin_on_ragged_shapes(body: &str, ks: &crate::KernelSet) {
        let mut rng = SplitMix64::new(0x15b);
        // (K, group size or channelwise, zero points, act-order)
        let cases: [(usize, Option<usize>, bool, bool); 10] = [
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
            for &n in &[1usize, 17, 33] {
                let w = weights(&mut rng, n, k, g, asym, perm);
                for &m in &[0usize, 1, 2, 3, 5, 8, 9, 16, 65, 130] {
                    if k > 1000 && m > 16 {
                        continue;
                    }
                    let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                    let want = wna16_i15_reference(m, &x, &w);
                    for par in [Par::Seq, Par::Rayon] {
                        assert!(m == 0 || ks.wna16_int4_dot_for(&w, m).is_some());
                        let mut got = vec![f32::NAN; m * n];
                        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), par)
                            .unwrap();
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{body}: k={k} g={g:?} asym={asym} perm={perm} n={n} m={m} \
                                 {par:?}: out[{i}] = {a}, want {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Against the f32 definition: the only new error is each activation's rounding to its
    /// 15-bit grid, at most half a step (`amax / 32766`) times the weight it meets, plus the
    /// f32 sums' own rounding.
    #[test]
    fn integer_body_stays_within_the_grid_of_the_f32_definition() {
        for (body, ks) in bodies() {
            within_the_grid_of_the_f32_definition(body, &ks);
        }
    }

    fn within_the_grid_of_the_f32_definition(body: &str, ks: &crate::KernelSet) {
        let mut rng = SplitMix64::new(0x15c);
        for &(k, g, asym) in &[
            (256usize, Some(128usize), false),
            (300, Some(32), true),
            (2048, None, false),
        ] {
            let n = 40;
            let w = weights(&mut rng, n, k, g, asym, false);
            let dq = w.dequantize_f64();
            for &m in &[1usize, 4, 9] {
                let mut x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
                // An outlier in the first row: the others' grid is finer.
                x[3] = 40.0;
                let mut got = vec![0f32; m * n];
                crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), Par::Seq)
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
                            "{body}: k={k} g={g:?} m={m}: out[{r},{c}] = {got}, want {want} (grid {grid})"
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
        for (body, ks) in bodies() {
            rows_of_non_finite_zero_and_tiny_values(body, &ks);
        }
    }

    fn rows_of_non_finite_zero_and_tiny_values(body: &str, ks: &crate::KernelSet) {
        let mut rng = SplitMix64::new(0x15d);
        let (n, k, m) = (20usize, 96usize, 6usize);
        let w = weights(&mut rng, n, k, Some(32), false, false);
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
