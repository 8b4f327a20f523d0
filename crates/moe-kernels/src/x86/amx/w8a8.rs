//! The W8A8 tile body: one row group (up to 32 rows) × one panel pair (up to 32 channels) per
//! step, the four C tiles held in the tile registers over the whole of K.
//!
//! The packed int8 panel already is a stack of B rows in VNNI order (each 64-byte step holds
//! K values `4s..4s+4` of the 16 channels), so whole 64-value chunks load straight from the
//! packed weights; only a ragged last chunk goes through a zero-padded copy, made once per
//! panel pair. With one scale per channel nothing happens between chunks: the int32 sums over
//! all of K take the AVX-512 VNNI kernel's epilogue once per output tile (`acc − 128·Σw`, times
//! `xs·ws`), so outputs equal the scalar reference bit for bit.

use std::arch::x86_64::*;
use std::ops::Range;

use super::common::{
    ARows, AccBuf, GROUP_ROWS, KBlock, TILE_ROWS, TileBuf, TiledA, dpbusd_live, load_a_live,
    load_b_live, load_c_live, prefetch_b_live, store_live, tile_rows, tiles_len, zero_live,
};
use super::tiles::{TILE_MAX_COLSB, TileUnit};
use crate::aligned::AlignedVec;
use crate::packed::{PANEL, PackedW8A8, STEP_BYTES, w8a8::K_STEP};
use crate::ukernel::W8A8Job;

/// K values per chunk: one full 64-byte A row.
pub(crate) const CHUNK: usize = TILE_MAX_COLSB;

/// How many chunks ahead of the products the step prefetches its B rows. The first row group
/// over a pair reads them from memory, and the tile loads alone keep too few lines in flight:
/// on one core, N × K = 1536 × 2048 with weights streaming from memory, prefetching 1, 2 or 3
/// chunks ahead ran 32 and 64 rows 1.25-1.4× faster than none, 8 chunks about half as much;
/// rows already in L2 (the later row groups) run the same with or without it.
const PREFETCH_CHUNKS: usize = 2;

/// The chunks of a GEMM with `k_pad` K values: `(first K value, values)` of chunk `c`, and
/// their count.
pub(crate) fn chunks(k_pad: usize) -> (usize, impl Fn(usize) -> (usize, usize)) {
    (k_pad.div_ceil(CHUNK), move |c| {
        (c * CHUNK, CHUNK.min(k_pad - c * CHUNK))
    })
}

/// Bytes of the layout [`tile_a`] makes for `m` rows of `k_pad` values, to size scratch up
/// front (the scale blocks do not matter: one scale per channel, or requantised to one).
pub(crate) fn tile_a_bytes(m: usize, k_pad: usize, _block_len: usize) -> usize {
    tiles_len(m, CHUNK, chunks(k_pad).0)
}

/// Re-lays a GEMM's encoded rows for the W8A8 tiles (the driver's layout hook).
pub(crate) fn tile_a(a: &[u8], m: usize, k_pad: usize, dst: &mut AlignedVec<u8>) {
    let (n_chunks, starts) = chunks(k_pad);
    tile_rows(ARows { a, m, k_pad }, CHUNK, n_chunks, starts, dst);
}

/// Zero-padded copies of the ragged last chunk of a panel pair, one per panel: its steps, then
/// zero rows. A walk keeps one for all its pairs.
pub(crate) type Tails = [TileBuf; 2];

/// The B side of one step: the packed bytes of up to two adjacent panels and, when K is not a
/// multiple of [`CHUNK`], zero-padded copies of their ragged last chunk.
pub(crate) struct PanelPair<'a> {
    /// First panel of the pair.
    p: usize,
    /// The packed panels (the second repeats the first when the pair has one panel).
    panels: [&'a [u8]; 2],
    /// The last chunk of each panel, filled when K is not a multiple of [`CHUNK`].
    tail: &'a Tails,
}

impl<'a> PanelPair<'a> {
    /// Panels `p..p + nb` (`nb` is 1 or 2) of `w`, their ragged last chunk copied into `tails`
    /// if K has one (every K value of a copy past the panel's data is zero, as a fresh
    /// [`TileBuf`] is and no copy writes there).
    pub(crate) fn new(w: &'a PackedW8A8, p: usize, nb: usize, tails: &'a mut Tails) -> Self {
        let bytes = |p: usize| {
            let panel = w.panel_bytes(p);
            // SAFETY: `i8` and `u8` have the same size, alignment and validity.
            unsafe { std::slice::from_raw_parts(panel.as_ptr().cast::<u8>(), panel.len()) }
        };
        let panels = [bytes(p), bytes(p + nb - 1)];
        let full = w.k_pad() / CHUNK * CHUNK;
        if full < w.k_pad() {
            for (buf, panel) in tails.iter_mut().zip(panels) {
                let (steps, _) = panel[full / K_STEP * STEP_BYTES..].as_chunks::<STEP_BYTES>();
                for (row, step) in buf.0.iter_mut().zip(steps) {
                    *row = *step;
                }
            }
        }
        Self {
            p,
            panels,
            tail: tails,
        }
    }
}

/// Computes rows `row0..row0 + min(32, m − row0)` of the pair's channels over chunks
/// `chunks`, resuming from and parking its C tiles in `acc` as `block` says (the epilogue runs
/// after the last block). `NA` is 2 when the group has more than 16 rows, `NB` the number of
/// panels in the pair. The int32 sums add the chunks in K order whatever the blocks, so a
/// walk in blocks gives the bits of one over all of K.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; `unit` is configured with `tile_config(CHUNK)`, and `a`
///   holds this job's rows filled with [`chunks`].
/// - The job satisfies [`crate::ukernel::W8A8PanelsFn`]'s contract for the pair's panels;
///   `row0 < job.m` is a multiple of 16, and `row0 + 16 < job.m` exactly when `NA == 2`.
/// - `chunks` lies within the GEMM's chunks; unless `block` is [`KBlock::Whole`] or
///   [`KBlock::First`], `acc` holds what the previous block of the same row group and pair
///   parked.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)] // one row group's place in the walk
pub(crate) unsafe fn w8a8_step<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    job: &W8A8Job<'_>,
    pair: &PanelPair<'_>,
    a: &TiledA<'_>,
    row0: usize,
    chunks: Range<usize>,
    block: KBlock,
    acc: &mut AccBuf,
) {
    let w = job.w;
    let t = row0 / TILE_ROWS;
    // SAFETY: for this and the tile calls below, the unit is configured for `CHUNK` (our
    // contract); `a` holds the row tiles `t..t + NA` of every chunk; each B pointer starts 16
    // readable 64-byte rows: a whole chunk of a packed panel or a tail buffer; `acc` holds this
    // row group's parked tiles when resuming.
    match block {
        // SAFETY: see above.
        KBlock::Whole | KBlock::First => unsafe { zero_live::<U, NA, NB>(unit) },
        // SAFETY: see above.
        KBlock::Middle | KBlock::Last => unsafe { load_c_live::<U, NA, NB>(unit, acc) },
    }
    let full = w.k_pad() / CHUNK;
    let chunk_bytes = CHUNK / K_STEP * STEP_BYTES;
    let ahead_end = chunks.end.min(full);
    for c in chunks {
        // SAFETY: see above.
        unsafe { load_a_live::<U, NA>(unit, a, t, c) };
        if c < full {
            let at = c * chunk_bytes;
            if c + PREFETCH_CHUNKS < ahead_end {
                let ahead = at + PREFETCH_CHUNKS * chunk_bytes;
                let b = pair.panels.map(|panel| panel[ahead..].as_ptr());
                prefetch_b_live::<NB>(b, CHUNK / K_STEP);
            }
            let b = [pair.panels[0][at..].as_ptr(), pair.panels[1][at..].as_ptr()];
            // SAFETY: see above; `at + 16·64 ≤` the panel's length because chunk `c` is whole.
            unsafe { load_b_live::<U, NB>(unit, b) };
        } else {
            let b = pair.tail.each_ref().map(|t| t.0.as_ptr().cast::<u8>());
            // SAFETY: see above.
            unsafe { load_b_live::<U, NB>(unit, b) };
        }
        // SAFETY: see above.
        unsafe { dpbusd_live::<U, NA, NB>(unit) };
    }
    // SAFETY: see above.
    unsafe { store_live::<U, NA, NB>(unit, acc) };
    if matches!(block, KBlock::First | KBlock::Middle) {
        return;
    }

    let rows = GROUP_ROWS.min(job.m - row0);
    for j in 0..NB {
        let p = pair.p + j;
        // SAFETY: the panel's sums and scales are 16 readable values each; unaligned loads.
        let comp =
            _mm512_slli_epi32::<7>(unsafe { _mm512_loadu_si512(w.panel_wsum(p).as_ptr().cast()) });
        // SAFETY: as above.
        let scales = unsafe { _mm512_loadu_ps(w.panel_scales(p).as_ptr()) };
        let valid = PANEL.min(w.n() - p * PANEL);
        let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
        for (r, acc_row) in acc.0[..rows].iter().enumerate() {
            // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable i32, 64-byte
            // aligned.
            let c = unsafe { _mm512_load_si512(acc_row[j * PANEL..].as_ptr().cast()) };
            let exact = _mm512_sub_epi32(c, comp);
            let dequant = _mm512_mul_ps(_mm512_set1_ps(job.row_scale[row0 + r]), scales);
            let y = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), dequant);
            let dst = job.out.wrapping_add((row0 + r) * job.ld + p * PANEL);
            // SAFETY: row `row0 + r < m` and channels `16p..16p + valid < N` are inside the
            // validated output and owned by this call; masked-out lanes are not accessed.
            unsafe { _mm512_mask_storeu_ps(dst, keep, y) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The W8A8 tiles walked over K in blocks of chunks (each row group's C tiles parked between
    /// them) give the bits of one walk over all of K: blocks of one to three chunks, a partial
    /// last block, a ragged last chunk (K not a multiple of 64), one and two panels in the last
    /// pair, one and two row tiles, on the emulated unit and, where present, the hardware.
    #[test]
    fn w8a8_tiles_walked_in_k_blocks_give_the_bits_of_one_walk() {
        use super::super::budget_changing_bits;
        use crate::{GemmScratch, PackedW8A8, Par};
        use moe_testutil::SplitMix64;
        let sets = super::super::int8_tile_kernel_sets();
        let mut rng = SplitMix64::new(0x8a8b);
        for (n, k) in [(33usize, 320usize), (64, 452), (17, 200)] {
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-127, 127) as i8).collect();
            let scales = rng.vec_uniform(n, 0.001, 0.01);
            let packed = PackedW8A8::pack(n, k, &w, &scales).unwrap();
            for m in [0usize, 1, 17, 40] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                for ks in &sets {
                    let packed = packed.clone().with_order(ks.panel_order());
                    let run = |out: &mut [f32]| {
                        crate::w8a8_gemm(ks, m, &x, &packed, out, &mut GemmScratch::new(), Par::Seq)
                            .unwrap()
                    };
                    let chunk_bytes = m.next_multiple_of(TILE_ROWS) * CHUNK + 2 * 16 * 64;
                    let budgets = [1, 2, 3].map(|chunks| chunks * chunk_bytes);
                    let changed = budget_changing_bits(m * n, budgets, run);
                    assert_eq!(
                        changed, None,
                        "n={n} k={k} m={m}: the budget that changed bits"
                    );
                }
            }
        }
    }
}
