//! The AVX2 rung: the shared 256-bit bodies (`ymm.rs`) with `vpmaddubsw` + `vpmaddwd` dots.
//!
//! W4A8 takes the activations as `u8 = q + 128` and the weights as s8 in `[-8, 7]`, so each
//! `vpmaddubsw` pair sum is at most `2·255·8 = 4080` and the two groups of a step add up to
//! 8160: no i16 saturation. W8A8 weights reach ±128, where that path would saturate, so it keeps
//! the activations signed and uses `vpmaddubsw(|w|, sign(q, w))`: pair sums are at most
//! `2·128·127 = 32512` (activation codes are in `[-127, 127]`, which the driver checks).

use super::Avx2;

super::ymm::ymm_kernels!("avx2", Avx2, crate::Isa::Avx2);

/// W8A8 activations stay signed here, so no compensation.
const W8_OFFSET: i32 = 0;

/// `acc` plus the per-lane sums of two 4-byte `u8 × s8` groups (saturation-free, see above).
#[target_feature(enable = "avx2")]
#[inline]
fn w4_dot(acc: __m256i, a_lo: __m256i, w_lo: __m256i, a_hi: __m256i, w_hi: __m256i) -> __m256i {
    let pairs = _mm256_add_epi16(
        _mm256_maddubs_epi16(a_lo, w_lo),
        _mm256_maddubs_epi16(a_hi, w_hi),
    );
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// `acc` plus the per-lane `Σ q·w` of one 4-byte group of signed codes.
#[target_feature(enable = "avx2")]
#[inline]
fn w8_dot(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the AVX2 rung.",
    token: Avx2,
    isa: crate::Isa::Avx2,
    w4a8: U8Offset128,
    w8a8: I8,
}
