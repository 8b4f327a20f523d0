//! Tensor element types ([`DType`]) and their spellings: the short abbreviations of
//! `torch.fx.graph.dtype_abbrs` that vLLM prints inside `QuantKey` strings (and therefore inside
//! user-facing oracle errors), and the PyTorch names found in checkpoint configs.

use std::fmt;
use std::str::FromStr;

use crate::error::QuantError;

/// A tensor element type, as PyTorch names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// `torch.float64`.
    F64,
    /// `torch.float32`.
    F32,
    /// `torch.bfloat16`.
    BF16,
    /// `torch.float16`.
    F16,
    /// `torch.float8_e4m3fn`: the fp8 type of CPUs and NVIDIA GPUs.
    F8E4M3Fn,
    /// `torch.float8_e4m3fnuz`: the fp8 type of ROCm.
    F8E4M3Fnuz,
    /// `torch.float8_e5m2`.
    F8E5M2,
    /// `torch.int8`; also the storage type of unpacked int4 weights.
    I8,
    /// `torch.int16`.
    I16,
    /// `torch.int32`; the word type of compressed-tensors packed weights.
    I32,
    /// `torch.int64`.
    I64,
    /// `torch.uint8`.
    U8,
    /// `torch.bool`.
    Bool,
}

/// Every variant with its `dtype_abbrs` abbreviation and PyTorch name.
const TABLE: &[(DType, &str, &str)] = &[
    (DType::F64, "f64", "float64"),
    (DType::F32, "f32", "float32"),
    (DType::BF16, "bf16", "bfloat16"),
    (DType::F16, "f16", "float16"),
    (DType::F8E4M3Fn, "f8e4m3fn", "float8_e4m3fn"),
    (DType::F8E4M3Fnuz, "f8e4m3fnuz", "float8_e4m3fnuz"),
    (DType::F8E5M2, "f8e5m2", "float8_e5m2"),
    (DType::I8, "i8", "int8"),
    (DType::I16, "i16", "int16"),
    (DType::I32, "i32", "int32"),
    (DType::I64, "i64", "int64"),
    (DType::U8, "u8", "uint8"),
    (DType::Bool, "b8", "bool"),
];

impl DType {
    fn entry(self) -> &'static (DType, &'static str, &'static str) {
        TABLE
            .iter()
            .find(|e| e.0 == self)
            .expect("every DType variant is in TABLE")
    }

    /// The `torch.fx.graph.dtype_abbrs` abbreviation (`"bf16"`, `"i8"`, `"f8e4m3fn"`, ...);
    /// also what [`Display`](fmt::Display) prints.
    pub fn abbrev(self) -> &'static str {
        self.entry().1
    }

    /// The PyTorch name without the `torch.` prefix (`"bfloat16"`, `"int8"`, ...).
    pub fn torch_name(self) -> &'static str {
        self.entry().2
    }

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 | DType::I16 => 2,
            DType::F8E4M3Fn
            | DType::F8E4M3Fnuz
            | DType::F8E5M2
            | DType::I8
            | DType::U8
            | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F64
                | DType::F32
                | DType::BF16
                | DType::F16
                | DType::F8E4M3Fn
                | DType::F8E4M3Fnuz
                | DType::F8E5M2
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.abbrev())
    }
}

impl FromStr for DType {
    type Err = QuantError;

    /// Accepts the abbreviation (`"bf16"`), the PyTorch name (`"bfloat16"`) and the prefixed
    /// form configs use (`"torch.bfloat16"`), plus the aliases `half`, `float`, `double`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.strip_prefix("torch.").unwrap_or(s);
        let name = match name {
            "half" => "float16",
            "float" => "float32",
            "double" => "float64",
            other => other,
        };
        TABLE
            .iter()
            .find(|e| e.1 == name || e.2 == name)
            .map(|e| e.0)
            .ok_or_else(|| QuantError::UnknownDType {
                name: s.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for &(d, abbrev, torch) in TABLE {
            assert_eq!(d.to_string(), abbrev);
            assert_eq!(abbrev.parse::<DType>().unwrap(), d);
            assert_eq!(torch.parse::<DType>().unwrap(), d);
            assert_eq!(format!("torch.{torch}").parse::<DType>().unwrap(), d);
        }
        assert_eq!("half".parse::<DType>().unwrap(), DType::F16);
        assert!(matches!(
            "float7".parse::<DType>(),
            Err(QuantError::UnknownDType { .. })
        ));
    }
}
