//! The WNA16 (weight-only int4/int8, f32 compute) body of the aarch64 rungs. It needs NEON
//! only, the aarch64 baseline, so all three rungs register it: the dot-product and
//! matrix-multiply extensions have nothing for f32 products.
//!
//! Tiles of up to 4 rows × 16 channels (four 4-lane vectors per row), or of 5 to [`MR`] rows
//! in two passes of 8 channels, so a decoded weight vector serves up to 8 rows.
//! - int4: one packed step holds 8 K values of the panel's 16 channels, one channel per
//!   32-bit lane (nibble `j` is K value `8s + j`). An XOR with `0x8888_8888` turns every code
//!   `c` into the 4-bit two's complement of `c − 8`, so K value `j` is a shift left that brings
//!   its nibble to the top of the lane, an arithmetic shift right by 28 and a conversion
//!   (`scvtf`): exactly `c − 8`.
//! - int8: K value `j` of a step is 16 consecutive channel bytes. An XOR with `0x80` turns
//!   each code into the i8 `c − 128`, which two widenings and a conversion make exact f32s.
//!
//! Asymmetric weights then subtract `z − 8` (or `z − 128`) per group, which leaves the exact
//! `c − z`. Each row multiplies the decoded weights by its activation with `fmla` by element
//! (the activations are read four K values at a time) into per-group partial sums; tiles of one
//! or two rows keep two partial sums per vector (even and odd K values) so the FMA latency does
//! not bound them. At the end of a group the partial sums are scaled into the row's
//! accumulator with one more `fmla`. Weights are decoded once per K value for all rows.
//!
//! Numerics: as in the AVX-512 body, every multiply-add is fused, so outputs differ from the
//! reference (`crate::wna16`) by a few units in the last place of the magnitudes summed; the
//! tests bound the difference by `1e-5·Σ|x·w|`. MXFP4 (e2m1) and FP8 (e4m3) codes run the
//! portable body, which LLVM vectorises for NEON.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::ops::Range;

use crate::packed::wna16::{Int4Values, K_STEP, K_STEP8};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::Wna16Job;

use super::common::load_f32x4;

/// Rows per tile. Tiles of up to 4 rows cover the panel's 16 channels at once (four vectors
/// per row); taller tiles cover it in two passes of 8 channels (two vectors per row), so each
/// decoded weight vector serves up to 8 rows while the partial sums still take 16 registers.
const MR: usize = 8;

/// Rows up to which a tile covers all 16 channels in one pass.
const FULL_WIDTH_ROWS: usize = 4;

/// Vectors per row of a panel's 16 channels.
const V: usize = PANEL / 4;

/// `NQ` vectors of one row, lane `i` of vector `q` being channel `4(q0 + q) + i` of the panel
/// for the pass starting at vector `q0`.
type Lanes<const NQ: usize> = [float32x4_t; NQ];

/// Loads vectors `q0..q0 + NQ` of 16 f32.
#[target_feature(enable = "neon")]
#[inline]
fn load_lanes<const NQ: usize>(v: &[f32; PANEL], q0: usize) -> Lanes<NQ> {
    let v = &v[4 * q0..4 * (q0 + NQ)];
    std::array::from_fn(|q| load_f32x4(&v[4 * q..]))
}

/// Stores vectors `q0..q0 + NQ` of 16 f32.
#[target_feature(enable = "neon")]
#[inline]
fn store_lanes<const NQ: usize>(dst: &mut [f32; PANEL], q0: usize, v: Lanes<NQ>) {
    let dst = &mut dst[4 * q0..4 * (q0 + NQ)];
    for q in 0..NQ {
        // SAFETY: lanes `4q..4q + 4` of the slice are writable; `st1` has no alignment
        // requirement.
        unsafe { vst1q_f32(dst[4 * q..].as_mut_ptr(), v[q]) };
    }
}

/// Words `4q0..4(q0 + NQ)` of one int4 step, XORed so each nibble is the two's complement of
/// `c − 8`.
#[target_feature(enable = "neon")]
#[inline]
fn load_step4<const NQ: usize>(step: &[u32; PANEL], q0: usize) -> [int32x4_t; NQ] {
    let flip = vdupq_n_u32(0x8888_8888);
    let words = &step[4 * q0..4 * (q0 + NQ)];
    std::array::from_fn(|q| {
        // SAFETY: words `4q..4q + 4` of the slice are readable; `ld1` has no alignment
        // requirement.
        let words = unsafe { vld1q_u32(words[4 * q..].as_ptr()) };
        vreinterpretq_s32_u32(veorq_u32(words, flip))
    })
}

/// Decodes K value `J` (nibble `J`, brought to the top by a left shift of `SHL = 28 − 4J`) of
/// a flipped int4 step: `c − 8`, less `zadj` when asymmetric.
#[target_feature(enable = "neon")]
#[inline]
fn decode4<const SHL: i32, const ASYM: bool, const NQ: usize>(
    v: &[int32x4_t; NQ],
    zadj: &Lanes<NQ>,
) -> Lanes<NQ> {
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(vshrq_n_s32::<28>(vshlq_n_s32::<SHL>(v[q])));
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// [`decode4`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "neon")]
#[inline]
fn decode4_at<const ASYM: bool, const NQ: usize>(
    v: &[int32x4_t; NQ],
    j: usize,
    zadj: &Lanes<NQ>,
) -> Lanes<NQ> {
    let shl = vdupq_n_s32(28 - 4 * j as i32);
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(vshrq_n_s32::<28>(vshlq_s32(v[q], shl)));
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// Decodes channels `4q0..4(q0 + NQ)` of K value `j` of an int8 step (16 consecutive channel
/// bytes): `c − 128`, less `zadj` when asymmetric. `NQ` is 4 (`q0` = 0) or 2.
#[target_feature(enable = "neon")]
#[inline]
fn decode8<const ASYM: bool, const NQ: usize>(
    step: &[u32; PANEL],
    j: usize,
    q0: usize,
    zadj: &Lanes<NQ>,
) -> Lanes<NQ> {
    let words: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    let flip = vdupq_n_u8(0x80);
    let ints: [int32x4_t; NQ] = if NQ == V {
        // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
        let bytes = unsafe { vld1q_u8(words.as_ptr().cast()) };
        let signed = vreinterpretq_s8_u8(veorq_u8(bytes, flip));
        let (lo, hi) = (vmovl_s8(vget_low_s8(signed)), vmovl_high_s8(signed));
        let all = [
            vmovl_s16(vget_low_s16(lo)),
            vmovl_high_s16(lo),
            vmovl_s16(vget_low_s16(hi)),
            vmovl_high_s16(hi),
        ];
        std::array::from_fn(|q| all[q])
    } else {
        let half: &[u32; 2] = words[q0..q0 + 2].try_into().expect("8 bytes");
        // SAFETY: the reference covers 8 readable bytes; `ld1` has no alignment requirement.
        let bytes = unsafe { vld1_u8(half.as_ptr().cast()) };
        let wide = vmovl_s8(vreinterpret_s8_u8(veor_u8(bytes, vget_low_u8(flip))));
        let both = [vmovl_s16(vget_low_s16(wide)), vmovl_high_s16(wide)];
        std::array::from_fn(|q| both[q])
    };
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(ints[q]);
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// `part += w · x[L]` over the pass's channels.
#[target_feature(enable = "neon")]
#[inline]
fn fma_lane<const L: i32, const NQ: usize>(part: &mut Lanes<NQ>, w: &Lanes<NQ>, x: float32x4_t) {
    for q in 0..NQ {
        part[q] = vfmaq_laneq_f32::<L>(part[q], w[q], x);
    }
}

/// `part += w · x` over the pass's channels.
#[target_feature(enable = "neon")]
#[inline]
fn fma_dup<const NQ: usize>(part: &mut Lanes<NQ>, w: &Lanes<NQ>, x: f32) {
    for q in 0..NQ {
        part[q] = vfmaq_n_f32(part[q], w[q], x);
    }
}

/// Computes rows `m0..m0 + R` of panel `p`, channels `4q0..4(q0 + NQ)`, with `C` partial sums
/// per vector.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0 + R` of panel
///   `p`; `m0 + R ≤ job.m`, `job.x` holds `m·K` values, and the codes are integers of `BITS`
///   bits (zero points present exactly when `ASYM`); `q0 + NQ ≤ 4`.
#[target_feature(enable = "neon")]
unsafe fn tile<
    const BITS: u32,
    const R: usize,
    const C: usize,
    const ASYM: bool,
    const NQ: usize,
>(
    job: &Wna16Job<'_>,
    p: usize,
    m0: usize,
    q0: usize,
) {
    let w = job.w;
    let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
    let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let rows: [&[f32]; R] = std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
    let symmetric_zero = f32::from(w.symmetric_zero());
    // The rows' accumulators live in memory: they change once per group, and in registers
    // they would crowd out the partial sums of the inner loop.
    let mut acc = [[0f32; PANEL]; R];
    for g in 0..ng {
        let (k0, k1) = (g * gs, k.min((g + 1) * gs));
        // `z − 8` (or `z − 128`): what is left to subtract from the decoded `c − 8`.
        let zadj: Lanes<NQ> = if ASYM {
            let z = w.group_zeros(p, g);
            load_lanes(&std::array::from_fn(|c| z[c] - symmetric_zero), q0)
        } else {
            [vdupq_n_f32(0.0); NQ]
        };
        let mut part = [[[vdupq_n_f32(0.0); NQ]; R]; C];
        if BITS == 4 {
            // Group sizes are multiples of K_STEP, so `k0` starts a step.
            let (s0, s_full) = (k0 / K_STEP, k1 / K_STEP);
            for s in s0..s_full {
                let v = load_step4::<NQ>(&steps[s], q0);
                // Each row's four activations of one half of the step, loaded when that half
                // starts, so the two halves do not hold twice the registers at once.
                let half = |h: usize| -> [float32x4_t; R] {
                    std::array::from_fn(|r| load_f32x4(&rows[r][s * K_STEP + 4 * h..]))
                };
                macro_rules! k_value {
                    ($xs:ident, $j:literal, $lane:literal) => {{
                        let wj = decode4::<{ 28 - 4 * $j }, ASYM, NQ>(&v, &zadj);
                        for r in 0..R {
                            fma_lane::<$lane, NQ>(&mut part[$j % C][r], &wj, $xs[r]);
                        }
                    }};
                }
                let xs = half(0);
                k_value!(xs, 0, 0);
                k_value!(xs, 1, 1);
                k_value!(xs, 2, 2);
                k_value!(xs, 3, 3);
                let xs = half(1);
                k_value!(xs, 4, 0);
                k_value!(xs, 5, 1);
                k_value!(xs, 6, 2);
                k_value!(xs, 7, 3);
            }
            // The last step of K, when K is not a multiple of K_STEP.
            if s_full * K_STEP < k1 {
                let v = load_step4::<NQ>(&steps[s_full], q0);
                for kk in s_full * K_STEP..k1 {
                    let wj = decode4_at::<ASYM, NQ>(&v, kk % K_STEP, &zadj);
                    for r in 0..R {
                        fma_dup(&mut part[0][r], &wj, rows[r][kk]);
                    }
                }
            }
        } else {
            // Group sizes are multiples of 8, so `k0` starts a step.
            let (s0, s_full) = (k0 / K_STEP8, k1 / K_STEP8);
            for s in s0..s_full {
                let step = &steps[s];
                let xs: [float32x4_t; R] =
                    std::array::from_fn(|r| load_f32x4(&rows[r][s * K_STEP8..]));
                macro_rules! k_value {
                    ($j:literal) => {{
                        let wj = decode8::<ASYM, NQ>(step, $j, q0, &zadj);
                        for r in 0..R {
                            fma_lane::<$j, NQ>(&mut part[$j % C][r], &wj, xs[r]);
                        }
                    }};
                }
                k_value!(0);
                k_value!(1);
                k_value!(2);
                k_value!(3);
            }
            for kk in s_full * K_STEP8..k1 {
                let wj = decode8::<ASYM, NQ>(&steps[s_full], kk % K_STEP8, q0, &zadj);
                for r in 0..R {
                    fma_dup(&mut part[0][r], &wj, rows[r][kk]);
                }
            }
        }
        let s: Lanes<NQ> = load_lanes(&w.group_scales(p, g), q0);
        for r in 0..R {
            let mut row: Lanes<NQ> = load_lanes(&acc[r], q0);
            for q in 0..NQ {
                let mut sum = part[0][r][q];
                for chain in &part[1..] {
                    sum = vaddq_f32(sum, chain[r][q]);
                }
                row[q] = vfmaq_f32(row[q], sum, s[q]);
            }
            store_lanes(&mut acc[r], q0, row);
        }
        // Keeps the accumulators in memory (see above) rather than promoted to registers.
        std::hint::black_box(&mut acc);
    }
    // SAFETY: forwarded from our contract (rows `m0..m0 + R` of panel `p` are ours).
    unsafe { store_panel_rows::<R, NQ>(w, job.out, p, m0, q0, &acc) };
}

/// Adds the bias (if any) to channels `4q0..4(q0 + NQ)` of the sums of rows `m0..m0 + R` of
/// panel `p` and stores the valid ones into `out` (`m·N`, row-major).
///
/// # Safety
/// - `out` is valid for writes of rows `m0..m0 + R` in panel `p`'s channels, which no other
///   thread writes meanwhile.
#[target_feature(enable = "neon")]
unsafe fn store_panel_rows<const R: usize, const NQ: usize>(
    w: &PackedWna16,
    out: *mut f32,
    p: usize,
    m0: usize,
    q0: usize,
    acc: &[[f32; PANEL]; R],
) {
    let bias: Option<Lanes<NQ>> = w
        .panel_bias(p)
        .map(|b| load_lanes(b.try_into().expect("16 biases"), q0));
    let first = 4 * q0;
    // Channels of the pass that exist (`N` need not fill the last panel).
    let valid = PANEL
        .min(w.n() - p * PANEL)
        .saturating_sub(first)
        .min(4 * NQ);
    for r in 0..R {
        let mut row = acc[r];
        if let Some(b) = bias {
            let mut v: Lanes<NQ> = load_lanes(&row, q0);
            for q in 0..NQ {
                v[q] = vaddq_f32(v[q], b[q]);
            }
            store_lanes(&mut row, q0, v);
        }
        let dst = out.wrapping_add((m0 + r) * w.n() + p * PANEL + first);
        // SAFETY: channels `16p + first..16p + first + valid` (< N) of row `m0 + r` are
        // elements of the caller's output owned by this panel alone (our contract); the local
        // row does not overlap them.
        unsafe { std::ptr::copy_nonoverlapping(row[first..].as_ptr(), dst, valid) };
    }
}

/// One row-count and width instance of [`tile`].
type TileFn = unsafe fn(&Wna16Job<'_>, usize, usize, usize);

/// Walks the row tiles of `panels`: tiles of up to [`FULL_WIDTH_ROWS`] rows in one pass over
/// the 16 channels, taller ones in two passes of 8.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`], for integer codes of `BITS` bits with zero points
///   exactly when `ASYM`.
#[target_feature(enable = "neon")]
unsafe fn panels<const BITS: u32, const ASYM: bool>(job: &Wna16Job<'_>, panels: Range<usize>) {
    for p in panels {
        for rows in crate::ukernel::row_tiles(job.m, MR) {
            let (m0, mr) = (rows.start, rows.len());
            let tile_fn: TileFn = match mr {
                1 => tile::<BITS, 1, 2, ASYM, V>,
                2 => tile::<BITS, 2, 2, ASYM, V>,
                3 => tile::<BITS, 3, 1, ASYM, V>,
                4 => tile::<BITS, 4, 1, ASYM, V>,
                5 => tile::<BITS, 5, 1, ASYM, 2>,
                6 => tile::<BITS, 6, 1, ASYM, 2>,
                7 => tile::<BITS, 7, 1, ASYM, 2>,
                _ => tile::<BITS, MR, 1, ASYM, 2>,
            };
            let passes: &[usize] = if mr <= FULL_WIDTH_ROWS { &[0] } else { &[0, 2] };
            for &q0 in passes {
                // SAFETY: rows `m0..m0 + mr` lie within `0..m`, panel `p` is ours (caller),
                // the codes are what the instance expects (caller), and each pass's vectors
                // lie within the panel's four.
                unsafe { tile_fn(job, p, m0, q0) };
            }
        }
    }
}

/// The entry of every aarch64 rung.
///
/// # Safety
/// - As [`crate::wna16::Wna16PanelsFn`]; it needs NEON only.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn panels_neon(job: &Wna16Job<'_>, range: Range<usize>) {
    let w = job.w;
    if w.values() == Int4Values::E2m1 || w.is_e4m3() {
        return crate::wna16::panels_body(job, range);
    }
    let walk: unsafe fn(&Wna16Job<'_>, Range<usize>) = match (w.bits(), w.zeros().is_some()) {
        (4, false) => panels::<4, false>,
        (4, true) => panels::<4, true>,
        (_, false) => panels::<8, false>,
        (_, true) => panels::<8, true>,
    };
    // SAFETY: forwarded from the caller; the instance matches the weights' codes.
    unsafe { walk(job, range) }
}
