//! Symmetric int4 weight quantization per group of input columns, as the compressed-tensors
//! producer does it (spec section 6.2), plus the matching dequantization.
//!
//! For each row and each group of `g` consecutive columns (channelwise: `g = cols`):
//!
//! ```text
//! scale = amax / 7.5                 # amax / ((qmax − qmin) / 2), qmin = −8, qmax = 7
//! q     = clamp(rne(w / scale), −8, 7)
//! ```
//!
//! computed in f32 (16-bit weights are widened first). An all-zero group gets `scale = 0` and
//! codes 0. This is for building test checkpoints and reference data; consumers of real
//! checkpoints (which may be GPTQ-calibrated) must only rely on `w ≈ q · scale`.
//! Codes are stored one per `i8`, the unpacked `int-quantized` layout; see [`crate::pack`] for
//! nibble packing.

use crate::error::QuantError;
use crate::half_conv::ModelFloat;
use crate::int8::{check_finite, check_len, check_matrix};

/// Smallest int4 code.
pub const INT4_MIN: i8 = -8;
/// Largest int4 code.
pub const INT4_MAX: i8 = 7;
/// The divisor that maps `amax` to the scale: half the code range, `(7 − (−8)) / 2`.
const HALF_RANGE: f32 = 7.5;

/// Int4 codes with one scale per row and group: `w[r, k] ≈ codes[r, k] · scales[r, k / g]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Grouped {
    /// Row-major `[rows, cols]` codes in `[−8, 7]`.
    pub codes: Vec<i8>,
    /// Row-major `[rows, cols / group_size]` f32 scales.
    pub scales: Vec<f32>,
    /// Number of rows (output channels).
    pub rows: usize,
    /// Number of columns (input features, the reduction dimension).
    pub cols: usize,
    /// Columns per group; equals `cols` for channelwise quantization.
    pub group_size: usize,
}

/// Resolves a group size (`None` = channelwise) against `cols`, rejecting 0 and non-divisors.
pub fn resolve_group_size(group_size: Option<usize>, cols: usize) -> Result<usize, QuantError> {
    let g = group_size.unwrap_or(cols);
    if g == 0 {
        return Err(QuantError::ZeroGroupSize {
            what: "group_size",
            group_size: g,
        });
    }
    if !cols.is_multiple_of(g) {
        return Err(QuantError::GroupSizeNotDividing {
            what: "weight",
            group_size: g,
            k: cols,
        });
    }
    Ok(g)
}

/// Quantizes a `[rows, cols]` row-major weight to int4 with groups of `group_size` columns
/// (`None` = channelwise). Errors: empty shapes, a length mismatch, a group size of zero or not
/// dividing `cols`, and NaN/infinite weights (named by row and column).
pub fn quantize_int4_grouped<W: ModelFloat>(
    w: &[W],
    rows: usize,
    cols: usize,
    group_size: Option<usize>,
) -> Result<Int4Grouped, QuantError> {
    check_matrix("weight", w.len(), rows, cols)?;
    let g = resolve_group_size(group_size, cols)?;
    check_finite("weight", w, cols)?;
    let mut codes = vec![0i8; w.len()];
    let mut scales = vec![0.0f32; rows * (cols / g)];
    for ((wg, qg), s) in w
        .chunks_exact(g)
        .zip(codes.chunks_exact_mut(g))
        .zip(scales.iter_mut())
    {
        *s = quantize_group(wg, qg);
    }
    Ok(Int4Grouped {
        codes,
        scales,
        rows,
        cols,
        group_size: g,
    })
}

/// Quantizes one group, returning its scale.
fn quantize_group<W: ModelFloat>(w: &[W], q: &mut [i8]) -> f32 {
    let amax = w.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs()));
    let scale = amax / HALF_RANGE;
    if scale == 0.0 {
        q.fill(0);
        return 0.0;
    }
    for (dst, v) in q.iter_mut().zip(w) {
        *dst = (v.to_f32() / scale)
            .round_ties_even()
            .clamp(f32::from(INT4_MIN), f32::from(INT4_MAX)) as i8;
    }
    scale
}

/// Dequantizes grouped int4 codes: `w[r, k] = codes[r, k] · scales[r, k / group_size]`.
///
/// `group_size = None` means channelwise. Codes outside `[−8, 7]` are rejected.
pub fn dequantize_int4_grouped(
    codes: &[i8],
    scales: &[f32],
    rows: usize,
    cols: usize,
    group_size: Option<usize>,
) -> Result<Vec<f32>, QuantError> {
    check_matrix("codes", codes.len(), rows, cols)?;
    let g = resolve_group_size(group_size, cols)?;
    check_len("scales", rows * (cols / g), scales.len())?;
    check_int4_range("codes", codes)?;
    Ok(codes
        .chunks_exact(g)
        .zip(scales)
        .flat_map(|(grp, &s)| grp.iter().map(move |&q| f32::from(q) * s))
        .collect())
}

/// Rejects the first code outside `[−8, 7]`.
pub(crate) fn check_int4_range(what: &'static str, codes: &[i8]) -> Result<(), QuantError> {
    match codes
        .iter()
        .position(|q| !(INT4_MIN..=INT4_MAX).contains(q))
    {
        None => Ok(()),
        Some(index) => Err(QuantError::ValueOutOfRange {
            what,
            index,
            value: i32::from(codes[index]),
            min: i32::from(INT4_MIN),
            max: i32::from(INT4_MAX),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_get_their_own_scale() {
        // Two groups of 2: amax 7.5 -> scale 1; amax 15 -> scale 2.
        let w = [7.5f32, -2.5, -15.0, 3.0];
        let r = quantize_int4_grouped(&w, 1, 4, Some(2)).unwrap();
        assert_eq!(r.scales, [1.0, 2.0]);
        // 7.5 -> rne 8 -> clamp 7; -2.5 -> -2 (ties to even); -15/2 = -7.5 -> -8; 3/2 = 1.5 -> 2.
        assert_eq!(r.codes, [7, -2, -8, 2]);
        let deq = dequantize_int4_grouped(&r.codes, &r.scales, 1, 4, Some(2)).unwrap();
        assert_eq!(deq, [7.0, -2.0, -16.0, 4.0]);
        let ch = quantize_int4_grouped(&w, 1, 4, None).unwrap();
        assert_eq!(ch.group_size, 4);
        assert_eq!(ch.scales.len(), 1);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_eq!(
            quantize_int4_grouped(&[1.0f32; 6], 1, 6, Some(4)),
            Err(QuantError::GroupSizeNotDividing {
                what: "weight",
                group_size: 4,
                k: 6
            })
        );
        assert!(matches!(
            quantize_int4_grouped(&[1.0f32; 6], 1, 6, Some(0)),
            Err(QuantError::ZeroGroupSize { .. })
        ));
        assert!(matches!(
            quantize_int4_grouped(&[1.0f32, f32::NEG_INFINITY], 2, 1, None),
            Err(QuantError::NonFinite { row: 1, col: 0, .. })
        ));
        assert!(matches!(
            quantize_int4_grouped::<f32>(&[], 3, 0, None),
            Err(QuantError::EmptyTensor { .. })
        ));
        assert!(matches!(
            dequantize_int4_grouped(&[0, 9], &[1.0], 1, 2, None),
            Err(QuantError::ValueOutOfRange {
                index: 1,
                value: 9,
                ..
            })
        ));
        assert!(matches!(
            dequantize_int4_grouped(&[0, 1], &[1.0, 1.0], 1, 2, None),
            Err(QuantError::LengthMismatch { what: "scales", .. })
        ));
    }
}
