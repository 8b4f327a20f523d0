//! Conversions between f32 and the 16-bit float types (bf16, f16) through the `half` crate, with
//! round-to-nearest-even narrowing as PyTorch's `.to(dtype)` does (spec section 0, `bf16(v)`).
//!
//! The [`ModelFloat`] trait lets the weight quantizers be written once for f32, bf16 and f16 and
//! emulate "computed in dtype D" arithmetic: widen, compute in f32, round the result back.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::QuantError;

/// A float type model weights and activations arrive in (f32, bf16, f16). For the 16-bit types
/// PyTorch computes by widening to f32 and rounding the result back (RNE); for f32 rounding is
/// the identity.
pub trait ModelFloat: Copy + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// The tensor dtype this type represents.
    const DTYPE: DType;
    /// Exact widening to f32.
    fn to_f32(self) -> f32;
    /// Narrowing from f32 with round-to-nearest-even (NaN stays NaN, overflow goes to ±inf).
    fn from_f32(v: f32) -> Self;
    /// Rounds an f32 to this type and widens it back: the value an op "computed in this dtype"
    /// produces.
    fn round_f32(v: f32) -> f32 {
        Self::from_f32(v).to_f32()
    }
}

impl ModelFloat for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl ModelFloat for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl ModelFloat for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Rounds an f32 to bf16 (RNE), the `bf16(v)` of the spec.
pub fn round_to_bf16(v: f32) -> f32 {
    bf16::round_f32(v)
}

/// Rounds an f32 to f16 (RNE), the `f16(v)` of the spec.
pub fn round_to_f16(v: f32) -> f32 {
    f16::round_f32(v)
}

/// Widens a slice into `dst` (exact).
pub fn widen_to_f32<H: ModelFloat>(src: &[H], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len(src.len(), dst.len())?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
    Ok(())
}

/// Narrows an f32 slice into `dst` with round-to-nearest-even.
pub fn narrow_from_f32<H: ModelFloat>(src: &[f32], dst: &mut [H]) -> Result<(), QuantError> {
    check_len(src.len(), dst.len())?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = H::from_f32(s);
    }
    Ok(())
}

/// Widens a slice into a new f32 vector.
pub fn to_f32_vec<H: ModelFloat>(src: &[H]) -> Vec<f32> {
    src.iter().map(|v| v.to_f32()).collect()
}

/// Narrows an f32 slice into a new vector (RNE).
pub fn from_f32_vec<H: ModelFloat>(src: &[f32]) -> Vec<H> {
    src.iter().map(|&v| H::from_f32(v)).collect()
}

fn check_len(expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::LengthMismatch {
            what: "dst",
            expected,
            got,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_is_round_to_nearest_even() {
        // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(round_to_bf16(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
        assert_eq!(
            round_to_bf16(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(round_to_f16(1.0 + 2f32.powi(-11)), 1.0);
    }

    #[test]
    fn slices_round_trip_and_check_lengths() {
        let src = [1.5f32, -2.25, 0.0];
        let h: Vec<bf16> = from_f32_vec(&src);
        assert_eq!(to_f32_vec(&h), src);
        let mut out = [0.0f32; 2];
        assert!(widen_to_f32(&h, &mut out).is_err());
        let mut hs = [f16::ZERO; 3];
        narrow_from_f32(&src, &mut hs).unwrap();
        let mut back = [0.0f32; 3];
        widen_to_f32(&hs, &mut back).unwrap();
        assert_eq!(back, src);
    }
}
