//! The AVX2 rung: the shared 256-bit W8A8 body (`ymm.rs`) with `vpmaddubsw` + `vpmaddwd` dots,
//! and a W4A8 body of its own that sums its products in 16-bit lanes.
//!
//! W4A8 takes the weight codes `c = w + 8` (`0..=15`, the stored nibbles) as `vpmaddubsw`'s
//! unsigned operand and the raw activation codes as its signed one
//! ([`crate::ukernel::ActEncoding::I8BlockCorrected`]). A pair sum is then at most
//! `2·15·128 = 3840` in magnitude, and the sums of [`WIDEN_STEPS`] steps of one 16-bit lane
//! (16 products) at most 30720: they stay in 16 bits, exact, and one `vpmaddwd` with ones per
//! four steps widens them to 32 bits. Against multiplying `q + 128` by `w` (a widening
//! `vpmaddwd` per step, and the block's weight sums from a virtual row of ones), that is 2.25
//! multiplier instructions per 64 products instead of 3, the weight sums are byte adds, and
//! the step unpacks with two ANDs and a shift.
//!
//! W8A8 weights reach ±128, where `vpmaddubsw` would saturate, so it keeps the activations
//! signed and uses `vpmaddubsw(|w|, sign(q, w))`: pair sums are at most `2·128·127 = 32512`
//! (activation codes are in `[-127, 127]`, which the driver checks).

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use super::Avx2;
use super::wna16::prefetch_ahead;
use crate::gemm::paired_blocks;

super::ymm::ymm_kernels!("avx2", Avx2, crate::Isa::Avx2);

/// W8A8 activations stay signed here, so no compensation.
const W8_OFFSET: i32 = 0;

/// `acc` plus the per-lane `Σ q·w` of one 4-byte group of signed codes.
#[target_feature(enable = "avx2")]
#[inline]
fn w8_dot(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Steps whose products one 16-bit lane sums before they are widened: each step adds four
/// products of at most `15·128` in magnitude, so four steps stay below `2^15`.
const WIDEN_STEPS: usize = 4;

/// The 16-bit sums of one group of at most [`WIDEN_STEPS`] steps.
struct NarrowSums<const R: usize> {
    /// Per row and half of the panel (8 channels): the 16-bit lanes of `Σ q·c`, two per
    /// channel.
    products: [[__m256i; 2]; R],
    /// Per half: the bytes of `Σ c` over the group, four per channel (at most `4·30 = 120`).
    codes: [__m256i; 2],
}

/// Sums the products of the steps `group` (at most [`WIDEN_STEPS`]) in 16-bit lanes, with
/// `rows[r][i]` the activations of step `first + i` of row `r`.
#[target_feature(enable = "avx2")]
#[inline]
fn narrow_sums<const R: usize>(
    group: &[[u8; 64]],
    rows: &[&[[u8; 8]]; R],
    first: usize,
) -> NarrowSums<R> {
    debug_assert!(group.len() <= WIDEN_STEPS);
    let mask = _mm256_set1_epi8(0x0F);
    let mut sums = NarrowSums {
        products: [[_mm256_setzero_si256(); 2]; R],
        codes: [_mm256_setzero_si256(); 2],
    };
    for (i, step) in group.iter().enumerate() {
        prefetch_ahead(step);
        let halves = step.as_chunks::<32>().0;
        let mut lo = [_mm256_setzero_si256(); 2];
        let mut hi = [_mm256_setzero_si256(); 2];
        for j in 0..2 {
            let v = load_bytes(&halves[j]);
            lo[j] = _mm256_and_si256(v, mask);
            hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
            sums.codes[j] = _mm256_add_epi8(sums.codes[j], _mm256_add_epi8(lo[j], hi[j]));
        }
        for r in 0..R {
            let a = &rows[r][first + i];
            let a_lo = _mm256_set1_epi32(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
            let a_hi = _mm256_set1_epi32(i32::from_le_bytes([a[4], a[5], a[6], a[7]]));
            for j in 0..2 {
                let pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo[j], a_lo),
                    _mm256_maddubs_epi16(hi[j], a_hi),
                );
                sums.products[r][j] = _mm256_add_epi16(sums.products[r][j], pairs);
            }
        }
    }
    sums
}

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// Per block, `acc_i = Σ q·c − zp·Σc − κ` with `κ = 8·Σ_{k∈b}(q_k − zp)` from the driver. How
/// the corrections come off depends on the block length `B`, as in the AVX-512 VNNI body:
/// - `255·B < 2^15` (groups up to 128): one `vpmaddwd` per row and half, of the code sums
///   held as the i16 pairs `(Σc, 8)` with the driver's word `(−zp, −κ/8)` of the row
///   ([`W4A8Job::block_words`]);
/// - `15·B < 2^15`: `κ` by a subtraction, `zp·Σc` by a `vpmaddwd` of `(Σc, 0)` with `(−zp, 0)`;
/// - longer blocks (channelwise scales): a subtraction and a 32-bit multiply.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]); `job.block_corr` holds `m·n_blocks` values.
#[target_feature(enable = "avx2")]
unsafe fn w4a8_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    let mut acc_f = [[_mm256_setzero_ps(); R]; 2];
    // SAFETY: our contract.
    unsafe { w4a8_blocks::<R, ACC>(job, p, m0, &mut acc_f) };
    if let W4A8Out::Values { ptr, ld } = job.out {
        let mut sums = [[_mm256_setzero_ps(); 2]; R];
        for r in 0..R {
            sums[r] = [acc_f[0][r], acc_f[1][r]];
        }
        // SAFETY: our contract.
        unsafe { store_w4a8_rows::<R>(job, p, m0, &sums, ptr, ld) };
    }
}

/// The scale blocks of [`w4a8_tile`]: their sums added to `acc_f[h]` for the panel's halves
/// `h` (or, with `ACC`, the block accumulators written to the job's buffer).
///
/// # Safety
/// - As [`w4a8_tile`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn w4a8_blocks<const R: usize, const ACC: bool>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
    acc_f: &mut [[__m256; R]; 2],
) {
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let nibbles = w.panel_nibbles(p);
    let (weight_steps, _) = nibbles.as_chunks::<64>();
    let mut row_steps: [&[[u8; 8]]; R] = [&[]; R];
    let mut row_kappa: [&[i32]; R] = [&[]; R];
    let mut zp = [0i32; R];
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0;
        row_kappa[r] = &job.block_corr[(m0 + r) * n_blocks..][..n_blocks];
        zp[r] = job.row_corr[m0 + r];
    }
    let short_blocks = w.block_len() * 15 < 1 << 15;
    let paired = paired_blocks(w.block_len());
    let ones16 = _mm256_set1_epi16(1);
    let ones8 = _mm256_set1_epi8(1);
    // Read once: the stores below could otherwise alias the job for the compiler.
    let block_acc = match job.out {
        W4A8Out::BlockAcc { ptr } if ACC => Some(ptr),
        _ => None,
    };
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        let mut a_block: [&[[u8; 8]]; R] = [&[]; R];
        for r in 0..R {
            a_block[r] = &row_steps[r][steps.clone()];
            assert_eq!(a_block[r].len(), w_block.len());
        }
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        // In the paired form each 32-bit lane holds `(Σc, 8)`: `Σc < 2^15` stays in the low
        // half.
        let mut code_sum = [_mm256_set1_epi32(if paired { 8 << 16 } else { 0 }); 2];
        let (groups, rest) = w_block.as_chunks::<WIDEN_STEPS>();
        let tail = (!rest.is_empty()).then_some(rest);
        for (g, group) in groups.iter().map(|g| &g[..]).chain(tail).enumerate() {
            let sums = narrow_sums::<R>(group, &a_block, g * WIDEN_STEPS);
            for j in 0..2 {
                let codes = _mm256_maddubs_epi16(sums.codes[j], ones8);
                code_sum[j] = _mm256_add_epi32(code_sum[j], _mm256_madd_epi16(codes, ones16));
                for r in 0..R {
                    let wide = _mm256_madd_epi16(sums.products[r][j], ones16);
                    acc[r][j] = _mm256_add_epi32(acc[r][j], wide);
                }
            }
        }
        let scales = w.block_scales(p, b);
        // The driver's paired words of this block, side by side for the tile's rows.
        let words: &[i32; R] = if paired {
            job.paired_words::<R>(b, m0)
        } else {
            &[0; R]
        };
        for r in 0..R {
            let kappa = row_kappa[r][b];
            let neg_zp_lo = zp[r].wrapping_neg() & 0xFFFF;
            for h in 0..2 {
                let acc_i = if paired {
                    let corr = _mm256_madd_epi16(code_sum[h], _mm256_set1_epi32(words[r]));
                    _mm256_add_epi32(acc[r][h], corr)
                } else if short_blocks {
                    let corr = _mm256_madd_epi16(code_sum[h], _mm256_set1_epi32(neg_zp_lo));
                    let acc = _mm256_sub_epi32(acc[r][h], _mm256_set1_epi32(kappa));
                    _mm256_add_epi32(acc, corr)
                } else {
                    let acc = _mm256_sub_epi32(acc[r][h], _mm256_set1_epi32(kappa));
                    let zp_sum = _mm256_mullo_epi32(_mm256_set1_epi32(zp[r]), code_sum[h]);
                    _mm256_sub_epi32(acc, zp_sum)
                };
                if let Some(ptr) = block_acc {
                    let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + p * PANEL + 8 * h;
                    // SAFETY: the driver sized the accumulator buffer `[m][n_blocks][n_pad]`;
                    // these 8 channels of row `m0 + r` belong to this call alone.
                    unsafe { _mm256_storeu_si256(ptr.wrapping_add(at).cast(), acc_i) };
                } else {
                    let sc = load_f32(scales[8 * h..][..8].try_into().unwrap());
                    let term = _mm256_mul_ps(_mm256_cvtepi32_ps(acc_i), sc);
                    acc_f[h][r] = _mm256_add_ps(acc_f[h][r], term);
                }
            }
        }
    }
}

crate::ukernel::impl_microkernels! {
    token: Avx2,
    features: "avx2",
    mr: MR,
    rows: [1 2 3 4],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the AVX2 rung.",
    token: Avx2,
    isa: crate::Isa::Avx2,
    w4a8: I8BlockCorrected,
    w8a8: I8,
}
