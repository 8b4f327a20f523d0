//! The WNA16 body for int4 and int8 integer codes on AVX2 (`vpmaddwd`), with each row of
//! activations quantized to 15-bit integers once per GEMM (the numerics of
//! [`crate::wna16_i15`], which this body equals bit for bit, as the AVX-512 VNNI body does).
//!
//! AVX2 multiplies bytes only through `vpmaddubsw`, whose 16-bit pair sums would need the
//! activations split into two bytes and a second widening step; `vpmaddwd` instead multiplies
//! 16-bit pairs into exact 32-bit sums (`|c·q| ≤ 15·16383`), so each activation stays one
//! 16-bit integer. A 32-byte half of a packed int4 step holds 8 channels, one per 32-bit lane,
//! nibble `j` = K value `8s + j`: a shift by `4j` and an AND with `0x000F000F` leave K values
//! `j` and `j + 4` as the lane's two 16-bit halves. The activations are laid out per step as
//! four 32-bit words, `(q_j, q_{j+4})` for `j = 0..4` ([`fill`]), each broadcast to all lanes,
//! so four `vpmaddwd` per half and row do the step's 64 multiply-adds of that half into
//! integer sums, which the block's end turns into f32 exactly as the scalar twin does.
//!
//! int8 codes are packed K-major, four K values per step, each the 16 channels' bytes
//! ([`int8_step`]): the two steps of an activation step's 8 K values hold K value `j` and `j + 4`
//! in their rows `j`, so interleaving those two rows byte by byte (`vpunpcklbw`/`vpunpckhbw`)
//! and widening to 16 bits (`vpmovzxbw`) puts codes `(c_j, c_{j+4})` of a channel in each
//! 32-bit lane, against the same activation word as the int4 codes: four instructions per 32
//! codes, and `|c·q| ≤ 255·16383` keeps the pair sums and a block's sum of at most
//! [`crate::wna16_i15::MAX_BLOCK_INT8`] K values exact in 32 bits.
//!
//! Rows run in blocks of [`ROW_BLOCK`] over all of the call's panels, each panel in tiles of
//! up to [`MR`] rows: the codes a step decodes serve every row of the tile.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::actquant::load8;
use super::wna16::prefetch_ahead;
use super::wna16::ymm::load_scales;
use crate::aligned::AlignedVec;
use crate::dispatch::Int4Dot;
use crate::packed::wna16::{Int4Values, K_STEP8, Wna16ScaleValues};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout, Int4DotTileFn, run_row_blocks};
use crate::wna16_i15::{
    Blocks, E2M1_INTEGERS, E2M1_ZERO, HEADER_BYTES, MAX_Q, RowLayout, RowScale, integer_body,
    layout_rows, panel_steps, read_header, write_header,
};

/// Rows per tile: 4 rows × 2 integer sums, a half step's 4 decoded code vectors and the
/// broadcast activations fit the 16 registers.
const MR: usize = 4;

/// Rows that run over all of a call's panels before the next rows start.
const ROW_BLOCK: usize = 64;

/// Bytes of one step of a row's activations: four words of two 16-bit integers.
const STEP_BYTES: usize = 16;

/// Where K value `kk` of a row's steps lies, in bytes from the first step.
#[cfg(test)]
fn byte_offset(kk: usize) -> usize {
    let j = kk % crate::packed::wna16::K_STEP;
    kk / crate::packed::wna16::K_STEP * STEP_BYTES + 4 * (j % 4) + 2 * (j / 4)
}

/// Lays out `m` rows of `x` for the body: per row a [`HEADER_BYTES`] header (the row's scale
/// and post factor, see [`RowScale`]) and then, per step, the 16-bit integers of K values
/// `8s + 0, 4, 1, 5, 2, 6, 3, 7`, K past its end as zeros. Writes each row's activation sums
/// per block into `sums`, row-major.
///
/// # Safety
/// - The CPU has AVX2; `x` holds `m·K` values of `w`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn fill(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout {
    // Steps of 8 K values whatever the codes' width (two int8 steps each).
    let k = w.k();
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
        let (mut block, mut sum) = (0, _mm256_setzero_si256());
        for (s, step) in steps.chunks_exact_mut(STEP_BYTES).enumerate() {
            let kk = 8 * s;
            let q = quantize8(row, kk, &rs);
            step.copy_from_slice(&interleave(q));
            // A block holds whole steps, so a step's eight integers share one.
            let b = blocks.of_k(kk);
            if b != block {
                row_sums[block] = sum_lanes(sum) as f32;
                (block, sum) = (b, _mm256_setzero_si256());
            }
            sum = _mm256_add_epi32(sum, q);
        }
        if nb > 0 {
            row_sums[block] = sum_lanes(sum) as f32;
        }
    }
    layout.of_rows(m)
}

/// Values `lo..lo + 8` of `row`, zeros past its end.
#[target_feature(enable = "avx2")]
#[inline]
fn load8_padded(row: &[f32], lo: usize) -> __m256 {
    match row.get(lo..lo + 8) {
        Some(v) => load8(v.try_into().expect("8 values")),
        None => {
            let mut buf = [0f32; 8];
            let tail = &row[lo.min(row.len())..];
            buf[..tail.len()].copy_from_slice(tail);
            load8(&buf)
        }
    }
}

/// The largest magnitude of `row`, NaN when it holds a NaN or an infinity.
#[target_feature(enable = "avx2")]
fn amax(row: &[f32]) -> f32 {
    let abs_mask = _mm256_set1_epi32(0x7FFF_FFFF);
    let finite_top = _mm256_set1_epi32(0x7F7F_FFFF);
    let (mut top, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_si256());
    for lo in (0..row.len()).step_by(8) {
        let a = _mm256_and_si256(_mm256_castps_si256(load8_padded(row, lo)), abs_mask);
        // `a` is not finite exactly when its bits pass those of the largest finite f32.
        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(a, finite_top));
        top = _mm256_max_ps(top, _mm256_castsi256_ps(a));
    }
    if _mm256_movemask_epi8(bad) != 0 {
        return f32::NAN;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 writable f32; the store is unaligned.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), top) };
    lanes.iter().fold(0f32, |m, &v| m.max(v))
}

/// The integers of values `lo..lo + 8` of `row` (zeros past its end), as
/// [`RowScale::quantize`] makes them: `x · lift · inv` rounded half to even, clamped.
#[target_feature(enable = "avx2")]
#[inline]
fn quantize8(row: &[f32], lo: usize, rs: &RowScale) -> __m256i {
    let v = _mm256_mul_ps(load8_padded(row, lo), _mm256_set1_ps(rs.lift));
    let v = _mm256_mul_ps(v, _mm256_set1_ps(rs.inv));
    let v = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
    _mm256_max_epi32(
        _mm256_min_epi32(_mm256_cvttps_epi32(v), _mm256_set1_epi32(MAX_Q)),
        _mm256_set1_epi32(-MAX_Q),
    )
}

/// The 16 bytes of one step's eight integers (see [`fill`]).
#[target_feature(enable = "avx2")]
#[inline]
fn interleave(q: __m256i) -> [u8; STEP_BYTES] {
    // The integers fit 16 bits, so the saturating pack is exact: 16-bit values 0..8 in order.
    let packed = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
    let order = _mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    let ordered = _mm_shuffle_epi8(packed, order);
    let mut bytes = [0u8; STEP_BYTES];
    // SAFETY: `bytes` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(bytes.as_mut_ptr().cast(), ordered) };
    bytes
}

/// The sum of the eight lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn sum_lanes(v: __m256i) -> i32 {
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` is 8 writable i32; the store is unaligned.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), v) };
    lanes.iter().sum()
}

/// Broadcasts word `j` of a step's activations to all 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn broadcast_word(step: &[u8; STEP_BYTES], j: usize) -> __m256i {
    let word: &[u8; 4] = step[4 * j..4 * j + 4].try_into().expect("4 bytes");
    _mm256_set1_epi32(i32::from_le_bytes(*word))
}

/// Loads channels `8h..8h + 8` of a step.
#[target_feature(enable = "avx2")]
#[inline]
fn load_half(step: &[u32; PANEL], h: usize) -> __m256i {
    let half: &[u32; 8] = step[8 * h..8 * h + 8].try_into().expect("8 words");
    // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(half.as_ptr().cast()) }
}

/// The 16 e8m0 scales `e[at..at + 16]` halved, `2^(e − 128)` (MXFP4's scales through the
/// integer sums, [`crate::wna16_i15`]): `2^(e − 127)` from the exponent bits (the subnormal
/// `2^−127` for `e = 0`), times one half, which is exact.
#[target_feature(enable = "avx2")]
#[inline]
fn halved_e8m0_scales(e: &[u8], at: usize) -> [__m256; 2] {
    let bytes: &[u8; PANEL] = e[at..at + PANEL].try_into().expect("16 scales");
    let subnormal = _mm256_castsi256_ps(_mm256_set1_epi32(0x0040_0000));
    let half = _mm256_set1_ps(0.5);
    std::array::from_fn(|h| {
        let eight: &[u8; 8] = bytes[8 * h..][..8].try_into().expect("8 scales");
        // SAFETY: the reference covers 8 readable bytes; the load is unaligned.
        let e = _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(eight.as_ptr().cast()) });
        let pow = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e));
        let zero = _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
        _mm256_mul_ps(_mm256_blendv_ps(pow, subnormal, zero), half)
    })
}

/// A group's 16 zero points, as f32.
#[target_feature(enable = "avx2")]
#[inline]
fn load_zeros(z: &[u8; PANEL]) -> [__m256; 2] {
    // SAFETY: the reference covers 16 readable bytes; the load is unaligned.
    let bytes = unsafe { _mm_loadu_si128(z.as_ptr().cast()) };
    [
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(bytes, bytes))),
    ]
}

/// Adds a half step's products to the rows' integer sums of half `h`: the four code pair
/// vectors `c` (K values `j` and `j + 4` in each lane) against the rows' four words.
#[target_feature(enable = "avx2")]
#[inline]
fn add_pair_products<const R: usize>(
    c: &[__m256i; 4],
    acts: [&[u8; STEP_BYTES]; R],
    sum: &mut [[__m256i; 2]; R],
    h: usize,
) {
    for r in 0..R {
        let a = acts[r];
        let d01 = _mm256_add_epi32(
            _mm256_madd_epi16(c[0], broadcast_word(a, 0)),
            _mm256_madd_epi16(c[1], broadcast_word(a, 1)),
        );
        let d23 = _mm256_add_epi32(
            _mm256_madd_epi16(c[2], broadcast_word(a, 2)),
            _mm256_madd_epi16(c[3], broadcast_word(a, 3)),
        );
        sum[r][h] = _mm256_add_epi32(sum[r][h], _mm256_add_epi32(d01, d23));
    }
}

/// Adds an int4 step's products to the rows' integer sums: per half of the panel, the step's
/// four code pairs (a shift by `4j` and an AND with `0x000F000F`) against the four words.
#[target_feature(enable = "avx2")]
#[inline]
fn int4_step<const R: usize>(
    step: &[u32; PANEL],
    acts: [&[u8; STEP_BYTES]; R],
    sum: &mut [[__m256i; 2]; R],
) {
    let pair_mask = _mm256_set1_epi32(0x000F_000F);
    for h in 0..2 {
        let v = load_half(step, h);
        let c = [
            _mm256_and_si256(v, pair_mask),
            _mm256_and_si256(_mm256_srli_epi32::<4>(v), pair_mask),
            _mm256_and_si256(_mm256_srli_epi32::<8>(v), pair_mask),
            _mm256_and_si256(_mm256_srli_epi32::<12>(v), pair_mask),
        ];
        add_pair_products(&c, acts, sum, h);
    }
}

/// Adds an e2m1 step's products to the rows' integer sums: per half of the panel, each code
/// nibble becomes its integer ([`E2M1_INTEGERS`], one `vpshufb` per nibble half of the bytes),
/// and the pairs of K values `j` and `j + 4` are those integers' bytes 0 and 2 (K values 0, 1)
/// or 1 and 3 (K values 2, 3) of each 32-bit lane, widened in place to 16 bits.
#[target_feature(enable = "avx2")]
#[inline]
fn e2m1_step<const R: usize>(
    step: &[u32; PANEL],
    acts: [&[u8; STEP_BYTES]; R],
    sum: &mut [[__m256i; 2]; R],
) {
    let nibble = _mm256_set1_epi8(0x0F);
    let even_bytes = _mm256_set1_epi32(0x00FF_00FF);
    // SAFETY: the table is 16 readable bytes; the load is unaligned.
    let table =
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(E2M1_INTEGERS.as_ptr().cast()) });
    for h in 0..2 {
        let v = load_half(step, h);
        // Nibbles 0, 2, 4, 6 (low) and 1, 3, 5, 7 (high) of each lane, as their integers.
        let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nibble));
        let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble));
        let c = [
            _mm256_and_si256(lo, even_bytes),
            _mm256_and_si256(hi, even_bytes),
            _mm256_srli_epi16::<8>(lo),
            _mm256_srli_epi16::<8>(hi),
        ];
        add_pair_products(&c, acts, sum, h);
    }
}

/// Codes of K values `j` (low 16 bits) and `j + 4` (high 16 bits) of each channel, as two
/// vectors of 8 channels, from int8 steps `first` and `second` (none past the end of K).
#[target_feature(enable = "avx2")]
#[inline]
fn int8_pairs(first: &[u32; PANEL], second: Option<&[u32; PANEL]>, j: usize) -> [__m256i; 2] {
    let row = |step: &[u32; PANEL]| {
        let bytes: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
        // SAFETY: the reference covers 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) }
    };
    let a = row(first);
    let b = second.map_or(_mm_setzero_si128(), row);
    [
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b)),
        _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b)),
    ]
}

/// Adds the products of two int8 steps (an activation step's 8 K values; `second` absent at
/// the end of an odd count of them) to the rows' integer sums.
#[target_feature(enable = "avx2")]
#[inline]
fn int8_step<const R: usize>(
    first: &[u32; PANEL],
    second: Option<&[u32; PANEL]>,
    acts: [&[u8; STEP_BYTES]; R],
    sum: &mut [[__m256i; 2]; R],
) {
    // Both steps' lines: the pair is two cache lines of the stream.
    prefetch_ahead(first);
    if let Some(second) = second {
        prefetch_ahead(second);
    }
    let mut part = [[_mm256_setzero_si256(); 2]; R];
    for j in 0..K_STEP8 {
        let c = int8_pairs(first, second, j);
        for r in 0..R {
            let a = broadcast_word(acts[r], j);
            for h in 0..2 {
                part[r][h] = _mm256_add_epi32(part[r][h], _mm256_madd_epi16(c[h], a));
            }
        }
    }
    for r in 0..R {
        for h in 0..2 {
            sum[r][h] = _mm256_add_epi32(sum[r][h], part[r][h]);
        }
    }
}

/// Rows `m0..m0 + R` of panel `p` (see the module docs), for `BITS`-bit codes (4 or 8), or
/// e2m1 codes with `E2M1` (their integers against the zero point [`E2M1_ZERO`], the scales
/// halved: [`crate::wna16_i15`]).
///
/// # Safety
/// - The CPU has AVX2, FMA and F16C; the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s
///   contract for panel `p` with this module's [`fill`], its codes are `BITS` wide (e2m1 ones
///   with `E2M1`), and `m0 + R ≤ job.m`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize, const BITS: u32, const ASYM: bool, const E2M1: bool>(
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
    let symmetric = if E2M1 {
        [_mm256_set1_ps(f32::from(E2M1_ZERO)); 2]
    } else {
        [_mm256_set1_ps(f32::from(w.symmetric_zero())); 2]
    };
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for g in 0..ng {
        let scale = match w.scales() {
            Wna16ScaleValues::E8m0(e) if E2M1 => halved_e8m0_scales(e, (p * ng + g) * PANEL),
            _ if E2M1 => load_scales(w, p, g, 0).map(|s| _mm256_mul_ps(s, _mm256_set1_ps(0.5))),
            _ => load_scales(w, p, g, 0),
        };
        let zero = match zeros {
            Some(z) if ASYM => load_zeros(&z[g]),
            _ => symmetric,
        };
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            let mut sum = [[_mm256_setzero_si256(); 2]; R];
            for s in steps {
                let a: [&[u8; STEP_BYTES]; R] = std::array::from_fn(|r| &acts[r][s]);
                if BITS == 8 {
                    int8_step(&codes[2 * s], codes.get(2 * s + 1), a, &mut sum);
                } else if E2M1 {
                    prefetch_ahead(&codes[s]);
                    e2m1_step(&codes[s], a, &mut sum);
                } else {
                    prefetch_ahead(&codes[s]);
                    int4_step(&codes[s], a, &mut sum);
                }
            }
            let b = g * blocks.per_group + i;
            for r in 0..R {
                let xsum = _mm256_set1_ps(job.group_sums[(m0 + r) * nb + b]);
                for h in 0..2 {
                    let t = _mm256_fnmadd_ps(zero[h], xsum, _mm256_cvtepi32_ps(sum[r][h]));
                    acc[r][h] = _mm256_fmadd_ps(t, scale[h], acc[r][h]);
                }
            }
        }
    }
    let mut out = [[0f32; PANEL]; R];
    for r in 0..R {
        let (s, post) = read_header(rows[r]);
        for h in 0..2 {
            let scaled = _mm256_mul_ps(acc[r][h], _mm256_set1_ps(s));
            let v = _mm256_mul_ps(scaled, _mm256_set1_ps(post));
            // SAFETY: `out[r]` holds 16 f32, of which this writes 8 from `8h` (h < 2).
            unsafe { _mm256_storeu_ps(out[r][8 * h..].as_mut_ptr(), v) };
        }
    }
    // SAFETY: rows `m0..m0 + R` of panel `p` are ours to write (our contract).
    unsafe { crate::wna16_tile::store_rows(w, job.out, p, m0, 0, &mut out) };
}

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]) and `BITS`-bit codes (e2m1 ones
/// with `E2M1`).
fn tile_fn<const BITS: u32, const ASYM: bool, const E2M1: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile::<1, BITS, ASYM, E2M1>,
        2 => tile::<2, BITS, ASYM, E2M1>,
        3 => tile::<3, BITS, ASYM, E2M1>,
        _ => tile::<MR, BITS, ASYM, E2M1>,
    }
}

/// The entry (see [`crate::wna16::Int4DotPanelsFn`]): rows in blocks of [`ROW_BLOCK`], each
/// block over `panels` in row tiles of up to [`MR`].
///
/// # Safety
/// - As [`crate::wna16::Int4DotPanelsFn`], on a CPU with AVX2, FMA and F16C, `job.pairs` and
///   `job.group_sums` made by this module's [`fill`].
pub(crate) unsafe fn entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    let tiles: [fn(usize) -> Int4DotTileFn; 2] = if job.w.bits() == 8 {
        [tile_fn::<8, false, false>, tile_fn::<8, true, false>]
    } else if job.w.values() == Int4Values::E2m1 {
        // MXFP4 has no zero points.
        [tile_fn::<4, false, true>; 2]
    } else {
        [tile_fn::<4, false, false>, tile_fn::<4, true, false>]
    };
    // SAFETY: every instance is a tile of this module, which needs the features and the
    // layout the caller vouches for, on rows and panels of the caller's.
    unsafe { run_row_blocks(job, panels, ROW_BLOCK, MR, tiles) };
}

/// This body as a kernel set's int4 dot-product body, for GEMMs of `min_m` rows up to
/// `max_m` (exclusive) on int4 and int8 integer codes.
pub(crate) fn body(min_m: usize, max_m: usize) -> Int4Dot {
    let unit = "avx2 16-bit dot products on codes decoded in registers";
    integer_body(unit, fill, entry, (min_m, max_m), (true, true))
}

/// The AVX2 set with this body at every row count, where the CPU has AVX2, FMA and F16C
/// (tests).
#[cfg(test)]
pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
    if !(std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c")) {
        return None;
    }
    let ks = super::kernel_set(crate::Isa::Avx2)?.without_wna16_int4_dot();
    // SAFETY: the set exists, so the CPU has AVX2; FMA and F16C were detected just above.
    Some(unsafe { ks.with_wna16_int4_dot(body(1, usize::MAX)) })
}

#[cfg(test)]
mod tests {
    use super::{STEP_BYTES, byte_offset, kernel_set};
    use crate::wna16_i15::tests::check_fill_layout;

    /// The layout holds each value's quantized integer as a 16-bit pair half at its place,
    /// the row's scale and post factor in the header, zeros past K, and each block's exact
    /// sum of the integers.
    #[test]
    fn fill_lays_out_16_bit_pairs_and_block_sums() {
        if kernel_set().is_none() {
            eprintln!("note: skipping the AVX2 integer WNA16 layout: no AVX2, FMA or F16C");
            return;
        }
        check_fill_layout(super::fill, STEP_BYTES, |steps, kk| {
            let at = byte_offset(kk);
            i32::from(i16::from_le_bytes([steps[at], steps[at + 1]]))
        });
    }
}
