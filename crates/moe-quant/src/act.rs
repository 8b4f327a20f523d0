//! Dynamic per-row int8 quantization of activations, in the two forms the CPU MoE paths use:
//! asymmetric with an integer zero point for W4A8 (spec section 4.2(a), KleidiAI "qai8dx" and
//! PyTorch's reference kernel) and symmetric per token for W8A8 (spec section 5.3, stage 0).
//!
//! Both work on one f32 row at a time; 16-bit activations are widened first
//! (see [`crate::half_conv`]).
//! Rounding is part of the contract and follows the spec: products `a·s` round half away from
//! zero (`rna`, Rust's [`f32::round`]), the asymmetric zero point rounds half to even (`rne`).

use crate::error::QuantError;

/// Smallest representable int8 code of the asymmetric form.
const QMIN: f32 = -128.0;
/// Largest representable int8 code.
const QMAX: f32 = 127.0;

/// Floor of the symmetric per-token absolute maximum, so an all-zero row gets a finite scale
/// (SGLang's `eps` in `quantize_row_int8`).
pub const SYM_AMAX_FLOOR: f32 = 1e-7;

/// The per-row parameters of an asymmetric int8 quantization: `a ≈ (q − zero_point) · recip`.
///
/// `recip` is the dequantization factor (`1 / s`, where `s = 255 / (rmax − rmin)` multiplies the
/// activations); KleidiAI stores it as the row's f32 and stores `−zero_point` as the row's i32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AsymRowQuant {
    /// Dequantization factor `1 / s`; `1.0` for an all-zero row.
    pub recip: f32,
    /// Integer zero point in `[−128, 127]`: the code that represents 0.0.
    pub zero_point: i32,
}

impl AsymRowQuant {
    /// The real value a code stands for: `(q − zero_point) · recip`.
    pub fn dequantize(&self, q: i8) -> f32 {
        (i32::from(q) - self.zero_point) as f32 * self.recip
    }
}

/// Quantizes one activation row to asymmetric int8 with a per-row zero point, exactly as
/// PyTorch's reference `_dyn_quant_matmul_4bit` kernel and KleidiAI's f32 `qai8dxp` packer do
/// (spec section 4.2(a)):
///
/// ```text
/// rmin = min(0, min a)   rmax = max(0, max a)        # the range always contains 0
/// s    = rmin == rmax ? 1 : 255 / (rmax − rmin)      # f32
/// dmin = rmin·s   dmax = rmax·s
/// zp   = rne(clamp((−128 + dmin) + (127 + dmax) > 0 ? −128 − dmin : 127 − dmax, −128, 127))
/// q    = clamp(rna(a·s) + zp, −128, 127)
/// recip = 1 / s
/// ```
///
/// Example: `[0.5, −1, 2, 0.25]` gives `s = 85`, `zero_point = −43`,
/// `q = [0, −128, 127, −22]` (`0.5·85 = 42.5` is a tie that `rna` rounds to 43).
///
/// An all-zero row gets `recip = 1`, `zero_point = 127` and every code 127, as upstream.
///
/// Non-finite values, a choice of ours where upstream is undefined: NaN elements are ignored
/// when the range is taken and quantize to the zero point (they dequantize to 0.0).
/// When `s` is not a positive finite number — an infinite element, a range wider than
/// `f32::MAX`, or a range so small that `255 / range` overflows — the row is treated as all
/// zero (the result above), so nothing downstream sees an infinite or NaN scale.
///
/// `q` must have the length of `x`; a mismatch is a caller bug caught by a debug assertion
/// (in release builds only the common prefix is written). Use [`try_quantize_row_asym_i8`] for
/// a checked call.
pub fn quantize_row_asym_i8(x: &[f32], q: &mut [i8]) -> AsymRowQuant {
    debug_assert_eq!(
        x.len(),
        q.len(),
        "quantize_row_asym_i8: x and q lengths differ"
    );
    // f32::min / f32::max return the other operand when one is NaN, so NaN never enters the range.
    let (rmin, rmax) = x
        .iter()
        .fold((0.0f32, 0.0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let s = if rmin == rmax {
        1.0
    } else {
        (QMAX - QMIN) / (rmax - rmin)
    };
    if !(s.is_finite() && s > 0.0) {
        return zero_row(q);
    }
    let dmin = rmin * s;
    let dmax = rmax * s;
    let zp_from_min_error = QMIN + dmin;
    let zp_from_max_error = QMAX + dmax;
    let zp_f = if zp_from_min_error + zp_from_max_error > 0.0 {
        QMIN - dmin
    } else {
        QMAX - dmax
    };
    let zero_point = zp_f.clamp(QMIN, QMAX).round_ties_even() as i32;
    for (dst, &v) in q.iter_mut().zip(x) {
        // `as i32` saturates and maps NaN to 0, so a NaN element lands on the zero point.
        let code = (v * s).round() as i32 + zero_point;
        *dst = code.clamp(-128, 127) as i8;
    }
    AsymRowQuant {
        recip: 1.0 / s,
        zero_point,
    }
}

/// The all-zero-row result of [`quantize_row_asym_i8`]: `s = 1`, zero point 127, every code 127.
fn zero_row(q: &mut [i8]) -> AsymRowQuant {
    q.fill(127);
    AsymRowQuant {
        recip: 1.0,
        zero_point: 127,
    }
}

/// [`quantize_row_asym_i8`] with the buffer lengths checked.
pub fn try_quantize_row_asym_i8(x: &[f32], q: &mut [i8]) -> Result<AsymRowQuant, QuantError> {
    check_len("q", x.len(), q.len())?;
    Ok(quantize_row_asym_i8(x, q))
}

/// Quantizes one activation row to symmetric int8 per token, as the W8A8 CPU MoE kernels do
/// (spec section 5.3, stage 0; SGLang `quantize_row_int8`, the Arm int8 path) and returns the
/// dequantization scale:
///
/// ```text
/// amax  = max(max |x|, 1e−7)
/// scale = amax / 127                          # returned; x ≈ q · scale
/// q     = clamp(rna(x · (127 / amax)), −127, 127)
/// ```
///
/// The x86 kernel stores `q + 128` as u8; that offset is a storage detail of its u8×s8 dot
/// product and is not applied here.
///
/// Non-finite values, a choice of ours: NaN elements are ignored when `amax` is taken and get
/// code 0. An infinite element makes `amax` infinite, so every code is 0 and the returned scale
/// is infinite; callers that must not see that should reject non-finite activations first.
///
/// `q` must have the length of `x` (debug assertion; release builds write the common prefix).
/// Use [`try_quantize_row_sym_i8`] for a checked call.
pub fn quantize_row_sym_i8(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(
        x.len(),
        q.len(),
        "quantize_row_sym_i8: x and q lengths differ"
    );
    let amax = x
        .iter()
        .fold(0.0f32, |m, &v| m.max(v.abs()))
        .max(SYM_AMAX_FLOOR);
    let inv_scale = 127.0 / amax;
    for (dst, &v) in q.iter_mut().zip(x) {
        *dst = (v * inv_scale).round().clamp(-127.0, 127.0) as i8;
    }
    amax / 127.0
}

/// [`quantize_row_sym_i8`] with the buffer lengths checked.
pub fn try_quantize_row_sym_i8(x: &[f32], q: &mut [i8]) -> Result<f32, QuantError> {
    check_len("q", x.len(), q.len())?;
    Ok(quantize_row_sym_i8(x, q))
}

/// Quantizes a row-major `[rows, cols]` activation matrix row by row with
/// [`quantize_row_asym_i8`], writing codes to `q` (same shape) and one [`AsymRowQuant`] per row
/// to `params`.
pub fn quantize_rows_asym_i8(
    x: &[f32],
    cols: usize,
    q: &mut [i8],
    params: &mut [AsymRowQuant],
) -> Result<(), QuantError> {
    let rows = params.len();
    check_len("x", rows * cols, x.len())?;
    check_len("q", rows * cols, q.len())?;
    if cols == 0 {
        params.iter_mut().for_each(|p| *p = zero_row(&mut []));
        return Ok(());
    }
    for ((xr, qr), p) in x
        .chunks_exact(cols)
        .zip(q.chunks_exact_mut(cols))
        .zip(params)
    {
        *p = quantize_row_asym_i8(xr, qr);
    }
    Ok(())
}

/// Quantizes a row-major `[rows, cols]` activation matrix row by row with
/// [`quantize_row_sym_i8`], writing codes to `q` and one dequantization scale per row to
/// `scales`.
pub fn quantize_rows_sym_i8(
    x: &[f32],
    cols: usize,
    q: &mut [i8],
    scales: &mut [f32],
) -> Result<(), QuantError> {
    let rows = scales.len();
    check_len("x", rows * cols, x.len())?;
    check_len("q", rows * cols, q.len())?;
    if cols == 0 {
        scales.fill(SYM_AMAX_FLOOR / 127.0);
        return Ok(());
    }
    for ((xr, qr), s) in x
        .chunks_exact(cols)
        .zip(q.chunks_exact_mut(cols))
        .zip(scales)
    {
        *s = quantize_row_sym_i8(xr, qr);
    }
    Ok(())
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what,
            expected,
            got,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example_asym() {
        let x = [0.5f32, -1.0, 2.0, 0.25];
        let mut q = [0i8; 4];
        let p = quantize_row_asym_i8(&x, &mut q);
        assert_eq!(q, [0, -128, 127, -22]);
        assert_eq!(p.zero_point, -43);
        assert_eq!(p.recip, 1.0 / 85.0);
    }

    #[test]
    fn all_zero_row_asym() {
        let mut q = [0i8; 3];
        let p = quantize_row_asym_i8(&[0.0; 3], &mut q);
        assert_eq!(
            p,
            AsymRowQuant {
                recip: 1.0,
                zero_point: 127
            }
        );
        assert_eq!(q, [127; 3]);
    }

    #[test]
    fn non_finite_asym_rows_become_zero_rows() {
        let mut q = [0i8; 2];
        for row in [[f32::INFINITY, 1.0], [f32::MAX, -f32::MAX], [1e-45, 0.0]] {
            let p = quantize_row_asym_i8(&row, &mut q);
            assert_eq!(
                p,
                AsymRowQuant {
                    recip: 1.0,
                    zero_point: 127
                },
                "{row:?}"
            );
            assert_eq!(q, [127; 2]);
        }
        let p = quantize_row_asym_i8(&[f32::NAN, 2.0], &mut q);
        assert_eq!(q[0] as i32, p.zero_point);
        assert_eq!(q[1], 127);
    }

    #[test]
    fn sym_rounds_half_away_and_clamps() {
        // amax 127 -> inverse scale 1: 0.5 -> 1, -2.5 -> -3.
        let mut q = [0i8; 4];
        let s = quantize_row_sym_i8(&[0.5, -2.5, 127.0, -127.0], &mut q);
        assert_eq!(q, [1, -3, 127, -127]);
        assert_eq!(s, 1.0);
        let s = quantize_row_sym_i8(&[0.0; 4], &mut q);
        assert_eq!(q, [0; 4]);
        assert_eq!(s, SYM_AMAX_FLOOR / 127.0);
    }

    #[test]
    fn checked_wrappers_reject_length_mismatch() {
        let mut q = [0i8; 2];
        let err = try_quantize_row_asym_i8(&[1.0; 3], &mut q).unwrap_err();
        assert_eq!(
            err,
            QuantError::LengthMismatch {
                what: "q",
                expected: 3,
                got: 2
            }
        );
        assert!(try_quantize_row_sym_i8(&[1.0; 3], &mut q).is_err());
        let mut p = [AsymRowQuant {
            recip: 0.0,
            zero_point: 0,
        }; 2];
        assert!(quantize_rows_asym_i8(&[1.0; 5], 3, &mut [0; 6], &mut p).is_err());
        assert!(quantize_rows_sym_i8(&[1.0; 6], 3, &mut [0; 5], &mut [0.0; 2]).is_err());
    }
}
