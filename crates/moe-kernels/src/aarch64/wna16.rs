//! The WNA16 (weight-only int4/int8, f32 compute) body of the aarch64 rungs. It needs NEON
//! only, the aarch64 baseline, so all three rungs register it: the dot-product and
//! matrix-multiply extensions have nothing for f32 products. It runs on the tile scaffolding
//! of `crate::wna16_tile`; this file keeps the decodes.
//!
//! Tiles of 1 to 8 rows cover a panel in two windows of 8 channels (two 4-lane vectors per
//! row), so a tile of 8 rows keeps its 16 partial sums in registers and each decoded weight
//! vector serves all of its rows.
//! - int4: one packed step holds 8 K values of the panel's 16 channels, one channel per
//!   32-bit lane (nibble `j` is K value `8s + j`). An XOR with `0x8888_8888` turns every code
//!   `c` into the 4-bit two's complement of `c − 8`, so K value `j` is a shift left that brings
//!   its nibble to the top of the lane, an arithmetic shift right by 28 and a conversion
//!   (`scvtf`): exactly `c − 8`.
//! - e2m1 (MXFP4, int4 codes in the same layout): the step is de-interleaved by bytes (two
//!   rounds of unzips for a window of 8 channels; a four-way load, `ld4`, for 16), so the
//!   codes of K value `j` are a nibble of consecutive channel bytes. Masked or shifted to it,
//!   they index two tables (`tbl`) holding the two high bytes of each value's f32 bits (every
//!   e2m1 value is a bf16 value); zipped byte by byte (`zip1`/`zip2`) they are bf16s, which
//!   widen into the top halves of f32 lanes (`shll`) exactly. Nine instructions per K value of
//!   16 channels and a share of the load, against twelve for int4, and no conversion: `scvtf`
//!   takes one vector pipe for two cycles on the Neoverse N2 model, while lookups and zips
//!   issue on both pipes.
//! - int8: K value `j` of a step is 16 consecutive channel bytes. An XOR with `0x80` turns
//!   each code into the i8 `c − 128`, which two widenings and a conversion make exact f32s.
//! - e4m3 (FP8, 8-bit codes in the same layout): each byte sign-extended to 16 bits and
//!   shifted left by 4 (`sshll`) holds its seven magnitude bits at bits 4..10 and copies of
//!   its sign at 11..15; clearing bits 11..14 (`bic`) and widening into the top half of a
//!   32-bit lane (`shll`) leaves the sign at bit 31 and the magnitude at bits 20..26, the
//!   f32 that is the e4m3 value times `2^-120` (see [`e4m3_value`]; subnormal codes give f32
//!   subnormals, which aarch64 does not flush), and one exact multiply by `2^120` follows:
//!   twelve instructions per K value of 16 channels, against eleven for int8, again without
//!   `scvtf`. The multiply stays in the decode: folded into the f32 block scales it could
//!   overflow them.
//!
//! Asymmetric weights then subtract `z − 8` (or `z − 128`) per group, which leaves the exact
//! `c − z`. Each row multiplies the decoded weights by its activation with `fmla` by element
//! (the activations are read four K values at a time) into per-group partial sums; tiles of one
//! to three rows keep two or four partial sums per vector so the FMA latency does not bound
//! them. At the end of a group the partial sums are scaled into the row's
//! accumulator with one more `fmla` (e8m0 scales widened exactly to f32, as every body does).
//! Weights are decoded once per K value for all rows.
//!
//! Numerics: as in the AVX-512 body, every multiply-add is fused, so outputs differ from the
//! reference (`crate::wna16`) by a few units in the last place of the magnitudes summed; the
//! tests bound the difference by `1e-5·Σ|x·w|`. Every decode above is exact.
//!
//! [`e4m3_value`]: crate::packed::wna16::e4m3_value

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use crate::packed::wna16::{E2M1_VALUES, Wna16ScaleValues};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16_tile::{E2M1, E4M3};

use super::asm::f16x4_to_f32;
use super::common::load_f32x4;

/// Vectors per row of a panel's 16 channels.
const V: usize = PANEL / 4;

/// Byte `B` (2 or 3, little-endian) of the f32 bits of each e2m1 value: every value is a
/// bf16 (at most two significant bits), so bytes 2 and 3 are all its bits.
const fn e2m1_f32_byte<const B: u32>() -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut c = 0;
    while c < 16 {
        let bits = E2M1_VALUES[c].to_bits();
        assert!(bits & 0xFFFF == 0, "e2m1 values are bf16 values");
        t[c] = (bits >> (8 * B)) as u8;
        c += 1;
    }
    t
}

/// Bits 16..24 of the f32 of each e2m1 code.
const E2M1_LOW: [u8; 16] = e2m1_f32_byte::<2>();

/// Bits 24..32 of the f32 of each e2m1 code.
const E2M1_HIGH: [u8; 16] = e2m1_f32_byte::<3>();

/// `2^120`, the factor between an e4m3 value and the f32 its bits make (see [`decode_e4m3`]).
const E4M3_RESCALE: f32 = f32::from_bits((127 + 120) << 23);

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

/// Channels `4q0..4(q0 + NQ)` of one e2m1 step, de-interleaved so that each byte of the
/// channels' words (K values `2b` and `2b + 1` in byte `b`, the low and high nibble) is
/// consecutive, for [`decode_e2m1`].
/// - `NQ` = 4: vector `b` holds byte `b` of the 16 channels (a four-way load, `ld4`).
/// - `NQ` = 2: vector `h` holds byte `2h` of the 8 channels in its low half and byte `2h + 1`
///   in its high half (two rounds of unzips, `uzp1`/`uzp2`, which keep two registers live
///   where the 64-bit halves of a four-way load would keep four).
#[target_feature(enable = "neon")]
#[inline]
fn load_e2m1<const NQ: usize>(step: &[u32; PANEL], q0: usize) -> [uint8x16_t; NQ] {
    if NQ == V {
        // SAFETY: the step is 64 readable bytes; `ld4` has no alignment requirement.
        let b = unsafe { vld4q_u8(step.as_ptr().cast()) };
        let all = [b.0, b.1, b.2, b.3];
        std::array::from_fn(|q| all[q])
    } else {
        let words = &step[4 * q0..4 * q0 + 8];
        let [a, b]: [uint8x16_t; 2] = std::array::from_fn(|h| {
            // SAFETY: words `4h..4h + 4` of the slice are readable; `ld1` has no alignment
            // requirement.
            unsafe { vld1q_u8(words[4 * h..].as_ptr().cast()) }
        });
        // Bytes 0 and 2, then 1 and 3, of the channels; then bytes 0 and 1, then 2 and 3.
        let (even, odd) = (vuzp1q_u8(a, b), vuzp2q_u8(a, b));
        let both = [vuzp1q_u8(even, odd), vuzp2q_u8(even, odd)];
        std::array::from_fn(|q| both[q])
    }
}

/// Decodes K value `J` (nibble `J`, brought to the top by a left shift of `SHL = 28 − 4J`) of
/// a flipped int4 step: `c − 8`, less `zadj` when asymmetric.
#[target_feature(enable = "neon")]
#[inline]
fn decode_int4<const SHL: i32, const ASYM: bool, const NQ: usize>(
    v: &[int32x4_t; NQ],
    zadj: &Lanes<NQ>,
) -> Lanes<NQ> {
    std::array::from_fn(|q| {
        let w = vcvtq_f32_s32(vshrq_n_s32::<28>(vshlq_n_s32::<SHL>(v[q])));
        if ASYM { vsubq_f32(w, zadj[q]) } else { w }
    })
}

/// [`decode_int4`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "neon")]
#[inline]
fn decode_int4_at<const ASYM: bool, const NQ: usize>(
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

/// Decodes K value `j` of an e2m1 step loaded by [`load_e2m1`]. The codes of the pass's
/// channels, masked to the low nibble (`j` even) or shifted down from the high one, index two
/// tables (`tbl`) holding the two high bytes of each value's f32 bits; zipped byte by byte
/// they are bf16s, which widen into the top halves of the f32 lanes (`shll`) exactly. `j` is a
/// constant where the tile inlines this, so the selections fold away.
#[target_feature(enable = "neon")]
#[inline]
fn decode_e2m1<const NQ: usize>(bytes: &[uint8x16_t; NQ], j: usize) -> Lanes<NQ> {
    // SAFETY: the table is 16 readable bytes; `ld1` has no alignment requirement.
    let low = unsafe { vld1q_u8(E2M1_LOW.as_ptr()) };
    // SAFETY: as above.
    let high = unsafe { vld1q_u8(E2M1_HIGH.as_ptr()) };
    let b = bytes[if NQ == V { j / 2 } else { j / 4 }];
    let codes = if j.is_multiple_of(2) {
        vandq_u8(b, vdupq_n_u8(0x0F))
    } else {
        vshrq_n_u8::<4>(b)
    };
    let (lo, hi) = (vqtbl1q_u8(low, codes), vqtbl1q_u8(high, codes));
    let widen = |bf16: uint8x16_t| {
        let bf16 = vreinterpretq_u16_u8(bf16);
        [
            vshll_n_u16::<16>(vget_low_u16(bf16)),
            vshll_high_n_u16::<16>(bf16),
        ]
    };
    let bits: [uint32x4_t; NQ] = if NQ == V {
        let ([a, b], [c, d]) = (widen(vzip1q_u8(lo, hi)), widen(vzip2q_u8(lo, hi)));
        let all = [a, b, c, d];
        std::array::from_fn(|q| all[q])
    } else {
        // Byte `j / 2` is the low half of its vector when it is even.
        let both = widen(if (j / 2).is_multiple_of(2) {
            vzip1q_u8(lo, hi)
        } else {
            vzip2q_u8(lo, hi)
        });
        std::array::from_fn(|q| both[q])
    };
    std::array::from_fn(|q| vreinterpretq_f32_u32(bits[q]))
}

/// Decodes channels `4q0..4(q0 + NQ)` of K value `j` of an e4m3 step (16 consecutive channel
/// bytes, sign bit 7 and seven magnitude bits; `NQ` is 4 with `q0` = 0, or 2). Sign-extended
/// to 16 bits and shifted left by 4 (`sshll`), a byte holds its magnitude at bits 4..10 and
/// copies of its sign at bits 11..15; with bits 11..14 cleared (`bic`) and the lane widened
/// into the top half of 32 bits (`shll`), the sign is at bit 31 and the magnitude at bits
/// 20..26: the f32 that is the e4m3 value times `2^-120`, subnormal codes included, as
/// [`e4m3_value`] places it. The multiply by `2^120` is exact.
///
/// [`e4m3_value`]: crate::packed::wna16::e4m3_value
#[target_feature(enable = "neon")]
#[inline]
fn decode_e4m3<const NQ: usize>(step: &[u32; PANEL], j: usize, q0: usize) -> Lanes<NQ> {
    let words: &[u32; 4] = step[4 * j..4 * j + 4].try_into().expect("16 bytes");
    let sign_copies = vdupq_n_s16(0x7800);
    let clear = |wide: int16x8_t| vreinterpretq_u16_s16(vbicq_s16(wide, sign_copies));
    let widen = |wide: uint16x8_t| {
        [
            vshll_n_u16::<16>(vget_low_u16(wide)),
            vshll_high_n_u16::<16>(wide),
        ]
    };
    let bits: [uint32x4_t; NQ] = if NQ == V {
        // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
        let bytes = unsafe { vld1q_s8(words.as_ptr().cast()) };
        let [a, b] = widen(clear(vshll_n_s8::<4>(vget_low_s8(bytes))));
        let [c, d] = widen(clear(vshll_high_n_s8::<4>(bytes)));
        let all = [a, b, c, d];
        std::array::from_fn(|q| all[q])
    } else {
        let half: &[u32; 2] = words[q0..q0 + 2].try_into().expect("8 bytes");
        // SAFETY: the reference covers 8 readable bytes; `ld1` has no alignment requirement.
        let bytes = unsafe { vld1_s8(half.as_ptr().cast()) };
        let both = widen(clear(vshll_n_s8::<4>(bytes)));
        std::array::from_fn(|q| both[q])
    };
    std::array::from_fn(|q| vmulq_n_f32(vreinterpretq_f32_u32(bits[q]), E4M3_RESCALE))
}

/// Decodes channels `4q0..4(q0 + NQ)` of K value `j` of an int8 step (16 consecutive channel
/// bytes): `c − 128`, less `zadj` when asymmetric. `NQ` is 4 (`q0` = 0) or 2.
#[target_feature(enable = "neon")]
#[inline]
fn decode_int8<const ASYM: bool, const NQ: usize>(
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

/// The tile scaffolding's view of this body (`crate::wna16_tile`): windows of 8 channels, two
/// 4-lane vectors per row, so that a tile of 8 rows keeps its 16 partial sums in registers and
/// each decoded weight vector serves all of its rows.
const LANES: usize = 8;

/// Vectors per row of a window.
const NQ: usize = LANES / 4;

/// A window's channels of f32.
type Ch = Lanes<NQ>;

/// A loaded int4 step's window: the flipped words of integer codes, or the byte planes of
/// e2m1 codes (the other stays zero).
#[derive(Clone, Copy)]
struct Step {
    ints: [int32x4_t; NQ],
    e2m1: [uint8x16_t; NQ],
}

/// What decoding one group of a window needs.
struct GroupConsts {
    /// `z − 8` (or `z − 128`) per channel: what is left to subtract from the decoded `c − 8`
    /// of asymmetric codes.
    zadj: Ch,
}

/// The decoding constants of group `g` of panel `p`'s window at channel `first`.
#[target_feature(enable = "neon")]
#[inline]
fn group_consts<const KIND: u8, const ASYM: bool>(
    w: &PackedWna16,
    p: usize,
    g: usize,
    first: usize,
) -> GroupConsts {
    let zadj = if ASYM {
        let z = w.group_zeros(p, g);
        let symmetric_zero = f32::from(w.symmetric_zero());
        load_lanes(&std::array::from_fn(|c| z[c] - symmetric_zero), first / 4)
    } else {
        zero()
    };
    GroupConsts { zadj }
}

/// All zeros.
#[target_feature(enable = "neon")]
#[inline]
fn zero() -> Ch {
    [vdupq_n_f32(0.0); NQ]
}

/// `a + b`.
#[target_feature(enable = "neon")]
#[inline]
fn add(a: Ch, b: Ch) -> Ch {
    std::array::from_fn(|q| vaddq_f32(a[q], b[q]))
}

/// `part + w · x`, fused.
#[target_feature(enable = "neon")]
#[inline]
fn fma(mut part: Ch, w: Ch, x: f32) -> Ch {
    fma_dup(&mut part, &w, x);
    part
}

/// `part + w · xs[j]`, fused: `fmla` by element on the four activations around `j`, a load
/// that repeats for the four `j` of a group and is merged into one.
#[target_feature(enable = "neon")]
#[inline]
fn fma_at(mut part: Ch, w: Ch, xs: &[f32], j: usize) -> Ch {
    let x = load_f32x4(&xs[4 * (j / 4)..]);
    match j % 4 {
        0 => fma_lane::<0, NQ>(&mut part, &w, x),
        1 => fma_lane::<1, NQ>(&mut part, &w, x),
        2 => fma_lane::<2, NQ>(&mut part, &w, x),
        _ => fma_lane::<3, NQ>(&mut part, &w, x),
    }
    part
}

/// Loads the window at channel `first` of one int4 step as its kind's decoder reads it.
#[target_feature(enable = "neon")]
#[inline]
fn load_step<const KIND: u8>(step: &[u32; PANEL], first: usize) -> Step {
    if KIND == E2M1 {
        Step {
            ints: [vdupq_n_s32(0); NQ],
            e2m1: load_e2m1::<NQ>(step, first / 4),
        }
    } else {
        Step {
            ints: load_step4::<NQ>(step, first / 4),
            e2m1: [vdupq_n_u8(0); NQ],
        }
    }
}

/// Issues no prefetch: the body is bound by its decode, not by memory.
#[target_feature(enable = "neon")]
#[inline]
fn prefetch_ahead(_step: &[u32; PANEL]) {}

/// Decodes K value `SHIFT / 4` of a loaded int4 step (`TOP = 28 − SHIFT` brings its nibble to
/// the top of the lane).
#[target_feature(enable = "neon")]
#[inline]
fn decode4<const SHIFT: i32, const TOP: i32, const KIND: u8, const ASYM: bool>(
    v: &Step,
    gc: &GroupConsts,
) -> Ch {
    if KIND == E2M1 {
        decode_e2m1::<NQ>(&v.e2m1, (SHIFT / 4) as usize)
    } else {
        decode_int4::<TOP, ASYM, NQ>(&v.ints, &gc.zadj)
    }
}

/// [`decode4`] for a K value `j` known only at run time (the ragged end of K).
#[target_feature(enable = "neon")]
#[inline]
fn decode4_at<const KIND: u8, const ASYM: bool>(v: &Step, j: usize, gc: &GroupConsts) -> Ch {
    if KIND == E2M1 {
        decode_e2m1::<NQ>(&v.e2m1, j)
    } else {
        decode_int4_at::<ASYM, NQ>(&v.ints, j, &gc.zadj)
    }
}

/// Decodes K value `j` of an 8-bit step's window at channel `first`.
#[target_feature(enable = "neon")]
#[inline]
fn decode8<const KIND: u8, const ASYM: bool>(
    step: &[u32; PANEL],
    j: usize,
    first: usize,
    gc: &GroupConsts,
) -> Ch {
    if KIND == E4M3 {
        decode_e4m3::<NQ>(step, j, first / 4)
    } else {
        decode_int8::<ASYM, NQ>(step, j, first / 4, &gc.zadj)
    }
}

/// The scales of group `g` of panel `p`'s window at channel `first`.
#[target_feature(enable = "neon")]
#[inline]
fn load_scales(w: &PackedWna16, p: usize, g: usize, first: usize) -> Ch {
    scale_lanes(w.scales(), (p * w.n_groups() + g) * PANEL + first)
}

/// The `4·NQ` packed scales from `at`, widened to f32 in registers (exactly): f16 by `fcvtl`,
/// bf16 by a shift into the high half, e8m0 by placing the exponent.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn scale_lanes<const NQ: usize>(s: &Wna16ScaleValues, at: usize) -> Lanes<NQ> {
    match s {
        Wna16ScaleValues::F16(v) => {
            let v = &v[at..at + 4 * NQ];
            std::array::from_fn(|q| f16x4_to_f32(load_u16x4(&v[4 * q..4 * q + 4])))
        }
        Wna16ScaleValues::Bf16(v) => {
            let v = &v[at..at + 4 * NQ];
            std::array::from_fn(|q| {
                let bits = vreinterpret_u16_s16(load_u16x4(&v[4 * q..4 * q + 4]));
                vreinterpretq_f32_u32(vshll_n_u16::<16>(bits))
            })
        }
        Wna16ScaleValues::F32(v) => {
            let v = &v[at..at + 4 * NQ];
            std::array::from_fn(|q| load_f32x4(&v[4 * q..]))
        }
        Wna16ScaleValues::E8m0(v) => {
            let v = &v[at..at + 4 * NQ];
            std::array::from_fn(|q| {
                let e: [u32; 4] = std::array::from_fn(|i| u32::from(v[4 * q + i]));
                // SAFETY: `e` is four readable u32; `ld1` has no alignment requirement.
                let e = unsafe { vld1q_u32(e.as_ptr()) };
                // `e << 23` is the f32 `2^(e − 127)` for e ≥ 1; e = 0 is the subnormal 2^-127.
                let pow = vreinterpretq_f32_u32(vshlq_n_u32::<23>(e));
                let subnormal = vdupq_n_f32(f32::from_bits(0x0040_0000));
                vbslq_f32(vceqq_u32(e, vdupq_n_u32(0)), subnormal, pow)
            })
        }
    }
}

/// Loads four 16-bit values (f16 or bf16 bits) into one 64-bit vector.
#[target_feature(enable = "neon")]
#[inline]
fn load_u16x4<T>(v: &[T]) -> int16x4_t {
    assert!(v.len() == 4 && size_of::<T>() == 2, "four 16-bit values");
    // SAFETY: the slice holds four 2-byte values (asserted): 8 readable bytes; `ld1` has no
    // alignment requirement.
    unsafe { vld1_s16(v.as_ptr().cast()) }
}

/// A group's sum of e4m3 products: [`decode_e4m3`] yields the values themselves.
#[target_feature(enable = "neon")]
#[inline]
fn e4m3_sum(sum: Ch) -> Ch {
    sum
}

/// `acc + sum · scales`.
#[target_feature(enable = "neon")]
#[inline]
fn scale_into(acc: &mut [f32; LANES], sum: Ch, scales: Ch) {
    for q in 0..NQ {
        let v = vfmaq_f32(load_f32x4(&acc[4 * q..]), sum[q], scales[q]);
        // SAFETY: lanes `4q..4q + 4` of the row are writable; `st1` has no alignment
        // requirement.
        unsafe { vst1q_f32(acc[4 * q..].as_mut_ptr(), v) };
    }
}

crate::wna16_tile::wna16_f32_tiles! {
    features: "neon",
    lanes: LANES,
    // Tiles of one to three rows keep more partial sums per row, so the `fmla` latency does
    // not bound them.
    mr: 8,
    rows: [1 => 4, 2 => 2, 3 => 2, 4 => 1, 5 => 1, 6 => 1, 7 => 1, 8 => 1],
}
