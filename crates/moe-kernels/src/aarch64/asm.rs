//! The only home of the `sdot`, `smmla` and `fcvtl` (from f16) instructions, emitted with
//! `asm!` because their intrinsics (`vdotq_laneq_s32`, `vmmlaq_s32`, `vcvt_f32_f16`) or the
//! f16 vector types are not stable yet; the helpers are meant to be replaced one for one by
//! those intrinsics once they are.
//!
//! Each helper is a safe `#[target_feature]` function: callers compiled with the same feature
//! (the rung's tile bodies) call it without `unsafe`, and LLVM inlines it there. The
//! instructions only read and write vector registers, so the blocks touch no memory.

use std::arch::aarch64::{float32x4_t, int8x8_t, int8x16_t, int16x4_t, int32x4_t};
use std::arch::asm;

/// SDOT by element: `acc[i] + Σ_{j<4} w[4i + j] · a[4·LANE + j]` for the four i32 lanes `i`
/// (signed bytes, exact i32 sums). With the packed panels this is "4 channels × 4 K values
/// against 4 activation bytes of one row".
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) fn sdot_lane<const LANE: u32>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    const { assert!(LANE < 4, "sdot selects one of four 4-byte groups") };
    let mut acc = acc;
    // SAFETY: the `dotprod` target feature of this function makes `sdot` a valid instruction;
    // it reads and writes only the named vector registers.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{lane}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            a = in(vreg) a,
            lane = const LANE,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// [`sdot_lane`] with the activation bytes in a 64-bit vector (`LANE` is 0 or 1), so one
/// 8-byte load feeds a whole packed W4A8 step.
#[target_feature(enable = "neon,dotprod")]
#[inline]
pub(super) fn sdot_lane_d<const LANE: u32>(acc: int32x4_t, w: int8x16_t, a: int8x8_t) -> int32x4_t {
    const { assert!(LANE < 2, "a 64-bit vector holds two 4-byte groups") };
    let mut acc = acc;
    // SAFETY: as in `sdot_lane`; lanes 0 and 1 lie in the low 64 bits, which hold `a`.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{lane}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            a = in(vreg) a,
            lane = const LANE,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// SMMLA: `acc + A·Bᵀ` for the 2×8 signed byte matrices `a` (bytes 0..8 row 0, 8..16 row 1)
/// and `b` (bytes 0..8 column 0, 8..16 column 1), giving the 2×2 i32 block
/// `[r0·c0, r0·c1, r1·c0, r1·c1]` exactly.
#[target_feature(enable = "neon,i8mm")]
#[inline]
pub(super) fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: the `i8mm` target feature of this function makes `smmla` a valid instruction; it
    // reads and writes only the named vector registers.
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// FCVTL: the four f16 values whose bits are the lanes of `h`, widened to f32 (exactly, as
/// every f16 is an f32).
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn f16x4_to_f32(h: int16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: `fcvtl` is part of the base aarch64 vector unit (the `neon` feature of this
    // function); it reads and writes only the named vector registers.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}
