//! The WNA16 body for int4 integer codes on AVX-512 VNNI (`vpdpbusd`), with each row of
//! activations quantized to 15-bit integers once per GEMM (the numerics of
//! [`crate::wna16_i15`], which this body equals bit for bit).
//!
//! One 64-byte int4 step holds 8 K values of the panel's 16 channels, one channel per 32-bit
//! lane, nibble `j` = K value `8s + j`. One AND with `0x0F0F0F0F` leaves the even K values of
//! the step as the lane's four bytes (`8s + 0, 2, 4, 6`), and a shift by 4 then the same AND
//! the odd ones: three instructions turn 128 codes into two `vpdpbusd` operands of unsigned
//! bytes, where the f32 body spends a shift, a table lookup and an FMA per 16 codes. The
//! activations are laid out per step as four 32-bit words ([`fill`]): the high bytes of the even
//! K values, of the odd ones, then the low bytes of both, each word broadcast to all lanes by
//! the instruction's memory operand. Four `vpdpbusd` then do the step's 128 multiply-adds per
//! row into two integer sums (high and low bytes), kept in two chains each for tiles of up to
//! four rows, so that no latency chain bounds them.
//!
//! int8 codes are packed K-major, four K values per step, each the 16 channels' bytes: one
//! 256-bit load of two of a step's rows widened to 16 bits (`vpmovzxbw`) and one `vpermw` put
//! codes `(c_j, c_{j+1})` of each channel in its 32-bit lane. Their activations are laid out as
//! the integers themselves, 16 bits each in K order ([`fill`]), so one `vpdpwssd` per pair of
//! K values and row does 32 multiply-adds into an exact sum `Σc·q` (`|c·q| ≤ 255·16383`, and a
//! block of at most [`crate::wna16_i15::MAX_BLOCK_INT8`] values keeps it within 32 bits): as
//! many multiply-adds per instruction as the split bytes of the int4 codes give, and two
//! shuffles per 32 codes.
//!
//! At the end of each block (a scale group, or [`crate::wna16_i15::MAX_BLOCK`] K values of
//! a longer one) the int4 sums become `128·Σc·hi + Σc·lo` (exact), convert to f32, lose `z · Σq`
//! (the block's activation sum, made by [`fill`]) in one fused multiply-add, and are scaled
//! into the row's f32 accumulator with another. The row's scale and the bias are applied once
//! at the end. A tile covers two panels ([`tile_panels`], [`MR2`]), so that each activation
//! word loaded feeds two `vpdpbusd` and the codes come as two streams; at [`QUAD_MAX_ROWS`]
//! rows or fewer, where the weights' stream from memory bounds the call, four, read as four
//! streams; a panel left over takes one ([`tile`]). Rows run in blocks of [`ROW_BLOCK`] over
//! all of the call's panels, so a block's activations stay in L2 while the panels stream, and
//! weights are prefetched a page ahead as in the f32 body.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx512vnni::dpwssd;
use super::wna16::{
    PREFETCH_BYTES, group_scales, load_step, load_zeros, prefetch_ahead, store_panel_rows,
};
use crate::aligned::AlignedVec;
use crate::dispatch::Int4Dot;
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout, Int4DotTileFn, run_row_blocks};
use crate::wna16_i15::{
    Blocks, HEADER_BYTES, MAX_Q, RowLayout, RowScale, integer_body, layout_rows, panel_steps,
    read_header, write_header,
};

/// Rows per tile: 8 rows × 2 integer sums and an f32 accumulator each leave room for the
/// step, its two decoded halves and the block's constants. Tiles of up to 4 rows keep 4 sums
/// per row: with two `vpdpbusd` issued per cycle, a chain taking two of them per step would be
/// bound by their latency.
const MR: usize = 8;

/// Rows per two-panel tile ([`tile_panels`]), which calls of more than [`QUAD_MAX_ROWS`] rows
/// take: 4 rows × 2 panels × 2 integer sums and 8 f32 accumulators. Each activation word
/// loaded feeds two `vpdpbusd`, and the panels' codes come as two streams. With the weights streaming from memory
/// (one core, 512 MiB of int4 g128 weights cycled, alternated call by call against one panel
/// per tile), two panels ran 1.20-1.28× faster at 4 rows and 1.08-1.15× at 8 on 1536 × 2048
/// and 2048 × 768, and 0.95-1.08× at 5 to 7 rows; with the weights in L2 they were even (an
/// earlier comparison there, 0.79-0.97× at 3 to 6 rows on 2048 × 768, had kept them to K of
/// 4096 and more).
const MR2: usize = 4;

/// Rows up to which tiles cover four panels at once. At a few rows the call streams its
/// weights from memory and computes little on them; one panel is one sequential stream, and
/// one core keeps too few of its lines in flight to draw its share of the memory's bandwidth.
/// Four panels read in lockstep are four streams: alternated against one panel per tile
/// (weight-only int4 g128, 2 threads, 2 GiB of weights), 1.1-1.5× faster at 1 and 4 tokens
/// on the three standard shapes. At 3 rows (one core, weights cycled from memory, alternated
/// call by call) four panels were 1.29-1.40× faster than one on 1536 × 2048 and 2048 × 768 and
/// 1.05-1.08× faster than two on 14336 × 4096 and 4096 × 14336, although 3 rows × 4 panels
/// spill some of the f32 accumulators (each touched once per block). At 4 rows they were no
/// faster than one panel.
const QUAD_MAX_ROWS: usize = 3;

/// Panels per tile at or below [`QUAD_MAX_ROWS`] rows.
const QUAD: usize = 4;

/// Rows that run over all of a call's panels before the next rows start.
const ROW_BLOCK: usize = 64;

/// Bytes of one step of a row's activations: four words of four bytes.
const STEP_BYTES: usize = crate::wna16_i15::SPLIT_STEP_BYTES;

/// Byte order within 16 bytes of one half (high or low) of two steps: per step, the even K
/// values then the odd ones.
#[target_feature(enable = "avx512f")]
#[inline]
fn even_odd_order() -> __m128i {
    _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
}

/// Lays out `m` rows of `x` for the body: per row a [`HEADER_BYTES`] header (the row's scale
/// and post factor, see [`RowScale`]) and then, per step, for int4 codes the high bytes of K
/// values `8s + 0, 2, 4, 6`, of `8s + 1, 3, 5, 7`, and the low bytes of both, for int8 codes
/// the eight integers as i16 in K order; K past its end as zeros. Writes each row's activation
/// sums per block into `sums`, row-major.
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
    let int8 = w.bits() == 8;
    let layout = RowLayout::prepare(w, m, STEP_BYTES, sums, dst);
    let (blocks, nb, row_bytes) = (layout.blocks, layout.nb, layout.row_bytes);
    for ((row, out), row_sums) in x
        .chunks_exact(k)
        .zip(dst.chunks_exact_mut(row_bytes))
        .zip(sums.chunks_exact_mut(nb.max(1)))
        .take(m)
    {
        let rs = RowScale::of_amax(amax(row));
        let (head, steps) = out.split_at_mut(HEADER_BYTES);
        write_header(head, &rs);
        let (mut block, mut sum) = (0, _mm512_setzero_si512());
        // Sixteen K values (two steps, 32 bytes) at a time; the last may be one step.
        for (c, chunk) in steps.chunks_mut(2 * STEP_BYTES).enumerate() {
            let q = quantize16(row, 16 * c, &rs);
            let bytes = if int8 { words16(q) } else { split16(q) };
            chunk.copy_from_slice(&bytes[..chunk.len()]);
            // Add each step's eight integers to its block's sum (a block holds whole steps).
            for half in 0..2 {
                let kk = 16 * c + 8 * half;
                if kk >= k {
                    break;
                }
                let b = blocks.of_k(kk);
                if b != block {
                    row_sums[block] = _mm512_reduce_add_epi32(sum) as f32;
                    (block, sum) = (b, _mm512_setzero_si512());
                }
                let lanes: __mmask16 = 0xFF << (8 * half);
                sum = _mm512_mask_add_epi32(sum, lanes, sum, q);
            }
        }
        if nb > 0 {
            row_sums[block] = _mm512_reduce_add_epi32(sum) as f32;
        }
    }
    layout.of_rows(m)
}

/// The largest magnitude of `row`, NaN when it holds a NaN or an infinity.
#[target_feature(enable = "avx512f")]
fn amax(row: &[f32]) -> f32 {
    let (mut top, mut bad) = (_mm512_setzero_ps(), 0u16);
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    for lo in (0..row.len()).step_by(16) {
        let v = load16(row, lo);
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
        // `a` is not finite exactly when its bits reach those of infinity.
        bad |= _mm512_cmpge_epi32_mask(_mm512_castps_si512(a), _mm512_set1_epi32(0x7F80_0000));
        top = _mm512_max_ps(top, a);
    }
    if bad != 0 {
        f32::NAN
    } else {
        _mm512_reduce_max_ps(top)
    }
}

/// Values `lo..lo + 16` of `row`, zeros past its end.
#[target_feature(enable = "avx512f")]
#[inline]
fn load16(row: &[f32], lo: usize) -> __m512 {
    let n = row.len().saturating_sub(lo).min(16);
    let keep: __mmask16 = if n == 16 { !0 } else { (1 << n) - 1 };
    // SAFETY: the masked load reads only the `n` values `row[lo..lo + n]`.
    unsafe { _mm512_maskz_loadu_ps(keep, row.as_ptr().wrapping_add(lo)) }
}

/// The integers of values `lo..lo + 16` of `row` (zeros past its end), as
/// [`RowScale::quantize`] makes them: `x · lift · inv` rounded half to even, clamped.
#[target_feature(enable = "avx512f")]
#[inline]
fn quantize16(row: &[f32], lo: usize, rs: &RowScale) -> __m512i {
    let v = _mm512_mul_ps(load16(row, lo), _mm512_set1_ps(rs.lift));
    let v = _mm512_mul_ps(v, _mm512_set1_ps(rs.inv));
    let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm512_max_epi32(
        _mm512_min_epi32(q, _mm512_set1_epi32(MAX_Q)),
        _mm512_set1_epi32(-MAX_Q),
    )
}

/// The 32 bytes of two steps of 16 integers (see [`fill`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
fn split16(q: __m512i) -> [u8; 32] {
    let hi = _mm512_cvtepi32_epi8(_mm512_srai_epi32::<7>(q));
    let lo = _mm512_cvtepi32_epi8(_mm512_and_si512(q, _mm512_set1_epi32(127)));
    let hi = _mm_shuffle_epi8(hi, even_odd_order());
    let lo = _mm_shuffle_epi8(lo, even_odd_order());
    // Step 0 is the first 8 bytes of each half, step 1 the last 8.
    let step0 = _mm_unpacklo_epi64(hi, lo);
    let step1 = _mm_unpackhi_epi64(hi, lo);
    let mut bytes = [0u8; 32];
    // SAFETY: `bytes` is 32 writable bytes; unaligned stores.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), step0) };
    // SAFETY: as above, its second half.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().wrapping_add(16).cast(), step1) };
    bytes
}

/// The 32 bytes of two steps of 16 integers for int8 codes: each integer as an i16, in K order
/// (exact: `|q| ≤ 16383`).
#[target_feature(enable = "avx512f")]
#[inline]
fn words16(q: __m512i) -> [u8; 32] {
    let words = _mm512_cvtepi32_epi16(q);
    let mut bytes = [0u8; 32];
    // SAFETY: `bytes` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), words) };
    bytes
}

/// The codes of an int8 step as `vpdpwssd` operands: K values `4s + 2i` (low 16 bits of each
/// lane) and `4s + 2i + 1` (high 16 bits) of the 16 channels, for `i = 0, 1`. Rows `2i` and
/// `2i + 1` of the step (16 channel bytes each) are 32 consecutive bytes: widened to 16 bits
/// they are the two rows side by side, and `vpermw` interleaves them channel by channel.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn int8_pairs(step: &[u32; PANEL]) -> [__m512i; 2] {
    let interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    std::array::from_fn(|i| {
        let rows: &[u32; 8] = step[8 * i..8 * i + 8].try_into().expect("32 bytes");
        // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
        let bytes = unsafe { _mm256_loadu_si256(rows.as_ptr().cast()) };
        _mm512_permutexvar_epi16(interleave, _mm512_cvtepu8_epi16(bytes))
    })
}

/// The code pairs of activation step `s` (eight K values: int8 steps `2s` and `2s + 1`, the
/// second zero past the end of K, where the activations are zero too), prefetching the
/// stream's lines a lead ahead as [`prefetch_stream`] does.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn int8_step_pairs<const NP: usize>(codes: &[[u32; PANEL]], s: usize) -> [__m512i; 4] {
    prefetch_stream::<NP>(codes, 2 * s);
    prefetch_stream::<NP>(codes, 2 * s + 1);
    let [a, b] = int8_pairs(&codes[2 * s]);
    let [c, d] = match codes.get(2 * s + 1) {
        Some(step) => int8_pairs(step),
        None => [_mm512_setzero_si512(); 2],
    };
    [a, b, c, d]
}

/// Broadcasts word `j` of a step's activations to all 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast_word(step: &[u8; STEP_BYTES], j: usize) -> __m512i {
    let word: &[u8; 4] = step[4 * j..4 * j + 4].try_into().expect("4 bytes");
    _mm512_set1_epi32(i32::from_le_bytes(*word))
}

/// A block's exact `Σ c·q` from its two integer sums: `128·hi + lo` for int4 codes (the sums
/// of the activations' high and low bytes), `hi + lo` for int8 (the sums of each step's first
/// and last four K values).
#[target_feature(enable = "avx512f")]
#[inline]
fn block_sum<const BITS: u32>(hi: __m512i, lo: __m512i) -> __m512i {
    if BITS == 8 {
        _mm512_add_epi32(hi, lo)
    } else {
        _mm512_add_epi32(_mm512_slli_epi32::<7>(hi), lo)
    }
}

/// Rows `m0..m0 + R` of panel `p` (see the module docs), `C` chains per integer sum, for
/// `BITS`-bit codes (4 or 8).
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI; the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s
///   contract for panel `p` with this module's [`fill`], and `m0 + R ≤ job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const R: usize, const C: usize, const BITS: u32, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let ng = w.n_groups();
    let blocks = Blocks::of(w);
    let nb = blocks.count(ng);
    let codes = panel_steps(w, p);
    let (rows, acts) = layout_rows::<R>(job, m0);
    let zeros = w
        .zeros()
        .map(|z| z[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>().0);
    let nibbles = _mm512_set1_epi32(0x0F0F_0F0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..ng {
        let scale = group_scales(w.scales(), (p * ng + g) * PANEL);
        let zero = match zeros {
            Some(z) if ASYM => load_zeros(&z[g]),
            _ => _mm512_set1_ps(f32::from(w.symmetric_zero())),
        };
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            // int4: sums of the high and the low bytes; int8: sums of the first and the last
            // four K values of each step.
            let mut hi = [[_mm512_setzero_si512(); R]; C];
            let mut lo = [[_mm512_setzero_si512(); R]; C];
            for s in steps {
                if BITS == 8 {
                    let c = int8_step_pairs::<1>(codes, s);
                    for r in 0..R {
                        let a = &acts[r][s];
                        hi[0][r] = dpwssd(hi[0][r], c[0], broadcast_word(a, 0));
                        hi[C - 1][r] = dpwssd(hi[C - 1][r], c[1], broadcast_word(a, 1));
                        lo[0][r] = dpwssd(lo[0][r], c[2], broadcast_word(a, 2));
                        lo[C - 1][r] = dpwssd(lo[C - 1][r], c[3], broadcast_word(a, 3));
                    }
                    continue;
                }
                prefetch_ahead(&codes[s]);
                let v = load_step(&codes[s]);
                let even = _mm512_and_si512(v, nibbles);
                let odd = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibbles);
                for r in 0..R {
                    let a = &acts[r][s];
                    hi[0][r] = _mm512_dpbusd_epi32(hi[0][r], even, broadcast_word(a, 0));
                    hi[C - 1][r] = _mm512_dpbusd_epi32(hi[C - 1][r], odd, broadcast_word(a, 1));
                    lo[0][r] = _mm512_dpbusd_epi32(lo[0][r], even, broadcast_word(a, 2));
                    lo[C - 1][r] = _mm512_dpbusd_epi32(lo[C - 1][r], odd, broadcast_word(a, 3));
                }
            }
            let b = g * blocks.per_group + i;
            for r in 0..R {
                let (mut h, mut l) = (hi[0][r], lo[0][r]);
                for c in 1..C {
                    h = _mm512_add_epi32(h, hi[c][r]);
                    l = _mm512_add_epi32(l, lo[c][r]);
                }
                let d = block_sum::<BITS>(h, l);
                let xsum = _mm512_set1_ps(job.group_sums[(m0 + r) * nb + b]);
                let t = _mm512_fnmadd_ps(zero, xsum, _mm512_cvtepi32_ps(d));
                acc[r] = _mm512_fmadd_ps(t, scale, acc[r]);
            }
        }
    }
    for r in 0..R {
        let (scale, post) = read_header(rows[r]);
        let scaled = _mm512_mul_ps(acc[r], _mm512_set1_ps(scale));
        acc[r] = _mm512_mul_ps(scaled, _mm512_set1_ps(post));
    }
    // SAFETY: rows `m0..m0 + R` of panel `p` are ours to write (our contract).
    unsafe { store_panel_rows(w, job.out, p, m0, acc) };
}

/// Rows `m0..m0 + R` of panels `p..p + NP` at once, for `BITS`-bit codes: for int4 each
/// broadcast activation word feeds the `vpdpbusd` of every panel, dividing the loads per
/// multiply-add of [`tile`] by `NP`; the panels' codes are read as `NP` streams.
///
/// # Safety
/// - As [`tile`], for panels `p..p + NP`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_panels<const NP: usize, const R: usize, const BITS: u32, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let ng = w.n_groups();
    let blocks = Blocks::of(w);
    let nb = blocks.count(ng);
    let codes: [&[[u32; PANEL]]; NP] = std::array::from_fn(|j| panel_steps(w, p + j));
    let (rows, acts) = layout_rows::<R>(job, m0);
    let nibbles = _mm512_set1_epi32(0x0F0F_0F0F);
    let mut acc = [[_mm512_setzero_ps(); R]; NP];
    for g in 0..ng {
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            let mut hi = [[_mm512_setzero_si512(); R]; NP];
            let mut lo = [[_mm512_setzero_si512(); R]; NP];
            for s in steps {
                if BITS == 8 {
                    // Panel by panel, so that only one panel's four code vectors are live.
                    for j in 0..NP {
                        let c = int8_step_pairs::<NP>(codes[j], s);
                        for r in 0..R {
                            let a = &acts[r][s];
                            hi[j][r] = dpwssd(hi[j][r], c[0], broadcast_word(a, 0));
                            hi[j][r] = dpwssd(hi[j][r], c[1], broadcast_word(a, 1));
                            lo[j][r] = dpwssd(lo[j][r], c[2], broadcast_word(a, 2));
                            lo[j][r] = dpwssd(lo[j][r], c[3], broadcast_word(a, 3));
                        }
                    }
                    continue;
                }
                let mut even = [_mm512_setzero_si512(); NP];
                let mut odd = [_mm512_setzero_si512(); NP];
                for j in 0..NP {
                    prefetch_stream::<NP>(codes[j], s);
                    let v = load_step(&codes[j][s]);
                    even[j] = _mm512_and_si512(v, nibbles);
                    odd[j] = _mm512_and_si512(_mm512_srli_epi32::<4>(v), nibbles);
                }
                for r in 0..R {
                    let a = &acts[r][s];
                    let words: [__m512i; 4] = std::array::from_fn(|k| broadcast_word(a, k));
                    for j in 0..NP {
                        hi[j][r] = _mm512_dpbusd_epi32(hi[j][r], even[j], words[0]);
                        hi[j][r] = _mm512_dpbusd_epi32(hi[j][r], odd[j], words[1]);
                        lo[j][r] = _mm512_dpbusd_epi32(lo[j][r], even[j], words[2]);
                        lo[j][r] = _mm512_dpbusd_epi32(lo[j][r], odd[j], words[3]);
                    }
                }
            }
            let b = g * blocks.per_group + i;
            for j in 0..NP {
                let q = p + j;
                let scale = group_scales(w.scales(), (q * ng + g) * PANEL);
                let zero = match w.zeros() {
                    Some(z) if ASYM => {
                        load_zeros(z[(q * ng + g) * PANEL..][..PANEL].try_into().expect("16"))
                    }
                    _ => _mm512_set1_ps(f32::from(w.symmetric_zero())),
                };
                for r in 0..R {
                    let d = block_sum::<BITS>(hi[j][r], lo[j][r]);
                    let xsum = _mm512_set1_ps(job.group_sums[(m0 + r) * nb + b]);
                    let t = _mm512_fnmadd_ps(zero, xsum, _mm512_cvtepi32_ps(d));
                    acc[j][r] = _mm512_fmadd_ps(t, scale, acc[j][r]);
                }
            }
        }
    }
    for j in 0..NP {
        for r in 0..R {
            let (scale, post) = read_header(rows[r]);
            let scaled = _mm512_mul_ps(acc[j][r], _mm512_set1_ps(scale));
            acc[j][r] = _mm512_mul_ps(scaled, _mm512_set1_ps(post));
        }
        // SAFETY: rows `m0..m0 + R` of panel `p + j` are ours to write (our contract).
        unsafe { store_panel_rows(w, job.out, p + j, m0, acc[j]) };
    }
}

/// Prefetches into L1 the line that the stream of `panel`, one of `NP` panels read in
/// lockstep, reads [`PREFETCH_BYTES`] after step `s` (the lead of [`prefetch_ahead`]). Past
/// the panel's end that stream goes on in the panel `NP` further (the same place in the next
/// group of panels), which starts `NP − 1` panels after this one ends: with panels of a few
/// KiB, a lead inside the panel alone would fetch lines of its neighbours that their own
/// streams read already, and leave each group's first page to the hardware prefetcher.
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn prefetch_stream<const NP: usize>(panel: &[[u32; PANEL]], s: usize) {
    prefetch_stream_at::<NP, PREFETCH_BYTES>(panel, s);
}

/// [`prefetch_stream`] with a lead of `LEAD` bytes.
#[target_feature(enable = "sse")]
#[inline]
pub(crate) fn prefetch_stream_at<const NP: usize, const LEAD: usize>(
    panel: &[[u32; PANEL]],
    s: usize,
) {
    let len = size_of_val(panel);
    let mut ahead = s * size_of::<[u32; PANEL]>() + LEAD;
    if ahead >= len {
        ahead += (NP - 1) * len;
    }
    // A prefetch is a hint that never faults, so an address past the weights is harmless.
    _mm_prefetch::<_MM_HINT_T0>(panel.as_ptr().cast::<i8>().wrapping_add(ahead));
}

/// The two-panel instance of [`tile_panels`] for `rows` rows (1 to [`MR2`]).
fn tile2_fn<const BITS: u32, const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile_panels::<2, 1, BITS, ASYM>,
        2 => tile_panels::<2, 2, BITS, ASYM>,
        3 => tile_panels::<2, 3, BITS, ASYM>,
        _ => tile_panels::<2, MR2, BITS, ASYM>,
    }
}

/// The four-panel instance of [`tile_panels`] for `rows` rows (1 to [`QUAD_MAX_ROWS`]).
fn tile4_fn<const BITS: u32, const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile_panels::<QUAD, 1, BITS, ASYM>,
        2 => tile_panels::<QUAD, 2, BITS, ASYM>,
        _ => tile_panels::<QUAD, QUAD_MAX_ROWS, BITS, ASYM>,
    }
}

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]).
fn tile_fn<const BITS: u32, const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile::<1, 2, BITS, ASYM>,
        2 => tile::<2, 2, BITS, ASYM>,
        3 => tile::<3, 2, BITS, ASYM>,
        4 => tile::<4, 2, BITS, ASYM>,
        5 => tile::<5, 1, BITS, ASYM>,
        6 => tile::<6, 1, BITS, ASYM>,
        7 => tile::<7, 1, BITS, ASYM>,
        _ => tile::<MR, 1, BITS, ASYM>,
    }
}

/// A tile instance by row count, as [`run_row_blocks`] takes them.
type TileFor = fn(usize) -> Int4DotTileFn;

/// The entry (see [`crate::wna16::Int4DotPanelsFn`]): rows in blocks of [`ROW_BLOCK`], each
/// block over `panels`; up to [`QUAD_MAX_ROWS`] rows, groups of four panels ([`tile_panels`]),
/// past that pairs of panels in row tiles of up to [`MR2`]; the panels left over alone in row
/// tiles of up to [`MR`] ([`tile`]).
///
/// # Safety
/// - As [`crate::wna16::Int4DotPanelsFn`], on a CPU with AVX-512 F/BW/VNNI, `job.pairs` and
///   `job.group_sums` made by this module's [`fill`].
pub(crate) unsafe fn entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    if job.w.bits() == 8 {
        // SAFETY: our contract; the codes are 8 bits wide.
        unsafe { entry_for::<8>(job, panels) }
    } else {
        // SAFETY: our contract; the codes are 4 bits wide.
        unsafe { entry_for::<4>(job, panels) }
    }
}

/// [`entry`] for `BITS`-bit codes.
///
/// # Safety
/// - As [`entry`], on codes `BITS` wide.
unsafe fn entry_for<const BITS: u32>(job: &Int4DotJob<'_>, panels: Range<usize>) {
    let (width, mr, tiles): (usize, usize, [TileFor; 2]) = if job.m <= QUAD_MAX_ROWS {
        let tiles = [tile4_fn::<BITS, false>, tile4_fn::<BITS, true>];
        (QUAD, QUAD_MAX_ROWS, tiles)
    } else {
        (2, MR2, [tile2_fn::<BITS, false>, tile2_fn::<BITS, true>])
    };
    let grouped = panels.len() / width * width;
    let groups = (panels.start..panels.start + grouped).step_by(width);
    // SAFETY: every instance is a tile of this module, which needs the features and the
    // layout the caller vouches for; each walked `p` starts `width` of the caller's panels
    // (`grouped ≤` their count).
    unsafe { run_row_blocks(job, groups, ROW_BLOCK, mr, tiles) };
    let singles = panels.start + grouped..panels.end;
    let tiles = [tile_fn::<BITS, false>, tile_fn::<BITS, true>];
    // SAFETY: as above, one panel of the caller's per tile.
    unsafe { run_row_blocks(job, singles, ROW_BLOCK, MR, tiles) };
}

/// This body as a kernel set's int4 dot-product body, for GEMMs of `min_m` rows up to
/// `max_m` (exclusive) on int4 and int8 integer codes.
pub(crate) fn body(min_m: usize, max_m: usize) -> Int4Dot {
    let unit = "avx512-vnni dot products on codes decoded in registers";
    integer_body(unit, fill, entry, (min_m, max_m), (true, false))
}

/// The AVX-512 VNNI set with this body at every row count, where the CPU has AVX-512 VNNI
/// (tests).
#[cfg(test)]
pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
    let token = super::Avx512Vnni::try_new()?;
    let ks = super::avx512vnni_kernel_set(token).without_wna16_int4_dot();
    // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all the body and its layout need.
    Some(unsafe { ks.with_wna16_int4_dot(body(1, usize::MAX)) })
}

#[cfg(test)]
mod tests {
    use super::{STEP_BYTES, kernel_set};
    use crate::wna16_i15::split_byte_offset;
    use crate::wna16_i15::tests::check_fill_layout;

    /// The layout holds each value's quantized integer as `128·hi + lo` at its place, the
    /// row's scale and post factor in the header, zeros past K, and each block's exact sum of
    /// the integers.
    #[test]
    fn fill_lays_out_integer_halves_and_block_sums() {
        if kernel_set().is_none() {
            eprintln!("note: skipping the AVX-512 VNNI integer WNA16 layout: no AVX-512 VNNI");
            return;
        }
        check_fill_layout(super::fill, STEP_BYTES, |steps, kk| {
            let hi = steps[split_byte_offset(kk, false)] as i8;
            let lo = steps[split_byte_offset(kk, true)];
            assert!(lo < 128, "K value {kk}: low byte {lo}");
            128 * i32::from(hi) + i32::from(lo)
        });
    }
}
