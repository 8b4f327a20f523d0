//! The WNA16 (weight-only int4/int8, f32 compute) body of the aarch64 rungs. It needs NEON
//! only, the aarch64 baseline, so all three rungs register it: the dot-product and
//! matrix-multiply extensions have nothing for f32 products.
//!
//! Tiles of up to [`MR`] rows × 16 channels, four 4-lane vectors per row.
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

/// Rows per tile: 16 partial sums, 16 accumulators (kept in registers or spilled once per
/// group), the four decoded weight vectors and the rows' activations.
const MR: usize = 4;

/// Vectors per row of 16 channels.
const V: usize = PANEL / 4;

/// 16 channels of one row, lane `i` of vector `q` being channel `4q + i`.
type Lanes = [float32x4_t; V];

/// Loads 16 f32.
#[target_feature(enable = "neon")]
#[inline]
fn load_lanes(v: &[f32; PANEL]) -> Lanes {
    // SAFETY: lanes `4q..4q + 4` of the 16 are readable; `ld1` has no alignment requirement.
    std::array::from_fn(|q| unsafe { vld1q_f32(v[4 * q..].as_ptr()) })
}

/// Stores 16 f32.
#[target_feature(enable = "neon")]
#[inline]
fn store_lanes(dst: &mut [f32; PANEL], v: Lanes) {
    for q in 0..V {
        // SAFETY: lanes `4q..4q + 4` of the 16 are writable; `st1` has no alignment requirement.
        unsafe { vst1q_f32(dst[4 * q..].as_mut_ptr(), v[q]) };
    }
}

/// Loads four f32.
#[target_feature(enable = "neon")]
#[inline]
fn load4(v: &[f32; 4]) -> float32x4_t {
    // SAFETY: the reference covers four readable f32; `ld1` has no alignment requirement.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// One int4 step's 16 code words, XORed so each nibble is the two's complement of `c − 8`.
#[target_feature(enable = "neon")]
#[inline]
fn load_step4(step: &[u32; PANEL]) -> [int32x4_t; V] {
    let flip = vdupq_n_u32(0x8888_8888);
    std::array::from_fn(|q| {
        // SAFETY: words `4q..4q + 4` of the step are readable; `ld1` has no alignment
        // requirement.
        let words = unsafe { vld1q_u32(step[4 * q..].as_ptr()) };
        vreinterpretq_s32_u32(veorq_u32(words, flip))
    })
}

/// Decodes K value `J` (nibble `J`, brought to the top by a left shift of `SHL = 28 − 4J`) of
/// a flipped int4 step: `c − 8`, less `zadj` when asymmetric.
#[target_feature(enable = "neon")]
#[inline]
fn decode4<const SHL: i32, const ASYM: bool>(v: &[int32x4_t; V], zadj: &Lanes) -> Lanes {
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(vshrq_n_s32::<28>(vshlq_n_s32::<SHL>(v[q])));
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// [`decode4`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "neon")]
#[inline]
fn decode4_at<const ASYM: bool>(v: &[int32x4_t; V], j: usize, zadj: &Lanes) -> Lanes {
    let shl = vdupq_n_s32(28 - 4 * j as i32);
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(vshrq_n_s32::<28>(vshlq_s32(v[q], shl)));
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// Decodes K value `j` of an int8 step (16 consecutive channel bytes): `c − 128`, less `zadj`
/// when asymmetric.
#[target_feature(enable = "neon")]
#[inline]
fn decode8<const ASYM: bool>(step: &[u32; PANEL], j: usize, zadj: &Lanes) -> Lanes {
    let words: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    let bytes = unsafe { vld1q_u8(words.as_ptr().cast()) };
    let signed = vreinterpretq_s8_u8(veorq_u8(bytes, vdupq_n_u8(0x80)));
    let (lo, hi) = (vmovl_s8(vget_low_s8(signed)), vmovl_high_s8(signed));
    let ints = [
        vmovl_s16(vget_low_s16(lo)),
        vmovl_high_s16(lo),
        vmovl_s16(vget_low_s16(hi)),
        vmovl_high_s16(hi),
    ];
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(ints[q]);
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// `part += w · x[L]` over the 16 channels.
#[target_feature(enable = "neon")]
#[inline]
fn fma_lane<const L: i32>(part: &mut Lanes, w: &Lanes, x: float32x4_t) {
    for q in 0..V {
        part[q] = vfmaq_laneq_f32::<L>(part[q], w[q], x);
    }
}

/// `part += w · x` over the 16 channels.
#[target_feature(enable = "neon")]
#[inline]
fn fma_dup(part: &mut Lanes, w: &Lanes, x: f32) {
    for q in 0..V {
        part[q] = vfmaq_n_f32(part[q], w[q], x);
    }
}

/// Computes rows `m0..m0 + R` of panel `p` with `C` partial sums per vector.
///
/// # Safety
/// - The job's output pointer is valid and exclusively ours for rows `m0..m0 + R` of panel
///   `p`; `m0 + R ≤ job.m`, `job.x` holds `m·K` values, and the codes are integers of `BITS`
///   bits (zero points present exactly when `ASYM`).
#[target_feature(enable = "neon")]
unsafe fn tile<const BITS: u32, const R: usize, const C: usize, const ASYM: bool>(
    job: &Wna16Job<'_>,
    p: usize,
    m0: usize,
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
        let zadj: Lanes = if ASYM {
            let z = w.group_zeros(p, g);
            load_lanes(&std::array::from_fn(|c| z[c] - symmetric_zero))
        } else {
            [vdupq_n_f32(0.0); V]
        };
        let mut part = [[[vdupq_n_f32(0.0); V]; R]; C];
        if BITS == 4 {
            // Group sizes are multiples of K_STEP, so `k0` starts a step.
            let (s0, s_full) = (k0 / K_STEP, k1 / K_STEP);
            for s in s0..s_full {
                let v = load_step4(&steps[s]);
                // Each row's four activations of one half of the step, loaded when that half
                // starts, so the two halves do not hold eight registers at once.
                let half = |h: usize| -> [float32x4_t; R] {
                    std::array::from_fn(|r| {
                        load4(rows[r][s * K_STEP + 4 * h..][..4].try_into().unwrap())
                    })
                };
                macro_rules! k_value {
                    ($xs:ident, $j:literal, $lane:literal) => {{
                        let wj = decode4::<{ 28 - 4 * $j }, ASYM>(&v, &zadj);
                        for r in 0..R {
                            fma_lane::<$lane>(&mut part[$j % C][r], &wj, $xs[r]);
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
                let v = load_step4(&steps[s_full]);
                for kk in s_full * K_STEP..k1 {
                    let wj = decode4_at::<ASYM>(&v, kk % K_STEP, &zadj);
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
                let xs: [float32x4_t; R] = std::array::from_fn(|r| {
                    load4(rows[r][s * K_STEP8..][..K_STEP8].try_into().unwrap())
                });
                macro_rules! k_value {
                    ($j:literal) => {{
                        let wj = decode8::<ASYM>(step, $j, &zadj);
                        for r in 0..R {
                            fma_lane::<$j>(&mut part[$j % C][r], &wj, xs[r]);
                        }
                    }};
                }
                k_value!(0);
                k_value!(1);
                k_value!(2);
                k_value!(3);
            }
            for kk in s_full * K_STEP8..k1 {
                let wj = decode8::<ASYM>(&steps[s_full], kk % K_STEP8, &zadj);
                for r in 0..R {
                    fma_dup(&mut part[0][r], &wj, rows[r][kk]);
                }
            }
        }
        let s = load_lanes(&w.group_scales(p, g));
        for r in 0..R {
            let mut row = load_lanes(&acc[r]);
            for q in 0..V {
                let mut sum = part[0][r][q];
                for chain in &part[1..] {
                    sum = vaddq_f32(sum, chain[r][q]);
                }
                row[q] = vfmaq_f32(row[q], sum, s[q]);
            }
            store_lanes(&mut acc[r], row);
        }
        // Keeps the accumulators in memory (see above) rather than promoted to registers.
        std::hint::black_box(&mut acc);
    }
    let acc: [Lanes; R] = std::array::from_fn(|r| load_lanes(&acc[r]));
    // SAFETY: forwarded from our contract (rows `m0..m0 + R` of panel `p` are ours).
    unsafe { store_panel_rows(w, job.out, p, m0, acc) };
}

/// Adds the bias (if any) to the sums of rows `m0..m0 + R` of panel `p` and stores their
/// valid channels into `out` (`m·N`, row-major).
///
/// # Safety
/// - `out` is valid for writes of rows `m0..m0 + R` in panel `p`'s channels, which no other
///   thread writes meanwhile.
#[target_feature(enable = "neon")]
unsafe fn store_panel_rows<const R: usize>(
    w: &PackedWna16,
    out: *mut f32,
    p: usize,
    m0: usize,
    mut acc: [Lanes; R],
) {
    if let Some(b) = w.panel_bias(p) {
        let b = load_lanes(b.try_into().expect("16 biases"));
        for r in 0..R {
            for q in 0..V {
                acc[r][q] = vaddq_f32(acc[r][q], b[q]);
            }
        }
    }
    let valid = PANEL.min(w.n() - p * PANEL);
    for r in 0..R {
        let mut row = [0f32; PANEL];
        store_lanes(&mut row, acc[r]);
        let dst = out.wrapping_add((m0 + r) * w.n() + p * PANEL);
        // SAFETY: channels `16p..16p + valid` (< N) of row `m0 + r` are elements of the
        // caller's output owned by this panel alone (our contract); the local row does not
        // overlap them.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst, valid) };
    }
}

/// One row-count instance of [`tile`].
type TileFn = unsafe fn(&Wna16Job<'_>, usize, usize);

/// Walks the row tiles of `panels`.
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
                1 => tile::<BITS, 1, 2, ASYM>,
                2 => tile::<BITS, 2, 2, ASYM>,
                3 => tile::<BITS, 3, 1, ASYM>,
                _ => tile::<BITS, MR, 1, ASYM>,
            };
            // SAFETY: rows `m0..m0 + mr` lie within `0..m`, panel `p` is ours (caller), and
            // the codes are what the instance expects (caller).
            unsafe { tile_fn(job, p, m0) };
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
