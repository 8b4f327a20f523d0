//! The WNA16 (weight-only int4/int8, f32 compute) bodies of the x86 rungs, on the tile
//! scaffolding of `crate::wna16_tile`: this file keeps how each rung decodes codes, and the
//! helpers the bf16 and AMX paths share.
//!
//! AVX-512 ([`zmm`]): 8 rows × 16 channels, one vector per row. One 64-byte int4 step holds 8
//! K values of the panel's 16 channels, one channel per 32-bit lane (nibble `j` = K value
//! `8s + j`), so K value `j` is one `vpsrld` by `4j` and one `vpermps` from a 16-entry f32
//! table (which reads the low four bits of each lane): `c − 8` for symmetric weights, `c` for
//! asymmetric ones, whose per-group zero vector is then subtracted (`c − z` stays exact), the
//! e2m1 values for MXFP4 weights. Tiles of four rows or fewer keep two or four partial sums
//! per row. int8 weights: one step holds 4 K values as 16 consecutive channel bytes each; K
//! value `j` is one 16-byte load, `vpmovzxbd`, `vcvtdq2ps` and the subtraction of the zero
//! (128 when symmetric). e4m3 codes (FP8 weights) sign-extend to 16 bits instead
//! (`vpmovsxbw`) and shift left by 7, which puts the seven magnitude bits at bits 7..13 and
//! copies of the sign at bits 14 and 15; clearing bit 14 leaves an f16 equal to the e4m3 value
//! times `2^-8` (normal and subnormal codes alike, as f16's exponent field is one bit wider
//! with bias 15). `vcvtph2ps` widens it exactly and one multiply by `2^8` restores the value,
//! so no f32 subnormal is ever an operand.
//!
//! AVX2 with FMA and F16C ([`ymm`]): 4 rows × 16 channels, two 8-lane vectors per row. Nibble
//! `j` of a step is one shift and one AND; ORed into the exponent of `2^23`, it is the f32
//! `2^23 + c`, and one subtraction of `2^23 + z` (the zero point, 8 or 128 when symmetric)
//! leaves the exact `c − z`. int8 codes widen with `vpmovzxbd` and decode the same way. e2m1
//! codes take their magnitude from an 8-entry table (`vpermps` on the low three bits) and their
//! sign from the top bit; e4m3 codes go through f16 as in the AVX-512 body. CPUs with AVX2 but
//! no FMA or F16C run the portable body compiled with AVX2 enabled ([`panels_avx2`]), which
//! keeps the reference's separate multiply and add and equals it bit for bit.
//!
//! Both bodies fuse their multiply-adds, so they differ from the reference by a few units in
//! the last place of the magnitudes summed (within `1e-5·Σ|x·w|`; see `crate::wna16`).

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use half::{bf16, f16};

use crate::packed::wna16::Wna16ScaleValues;
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::Wna16Job;

/// How far ahead of the current step the tile prefetches weights into L1: every code byte
/// streams from DRAM once per call.
pub(crate) const PREFETCH_BYTES: usize = 4096;

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

/// Prefetches the line `PREFETCH_BYTES` past `step` into L1 (an SSE instruction, part of
/// every x86_64 CPU): weights that stream from DRAM once per call, here and in the AMX panel
/// fills, where a page-sized lead carries the stream across the 4 KiB boundaries at which the
/// hardware prefetcher stops.
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn prefetch_ahead<T>(step: &T) {
    // A prefetch is a hint that never faults, so an address past the weights is harmless.
    let ahead = (step as *const T).cast::<i8>().wrapping_add(PREFETCH_BYTES);
    _mm_prefetch::<_MM_HINT_T0>(ahead);
}

/// [`prefetch_ahead`], and the line twice as far ahead into L2, as the VNNI W4A8 tiles do:
/// for a body that reads one stream per tile and spends several cycles on each step, the
/// farther line keeps more of the stream in flight than the L1 misses alone allow. One core
/// reading a 14336 × 4096 matrix of int4 codes through the bf16 dot-product body took about a
/// fifth less time with it at one row and a little less at four; the AVX2 integer body, which
/// reads two streams and decodes each step in fewer cycles, took longer with it, so it keeps
/// [`prefetch_ahead`].
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn prefetch_ahead_into_l2<T>(step: &T) {
    // A prefetch is a hint that never faults, so an address past the weights is harmless.
    let far = (step as *const T)
        .cast::<i8>()
        .wrapping_add(2 * PREFETCH_BYTES);
    _mm_prefetch::<_MM_HINT_T1>(far);
    prefetch_ahead(step);
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

/// The AVX2 entry: the portable body vectorized over 256-bit registers.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn panels_avx2(job: &Wna16Job<'_>, range: Range<usize>) {
    crate::wna16::panels_body(job, range);
}

/// The AVX-512 f32 body: tiles of 8 rows × 16 channels, one 512-bit vector per row.
pub(crate) mod zmm {
    use std::arch::x86_64::*;

    use crate::packed::wna16::E2M1_VALUES;
    use crate::packed::{PANEL, PackedWna16};
    use crate::wna16_tile::{E2M1, E4M3};

    use super::{LUT_RAW, LUT_SYM, group_scales, load_f32, load_zeros, prefetch_ahead};

    /// 16 channels of f32.
    type Ch = __m512;

    /// A loaded int4 step: 16 channels' code words.
    type Step = __m512i;

    /// What decoding one group of a panel needs.
    struct GroupConsts {
        /// The group's zero points (asymmetric), or the symmetric offset of int8 codes.
        zero: __m512,
        /// The values of the 16 int4 codes.
        lut: __m512,
    }

    /// The decoding constants of group `g` of panel `p`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn group_consts<const KIND: u8, const ASYM: bool>(
        w: &PackedWna16,
        p: usize,
        g: usize,
        _first: usize,
    ) -> GroupConsts {
        let zero = match w.zeros() {
            Some(z) if ASYM => {
                let at = (p * w.n_groups() + g) * PANEL;
                load_zeros(z[at..at + PANEL].try_into().expect("16 zero points"))
            }
            _ => _mm512_set1_ps(f32::from(w.symmetric_zero())),
        };
        let lut = load_f32(match KIND {
            E2M1 => &E2M1_VALUES,
            _ if ASYM => &LUT_RAW,
            _ => &LUT_SYM,
        });
        GroupConsts { zero, lut }
    }

    /// All zeros.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn zero() -> Ch {
        _mm512_setzero_ps()
    }

    /// `a + b`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn add(a: Ch, b: Ch) -> Ch {
        _mm512_add_ps(a, b)
    }

    /// `part + w · x`, fused.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn fma(part: Ch, w: Ch, x: f32) -> Ch {
        _mm512_fmadd_ps(_mm512_set1_ps(x), w, part)
    }

    /// `part + w · xs[j]`, fused (a broadcast from memory).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn fma_at(part: Ch, w: Ch, xs: &[f32], j: usize) -> Ch {
        fma(part, w, xs[j])
    }

    /// Loads one step: 16 channels' 32-bit code words.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_step<const KIND: u8>(step: &[u32; PANEL], _first: usize) -> Step {
        super::load_step(step)
    }

    /// Decodes nibble `SHIFT / 4` of every lane through the group's table, less its zero
    /// points when asymmetric.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn decode4<const SHIFT: u32, const TOP: u32, const KIND: u8, const ASYM: bool>(
        v: &Step,
        gc: &GroupConsts,
    ) -> Ch {
        let w = _mm512_permutexvar_ps(_mm512_srli_epi32::<SHIFT>(*v), gc.lut);
        if ASYM { _mm512_sub_ps(w, gc.zero) } else { w }
    }

    /// [`decode4`] for a K value `j` known only at run time (the ragged end of K).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn decode4_at<const KIND: u8, const ASYM: bool>(v: &Step, j: usize, gc: &GroupConsts) -> Ch {
        let shift = _mm512_set1_epi32(4 * j as i32);
        let w = _mm512_permutexvar_ps(_mm512_srlv_epi32(*v, shift), gc.lut);
        if ASYM { _mm512_sub_ps(w, gc.zero) } else { w }
    }

    /// Decodes K value `j` of an 8-bit step: an integer less its zero, or an e4m3 value.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn decode8<const KIND: u8, const ASYM: bool>(
        step: &[u32; PANEL],
        j: usize,
        _first: usize,
        gc: &GroupConsts,
    ) -> Ch {
        if KIND == E4M3 {
            super::decode_e4m3(step, j)
        } else {
            super::decode8(step, j, gc.zero)
        }
    }

    /// The scales of group `g` of panel `p`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn load_scales(w: &PackedWna16, p: usize, g: usize, _first: usize) -> Ch {
        group_scales(w.scales(), (p * w.n_groups() + g) * PANEL)
    }

    /// A group's sum of e4m3 products: [`super::decode_e4m3`] yields the values themselves.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn e4m3_sum(sum: Ch) -> Ch {
        sum
    }

    /// `acc + sum · scales`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn scale_into(acc: &mut [f32; PANEL], sum: Ch, scales: Ch) {
        let v = _mm512_fmadd_ps(sum, scales, load_f32(acc));
        // SAFETY: the reference covers 16 writable f32, and the store is unaligned.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr(), v) };
    }

    crate::wna16_tile::wna16_f32_tiles! {
        features: "avx512f,avx512bw,avx512vl",
        lanes: 16,
        // 8 rows × 1 chain, or fewer rows × more chains, of partial sums leave room for the
        // table, the step, the decoded weights and the zero vector.
        mr: 8,
        rows: [1 => 4, 2 => 4, 3 => 2, 4 => 2, 5 => 1, 6 => 1, 7 => 1, 8 => 1],
    }
}

/// The AVX2 FMA body (CPUs with AVX2, FMA and F16C): tiles of 4 rows × 16 channels, two 8-lane
/// vectors per row.
pub(crate) mod ymm {
    use std::arch::x86_64::*;

    use half::{bf16, f16};

    use crate::packed::wna16::{E2M1_VALUES, Wna16ScaleValues};
    use crate::packed::{PANEL, PackedWna16};
    use crate::wna16_tile::{E2M1, E4M3};
    use crate::x86::actquant::load8;

    /// `2^23` as f32 bits: ORed with an integer below `2^23`, it makes the f32 `2^23 + i`.
    const MAGIC: i32 = 0x4B00_0000;

    /// 16 channels of f32, as two vectors of 8.
    type Ch = [__m256; 2];

    /// A loaded int4 step: 16 channels' code words as two vectors of 8.
    type Step = [__m256i; 2];

    /// What decoding one group of a panel needs.
    struct GroupConsts {
        /// `2^23 + z` per channel (z the zero point, or 8 and 128 when symmetric).
        offset: [__m256; 2],
        /// Magnitudes of the e2m1 codes 0..=7 (the sign is the code's top bit).
        e2m1: __m256,
    }

    /// The decoding constants of group `g` of panel `p`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn group_consts<const KIND: u8, const ASYM: bool>(
        w: &PackedWna16,
        p: usize,
        g: usize,
        _first: usize,
    ) -> GroupConsts {
        // Only asymmetric codes need the group's zero points; the others share one offset
        // (unused by e2m1 and e4m3 codes).
        let offset = if ASYM {
            let zeros = w.group_zeros(p, g);
            std::array::from_fn(|h| load8(&std::array::from_fn(|c| zeros[8 * h + c] + 8_388_608.0)))
        } else {
            [_mm256_set1_ps(8_388_608.0 + f32::from(w.symmetric_zero())); 2]
        };
        let e2m1 = load8(E2M1_VALUES[..8].try_into().expect("8 values"));
        GroupConsts { offset, e2m1 }
    }

    /// All zeros.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn zero() -> Ch {
        [_mm256_setzero_ps(); 2]
    }

    /// `a + b`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn add(a: Ch, b: Ch) -> Ch {
        [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
    }

    /// `part + w · x`, fused.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn fma(part: Ch, w: Ch, x: f32) -> Ch {
        let x = _mm256_set1_ps(x);
        [
            _mm256_fmadd_ps(x, w[0], part[0]),
            _mm256_fmadd_ps(x, w[1], part[1]),
        ]
    }

    /// `part + w · xs[j]`, fused (a broadcast from memory).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn fma_at(part: Ch, w: Ch, xs: &[f32], j: usize) -> Ch {
        fma(part, w, xs[j])
    }

    /// Loads one step's 16 code words.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn load_step<const KIND: u8>(step: &[u32; PANEL], _first: usize) -> Step {
        // SAFETY: each half covers 8 readable words (32 bytes), and the loads are unaligned.
        std::array::from_fn(|h| unsafe { _mm256_loadu_si256(step[8 * h..].as_ptr().cast()) })
    }

    /// Prefetches a page ahead like the integer bodies: this body now serves mostly e4m3
    /// codes, whose 8-bit steps stream twice the bytes per product of int4 ones, and there the
    /// hardware prefetchers alone fell behind the DRAM rate at one row.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn prefetch_ahead(step: &[u32; PANEL]) {
        super::prefetch_ahead(step)
    }

    /// `2^23 + c` as f32 less the group's offset: the exact `c − z`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn minus_offset(c: [__m256i; 2], gc: &GroupConsts) -> Ch {
        let magic = _mm256_set1_epi32(MAGIC);
        std::array::from_fn(|h| {
            let biased = _mm256_castsi256_ps(_mm256_or_si256(c[h], magic));
            _mm256_sub_ps(biased, gc.offset[h])
        })
    }

    /// The e2m1 values of the low nibbles of `low` (magnitude from the table on the low three
    /// bits) with the signs in bit 31 of `top`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn e2m1(low: [__m256i; 2], top: [__m256i; 2], gc: &GroupConsts) -> Ch {
        let sign_bit = _mm256_set1_epi32(i32::MIN);
        std::array::from_fn(|h| {
            let magnitude = _mm256_permutevar8x32_ps(gc.e2m1, low[h]);
            let sign = _mm256_and_si256(top[h], sign_bit);
            _mm256_xor_ps(magnitude, _mm256_castsi256_ps(sign))
        })
    }

    /// Decodes nibble `SHIFT / 4` (`TOP = 28 − SHIFT`) of both halves of a step: one shift and
    /// an AND, then `2^23 + c − offset` for integers, or the e2m1 table and sign.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn decode4<const SHIFT: i32, const TOP: i32, const KIND: u8, const ASYM: bool>(
        v: &Step,
        gc: &GroupConsts,
    ) -> Ch {
        let low = v.map(|v| _mm256_srli_epi32::<SHIFT>(v));
        if KIND == E2M1 {
            e2m1(low, v.map(|v| _mm256_slli_epi32::<TOP>(v)), gc)
        } else {
            let mask = _mm256_set1_epi32(0xF);
            minus_offset(low.map(|v| _mm256_and_si256(v, mask)), gc)
        }
    }

    /// [`decode4`] for a K value `j` known only at run time (the ragged end of K).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn decode4_at<const KIND: u8, const ASYM: bool>(v: &Step, j: usize, gc: &GroupConsts) -> Ch {
        let right = _mm_cvtsi32_si128(4 * j as i32);
        let low = v.map(|v| _mm256_srl_epi32(v, right));
        if KIND == E2M1 {
            let left = _mm_cvtsi32_si128(28 - 4 * j as i32);
            e2m1(low, v.map(|v| _mm256_sll_epi32(v, left)), gc)
        } else {
            let mask = _mm256_set1_epi32(0xF);
            minus_offset(low.map(|v| _mm256_and_si256(v, mask)), gc)
        }
    }

    /// Decodes K value `j` of an 8-bit step (16 consecutive channel bytes): an integer less
    /// its offset, or an e4m3 value times `2^-8` through f16 as [`super::decode_e4m3`] does
    /// with 512-bit registers (sign-extended to 16 bits and shifted left by 7, bit 14 cleared:
    /// an f16 that `vcvtph2ps` widens exactly). The `2^8` is restored once per group sum
    /// ([`e4m3_sum`]), not per value: two multiplies of the decode's nine operations.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    fn decode8<const KIND: u8, const ASYM: bool>(
        step: &[u32; PANEL],
        j: usize,
        _first: usize,
        gc: &GroupConsts,
    ) -> Ch {
        if KIND == E4M3 {
            let bytes: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
            // SAFETY: the reference covers 16 readable bytes, and the load is unaligned.
            let b = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
            let shifted = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b));
            let half = _mm256_and_si256(shifted, _mm256_set1_epi16(!0x4000));
            [
                _mm256_cvtph_ps(_mm256_castsi256_si128(half)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(half)),
            ]
        } else {
            let codes = std::array::from_fn(|h| {
                let bytes: &[u32; 2] = step[4 * j + 2 * h..][..2].try_into().expect("8 bytes");
                // SAFETY: the reference covers 8 readable bytes, and the load is unaligned.
                _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) })
            });
            minus_offset(codes, gc)
        }
    }

    /// 16 two-byte values (`f16` or `bf16` scales) as two halves of 8.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn load_u16_halves<T>(v: &[T; PANEL]) -> [__m128i; 2] {
        debug_assert_eq!(size_of::<T>(), 2);
        // SAFETY: callers pass 16 two-byte elements, 32 readable bytes; the load is unaligned.
        let raw = unsafe { _mm256_loadu_si256(v.as_ptr().cast()) };
        [
            _mm256_castsi256_si128(raw),
            _mm256_extracti128_si256::<1>(raw),
        ]
    }

    /// The scales of group `g` of panel `p`, widened to f32 in registers (exactly), as the
    /// AVX-512 body's `group_scales` does with 512-bit ones.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) fn load_scales(w: &PackedWna16, p: usize, g: usize, _first: usize) -> Ch {
        let at = (p * w.n_groups() + g) * PANEL;
        match w.scales() {
            Wna16ScaleValues::F16(v) => {
                let v: &[f16; PANEL] = v[at..at + PANEL].try_into().expect("16 scales");
                load_u16_halves(v).map(|h| _mm256_cvtph_ps(h))
            }
            Wna16ScaleValues::Bf16(v) => {
                let v: &[bf16; PANEL] = v[at..at + PANEL].try_into().expect("16 scales");
                load_u16_halves(v)
                    .map(|h| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))))
            }
            Wna16ScaleValues::F32(v) => {
                std::array::from_fn(|h| load8(v[at + 8 * h..][..8].try_into().expect("8 scales")))
            }
            Wna16ScaleValues::E8m0(v) => {
                let subnormal = _mm256_set1_ps(f32::from_bits(0x0040_0000));
                std::array::from_fn(|h| {
                    let bytes: &[u8; 8] = v[at + 8 * h..][..8].try_into().expect("8 scales");
                    // SAFETY: the reference covers 8 readable bytes, and the load is unaligned.
                    let e = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(bytes.as_ptr().cast()) });
                    // `e << 23` is the f32 `2^(e − 127)` for e ≥ 1; e = 0 is the subnormal 2^-127.
                    let pow = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
                    let zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
                    _mm256_blendv_ps(pow, subnormal, zero)
                })
            }
        }
    }

    /// A group's sum of e4m3 products from [`decode8`]'s values times `2^-8`, times `2^8`:
    /// exact (a power of two), so the sum is the one of the values themselves up to the
    /// products' roundings.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn e4m3_sum(sum: Ch) -> Ch {
        let restore = _mm256_set1_ps(256.0);
        sum.map(|h| _mm256_mul_ps(h, restore))
    }

    /// `acc + sum · scales`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn scale_into(acc: &mut [f32; PANEL], sum: Ch, scales: Ch) {
        for h in 0..2 {
            let dst: &mut [f32; 8] = (&mut acc[8 * h..][..8]).try_into().expect("8 sums");
            let v = _mm256_fmadd_ps(sum[h], scales[h], load8(dst));
            // SAFETY: the reference covers 8 writable f32, and the store is unaligned.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) };
        }
    }

    crate::wna16_tile::wna16_f32_tiles! {
        features: "avx2,fma,f16c",
        lanes: 16,
        // 8 partial sums (two vectors per row), the decoded weights, the broadcast activation
        // and the decoding constants fit the 16 registers.
        mr: 4,
        rows: [1 => 2, 2 => 2, 3 => 1, 4 => 1],
    }
}
