//! AVX-512 VNNI microkernels: `vpdpbusd` accumulators per row, 8 rows × 16 channels for W4A8
//! (two per row up to 3 rows; calls of up to 4 rows with K of 4096 or more take 4 rows × 32
//! channels, two panels read as two streams) and 8 rows × 32 channels for W8A8 (one per row
//! and panel; a lone last panel takes a 16-channel tile).
//!
//! W4A8: each 64-byte packed step yields two u8 vectors of weight codes `c = w + 8` (low
//! nibbles: K values 0..4 of the step, high nibbles: 4..8); each row broadcasts its matching 4
//! raw (signed) activation codes. The block's code sums `Σc` come from one more `vpdpbusd` per
//! step, of the byte sums `lo + hi` with a vector of ones, shared by all rows of the tile.
//! After a scale block, `acc_i = Σ q·c − zp·Σc − κ` is exact (see [`w4a8_tile`]) and the f32
//! epilogue runs in the reference order (no FMA), so outputs equal the scalar reference bit for
//! bit.
//! W8A8: activations as `u8 = q + 128`, weights s8, one weight vector per 4 K values;
//! `acc − 128·Σw` is `Σ q·w` exactly.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::Avx512Vnni;
use crate::gemm::paired_blocks;
use crate::packed::PANEL;
use crate::ukernel::{W4A8Job, W4A8Out, W8A8Job};

/// Rows per tile.
const MR: usize = 8;

/// Tiles of at most this many rows keep two accumulators per row (see [`w4a8_tile`]).
const SPLIT_MAX_ROWS: usize = 3;

/// Loads 64 bytes.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_bytes(bytes: &[u8; 64]) -> __m512i {
    // SAFETY: the reference covers 64 readable bytes, and the load is unaligned.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
}

/// Loads 16 i32.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_i32(v: &[i32; 16]) -> __m512i {
    // SAFETY: the reference covers 64 readable bytes, and the load is unaligned.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// Loads 16 f32.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_f32(v: &[f32; 16]) -> __m512 {
    // SAFETY: the reference covers 16 readable f32, and the load is unaligned.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// How far ahead of the current 64-byte weight step the tiles prefetch into L1, and (twice as
/// far) into L2: weights stream from DRAM once per call, and the hardware prefetcher alone
/// leaves the core waiting on them when a step carries few rows of work. Measured on an
/// Intel core with AVX-512 VNNI (interleaved A/B, 2 threads, `moe bench`, M = 1 and 16 on the three
/// standard shapes): no software prefetch is 1.35-1.55x slower, 1 KiB 1.15x; 4 KiB into L1
/// plus 8 KiB into L2 was the best or equal best of 4 and 8 KiB into L1, 4, 8 and 16 KiB into
/// L2 (Mixtral M=1 6.9-7.1 ms against 7.3-7.7 for 4 KiB into L1 alone). On an AMD core with AVX-512, 4 KiB
/// into L1 beat 1 KiB and none.
const PREFETCH_BYTES: usize = 4096;

/// The W8A8 tile's distance: one weight byte per MAC consumes its stream twice as fast as
/// W4A8's nibbles, so the same lead in time is twice the bytes. Measured on an AMD core
/// with AVX-512 (`moe bench --format w8a8`, 2 threads, binaries alternating): Qwen3 M=256 6-10 % faster
/// than with 4 KiB in four paired runs, 16 KiB no better, M=1 and Mixtral within noise.
const W8A8_PREFETCH_BYTES: usize = 2 * PREFETCH_BYTES;

/// Prefetches the line `PREFETCH_BYTES` past `step` into L1 and the one `2·PREFETCH_BYTES`
/// past it into L2.
#[target_feature(enable = "avx512f")]
#[inline]
fn prefetch_ahead<T>(step: &T) {
    prefetch_at::<PREFETCH_BYTES, T>(step);
}

/// [`prefetch_ahead`] at `BYTES` ahead (L1) and twice that (L2).
#[target_feature(enable = "avx512f")]
#[inline]
fn prefetch_at<const BYTES: usize, T>(step: &T) {
    let ahead = (step as *const T).cast::<i8>().wrapping_add(BYTES);
    // A prefetch is a hint that never faults, so an address past the weights is harmless.
    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(BYTES));
    _mm_prefetch::<_MM_HINT_T0>(ahead);
}

/// `vpdpwssd`: `acc` plus, in each 32-bit lane, the sum of the products of the two i16 halves
/// of `a` and `b`, low with low and high with high.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
pub(super) fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: `vpdpwssd` reads and writes registers only; the enabled features include
    // AVX-512 VNNI.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
///
/// The weight codes `c = w + 8` (nibbles, `0..=15`) are `vpdpbusd`'s unsigned operand and the
/// raw activation codes its signed one ([`crate::ukernel::ActEncoding::I8BlockCorrected`]), so a
/// step unpacks with two ANDs and a shift and nothing else. Per block,
/// `acc_i = Σ q·c − zp·Σc − κ`, with `Σc` from one more `vpdpbusd` per step shared by all
/// rows and `κ = 8·Σ_{k∈b}(q_k − zp)` from the driver. How the two corrections come off
/// depends on the block length `B`:
/// - `255·B < 2^15` (groups up to 128): in one `vpdpwssd` per row. The code-sum lanes start
///   at `8·2^16`, so each holds the i16 pair `(Σc, 8)`; the row's operand is the driver's
///   word `(−zp, −κ/8)` ([`W4A8Job::block_words`]), both i16 because `|q − zp| ≤ 255`. Their
///   pair product is `−zp·Σc − κ`.
/// - `15·B < 2^15`: `κ` by a subtraction, `zp·Σc` by a `vpdpwssd` of the pair `(Σc, 0)` with
///   `(−zp, 0)`.
/// - longer blocks (channelwise scales): a subtraction and a 32-bit multiply.
///
/// `vpdpwssd` is emitted as written ([`dpwssd`]): LLVM's generic tuning would split the
/// intrinsic into `vpmaddwd` + `vpaddd`, one more operation per row and block on the ports
/// `vpdpbusd` needs.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`
///   (see [`crate::ukernel::W4A8PanelsFn`]); `job.block_corr` holds `m·n_blocks` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w4a8_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let nibbles = w.panel_nibbles(p);
    // Steps as fixed-size chunks, so the inner loop indexes arrays with one proven bound.
    let (weight_steps, _) = nibbles.as_chunks::<64>();
    let mut row_steps: [&[[u8; 8]]; R] = [&[]; R];
    let mut row_kappa: [&[i32]; R] = [&[]; R];
    // `−zp` in the low 16 bits of each 32-bit lane, 0 in the high ones, for `vpdpwssd`.
    let mut neg_zp_lo = [0i32; R];
    let mut zp = [0i32; R];
    // Σc of a block is at most 15·B; below 2^15 it is one i16 for `vpdpwssd`, and below
    // 2^15 / 255 blocks the `κ/8` of every row fits an i16 too: the driver's paired words.
    let short_blocks = w.block_len() * 15 < 1 << 15;
    let paired = paired_blocks(w.block_len());
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0;
        row_kappa[r] = &job.block_corr[(m0 + r) * n_blocks..][..n_blocks];
        zp[r] = job.row_corr[m0 + r];
        neg_zp_lo[r] = zp[r].wrapping_neg() & 0xFFFF;
    }
    let mask = _mm512_set1_epi8(0x0F);
    let ones = _mm512_set1_epi8(1);
    let mut acc_f = [_mm512_setzero_ps(); R];
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_block = &weight_steps[steps.clone()];
        let mut a_block: [&[[u8; 8]]; R] = [&[]; R];
        for r in 0..R {
            a_block[r] = &row_steps[r][steps.clone()];
        }
        for a in &a_block {
            assert_eq!(a.len(), w_block.len());
        }
        // With few rows, two accumulators per row (K values 0..4 and 4..8 of each step) halve
        // the dependency chain; from `SPLIT_MAX_ROWS + 1` rows the rows' own chains keep the
        // unit busy, and one accumulator saves the add that joins the two.
        let split = R <= SPLIT_MAX_ROWS;
        let mut acc_lo = [_mm512_setzero_si512(); R];
        let mut acc_hi = [_mm512_setzero_si512(); R];
        let mut code_sum = if paired {
            _mm512_set1_epi32(8 << 16)
        } else {
            _mm512_setzero_si512()
        };
        for (i, w_step) in w_block.iter().enumerate() {
            prefetch_ahead(w_step);
            let v = load_bytes(w_step);
            let lo = _mm512_and_si512(v, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
            // `lo + hi` is at most 30: one byte, so one dot with ones sums both halves.
            code_sum = _mm512_dpbusd_epi32(code_sum, _mm512_add_epi8(lo, hi), ones);
            for r in 0..R {
                let a = &a_block[r][i];
                let a_lo = _mm512_set1_epi32(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
                let a_hi = _mm512_set1_epi32(i32::from_le_bytes([a[4], a[5], a[6], a[7]]));
                acc_lo[r] = _mm512_dpbusd_epi32(acc_lo[r], lo, a_lo);
                if split {
                    acc_hi[r] = _mm512_dpbusd_epi32(acc_hi[r], hi, a_hi);
                } else {
                    acc_lo[r] = _mm512_dpbusd_epi32(acc_lo[r], hi, a_hi);
                }
            }
        }
        let sc = load_f32(&w.block_scales(p, b));
        let joined: [__m512i; R] = std::array::from_fn(|r| {
            if split {
                _mm512_add_epi32(acc_lo[r], acc_hi[r])
            } else {
                acc_lo[r]
            }
        });
        // One branch per block, outside the rows, so each arm unrolls over the rows with the
        // accumulators in registers.
        let acc_i: [__m512i; R] = if paired {
            // Each word broadcast from memory, the block's words of the tile's rows side by
            // side: built in a register, each cost two more vector operations per row and
            // block, on the ports `vpdpbusd` needs.
            let words = job.paired_words::<R>(b, m0);
            std::array::from_fn(|r| dpwssd(joined[r], code_sum, _mm512_set1_epi32(words[r])))
        } else if short_blocks {
            std::array::from_fn(|r| {
                let acc = _mm512_sub_epi32(joined[r], _mm512_set1_epi32(row_kappa[r][b]));
                dpwssd(acc, code_sum, _mm512_set1_epi32(neg_zp_lo[r]))
            })
        } else {
            std::array::from_fn(|r| {
                let acc = _mm512_sub_epi32(joined[r], _mm512_set1_epi32(row_kappa[r][b]));
                _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(zp[r]), code_sum))
            })
        };
        match job.out {
            W4A8Out::BlockAcc { ptr } if ACC => {
                for r in 0..R {
                    let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + p * PANEL;
                    // SAFETY: the driver sized the accumulator buffer `[m][n_blocks][n_pad]`;
                    // these 16 channels of row `m0 + r` belong to this call alone.
                    unsafe { _mm512_storeu_si512(ptr.wrapping_add(at).cast(), acc_i[r]) };
                }
            }
            _ => {
                for r in 0..R {
                    acc_f[r] =
                        _mm512_add_ps(acc_f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(acc_i[r]), sc));
                }
            }
        }
    }
    // SAFETY: our contract.
    unsafe { w4a8_store_rows(job, p, m0, acc_f) };
}

/// Writes rows `m0..m0 + R` of panel `p` from their f32 accumulators (the row's scale, then
/// the bias), the channels past N masked out, when the job's output is values.
///
/// # Safety
/// - As [`w4a8_tile`] for panel `p`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn w4a8_store_rows<const R: usize>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
    acc_f: [__m512; R],
) {
    let w = job.w;
    if let W4A8Out::Values { ptr, ld } = job.out {
        let valid = PANEL.min(w.n() - p * PANEL);
        let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
        let bias = w.panel_bias(p).map(|b| load_f32(b.try_into().unwrap()));
        for r in 0..R {
            let mut y = _mm512_mul_ps(acc_f[r], _mm512_set1_ps(job.row_recip[m0 + r]));
            if let Some(bias) = bias {
                y = _mm512_add_ps(y, bias);
            }
            // SAFETY: row `m0 + r < m` and the masked-in channels `16p..16p + valid` are `< N`,
            // inside the validated output and owned by this call; masked-out lanes are not
            // accessed.
            unsafe { _mm512_mask_storeu_ps(ptr.wrapping_add((m0 + r) * ld + p * PANEL), keep, y) };
        }
    }
}

/// Rows up to which the W4A8 walk covers two panels per tile ([`w4a8_pair_tile`]) on matrices
/// with K of at least [`PAIR_MIN_K`]. With a few rows a tile computes little per byte of codes,
/// and one panel's sequential stream keeps too few lines in flight for a core to draw its
/// share of the memory's bandwidth; two panels read in lockstep are two streams, and each
/// activation broadcast feeds both. Alternated call by call on one core with the codes
/// streaming from memory (groups of 32, 1 GiB cycled), against one panel per tile: 1.16-1.22×
/// faster at 2 rows and 1.22-1.28× at 4 on 14336 × 4096 and 4096 × 14336 in one window,
/// 0.96-1.18× in others; 0.82-0.86× at 5 rows, where the single panel's tile computes more per
/// load.
const PAIR_MAX_ROWS: usize = 4;

/// K from which the pair tiles run. On 1536 × 2048 and 2048 × 768 they were 1.03-1.08× faster
/// than one panel in one window and 0.78-0.95× in others (the same comparison), and the layer
/// at 16 tokens on the Qwen3-30B-A3B shape was 0.77-0.91× as fast in three rounds of
/// `moe bench`.
const PAIR_MIN_K: usize = 4096;

/// The W4A8 tile body for `R` rows (at most [`PAIR_MAX_ROWS`]) of panels `p` and `p + 1`, with
/// the numerics of [`w4a8_tile`] (the same exact block sums and corrections, the same f32
/// epilogue) for each panel: each panel keeps its own code sums and one accumulator per row,
/// and each broadcast activation word feeds both panels.
///
/// # Safety
/// - As [`w4a8_tile`], for both panels.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w4a8_pair_tile<const R: usize, const ACC: bool>(job: &W4A8Job<'_>, p: usize, m0: usize) {
    let w = job.w;
    let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
    let panel_steps = [p, p + 1].map(|q| w.panel_nibbles(q).as_chunks::<64>().0);
    let mut row_steps: [&[[u8; 8]]; R] = [&[]; R];
    let mut row_kappa: [&[i32]; R] = [&[]; R];
    let mut neg_zp_lo = [0i32; R];
    let mut zp = [0i32; R];
    let short_blocks = w.block_len() * 15 < 1 << 15;
    let paired = paired_blocks(w.block_len());
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0;
        row_kappa[r] = &job.block_corr[(m0 + r) * n_blocks..][..n_blocks];
        zp[r] = job.row_corr[m0 + r];
        neg_zp_lo[r] = zp[r].wrapping_neg() & 0xFFFF;
    }
    let mask = _mm512_set1_epi8(0x0F);
    let ones = _mm512_set1_epi8(1);
    // `acc_f[j][r]`: panel `p + j`, row `m0 + r`.
    let mut acc_f = [[_mm512_setzero_ps(); R]; 2];
    for b in 0..n_blocks {
        let steps = b * steps_per_block..(b + 1) * steps_per_block;
        let w_blocks = panel_steps.map(|s| &s[steps.clone()]);
        let mut a_block: [&[[u8; 8]]; R] = [&[]; R];
        for r in 0..R {
            a_block[r] = &row_steps[r][steps.clone()];
        }
        for a in &a_block {
            assert_eq!(a.len(), w_blocks[0].len());
        }
        assert_eq!(w_blocks[1].len(), w_blocks[0].len());
        let mut acc = [[_mm512_setzero_si512(); R]; 2];
        let start = if paired {
            _mm512_set1_epi32(8 << 16)
        } else {
            _mm512_setzero_si512()
        };
        let mut code_sum = [start; 2];
        for i in 0..w_blocks[0].len() {
            let mut lo = [_mm512_setzero_si512(); 2];
            let mut hi = [_mm512_setzero_si512(); 2];
            for j in 0..2 {
                prefetch_ahead(&w_blocks[j][i]);
                let v = load_bytes(&w_blocks[j][i]);
                lo[j] = _mm512_and_si512(v, mask);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
                let both = _mm512_add_epi8(lo[j], hi[j]);
                code_sum[j] = _mm512_dpbusd_epi32(code_sum[j], both, ones);
            }
            for r in 0..R {
                let a = &a_block[r][i];
                let a_lo = _mm512_set1_epi32(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
                let a_hi = _mm512_set1_epi32(i32::from_le_bytes([a[4], a[5], a[6], a[7]]));
                for j in 0..2 {
                    acc[j][r] = _mm512_dpbusd_epi32(acc[j][r], lo[j], a_lo);
                    acc[j][r] = _mm512_dpbusd_epi32(acc[j][r], hi[j], a_hi);
                }
            }
        }
        for j in 0..2 {
            let q = p + j;
            // The corrections of `w4a8_tile`, one branch per block outside the rows. Written
            // out here rather than shared: behind a function both tiles call, LLVM kept the
            // rows' sums in memory and both tiles ran about 1.4× slower.
            let acc_i: [__m512i; R] = if paired {
                let words = job.paired_words::<R>(b, m0);
                std::array::from_fn(|r| dpwssd(acc[j][r], code_sum[j], _mm512_set1_epi32(words[r])))
            } else if short_blocks {
                std::array::from_fn(|r| {
                    let acc = _mm512_sub_epi32(acc[j][r], _mm512_set1_epi32(row_kappa[r][b]));
                    dpwssd(acc, code_sum[j], _mm512_set1_epi32(neg_zp_lo[r]))
                })
            } else {
                std::array::from_fn(|r| {
                    let acc = _mm512_sub_epi32(acc[j][r], _mm512_set1_epi32(row_kappa[r][b]));
                    let zp_sum = _mm512_mullo_epi32(_mm512_set1_epi32(zp[r]), code_sum[j]);
                    _mm512_sub_epi32(acc, zp_sum)
                })
            };
            match job.out {
                W4A8Out::BlockAcc { ptr } if ACC => {
                    for r in 0..R {
                        let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + q * PANEL;
                        // SAFETY: the driver sized the accumulator buffer
                        // `[m][n_blocks][n_pad]`; these 16 channels of row `m0 + r` belong to
                        // this call alone.
                        unsafe { _mm512_storeu_si512(ptr.wrapping_add(at).cast(), acc_i[r]) };
                    }
                }
                _ => {
                    let sc = load_f32(&w.block_scales(q, b));
                    for r in 0..R {
                        let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(acc_i[r]), sc);
                        acc_f[j][r] = _mm512_add_ps(acc_f[j][r], scaled);
                    }
                }
            }
        }
    }
    for j in 0..2 {
        // SAFETY: our contract, for panel `p + j`.
        unsafe { w4a8_store_rows(job, p + j, m0, acc_f[j]) };
    }
}

/// The W8A8 tile body for `R` rows.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w8a8_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    let w = job.w;
    let k_pad = w.k_pad();
    let bytes = w.panel_bytes(p);
    let (weight_steps, _) = bytes.as_chunks::<64>();
    let mut row_steps: [&[[u8; 4]]; R] = [&[]; R];
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<4>().0;
    }
    for a in &row_steps {
        assert_eq!(a.len(), weight_steps.len());
    }
    let mut acc = [_mm512_setzero_si512(); R];
    for (i, step) in weight_steps.iter().enumerate() {
        prefetch_at::<W8A8_PREFETCH_BYTES, _>(step);
        // SAFETY: `[i8; 64]` and `[u8; 64]` have the same size, alignment and validity.
        let v = load_bytes(unsafe { &*(step as *const [i8; 64]).cast::<[u8; 64]>() });
        for r in 0..R {
            let a = _mm512_set1_epi32(i32::from_le_bytes(row_steps[r][i]));
            acc[r] = _mm512_dpbusd_epi32(acc[r], a, v);
        }
    }
    // SAFETY: our contract.
    unsafe { w8a8_store_panel(job, p, m0, acc) };
}

/// The W8A8 epilogue of panel `p`: `f32(acc − 128·Σw) · (xs·ws)` for rows `m0..m0 + R`, the
/// channels past N masked out.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of panel `p`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn w8a8_store_panel<const R: usize>(
    job: &W8A8Job<'_>,
    p: usize,
    m0: usize,
    acc: [__m512i; R],
) {
    let w = job.w;
    let comp = _mm512_slli_epi32::<7>(load_i32(w.panel_wsum(p).try_into().unwrap()));
    let scales = load_f32(w.panel_scales(p).try_into().unwrap());
    let valid = PANEL.min(w.n() - p * PANEL);
    let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
    for r in 0..R {
        let exact = _mm512_sub_epi32(acc[r], comp);
        let dequant = _mm512_mul_ps(_mm512_set1_ps(job.row_scale[m0 + r]), scales);
        let y = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), dequant);
        // SAFETY: row `m0 + r < m`, channels `16p..16p + valid < N`, owned by this call; masked
        // lanes are not accessed.
        unsafe {
            _mm512_mask_storeu_ps(job.out.wrapping_add((m0 + r) * job.ld + p * PANEL), keep, y)
        };
    }
}

/// The W8A8 tile body for `R` rows of panels `p` and `p + 1`. With one panel a tile has one
/// `vpdpbusd` chain per row, too few to cover the instruction's latency on cores that issue two
/// per cycle; two panels double the chains and let each broadcast activation serve both.
/// Measured on an Intel core (AVX-512 VNNI rung, `moe bench --format w8a8`, 2 threads, 4
/// alternations): 1.24-1.43× faster at 256 and 1024 tokens on the three standard shapes except
/// Qwen3 at 256 (1.10×), 1.0-1.13× at 16.
///
/// # Safety
/// - As [`w8a8_tile`], for both panels.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w8a8_pair_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
    let w = job.w;
    let k_pad = w.k_pad();
    let steps = [p, p + 1].map(|p| w.panel_bytes(p).as_chunks::<64>().0);
    let mut row_steps: [&[[u8; 4]]; R] = [&[]; R];
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<4>().0;
    }
    for a in &row_steps {
        assert_eq!(a.len(), steps[0].len());
    }
    assert_eq!(steps[0].len(), steps[1].len());
    // `acc[j][r]`: panel `p + j`, row `m0 + r`.
    let mut acc = [[_mm512_setzero_si512(); R]; 2];
    for (i, (s0, s1)) in steps[0].iter().zip(steps[1]).enumerate() {
        prefetch_at::<W8A8_PREFETCH_BYTES, _>(s0);
        prefetch_at::<W8A8_PREFETCH_BYTES, _>(s1);
        // SAFETY: `[i8; 64]` and `[u8; 64]` have the same size, alignment and validity.
        let v0 = load_bytes(unsafe { &*(s0 as *const [i8; 64]).cast::<[u8; 64]>() });
        // SAFETY: as above.
        let v1 = load_bytes(unsafe { &*(s1 as *const [i8; 64]).cast::<[u8; 64]>() });
        for r in 0..R {
            let a = _mm512_set1_epi32(i32::from_le_bytes(row_steps[r][i]));
            acc[0][r] = _mm512_dpbusd_epi32(acc[0][r], a, v0);
            acc[1][r] = _mm512_dpbusd_epi32(acc[1][r], a, v1);
        }
    }
    // SAFETY: our contract, for panel `p`.
    unsafe { w8a8_store_panel(job, p, m0, acc[0]) };
    // SAFETY: our contract, for panel `p + 1`.
    unsafe { w8a8_store_panel(job, p + 1, m0, acc[1]) };
}

crate::ukernel::impl_microkernels! {
    token: Avx512Vnni,
    features: "AVX-512 F/BW/VL/VNNI",
    mr: MR,
    rows: [1 2 3 4 5 6 7 8],
    w4a8_tile: w4a8_tile,
    w4a8_pair_tile: w4a8_pair_tile for [1 2 3 4] from_k PAIR_MIN_K,
    w8a8_tile: w8a8_tile,
    w8a8_pair_tile: w8a8_pair_tile,
}

// The walk takes the two-panel tile up to the rows it is instantiated for.
const _: () =
    assert!(<Avx512Vnni as crate::ukernel::W4A8Microkernel>::PAIR_MAX_ROWS == PAIR_MAX_ROWS);
