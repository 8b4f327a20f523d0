//! AVX-512 activation quantisers, equal to the scalar ones of `moe_quant::act` bit for bit:
//! for the W4A8 driver the asymmetric per-row quantisation of `quantize_row_asym_i8`
//! (spec §4.2(a)), fused with the `q + 128` encoding the x86 kernels read; for the W8A8 driver
//! the symmetric one of `quantize_row_sym_i8` (spec §5.3 stage 0), fused with the encoding and
//! the NaN scan of the W8A8 driver (its scalar `f32::round` was 18 % of a Qwen3 M=1024 W8A8
//! profile).
//!
//! The range pass uses `vminps`/`vmaxps` with the accumulator second, so a NaN element leaves it
//! unchanged, as `f32::min`/`f32::max` do in the scalar code. Codes are `t + sign(p)` where
//! `t = trunc(p)` and `|p − t| ≥ 0.5` (that difference is exact), i.e. round half away from
//! zero like `f32::round`; NaN products become code `zp`, like the scalar `as i32`. The row
//! parameters (scale, zero point) are computed with the same scalar f32 operations as in
//! `moe_quant`.

use std::arch::x86_64::*;

use moe_quant::act::AsymRowQuant;

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
    let s = if rmin == rmax {
        1.0
    } else {
        255.0 / (rmax - rmin)
    };
    if !(s.is_finite() && s > 0.0) {
        // The all-zero row of the scalar quantiser: every code 127, encoded 255.
        dst.fill(255);
        let row = AsymRowQuant {
            recip: 1.0,
            zero_point: 127,
        };
        return AsymRowU8 { row, has_nan };
    }
    let dmin = rmin * s;
    let dmax = rmax * s;
    let zp_f = if (-128.0 + dmin) + (127.0 + dmax) > 0.0 {
        -128.0 - dmin
    } else {
        127.0 - dmax
    };
    let zero_point = zp_f.clamp(-128.0, 127.0).round_ties_even() as i32;

    let (dst_chunks, dst_tail) = dst.as_chunks_mut::<16>();
    for (c, d) in chunks.iter().zip(dst_chunks) {
        store16(d, encode16(load16(c), s, zero_point));
    }
    if !tail.is_empty() {
        let mut padded = [0f32; 16];
        padded[..tail.len()].copy_from_slice(tail);
        let mut codes = [0u8; 16];
        store16(&mut codes, encode16(load16(&padded), s, zero_point));
        dst_tail.copy_from_slice(&codes[..tail.len()]);
    }
    let row = AsymRowQuant {
        recip: 1.0 / s,
        zero_point,
    };
    AsymRowU8 { row, has_nan }
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
    let has_nan = bits > f32::INFINITY.to_bits();
    // With a NaN in the row, the scalar fold's `f32::max` skips it: so does this slow pass.
    let amax = if has_nan {
        x.iter().fold(0.0f32, |m, &v| m.max(v.abs()))
    } else {
        f32::from_bits(bits)
    };
    let amax = amax.max(moe_quant::act::SYM_AMAX_FLOOR);
    let inv_scale = 127.0 / amax;
    // The flip stays in a vector register: a per-byte `map` over the codes was most of the
    // quantiser's time.
    let flip = _mm_set1_epi8(flip as i8);
    let (d_chunks, d_tail) = dst.as_chunks_mut::<16>();
    for (c, d) in chunks.iter().zip(d_chunks) {
        store16(d, _mm_xor_si128(sym_codes16(load16(c), inv_scale), flip));
    }
    if !tail.is_empty() {
        let mut padded = [0f32; 16];
        padded[..tail.len()].copy_from_slice(tail);
        let mut codes = [0u8; 16];
        store16(
            &mut codes,
            _mm_xor_si128(sym_codes16(load16(&padded), inv_scale), flip),
        );
        d_tail.copy_from_slice(&codes[..tail.len()]);
    }
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

    #[test]
    fn asym_equals_moe_quant_exactly() {
        if !super::super::Avx512Vnni::is_available() {
            eprintln!("note: skipping the AVX-512 quantiser test: no AVX-512 on this CPU");
            return;
        }
        for row in rows_with_nan_inside() {
            let mut want_q = vec![0i8; row.len()];
            let want = moe_quant::act::quantize_row_asym_i8(&row, &mut want_q);
            let mut got = vec![0u8; row.len()];
            // SAFETY: AVX-512 was detected above.
            let r = unsafe { quantize_row_asym_u8(&row, &mut got) };
            assert_eq!(r.has_nan, row.iter().any(|v| v.is_nan()), "{row:?}");
            let r = r.row;
            assert_eq!(r.zero_point, want.zero_point, "{row:?}");
            assert_eq!(r.recip.to_bits(), want.recip.to_bits(), "{row:?}");
            let got_q: Vec<i8> = got.iter().map(|&u| (u ^ 0x80) as i8).collect();
            assert_eq!(got_q, want_q, "{row:?}");
        }
    }

    #[test]
    fn sym_equals_moe_quant_exactly() {
        if !super::super::Avx512Vnni::is_available() {
            eprintln!("note: skipping the AVX-512 quantiser test: no AVX-512 on this CPU");
            return;
        }
        for row in rows_with_nan_inside() {
            let mut want_q = vec![0i8; row.len()];
            let want = moe_quant::act::quantize_row_sym_i8(&row, &mut want_q);
            for flip in [0u8, 0x80] {
                let mut got = vec![0u8; row.len()];
                // SAFETY: AVX-512 was detected above.
                let r = unsafe { quantize_row_sym_u8(&row, &mut got, flip) };
                assert_eq!(r.scale.to_bits(), want.to_bits(), "{row:?}");
                assert_eq!(r.has_nan, row.iter().any(|v| v.is_nan()), "{row:?}");
                let got_q: Vec<i8> = got.iter().map(|&u| (u ^ flip) as i8).collect();
                assert_eq!(got_q, want_q, "flip {flip:#x}: {row:?}");
            }
        }
    }
}
