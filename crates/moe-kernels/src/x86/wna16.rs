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
//! AVX2: the portable body compiled with AVX2 enabled; it keeps the reference's separate
//! multiply and add, so its results equal the scalar reference bit for bit.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use half::{bf16, f16};

use crate::packed::wna16::{E2M1_VALUES, Int4Values, K_STEP, K_STEP8, Wna16ScaleValues};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::Wna16Job;

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
