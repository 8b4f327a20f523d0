//! Activation quantisers for the x86 rungs, AVX-512 (16 lanes) and AVX2 (8 lanes), equal to
//! the scalar ones of `moe_quant::act` bit for bit: for the W4A8 driver the asymmetric per-row
//! quantisation of `quantize_row_asym_i8` (spec §4.2(a)), fused with the `q + 128` encoding the
//! x86 kernels read; for the W8A8 driver the symmetric one of `quantize_row_sym_i8` (spec §5.3
//! stage 0), fused with the encoding and the NaN scan of the W8A8 driver (its scalar
//! `f32::round` was 18 % of a Qwen3 M=1024 W8A8 profile).
//!
//! The asymmetric range pass uses `vminps`/`vmaxps` with the accumulator second, so a NaN
//! element leaves it unchanged, as `f32::min`/`f32::max` do in the scalar code; the symmetric
//! one takes the largest magnitude as the largest of the magnitudes' bit patterns. Codes are
//! `t + sign(p)` where `t = trunc(p)` and `|p − t| ≥ 0.5` (that difference is exact), i.e.
//! round half away from zero like `f32::round`; NaN products become code `zp` (0 for the
//! symmetric codes), like the scalar `as i32`. The row parameters (scale, zero point) are
//! computed with the same scalar f32 operations as in `moe_quant`, by one function for both
//! widths.

use std::arch::x86_64::*;

use moe_quant::act::AsymRowQuant;

#[cfg(test)]
use crate::dispatch::{AsymQuantU8Fn, SymQuantFn};
use crate::dispatch::{AsymRowU8, SymRowQuant};

/// Quantises `x`, writes `q + 128` into `dst[..x.len()]` and says whether the row held a NaN
/// (found in the range pass, so the driver reads the row's floats twice, not three times).
///
/// # Safety
/// - The CPU supports AVX-512 F (the caller holds an `Avx512Vnni` token).
pub(crate) unsafe fn quantize_row_asym_u8(x: &[f32], dst: &mut [u8]) -> AsymRowU8 {
    // SAFETY: forwarded from this function's contract.
    unsafe { quantize_row_asym_u8_avx512(x, dst) }
}

#[target_feature(enable = "avx512f")]
fn quantize_row_asym_u8_avx512(x: &[f32], dst: &mut [u8]) -> AsymRowU8 {
    let dst = &mut dst[..x.len()];
    let (chunks, tail) = x.as_chunks::<16>();
    let mut lo = _mm512_setzero_ps();
    let mut hi = _mm512_setzero_ps();
    let mut nan: __mmask16 = 0;
    for c in chunks {
        let v = load16(c);
        lo = _mm512_min_ps(v, lo);
        hi = _mm512_max_ps(v, hi);
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    }
    let (mut rmin, mut rmax) = (0.0f32, 0.0f32);
    for (&a, &b) in lanes(lo).iter().zip(&lanes(hi)) {
        rmin = rmin.min(a);
        rmax = rmax.max(b);
    }
    let mut has_nan = nan != 0;
    for &v in tail {
        rmin = rmin.min(v);
        rmax = rmax.max(v);
        has_nan |= v.is_nan();
    }
    let Some((s, zero_point)) = asym_params(rmin, rmax) else {
        return all_zero_row(dst, has_nan);
    };
    code_row(x, dst, |c: &[f32; 16], d| {
        store16(d, encode16(load16(c), s, zero_point))
    });
    let row = AsymRowQuant {
        recip: 1.0 / s,
        zero_point,
    };
    AsymRowU8 { row, has_nan }
}

/// Writes the codes of `x` into `dst[..x.len()]`, `N` values at a time with `code` (which
/// reads `N` floats and writes their `N` codes), the tail through a zero-padded chunk.
///
/// Always inlined into the quantisers, so `code`, a closure of theirs, inherits their target
/// features and is inlined too.
#[inline(always)]
fn code_row<const N: usize>(x: &[f32], dst: &mut [u8], code: impl Fn(&[f32; N], &mut [u8; N])) {
    let (chunks, tail) = x.as_chunks::<N>();
    let (d_chunks, d_tail) = dst[..x.len()].as_chunks_mut::<N>();
    for (c, d) in chunks.iter().zip(d_chunks) {
        code(c, d);
    }
    if !tail.is_empty() {
        let mut padded = [0f32; N];
        padded[..tail.len()].copy_from_slice(tail);
        let mut codes = [0u8; N];
        code(&padded, &mut codes);
        d_tail.copy_from_slice(&codes[..tail.len()]);
    }
}

/// The asymmetric row parameters `(s, zero_point)` of a row ranging over `[rmin, rmax]`, with
/// the scalar quantiser's f32 operations; `None` for the all-zero row.
fn asym_params(rmin: f32, rmax: f32) -> Option<(f32, i32)> {
    let s = if rmin == rmax {
        1.0
    } else {
        255.0 / (rmax - rmin)
    };
    if !(s.is_finite() && s > 0.0) {
        return None;
    }
    let dmin = rmin * s;
    let dmax = rmax * s;
    let zp_f = if (-128.0 + dmin) + (127.0 + dmax) > 0.0 {
        -128.0 - dmin
    } else {
        127.0 - dmax
    };
    Some((s, zp_f.clamp(-128.0, 127.0).round_ties_even() as i32))
}

/// The all-zero row of the scalar quantiser: every code 127, encoded 255.
fn all_zero_row(dst: &mut [u8], has_nan: bool) -> AsymRowU8 {
    dst.fill(255);
    let row = AsymRowQuant {
        recip: 1.0,
        zero_point: 127,
    };
    AsymRowU8 { row, has_nan }
}

/// The symmetric row parameters from the bit pattern of the largest magnitude of a row (NaNs
/// included, see [`quantize_row_sym_u8_avx512`]): `(amax, has_nan)`, `amax` with the scalar
/// quantiser's floor and its NaN-skipping fold when the row holds a NaN.
fn sym_amax(x: &[f32], bits: u32) -> (f32, bool) {
    let has_nan = bits > f32::INFINITY.to_bits();
    // With a NaN in the row, the scalar fold's `f32::max` skips it: so does this slow pass.
    let amax = if has_nan {
        x.iter().fold(0.0f32, |m, &v| m.max(v.abs()))
    } else {
        f32::from_bits(bits)
    };
    (amax.max(moe_quant::act::SYM_AMAX_FLOOR), has_nan)
}

/// Quantises `x` symmetrically, writes each code `q` as the byte `q as u8 ^ flip` into
/// `dst[..x.len()]` (`flip = 0x80` gives the `q + 128` the x86 W8A8 kernels read), and says
/// whether the row held a NaN, so the driver makes one pass over the row's floats for all
/// three.
///
/// # Safety
/// - The CPU supports AVX-512 F (the caller holds an `Avx512Vnni` token).
pub(crate) unsafe fn quantize_row_sym_u8(x: &[f32], dst: &mut [u8], flip: u8) -> SymRowQuant {
    // SAFETY: forwarded from this function's contract.
    unsafe { quantize_row_sym_u8_avx512(x, dst, flip) }
}

#[target_feature(enable = "avx512f")]
fn quantize_row_sym_u8_avx512(x: &[f32], dst: &mut [u8], flip: u8) -> SymRowQuant {
    let dst = &mut dst[..x.len()];
    let (chunks, tail) = x.as_chunks::<16>();
    // The largest magnitude as the largest of the magnitudes' bit patterns, which order like
    // their values for every non-NaN float (zeros, subnormals and infinities included), so the
    // pass is one AND and one integer max per vector; a NaN's pattern lies above infinity's.
    let magnitude = _mm512_set1_epi32(i32::MAX);
    let mut acc = _mm512_setzero_si512();
    for c in chunks {
        let bits = _mm512_castps_si512(load16(c));
        acc = _mm512_max_epu32(acc, _mm512_and_si512(bits, magnitude));
    }
    let mut bits = _mm512_reduce_max_epu32(acc);
    for &v in tail {
        bits = bits.max(v.to_bits() & i32::MAX as u32);
    }
    let (amax, has_nan) = sym_amax(x, bits);
    let inv_scale = 127.0 / amax;
    // The flip stays in a vector register: a per-byte `map` over the codes was most of the
    // quantiser's time.
    let flip = _mm_set1_epi8(flip as i8);
    code_row(x, dst, |c: &[f32; 16], d| {
        store16(d, _mm_xor_si128(sym_codes16(load16(c), inv_scale), flip));
    });
    SymRowQuant {
        scale: amax / 127.0,
        has_nan,
    }
}

/// `rna(p)` for every lane: `t + sign(p)` where `t = trunc(p)` and `|p − t| ≥ 0.5` (exact).
#[target_feature(enable = "avx512f")]
#[inline]
fn round_half_away(p: __m512) -> __m512 {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let away =
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(p, t)), _mm512_set1_ps(0.5));
    // `(p & sign bit) | 1.0` in one ternary logic op: ±1 with the sign of `p`.
    let unit = _mm512_ternarylogic_epi32::<0xEA>(
        _mm512_castps_si512(p),
        _mm512_set1_epi32(i32::MIN),
        _mm512_castps_si512(_mm512_set1_ps(1.0)),
    );
    _mm512_mask_add_ps(t, away, t, _mm512_castsi512_ps(unit))
}

/// 16 codes `clamp(rna(v·inv_scale), −127, 127)`, NaN products as 0 (the scalar `as i8`), as
/// bytes.
///
/// No clamp is needed: `inv_scale = 127 / amax` with `|v| ≤ amax` bounds every finite product
/// by `127·(1 + 2⁻²⁴)²`, below 127.5, and an infinite `v` makes `amax` infinite and
/// `inv_scale` zero, so its product is NaN. A NaN product converts to `i32::MIN`, whose low
/// byte, all that the truncating `vpmovdb` keeps, is 0.
#[target_feature(enable = "avx512f")]
#[inline]
fn sym_codes16(v: __m512, inv_scale: f32) -> __m128i {
    let p = _mm512_mul_ps(v, _mm512_set1_ps(inv_scale));
    _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(round_half_away(p)))
}

/// 16 codes `clamp(rna(v·s) + zp, −128, 127) + 128`, as bytes.
#[target_feature(enable = "avx512f")]
#[inline]
fn encode16(v: __m512, s: f32, zero_point: i32) -> __m128i {
    let p = _mm512_mul_ps(v, _mm512_set1_ps(s));
    let rounded = round_half_away(p);
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(p, p);
    let q = _mm512_mask_mov_epi32(_mm512_cvttps_epi32(rounded), nan, _mm512_setzero_si512());
    let q = _mm512_add_epi32(q, _mm512_set1_epi32(zero_point));
    let q = _mm512_min_epi32(
        _mm512_max_epi32(q, _mm512_set1_epi32(-128)),
        _mm512_set1_epi32(127),
    );
    let u = _mm512_add_epi32(q, _mm512_set1_epi32(128));
    _mm512_cvtepi32_epi8(u)
}

/// Stores 16 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
fn store16(dst: &mut [u8; 16], v: __m128i) {
    // SAFETY: `dst` holds 16 writable bytes, exactly what this unaligned store writes.
    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), v) };
}

/// Loads 16 f32.
#[target_feature(enable = "avx512f")]
#[inline]
fn load16(v: &[f32; 16]) -> __m512 {
    // SAFETY: the reference covers 16 readable f32; the load is unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// The 16 lanes of a vector.
#[target_feature(enable = "avx512f")]
#[inline]
fn lanes(v: __m512) -> [f32; 16] {
    let mut out = [0f32; 16];
    // SAFETY: `out` holds 16 f32, exactly what this unaligned store writes.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// [`quantize_row_asym_u8`] for CPUs with AVX2 (8 lanes), bit for bit the same.
///
/// # Safety
/// - The CPU supports AVX2.
pub(crate) unsafe fn quantize_row_asym_u8_avx2(x: &[f32], dst: &mut [u8]) -> AsymRowU8 {
    // SAFETY: forwarded from this function's contract.
    unsafe { asym_u8_avx2(x, dst) }
}

#[target_feature(enable = "avx2")]
fn asym_u8_avx2(x: &[f32], dst: &mut [u8]) -> AsymRowU8 {
    let dst = &mut dst[..x.len()];
    let (chunks, tail) = x.as_chunks::<8>();
    // `vminps`/`vmaxps` return their second operand when either is NaN, as in the AVX-512
    // pass; NaN lanes are collected as all-ones compare results.
    let (mut lo, mut hi, mut nan) = (
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
        _mm256_setzero_ps(),
    );
    for c in chunks {
        let v = load8(c);
        lo = _mm256_min_ps(v, lo);
        hi = _mm256_max_ps(v, hi);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    let (mut rmin, mut rmax) = (0.0f32, 0.0f32);
    for (&a, &b) in lanes8(lo).iter().zip(&lanes8(hi)) {
        rmin = rmin.min(a);
        rmax = rmax.max(b);
    }
    let mut has_nan = _mm256_movemask_ps(nan) != 0;
    for &v in tail {
        rmin = rmin.min(v);
        rmax = rmax.max(v);
        has_nan |= v.is_nan();
    }
    let Some((s, zero_point)) = asym_params(rmin, rmax) else {
        return all_zero_row(dst, has_nan);
    };
    code_row(x, dst, |c: &[f32; 8], d| {
        store8(d, encode8(load8(c), s, zero_point))
    });
    let row = AsymRowQuant {
        recip: 1.0 / s,
        zero_point,
    };
    AsymRowU8 { row, has_nan }
}

/// [`quantize_row_sym_u8`] for CPUs with AVX2 (8 lanes), bit for bit the same.
///
/// # Safety
/// - The CPU supports AVX2.
pub(crate) unsafe fn quantize_row_sym_u8_avx2(x: &[f32], dst: &mut [u8], flip: u8) -> SymRowQuant {
    // SAFETY: forwarded from this function's contract.
    unsafe { sym_u8_avx2(x, dst, flip) }
}

#[target_feature(enable = "avx2")]
fn sym_u8_avx2(x: &[f32], dst: &mut [u8], flip: u8) -> SymRowQuant {
    let dst = &mut dst[..x.len()];
    let (chunks, tail) = x.as_chunks::<8>();
    // The largest magnitude's bit pattern, as in the AVX-512 pass.
    let magnitude = _mm256_set1_epi32(i32::MAX);
    let mut acc = _mm256_setzero_si256();
    for c in chunks {
        let bits = _mm256_castps_si256(load8(c));
        acc = _mm256_max_epu32(acc, _mm256_and_si256(bits, magnitude));
    }
    let mut bits = lanes8(_mm256_castsi256_ps(acc))
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits()));
    for &v in tail {
        bits = bits.max(v.to_bits() & i32::MAX as u32);
    }
    let (amax, has_nan) = sym_amax(x, bits);
    let inv_scale = 127.0 / amax;
    let flip = _mm_set1_epi8(flip as i8);
    code_row(x, dst, |c: &[f32; 8], d| {
        store8(d, _mm_xor_si128(sym_codes8(load8(c), inv_scale), flip));
    });
    SymRowQuant {
        scale: amax / 127.0,
        has_nan,
    }
}

/// `rna(p)` for every lane, as [`round_half_away`].
#[target_feature(enable = "avx2")]
#[inline]
fn round_half_away8(p: __m256) -> __m256 {
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let frac = _mm256_and_ps(
        _mm256_sub_ps(p, t),
        _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX)),
    );
    let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    let sign = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN)));
    let unit = _mm256_or_ps(sign, _mm256_set1_ps(1.0));
    // `t + 0` where the lane rounds toward zero: the code is the same for `±0`.
    _mm256_add_ps(t, _mm256_and_ps(unit, away))
}

/// The low byte of each of the 8 lanes, in the low 8 bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn low_bytes8(v: __m256i) -> __m128i {
    let pick = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let bytes = _mm256_shuffle_epi8(v, pick);
    let joined = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    _mm256_castsi256_si128(joined)
}

/// 8 codes `clamp(rna(v·inv_scale), −127, 127)` as [`sym_codes16`] (no clamp needed, NaN
/// products truncated to byte 0), in the low 8 bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn sym_codes8(v: __m256, inv_scale: f32) -> __m128i {
    let p = _mm256_mul_ps(v, _mm256_set1_ps(inv_scale));
    low_bytes8(_mm256_cvttps_epi32(round_half_away8(p)))
}

/// 8 codes `clamp(rna(v·s) + zp, −128, 127) + 128` as [`encode16`], in the low 8 bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn encode8(v: __m256, s: f32, zero_point: i32) -> __m128i {
    let p = _mm256_mul_ps(v, _mm256_set1_ps(s));
    let ordered = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(p, p));
    let q = _mm256_and_si256(_mm256_cvttps_epi32(round_half_away8(p)), ordered);
    let q = _mm256_add_epi32(q, _mm256_set1_epi32(zero_point));
    let q = _mm256_min_epi32(
        _mm256_max_epi32(q, _mm256_set1_epi32(-128)),
        _mm256_set1_epi32(127),
    );
    low_bytes8(_mm256_add_epi32(q, _mm256_set1_epi32(128)))
}

/// Loads 8 f32.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn load8(v: &[f32; 8]) -> __m256 {
    // SAFETY: the reference covers 8 readable f32; the load is unaligned.
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// The 8 lanes of a vector.
#[target_feature(enable = "avx2")]
#[inline]
fn lanes8(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    // SAFETY: `out` holds 8 f32, exactly what this unaligned store writes.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// Stores the low 8 bytes.
#[target_feature(enable = "avx2")]
#[inline]
fn store8(dst: &mut [u8; 8], v: __m128i) {
    // SAFETY: `dst` holds 8 writable bytes, exactly what this 64-bit store writes.
    unsafe { _mm_storel_epi64(dst.as_mut_ptr().cast(), v) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_testutil::SplitMix64;

    /// Rows that exercise ties, NaN/Inf/zero rows and vector tails.
    fn test_rows() -> Vec<Vec<f32>> {
        let mut rng = SplitMix64::new(0xac7);
        let mut rows: Vec<Vec<f32>> = vec![
            vec![0.5, -1.0, 2.0, 0.25],
            vec![0.0; 37],
            vec![1.0; 16],
            vec![-3.0; 17],
            vec![f32::NAN, 1.0, -2.0, 0.5],
            vec![f32::NAN; 19],
            vec![f32::INFINITY, 1.0],
            vec![f32::NEG_INFINITY, 1.0, f32::NAN],
            vec![1e-40, -1e-40, 0.0],
            vec![],
            // Extremes of the magnitude pass: the largest finite values, negative zeros,
            // rows below the amax floor, an infinity after 16 finite values.
            vec![f32::MAX, -f32::MAX, 1.0, -0.0],
            vec![-0.0; 33],
            vec![3e-8, -7e-8, 1e-9, 5e-8],
            (0..40)
                .map(|i| if i == 20 { f32::NEG_INFINITY } else { i as f32 })
                .collect(),
        ];
        for len in [1usize, 15, 16, 17, 31, 33, 64, 100, 255, 2048] {
            rows.push((0..len).map(|_| rng.normal() * 4.0).collect());
            // Many exact .5 products: multiples of 1/(2s) with s = 255/range.
            let mut tie: Vec<f32> = (0..len)
                .map(|i| (i as f32 - len as f32 / 2.0) / 2.0)
                .collect();
            tie.push(255.0 / 2.0);
            tie.push(0.0);
            rows.push(tie);
            // Exact .5 products of the symmetric quantiser: amax 127 makes the factor 1.
            let mut sym_tie: Vec<f32> = (0..len).map(|i| (i % 254) as f32 - 126.5).collect();
            sym_tie.push(-127.0);
            rows.push(sym_tie);
        }
        rows
    }

    /// [`test_rows`] and two rows with a NaN among finite values, in a vector and in the tail.
    fn rows_with_nan_inside() -> Vec<Vec<f32>> {
        let mut rows = test_rows();
        let mut with_nan = vec![-3.0f32; 17];
        with_nan[5] = f32::NAN;
        rows.push(with_nan);
        let mut nan_in_tail = vec![0.25f32; 37];
        nan_in_tail[35] = f32::NAN;
        rows.push(nan_in_tail);
        let mut nan_and_inf = vec![2.5f32; 40];
        nan_and_inf[3] = f32::NAN;
        nan_and_inf[30] = f32::INFINITY;
        rows.push(nan_and_inf);
        rows
    }

    /// The quantisers this CPU can run: `(name, asymmetric, symmetric)`.
    fn quantisers() -> Vec<(&'static str, AsymQuantU8Fn, SymQuantFn)> {
        let mut sets: Vec<(&'static str, AsymQuantU8Fn, SymQuantFn)> = Vec::new();
        if super::super::Avx512Vnni::is_available() {
            sets.push(("avx512", quantize_row_asym_u8, quantize_row_sym_u8));
        }
        if super::super::Avx2::is_available() {
            sets.push(("avx2", quantize_row_asym_u8_avx2, quantize_row_sym_u8_avx2));
        }
        if sets.is_empty() {
            eprintln!("note: skipping the SIMD quantiser tests: no AVX2 on this CPU");
        }
        sets
    }

    #[test]
    fn asym_equals_moe_quant_exactly() {
        for (name, asym, _) in quantisers() {
            for row in rows_with_nan_inside() {
                let mut want_q = vec![0i8; row.len()];
                let want = moe_quant::act::quantize_row_asym_i8(&row, &mut want_q);
                let mut got = vec![0u8; row.len()];
                // SAFETY: `quantisers` lists only what this CPU runs.
                let r = unsafe { asym(&row, &mut got) };
                assert_eq!(r.has_nan, row.iter().any(|v| v.is_nan()), "{name}: {row:?}");
                let r = r.row;
                assert_eq!(r.zero_point, want.zero_point, "{name}: {row:?}");
                assert_eq!(r.recip.to_bits(), want.recip.to_bits(), "{name}: {row:?}");
                let got_q: Vec<i8> = got.iter().map(|&u| (u ^ 0x80) as i8).collect();
                assert_eq!(got_q, want_q, "{name}: {row:?}");
            }
        }
    }

    #[test]
    fn sym_equals_moe_quant_exactly() {
        for (name, _, sym) in quantisers() {
            for row in rows_with_nan_inside() {
                let mut want_q = vec![0i8; row.len()];
                let want = moe_quant::act::quantize_row_sym_i8(&row, &mut want_q);
                for flip in [0u8, 0x80] {
                    let mut got = vec![0u8; row.len()];
                    // SAFETY: `quantisers` lists only what this CPU runs.
                    let r = unsafe { sym(&row, &mut got, flip) };
                    assert_eq!(r.scale.to_bits(), want.to_bits(), "{name}: {row:?}");
                    assert_eq!(r.has_nan, row.iter().any(|v| v.is_nan()), "{name}: {row:?}");
                    let got_q: Vec<i8> = got.iter().map(|&u| (u ^ flip) as i8).collect();
                    assert_eq!(got_q, want_q, "{name}: flip {flip:#x}: {row:?}");
                }
            }
        }
    }
}
