//! The W4A8 tile body: one row group (up to 32 rows) × one panel pair (up to 32 channels) per
//! step.
//!
//! AMX multiplies bytes, so the nibbles of a panel pair are widened to s8 once per call
//! ([`WidePair::fill`]) in the VNNI order `tdpbusd` wants (B row `j` holds K values `4j..4j+4`
//! of the 16 channels: the low and high nibbles of one 64-byte packed step are two such rows),
//! together with every block's weight sums and f32 scales. Each block then starts at a fixed
//! row of that buffer, padded with zero rows to whole chunks, so every B tile loads straight
//! from it, and every row group of the call reuses it.
//!
//! The group scales change every block, so the C tiles are stored after each block and the
//! block's int32 sums go through the epilogue of the scalar reference:
//! `acc_i = acc − (128 + zp)·Σw`, `acc_f = acc_f + f32(acc_i)·scale` (no FMA), and at the end
//! `y = acc_f·recip + bias`, so outputs equal the scalar reference bit for bit.
//!
//! With blocks of 32 values the correction `−(128 + zp)·Σw` is part of the tile product: each
//! block's chunk is 36 bytes, the A row ending in four copies of the row's `128 + zp` and the B
//! rows in a ninth row holding `−Σw` of each channel split into four s8 parts, so the C tile
//! holds `acc_i` itself and costs no vector work. The C tiles of [`BATCH`] blocks are stored
//! before their epilogue, which keeps each output row's f32 sum in a register across them; the
//! tiles of the next batch are issued first, into the other of two buffers, so the tile unit
//! and the vector units work at the same time.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::common::{
    ARows, AccBuf, GROUP_ROWS, Row64, TILE_ROWS, TiledA, dpbusd_live, load_a_live, load_b_live,
    store_live, tile_rows, tiles_len, write_panel_rows, zero_live,
};
use super::tiles::{TILE_MAX_COLSB, TileUnit};
use crate::aligned::AlignedVec;
use crate::packed::{PANEL, PackedW4A8, STEP_BYTES, w4a8::K_STEP};
use crate::ukernel::{W4A8Job, W4A8Out};
use crate::x86::wna16::prefetch_ahead;

/// Values per block up to which the correction rides in the tile product.
const CORR_IN_TILE_MAX_BLOCK: usize = 32;

/// Bytes of A row per chunk when the correction rides in the tile: 32 values and four copies
/// of the row's correction.
const CORR_CHUNK: usize = CORR_IN_TILE_MAX_BLOCK + 4;

/// Blocks whose C tiles are stored before one epilogue pass over them. Two buffers of two
/// blocks (16 KiB) stay in L1 between the tile stores and the epilogue's loads; a ring of
/// 32 KiB made the tile stores about twice as slow on the tile unit.
pub(crate) const BATCH: usize = 2;

/// The two C-tile buffers of a step: each holds the sums of one batch of blocks.
pub(crate) type BatchAccs = [[AccBuf; BATCH]; 2];

/// Whether blocks of `block_len` values carry their correction in the tile product.
pub(crate) fn corr_in_tile(block_len: usize) -> bool {
    block_len <= CORR_IN_TILE_MAX_BLOCK
}

/// Bytes of A row per chunk for blocks of `block_len` values: one chunk of 32 values and the
/// correction when it rides in the tile, else whole 64-byte A rows.
pub(crate) fn chunk_len(block_len: usize) -> usize {
    if corr_in_tile(block_len) {
        CORR_CHUNK
    } else {
        TILE_MAX_COLSB
    }
}

/// K values of data per chunk (the rest of a [`CORR_CHUNK`] is the correction).
fn chunk_values(block_len: usize) -> usize {
    if corr_in_tile(block_len) {
        CORR_IN_TILE_MAX_BLOCK
    } else {
        TILE_MAX_COLSB
    }
}

/// Re-lays a GEMM's encoded rows for the W4A8 tiles (the driver's layout hook); with blocks of
/// up to 32 values each chunk's row ends in four copies of the row's correction `corr`.
pub(crate) fn tile_a(a: &[u8], corr: &[i32], m: usize, w: &PackedW4A8, dst: &mut AlignedVec<u8>) {
    let (n_chunks, starts) = chunks(w);
    let rows = ARows {
        a,
        m,
        k_pad: w.k_pad(),
    };
    let chunk = chunk_len(w.block_len());
    tile_rows(rows, chunk, n_chunks, starts, dst);
    if !corr_in_tile(w.block_len()) || n_chunks == 0 {
        return;
    }
    let tile_bytes = TILE_ROWS * chunk;
    let len = m.div_ceil(TILE_ROWS) * n_chunks * tile_bytes;
    for (t, tile_row) in dst[..len]
        .chunks_exact_mut(n_chunks * tile_bytes)
        .enumerate()
    {
        let rows = TILE_ROWS.min(m.saturating_sub(t * TILE_ROWS));
        let corr = &corr[t * TILE_ROWS..][..rows];
        for block in tile_row.chunks_exact_mut(tile_bytes) {
            for (row, &c) in block.chunks_exact_mut(chunk).zip(corr) {
                // The correction is `128 + zp` with `zp` in `[-128, 127]` (the driver checks
                // the zero points): one unsigned byte.
                row[CORR_IN_TILE_MAX_BLOCK..].fill(c as u8);
            }
        }
    }
}

/// The chunks of `w`'s blocks in K order: `(first K value, values)` of chunk `c` (a block of
/// `block_len` values takes `ceil(block_len / values per chunk)` chunks, the last one possibly
/// partial), and their count.
pub(crate) fn chunks(w: &PackedW4A8) -> (usize, impl Fn(usize) -> (usize, usize)) {
    let block_len = w.block_len();
    let values = chunk_values(block_len);
    let per_block = block_len.div_ceil(values);
    (chunk_count(w.k_pad(), block_len), move |c| {
        let (b, i) = (c / per_block, c % per_block);
        (
            b * block_len + i * values,
            values.min(block_len - i * values),
        )
    })
}

/// How many chunks [`chunks`] cuts `k_pad` values in blocks of `block_len` into.
fn chunk_count(k_pad: usize, block_len: usize) -> usize {
    k_pad / block_len * block_len.div_ceil(chunk_values(block_len))
}

/// Bytes of the layout [`tile_a`] makes for `m` rows of `k_pad` values in blocks of
/// `block_len`, to size scratch up front.
pub(crate) fn tile_a_bytes(m: usize, k_pad: usize, block_len: usize) -> usize {
    tiles_len(m, chunk_len(block_len), chunk_count(k_pad, block_len))
}

/// Longest block whose int32 sums are exact in f32: `|Σ (q + 128)·w| ≤ 255·8·B < 2^24`. For
/// such blocks `f32(acc) − f32(128 + zp)·f32(Σw)`, one fused multiply-add of exact integers,
/// is the exact `acc_i`, which saves the 32-bit multiply of the integer correction.
const F32_EXACT_BLOCK: usize = 8192;

/// A panel pair's weights widened to s8 B rows, and each block's weight sums and scales.
#[derive(Default)]
pub(crate) struct WidePair {
    /// `[panel][block][rows_per_block]` B rows; rows past a block's data are zero, or hold the
    /// block's correction parts when it rides in the tile.
    rows: Vec<Row64>,
    /// `[panel][block]` sums `Σ_{k∈b} w` of the 16 channels.
    wsum: Vec<[i32; PANEL]>,
    /// `[panel][block]` scales of the 16 channels, as f32.
    scales: Vec<[f32; PANEL]>,
    /// B rows per block: the block's chunks, whole.
    rows_per_block: usize,
    /// Blocks per panel that were widened.
    n_blocks: usize,
    /// The first block widened.
    first_block: usize,
}

impl WidePair {
    /// Widens scale blocks `blocks` of panels `p..p + nb` (`nb` is 1 or 2) of `w` for chunks
    /// of `chunk` bytes. Reuses the buffers, so a thread's calls stop allocating once the
    /// longest range is seen; every row is written (data, correction or padding), so nothing is
    /// cleared first.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(crate) fn fill(
        &mut self,
        w: &PackedW4A8,
        (p, nb): (usize, usize),
        chunk: usize,
        blocks: Range<usize>,
    ) {
        let (block_len, n_blocks) = (w.block_len(), blocks.len());
        let rows_per_block = block_len.div_ceil(chunk_values(block_len)) * (chunk / 4);
        let in_tile = corr_in_tile(block_len);
        self.rows_per_block = rows_per_block;
        self.n_blocks = n_blocks;
        self.first_block = blocks.start;
        self.rows
            .resize(nb * n_blocks * rows_per_block, Row64::ZERO);
        // Every block's sums are stored below, so nothing is cleared.
        self.wsum.resize(nb * n_blocks, [0; PANEL]);
        self.scales.clear();
        let steps_per_block = block_len / K_STEP;
        let mask = _mm512_set1_epi8(0x0F);
        let eight = _mm512_set1_epi8(8);
        let ones = _mm512_set1_epi8(1);
        for j in 0..nb {
            let (steps, _) = w.panel_nibbles(p + j).as_chunks::<STEP_BYTES>();
            for (b, block_of_k) in blocks.clone().enumerate() {
                let block = &steps[block_of_k * steps_per_block..][..steps_per_block];
                let at = (j * n_blocks + b) * rows_per_block;
                let dst = &mut self.rows[at..at + rows_per_block];
                let mut ws = _mm512_setzero_si512();
                for (step, pair) in block.iter().zip(dst.as_chunks_mut::<2>().0) {
                    prefetch_ahead(step);
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
                // Rows past the block's data up to its correction row (or its end) are zero: a
                // block that ends inside a chunk pads it.
                let data_rows = 2 * steps_per_block;
                let pad_end = rows_per_block - usize::from(in_tile);
                dst[data_rows..pad_end].fill(Row64::ZERO);
                if in_tile {
                    let parts = correction_parts(ws);
                    // SAFETY: the block's last row (K values 32..36 of its one chunk) is 64
                    // writable, 64-byte aligned bytes.
                    unsafe {
                        _mm512_store_si512(dst[rows_per_block - 1].0.as_mut_ptr().cast(), parts)
                    };
                }
                // SAFETY: 16 writable i32; unaligned store.
                unsafe { _mm512_storeu_si512(self.wsum[j * n_blocks + b].as_mut_ptr().cast(), ws) };
                self.scales.push(w.block_scales(p + j, block_of_k));
            }
        }
    }

    /// The B rows of chunk `c` of block `b` (of K, one of the widened ones) of the pair's
    /// panel `j`.
    fn chunk_rows(&self, j: usize, b: usize, c: usize, chunk: usize) -> *const u8 {
        let b = b - self.first_block;
        let at = (j * self.n_blocks + b) * self.rows_per_block + c * (chunk / 4);
        self.rows[at..at + chunk / 4].as_ptr().cast()
    }

    /// Block `b`'s scales of the pair's panel `j`.
    #[inline(always)]
    fn scales(&self, j: usize, b: usize) -> __m512 {
        let s = &self.scales[j * self.n_blocks + b - self.first_block];
        // SAFETY: 16 readable f32; unaligned load.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// Block `b`'s weight sums of the pair's panel `j`.
    #[inline(always)]
    fn wsum(&self, j: usize, b: usize) -> __m512i {
        let s = &self.wsum[j * self.n_blocks + b - self.first_block];
        // SAFETY: 16 readable i32; unaligned load.
        unsafe { _mm512_loadu_si512(s.as_ptr().cast()) }
    }
}

/// The B row that adds `corr·(−Σw)` to each channel's sum: `−Σw` split into four s8 parts
/// `⌊(−Σw + i)/4⌋`, `i = 0..3`, which add up to `−Σw` (each lies in `[-56, 64]`, since a block of
/// 32 values of `[-8, 7]` sums to `[-256, 224]`), in the byte order of one VNNI B row.
#[target_feature(enable = "avx512f,avx512bw")]
fn correction_parts(wsum: __m512i) -> __m512i {
    let q = _mm512_sub_epi32(_mm512_setzero_si512(), wsum);
    let byte = _mm512_set1_epi32(0xFF);
    let part = |i: i32| {
        _mm512_and_si512(
            _mm512_srai_epi32::<2>(_mm512_add_epi32(q, _mm512_set1_epi32(i))),
            byte,
        )
    };
    let lo = _mm512_or_si512(part(0), _mm512_slli_epi32::<8>(part(1)));
    let hi = _mm512_or_si512(
        _mm512_slli_epi32::<16>(part(2)),
        _mm512_slli_epi32::<24>(part(3)),
    );
    _mm512_or_si512(lo, hi)
}

/// The f32 accumulators of a row group, `[row][panel]`.
pub(crate) type AccF = [[__m512; 2]; GROUP_ROWS];

/// How a block's int32 sums become `acc_i`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Correction {
    /// The tile product already subtracted it.
    InTile,
    /// `f32(acc) − f32(corr)·f32(Σw)` in one FMA of exact integers.
    F32Exact,
    /// `acc − corr·Σw` in int32, then converted.
    Int32,
}

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
    /// The two C-tile buffers the batches alternate between.
    pub accs: &'a mut BatchAccs,
    /// The scale blocks of K to run (the ones `wide` holds).
    pub blocks: Range<usize>,
    /// Where the row group's f32 sums wait between blocks of K, when K goes in several.
    pub parked: Option<&'a mut AccF>,
}

/// Computes rows `row0..row0 + min(32, m − row0)` of the pair's channels. `NA` is 2 when the
/// group has more than 16 rows, `NB` the number of panels in the pair.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with
///   `tile_config(chunk_len(job.w.block_len()))`, `step.wide` was filled for this pair with
///   that chunk, and `step.a` holds this job's rows filled with [`tile_a`].
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
        blocks,
        parked,
    } = step;
    let w = job.w;
    let (block_len, n_blocks) = (w.block_len(), w.n_blocks());
    let first = blocks.start;
    let chunk = chunk_len(block_len);
    let per_block = block_len.div_ceil(chunk_values(block_len));
    let t = row0 / TILE_ROWS;
    let rows = GROUP_ROWS.min(job.m - row0);
    let mut corr = [0i32; GROUP_ROWS];
    corr[..rows].copy_from_slice(&job.row_corr[row0..row0 + rows]);
    let correction = if corr_in_tile(block_len) {
        Correction::InTile
    } else if block_len <= F32_EXACT_BLOCK {
        Correction::F32Exact
    } else {
        Correction::Int32
    };

    // Zeroes, accumulates and stores block `b`'s C tiles into `acc`.
    let tiles = |unit: &mut U, b: usize, acc: &mut AccBuf| {
        // SAFETY: for this and the tile calls below, the unit is configured for `chunk` (our
        // contract); `a` holds row tiles `t..t + NA` of every chunk; `chunk_rows` points at
        // `chunk / 4` rows of the filled pair.
        unsafe { zero_live::<U, NA, NB>(unit) };
        for c in 0..per_block {
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
    // Runs the tiles of batch `i` (of the range) into `ring`.
    let batch_tiles = |unit: &mut U, i: usize, ring: &mut [AccBuf; BATCH]| {
        let batch = first + i * BATCH..blocks.end.min(first + (i + 1) * BATCH);
        for (b, acc) in batch.zip(ring.iter_mut()) {
            tiles(unit, b, acc);
        }
    };

    let mut acc_f: AccF = match (first, &parked) {
        (0, _) | (_, None) => [[_mm512_setzero_ps(); 2]; GROUP_ROWS],
        (_, Some(parked)) => **parked,
    };
    let corr_f = corr.map(|c| c as f32);
    // Batch `i`'s epilogue from its stored C tiles.
    let epilogue = |acc_f: &mut AccF, i: usize, ring: &[AccBuf; BATCH]| {
        let b0 = first + i * BATCH;
        let live = BATCH.min(blocks.end - b0);
        for j in 0..NB {
            // The block's int32 sum of row `r` as `acc_i`.
            let acc_i = |q: usize, r: usize| {
                // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable,
                // 64-byte aligned i32.
                let c = unsafe { _mm512_load_si512(ring[q].0[r][j * PANEL..].as_ptr().cast()) };
                match correction {
                    Correction::InTile => c,
                    _ => _mm512_sub_epi32(
                        c,
                        _mm512_mullo_epi32(_mm512_set1_epi32(corr[r]), wide.wsum(j, b0 + q)),
                    ),
                }
            };
            if let W4A8Out::BlockAcc { ptr } = job.out {
                for q in 0..live {
                    for r in 0..rows {
                        let at = ((row0 + r) * n_blocks + b0 + q) * PANEL * w.n_panels()
                            + (p + j) * PANEL;
                        // SAFETY: the driver sized the accumulator buffer
                        // `[m][n_blocks][n_pad]`; these 16 channels of row `row0 + r` belong
                        // to this call alone.
                        unsafe { _mm512_storeu_si512(ptr.wrapping_add(at).cast(), acc_i(q, r)) };
                    }
                }
                continue;
            }
            let sc: [__m512; BATCH] = std::array::from_fn(|q| wide.scales(j, b0 + q.min(live - 1)));
            match correction {
                Correction::InTile => {
                    for r in 0..rows {
                        let mut acc = acc_f[r][j];
                        for q in 0..live {
                            // SAFETY: as in `acc_i`.
                            let c = unsafe {
                                _mm512_load_si512(ring[q].0[r][j * PANEL..].as_ptr().cast())
                            };
                            acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_cvtepi32_ps(c), sc[q]));
                        }
                        acc_f[r][j] = acc;
                    }
                }
                Correction::F32Exact => {
                    let ws: [__m512; BATCH] = std::array::from_fn(|q| {
                        _mm512_cvtepi32_ps(wide.wsum(j, b0 + q.min(live - 1)))
                    });
                    for r in 0..rows {
                        let mut acc = acc_f[r][j];
                        let corr = _mm512_set1_ps(corr_f[r]);
                        for q in 0..live {
                            // SAFETY: as in `acc_i`.
                            let c = unsafe {
                                _mm512_load_si512(ring[q].0[r][j * PANEL..].as_ptr().cast())
                            };
                            let exact = _mm512_fnmadd_ps(corr, ws[q], _mm512_cvtepi32_ps(c));
                            acc = _mm512_add_ps(acc, _mm512_mul_ps(exact, sc[q]));
                        }
                        acc_f[r][j] = acc;
                    }
                }
                Correction::Int32 => {
                    for r in 0..rows {
                        let mut acc = acc_f[r][j];
                        for q in 0..live {
                            let exact = _mm512_cvtepi32_ps(acc_i(q, r));
                            acc = _mm512_add_ps(acc, _mm512_mul_ps(exact, sc[q]));
                        }
                        acc_f[r][j] = acc;
                    }
                }
            }
        }
    };

    let n_batches = blocks.len().div_ceil(BATCH);
    let [ring_even, ring_odd] = accs;
    batch_tiles(unit, 0, ring_even);
    for i in 1..=n_batches {
        let (next, done) = if i % 2 == 0 {
            (&mut *ring_even, &*ring_odd)
        } else {
            (&mut *ring_odd, &*ring_even)
        };
        if i < n_batches {
            batch_tiles(unit, i, next);
        }
        epilogue(&mut acc_f, i - 1, done);
    }

    if blocks.end < n_blocks {
        if let Some(parked) = parked {
            *parked = acc_f;
        }
        return;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The W4A8 tiles walked over K in blocks of scale blocks (each row group's f32 sums parked
    /// between them) give the bits of one walk over all of K: groups of 64 and 128 (corrected
    /// in f32; groups of 32 keep one walk), a partial last block of the walk, one and two row
    /// tiles, on the emulated unit and, where present, the hardware.
    #[test]
    fn w4a8_tiles_walked_in_k_blocks_give_the_bits_of_one_walk() {
        use super::super::budget_changing_bits;
        use crate::{GemmScratch, Par, W4A8Scales};
        use half::bf16;
        use moe_testutil::SplitMix64;
        let sets = super::super::int8_tile_kernel_sets();
        let mut rng = SplitMix64::new(0x4b10c);
        for (k, g) in [(640usize, 64usize), (512, 128), (896, 128)] {
            let n = 33;
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
            let s: Vec<bf16> = (0..n * k / g)
                .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                .collect();
            let bias = rng.vec_uniform(n, -1.0, 1.0);
            let scales = W4A8Scales::Grouped {
                group_size: g,
                scales: &s,
            };
            let packed = crate::PackedW4A8::pack(n, k, &w, scales, Some(&bias)).unwrap();
            let chunk = chunk_len(g);
            let per_block = g.div_ceil(chunk_values(g));
            for m in [0usize, 1, 17, 40] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                for ks in &sets {
                    let run = |out: &mut [f32]| {
                        crate::w4a8_gemm(ks, m, &x, &packed, out, &mut GemmScratch::new(), Par::Seq)
                            .unwrap()
                    };
                    let block_bytes = per_block * m.next_multiple_of(TILE_ROWS) * chunk;
                    let budgets = [1, 2, 3].map(|blocks| blocks * block_bytes);
                    let changed = budget_changing_bits(m * n, budgets, run);
                    assert_eq!(
                        changed, None,
                        "k={k} g={g} m={m}: the budget that changed bits"
                    );
                }
            }
        }
    }

    /// Every weight sum a block of 32 values of `[-8, 7]` can have splits into four s8 parts
    /// that add up to its negation, in the lane of its channel.
    #[test]
    fn correction_parts_add_up_to_the_negated_weight_sum() {
        if crate::x86::Avx512Vnni::try_new().is_none() {
            eprintln!("note: skipping: no AVX-512");
            return;
        }
        for base in (-256..=224).step_by(PANEL) {
            let sums: [i32; PANEL] = std::array::from_fn(|i| (base + i as i32).min(224));
            // SAFETY: AVX-512 F/BW were just checked; 16 readable i32, unaligned load.
            let sums_v = unsafe { _mm512_loadu_si512(sums.as_ptr().cast()) };
            // SAFETY: AVX-512 F/BW were just checked.
            let parts = unsafe { correction_parts(sums_v) };
            let mut row = [0i8; 64];
            // SAFETY: 64 writable bytes; unaligned store.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), parts) };
            for (lane, &sum) in sums.iter().enumerate() {
                let parts = &row[4 * lane..4 * lane + 4];
                let total: i32 = parts.iter().map(|&p| i32::from(p)).sum();
                assert_eq!(total, -sum, "parts {parts:?} of Σw = {sum}");
            }
        }
    }
}
