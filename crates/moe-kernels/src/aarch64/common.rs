//! NEON helpers shared by the three aarch64 rungs: loads, nibble unpacking, and the W4A8 and
//! W8A8 epilogues, written once.
//!
//! Every rung reduces a tile to [`RowSums`] (exact i32 sums of one row over the 16 channels of
//! a panel) and hands them here. The epilogues follow the reference order of spec §4.5 with a
//! separate `fmul` and `fadd` (never `vfmaq`, and Rust does not contract `vmulq` + `vaddq` into
//! `fmla`), so the f32 outputs equal the scalar reference bit for bit.

use std::arch::aarch64::*;

use crate::packed::PANEL;
use crate::ukernel::{W4A8Job, W4A8Out, W8A8Job};

/// Exact i32 sums of one row over the 16 channels of a panel: lane `i` of vector `q` is channel
/// `4q + i`, matching the packed layout (16 bytes of a step = 4 channels × 4 K values).
pub(super) type RowSums = [int32x4_t; 4];

/// The f32 block accumulators of one row, laid out as [`RowSums`].
pub(super) type RowAccF = [float32x4_t; 4];

/// Sums that start at zero.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn zero_sums() -> RowSums {
    [vdupq_n_s32(0); 4]
}

/// Loads 16 bytes.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load_u8x16(bytes: &[u8; 16]) -> uint8x16_t {
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_u8(bytes.as_ptr()) }
}

/// Loads 16 signed bytes.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load_i8x16(bytes: &[i8; 16]) -> int8x16_t {
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_s8(bytes.as_ptr()) }
}

/// Loads 8 activation bytes as signed codes (the aarch64 rungs use `ActEncoding::I8`).
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load_i8x8(bytes: &[u8; 8]) -> int8x8_t {
    vreinterpret_s8_u8(load_u8x8(bytes))
}

/// Loads 8 bytes.
#[target_feature(enable = "neon")]
#[inline]
fn load_u8x8(bytes: &[u8; 8]) -> uint8x8_t {
    // SAFETY: the reference covers 8 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1_u8(bytes.as_ptr()) }
}

/// The 4 activation bytes `word` repeated over 16 bytes, as signed codes.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn dup4(word: [u8; 4]) -> int8x16_t {
    vreinterpretq_s8_u32(vdupq_n_u32(u32::from_le_bytes(word)))
}

/// Loads 4 i32.
#[target_feature(enable = "neon")]
#[inline]
fn load_i32x4(v: &[i32]) -> int32x4_t {
    let v: &[i32; 4] = v[..4].try_into().unwrap();
    // SAFETY: the reference covers 4 readable i32; `ld1` has no alignment requirement.
    unsafe { vld1q_s32(v.as_ptr()) }
}

/// Loads 4 f32.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn load_f32x4(v: &[f32]) -> float32x4_t {
    let v: &[f32; 4] = v[..4].try_into().unwrap();
    // SAFETY: the reference covers 4 readable f32; `ld1` has no alignment requirement.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// The int4 weight codes `c = w + 8` (`0..=15`, valid signed bytes) of 16 packed bytes (4
/// channels × 4 byte positions): the low nibbles (K values 0..4 of the step) and the high
/// nibbles (K values 4..8). The tiles multiply the codes as they are, two instructions per 16
/// bytes; the block end takes the `+ 8` off (see [`w4a8_block_end`]).
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn unpack_codes(v: uint8x16_t) -> [int8x16_t; 2] {
    let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
    [lo, hi]
}

/// The code sums `Σc` of block `b` of panel `p`, channel quarters `q0..q0 + NQ`, counted
/// again from the block's nibbles (which the tile has just streamed through L1, see
/// `PackedW4A8::block_code_sum`): for a tile body with no spare dot product to count them
/// beside its products.
#[target_feature(enable = "neon")]
#[inline]
pub(super) fn recount_code_sums<const NQ: usize>(
    w: &crate::packed::PackedW4A8,
    p: usize,
    b: usize,
    q0: usize,
) -> [int32x4_t; NQ] {
    let csum = w.block_code_sum(p, b, 4 * q0..4 * (q0 + NQ));
    std::array::from_fn(|q| load_i32x4(&csum[4 * (q0 + q)..]))
}

/// Closes scale block `b` of a W4A8 tile (rows `m0..m0 + R` of panel `p`, channel quarters
/// `q0..q0 + NQ`: channels `4·q0..4·(q0 + NQ)` of the panel) from the row sums `Σ q·c`
/// (`ActEncoding::I8BlockCorrected`) and the block's code sums `Σc` of those channels
/// (`csum`, laid out as the row sums), which the tile counts beside its products: forms the
/// exact `acc_i = Σ q·c − zp·Σc − κ`
/// (`= Σ (q − zp)·w`; `κ` per row and block from the driver, in `job.block_corr`), then
/// either stores it (block-accumulator mode, `ACC`) or adds `f32(acc_i) · scale` to `acc_f`,
/// multiply then add. The int32 arithmetic wraps like the scalar reference's, so `acc_i` is
/// exact whenever it fits. Tiles of many rows cover a panel in two passes of 8 channels
/// (`NQ = 2`) or four of 4 (`NQ = 1`), so that their accumulators fit the register file.
///
/// # Safety
/// - In block-accumulator mode the job's pointer is valid for the whole
///   `[m][n_blocks][16·n_panels]` buffer and these rows' channels of panel `p` are ours alone.
#[target_feature(enable = "neon")]
#[inline]
#[allow(clippy::too_many_arguments)] // the tile coordinates, as in the tile bodies
pub(super) unsafe fn w4a8_block_end<const R: usize, const NQ: usize, const ACC: bool>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
    q0: usize,
    b: usize,
    sums: &[[int32x4_t; NQ]; R],
    cs: &[int32x4_t; NQ],
    acc_f: &mut [[float32x4_t; NQ]; R],
) {
    let w = job.w;
    let n_blocks = w.n_blocks();
    let scales = w.block_scales(p, b);
    let sc: [float32x4_t; NQ] = std::array::from_fn(|q| load_f32x4(&scales[4 * (q0 + q)..]));
    for (r, (row_sums, row_acc)) in sums.iter().zip(acc_f.iter_mut()).enumerate() {
        let zp = vdupq_n_s32(job.row_corr[m0 + r]);
        let kappa = vdupq_n_s32(job.block_corr[(m0 + r) * n_blocks + b]);
        for (q, (&sum, acc)) in row_sums.iter().zip(row_acc.iter_mut()).enumerate() {
            let acc_i = vsubq_s32(vsubq_s32(sum, vmulq_s32(zp, cs[q])), kappa);
            match job.out {
                W4A8Out::BlockAcc { ptr } if ACC => {
                    let at =
                        ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + p * PANEL + 4 * (q0 + q);
                    // SAFETY: the driver sized the buffer `[m][n_blocks][n_pad]`; these 4
                    // channels of row `m0 + r` belong to this call alone.
                    unsafe { vst1q_s32(ptr.wrapping_add(at), acc_i) };
                }
                _ => *acc = vaddq_f32(*acc, vmulq_f32(vcvtq_f32_s32(acc_i), sc[q])),
            }
        }
    }
}

/// Writes the W4A8 outputs of a tile's channel quarters `q0..q0 + NQ`:
/// `y = acc_f · recip (+ bias)`, multiply then add.
///
/// # Safety
/// - When the job writes values, its pointer is valid for rows `m0..m0 + R` and the channels
///   of panel `p` that are `< N`, which no one else accesses meanwhile.
#[target_feature(enable = "neon")]
#[inline]
pub(super) unsafe fn w4a8_store<const R: usize, const NQ: usize>(
    job: &W4A8Job<'_>,
    p: usize,
    m0: usize,
    q0: usize,
    acc_f: &[[float32x4_t; NQ]; R],
) {
    let W4A8Out::Values { ptr, ld } = job.out else {
        return;
    };
    let w = job.w;
    let valid = pass_valid(w.n(), p, q0, NQ);
    if valid == 0 {
        return;
    }
    let bias = w
        .panel_bias(p)
        .map(|b| -> [float32x4_t; NQ] { std::array::from_fn(|q| load_f32x4(&b[4 * (q0 + q)..])) });
    for (r, row_acc) in acc_f.iter().enumerate() {
        let recip = vdupq_n_f32(job.row_recip[m0 + r]);
        let mut y: [float32x4_t; NQ] = std::array::from_fn(|q| vmulq_f32(row_acc[q], recip));
        if let Some(bias) = bias {
            y = std::array::from_fn(|q| vaddq_f32(y[q], bias[q]));
        }
        // SAFETY: row `m0 + r < m`, channels `16p + 4·q0..` up to `valid` of them, all `< N`,
        // inside the validated output and owned by this call.
        unsafe {
            store_n(
                ptr.wrapping_add((m0 + r) * ld + p * PANEL + 4 * q0),
                &y,
                valid,
            )
        };
    }
}

/// Writes the W8A8 outputs of a tile's channel quarters `q0..q0 + NQ`:
/// `y = f32(Σ q·w) · (xs[m] · ws[n])`.
///
/// # Safety
/// - The job's pointer is valid for rows `m0..m0 + R` and the channels of panel `p` that are
///   `< N`, which no one else accesses meanwhile.
#[target_feature(enable = "neon")]
#[inline]
pub(super) unsafe fn w8a8_store<const R: usize, const NQ: usize>(
    job: &W8A8Job<'_>,
    p: usize,
    m0: usize,
    q0: usize,
    sums: &[[int32x4_t; NQ]; R],
) {
    let w = job.w;
    let valid = pass_valid(w.n(), p, q0, NQ);
    if valid == 0 {
        return;
    }
    let scales = w.panel_scales(p);
    let sc: [float32x4_t; NQ] = std::array::from_fn(|q| load_f32x4(&scales[4 * (q0 + q)..]));
    for (r, row_sums) in sums.iter().enumerate() {
        let xs = vdupq_n_f32(job.row_scale[m0 + r]);
        let y: [float32x4_t; NQ] =
            std::array::from_fn(|q| vmulq_f32(vcvtq_f32_s32(row_sums[q]), vmulq_f32(xs, sc[q])));
        // SAFETY: row `m0 + r < m`, channels `16p + 4·q0..` up to `valid` of them, all `< N`,
        // inside the validated output and owned by this call.
        unsafe {
            store_n(
                job.out.wrapping_add((m0 + r) * job.ld + p * PANEL + 4 * q0),
                &y,
                valid,
            )
        };
    }
}

/// How many of the channels `16p + 4·q0 .. 16p + 4·(q0 + nq)` are real (`< n`).
fn pass_valid(n: usize, p: usize, q0: usize, nq: usize) -> usize {
    n.saturating_sub(p * PANEL + 4 * q0).min(4 * nq)
}

/// Writes the first `valid` of the `4·NQ` values in `y` to `dst`.
///
/// # Safety
/// - `dst` is valid for `valid` f32 writes that no one else accesses meanwhile.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn store_n<const NQ: usize>(dst: *mut f32, y: &[float32x4_t; NQ], valid: usize) {
    if valid == 4 * NQ {
        for (q, v) in y.iter().enumerate() {
            // SAFETY: elements `4q..4q + 4 ≤ 4·NQ = valid` of the caller's destination.
            unsafe { vst1q_f32(dst.wrapping_add(4 * q), *v) };
        }
    } else {
        let mut tmp = [0f32; PANEL];
        for (q, v) in y.iter().enumerate() {
            // SAFETY: `tmp` holds 16 ≥ 4·NQ f32; this store covers elements `4q..4q + 4`.
            unsafe { vst1q_f32(tmp[4 * q..].as_mut_ptr(), *v) };
        }
        // SAFETY: `valid < 4·NQ ≤ 16` values from a local array to the caller's valid
        // destination.
        unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid) };
    }
}
