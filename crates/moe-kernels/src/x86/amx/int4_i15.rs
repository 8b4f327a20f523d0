//! WNA16 GEMMs on int4 integer codes with the 15-bit integer activations of
//! [`crate::wna16_i15`], their products on the AMX-INT8 tiles: the numerics of the AVX-512 VNNI
//! integer body (`x86/wna16_i15.rs`) bit for bit, the multiply-adds on the tile unit.
//!
//! Each activation `q = 128·hi + lo` takes two A rows, its signed high bytes and its low bytes
//! (`0..=127`, so signed too), so one A tile holds eight rows of the GEMM and `tdpbsud` (signed
//! A bytes, unsigned B bytes) multiplies both halves with the codes in one product. A B row is
//! four K values of the 16 channels, one per 32-bit lane: one AND of a packed step with
//! `0x0F0F0F0F` gives its even K values and a shift and the same AND its odd ones, so a 64-byte
//! step is two B rows for three instructions, where the bf16 tile body (`int4.rs`) spends two
//! instructions per B row of half as many K values. The A rows hold each step's bytes in the
//! matching order, which is the integer body's layout already: its fill lays out the rows, and
//! [`fill`] cuts them into [`TiledA`] tiles after them in the same buffer.
//!
//! At the end of each block of K (a scale group, or [`crate::wna16_i15::MAX_BLOCK`] values of a
//! longer one) the C tiles are stored and each row's `128·Σc·hi + Σc·lo` goes through the integer
//! body's f32 epilogue in the same order: less `z·Σq`, times the group scale into the row's
//! accumulator. Blocks must start on a tile's 64-value chunk ([`serves`]). As in `int4.rs`, the
//! tiles of the next block are issued before the stored ones are scaled, so that the tile unit
//! and the vector units overlap.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::common::{
    A0, AccBuf, C00, C01, DecodedSpan, GROUP_ROWS, Row64, SignedBytes, SpanTiles, TILE_ROWS,
    TiledA, span_tiles, tiles_len, write_panel_rows,
};
use super::tiles::TileUnit;
use crate::aligned::AlignedVec;
use crate::dispatch::Int4Dot;
use crate::packed::wna16::K_STEP;
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout};
use crate::wna16_i15::{
    Blocks, HEADER_BYTES, RowLayout, SPLIT_STEP_BYTES, integer_body, read_header,
};
use crate::x86::wna16::{group_scales, load_step, load_zeros};
use crate::x86::wna16_i15::prefetch_stream_at;

/// K values per chunk: one 64-byte A row of activation bytes, 16 B rows of four K values.
pub(crate) const CHUNK_K: usize = 64;

/// Packed steps of eight K values per chunk.
const STEPS_PER_CHUNK: usize = CHUNK_K / K_STEP;

/// Rows of the GEMM per row group: each takes two A rows, and a row group has two A tiles.
const GROUP_GEMM_ROWS: usize = GROUP_ROWS / 2;

/// Chunks a span decodes at least (one scale group of 128). The codes stream from DRAM only
/// while a span is decoded, so short spans interleave that stream with the tile work: one
/// core, 28672 × 4096 int4 codes in groups of 128 cycled from memory, spans of 2 chunks drew
/// 8.1-8.8 GB/s of codes at one row and 7.0-7.4 at eight, against 7.2-7.8 and 6.0-6.3 with
/// spans of 4 chunks and 6.5-6.9 and 5.2-5.5 with 8.
const SPAN_CHUNKS: usize = 2;

/// How far ahead of the step it decodes each panel's stream prefetches into L1: in the
/// comparison above, 2 KiB drew 8.8 GB/s at one row against 8.1-8.7 for 4 KiB, 8.4 for 8 KiB.
const PREFETCH_LEAD: usize = 2048;

/// Whether this body takes `w`: int4 integer codes the integer body takes, whose blocks start on
/// 64-value chunks (one block, or groups of a multiple of 64 values).
pub(crate) fn serves(w: &PackedWna16, _m: usize) -> bool {
    w.bits() == 4
        && crate::wna16_i15::serves(w, false)
        && (w.n_groups() == 1 || w.group_size().is_multiple_of(CHUNK_K))
}

/// This body as a kernel set's int4 dot-product body for GEMMs of `min_m` rows up to `max_m`
/// (exclusive), running `entry`.
pub(crate) fn body(min_m: usize, max_m: usize, entry: crate::wna16::Int4DotPanelsFn) -> Int4Dot {
    let mut body = integer_body(
        "amx-int8 tiles on codes decoded to bytes, scale groups of whole 64-value chunks",
        fill,
        entry,
        (min_m, max_m),
        (false, false),
    );
    body.serves = serves;
    body
}

/// Bytes [`fill`] lays out for `rows` rows of K values `k`: the integer body's rows, then
/// (from the next 64-byte boundary) their tiles.
pub(crate) fn layout_bytes(k: usize, rows: usize) -> usize {
    (rows * RowLayout::row_bytes(k, SPLIT_STEP_BYTES)).next_multiple_of(64)
        + tiles_len(2 * rows, CHUNK_K, k.div_ceil(CHUNK_K))
}

/// Lays out `m` rows of `x` as the integer body does (headers, byte-split steps and block sums,
/// `x86/wna16_i15.rs`), then, from the next 64-byte boundary, the same bytes as [`TiledA`]
/// tiles of [`CHUNK_K`] values: GEMM row `r` is A row `2r` (its high bytes) and `2r + 1` (its
/// low bytes), each chunk's row the eight steps' halves side by side; zeros past K and past
/// the last row.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VL; `x` holds `m·K` values of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn fill(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout {
    let k = w.k();
    let total = layout_bytes(k, m);
    dst.grow_to(total);
    // SAFETY: our contract is the integer body's fill's.
    let rows = unsafe { crate::x86::wna16_i15::fill(x, m, w, sums, dst) };
    let (row_part, tile_part) = dst[..total].split_at_mut(rows.len.next_multiple_of(64));
    tile_rows(&row_part[..rows.len], rows.row_bytes, m, k, tile_part);
    Int4DotLayout {
        len: total,
        row_bytes: rows.row_bytes,
    }
}

/// Cuts `m` rows of the integer layout (`row_bytes` each) into the tiles of [`fill`].
fn tile_rows(rows: &[u8], row_bytes: usize, m: usize, k: usize, tiles: &mut [u8]) {
    let steps = k.div_ceil(K_STEP);
    let n_chunks = k.div_ceil(CHUNK_K);
    let tile_bytes = TILE_ROWS * CHUNK_K;
    for (t, tile_row) in tiles.chunks_exact_mut(n_chunks * tile_bytes).enumerate() {
        for (c, tile) in tile_row.chunks_exact_mut(tile_bytes).enumerate() {
            for (i, a_row) in tile.chunks_exact_mut(CHUNK_K).enumerate() {
                let (row, half) = ((t * TILE_ROWS + i) / 2, i % 2);
                if row >= m {
                    a_row.fill(0);
                    continue;
                }
                let src = &rows[row * row_bytes + HEADER_BYTES..][..steps * SPLIT_STEP_BYTES];
                let (src_steps, _) = src.as_chunks::<SPLIT_STEP_BYTES>();
                let (dst_steps, _) = a_row.as_chunks_mut::<K_STEP>();
                for (s, dst) in dst_steps.iter_mut().enumerate() {
                    *dst = match src_steps.get(c * STEPS_PER_CHUNK + s) {
                        Some(step) => step[K_STEP * half..][..K_STEP].try_into().expect("8"),
                        None => [0; K_STEP],
                    };
                }
            }
        }
    }
}

/// One span of a panel pair's codes as B rows of bytes: per panel, the span's chunk `c` has row
/// `2s` holding the even K values of the chunk's step `s` for the 16 channels, row `2s + 1` the
/// odd ones; rows past K are zero.
#[derive(Default)]
pub(crate) struct BytePair {
    /// `[panel][chunk of the span][TILE_ROWS]`.
    rows: Vec<Row64>,
    /// B rows per panel.
    rows_per_panel: usize,
    /// The span's first chunk.
    first_chunk: usize,
}

impl BytePair {
    /// Decodes chunks `chunks` of panels `p..p + nb` (`nb` is 1 or 2) of `w`. Reuses the
    /// buffer, so a thread's calls stop allocating once the longest span is seen.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn fill(&mut self, w: &PackedWna16, p: usize, nb: usize, chunks: Range<usize>) {
        let ks = w.k_steps();
        let rows_per_panel = chunks.len() * TILE_ROWS;
        let step0 = chunks.start * STEPS_PER_CHUNK;
        let live_steps = ks.min(chunks.end * STEPS_PER_CHUNK).saturating_sub(step0);
        self.rows_per_panel = rows_per_panel;
        self.first_chunk = chunks.start;
        self.rows.resize(nb * rows_per_panel, Row64::ZERO);
        let nibbles = _mm512_set1_epi32(0x0F0F_0F0F);
        for j in 0..nb {
            let panel = &w.codes()[(p + j) * ks * PANEL..][..ks * PANEL];
            let (all_steps, _) = panel.as_chunks::<PANEL>();
            let steps = &all_steps[step0..step0 + live_steps];
            let dst = &mut self.rows[j * rows_per_panel..][..rows_per_panel];
            let (pairs, _) = dst.as_chunks_mut::<2>();
            for (s, (step, pair)) in steps.iter().zip(pairs.iter_mut()).enumerate() {
                // The codes come from DRAM once per call.
                prefetch_stream_at::<2, PREFETCH_LEAD>(all_steps, step0 + s);
                let v = load_step(step);
                let even = _mm512_and_si512(v, nibbles);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibbles);
                for (row, bits) in pair.iter_mut().zip([even, odd]) {
                    // SAFETY: a `Row64` is 64 writable, 64-byte aligned bytes we borrow mutably.
                    unsafe { _mm512_store_si512(row.0.as_mut_ptr().cast(), bits) };
                }
            }
            // A buffer that held other codes would meet the zero activations past K there;
            // zeros keep the unused rows out of every sum.
            dst[2 * live_steps..].fill(Row64::ZERO);
        }
    }
}

impl DecodedSpan for BytePair {
    fn chunk_rows(&self, j: usize, c: usize) -> *const u8 {
        let at = j * self.rows_per_panel + (c - self.first_chunk) * TILE_ROWS;
        self.rows[at..at + TILE_ROWS].as_ptr().cast()
    }
}

/// Each GEMM row's f32 accumulators for the two panels of a pair.
pub(crate) type RowAccs = Vec<[__m512; 2]>;

/// One item of a pair's walk: a row group over one block of K, its C tiles stored in
/// `bufs[buf]`.
#[derive(Clone, Copy)]
struct Item {
    row0: usize,
    rows: usize,
    block: usize,
    buf: usize,
}

/// Channels `16j..16j + 16` of row `r` of a C-tile buffer.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_sums(buf: &AccBuf, r: usize, j: usize) -> __m512i {
    let sums: &[i32; PANEL] = buf.0[r][j * PANEL..][..PANEL].try_into().expect("16 sums");
    // SAFETY: 16 readable i32, 64-byte aligned (an `AccBuf` row is, and `16j` of them past it).
    unsafe { _mm512_load_si512(sums.as_ptr().cast()) }
}

/// The chunks of block `b` of `blocks` (empty past K).
fn block_chunks(blocks: &Blocks, b: usize) -> Range<usize> {
    let r = blocks.k_range(b / blocks.per_group, b % blocks.per_group);
    if r.is_empty() {
        return 0..0;
    }
    r.start / CHUNK_K..r.end.div_ceil(CHUNK_K)
}

/// The chunks of the blocks `span` of `blocks`, from the first chunk of its first block to the
/// last of its last (empty blocks, past K, hold none).
fn span_chunks(blocks: &Blocks, span: Range<usize>) -> Range<usize> {
    span.map(|b| block_chunks(blocks, b))
        .filter(|c| !c.is_empty())
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
        .unwrap_or(0..0)
}

/// Walks `panels` in pairs on a unit it configures and releases: for each span of whole blocks
/// of at least [`SPAN_CHUNKS`] chunks, decodes the pair's codes ([`BytePair::fill`]), then runs
/// each row group over each block of the span; then writes the pair's rows.
///
/// # Safety
/// - The CPU has AVX-512 F/BW and `unit` can run AMX-INT8 tile instructions;
/// - the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s contract with this module's
///   [`fill`], and [`serves`] holds for its weights.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn panels<U: TileUnit>(
    unit: &mut U,
    job: &Int4DotJob<'_>,
    panels: Range<usize>,
    (codes, accs): (&mut BytePair, &mut RowAccs),
) {
    // A GEMM of fewer than 8 rows fills only `2m` rows of its one A tile, and the products
    // and C tile stores of a tile shaped to those rows take less time than of a full one.
    let live = (2 * job.m).min(TILE_ROWS);
    let cfg = super::common::tile_config(CHUNK_K)
        .with_tile(C00, live, 4 * PANEL)
        .with_tile(C01, live, 4 * PANEL)
        .with_tile(A0, live, CHUNK_K);
    // SAFETY: every shape is legal (`with_tile` checks), and C tiles match their A tiles.
    unsafe { unit.configure(&cfg) };
    let w = job.w;
    let n_chunks = w.k().div_ceil(CHUNK_K);
    let tiles_at = (job.m * job.row_bytes).next_multiple_of(64);
    let a = TiledA::new(&job.pairs[tiles_at..], 2 * job.m, CHUNK_K, n_chunks);
    let mut bufs = [AccBuf::zeroed(), AccBuf::zeroed()];
    accs.resize(job.m, [_mm512_setzero_ps(); 2]);
    for p in panels.clone().step_by(2) {
        let nb = 2.min(panels.end - p);
        accs.fill([_mm512_setzero_ps(); 2]);
        // SAFETY: the unit is configured for 64-byte chunks, `a` views this job's tiles, and
        // the job contract is forwarded.
        unsafe { pair(unit, job, (codes, &a), (p, nb), &mut bufs, accs) };
    }
    unit.release();
}

/// Panels `p..p + nb` (`nb` 1 or 2) of the job over all of K into `accs` (zeroed), then the
/// output.
///
/// # Safety
/// - As [`panels`], with `unit` configured for [`CHUNK_K`] and `a` this job's tiles; `accs`
///   holds `m` zeroed rows.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pair<U: TileUnit>(
    unit: &mut U,
    job: &Int4DotJob<'_>,
    (codes, a): (&mut BytePair, &TiledA<'_>),
    (p, nb): (usize, usize),
    bufs: &mut [AccBuf; 2],
    accs: &mut [[__m512; 2]],
) {
    let w = job.w;
    let ng = w.n_groups();
    let blocks = Blocks::of(w);
    let nbk = blocks.count(ng);
    let zeros = w.zeros();
    let symmetric = _mm512_set1_ps(f32::from(w.symmetric_zero()));
    // The integer body's block epilogue for an item's stored sums.
    let epilogue = |accs: &mut [[__m512; 2]], item: Item, buf: &AccBuf| {
        let g = item.block / blocks.per_group;
        for j in 0..nb {
            let at = ((p + j) * ng + g) * PANEL;
            let scale = group_scales(w.scales(), at);
            let zero = match zeros {
                Some(z) => load_zeros(z[at..at + PANEL].try_into().expect("16")),
                None => symmetric,
            };
            for i in 0..item.rows {
                let row = item.row0 + i;
                // The high-byte sums of GEMM row `row` (A row `2i`), then its low-byte ones.
                let (hi, lo) = (load_sums(buf, 2 * i, j), load_sums(buf, 2 * i + 1, j));
                let d = _mm512_add_epi32(_mm512_slli_epi32::<7>(hi), lo);
                let xsum = _mm512_set1_ps(job.group_sums[row * nbk + item.block]);
                let t = _mm512_fnmadd_ps(zero, xsum, _mm512_cvtepi32_ps(d));
                accs[row][j] = _mm512_fmadd_ps(t, scale, accs[row][j]);
            }
        }
    };
    let per_block = match blocks.block_len() / CHUNK_K {
        0 => SPAN_CHUNKS,
        c => c,
    };
    let span_blocks = (SPAN_CHUNKS / per_block).max(1);
    let mut pending: Option<Item> = None;
    let mut next_buf = 0;
    for first in (0..nbk).step_by(span_blocks) {
        let span = first..nbk.min(first + span_blocks);
        let chunks = span_chunks(&blocks, span.clone());
        if chunks.is_empty() {
            continue;
        }
        codes.fill(w, p, nb, chunks);
        let codes = &*codes;
        let mut row0 = 0;
        while row0 < job.m {
            let rows = GROUP_GEMM_ROWS.min(job.m - row0);
            for b in span.clone() {
                let chunks = block_chunks(&blocks, b);
                if chunks.is_empty() {
                    continue;
                }
                let item = Item {
                    row0,
                    rows,
                    block: b,
                    buf: next_buf,
                };
                let tiles = SpanTiles {
                    span: codes,
                    a,
                    t: 2 * row0 / TILE_ROWS,
                    chunks,
                };
                let buf = &mut bufs[item.buf];
                // SAFETY: the unit is configured with 64-byte rows and runs the product
                // (our contract); `a` holds the A tiles of every chunk; `codes` holds the
                // block's decoded rows of the pair's panels; the second A tile exists
                // exactly when the shape says so.
                unsafe {
                    span_tiles::<U, SignedBytes, BytePair>(
                        unit,
                        tiles,
                        (2 * rows > TILE_ROWS, nb),
                        buf,
                    )
                };
                if let Some(done) = pending {
                    epilogue(accs, done, &bufs[done.buf]);
                }
                pending = Some(item);
                next_buf ^= 1;
            }
            row0 += rows;
        }
    }
    if let Some(done) = pending {
        epilogue(accs, done, &bufs[done.buf]);
    }
    for j in 0..nb {
        let bias = w.bias().map(|b| &b[(p + j) * PANEL..][..PANEL]);
        let y = |r: usize| {
            let (scale, post) = read_header(&job.pairs[r * job.row_bytes..][..job.row_bytes]);
            let scaled = _mm512_mul_ps(accs[r][j], _mm512_set1_ps(scale));
            _mm512_mul_ps(scaled, _mm512_set1_ps(post))
        };
        // SAFETY: rows `0..m` and panel `p + j`'s channels are inside the validated output and
        // owned by this call (our contract).
        unsafe { write_panel_rows((job.out, w.n()), w.n(), (0, job.m), p + j, bias, y) };
    }
}

#[cfg(test)]
mod tests {
    use super::serves;
    use crate::PackedWna16;

    /// The sets that put this body first take the int4 GEMMs whose blocks start on a chunk
    /// (groups of 64 and 128, one group over all of K, long and short) at every row count, and
    /// leave groups of 32 and 40 and int8 codes to the body after it.
    #[test]
    fn takes_int4_blocks_of_whole_chunks_and_leaves_the_rest() {
        let sets = [
            super::super::emulated::i15_tile_kernel_set(),
            super::super::hardware_i15_tile_kernel_set(),
        ];
        let this = super::body(1, usize::MAX, |_, _| {}).unit;
        for ks in sets.into_iter().flatten() {
            for (k, group, takes) in [
                (256usize, 128usize, true),
                (200, 64, true),
                (37, 37, true),
                (2100, 2100, true),
                (4100, 128, true),
                (100, 32, false),
                (120, 40, false),
            ] {
                let w = PackedWna16::int4_for_layout(k, group, false);
                assert_eq!(serves(&w, 1), takes, "k={k} group={group}");
                for m in [1usize, 2, 8, 9, 16, 17, 40] {
                    let body = ks.wna16_int4_dot_for(&w, m).expect("an integer body");
                    assert_eq!(body.unit == this, takes, "k={k} group={group} m={m}");
                }
            }
        }
    }
}
