//! The W8A8 tile body: up to 64 rows × one 16-channel panel per call.
//!
//! The packed int8 panel already is a stack of B rows in VNNI order (each 64-byte step holds
//! K values `4s..4s+4` of the 16 channels), so whole 64-value chunks load straight from the
//! packed weights; only a ragged last chunk goes through a zero-padded copy. The int32 sums
//! over all of K then take the AVX-512 VNNI kernel's epilogue (`acc − 128·Σw`, times
//! `xs·ws`), so outputs equal the scalar reference bit for bit.

use std::arch::x86_64::*;

use super::common::{
    ARows, AccBuf, C_TILES, MR, TILE_ROWS, TileBuf, dpbusd_into, load_a, store_c, zero_c,
};
use super::tiles::{TILE_B, TILE_MAX_COLSB, TileUnit};
use crate::packed::{PANEL, STEP_BYTES, w8a8::K_STEP};
use crate::ukernel::W8A8Job;

/// K values per chunk: one full 64-byte A row.
pub(crate) const CHUNK: usize = TILE_MAX_COLSB;

/// Computes rows `m0..m0 + mr` (`1 ≤ mr ≤ MR`) of panel `p`.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with `tile_config(CHUNK)`.
/// - The job satisfies [`crate::ukernel::W8A8PanelsFn`]'s contract for panel `p`, and
///   `m0 + mr ≤ job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn w8a8_rows<U: TileUnit>(
    unit: &mut U,
    job: &W8A8Job<'_>,
    p: usize,
    m0: usize,
    mr: usize,
) {
    debug_assert!((1..=MR).contains(&mr) && m0 + mr <= job.m);
    let w = job.w;
    let k_pad = w.k_pad();
    let panel = w.panel_bytes(p);
    // SAFETY: `i8` and `u8` have the same size, alignment and validity.
    let panel: &[u8] = unsafe { std::slice::from_raw_parts(panel.as_ptr().cast(), panel.len()) };
    let (steps, _) = panel.as_chunks::<STEP_BYTES>();
    let groups = mr.div_ceil(TILE_ROWS);
    debug_assert!(groups <= C_TILES);

    let mut b_pad = TileBuf::zeroed();
    let mut a_pad = TileBuf::zeroed();
    let mut acc = AccBuf::zeroed();
    // SAFETY: the unit is configured (our contract).
    unsafe { zero_c(unit, groups) };
    let mut k0 = 0;
    while k0 < k_pad {
        let len = CHUNK.min(k_pad - k0);
        let chunk_steps = &steps[k0 / K_STEP..(k0 + len) / K_STEP];
        if len == CHUNK {
            // SAFETY: a whole chunk is 16 consecutive 64-byte steps inside the panel; the
            // unit is configured (our contract).
            unsafe { unit.load::<TILE_B>(chunk_steps.as_ptr().cast(), TILE_MAX_COLSB) };
        } else {
            for (row, step) in b_pad.0.iter_mut().zip(chunk_steps) {
                *row = *step;
            }
            for row in &mut b_pad.0[chunk_steps.len()..] {
                *row = [0; TILE_MAX_COLSB];
            }
            // SAFETY: `b_pad` holds 16 rows of 64 readable bytes at stride 64; configured unit.
            unsafe { unit.load::<TILE_B>(b_pad.0.as_ptr().cast(), TILE_MAX_COLSB) };
        }
        for g in 0..groups {
            let rows = ARows {
                a: job.a,
                k_pad,
                row0: m0 + g * TILE_ROWS,
                rows: TILE_ROWS.min(mr - g * TILE_ROWS),
                k0,
                len,
                chunk: CHUNK,
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

    // SAFETY: the panel's sums and scales are 16 readable values each; unaligned loads.
    let comp =
        _mm512_slli_epi32::<7>(unsafe { _mm512_loadu_si512(w.panel_wsum(p).as_ptr().cast()) });
    // SAFETY: as above.
    let scales = unsafe { _mm512_loadu_ps(w.panel_scales(p).as_ptr()) };
    let valid = PANEL.min(w.n() - p * PANEL);
    let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
    for r in 0..mr {
        // SAFETY: row `r` of `acc` is 16 readable, 64-byte aligned i32.
        let c = unsafe { _mm512_load_si512(acc.0[r].as_ptr().cast()) };
        let exact = _mm512_sub_epi32(c, comp);
        let dequant = _mm512_mul_ps(_mm512_set1_ps(job.row_scale[m0 + r]), scales);
        let y = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), dequant);
        // SAFETY: row `m0 + r < m`, channels `16p..16p + valid < N`, owned by this call; masked
        // lanes are not accessed.
        unsafe {
            _mm512_mask_storeu_ps(job.out.wrapping_add((m0 + r) * job.ld + p * PANEL), keep, y)
        };
    }
}
