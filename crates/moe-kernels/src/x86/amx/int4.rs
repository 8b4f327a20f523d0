//! WNA16 GEMMs on the AMX-BF16 tiles with the codes decoded exactly: the numerics of the
//! AVX-512 BF16 dot-product body (`x86/wna16dot.rs`), the products on the tile unit. Int4 codes
//! are decoded here; 8-bit codes (int8 and FP8's e4m3) by `byte_codes.rs`, into B rows of K
//! pairs in K order with activations laid out to match, and then walk the same way.
//!
//! The bf16 tile body (`bf16.rs`) folds each group scale into bf16 weights, `bf16(w·scale)`,
//! so its C tiles hold their sums over all of K; the price is a dequantization of every panel
//! pair per call that costs about four vector instructions per 16 weights, which the tiles
//! only pay back with many rows. Here a B row is two instructions per 32 weights: as in the
//! dot-product body, one `vpsrlw` by `4j` and one `vpermw` through the 32-entry table of code
//! values give K values `j` and `j + 4` of a step's 16 channels as exact bf16 (`c − 8`, or `c`
//! with zero points, or the e2m1 value), which is one B row of `tdpbf16ps` when the activations
//! are laid out in the same pair order ([`fill`]: the dot-product body's rows, cut into
//! [`TiledA`] tiles). The scales stay out of the tiles: at the end of each scale group the C
//! tiles are stored and each row's f32 sums are scaled into its accumulators (less `z · Σx`
//! with zero points), one `vfmadd` per 16 outputs.
//!
//! That per-group epilogue grows with the rows while the dequantization it replaces does not,
//! so the body serves a GEMM only while its rows do not exceed the group size ([`serves`]);
//! past that the bf16 tile body's single epilogue is cheaper. Group boundaries must fall on
//! the tiles' 32-value chunks, so groups that are not multiples of 32 go to the bf16 tile body
//! too.
//!
//! Numerics: activations rounded to bf16 (nearest, ties to even), code values exact, group
//! sums in f32 scaled in f32, as the dot-product body; the tile unit adds in its own order, so
//! results are compared with an f64 model within a tolerance. For 8-bit codes that is closer
//! to the f32 reference than the bf16 tile body, which rounds every `w·scale` to bf16.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::bf16::{CHUNK_BYTES, CHUNK_K};
use super::byte_codes;
use super::common::{
    AccBuf, Bf16Pairs, DecodedSpan, GROUP_ROWS, Row64, SpanTiles, TILE_ROWS, TiledA, span_tiles,
    tiles_for, write_panel_rows,
};
use super::tiles::TileUnit;
use crate::aligned::AlignedVec;
use crate::dispatch::Int4Dot;
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout};
use crate::x86::wna16::{group_scales, load_step, load_zeros};
use crate::x86::wna16_i15::prefetch_stream;
use crate::x86::wna16dot::{bf16_group_sums, pairs16, table};

/// B rows per chunk: one per K pair of the chunk's 32 values.
const CHUNK_ROWS: usize = CHUNK_K / 2;

/// Whether this body takes the GEMM of `m` rows on `w`: one scale group per matrix, or groups
/// of whole chunks with no more rows than values per group; 8-bit codes only where the CPU has
/// the byte permutes their decode needs (AVX-512 VBMI).
pub(crate) fn serves(w: &PackedWna16, m: usize) -> bool {
    (w.bits() == 4 || has_byte_decode())
        && (w.n_groups() == 1 || (w.group_size().is_multiple_of(CHUNK_K) && m <= w.group_size()))
}

/// Whether the CPU has what the decode of 8-bit codes needs (AVX-512 VBMI's byte permutes).
fn has_byte_decode() -> bool {
    std::is_x86_feature_detected!("avx512vbmi")
}

/// This body as a kernel set's dot-product body from `min_m` rows for int4 codes, and for
/// 8-bit ones where the CPU can decode them, running `entry`.
pub(crate) fn body(min_m: usize, entry: crate::wna16::Int4DotPanelsFn) -> Int4Dot {
    Int4Dot {
        unit: "amx-bf16 tiles on exactly decoded codes, up to as many rows as the group size",
        activations: "bf16 activations",
        codes: "",
        min_m,
        max_m: usize::MAX,
        int8: has_byte_decode(),
        e4m3: has_byte_decode(),
        serves,
        fill,
        entry,
    }
}

/// Lays out `m` rows of `x` (K values of `w` each) as [`TiledA`] tiles of [`CHUNK_K`] values,
/// each value rounded to bf16 (nearest, ties to even), in the pair order of `w`'s B rows: for
/// int4 codes the dot-product body's (K values `j` and `j + 4` of each step side by side), for
/// 8-bit codes K order ([`byte_codes`]). K past its end and rows past `m` are zero. For
/// weights with zero points, also writes each row's sums of its bf16 activations per scale
/// group into `sums`, in row-major `[m, n_groups]` order ([`bf16_group_sums`], the
/// dot-product body's sums).
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VL/BF16; `x` holds `m·K` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn fill(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout {
    let k_order = w.bits() == 8;
    let k = w.k();
    let sums = w.zeros().map(|_| (w.group_size(), sums));
    let n_chunks = k.div_ceil(CHUNK_K);
    let tile_bytes = TILE_ROWS * CHUNK_BYTES;
    let bytes = tiles_for(dst, m, CHUNK_BYTES, n_chunks);
    let len = bytes.len();
    for (t, tile_row) in bytes.chunks_exact_mut(n_chunks * tile_bytes).enumerate() {
        for (c, tile) in tile_row.chunks_exact_mut(tile_bytes).enumerate() {
            for (r, a_row) in tile.chunks_exact_mut(CHUNK_BYTES).enumerate() {
                let row = t * TILE_ROWS + r;
                if row >= m {
                    a_row.fill(0);
                    continue;
                }
                let src = &x[row * k..][..k];
                for (half, out) in a_row.chunks_exact_mut(32).enumerate() {
                    let lo = c * CHUNK_K + 16 * half;
                    out.copy_from_slice(&if k_order {
                        byte_codes::bf16x16(src, lo)
                    } else {
                        pairs16(src, lo)
                    });
                }
            }
        }
    }
    if let Some((group, sums)) = sums {
        sums.clear();
        bf16_group_sums(x, m, k, group, sums);
    }
    Int4DotLayout { len, row_bytes: 0 }
}

/// One span of a panel pair's codes decoded to exact bf16 B rows: per panel, the span's chunk
/// `c` has row `4s + j` holding K values `8s + j` and `8s + j + 4` of the chunk's step `s` for
/// the 16 channels; rows past K are zero.
///
/// A span is whole scale groups of at least [`SPAN_CHUNKS`] chunks, so with groups of 32 to
/// 128 both panels' rows take 8 KiB: the decode writes into L1 and the tiles load from there.
/// Decoding a whole pair at once (128 KiB at K = 2048) wrote every row out to L2 and had the
/// tiles load it back from there, which took as long as the products.
#[derive(Default)]
pub(crate) struct CodePair {
    /// `[panel][chunk of the span][CHUNK_ROWS]`.
    rows: Vec<Row64>,
    /// B rows per panel.
    rows_per_panel: usize,
    /// The span's first chunk.
    first_chunk: usize,
}

impl CodePair {
    /// Decodes chunks `chunks` of panels `p..p + nb` (`nb` is 1 or 2) of `w`. Reuses the
    /// buffer, so a thread's calls stop allocating once the longest span is seen.
    ///
    /// # Safety
    /// - The CPU has AVX-512 F/BW, and AVX-512 VBMI when `w` holds 8-bit codes.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) unsafe fn fill(
        &mut self,
        w: &PackedWna16,
        p: usize,
        nb: usize,
        chunks: Range<usize>,
    ) {
        let ks = w.k_steps();
        let steps_per_chunk = CHUNK_K / w.k_step();
        let rows_per_step = CHUNK_ROWS / steps_per_chunk;
        let rows_per_panel = chunks.len() * CHUNK_ROWS;
        let step0 = chunks.start * steps_per_chunk;
        let live_steps = ks.min(chunks.end * steps_per_chunk).saturating_sub(step0);
        self.rows_per_panel = rows_per_panel;
        self.first_chunk = chunks.start;
        self.rows.resize(nb * rows_per_panel, Row64::ZERO);
        for j in 0..nb {
            let panel = &w.codes()[(p + j) * ks * PANEL..][..ks * PANEL];
            let (all_steps, _) = panel.as_chunks::<PANEL>();
            let steps = &all_steps[step0..step0 + live_steps];
            let dst = &mut self.rows[j * rows_per_panel..][..rows_per_panel];
            if w.bits() == 8 {
                // SAFETY: VBMI comes with 8-bit codes (our contract).
                unsafe { decode_bytes(w, (all_steps, step0), steps, dst) };
            } else {
                decode_nibbles(w, (all_steps, step0), steps, dst);
            }
            // A buffer that held other codes keeps finite values here, which the zero
            // activations past K would cancel; zeros keep every product exact.
            dst[live_steps * rows_per_step..].fill(Row64::ZERO);
        }
    }
}

impl DecodedSpan for CodePair {
    fn chunk_rows(&self, j: usize, c: usize) -> *const u8 {
        let at = j * self.rows_per_panel + (c - self.first_chunk) * CHUNK_ROWS;
        self.rows[at..at + CHUNK_ROWS].as_ptr().cast()
    }
}

/// Decodes int4 steps `steps` (step `first` of the panel's `all` onwards) into four B rows each.
#[target_feature(enable = "avx512f,avx512bw")]
fn decode_nibbles(
    w: &PackedWna16,
    (all, first): (&[[u32; PANEL]], usize),
    steps: &[[u32; PANEL]],
    dst: &mut [Row64],
) {
    // SAFETY: the table is 64 readable bytes; unaligned load.
    let lut = unsafe { _mm512_loadu_si512(table(w).as_ptr().cast()) };
    let (quads, _) = dst.as_chunks_mut::<4>();
    for (s, (step, quad)) in steps.iter().zip(quads.iter_mut()).enumerate() {
        // The codes come from DRAM once per call, a span at a time with the tiles' work in
        // between: each panel's stream runs a fixed lead ahead, on into the next pair's panel
        // past its end.
        prefetch_stream::<2>(all, first + s);
        let v = load_step(step);
        let rows = [
            v,
            _mm512_srli_epi16::<4>(v),
            _mm512_srli_epi16::<8>(v),
            _mm512_srli_epi16::<12>(v),
        ];
        for (row, idx) in quad.iter_mut().zip(rows) {
            let bits = _mm512_permutexvar_epi16(idx, lut);
            // SAFETY: a `Row64` is 64 writable, 64-byte aligned bytes we borrow mutably.
            unsafe { _mm512_store_si512(row.0.as_mut_ptr().cast(), bits) };
        }
    }
}

/// Decodes 8-bit steps `steps` (step `first` of the panel's `all` onwards) into two B rows
/// each ([`byte_codes`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn decode_bytes(
    w: &PackedWna16,
    (all, first): (&[[u32; PANEL]], usize),
    steps: &[[u32; PANEL]],
    dst: &mut [Row64],
) {
    let dec = byte_codes::ByteDecoder::new(byte_codes::tables(w));
    let (pairs, _) = dst.as_chunks_mut::<{ byte_codes::ROWS_PER_STEP }>();
    for (s, (step, pair)) in steps.iter().zip(pairs.iter_mut()).enumerate() {
        // As for int4 codes above.
        prefetch_stream::<2>(all, first + s);
        for (row, bits) in pair.iter_mut().zip(dec.rows(load_step(step))) {
            // SAFETY: a `Row64` is 64 writable, 64-byte aligned bytes we borrow mutably.
            unsafe { _mm512_store_si512(row.0.as_mut_ptr().cast(), bits) };
        }
    }
}

/// Chunks of 32 values a span decodes at least: whole scale groups, 8 KiB of B rows for a pair.
/// Alternated in one process (one core, 1536 × 2048, codes from DRAM, 8-32 rows), spans of 4
/// chunks were 6-9 % faster than one chunk with groups of 32, and spans of 16 chunks or all of K
/// 10-40 % slower than 4 with groups of 32 and 128.
const SPAN_CHUNKS: usize = 4;

/// Each row's f32 accumulators for the two panels of a pair, kept between a pair's spans (and,
/// when the walk goes over K in blocks, one set per pair of the walk).
pub(crate) type RowAccs = Vec<[__m512; 2]>;

/// One item of a pair's walk: a row group over one scale group, its C tiles stored in
/// `bufs[buf]`.
#[derive(Clone, Copy)]
struct Item {
    row0: usize,
    rows: usize,
    group: usize,
    buf: usize,
}

/// Chunks of 32 values per scale group of `w`: all of K when it has one group; otherwise groups
/// are whole chunks ([`serves`]).
pub(crate) fn chunks_per_group(w: &PackedWna16) -> usize {
    if w.n_groups() == 1 {
        w.k().div_ceil(CHUNK_K)
    } else {
        w.group_size() / CHUNK_K
    }
}

/// Computes the job's rows in the channels of panels `p..p + nb` over scale groups
/// `groups_of_k`, accumulating into `accs` (a row's two accumulators each): for each span of those groups, decodes
/// the span's codes ([`CodePair::fill`]), then runs each row group of up to 32 rows over each
/// of its groups, the C tiles stored into alternate buffers of `bufs` and scaled into the rows'
/// accumulators once the next item's tiles are issued, so that the tile unit and the vector
/// units work at the same time. Each row still takes its groups in K order. The first group of
/// K sets the accumulators, the others add to them; the last ones write the output.
///
/// # Safety
/// - The CPU has AVX-512 F/BW and AMX-BF16; `unit` is configured with
///   `tile_config(CHUNK_BYTES)`; `a` views this job's rows ([`fill`]).
/// - The job satisfies [`crate::wna16::Int4DotPanelsFn`]'s contract for panels `p..p + nb`
///   (`nb` is 1 or 2) and [`serves`] holds for it; `groups_of_k` lies in `0..n_groups`, `accs`
///   holds `m` rows, and unless `groups_of_k` starts at 0 they hold this pair's sums over every
///   group before it.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)] // one pair's place in the walk over K
pub(crate) unsafe fn int4_pair<U: TileUnit>(
    unit: &mut U,
    job: &Int4DotJob<'_>,
    (codes, a): (&mut CodePair, &TiledA<'_>),
    (p, nb): (usize, usize),
    groups_of_k: Range<usize>,
    bufs: &mut [AccBuf; 2],
    accs: &mut [[__m512; 2]],
) {
    let w = job.w;
    let (k, ng) = (w.k(), w.n_groups());
    let n_chunks = k.div_ceil(CHUNK_K);
    let per_group = chunks_per_group(w);
    let zeros = w.zeros();
    // Scales an item's stored sums into its rows' accumulators: the first group of K sets them
    // (what a multiply-add into zeros gives, but for the sign of a zero), so no pass clears
    // them first.
    let epilogue = |accs: &mut [[__m512; 2]], item: Item, buf: &AccBuf| {
        let first = item.group == 0;
        for j in 0..nb {
            let at = ((p + j) * ng + item.group) * PANEL;
            let scale = group_scales(w.scales(), at);
            let zero = zeros.map(|z| load_zeros(z[at..at + PANEL].try_into().expect("16")));
            for r in 0..item.rows {
                let row = item.row0 + r;
                // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable, 64-byte
                // aligned 32-bit values, here the f32 sums the C tiles stored.
                let mut sum = unsafe { _mm512_load_ps(buf.0[r][j * PANEL..].as_ptr().cast()) };
                if let Some(zero) = zero {
                    let xsum = _mm512_set1_ps(job.group_sums[row * ng + item.group]);
                    sum = _mm512_fnmadd_ps(zero, xsum, sum);
                }
                let acc = &mut accs[row][j];
                *acc = if first {
                    _mm512_mul_ps(sum, scale)
                } else {
                    _mm512_fmadd_ps(sum, scale, *acc)
                };
            }
        }
    };
    let mut pending: Option<Item> = None;
    let mut next_buf = 0;
    let span_groups = (SPAN_CHUNKS / per_group).max(1);
    for first in groups_of_k.clone().step_by(span_groups) {
        let groups = first..groups_of_k.end.min(first + span_groups);
        let chunks = groups.start * per_group..n_chunks.min(groups.end * per_group);
        // SAFETY: `serves` holds for the job (our contract), so 8-bit codes come with VBMI.
        unsafe { codes.fill(w, p, nb, chunks) };
        let codes = &*codes;
        let mut row0 = 0;
        while row0 < job.m {
            let rows = GROUP_ROWS.min(job.m - row0);
            for g in groups.clone() {
                let item = Item {
                    row0,
                    rows,
                    group: g,
                    buf: next_buf,
                };
                let tiles = SpanTiles {
                    span: codes,
                    a,
                    t: row0 / TILE_ROWS,
                    chunks: g * per_group..n_chunks.min((g + 1) * per_group),
                };
                let buf = &mut bufs[item.buf];
                // SAFETY: the unit is configured with 64-byte rows and runs the product
                // (our contract); `a` holds the A tiles of every chunk; `codes` holds the
                // block's decoded rows of the pair's panels; the second A tile exists
                // exactly when the shape says so.
                unsafe {
                    span_tiles::<U, Bf16Pairs, CodePair>(unit, tiles, (rows > TILE_ROWS, nb), buf)
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
    if groups_of_k.end < ng {
        return;
    }
    for j in 0..nb {
        let bias = w.bias().map(|b| &b[(p + j) * PANEL..][..PANEL]);
        // SAFETY: rows `0..m` and panel `p + j`'s channels are inside the validated output and
        // owned by this call (our contract).
        unsafe {
            write_panel_rows((job.out, w.n()), w.n(), (0, job.m), p + j, bias, |r| {
                accs[r][j]
            })
        };
    }
}

#[cfg(test)]
mod tests {
    use moe_testutil::SplitMix64;

    use super::{CHUNK_BYTES, CHUNK_K, TILE_ROWS, TiledA};

    /// The tiled layout holds the dot-product body's rows chunk by chunk, zeros past K and
    /// past the last row, and the same group sums bit for bit.
    #[test]
    fn fill_tiles_the_dot_product_layout() {
        if crate::x86::bf16_dot_kernel_set().is_none() {
            eprintln!("note: skipping: no AVX-512 BF16");
            return;
        }
        let mut rng = SplitMix64::new(0x1a4);
        for (m, k, group) in [
            (1usize, 8usize, 8usize),
            (3, 37, 37),
            (17, 72, 32),
            (33, 200, 64),
        ] {
            let x = rng.vec_uniform(m * k, -3.0, 3.0);
            let (mut rows, mut row_sums) = (crate::aligned::AlignedVec::new(), Vec::new());
            let (mut tiles, mut tile_sums) = (
                crate::aligned::AlignedVec::from(vec![0xAA; 5]),
                vec![1.0; 2],
            );
            let w = crate::PackedWna16::int4_for_layout(k, group, true);
            // SAFETY: AVX-512 F/BW/VL/BF16 were checked above (the set exists); `x` holds
            // `m·k` values.
            let by_row = unsafe { crate::x86::wna16dot::fill(&x, m, &w, &mut row_sums, &mut rows) };
            // SAFETY: as above.
            let tiled = unsafe { super::fill(&x, m, &w, &mut tile_sums, &mut tiles) };
            assert_eq!(row_sums.len(), m * k.div_ceil(group));
            assert_eq!(
                row_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                tile_sums.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "m={m} k={k} group={group}"
            );
            let n_chunks = k.div_ceil(CHUNK_K);
            let a = TiledA::new(&tiles[..tiled.len], m, CHUNK_BYTES, n_chunks);
            for r in 0..m.next_multiple_of(TILE_ROWS) {
                for c in 0..n_chunks {
                    // SAFETY: `row` points at 64 bytes of the layout for every padded row.
                    let got = unsafe { std::slice::from_raw_parts(a.row(r, c), CHUNK_BYTES) };
                    let want: Vec<u8> = (0..CHUNK_BYTES)
                        .map(|i| {
                            let at = c * CHUNK_BYTES + i;
                            if r < m && at < by_row.row_bytes {
                                rows[r * by_row.row_bytes + at]
                            } else {
                                0
                            }
                        })
                        .collect();
                    assert_eq!(got, &want[..], "m={m} k={k} row {r} chunk {c}");
                }
            }
        }
    }
}
