//! The W4A8 tile body: up to 64 rows × one 16-channel panel per call.
//!
//! AMX multiplies bytes, so each K chunk of the panel's nibbles is first widened to s8 in the
//! VNNI order `tdpbusd` wants: B row `j` holds K values `4j..4j+4` of the chunk for the 16
//! channels, which is exactly what the low (even rows) and high (odd rows) nibbles of one
//! 64-byte packed step give. Per scale block, the C tiles are zeroed, every chunk of the block
//! is accumulated, and the int32 sums go through the same epilogue as the AVX-512 VNNI kernel
//! (`acc − (128 + zp)·Σw`, then `acc_f += f32(acc_i)·scale` without FMA, `y = acc_f·recip + bias`),
//! so outputs equal the scalar reference bit for bit.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::common::{
    ARows, AccBuf, C_TILES, MR, TILE_ROWS, TileBuf, dpbusd_into, load_a, store_c, zero_c,
};
use super::tiles::{TILE_B, TILE_MAX_COLSB, TileUnit};
use crate::packed::{PANEL, STEP_BYTES, w4a8::K_STEP};
use crate::ukernel::{W4A8Job, W4A8Out};

/// K values per chunk for blocks of `block_len` values: a whole 64-byte A row, or 32 when a
/// block is no longer (group size 32), so no chunk straddles two scale blocks.
pub(crate) fn chunk_len(block_len: usize) -> usize {
    if block_len <= 32 { 32 } else { TILE_MAX_COLSB }
}

/// Widens the packed steps `steps` (K values `8i..8i+8` each) into B rows `2i` (low nibbles)
/// and `2i + 1` (high nibbles), minus 8; rows past them up to `rows` become zero. Adds the
/// 16 channels' weight sums over these steps to `wsum`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn widen_chunk(steps: &[[u8; STEP_BYTES]], rows: usize, b: &mut TileBuf, wsum: &mut __m512i) {
    let mask = _mm512_set1_epi8(0x0F);
    let eight = _mm512_set1_epi8(8);
    let ones = _mm512_set1_epi8(1);
    for (i, step) in steps.iter().enumerate() {
        // SAFETY: `step` is 64 readable bytes; the load is unaligned.
        let v = unsafe { _mm512_loadu_si512(step.as_ptr().cast()) };
        let lo = _mm512_sub_epi8(_mm512_and_si512(v, mask), eight);
        let hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(v), mask), eight);
        // `lo + hi` lies in [-16, 14], so one dot with ones adds both halves exactly.
        *wsum = _mm512_dpbusd_epi32(*wsum, ones, _mm512_add_epi8(lo, hi));
        let (row_lo, rest) = b.0[2 * i..].split_first_mut().expect("16 B rows");
        let row_hi = &mut rest[0];
        // SAFETY: `row_lo` is 64 writable bytes we borrow mutably; the store is unaligned.
        unsafe { _mm512_storeu_si512(row_lo.as_mut_ptr().cast(), lo) };
        // SAFETY: as above, for `row_hi`.
        unsafe { _mm512_storeu_si512(row_hi.as_mut_ptr().cast(), hi) };
    }
    for row in &mut b.0[2 * steps.len()..rows] {
        *row = [0; TILE_MAX_COLSB];
    }
}

/// Computes rows `m0..m0 + mr` (`1 ≤ mr ≤ MR`) of panel `p`.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with
///   `tile_config(chunk_len(job.w.block_len()))`.
/// - The job satisfies [`crate::ukernel::W4A8PanelsFn`]'s contract for panel `p`, and
///   `m0 + mr ≤ job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn w4a8_rows<U: TileUnit>(
    unit: &mut U,
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
    mr: usize,
) {
    debug_assert!((1..=MR).contains(&mr) && m0 + mr <= job.m);
    let w = job.w;
    let (k_pad, block_len, n_blocks) = (w.k_pad(), w.block_len(), w.n_blocks());
    let chunk = chunk_len(block_len);
    let (steps, _) = w.panel_nibbles(p).as_chunks::<STEP_BYTES>();
    let groups = mr.div_ceil(TILE_ROWS);
    debug_assert!(groups <= C_TILES);

    let mut b_buf = TileBuf::zeroed();
    let mut a_pad = TileBuf::zeroed();
    let mut acc = AccBuf::zeroed();
    let mut acc_f = [_mm512_setzero_ps(); MR];
    for b in 0..n_blocks {
        // SAFETY: the unit is configured with this chunk's `tile_config` (our contract).
        unsafe { zero_c(unit, groups) };
        let block_end = (b + 1) * block_len;
        let mut k0 = b * block_len;
        let mut ws = _mm512_setzero_si512();
        while k0 < block_end {
            let len = chunk.min(block_end - k0);
            widen_chunk(
                &steps[k0 / K_STEP..(k0 + len) / K_STEP],
                chunk / 4,
                &mut b_buf,
                &mut ws,
            );
            // SAFETY: `b_buf` holds 16 rows of 64 readable bytes at stride 64; configured unit.
            unsafe { unit.load::<TILE_B>(b_buf.0.as_ptr().cast(), TILE_MAX_COLSB) };
            for g in 0..groups {
                let rows = ARows {
                    a: job.a,
                    k_pad,
                    row0: m0 + g * TILE_ROWS,
                    rows: TILE_ROWS.min(mr - g * TILE_ROWS),
                    k0,
                    len,
                    chunk,
                };
                // SAFETY: configured unit (our contract).
                unsafe { load_a(unit, &rows, &mut a_pad) };
                // SAFETY: configured unit with A and B loaded; `g < groups ≤ C_TILES`.
                unsafe { dpbusd_into(unit, g) };
            }
            k0 += len;
        }
        // SAFETY: configured unit (our contract).
        unsafe { store_c(unit, groups, &mut acc) };

        let block_scales = w.block_scales(p, b);
        // SAFETY: 16 readable f32 in a local array; unaligned load.
        let sc = unsafe { _mm512_loadu_ps(block_scales.as_ptr()) };
        for r in 0..mr {
            // SAFETY: row `r` of `acc` is 16 readable i32.
            let c = unsafe { _mm512_load_si512(acc.0[r].as_ptr().cast()) };
            let corr = _mm512_set1_epi32(job.row_corr[m0 + r]);
            let acc_i = _mm512_sub_epi32(c, _mm512_mullo_epi32(corr, ws));
            match job.out {
                W4A8Out::BlockAcc { ptr } => {
                    let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + p * PANEL;
                    // SAFETY: the driver sized the accumulator buffer `[m][n_blocks][n_pad]`;
                    // these 16 channels of row `m0 + r` belong to this call alone.
                    unsafe { _mm512_storeu_si512(ptr.wrapping_add(at).cast(), acc_i) };
                }
                W4A8Out::Values { .. } => {
                    acc_f[r] =
                        _mm512_add_ps(acc_f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(acc_i), sc));
                }
            }
        }
    }
    if let W4A8Out::Values { ptr, ld } = job.out {
        let valid = PANEL.min(w.n() - p * PANEL);
        let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
        // SAFETY: a present bias slice holds 16 readable f32; unaligned load.
        let bias = w
            .panel_bias(p)
            .map(|b| unsafe { _mm512_loadu_ps(b.as_ptr()) });
        for r in 0..mr {
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
