//! The WNA16 body for int4 integer codes on the dot-product rungs (`sdot`), with each row of
//! activations quantized to 15-bit integers once per GEMM (the numerics of
//! [`crate::wna16_i15`], which this body equals bit for bit, as the x86 integer bodies do).
//!
//! The NEON f32 body spends a shift pair, a conversion and an `fmla` per four codes; here one
//! packed int4 step (8 K values of the panel's 16 channels, one channel per 32-bit lane,
//! nibble `j` = K value `8s + j`) becomes `sdot` operands in two instructions per 16 bytes: an
//! AND with `0x0F` per byte leaves the even K values of each channel (`8s + 0, 2, 4, 6`) as the
//! lane's four bytes, a shift right by 4 per byte the odd ones. The codes stay unsigned
//! (0..=15), which `sdot` reads as non-negative signed bytes. The activations come in the
//! byte-split layout of [`crate::wna16_i15::fill_byte_split`] (the one the AVX-512 VNNI body
//! uses): per step the high bytes of the even K values, of the odd ones, then the low bytes of
//! both, four bytes each, one 16-byte load per row and step, each group picked by `sdot`'s
//! lane index, so no broadcast is needed. Four `sdot` per channel vector and row do the step's
//! products into two exact integer sums (`Σc·hi`, `Σc·lo`).
//!
//! int8 integer codes (8-bit GPTQ, compressed-tensors W8A16) are packed K-major, four K values
//! per step, each the 16 channels' bytes, so an activation step's 8 K values are two int8
//! steps. Each 64-byte step is a four-register table: one `tbl` per four channels gathers their
//! even K values (`8s + 0, 2`) from the first step, one `tbx` adds `8s + 4, 6` from the second,
//! likewise for the odd ones, so the codes meet the same activation bytes and lanes as int4
//! codes do. `sdot` reads signed bytes, so the codes become `c − 128` (an XOR with `0x80`) and
//! the block's `128·Σq` (from the fill's exact block sums) is added back to the high sum before
//! it is shifted: the block sum is the exact `Σc·q` again, as the reference has it (blocks of
//! at most [`crate::wna16_i15::MAX_BLOCK_INT8`] K values keep it within 32 bits).
//!
//! MXFP4's e2m1 codes take the same path as the integers `2·e2m1 + 12`
//! ([`crate::wna16_i15::E2M1_INTEGERS`], against the zero point 12 with the e8m0 scales
//! halved): one `tbl` per 16 bytes turns the split nibbles into those integers (`0..=24`, still
//! non-negative signed bytes).
//!
//! Tiles cover a window of 8 channels (two vectors) of up to [`MR`] rows: 4 rows × 2 vectors ×
//! 2 sums, the window's 4 decoded code vectors and the rows' activation vectors fit the 32
//! registers; a single row keeps two chains per sum so that `sdot`'s latency does not bound
//! it. At the end of each block (a scale group, or [`crate::wna16_i15::MAX_BLOCK`] K values
//! of a longer one) the sums become `128·Σc·hi + Σc·lo` (exact), convert to f32 (`scvtf`),
//! lose `z · Σq` in one fused multiply-subtract and are scaled into the row's accumulator with
//! one fused multiply-add; the row's scale, post factor and the bias come last. Rows run in
//! blocks of [`ROW_BLOCK`] over all of the call's panels.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::ops::Range;

use super::asm::sdot_lane;
use super::common::load_f32x4;
use super::wna16::scale_lanes;
use crate::dispatch::Int4Dot;
use crate::packed::PANEL;
use crate::wna16::{Int4DotJob, Int4DotTileFn, run_row_blocks};
use crate::wna16_i15::{
    Blocks, E2M1_INTEGERS, E2M1_ZERO, SPLIT_STEP_BYTES, fill_byte_split, integer_body, layout_rows,
    panel_steps, read_header,
};
use crate::wna16_tile::{E2M1, INTEGER, code_kind, store_rows};

/// This body's kind for int8 integer codes, beside the scaffolding's int4 kinds [`INTEGER`]
/// and [`E2M1`] (8-bit e4m3 codes never come here).
const INT8: u8 = 3;

/// `tbl` indices of one int8 step for the four channels at offset 0 of a window vector: byte
/// `4i + t` of the result is channel `i`'s K value `2t + odd` when it lies in this step (`t` =
/// 0, 1 in the first step, 2, 3 in the second); `0x80` elsewhere, out of the table's range
/// (also once the vector's channel offset, at most 12, is added), so `tbl` writes a zero and
/// `tbx` keeps what is there.
const INT8_INDICES: [[[u8; 16]; 2]; 2] = {
    let mut t = [[[0x80u8; 16]; 2]; 2];
    let mut half = 0;
    while half < 2 {
        let mut odd = 0;
        while odd < 2 {
            let mut i = 0;
            while i < 4 {
                let mut j = 0;
                while j < 2 {
                    // Row `2j + odd` of the step holds this K value, channel `i` of the four.
                    t[half][odd][4 * i + 2 * half + j] = ((2 * j + odd) * 16 + i) as u8;
                    j += 1;
                }
                i += 1;
            }
            odd += 1;
        }
        half += 1;
    }
    t
};

/// Channels of one window of a panel.
const WINDOW: usize = 8;

/// Vectors of four channels per window.
const NQ: usize = WINDOW / 4;

/// Rows per tile.
const MR: usize = 4;

/// Rows that run over all of a call's panels before the next rows start.
const ROW_BLOCK: usize = 64;

/// The exact integer sums of one row over a window: per vector, `Σc·hi` and `Σc·lo`.
type Sums = [[int32x4_t; NQ]; 2];

/// Loads the window at channel `first` of one int4 step and splits its nibbles: the even K
/// values (low nibbles) and the odd ones (high nibbles) of each vector's four channels, as
/// their e2m1 integers when `KIND` is [`E2M1`].
#[target_feature(enable = "neon")]
#[inline]
fn even_odd<const KIND: u8>(step: &[u32; PANEL], first: usize) -> [[int8x16_t; NQ]; 2] {
    let words = &step[first..first + WINDOW];
    let low = vdupq_n_u8(0x0F);
    let v: [uint8x16_t; NQ] = std::array::from_fn(|q| {
        // SAFETY: words `4q..4q + 4` of the window are 16 readable bytes; `ld1` has no
        // alignment requirement.
        unsafe { vld1q_u8(words[4 * q..].as_ptr().cast()) }
    });
    let integers = |nibbles: uint8x16_t| {
        if KIND == E2M1 {
            // SAFETY: the table is 16 readable bytes; `ld1` has no alignment requirement.
            let table = unsafe { vld1q_u8(E2M1_INTEGERS.as_ptr()) };
            vreinterpretq_s8_u8(vqtbl1q_u8(table, nibbles))
        } else {
            vreinterpretq_s8_u8(nibbles)
        }
    };
    [
        v.map(|v| integers(vandq_u8(v, low))),
        v.map(|v| integers(vshrq_n_u8::<4>(v))),
    ]
}

/// The even and odd K values of an activation step's two int8 steps (`second` absent past the
/// end of K, where the activations are zeros) for the window at channel `first`, as the signed
/// bytes `c − 128`, laid out as [`even_odd`] lays out int4 codes.
#[target_feature(enable = "neon")]
#[inline]
fn int8_even_odd(
    first_step: &[u32; PANEL],
    second: Option<&[u32; PANEL]>,
    first: usize,
) -> [[int8x16_t; NQ]; 2] {
    let table = |step: &[u32; PANEL]| {
        // SAFETY: a step is 64 readable bytes; `ld1` has no alignment requirement.
        unsafe { vld1q_u8_x4(step.as_ptr().cast()) }
    };
    let a = table(first_step);
    let b = second.map(table);
    let bias = vdupq_n_u8(0x80);
    std::array::from_fn(|odd| {
        std::array::from_fn(|q| {
            let at = vdupq_n_u8((first + 4 * q) as u8);
            // SAFETY: the index tables are 16 readable bytes each; `ld1` has no alignment
            // requirement.
            let [in_first, in_second] =
                INT8_INDICES.map(|t| vaddq_u8(unsafe { vld1q_u8(t[odd].as_ptr()) }, at));
            let mut codes = vqtbl4q_u8(a, in_first);
            if let Some(b) = b {
                codes = vqtbx4q_u8(codes, b, in_second);
            }
            vreinterpretq_s8_u8(veorq_u8(codes, bias))
        })
    })
}

/// Loads one step of a row's activations (the four 4-byte groups of the byte-split layout).
#[target_feature(enable = "neon")]
#[inline]
fn load_acts(step: &[u8; SPLIT_STEP_BYTES]) -> int8x16_t {
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_s8(step.as_ptr().cast()) }
}

/// Rows `m0..m0 + R` of the window at channel `first` of panel `p`, `C` chains per sum, for
/// int4 integer codes, e2m1 ones (`KIND` [`E2M1`]) or int8 integer codes ([`INT8`]).
///
/// # Safety
/// - The CPU has the dot-product extension; the job satisfies
///   [`crate::wna16::Int4DotPanelsFn`]'s contract for panel `p` with
///   [`fill_byte_split`]'s layout, its codes are of kind `KIND`, and `m0 + R ≤ job.m`.
// Kept out of line: one function per instance, which `cargo xtask arm-cost` finds by name.
#[target_feature(enable = "neon,dotprod")]
#[inline(never)]
unsafe fn window<const R: usize, const C: usize, const KIND: u8, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
    first: usize,
) {
    let w = job.w;
    let ng = w.n_groups();
    let blocks = Blocks::of(w);
    let nb = blocks.count(ng);
    let codes = panel_steps(w, p);
    let (rows, acts) = layout_rows::<R>(job, m0);
    let mut acc = [[vdupq_n_f32(0.0); NQ]; R];
    for g in 0..ng {
        let mut scale: [float32x4_t; NQ] = scale_lanes(w.scales(), (p * ng + g) * PANEL + first);
        let zero: [float32x4_t; NQ] = if ASYM {
            let z = w.group_zeros(p, g);
            std::array::from_fn(|q| load_f32x4(&z[first + 4 * q..]))
        } else if KIND == E2M1 {
            // Halved, a power of two: exact.
            scale = scale.map(|s| vmulq_n_f32(s, 0.5));
            [vdupq_n_f32(f32::from(E2M1_ZERO)); NQ]
        } else {
            [vdupq_n_f32(f32::from(w.symmetric_zero())); NQ]
        };
        for i in 0..blocks.per_group {
            let steps = blocks.steps(g, i);
            if steps.is_empty() {
                continue;
            }
            let mut sums: [[Sums; R]; C] = [[[[vdupq_n_s32(0); NQ]; 2]; R]; C];
            for s in steps {
                let [even, odd] = if KIND == INT8 {
                    int8_even_odd(&codes[2 * s], codes.get(2 * s + 1), first)
                } else {
                    even_odd::<KIND>(&codes[s], first)
                };
                for r in 0..R {
                    let a = load_acts(&acts[r][s]);
                    for q in 0..NQ {
                        let [hi, lo] = &mut sums[0][r];
                        hi[q] = sdot_lane::<0>(hi[q], even[q], a);
                        lo[q] = sdot_lane::<2>(lo[q], even[q], a);
                        let [hi, lo] = &mut sums[C - 1][r];
                        hi[q] = sdot_lane::<1>(hi[q], odd[q], a);
                        lo[q] = sdot_lane::<3>(lo[q], odd[q], a);
                    }
                }
            }
            let b = g * blocks.per_group + i;
            for r in 0..R {
                let block_sum = job.group_sums[(m0 + r) * nb + b];
                let xsum = vdupq_n_f32(block_sum);
                // int8 codes were summed as `c − 128`: `Σq` (an exact integer, see
                // `fill_byte_split`) added to the high sum restores `128·Σq`.
                let lift = vdupq_n_s32(if KIND == INT8 { block_sum as i32 } else { 0 });
                for q in 0..NQ {
                    let (mut h, mut l) = (vaddq_s32(sums[0][r][0][q], lift), sums[0][r][1][q]);
                    for c in 1..C {
                        h = vaddq_s32(h, sums[c][r][0][q]);
                        l = vaddq_s32(l, sums[c][r][1][q]);
                    }
                    let d = vaddq_s32(vshlq_n_s32::<7>(h), l);
                    let t = vfmsq_f32(vcvtq_f32_s32(d), zero[q], xsum);
                    acc[r][q] = vfmaq_f32(acc[r][q], t, scale[q]);
                }
            }
        }
    }
    let mut out = [[0f32; WINDOW]; R];
    for r in 0..R {
        let (scale, post) = read_header(rows[r]);
        for q in 0..NQ {
            let y = vmulq_n_f32(vmulq_n_f32(acc[r][q], scale), post);
            // SAFETY: lanes `4q..4q + 4` of the row are writable; `st1` has no alignment
            // requirement.
            unsafe { vst1q_f32(out[r][4 * q..].as_mut_ptr(), y) };
        }
    }
    // SAFETY: rows `m0..m0 + R` of panel `p` are ours to write (our contract), and the window
    // lies within the panel.
    unsafe { store_rows(w, job.out, p, m0, first, &mut out) };
}

/// Rows `m0..m0 + R` of panel `p`, one window of channels after the other.
///
/// # Safety
/// - As [`window`], for both windows of panel `p`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile<const R: usize, const C: usize, const KIND: u8, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
) {
    for first in (0..PANEL).step_by(WINDOW) {
        // SAFETY: forwarded from our contract; `first` starts a window of the panel.
        unsafe { window::<R, C, KIND, ASYM>(job, p, m0, first) };
    }
}

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]) and codes of kind `KIND`.
fn tile_fn<const KIND: u8, const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile::<1, 2, KIND, ASYM>,
        2 => tile::<2, 1, KIND, ASYM>,
        3 => tile::<3, 1, KIND, ASYM>,
        _ => tile::<MR, 1, KIND, ASYM>,
    }
}

/// The entry (see [`crate::wna16::Int4DotPanelsFn`]): rows in blocks of [`ROW_BLOCK`], each
/// block over `panels`, each panel in row tiles of up to [`MR`].
///
/// # Safety
/// - As [`crate::wna16::Int4DotPanelsFn`], on a CPU with the dot-product extension,
///   `job.pairs` and `job.group_sums` made by [`fill_byte_split`].
unsafe fn entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    let tiles: [fn(usize) -> Int4DotTileFn; 2] = if job.w.bits() == 8 {
        [tile_fn::<INT8, false>, tile_fn::<INT8, true>]
    } else if code_kind(job.w) == E2M1 {
        // MXFP4 has no zero points.
        [tile_fn::<E2M1, false>; 2]
    } else {
        [tile_fn::<INTEGER, false>, tile_fn::<INTEGER, true>]
    };
    // SAFETY: every instance is a tile of this module, which needs the features and the
    // layout the caller vouches for, and each walked panel is one of the caller's.
    unsafe { run_row_blocks(job, panels, ROW_BLOCK, MR, tiles) };
}

/// This body as a kernel set's int4 dot-product body at every row count, for int4 integer,
/// e2m1 and int8 integer codes. Only for sets of a rung with the dot-product extension.
pub(crate) fn body() -> Int4Dot {
    let unit = "dotprod sdot on codes decoded in registers";
    integer_body(unit, fill_byte_split, entry, (1, usize::MAX), (true, true))
}

/// The dot-product rung's set with this body, where the CPU has the extension (tests).
#[cfg(test)]
pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
    let ks = super::kernel_set(crate::Isa::NeonDot)?;
    ks.wna16_int4_dot_for(&crate::PackedWna16::int4_for_layout(8, 8, false), 1)
        .map(|_| ks)
}
