//! [`ScalarType`]: the logical number formats of quantized weights (int4, uint4b8, int8, fp8, ...)
//! described as vLLM's `scalar_types` describe them: a bit layout plus an integer bias, so that
//! a stored unsigned code `u` means the value `u − bias`.
//!
//! This matters for layout conversions: compressed-tensors and GPTQ store int4 weights as
//! `uint4b8` (value + 8), which is the same bits as our nibble packing.

use std::fmt;

/// How a floating-point format spends its NaN encodings (vLLM `NanRepr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NanRepr {
    /// No NaN (integer formats, or float formats without NaN).
    None,
    /// IEEE 754 NaNs (exponent all ones, mantissa non-zero).
    Ieee754,
    /// A single NaN: exponent and mantissa all ones (as `float8_e4m3fn`).
    ExtdRangeMaxMinNegZero,
}

/// A scalar number format: sign, exponent and mantissa bits, and a bias subtracted from the
/// stored code.
///
/// Integers have `exponent == 0`; their width is `mantissa + signed`.
/// Names follow vLLM: `int4`, `uint4`, `uint4b8`, `int8`, `uint8b128`, `float8_e4m3fn`,
/// `float4_e2m1f`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScalarType {
    /// Exponent bits (0 for integers).
    pub exponent: u8,
    /// Mantissa bits (magnitude bits for integers).
    pub mantissa: u8,
    /// Whether a sign bit is present.
    pub signed: bool,
    /// Subtracted from the stored code to get the value (`uint4b8`: 8).
    pub bias: i32,
    /// Float formats without infinities (`fn` suffix).
    pub finite_values_only: bool,
    /// NaN encoding of float formats.
    pub nan_repr: NanRepr,
}

impl ScalarType {
    const fn int(size_bits: u8, bias: i32) -> Self {
        Self {
            exponent: 0,
            mantissa: size_bits - 1,
            signed: true,
            bias,
            finite_values_only: false,
            nan_repr: NanRepr::None,
        }
    }

    const fn uint(size_bits: u8, bias: i32) -> Self {
        Self {
            exponent: 0,
            mantissa: size_bits,
            signed: false,
            bias,
            finite_values_only: false,
            nan_repr: NanRepr::None,
        }
    }

    /// Signed 4-bit two's complement, `[−8, 7]`.
    pub const INT4: ScalarType = ScalarType::int(4, 0);
    /// Unsigned 4-bit, `[0, 15]`.
    pub const UINT4: ScalarType = ScalarType::uint(4, 0);
    /// Unsigned 4-bit code with bias 8: value `u − 8` in `[−8, 7]` (GPTQ / compressed-tensors).
    pub const UINT4B8: ScalarType = ScalarType::uint(4, 8);
    /// Signed 8-bit two's complement, `[−128, 127]`.
    pub const INT8: ScalarType = ScalarType::int(8, 0);
    /// Unsigned 8-bit, `[0, 255]`.
    pub const UINT8: ScalarType = ScalarType::uint(8, 0);
    /// Unsigned 8-bit code with bias 128: value `u − 128` in `[−128, 127]`.
    pub const UINT8B128: ScalarType = ScalarType::uint(8, 128);
    /// fp8 with 4 exponent and 3 mantissa bits, finite only, one NaN (`torch.float8_e4m3fn`).
    pub const FLOAT8_E4M3FN: ScalarType = ScalarType {
        exponent: 4,
        mantissa: 3,
        signed: true,
        bias: 0,
        finite_values_only: true,
        nan_repr: NanRepr::ExtdRangeMaxMinNegZero,
    };

    /// fp4 with 2 exponent and 1 mantissa bits, finite only, no NaN (OCP `e2m1`, the element of
    /// MXFP4): values `{0, 0.5, 1, 1.5, 2, 3, 4, 6}` and their negatives.
    pub const FLOAT4_E2M1F: ScalarType = ScalarType {
        exponent: 2,
        mantissa: 1,
        signed: true,
        bias: 0,
        finite_values_only: true,
        nan_repr: NanRepr::None,
    };

    /// Total storage width in bits.
    pub const fn size_bits(&self) -> u32 {
        self.exponent as u32 + self.mantissa as u32 + self.signed as u32
    }

    /// Whether the stored code carries a sign bit (false for biased unsigned codes such as
    /// `uint4b8`, even though their values can be negative).
    pub const fn is_signed(&self) -> bool {
        self.signed
    }

    /// Whether this is an integer format.
    pub const fn is_integer(&self) -> bool {
        self.exponent == 0
    }

    /// Whether this is a floating-point format.
    pub const fn is_floating_point(&self) -> bool {
        self.exponent != 0
    }

    /// Whether a non-zero bias is subtracted from stored codes.
    pub const fn has_bias(&self) -> bool {
        self.bias != 0
    }

    /// Smallest representable value (after the bias).
    pub fn min(&self) -> f64 {
        if self.is_integer() {
            self.int_min().unwrap_or(0) as f64
        } else {
            -self.float_max()
        }
    }

    /// Largest representable value (after the bias).
    pub fn max(&self) -> f64 {
        if self.is_integer() {
            self.int_max().unwrap_or(0) as f64
        } else {
            self.float_max()
        }
    }

    /// Smallest value of an integer format (after the bias); `None` for floats.
    pub const fn int_min(&self) -> Option<i64> {
        if !self.is_integer() {
            return None;
        }
        let raw = if self.signed {
            -(1i64 << (self.size_bits() - 1))
        } else {
            0
        };
        Some(raw - self.bias as i64)
    }

    /// Largest value of an integer format (after the bias); `None` for floats.
    pub const fn int_max(&self) -> Option<i64> {
        if !self.is_integer() {
            return None;
        }
        let raw = if self.signed {
            (1i64 << (self.size_bits() - 1)) - 1
        } else {
            (1i64 << self.size_bits()) - 1
        };
        Some(raw - self.bias as i64)
    }

    fn float_max(&self) -> f64 {
        let mut max_mantissa = (1u64 << self.mantissa) - 1;
        let exp_bias = (1i32 << (self.exponent - 1)) - 1;
        let mut max_exp = (1i32 << self.exponent) - 1;
        match self.nan_repr {
            // The all-ones exponent holds infinities and NaNs.
            NanRepr::Ieee754 => max_exp -= 1,
            // Only exponent and mantissa both all ones is NaN.
            NanRepr::ExtdRangeMaxMinNegZero => max_mantissa -= 1,
            NanRepr::None => {}
        }
        let frac = 1.0 + max_mantissa as f64 / (1u64 << self.mantissa) as f64;
        frac * pow2(max_exp - exp_bias)
    }
}

/// `2^e` for a normal-range exponent, built from its bits. `powi` is not guaranteed to be
/// correctly rounded (Miri reports `2f64.powi(8)` as `255.99…`), and these limits must be exact.
fn pow2(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e), "exponent {e} out of range");
    f64::from_bits(((e + 1023) as u64) << 52)
}

impl fmt::Display for ScalarType {
    /// vLLM's spelling: `int4`, `uint4b8`, `float8_e4m3fn`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_floating_point() {
            write!(
                f,
                "float{}_e{}m{}",
                self.size_bits(),
                self.exponent,
                self.mantissa
            )?;
            let ieee = self.nan_repr == NanRepr::Ieee754 && !self.finite_values_only;
            if !ieee {
                if self.finite_values_only {
                    f.write_str("f")?;
                }
                if self.nan_repr != NanRepr::None {
                    f.write_str("n")?;
                }
            }
            Ok(())
        } else {
            let sign = if self.signed { "int" } else { "uint" };
            write!(f, "{sign}{}", self.size_bits())?;
            if self.has_bias() {
                write!(f, "b{}", self.bias)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ranges() {
        let cases = [
            (ScalarType::INT4, "int4", 4, -8.0, 7.0),
            (ScalarType::UINT4, "uint4", 4, 0.0, 15.0),
            (ScalarType::UINT4B8, "uint4b8", 4, -8.0, 7.0),
            (ScalarType::INT8, "int8", 8, -128.0, 127.0),
            (ScalarType::UINT8, "uint8", 8, 0.0, 255.0),
            (ScalarType::UINT8B128, "uint8b128", 8, -128.0, 127.0),
            (ScalarType::FLOAT8_E4M3FN, "float8_e4m3fn", 8, -448.0, 448.0),
            (ScalarType::FLOAT4_E2M1F, "float4_e2m1f", 4, -6.0, 6.0),
        ];
        for (t, name, bits, min, max) in cases {
            assert_eq!(t.to_string(), name);
            assert_eq!(t.size_bits(), bits, "{name}");
            assert_eq!(t.min(), min, "{name}");
            assert_eq!(t.max(), max, "{name}");
        }
        assert!(!ScalarType::UINT4B8.is_signed());
        assert!(ScalarType::INT4.is_signed());
        assert_eq!(ScalarType::FLOAT8_E4M3FN.int_min(), None);
    }
}
