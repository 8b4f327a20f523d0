//! The bf16 tile body for int4 weights: activations rounded to bf16, weights dequantized to
//! bf16 (`bf16(w·scale)`) once per call, products on AMX-BF16 (`tdpbf16ps`) with the four C
//! tiles of a step held in the tile registers over the whole of K.
//!
//! With group scales the int8 body must leave the tile unit after every scale block (store the
//! C tiles, scale, add in f32); here the scale is inside the bf16 weights, so a C tile is stored
//! once. The price is numerics: each activation and each scaled weight is rounded to bf16
//! (relative error at most 2^-8 each) instead of the activations to int8, which is closer to
//! the f32 reference than W4A8 but not bit-equal to it or to vLLM's W4A8 kernel. The tile unit
//! adds in its own order, so results are compared with a reference within a tolerance, not bit
//! for bit.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::common::{
    AccBuf, GROUP_ROWS, KBlock, Row64, TILE_ROWS, TiledA, dpbf16_live, load_a_live, load_b_live,
    load_c_live, store_live, tiles_for, write_panel_rows, zero_live,
};
use super::tiles::TileUnit;
use crate::aligned::AlignedVec;
use crate::packed::wna16::{K_STEP as K_STEP_WNA16, K_STEP8};
use crate::packed::{PANEL, PackedDense, PackedW4A8, PackedWna16, STEP_BYTES, w4a8::K_STEP};
use crate::ukernel::{Bf16Weights, W4Bf16Job};
use crate::x86::wna16::{decode_e4m3, decode8, prefetch_ahead};

/// K values per chunk: 32 bf16 fill one 64-byte A row.
pub(crate) const CHUNK_K: usize = 32;
/// Bytes per A tile row.
pub(crate) const CHUNK_BYTES: usize = 2 * CHUNK_K;
/// B rows per chunk: one per K pair.
const CHUNK_ROWS: usize = CHUNK_K / 2;

/// Rounds 16 f32 to bf16 (nearest, ties to even; NaN stays NaN).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn to_bf16(v: __m512) -> __m256i {
    let h = _mm512_cvtneps_pbh(v);
    // SAFETY: both are plain 256-bit vectors; the bf16 type is a bit pattern the tiles read as
    // bytes.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(h) }
}

/// Fills `dst` with the rows of `x` (`m` rows of `k` values) rounded to bf16, as [`TiledA`]
/// tiles of [`CHUNK_K`] values; K past `k` and rows past `m` are zero.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) fn fill_a(x: &[f32], m: usize, k: usize, dst: &mut AlignedVec<u8>) {
    let n_chunks = k.div_ceil(CHUNK_K);
    let bytes = tiles_for(dst, m, CHUNK_BYTES, n_chunks);
    if n_chunks == 0 {
        return;
    }
    let tile_bytes = TILE_ROWS * CHUNK_BYTES;
    for (t, tile_row) in bytes.chunks_exact_mut(n_chunks * tile_bytes).enumerate() {
        for (c, block) in tile_row.chunks_exact_mut(tile_bytes).enumerate() {
            let k0 = c * CHUNK_K;
            let len = CHUNK_K.min(k - k0);
            for (r, dst) in block.chunks_exact_mut(CHUNK_BYTES).enumerate() {
                let row = t * TILE_ROWS + r;
                if row >= m {
                    dst.fill(0);
                    continue;
                }
                let src = &x[row * k + k0..][..len];
                for (half, out) in dst.chunks_exact_mut(32).enumerate() {
                    let lo = (16 * half).min(len);
                    let n = (len - lo).min(16);
                    let keep: __mmask16 = if n == 16 { !0 } else { (1 << n) - 1 };
                    // SAFETY: the masked load reads only the `n` values `src[lo..lo + n]`.
                    let v = unsafe { _mm512_maskz_loadu_ps(keep, src[lo..].as_ptr()) };
                    let h = to_bf16(v);
                    // SAFETY: `out` is 32 writable bytes; unaligned store.
                    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), h) };
                }
            }
        }
    }
}

/// A panel pair's weights over a range of chunks dequantized to bf16 B rows: per panel, row
/// `r` of chunk `c` holds K values `32c + 2r` and `32c + 2r + 1` of the 16 channels
/// (`bf16(w·scale)` each), K padded with zeros to whole chunks.
#[derive(Default)]
pub(crate) struct WideBf16Pair {
    /// `[panel][row]`.
    rows: Vec<Row64>,
    /// B rows per panel.
    rows_per_panel: usize,
    /// The range's first chunk.
    first_chunk: usize,
}

/// Interleaves the even (lanes 0..16) and odd (lanes 16..32) bf16 of `vcvtne2ps2bf16` into one
/// pair per channel: the index vector of `vpermw`.
#[target_feature(enable = "avx512f,avx512bw")]
fn pair_index() -> __m512i {
    _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    )
}

/// Stores one B row.
#[target_feature(enable = "avx512f")]
fn store_row(row: &mut Row64, bits: __m512i) {
    // SAFETY: a `Row64` is 64 writable, 64-byte aligned bytes we borrow mutably.
    unsafe { _mm512_store_si512(row.0.as_mut_ptr().cast(), bits) };
}

/// One B row from two vectors of 16 f32 weights (K values `2r` and `2r + 1`).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn store_pair(row: &mut Row64, even: __m512, odd: __m512, pairs: __m512i) {
    let both = _mm512_cvtne2ps_pbh(odd, even);
    // SAFETY: the bf16 vector type is a bit pattern.
    let both = unsafe { std::mem::transmute::<__m512bh, __m512i>(both) };
    store_row(row, _mm512_permutexvar_epi16(pairs, both));
}

impl WideBf16Pair {
    /// Dequantizes chunks `chunks` of panels `p..p + nb` (`nb` is 1 or 2) of `w`. Reuses the
    /// buffer, so a thread's calls stop allocating once the longest range is seen.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(crate) fn fill(&mut self, w: Bf16Weights<'_>, p: usize, nb: usize, chunks: Range<usize>) {
        let rows_per_panel = chunks.len() * CHUNK_ROWS;
        self.rows_per_panel = rows_per_panel;
        self.first_chunk = chunks.start;
        self.rows.resize(nb * rows_per_panel, Row64::ZERO);
        let rows = chunks.start * CHUNK_ROWS..chunks.end * CHUNK_ROWS;
        let written = match w {
            Bf16Weights::W4A8(w) => self.fill_w4a8(w, p, nb, rows),
            Bf16Weights::Wna16(w) => self.fill_wna16(w, p, nb, rows),
            Bf16Weights::Dense(w) => self.fill_dense(w, p, nb, rows),
        };
        // The rows past K meet zero activations. Every weight is finite, so what a longer
        // matrix left here would add zeros too; clearing the few rows past K keeps that exact
        // without relying on it.
        for j in 0..nb {
            self.rows[j * rows_per_panel + written..(j + 1) * rows_per_panel].fill(Row64::ZERO);
        }
    }

    /// [`WideBf16Pair::fill`] from bf16 dense panels, whose weights are B rows as they are:
    /// K values `2r` and `2r + 1` of a panel's 16 channels are 64 consecutive bytes (the panel
    /// is K-major), even channels' values first, which `vpermw` interleaves into pairs. An odd
    /// K leaves the last row's odd halves zero, as are the rows past K. Fills B rows `rows`
    /// and returns how many of them hold weights.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn fill_dense(&mut self, w: &PackedDense, p: usize, nb: usize, rows: Range<usize>) -> usize {
        let rows_per_panel = self.rows_per_panel;
        let k = w.k();
        let Some(values) = w.bf16_values() else {
            debug_assert!(false, "the bf16 path takes bf16 dense weights only");
            return 0;
        };
        let end = rows.end.min(k.div_ceil(2));
        let live = rows.start.min(end)..end;
        let pairs = pair_index();
        for j in 0..nb {
            let panel = &values[(p + j) * k * PANEL..][..k * PANEL];
            let dst = &mut self.rows[j * rows_per_panel..][..live.len()];
            let (whole, tail) = panel.as_chunks::<{ 2 * PANEL }>();
            let whole_live = &whole[live.start.min(whole.len())..live.end.min(whole.len())];
            for (row, two) in dst.iter_mut().zip(whole_live) {
                prefetch_ahead(two);
                // SAFETY: 32 readable bf16 (64 bytes); the load is unaligned.
                let v = unsafe { _mm512_loadu_si512(two.as_ptr().cast()) };
                store_row(row, _mm512_permutexvar_epi16(pairs, v));
            }
            // The half row of an odd K is the last row with weights, inside `live` or not.
            let half_row = (!tail.is_empty() && live.contains(&whole.len()))
                .then(|| dst.last_mut())
                .flatten();
            if let Some(row) = half_row {
                // SAFETY: the tail is one K value of 16 channels, 32 readable bytes; unaligned.
                let even = unsafe { _mm256_loadu_si256(tail.as_ptr().cast()) };
                let v = _mm512_zextsi256_si512(even);
                store_row(row, _mm512_permutexvar_epi16(pairs, v));
            }
        }
        live.len()
    }

    /// [`WideBf16Pair::fill`] from W4A8-packed panels (weights `c − 8`, block scales): B rows
    /// `rows` (whole steps of four), returning how many of them hold weights.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn fill_w4a8(&mut self, w: &PackedW4A8, p: usize, nb: usize, rows: Range<usize>) -> usize {
        let rows_per_panel = self.rows_per_panel;
        let block_len = w.block_len();
        let live = step_range(rows, 4, w.k_pad() / K_STEP);
        // The weight `c − 8` of every nibble code `c`; `vpermps` reads a lane's low 4 bits.
        let lut = _mm512_setr_ps(
            -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
        );
        let pairs = pair_index();
        for j in 0..nb {
            let (steps, _) = w.panel_nibbles(p + j).as_chunks::<STEP_BYTES>();
            let dst = &mut self.rows[j * rows_per_panel..][..rows_per_panel];
            let mut scale_block = usize::MAX;
            let mut sc = _mm512_setzero_ps();
            let live_steps = steps[live.clone()].iter().zip(dst.as_chunks_mut::<4>().0);
            for (s, (step, out)) in live.clone().zip(live_steps) {
                let b = s * K_STEP / block_len;
                if b != scale_block {
                    scale_block = b;
                    let scales = w.block_scales(p + j, b);
                    // SAFETY: 16 readable f32 in a local array; unaligned load.
                    sc = unsafe { _mm512_loadu_ps(scales.as_ptr()) };
                }
                prefetch_ahead(step);
                // SAFETY: `step` is 64 readable bytes; the load is unaligned.
                let v = unsafe { _mm512_loadu_si512(step.as_ptr().cast()) };
                // Byte `i` of a channel's dword holds K value `i` (low nibble) and `4 + i`
                // (high nibble) of the step.
                let weight = |shift: u32| {
                    let codes = _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32));
                    _mm512_mul_ps(_mm512_permutexvar_ps(codes, lut), sc)
                };
                for (row, (even, odd)) in out.iter_mut().zip([(0, 8), (16, 24), (4, 12), (20, 28)])
                {
                    store_pair(row, weight(even), weight(odd), pairs);
                }
            }
        }
        live.len() * 4
    }

    /// [`WideBf16Pair::fill`] from WNA16-packed int4 panels: weights `(v(c) − zero)·scale` with
    /// the panel's group scales and zero points (8 when symmetric; `v(c) = c`), or the e2m1
    /// value times the scale for MXFP4 (zero 0; exact in bf16). 8-bit codes go to
    /// [`WideBf16Pair::fill_bytes`].
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn fill_wna16(&mut self, w: &PackedWna16, p: usize, nb: usize, rows: Range<usize>) -> usize {
        if w.bits() == 8 {
            return self.fill_bytes(w, p, nb, rows);
        }
        let rows_per_panel = self.rows_per_panel;
        let (group_size, steps) = (w.group_size(), w.k_steps());
        let live = step_range(rows, 4, steps);
        // The value of every nibble code before the zero point (the code itself, or its e2m1
        // value); `vpermps` reads a lane's low 4 bits.
        // SAFETY: the table is 16 readable f32; unaligned load.
        let lut = unsafe { _mm512_loadu_ps(w.raw_table().as_ptr()) };
        let pairs = pair_index();
        for j in 0..nb {
            let words = &w.codes()[(p + j) * steps * PANEL..][..steps * PANEL];
            let dst = &mut self.rows[j * rows_per_panel..][..rows_per_panel];
            let mut group = usize::MAX;
            let (mut sc, mut zero) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let (word_steps, _) = words.as_chunks::<PANEL>();
            let live_steps = word_steps[live.clone()]
                .iter()
                .zip(dst.as_chunks_mut::<4>().0);
            for (s, (step, out)) in live.clone().zip(live_steps) {
                let g = s * K_STEP_WNA16 / group_size;
                if g != group {
                    group = g;
                    let scales = w.group_scales(p + j, g);
                    let zeros = w.group_zeros(p + j, g);
                    // SAFETY: 16 readable f32 in local arrays; unaligned loads.
                    sc = unsafe { _mm512_loadu_ps(scales.as_ptr()) };
                    // SAFETY: as above.
                    zero = unsafe { _mm512_loadu_ps(zeros.as_ptr()) };
                }
                prefetch_ahead(step);
                // SAFETY: `step` is 16 readable u32; the load is unaligned.
                let v = unsafe { _mm512_loadu_si512(step.as_ptr().cast()) };
                // Nibble `i` of a channel's word holds K value `8s + i`.
                let weight = |shift: u32| {
                    let codes = _mm512_srlv_epi32(v, _mm512_set1_epi32(shift as i32));
                    _mm512_mul_ps(_mm512_sub_ps(_mm512_permutexvar_ps(codes, lut), zero), sc)
                };
                for (row, (even, odd)) in out.iter_mut().zip([(0, 4), (8, 12), (16, 20), (24, 28)])
                {
                    store_pair(row, weight(even), weight(odd), pairs);
                }
            }
        }
        live.len() * 4
    }

    /// [`WideBf16Pair::fill`] from WNA16-packed 8-bit panels: integer codes as
    /// `(c − zero)·scale` (zero 128 when symmetric), e4m3 codes (FP8 blocks) as their exact
    /// value times the block scale. Either is exact in f32 before the scale, is multiplied by
    /// it in f32 (one rounding) and rounded to bf16 (a second one), the two roundings the int4
    /// weights get. A 64-byte int8 step holds K values `4s..4s + 4` of the 16 channels as four
    /// runs of 16 bytes, so it fills B rows `2s` and `2s + 1`. Codes past K are 0, finite
    /// weights that meet the zero activations [`fill_a`] puts past K.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn fill_bytes(&mut self, w: &PackedWna16, p: usize, nb: usize, rows: Range<usize>) -> usize {
        let rows_per_panel = self.rows_per_panel;
        let (group_size, steps) = (w.group_size(), w.k_steps());
        let live = step_range(rows, 2, steps);
        let e4m3 = w.is_e4m3();
        let pairs = pair_index();
        for j in 0..nb {
            let words = &w.codes()[(p + j) * steps * PANEL..][..steps * PANEL];
            let dst = &mut self.rows[j * rows_per_panel..][..rows_per_panel];
            let mut group = usize::MAX;
            let (mut sc, mut zero) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            let (word_steps, _) = words.as_chunks::<PANEL>();
            let live_steps = word_steps[live.clone()]
                .iter()
                .zip(dst.as_chunks_mut::<2>().0);
            for (s, (step, out)) in live.clone().zip(live_steps) {
                // Group sizes are multiples of 8, so a step never straddles two groups.
                let g = s * K_STEP8 / group_size;
                if g != group {
                    group = g;
                    let scales = w.group_scales(p + j, g);
                    // SAFETY: 16 readable f32 in a local array; unaligned load.
                    sc = unsafe { _mm512_loadu_ps(scales.as_ptr()) };
                    if !e4m3 {
                        let zeros = w.group_zeros(p + j, g);
                        // SAFETY: as above.
                        zero = unsafe { _mm512_loadu_ps(zeros.as_ptr()) };
                    }
                }
                let weight = |i: usize| {
                    let value = if e4m3 {
                        decode_e4m3(step, i)
                    } else {
                        decode8(step, i, zero)
                    };
                    _mm512_mul_ps(value, sc)
                };
                store_pair(&mut out[0], weight(0), weight(1), pairs);
                store_pair(&mut out[1], weight(2), weight(3), pairs);
            }
        }
        live.len() * 2
    }

    /// The B rows of chunk `c` (of the filled range) of the pair's panel `j`.
    pub(crate) fn chunk_rows(&self, j: usize, c: usize) -> *const u8 {
        let at = j * self.rows_per_panel + (c - self.first_chunk) * CHUNK_ROWS;
        self.rows[at..at + CHUNK_ROWS].as_ptr().cast()
    }
}

/// The packed steps that fill B rows `rows` at `per_step` rows a step (`rows` starts on a
/// step), cut at the `steps` the panel holds.
fn step_range(rows: Range<usize>, per_step: usize, steps: usize) -> Range<usize> {
    let first = (rows.start / per_step).min(steps);
    first..(rows.end / per_step).min(steps)
}

/// Computes rows `row0..row0 + min(32, m − row0)` of the pair's channels over chunks `chunks`
/// (the chunks `wide` holds), resuming from and parking its C tiles in `acc` as `block` says.
/// `NA` is 2 when the group has more than 16 rows, `NB` the number of panels in the pair. The
/// tiles add the chunks in K order whatever the blocks, and parking stores f32 sums exactly, so
/// a walk in blocks gives the same bits as one over all of K.
///
/// # Safety
/// - The CPU has AVX-512 F/BW and AMX-BF16; `unit` is configured with `tile_config(64)`;
///   `wide` was filled for the pair and `chunks`, and `a` views this job's rows ([`fill_a`]).
/// - The job satisfies [`crate::ukernel::W4Bf16PanelsFn`]'s contract for the pair's panels;
///   `row0 < job.m` is a multiple of 16, and `row0 + 16 < job.m` exactly when `NA == 2`.
/// - Unless `block` is [`KBlock::Whole`] or [`KBlock::First`], `acc` holds what the previous
///   block of the same row group and pair parked.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)] // one row group's place in the walk
pub(crate) unsafe fn bf16_step<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    job: &W4Bf16Job<'_>,
    wide: &WideBf16Pair,
    a: &TiledA<'_>,
    (p, row0): (usize, usize),
    chunks: Range<usize>,
    block: KBlock,
    acc: &mut AccBuf,
) {
    let w = job.w;
    let t = row0 / TILE_ROWS;
    // SAFETY: for this and the tile calls below, the unit is configured with 64-byte A and B
    // rows (our contract); `a` holds row tiles `t..t + NA` of every chunk; `chunk_rows` points
    // at 16 rows of the filled range; `acc` holds this row group's parked tiles when resuming;
    // the CPU has AMX-BF16 (our contract).
    match block {
        // SAFETY: see above.
        KBlock::Whole | KBlock::First => unsafe { zero_live::<U, NA, NB>(unit) },
        // SAFETY: see above.
        KBlock::Middle | KBlock::Last => unsafe { load_c_live::<U, NA, NB>(unit, acc) },
    }
    for c in chunks {
        // SAFETY: see above.
        unsafe { load_a_live::<U, NA>(unit, a, t, c) };
        // SAFETY: see above.
        unsafe { load_b_live::<U, NB>(unit, [wide.chunk_rows(0, c), wide.chunk_rows(NB - 1, c)]) };
        // SAFETY: see above.
        unsafe { dpbf16_live::<U, NA, NB>(unit) };
    }
    // SAFETY: see above.
    unsafe { store_live::<U, NA, NB>(unit, acc) };
    if matches!(block, KBlock::First | KBlock::Middle) {
        return;
    }

    let rows = GROUP_ROWS.min(job.m - row0);
    for j in 0..NB {
        let sums = |r: usize| {
            // SAFETY: channels `16j..16j + 16` of an `AccBuf` row are 16 readable, 64-byte
            // aligned 32-bit values, here the f32 sums the C tiles stored.
            unsafe { _mm512_load_ps(acc.0[r][j * PANEL..].as_ptr().cast()) }
        };
        let bias = w.panel_bias(p + j);
        // SAFETY: rows `row0..row0 + rows < m` and panel `p + j`'s channels are inside the
        // validated output and owned by this call (our contract).
        unsafe { write_panel_rows((job.out, job.ld), w.n(), (row0, rows), p + j, bias, sums) };
    }
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use moe_testutil::SplitMix64;

    use crate::{GemmScratch, PackedW4A8, Par, W4A8Scales};

    /// `Σ_k bf16(x)·bf16(w·s)` (+ bias) in f64, and `Σ_k |term|` for the tolerance.
    #[allow(clippy::too_many_arguments)] // one matrix product's inputs, spelled out
    fn reference(
        x: &[f32],
        w: &[i8],
        s: &[f32],
        g: usize,
        bias: Option<&[f32]>,
        m: usize,
        n: usize,
        k: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let round = |v: f32| f64::from(bf16::from_f32(v).to_f32());
        let mut y = vec![0f64; m * n];
        let mut mag = vec![0f64; m * n];
        for r in 0..m {
            for c in 0..n {
                let (mut acc, mut abs) = (0f64, 0f64);
                for i in 0..k {
                    let wv = round(f32::from(w[c * k + i]) * s[c * (k / g) + i / g]);
                    let t = round(x[r * k + i]) * wv;
                    acc += t;
                    abs += t.abs();
                }
                let b = bias.map_or(0.0, |b| f64::from(b[c]));
                y[r * n + c] = acc + b;
                mag[r * n + c] = abs + b.abs();
            }
        }
        (y, mag)
    }

    /// Every bf16 path this CPU can run, from one row: the AMX-BF16 bodies on the emulated
    /// unit, on the hardware (on the row counts they take) and the AVX-512 BF16 body.
    fn bf16_sets() -> Vec<(&'static str, crate::KernelSet)> {
        let mut sets = Vec::new();
        match super::super::emulated::bf16_kernel_set() {
            Some(ks) => sets.push(("emulated tiles", ks)),
            None => eprintln!("note: skipping the emulated bf16 tiles: no AVX-512 VNNI and BF16"),
        }
        if let Some(ks) = super::super::emulated::int4_kernel_set() {
            sets.push(("emulated tiles, int4 codes decoded exactly", ks));
        }
        if let Some(ks) = super::super::hardware_bf16_kernel_set() {
            sets.push(("hardware tiles", ks));
        }
        if let Some(ks) = super::super::hardware_int4_kernel_set() {
            sets.push(("hardware tiles, int4 codes decoded exactly", ks));
        }
        if let Some(ks) = crate::x86::bf16_dot_kernel_set() {
            sets.push(("avx512-bf16", ks));
        }
        sets
    }

    #[test]
    fn bf16_tiles_match_the_bf16_reference_on_ragged_shapes() {
        let sets = bf16_sets();
        let mut rng = SplitMix64::new(0xbf16);
        // K past 256 as well: 544 in groups of 32 is 17 chunks, channelwise 600 ends in a
        // partial chunk.
        for &(k, g) in &[
            (32, 32),
            (96, 32),
            (72, 72),
            (256, 128),
            (64, 64),
            (40, 40),
            (544, 32),
            (600, 600),
        ] {
            for &m in &[0usize, 1, 5, 16, 17, 33, 70] {
                for &n in &[1usize, 16, 17, 33, 47] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                    let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
                    let bias = (rng.below(2) == 0).then(|| rng.vec_uniform(n, -1.0, 1.0));
                    let (packed, scales) = if g == k && k % 32 != 0 {
                        let s = rng.vec_uniform(n, 0.01, 0.1);
                        let p = PackedW4A8::pack(
                            n,
                            k,
                            &w,
                            W4A8Scales::Channelwise(&s),
                            bias.as_deref(),
                        );
                        (p.unwrap(), s)
                    } else {
                        let s: Vec<bf16> = (0..n * k / g)
                            .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                            .collect();
                        let scales = W4A8Scales::Grouped {
                            group_size: g,
                            scales: &s,
                        };
                        let p = PackedW4A8::pack(n, k, &w, scales, bias.as_deref()).unwrap();
                        (p, s.iter().map(|v| v.to_f32()).collect())
                    };
                    let (want, mag) = reference(&x, &w, &scales, g, bias.as_deref(), m, n, k);
                    for (unit, ks) in &sets {
                        if ks.w4bf16_for(m, packed.order()).is_none() {
                            continue;
                        }
                        for par in [Par::Seq, Par::Rayon] {
                            let mut got = vec![f32::NAN; m * n];
                            crate::w4a8_gemm(
                                ks,
                                m,
                                &x,
                                &packed,
                                &mut got,
                                &mut GemmScratch::new(),
                                par,
                            )
                            .unwrap();
                            for (i, (&g_, (&w_, &mg))) in
                                got.iter().zip(want.iter().zip(&mag)).enumerate()
                            {
                                let tol = 1e-5 * mg + 1e-6;
                                assert!(
                                    (f64::from(g_) - w_).abs() <= tol,
                                    "{unit} m={m} n={n} k={k} g={g} {par:?}: out[{i}] = {g_}, want {w_} (tol {tol:e})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_tiles_keep_nan_rows_nan() {
        for (unit, ks) in bf16_sets() {
            nan_row_stays_nan(unit, &ks);
        }
    }

    fn nan_row_stays_nan(unit: &str, ks: &crate::KernelSet) {
        let (m, n, k) = (3, 17, 64);
        let w = vec![1i8; n * k];
        let s = vec![bf16::from_f32(0.5); n * k / 32];
        let packed = PackedW4A8::pack(
            n,
            k,
            &w,
            W4A8Scales::Grouped {
                group_size: 32,
                scales: &s,
            },
            None,
        )
        .unwrap();
        let mut x = vec![0.25f32; m * k];
        x[k + 7] = f32::NAN;
        let mut got = vec![0f32; m * n];
        crate::w4a8_gemm(
            ks,
            m,
            &x,
            &packed,
            &mut got,
            &mut GemmScratch::new(),
            Par::Seq,
        )
        .unwrap();
        assert!(
            got[..n].iter().all(|v| (v - 8.0).abs() < 1e-6),
            "{unit}: {:?}",
            &got[..n]
        );
        assert!(got[n..2 * n].iter().all(|v| v.is_nan()), "{unit}");
        assert!(
            got[2 * n..].iter().all(|v| (v - 8.0).abs() < 1e-6),
            "{unit}"
        );
    }

    /// bf16 dense experts on every bf16 path: the weights exact, the activations rounded to
    /// bf16, f32 sums, against the f64 sum of those products on ragged shapes (odd K, K past a
    /// chunk, N past a panel, M = 0 and 1); f32 dense weights stay on the f32 body, bit for bit.
    #[test]
    fn dense_bf16_experts_on_the_bf16_path_match_the_bf16_reference() {
        use crate::PackedDense;
        let sets = bf16_sets();
        let mut rng = SplitMix64::new(0xde5e);
        let round = |v: f32| f64::from(bf16::from_f32(v).to_f32());
        for &k in &[1usize, 2, 33, 64, 70, 129, 557] {
            for &(m, n) in &[
                (0usize, 5usize),
                (1, 16),
                (5, 17),
                (17, 33),
                (33, 1),
                (40, 47),
            ] {
                let w: Vec<bf16> = (0..n * k)
                    .map(|_| bf16::from_f32(rng.normal() * 0.5))
                    .collect();
                let w32: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                let packed = PackedDense::pack_bf16(n, k, &w).unwrap();
                let packed32 = PackedDense::pack_f32(n, k, &w32).unwrap();
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                let exact = crate::dense::dense_reference(m, n, k, &x, &w32);
                for ((unit, ks), par) in sets.iter().flat_map(|s| [(s, Par::Seq), (s, Par::Rayon)])
                {
                    let mut got = vec![f32::NAN; m * n];
                    let mut scratch = GemmScratch::new();
                    crate::dense::dense_expert_gemm(
                        ks,
                        m,
                        &x,
                        &packed,
                        &mut got,
                        &mut scratch,
                        par,
                    )
                    .unwrap();
                    for r in 0..m {
                        for c in 0..n {
                            let (mut want, mut mag) = (0f64, 0f64);
                            for i in 0..k {
                                let t = round(x[r * k + i]) * f64::from(w32[c * k + i]);
                                want += t;
                                mag += t.abs();
                            }
                            let g = f64::from(got[r * n + c]);
                            assert!(
                                (g - want).abs() <= 1e-5 * mag + 1e-6,
                                "{unit}: k={k} m={m} n={n} {par:?}: out[{r},{c}] = {g}, want {want}"
                            );
                        }
                    }
                    let mut got32 = vec![f32::NAN; m * n];
                    crate::dense::dense_expert_gemm(
                        ks,
                        m,
                        &x,
                        &packed32,
                        &mut got32,
                        &mut scratch,
                        par,
                    )
                    .unwrap();
                    assert!(
                        got32
                            .iter()
                            .zip(&exact)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{unit}: f32 weights left the f32 body (k={k} m={m} n={n})"
                    );
                }
            }
        }
    }

    #[test]
    fn wna16_int4_and_int8_on_the_bf16_path_match_the_bf16_reference() {
        use crate::{PackedWna16, Wna16Desc, Wna16Scales};
        use half::f16;
        let sets = bf16_sets();
        for (_, ks) in &sets {
            assert!(ks.wna16_bf16_for(1).is_some());
        }
        let round = |v: f64| f64::from(bf16::from_f32(v as f32).to_f32());
        let mut rng = SplitMix64::new(0x16a);
        // (K, group size or channelwise, asymmetric, act-order); the symmetric shape with groups
        // of 32 runs MXFP4 weights.
        let cases: [(usize, Option<usize>, bool, bool); 8] = [
            (64, Some(32), false, false),
            (80, Some(32), false, false),
            (96, Some(32), true, false),
            (256, Some(128), false, true),
            (40, None, false, false),
            (200, None, true, true),
            (520, Some(40), true, false),
            (584, None, false, true),
        ];
        for (bits, &(k, g, asym, act_order)) in [4u32, 8]
            .into_iter()
            .flat_map(|b| cases.iter().map(move |c| (b, c)))
        {
            for &(m, n) in &[(0usize, 5usize), (1, 16), (17, 33), (33, 7), (70, 47)] {
                let groups = g.map_or(1, |g| k.div_ceil(g));
                let levels = 1usize << bits;
                let codes: Vec<u8> = (0..n * k).map(|_| rng.below(levels) as u8).collect();
                let scales: Vec<f16> = (0..n * groups)
                    .map(|_| f16::from_f32(rng.uniform(0.01, 0.1)))
                    .collect();
                let zeros: Vec<u8> = (0..n * groups).map(|_| rng.below(levels) as u8).collect();
                let mut perm: Vec<u32> = (0..k as u32).collect();
                for i in (1..k).rev() {
                    perm.swap(i, rng.below(i + 1));
                }
                let bias = rng.vec_uniform(n, -1.0, 1.0);
                // MXFP4 where the shape has int4 groups of 32 and no zero points or act-order.
                let mx = bits == 4 && g == Some(32) && !asym && !act_order;
                let nb = k.div_ceil(32);
                let blocks: Vec<u8> = (0..n * nb * 16).map(|_| rng.below(256) as u8).collect();
                let e8m0: Vec<u8> = (0..n * nb).map(|_| 120 + rng.below(8) as u8).collect();
                let w = if mx {
                    PackedWna16::pack_mxfp4(crate::Mxfp4Desc {
                        n,
                        k,
                        blocks: &blocks,
                        scales: &e8m0,
                        bias: Some(&bias),
                    })
                } else {
                    PackedWna16::pack(Wna16Desc {
                        n,
                        k,
                        bits,
                        codes: &codes,
                        group_size: moe_quant::WeightGroups::from_group_size(g).unwrap(),
                        scales: Wna16Scales::F16(&scales),
                        zeros: asym.then_some(&zeros[..]),
                        bias: Some(&bias),
                        perm: act_order.then_some(&perm[..]),
                    })
                }
                .unwrap();
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                let dq = w.dequantize_f64();
                for ((unit, ks), par) in sets.iter().flat_map(|s| [(s, Par::Seq), (s, Par::Rayon)])
                {
                    let mut got = vec![f32::NAN; m * n];
                    crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), par)
                        .unwrap();
                    // The int4 dot-product body multiplies the exact code values and scales the
                    // group sums in f32: no weight is rounded to bf16.
                    let exact_weights = ks.wna16_int4_dot_for(&w, m).is_some();
                    let weight = |v: f64| if exact_weights { v } else { round(v) };
                    for r in 0..m {
                        for c in 0..n {
                            let (mut want, mut mag) =
                                (f64::from(bias[c]), f64::from(bias[c]).abs());
                            for col in 0..k {
                                let t = round(f64::from(x[r * k + col])) * weight(dq[c * k + col]);
                                want += t;
                                mag += t.abs();
                            }
                            let got = f64::from(got[r * n + c]);
                            assert!(
                                (got - want).abs() <= 1e-5 * mag + 1e-6,
                                "{unit}: bits={bits} k={k} g={g:?} asym={asym} \
                                 act_order={act_order} m={m} n={n} {par:?}: out[{r},{c}] = \
                                 {got}, want {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// FP8 weights (e4m3 codes, f32 scales per 128 × 128 block, per channel or per tensor) on every
    /// bf16 path: each weight is `bf16(f32(e4m3(c)·s))` (the e4m3 value exact, the scaled value
    /// rounded in f32 and then to bf16, as int4 weights are), activations rounded to bf16, f32
    /// sums. Checked against that model in f64 within `1e-5·Σ|x·w|`, and against the exact product
    /// of the dequantized weights within the two bf16 roundings (each at most half a unit in the
    /// last of bf16's 8 significant bits, a relative 2^-8: `2^-7·Σ|x·w|`), on ragged shapes: K not
    /// a multiple of the block (and below one step), odd N, N past one block row, M = 0 and 1,
    /// codes with frequent subnormals and signed zeros, channels in one run or two (each with its
    /// own block rows), and channelwise as a run of channel scales beside a tensor-scaled run, with
    /// and without bias.
    #[test]
    fn wna16_fp8_on_the_bf16_path_matches_the_bf16_reference() {
        use crate::packed::wna16::{FP8_BLOCK, Fp8Desc, Fp8Rows, Fp8Scales};
        use crate::{Int8Values, PackedWna16};
        let sets = bf16_sets();
        let round = |v: f64| f64::from(bf16::from_f32(v as f32).to_f32());
        let mut rng = SplitMix64::new(0xf8b);
        // Any non-NaN byte, a quarter of them forced to a subnormal or a signed zero.
        let codes = |rng: &mut SplitMix64, len: usize| -> Vec<u8> {
            (0..len)
                .map(|_| {
                    let b = rng.below(256) as u8;
                    let b = if rng.below(4) == 0 { b & 0x87 } else { b };
                    if b & 0x7F == 0x7F { b & 0xF0 } else { b }
                })
                .collect()
        };
        let mut seen_subnormal = false;
        for &(n, k) in &[
            (1usize, 1usize),
            (5, 3),
            (16, 32),
            (17, 127),
            (33, 129),
            (7, 200),
            (47, 257),
            (131, 72),
        ] {
            let kb = k.div_ceil(FP8_BLOCK);
            let fp8 = codes(&mut rng, n * k);
            seen_subnormal |= fp8.iter().any(|&c| c & 0x78 == 0 && c & 0x07 != 0);
            let whole = rng.vec_uniform(n.div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2);
            let h = n / 2;
            let split = [
                rng.vec_uniform(h.div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2),
                rng.vec_uniform((n - h).div_ceil(FP8_BLOCK) * kb, 1e-4, 1e-2),
            ];
            let bias = rng.vec_uniform(n, -1.0, 1.0);
            let one = [Fp8Rows {
                channels: n,
                codes: &fp8,
                scales: Fp8Scales::Blocks(&whole),
            }];
            let two = [
                Fp8Rows {
                    channels: h,
                    codes: &fp8[..h * k],
                    scales: Fp8Scales::Blocks(&split[0]),
                },
                Fp8Rows {
                    channels: n - h,
                    codes: &fp8[h * k..],
                    scales: Fp8Scales::Blocks(&split[1]),
                },
            ];
            let per_channel = rng.vec_uniform(n, 1e-4, 1e-2);
            let channelwise = [
                Fp8Rows {
                    channels: h,
                    codes: &fp8[..h * k],
                    scales: Fp8Scales::Channels(&per_channel[..h]),
                },
                Fp8Rows {
                    channels: n - h,
                    codes: &fp8[h * k..],
                    scales: Fp8Scales::Tensor(per_channel[h]),
                },
            ];
            for (rows, with_bias) in [
                (&one[..], false),
                (&two[..], true),
                (&channelwise[..], true),
            ] {
                let bias = with_bias.then_some(&bias[..]);
                let w = PackedWna16::pack_fp8(Fp8Desc { n, k, rows, bias }).unwrap();
                assert_eq!(w.int8_values(), Int8Values::E4m3);
                let dq = w.dequantize_f64();
                for &m in &[0usize, 1, 5, 17, 33, 70] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                    for ((unit, ks), par) in
                        sets.iter().flat_map(|s| [(s, Par::Seq), (s, Par::Rayon)])
                    {
                        assert!(ks.wna16_bf16_for(m.max(1)).is_some(), "{unit}");
                        if ks.wna16_int4_dot_for(&w, m).is_some() {
                            // The exactly decoded codes' numerics, tested in `byte_codes.rs`.
                            continue;
                        }
                        let mut got = vec![f32::NAN; m * n];
                        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), par)
                            .unwrap();
                        for r in 0..m {
                            for c in 0..n {
                                let b = bias.map_or(0.0, |b| f64::from(b[c]));
                                let (mut want, mut exact, mut mag) = (b, b, b.abs());
                                for col in 0..k {
                                    let (xv, wv) = (f64::from(x[r * k + col]), dq[c * k + col]);
                                    let t = round(xv) * round(wv);
                                    want += t;
                                    exact += xv * wv;
                                    mag += t.abs();
                                }
                                let got = f64::from(got[r * n + c]);
                                assert!(
                                    (got - want).abs() <= 1e-5 * mag + 1e-6,
                                    "{unit}: n={n} k={k} m={m} runs={} {par:?}: out[{r},{c}] = \
                                     {got}, want {want}",
                                    rows.len()
                                );
                                assert!(
                                    (got - exact).abs()
                                        <= (1.01 * 2f64.powi(-7) + 1e-5) * mag + 1e-6,
                                    "{unit}: n={n} k={k} m={m} {par:?}: out[{r},{c}] = {got}, \
                                     exact {exact}"
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(seen_subnormal, "the codes should include subnormals");
    }

    /// Walking K in blocks (each pair dequantized a block at a time, C tiles parked between
    /// blocks) gives the bits of one walk over all of K, for each way the bf16 tiles read
    /// weights: W4A8 int4 blocks, WNA16 int4 and int8 codes with zero points, and bf16 dense
    /// panels with an odd K (a half B row in the last block).
    #[test]
    fn bf16_tiles_walked_in_k_blocks_give_the_bits_of_one_walk() {
        use super::super::budget_changing_bits;
        use crate::{PackedDense, PackedWna16, Wna16Desc, Wna16Scales};
        use half::f16;
        let sets = bf16_sets();
        let mut rng = SplitMix64::new(0xb10c);
        for &(m, n) in &[(0usize, 17usize), (1, 17), (17, 33), (40, 16)] {
            // (format, K): 17, 10 and 10 chunks, the last two partial.
            for (format, k) in [("w4a8", 544usize), ("wna16", 300), ("dense", 301)] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                let bias = rng.vec_uniform(n, -1.0, 1.0);
                let run = |ks: &crate::KernelSet, bits: u32, out: &mut [f32]| {
                    let mut scratch = GemmScratch::new();
                    match format {
                        "w4a8" => {
                            let w: Vec<i8> = (0..n * k).map(|i| (i * 7 % 16) as i8 - 8).collect();
                            let s: Vec<bf16> = (0..n * k / 32)
                                .map(|i| bf16::from_f32(0.01 + (i % 9) as f32 * 0.01))
                                .collect();
                            let scales = W4A8Scales::Grouped {
                                group_size: 32,
                                scales: &s,
                            };
                            let packed = PackedW4A8::pack(n, k, &w, scales, Some(&bias)).unwrap();
                            if ks.w4bf16_for(m, packed.order()).is_none() {
                                return false;
                            }
                            crate::w4a8_gemm(ks, m, &x, &packed, out, &mut scratch, Par::Seq)
                        }
                        "wna16" => {
                            let levels = 1usize << bits;
                            let codes: Vec<u8> =
                                (0..n * k).map(|i| (i * 13 % levels) as u8).collect();
                            let groups = k.div_ceil(64);
                            let scales: Vec<f16> = (0..n * groups)
                                .map(|i| f16::from_f32(0.01 + (i % 5) as f32 * 0.02))
                                .collect();
                            let zeros: Vec<u8> =
                                (0..n * groups).map(|i| (i * 3 % levels) as u8).collect();
                            let w = PackedWna16::pack(Wna16Desc {
                                n,
                                k,
                                bits,
                                codes: &codes,
                                group_size: moe_quant::WeightGroups::from_group_size(Some(64))
                                    .unwrap(),
                                scales: Wna16Scales::F16(&scales),
                                zeros: Some(&zeros),
                                bias: Some(&bias),
                                perm: None,
                            })
                            .unwrap();
                            crate::wna16_gemm(ks, m, &x, &w, out, &mut scratch, Par::Seq)
                        }
                        _ => {
                            let w: Vec<bf16> = (0..n * k)
                                .map(|i| bf16::from_f32((i % 11) as f32 * 0.1 - 0.5))
                                .collect();
                            let packed = PackedDense::pack_bf16(n, k, &w).unwrap();
                            crate::dense::dense_expert_gemm(
                                ks,
                                m,
                                &x,
                                &packed,
                                out,
                                &mut scratch,
                                Par::Seq,
                            )
                        }
                    }
                    .unwrap();
                    true
                };
                let per_chunk = m.next_multiple_of(16) * super::CHUNK_BYTES + 2 * 16 * 64;
                let widths: &[u32] = if format == "wna16" { &[4, 8] } else { &[4] };
                for (unit, ks) in &sets {
                    for &bits in widths {
                        if !run(ks, bits, &mut vec![f32::NAN; m * n]) {
                            continue;
                        }
                        let budgets = [1, 2, 5].map(|chunks| chunks * per_chunk);
                        let changed = budget_changing_bits(m * n, budgets, |out| {
                            run(ks, bits, out);
                        });
                        assert_eq!(
                            changed, None,
                            "{unit} {format} {bits}-bit m={m} n={n} k={k}: the budget that \
                             changed bits"
                        );
                    }
                }
            }
        }
    }
}
