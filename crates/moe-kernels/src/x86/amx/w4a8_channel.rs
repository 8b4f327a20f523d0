//! The W4A8 tile body under [`crate::W4A8Prefill::ChannelInt8`]: each panel pair's int4 codes
//! requantised to int8 with one scale per channel once per call (`x86/requant.rs`), so the C
//! tiles hold their sums over the whole of K as the W8A8 body's do, and one epilogue per output
//! tile replaces the exact body's one per scale block. The B rows, weight sums and C tiles hold
//! the channels in the fill's tile order; the epilogue puts each output row back in channel
//! order with one permutation.

use std::arch::x86_64::*;

use super::common::{
    AccBuf, GROUP_ROWS, TILE_ROWS, TiledA, dpbusd_live, load_a_live, load_b_live, store_live,
    write_panel_rows, zero_live,
};
use super::tiles::TileUnit;
use crate::packed::PANEL;
use crate::ukernel::{W4A8Job, W4A8Out};
use crate::x86::requant::{ChannelPair, channel_order};

/// Computes rows `row0..row0 + min(32, m − row0)` of the pair's channels from the requantised
/// weights. `NA` is 2 when the group has more than 16 rows, `NB` the number of panels in the
/// pair.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with `tile_config(CHUNK)`, `pair` was
///   filled for panels `p..p + NB` of `job.w`, and `a` holds this job's rows laid out by
///   `w8a8::tile_a` for the weights' `k_pad`.
/// - The job satisfies [`crate::ukernel::W4A8PanelsFn`]'s contract for the pair's panels, with
///   values as its output; `row0 < job.m` is a multiple of 16, and `row0 + 16 < job.m`
///   exactly when `NA == 2`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn channel_step<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    job: &W4A8Job<'_>,
    (pair, p): (&ChannelPair, usize),
    a: &TiledA<'_>,
    row0: usize,
    acc: &mut AccBuf,
) {
    let W4A8Out::Values { ptr, ld } = job.out else {
        debug_assert!(false, "the per-channel body has no block accumulators");
        return;
    };
    let t = row0 / TILE_ROWS;
    // SAFETY: for this and the tile calls below, the unit is configured for `CHUNK` (our
    // contract); `a` holds the row tiles `t..t + NA` of every chunk; `chunk_rows` points at
    // 16 rows of 64 bytes of the filled pair.
    unsafe { zero_live::<U, NA, NB>(unit) };
    for c in 0..pair.n_chunks() {
        // SAFETY: see above.
        unsafe { load_a_live::<U, NA>(unit, a, t, c) };
        let b = [pair.chunk_rows(0, c), pair.chunk_rows(NB - 1, c)];
        // SAFETY: see above.
        unsafe { load_b_live::<U, NB>(unit, b) };
        // SAFETY: see above.
        unsafe { dpbusd_live::<U, NA, NB>(unit) };
    }
    // SAFETY: see above.
    unsafe { store_live::<U, NA, NB>(unit, acc) };

    let w = job.w;
    let rows = GROUP_ROWS.min(job.m - row0);
    let to_channels = channel_order();
    for j in 0..NB {
        let (wsum, scale) = (pair.wsum(j), pair.scale(j));
        let y = |r: usize| {
            // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable i32, 64-byte
            // aligned.
            let c = unsafe { _mm512_load_si512(acc.0[r][j * PANEL..].as_ptr().cast()) };
            let corr = _mm512_set1_epi32(job.row_corr[row0 + r]);
            let exact = _mm512_sub_epi32(c, _mm512_mullo_epi32(corr, wsum));
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale);
            let v = _mm512_mul_ps(v, _mm512_set1_ps(job.row_recip[row0 + r]));
            _mm512_permutexvar_ps(to_channels, v)
        };
        let bias = w.panel_bias(p + j);
        // SAFETY: rows `row0..row0 + rows < m` and panel `p + j`'s channels are inside the
        // validated output and owned by this call (our contract).
        unsafe { write_panel_rows((ptr, ld), w.n(), (row0, rows), p + j, bias, y) };
    }
}
