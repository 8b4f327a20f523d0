//! The WNA16 (weight-only int4/int8, f32 compute) bodies of the x86 rungs.
//!
//! AVX-512: 8 rows × 16 channels. One 64-byte int4 step holds 8 K values of the panel's 16
//! channels, one channel per 32-bit lane (nibble `j` = K value `8s + j`), so K value `j` is
//! one `vpsrld` by `4j` and one `vpermps` from a 16-entry f32 table (which reads the low four
//! bits of each lane): `c − 8` for symmetric weights, `c` for asymmetric ones, whose per-group
//! zero vector is then subtracted (`c − z` stays exact), the e2m1 values for MXFP4 weights. Each row broadcasts its activation and
//! fuses the multiply-add into a per-group partial sum (`vfmadd`); tiles of four rows or fewer
//! keep two or four partial sums per row (K value `j` of a step into chain `j mod C`), so one
//! FMA latency chain does not bound them. At the end of a group the chains are added and the
//! sum is scaled into the row accumulator with one more `vfmadd`. Weights are
//! decoded once per step and serve all rows of the tile. See `crate::wna16` for the numerics.
//!
//! int8 weights: one step holds 4 K values as 16 consecutive channel bytes each; K value `j`
//! is one 16-byte load, `vpmovzxbd`, `vcvtdq2ps` and the subtraction of the zero (128 when
//! symmetric), with the same partial-sum chains and group epilogue. e4m3 codes (FP8 weights)
//! sign-extend to 16 bits instead (`vpmovsxbw`) and shift left by 7, which puts the seven
//! magnitude bits at bits 7..13 and copies of the sign at bits 14 and 15; clearing bit 14
//! leaves an f16 equal to the e4m3 value times `2^-8` (normal and subnormal codes alike, as
//! f16's exponent field is one bit wider with bias 15). `vcvtph2ps` widens it exactly and one
//! multiply by `2^8` restores the value, so no f32 subnormal is ever an operand.
//!
//! AVX2 with FMA: 4 rows × 16 channels, two 8-lane vectors per row. Nibble `j` of a step is
//! one shift and one AND; ORed into the exponent of `2^23`, it is the f32 `2^23 + c`, and one
//! subtraction of `2^23 + z` (the zero point, 8 or 128 when symmetric) leaves the exact `c − z`.
//! int8 codes widen with `vpmovzxbd` and decode the same way. The multiply-adds are fused, as
//! in the AVX-512 body (within `1e-5·Σ|x·w|` of the reference). e2m1 codes take their
//! magnitude from an 8-entry table (`vpermps` on the low three bits) and their sign from the
//! top bit; e4m3 codes go through f16 as in the AVX-512 body (`vcvtph2ps`, F16C). CPUs with
//! AVX2 but no FMA or F16C run the portable body compiled with AVX2 enabled, which keeps the
//! reference's separate multiply and add and equals it bit for bit.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use half::{bf16, f16};

use crate::packed::wna16::{E2M1_VALUES, Int4Values, K_STEP, K_STEP8, Wna16ScaleValues};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::Wna16Job;

use super::actquant::load8;

/// Rows per tile: 8 partial sums, 8 accumulators, the table, the step, the decoded weights and
/// the zero vector fit the 32 registers.
const MR: usize = 8;

/// How far ahead of the current step the tile prefetches weights into L1: every code byte
/// streams from DRAM once per call.
const PREFETCH_BYTES: usize = 4096;

/// Decoded values of the 16 codes for symmetric weights (`c − 8`).
pub(crate) const LUT_SYM: [f32; 16] = [
    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
];

/// Decoded values of the 16 codes for asymmetric weights (`c`; the zero is subtracted after).
pub(crate) const LUT_RAW: [f32; 16] = [
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
];

/// Loads 16 f32.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_f32(v: &[f32; 16]) -> __m512 {
    // SAFETY: the reference covers 16 readable f32, and the load is unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// Loads one step: 16 channels' 32-bit code words.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load_step(v: &[u32; 16]) -> __m512i {
    // SAFETY: the reference covers 64 readable bytes, and the load is unaligned.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// Loads 16 16-bit values as the low halves of an `__m256i`.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_u16x16<T>(v: &[T; 16]) -> __m256i {
    debug_assert_eq!(size_of::<T>(), 2);
    // SAFETY: callers pass 16 two-byte elements (`f16`/`bf16`), 32 readable bytes; unaligned.
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// Loads 16 zero points and widens them to f32.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn load_zeros(v: &[u8; 16]) -> __m512 {
    // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
    let bytes = unsafe { _mm_loadu_si128(v.as_ptr().cast()) };
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes))
}

/// The 16 scales at `at` of the packed scales, widened to f32 (exactly).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn group_scales(s: &Wna16ScaleValues, at: usize) -> __m512 {
    match s {
        Wna16ScaleValues::F16(v) => {
            let v: &[f16; 16] = v[at..at + 16].try_into().expect("16 scales");
            _mm512_cvtph_ps(load_u16x16(v))
        }
        Wna16ScaleValues::Bf16(v) => {
            let v: &[bf16; 16] = v[at..at + 16].try_into().expect("16 scales");
            let wide = _mm512_cvtepu16_epi32(load_u16x16(v));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
        }
        Wna16ScaleValues::F32(v) => load_f32(v[at..at + 16].try_into().expect("16 scales")),
        Wna16ScaleValues::E8m0(v) => {
            let v: &[u8; 16] = v[at..at + 16].try_into().expect("16 scales");
            // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
            let bytes = unsafe { _mm_loadu_si128(v.as_ptr().cast()) };
            let e = _mm512_cvtepu8_epi32(bytes);
            // `e << 23` is the f32 `2^(e − 127)` for e ≥ 1; e = 0 is the subnormal 2^-127.
            let pow = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e));
            let zero = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
            _mm512_mask_mov_ps(pow, zero, _mm512_set1_ps(f32::from_bits(0x0040_0000)))
        }
    }
}

/// Prefetches the line `PREFETCH_BYTES` past `step` into L1.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn prefetch_ahead(step: &[u32; 16]) {
    // A prefetch is a hint that never faults, so an address past the weights is harmless.
    let ahead = step.as_ptr().cast::<i8>().wrapping_add(PREFETCH_BYTES);
    _mm_prefetch::<_MM_HINT_T0>(ahead);
}

/// Decodes nibble `J` of every lane of `v` through `lut`, less `zero` when asymmetric.
#[target_feature(enable = "avx512f")]
#[inline]
fn decode<const SHIFT: u32, const ASYM: bool>(v: __m512i, lut: __m512, zero: __m512) -> __m512 {
    let w = _mm512_permutexvar_ps(_mm512_srli_epi32::<SHIFT>(v), lut);
    if ASYM { _mm512_sub_ps(w, zero) } else { w }
}

/// Decodes K value `j` of an int8 step (16 consecutive bytes) to f32, less `zero`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn decode8(step: &[u32; 16], j: usize, zero: __m512) -> __m512 {
    let bytes: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
    let v = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)), zero)
}

/// Decodes K value `j` of an int8 step of e4m3 codes (16 consecutive bytes) to f32.
///
/// Needs only AVX-512 F (which implies the AVX2 and F16C operations it uses), so the bf16
/// path's panel fill can share it.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn decode_e4m3(step: &[u32; 16], j: usize) -> __m512 {
    let bytes: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
    let v = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    let shifted = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(v));
    // Bit 14 holds a second copy of the sign; an f16 needs it clear (0xBFFF as an i16).
    let half = _mm256_and_si256(shifted, _mm256_set1_epi16(!0x4000));
    _mm512_mul_ps(_mm512_cvtph_ps(half), _mm512_set1_ps(256.0))
}

/// Computes rows `m0..m0 + R` of panel `p` (see the module docs).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`;
///   `m0 + R ≤ job.m` and `job.x` holds `m·K` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn tile<
    const BITS: u32,
    const R: usize,
    const C: usize,
    const ASYM: bool,
    const E4M3: bool,
>(
    job: &Wna16Job<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
    let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let rows: [&[f32]; R] = std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
    let row_steps: [&[[f32; K_STEP]]; R] = std::array::from_fn(|r| rows[r].as_chunks().0);
    let zeros = w
        .zeros()
        .map(|z| z[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>().0);
    let lut = load_f32(match w.values() {
        Int4Values::E2m1 => &E2M1_VALUES,
        _ if ASYM => &LUT_RAW,
        _ => &LUT_SYM,
    });
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..ng {
        let (k0, k1) = (g * gs, k.min((g + 1) * gs));
        let zero = match zeros {
            Some(z) if ASYM => load_zeros(&z[g]),
            _ if BITS == 8 => _mm512_set1_ps(128.0),
            _ => _mm512_setzero_ps(),
        };
        // `C` independent partial sums per row (K value `j` of a step goes to chain `j % C`),
        // so tiles of few rows are not bound by the latency of one `vfmadd` chain.
        let mut part = [[_mm512_setzero_ps(); R]; C];
        if BITS == 8 {
            // Group sizes are multiples of 8, so `k0` starts a step.
            let row_steps8: [&[[f32; K_STEP8]]; R] = std::array::from_fn(|r| rows[r].as_chunks().0);
            let (s0, s_full) = (k0 / K_STEP8, k1 / K_STEP8);
            for s in s0..s_full {
                let step = &steps[s];
                prefetch_ahead(step);
                let xs: [&[f32; K_STEP8]; R] = std::array::from_fn(|r| &row_steps8[r][s]);
                for j in 0..K_STEP8 {
                    let wj = if E4M3 {
                        decode_e4m3(step, j)
                    } else {
                        decode8(step, j, zero)
                    };
                    for r in 0..R {
                        let c = j % C;
                        part[c][r] = _mm512_fmadd_ps(_mm512_set1_ps(xs[r][j]), wj, part[c][r]);
                    }
                }
            }
            for kk in s_full * K_STEP8..k1 {
                let wj = if E4M3 {
                    decode_e4m3(&steps[s_full], kk % K_STEP8)
                } else {
                    decode8(&steps[s_full], kk % K_STEP8, zero)
                };
                for r in 0..R {
                    part[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(rows[r][kk]), wj, part[0][r]);
                }
            }
            let s = group_scales(w.scales(), (p * ng + g) * PANEL);
            for r in 0..R {
                let mut sum = part[0][r];
                for chain in &part[1..] {
                    sum = _mm512_add_ps(sum, chain[r]);
                }
                acc[r] = _mm512_fmadd_ps(sum, s, acc[r]);
            }
            continue;
        }
        // Group sizes are multiples of K_STEP, so `k0` starts a step.
        let (s0, s_full) = (k0 / K_STEP, k1 / K_STEP);
        for s in s0..s_full {
            let step = &steps[s];
            prefetch_ahead(step);
            let v = load_step(step);
            let xs: [&[f32; K_STEP]; R] = std::array::from_fn(|r| &row_steps[r][s]);
            macro_rules! k_value {
                ($j:literal) => {{
                    let wj = decode::<{ 4 * $j }, ASYM>(v, lut, zero);
                    for r in 0..R {
                        let c = $j % C;
                        part[c][r] = _mm512_fmadd_ps(_mm512_set1_ps(xs[r][$j]), wj, part[c][r]);
                    }
                }};
            }
            k_value!(0);
            k_value!(1);
            k_value!(2);
            k_value!(3);
            k_value!(4);
            k_value!(5);
            k_value!(6);
            k_value!(7);
        }
        // The last step of K, when K is not a multiple of K_STEP.
        if s_full * K_STEP < k1 {
            let v = load_step(&steps[s_full]);
            for kk in s_full * K_STEP..k1 {
                let shift = _mm512_set1_epi32(4 * (kk % K_STEP) as i32);
                let wj = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shift), lut);
                let wj = if ASYM { _mm512_sub_ps(wj, zero) } else { wj };
                for r in 0..R {
                    part[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(rows[r][kk]), wj, part[0][r]);
                }
            }
        }
        let s = group_scales(w.scales(), (p * ng + g) * PANEL);
        for r in 0..R {
            let mut sum = part[0][r];
            for chain in &part[1..] {
                sum = _mm512_add_ps(sum, chain[r]);
            }
            acc[r] = _mm512_fmadd_ps(sum, s, acc[r]);
        }
    }
    // SAFETY: forwarded from our contract (rows `m0..m0 + R` of panel `p` are ours).
    unsafe { store_panel_rows(w, job.out, p, m0, acc) };
}

/// Adds the bias (if any) to the sums of rows `m0..m0 + R` of panel `p` and stores their
/// valid channels into `out` (`m·N`, row-major).
///
/// # Safety
/// - `out` is valid for writes of rows `m0..m0 + R` in panel `p`'s channels, which no other
///   thread writes meanwhile.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store_panel_rows<const R: usize>(
    w: &PackedWna16,
    out: *mut f32,
    p: usize,
    m0: usize,
    mut acc: [__m512; R],
) {
    if let Some(b) = w.bias() {
        let b = load_f32(b[p * PANEL..][..PANEL].try_into().expect("16 biases"));
        for r in 0..R {
            acc[r] = _mm512_add_ps(acc[r], b);
        }
    }
    let valid = PANEL.min(w.n() - p * PANEL);
    let mask: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
    for r in 0..R {
        let at = (m0 + r) * w.n() + p * PANEL;
        // SAFETY: the masked store writes channels `16p..16p + valid` (< N) of row
        // `m0 + r`, elements of the caller's output owned by this panel alone (our contract).
        unsafe { _mm512_mask_storeu_ps(out.wrapping_add(at), mask, acc[r]) };
    }
}

/// One row-count instance of [`tile`].
type TileFn = unsafe fn(&Wna16Job<'_>, usize, usize);

/// Walks the row tiles of `panels`.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX-512 F/BW/VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn panels<const BITS: u32, const ASYM: bool, const E4M3: bool>(
    job: &Wna16Job<'_>,
    panels: Range<usize>,
) {
    for p in panels {
        for rows in crate::ukernel::row_tiles(job.m, MR) {
            let (m0, mr) = (rows.start, rows.len());
            let tile_fn: TileFn = match mr {
                1 => tile::<BITS, 1, 4, ASYM, E4M3>,
                2 => tile::<BITS, 2, 4, ASYM, E4M3>,
                3 => tile::<BITS, 3, 2, ASYM, E4M3>,
                4 => tile::<BITS, 4, 2, ASYM, E4M3>,
                5 => tile::<BITS, 5, 1, ASYM, E4M3>,
                6 => tile::<BITS, 6, 1, ASYM, E4M3>,
                7 => tile::<BITS, 7, 1, ASYM, E4M3>,
                _ => tile::<BITS, MR, 1, ASYM, E4M3>,
            };
            // SAFETY: rows `m0..m0 + mr` lie within `0..m`, panel `p` is ours (caller), and the
            // caller's CPU has the features the tile needs.
            unsafe { tile_fn(job, p, m0) };
        }
    }
}

/// The AVX-512 entry.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX-512 F/BW/VL.
pub(crate) unsafe fn panels_avx512(job: &Wna16Job<'_>, range: Range<usize>) {
    let walk: unsafe fn(&Wna16Job<'_>, Range<usize>) = match (job.w.bits(), job.w.zeros()) {
        _ if job.w.is_e4m3() => panels::<8, false, true>,
        (4, None) => panels::<4, false, false>,
        (4, Some(_)) => panels::<4, true, false>,
        (_, None) => panels::<8, false, false>,
        (_, Some(_)) => panels::<8, true, false>,
    };
    // SAFETY: forwarded from the caller.
    unsafe { walk(job, range) }
}

/// The AVX2 entry: the portable body vectorized over 256-bit registers.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn panels_avx2(job: &Wna16Job<'_>, range: Range<usize>) {
    crate::wna16::panels_body(job, range);
}

/// Rows per tile of the AVX2 FMA body: 8 partial sums (two vectors per row), the two decoded
/// weight vectors, the broadcast activation and the decoding constants fit the 16 registers.
const MR_AVX2: usize = 4;

/// `2^23` as f32 bits: ORed with an integer below `2^23`, it makes the f32 `2^23 + i`.
const MAGIC: i32 = 0x4B00_0000;

/// Stores 8 f32.
#[target_feature(enable = "avx2")]
#[inline]
fn store8(dst: &mut [f32; 8], v: __m256) {
    // SAFETY: the reference covers 8 writable f32, and the store is unaligned.
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) }
}

/// One int4 step's 16 code words as two vectors of 8 channels.
#[target_feature(enable = "avx2")]
#[inline]
fn load_step_avx2(step: &[u32; 16]) -> [__m256i; 2] {
    // SAFETY: each half covers 8 readable words (32 bytes), and the loads are unaligned.
    std::array::from_fn(|h| unsafe { _mm256_loadu_si256(step[8 * h..].as_ptr().cast()) })
}

/// Decodes nibble `J` (`SHIFT = 4J`) of both halves of a step: `2^23 + c` as f32, less
/// `offset` (`2^23 + 8`, or `2^23 + z` per channel), which leaves the exact `c − 8` or `c − z`.
#[target_feature(enable = "avx2")]
#[inline]
fn decode4_avx2<const SHIFT: i32>(v: &[__m256i; 2], offset: &[__m256; 2]) -> [__m256; 2] {
    let (mask, magic) = (_mm256_set1_epi32(0xF), _mm256_set1_epi32(MAGIC));
    std::array::from_fn(|h| {
        let c = _mm256_and_si256(_mm256_srli_epi32::<SHIFT>(v[h]), mask);
        _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, magic)), offset[h])
    })
}

/// [`decode4_avx2`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "avx2")]
#[inline]
fn decode4_at_avx2(v: &[__m256i; 2], j: usize, offset: &[__m256; 2]) -> [__m256; 2] {
    let (mask, magic) = (_mm256_set1_epi32(0xF), _mm256_set1_epi32(MAGIC));
    let shift = _mm_cvtsi32_si128(4 * j as i32);
    std::array::from_fn(|h| {
        let c = _mm256_and_si256(_mm256_srl_epi32(v[h], shift), mask);
        _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, magic)), offset[h])
    })
}

/// Decodes K value `j` of an int8 step (16 consecutive channel bytes) the same way.
#[target_feature(enable = "avx2")]
#[inline]
fn decode8_avx2(step: &[u32; 16], j: usize, offset: &[__m256; 2]) -> [__m256; 2] {
    let magic = _mm256_set1_epi32(MAGIC);
    std::array::from_fn(|h| {
        let bytes: &[u32; 2] = step[4 * j + 2 * h..4 * j + 2 * h + 2]
            .try_into()
            .expect("8 bytes");
        // SAFETY: the reference covers 8 readable bytes, and the load is unaligned.
        let b = unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) };
        let c = _mm256_cvtepu8_epi32(b);
        _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(c, magic)), offset[h])
    })
}

/// Decodes nibble `J` (`SHIFT = 4J`, `SIGN = 28 − 4J`) of both halves of a step of e2m1
/// codes: the magnitude from the 8-entry table of codes 0..=7 (`vpermps` reads the low three
/// bits of each lane), the sign from the nibble's top bit moved to bit 31.
#[target_feature(enable = "avx2")]
#[inline]
fn decode_e2m1_avx2<const SHIFT: i32, const SIGN: i32>(
    v: &[__m256i; 2],
    lut: __m256,
) -> [__m256; 2] {
    let sign_bit = _mm256_set1_epi32(i32::MIN);
    std::array::from_fn(|h| {
        let magnitude = _mm256_permutevar8x32_ps(lut, _mm256_srli_epi32::<SHIFT>(v[h]));
        let sign = _mm256_and_si256(_mm256_slli_epi32::<SIGN>(v[h]), sign_bit);
        _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign))
    })
}

/// [`decode_e2m1_avx2`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "avx2")]
#[inline]
fn decode_e2m1_at_avx2(v: &[__m256i; 2], j: usize, lut: __m256) -> [__m256; 2] {
    let sign_bit = _mm256_set1_epi32(i32::MIN);
    let (right, left) = (
        _mm_cvtsi32_si128(4 * j as i32),
        _mm_cvtsi32_si128(28 - 4 * j as i32),
    );
    std::array::from_fn(|h| {
        let magnitude = _mm256_permutevar8x32_ps(lut, _mm256_srl_epi32(v[h], right));
        let sign = _mm256_and_si256(_mm256_sll_epi32(v[h], left), sign_bit);
        _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign))
    })
}

/// Decodes K value `j` of an int8 step of e4m3 codes (16 consecutive channel bytes), as
/// [`decode_e4m3`] does with 512-bit registers: sign-extended to 16 bits and shifted left by
/// 7, with bit 14 (a second copy of the sign) cleared, each is an f16 equal to the e4m3 value
/// times `2^-8`, which `vcvtph2ps` widens exactly and one multiply by `2^8` restores.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn decode_e4m3_avx2(step: &[u32; 16], j: usize) -> [__m256; 2] {
    let bytes: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
    let b = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    let shifted = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b));
    let half = _mm256_and_si256(shifted, _mm256_set1_epi16(!0x4000));
    let scale = _mm256_set1_ps(256.0);
    [
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(half)), scale),
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256::<1>(half)), scale),
    ]
}

/// `part += w · x` over the 16 channels.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn fma16(part: &mut [__m256; 2], w: &[__m256; 2], x: __m256) {
    for h in 0..2 {
        part[h] = _mm256_fmadd_ps(x, w[h], part[h]);
    }
}

/// What the codes of a matrix are, for the AVX2 FMA body.
const INTEGER: u8 = 0;
/// See [`INTEGER`]: 4-bit e2m1 values (MXFP4).
const E2M1: u8 = 1;
/// See [`INTEGER`]: 8-bit e4m3 values (FP8).
const E4M3: u8 = 2;

/// Computes rows `m0..m0 + R` of panel `p` with `C` partial sums per vector (the AVX2 FMA
/// body; see the module docs).
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0 + R` of panel
///   `p`; `m0 + R ≤ job.m`, `job.x` holds `m·K` values; the codes are `BITS`-bit codes of
///   kind `KIND` ([`INTEGER`], [`E2M1`] with 4 bits, [`E4M3`] with 8).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const BITS: u32, const R: usize, const C: usize, const KIND: u8>(
    job: &Wna16Job<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
    let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let rows: [&[f32]; R] = std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
    // Magnitudes of the e2m1 codes 0..=7 (the sign is the code's top bit).
    let e2m1 = load8(E2M1_VALUES[..8].try_into().expect("8 values"));
    // The rows' accumulators live in memory: they change once per group, and in registers
    // they would crowd out the partial sums.
    let mut acc = [[0f32; PANEL]; R];
    for g in 0..ng {
        let (k0, k1) = (g * gs, k.min((g + 1) * gs));
        // `2^23 + z` per channel (z the zero point, or 8 and 128 when symmetric).
        let zeros = w.group_zeros(p, g);
        let offset: [__m256; 2] = std::array::from_fn(|h| {
            load8(&std::array::from_fn(|c| zeros[8 * h + c] + 8_388_608.0))
        });
        let mut part = [[[_mm256_setzero_ps(); 2]; R]; C];
        if BITS == 4 {
            // Group sizes are multiples of K_STEP, so `k0` starts a step.
            let (s0, s_full) = (k0 / K_STEP, k1 / K_STEP);
            for s in s0..s_full {
                let v = load_step_avx2(&steps[s]);
                let xs: [&[f32; K_STEP]; R] =
                    std::array::from_fn(|r| rows[r][s * K_STEP..][..K_STEP].try_into().unwrap());
                macro_rules! k_value {
                    ($j:literal) => {{
                        let wj = if KIND == E2M1 {
                            decode_e2m1_avx2::<{ 4 * $j }, { 28 - 4 * $j }>(&v, e2m1)
                        } else {
                            decode4_avx2::<{ 4 * $j }>(&v, &offset)
                        };
                        for r in 0..R {
                            fma16(&mut part[$j % C][r], &wj, _mm256_set1_ps(xs[r][$j]));
                        }
                    }};
                }
                k_value!(0);
                k_value!(1);
                k_value!(2);
                k_value!(3);
                k_value!(4);
                k_value!(5);
                k_value!(6);
                k_value!(7);
            }
            // The last step of K, when K is not a multiple of K_STEP.
            if s_full * K_STEP < k1 {
                let v = load_step_avx2(&steps[s_full]);
                for kk in s_full * K_STEP..k1 {
                    let wj = if KIND == E2M1 {
                        decode_e2m1_at_avx2(&v, kk % K_STEP, e2m1)
                    } else {
                        decode4_at_avx2(&v, kk % K_STEP, &offset)
                    };
                    for r in 0..R {
                        fma16(&mut part[0][r], &wj, _mm256_set1_ps(rows[r][kk]));
                    }
                }
            }
        } else {
            // Group sizes are multiples of 8, so `k0` starts a step.
            let (s0, s_full) = (k0 / K_STEP8, k1 / K_STEP8);
            for s in s0..s_full {
                let step = &steps[s];
                for j in 0..K_STEP8 {
                    let wj = if KIND == E4M3 {
                        decode_e4m3_avx2(step, j)
                    } else {
                        decode8_avx2(step, j, &offset)
                    };
                    for r in 0..R {
                        let x = _mm256_set1_ps(rows[r][s * K_STEP8 + j]);
                        fma16(&mut part[j % C][r], &wj, x);
                    }
                }
            }
            for kk in s_full * K_STEP8..k1 {
                let wj = if KIND == E4M3 {
                    decode_e4m3_avx2(&steps[s_full], kk % K_STEP8)
                } else {
                    decode8_avx2(&steps[s_full], kk % K_STEP8, &offset)
                };
                for r in 0..R {
                    fma16(&mut part[0][r], &wj, _mm256_set1_ps(rows[r][kk]));
                }
            }
        }
        let s = w.group_scales(p, g);
        let s: [__m256; 2] = std::array::from_fn(|h| load8(s[8 * h..][..8].try_into().unwrap()));
        for r in 0..R {
            for h in 0..2 {
                let mut sum = part[0][r][h];
                for chain in &part[1..] {
                    sum = _mm256_add_ps(sum, chain[r][h]);
                }
                let dst: &mut [f32; 8] = (&mut acc[r][8 * h..][..8]).try_into().unwrap();
                store8(dst, _mm256_fmadd_ps(sum, s[h], load8(dst)));
            }
        }
        // Keeps the accumulators in memory (see above) rather than promoted to registers.
        std::hint::black_box(&mut acc);
    }
    let bias = w.panel_bias(p);
    let valid = PANEL.min(w.n() - p * PANEL);
    for (r, row) in acc.iter_mut().enumerate() {
        if let Some(b) = bias {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b;
            }
        }
        let dst = job.out.wrapping_add((m0 + r) * w.n() + p * PANEL);
        // SAFETY: channels `16p..16p + valid` (< N) of row `m0 + r` are elements of the
        // caller's output owned by this panel alone (our contract); the local row does not
        // overlap them.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst, valid) };
    }
}

/// Walks the row tiles of `panels` with the AVX2 FMA body.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX2, FMA and F16C, for `BITS`-bit
///   codes of kind `KIND`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panels_fma<const BITS: u32, const KIND: u8>(job: &Wna16Job<'_>, panels: Range<usize>) {
    for p in panels {
        for rows in crate::ukernel::row_tiles(job.m, MR_AVX2) {
            let (m0, mr) = (rows.start, rows.len());
            let tile_fn: TileFn = match mr {
                1 => tile_avx2::<BITS, 1, 2, KIND>,
                2 => tile_avx2::<BITS, 2, 2, KIND>,
                3 => tile_avx2::<BITS, 3, 1, KIND>,
                _ => tile_avx2::<BITS, MR_AVX2, 1, KIND>,
            };
            // SAFETY: rows `m0..m0 + mr` lie within `0..m`, panel `p` is ours (caller), and the
            // caller's CPU has the features the tile needs.
            unsafe { tile_fn(job, p, m0) };
        }
    }
}

/// The AVX2 entry on CPUs with FMA and F16C: the FMA body for every kind of code.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX2, FMA and F16C.
pub(crate) unsafe fn panels_avx2_fma(job: &Wna16Job<'_>, range: Range<usize>) {
    let w = job.w;
    let walk: unsafe fn(&Wna16Job<'_>, Range<usize>) = match (w.bits(), w.values()) {
        _ if w.is_e4m3() => panels_fma::<8, E4M3>,
        (4, Int4Values::E2m1) => panels_fma::<4, E2M1>,
        (4, _) => panels_fma::<4, INTEGER>,
        _ => panels_fma::<8, INTEGER>,
    };
    // SAFETY: forwarded from the caller; the instance matches the weights' codes.
    unsafe { walk(job, range) }
}
