//! Per-row symmetric int8 weight quantization, bit-exact with vLLM's `Int8OnlineMoEMethod`
//! (spec section 5.1), which quantizes bf16/f16 expert weights at load time.
//!
//! Every step is "computed in the weight dtype", so each intermediate is rounded to bf16/f16:
//!
//! ```text
//! amax  = max_k |w[r,k]|                         # exact
//! scale = D(amax / 127)                          # f32 division, rounded to the weight dtype D
//! q     = clamp(rne(D(w / scale)), −127, 127)    # the quotient is rounded to D before rne
//! ```
//!
//! The scale is returned as f32, an exact widening of the 16-bit value. An all-zero row gives
//! `scale = 0` and codes 0 (vLLM divides 0 by 0 there). With f32 weights `D` is the identity.
//! Expert stacks `[E, rows, cols]` are quantized as `E·rows` rows: the scheme is per row.

use crate::error::QuantError;
use crate::half_conv::ModelFloat;

/// Largest int8 code produced; the range is symmetric, −128 is never produced.
const QMAX: f32 = 127.0;

/// Int8 codes and per-row scales of a `[rows, cols]` weight: `w[r, k] ≈ codes[r, k] · scales[r]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8PerRow {
    /// Row-major codes in `[−127, 127]`.
    pub codes: Vec<i8>,
    /// One f32 scale per row (the weight dtype's value, widened exactly).
    pub scales: Vec<f32>,
}

/// The absolute maximum of a row, in f32 (exact for every [`ModelFloat`]).
///
/// Exposed so tensor-parallel callers can all-reduce (max) the `amax` of a row split across
/// ranks before quantizing with [`quantize_row_int8_with_amax`], as the newest vLLM does for w2.
pub fn row_amax<W: ModelFloat>(row: &[W]) -> f32 {
    row.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()))
}

/// Quantizes a `[rows, cols]` row-major weight per row (see the module docs).
///
/// Errors: empty shapes, `w.len() != rows·cols`, or a NaN/infinite weight (reported with its
/// row and column).
pub fn quantize_int8_per_row<W: ModelFloat>(
    w: &[W],
    rows: usize,
    cols: usize,
) -> Result<Int8PerRow, QuantError> {
    let mut out = Int8PerRow {
        codes: vec![0; w.len()],
        scales: vec![0.0; rows],
    };
    quantize_int8_per_row_into(w, rows, cols, &mut out.codes, &mut out.scales)?;
    Ok(out)
}

/// [`quantize_int8_per_row`] into caller-provided buffers (`codes`: `rows·cols`, `scales`:
/// `rows`).
pub fn quantize_int8_per_row_into<W: ModelFloat>(
    w: &[W],
    rows: usize,
    cols: usize,
    codes: &mut [i8],
    scales: &mut [f32],
) -> Result<(), QuantError> {
    check_matrix("weight", w.len(), rows, cols)?;
    check_len("codes", rows * cols, codes.len())?;
    check_len("scales", rows, scales.len())?;
    check_finite("weight", w, cols)?;
    for ((row, q), s) in w
        .chunks_exact(cols)
        .zip(codes.chunks_exact_mut(cols))
        .zip(scales.iter_mut())
    {
        *s = quantize_row(row, row_amax(row), q);
    }
    Ok(())
}

/// Quantizes one row with a given `amax` (normally [`row_amax`] of the full, unsharded row),
/// returning the f32 scale. `amax` must be finite and at least the row's own absolute maximum,
/// or codes clamp at ±127.
pub fn quantize_row_int8_with_amax<W: ModelFloat>(
    row: &[W],
    amax: f32,
    q: &mut [i8],
) -> Result<f32, QuantError> {
    check_len("q", row.len(), q.len())?;
    check_finite("weight", row, row.len().max(1))?;
    if !amax.is_finite() || amax < 0.0 {
        return Err(QuantError::NonFinite {
            what: "amax",
            row: 0,
            col: 0,
            value: amax,
        });
    }
    Ok(quantize_row(row, amax, q))
}

/// The row kernel: inputs already checked.
pub(crate) fn quantize_row<W: ModelFloat>(row: &[W], amax: f32, q: &mut [i8]) -> f32 {
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let scale = W::round_f32(amax / QMAX);
    for (dst, v) in q.iter_mut().zip(row) {
        let quotient = W::round_f32(v.to_f32() / scale);
        // A scale that underflowed to 0 gives ±inf quotients (clamped) or 0/0 = NaN (cast to 0),
        // which is what PyTorch produces in practice.
        *dst = quotient.round_ties_even().clamp(-QMAX, QMAX) as i8;
    }
    scale
}

/// Dequantizes per-row int8 codes: `w[r, k] = codes[r, k] · scales[r]`.
pub fn dequantize_int8_per_row(
    codes: &[i8],
    scales: &[f32],
    cols: usize,
) -> Result<Vec<f32>, QuantError> {
    check_matrix("codes", codes.len(), scales.len(), cols)?;
    Ok(codes
        .chunks_exact(cols)
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&q| f32::from(q) * s))
        .collect())
}

/// Rejects empty shapes and a buffer whose length is not `rows·cols`.
pub(crate) fn check_matrix(
    what: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
) -> Result<(), QuantError> {
    if rows == 0 || cols == 0 {
        return Err(QuantError::EmptyTensor { what, rows, cols });
    }
    let expected = rows.checked_mul(cols).ok_or(QuantError::LengthMismatch {
        what,
        expected: usize::MAX,
        got: len,
    })?;
    check_len(what, expected, len)
}

/// Rejects a buffer of the wrong length.
pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
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

/// Rejects the first NaN or infinity, naming its row and column (`cols` > 0).
pub(crate) fn check_finite<W: ModelFloat>(
    what: &'static str,
    w: &[W],
    cols: usize,
) -> Result<(), QuantError> {
    match w.iter().position(|v| !v.to_f32().is_finite()) {
        None => Ok(()),
        Some(i) => Err(QuantError::NonFinite {
            what,
            row: i / cols,
            col: i % cols,
            value: w[i].to_f32(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn bf16_quotient_is_rounded_before_rne() {
        // amax 127 -> scale 1 exactly; 2.5 / 1 = 2.5 -> rne 2; -3.5 -> -4.
        let w: Vec<bf16> = [127.0f32, 2.5, -3.5, 0.0]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let r = quantize_int8_per_row(&w, 1, 4).unwrap();
        assert_eq!(r.codes, [127, 2, -4, 0]);
        assert_eq!(r.scales, [1.0]);
        // amax 1 -> scale bf16(1/127) = 0.00787353515625; 0.5 / scale = 63.50... in f32,
        // which bf16 rounds to 63.5 exactly, and rne gives 64 (f32-only math would give 64 too
        // via 63.504 -> 64, so check the scale itself).
        let w: Vec<bf16> = [1.0f32, 0.5].iter().map(|&v| bf16::from_f32(v)).collect();
        let r = quantize_int8_per_row(&w, 1, 2).unwrap();
        assert_eq!(r.scales[0], bf16::from_f32(1.0 / 127.0).to_f32());
        assert_eq!(r.codes, [127, 64]);
    }

    #[test]
    fn zero_row_and_errors() {
        let r = quantize_int8_per_row(&[0.0f32; 4], 2, 2).unwrap();
        assert_eq!(r.codes, [0; 4]);
        assert_eq!(r.scales, [0.0; 2]);
        // NaN != NaN, so match the fields instead of comparing errors.
        assert!(matches!(
            quantize_int8_per_row(&[1.0f32, 2.0, f32::NAN, 0.0], 2, 2),
            Err(QuantError::NonFinite { what: "weight", row: 1, col: 0, value }) if value.is_nan()
        ));
        assert_eq!(
            quantize_int8_per_row(&[1.0f32, f32::INFINITY], 1, 2),
            Err(QuantError::NonFinite {
                what: "weight",
                row: 0,
                col: 1,
                value: f32::INFINITY
            })
        );
        assert!(matches!(
            quantize_int8_per_row::<f32>(&[], 0, 4),
            Err(QuantError::EmptyTensor {
                rows: 0,
                cols: 4,
                ..
            })
        ));
        assert!(matches!(
            quantize_int8_per_row(&[1.0f32; 5], 2, 2),
            Err(QuantError::LengthMismatch {
                expected: 4,
                got: 5,
                ..
            })
        ));
        assert!(dequantize_int8_per_row(&[1; 4], &[1.0; 3], 2).is_err());
        let mut q = [0i8; 2];
        assert!(quantize_row_int8_with_amax(&[1.0f32, 2.0], f32::NAN, &mut q).is_err());
        assert_eq!(
            quantize_row_int8_with_amax(&[1.0f32, 2.0], 254.0, &mut q).unwrap(),
            2.0
        );
        assert_eq!(q, [0, 1]);
    }
}
