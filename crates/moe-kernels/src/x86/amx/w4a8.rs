//! The W4A8 tile body: one row group (up to 32 rows) × one panel pair (up to 32 channels) per
//! step.
//!
//! AMX multiplies bytes, so the nibbles of a panel pair are widened to s8 once per call
//! ([`WidePair::fill`]) in the VNNI order `tdpbusd` wants (B row `j` holds K values `4j..4j+4`
//! of the 16 channels: the low and high nibbles of one 64-byte packed step are two such rows),
//! together with every block's weight sums. Each block then starts at a fixed row of that
//! buffer, padded with zero rows to whole chunks, so every B tile loads straight from it, and
//! every row group of the call reuses it.
//!
//! The group scales change every block, so the C tiles are stored after each block and the
//! block's int32 sums go through the epilogue of the scalar reference:
//! `acc_i = acc − (128 + zp)·Σw`, `acc_f = acc_f + f32(acc_i)·scale` (no FMA), and at the end
//! `y = acc_f·recip + bias`, so outputs equal the scalar reference bit for bit. The tiles of
//! block `b + 1` are issued before the epilogue of block `b`, into the other of two
//! accumulator buffers, so the tile unit and the vector units work at the same time.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::common::{
    ARows, AccBuf, GROUP_ROWS, Row64, TILE_ROWS, TiledA, dpbusd_live, load_a_live, load_b_live,
    prefetch, store_live, tile_rows, write_panel_rows, zero_live,
};
use super::tiles::{TILE_MAX_COLSB, TileUnit};
use crate::packed::{PANEL, PackedW4A8, STEP_BYTES, w4a8::K_STEP};
use crate::ukernel::{W4A8Job, W4A8Out};

/// K values per chunk for blocks of `block_len` values: a whole 64-byte A row, or 32 when a
/// block is no longer (group size 32), so no chunk straddles two scale blocks.
pub(crate) fn chunk_len(block_len: usize) -> usize {
    if block_len <= 32 { 32 } else { TILE_MAX_COLSB }
}

/// Re-lays a GEMM's encoded rows for the W4A8 tiles (the driver's layout hook).
pub(crate) fn tile_a(a: &[u8], m: usize, w: &PackedW4A8, dst: &mut Vec<u8>) {
    let (n_chunks, starts) = chunks(w);
    let rows = ARows {
        a,
        m,
        k_pad: w.k_pad(),
    };
    tile_rows(rows, chunk_len(w.block_len()), n_chunks, starts, dst);
}

/// The chunks of `w`'s blocks in K order: `(first K value, values)` of chunk `c` (a block of
/// `block_len` values takes `ceil(block_len / chunk)` chunks, the last one possibly partial),
/// and their count.
pub(crate) fn chunks(w: &PackedW4A8) -> (usize, impl Fn(usize) -> (usize, usize)) {
    let (block_len, n_blocks) = (w.block_len(), w.n_blocks());
    let chunk = chunk_len(block_len);
    let per_block = block_len.div_ceil(chunk);
    (n_blocks * per_block, move |c| {
        let (b, i) = (c / per_block, c % per_block);
        (b * block_len + i * chunk, chunk.min(block_len - i * chunk))
    })
}

/// Chunks ahead whose tiles are requested in L1.
const AHEAD_L1: usize = 2;

/// Longest block whose int32 sums are exact in f32: `|Σ (q + 128)·w| ≤ 255·8·B < 2^24`. For
/// such blocks `f32(acc) − f32(128 + zp)·f32(Σw)`, one fused multiply-add of exact integers,
/// is the exact `acc_i`, which saves the 32-bit multiply of the integer correction.
const F32_EXACT_BLOCK: usize = 8192;

/// A panel pair's weights widened to s8 B rows, and each block's weight sums.
#[derive(Default)]
pub(crate) struct WidePair {
    /// `[panel][block][rows_per_block]` B rows; rows past a block's data are zero.
    rows: Vec<Row64>,
    /// `[panel][block]` sums `Σ_{k∈b} w` of the 16 channels.
    wsum: Vec<[i32; PANEL]>,
    /// B rows per block: the block's chunks, whole.
    rows_per_block: usize,
    /// Blocks per panel.
    n_blocks: usize,
}

impl WidePair {
    /// Widens panels `p..p + nb` (`nb` is 1 or 2) of `w` for chunks of `chunk` K values.
    /// Reuses the buffers, so a thread's calls stop allocating once the largest matrix is seen.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(crate) fn fill(&mut self, w: &PackedW4A8, p: usize, nb: usize, chunk: usize) {
        let (block_len, n_blocks) = (w.block_len(), w.n_blocks());
        let rows_per_block = block_len.div_ceil(chunk) * (chunk / 4);
        self.rows_per_block = rows_per_block;
        self.n_blocks = n_blocks;
        self.rows.clear();
        self.rows
            .resize(nb * n_blocks * rows_per_block, Row64::ZERO);
        self.wsum.clear();
        self.wsum.resize(nb * n_blocks, [0; PANEL]);
        let steps_per_block = block_len / K_STEP;
        let mask = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let ones = _mm512_set1_epi8(1);
        for j in 0..nb {
            let (steps, _) = w.panel_nibbles(p + j).as_chunks::<STEP_BYTES>();
            for b in 0..n_blocks {
                let block = &steps[b * steps_per_block..][..steps_per_block];
                let at = (j * n_blocks + b) * rows_per_block;
                let dst = &mut self.rows[at..at + 2 * steps_per_block];
                let mut ws = _mm512_setzero_si512();
                for (step, pair) in block.iter().zip(dst.as_chunks_mut::<2>().0) {
                    // SAFETY: `step` is 64 readable bytes; the load is unaligned.
                    let v = unsafe { _mm512_loadu_si512(step.as_ptr().cast()) };
                    let lo = _mm512_sub_epi8(_mm512_and_si512(v, mask), eight);
                    let hi =
                        _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16::<4>(v), mask), eight);
                    // `lo + hi` lies in [-16, 14], so one dot with ones adds both halves.
                    ws = _mm512_dpbusd_epi32(ws, ones, _mm512_add_epi8(lo, hi));
                    // SAFETY: each `Row64` is 64 writable, 64-byte aligned bytes we borrow
                    // mutably.
                    unsafe { _mm512_store_si512(pair[0].0.as_mut_ptr().cast(), lo) };
                    // SAFETY: as above.
                    unsafe { _mm512_store_si512(pair[1].0.as_mut_ptr().cast(), hi) };
                }
                // SAFETY: 16 writable i32; unaligned store.
                unsafe {
                    _mm512_storeu_si512(self.wsum[j * self.n_blocks + b].as_mut_ptr().cast(), ws)
                };
            }
        }
    }

    /// The B rows of chunk `c` of block `b` of the pair's panel `j`.
    fn chunk_rows(&self, j: usize, b: usize, c: usize, chunk: usize) -> *const u8 {
        let at = (j * self.n_blocks + b) * self.rows_per_block + c * (chunk / 4);
        self.rows[at..at + chunk / 4].as_ptr().cast()
    }
}

/// The f32 accumulators of a row group, `[row][panel]`.
type AccF = [[__m512; 2]; GROUP_ROWS];

/// What a step needs besides the job: the widened pair, its first panel, the row group and
/// the scratch buffers.
pub(crate) struct W4A8Step<'a> {
    /// The widened panels.
    pub wide: &'a WidePair,
    /// First panel of the pair.
    pub p: usize,
    /// The activation rows as tiles, filled with [`chunks`].
    pub a: TiledA<'a>,
    /// First row of the group, a multiple of 16.
    pub row0: usize,
    /// The two accumulator buffers the blocks alternate between.
    pub accs: &'a mut [AccBuf; 2],
}

/// Computes rows `row0..row0 + min(32, m − row0)` of the pair's channels. `NA` is 2 when the
/// group has more than 16 rows, `NB` the number of panels in the pair.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with
///   `tile_config(chunk_len(job.w.block_len()))`, `step.wide` was filled for this pair with
///   that chunk, and `step.a` holds this job's rows filled with [`chunks`].
/// - The job satisfies [`crate::ukernel::W4A8PanelsFn`]'s contract for the pair's panels;
///   `row0 < job.m` is a multiple of 16, and `row0 + 16 < job.m` exactly when `NA == 2`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn w4a8_step<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    job: &W4A8Job<'_>,
    step: W4A8Step<'_>,
) {
    let W4A8Step {
        wide,
        p,
        a,
        row0,
        accs,
    } = step;
    let w = job.w;
    let (block_len, n_blocks) = (w.block_len(), w.n_blocks());
    let chunk = chunk_len(block_len);
    let per_block = block_len.div_ceil(chunk);
    let t = row0 / TILE_ROWS;
    let rows = GROUP_ROWS.min(job.m - row0);
    let mut corr = [0i32; GROUP_ROWS];
    corr[..rows].copy_from_slice(&job.row_corr[row0..row0 + rows]);

    // Zeroes, accumulates and stores block `b`'s C tiles into `acc`.
    let tiles = |unit: &mut U, b: usize, acc: &mut AccBuf| {
        // SAFETY: for this and the tile calls below, the unit is configured for `chunk` (our
        // contract); `a` holds row tiles `t..t + NA` of every chunk; `chunk_rows` points at
        // `chunk / 4` rows of the filled pair.
        unsafe { zero_live::<U, NA, NB>(unit) };
        for c in 0..per_block {
            // The tiles two chunks ahead into L1.
            let ahead = b * per_block + c + AHEAD_L1;
            a.prefetch_tile(t, ahead);
            if NA == 2 {
                a.prefetch_tile(t + 1, ahead);
            }
            if ahead / per_block < n_blocks {
                for j in 0..NB {
                    let rows = wide.chunk_rows(j, ahead / per_block, ahead % per_block, chunk);
                    prefetch::<_MM_HINT_T0>(rows, chunk / 4 * TILE_MAX_COLSB);
                }
            }
            // SAFETY: see above.
            unsafe { load_a_live::<U, NA>(unit, &a, t, b * per_block + c) };
            let b_rows = [
                wide.chunk_rows(0, b, c, chunk),
                wide.chunk_rows(NB - 1, b, c, chunk),
            ];
            // SAFETY: see above.
            unsafe { load_b_live::<U, NB>(unit, b_rows) };
            // SAFETY: see above.
            unsafe { dpbusd_live::<U, NA, NB>(unit) };
        }
        // SAFETY: see above.
        unsafe { store_live::<U, NA, NB>(unit, acc) };
    };

    let mut acc_f: AccF = [[_mm512_setzero_ps(); 2]; GROUP_ROWS];
    let exact_in_f32 = block_len <= F32_EXACT_BLOCK;
    let corr_f = corr.map(|c| c as f32);
    // Block `b`'s epilogue from its stored C tiles.
    let epilogue = |acc_f: &mut AccF, b: usize, acc: &AccBuf| {
        for j in 0..NB {
            // SAFETY: 16 readable i32 of the pair's sums; unaligned load.
            let ws = unsafe { _mm512_loadu_si512(wide.wsum[j * n_blocks + b].as_ptr().cast()) };
            let ws_f = _mm512_cvtepi32_ps(ws);
            let block_scales = w.block_scales(p + j, b);
            // SAFETY: 16 readable f32 in a local array; unaligned load.
            let sc = unsafe { _mm512_loadu_ps(block_scales.as_ptr()) };
            for r in 0..rows {
                // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable,
                // 64-byte aligned i32.
                let c = unsafe { _mm512_load_si512(acc.0[r][j * PANEL..].as_ptr().cast()) };
                match job.out {
                    W4A8Out::BlockAcc { ptr } => {
                        let acc_i =
                            _mm512_sub_epi32(c, _mm512_mullo_epi32(_mm512_set1_epi32(corr[r]), ws));
                        let at =
                            ((row0 + r) * n_blocks + b) * PANEL * w.n_panels() + (p + j) * PANEL;
                        // SAFETY: the driver sized the accumulator buffer
                        // `[m][n_blocks][n_pad]`; these 16 channels of row `row0 + r` belong to
                        // this call alone.
                        unsafe { _mm512_storeu_si512(ptr.wrapping_add(at).cast(), acc_i) };
                    }
                    W4A8Out::Values { .. } => {
                        let acc_i = if exact_in_f32 {
                            _mm512_fnmadd_ps(_mm512_set1_ps(corr_f[r]), ws_f, _mm512_cvtepi32_ps(c))
                        } else {
                            let exact = _mm512_sub_epi32(
                                c,
                                _mm512_mullo_epi32(_mm512_set1_epi32(corr[r]), ws),
                            );
                            _mm512_cvtepi32_ps(exact)
                        };
                        acc_f[r][j] = _mm512_add_ps(acc_f[r][j], _mm512_mul_ps(acc_i, sc));
                    }
                }
            }
        }
    };

    let [acc_even, acc_odd] = accs;
    tiles(unit, 0, acc_even);
    for b in 1..=n_blocks {
        let (next, done) = if b % 2 == 0 {
            (&mut *acc_even, &*acc_odd)
        } else {
            (&mut *acc_odd, &*acc_even)
        };
        if b < n_blocks {
            tiles(unit, b, next);
        }
        epilogue(&mut acc_f, b - 1, done);
    }

    if let W4A8Out::Values { ptr, ld } = job.out {
        for j in 0..NB {
            let scaled =
                |r: usize| _mm512_mul_ps(acc_f[r][j], _mm512_set1_ps(job.row_recip[row0 + r]));
            let bias = w.panel_bias(p + j);
            // SAFETY: rows `row0..row0 + rows < m` and panel `p + j`'s channels are inside
            // the validated output and owned by this call (our contract).
            unsafe { write_panel_rows((ptr, ld), w.n(), (row0, rows), p + j, bias, scaled) };
        }
    }
}
