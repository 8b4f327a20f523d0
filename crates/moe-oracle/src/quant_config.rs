//! Quantization descriptions the oracle reads and builds: the weight key of a scheme
//! ([`WeightKey`], which extends moe-quant's [`QuantKey`] with vLLM's `ScalarType`-typed keys
//! of the WNA16 path), and vLLM's `FusedMoEQuantDesc` / `FusedMoEQuantConfig` with the
//! per-family `make_*_quant_config` helpers (spec section 7.2).
//!
//! The configs hold no tensors: only dtypes, group shapes and whether biases exist, which is
//! all selection and kernel construction need to agree on.

use std::fmt;

use moe_quant::{DType, GroupShape, QuantKey, ScalarType, ScaleDesc, WeightGroups};

use crate::error::OracleError;

/// A quantization key whose element type is a vLLM `ScalarType` (`uint4b8`, `uint8b128`)
/// rather than a torch dtype: the keys the GPTQ / compressed-tensors WNA16 path builds.
/// moe-quant's [`QuantKey`] holds only [`DType`]s, so these live here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScalarQuantKey {
    /// Logical element type.
    pub scalar_type: ScalarType,
    /// Primary scale.
    pub scale: ScaleDesc,
    /// Symmetric (no zero point).
    pub symmetric: bool,
}

/// The WNA16 group scale vLLM's GPTQ path builds: static f16 with `GroupShape(1, −1)`.
const F16_STATIC_GROUP: ScaleDesc = ScaleDesc::new(DType::F16, true, GroupShape::PER_TOKEN);

impl ScalarQuantKey {
    /// `kInt4Static`: `uint4b8` weights with static f16 group scales.
    pub const INT4_STATIC: ScalarQuantKey = ScalarQuantKey {
        scalar_type: ScalarType::UINT4B8,
        scale: F16_STATIC_GROUP,
        symmetric: true,
    };
    /// `kInt8Static`: `uint8b128` weights with static f16 group scales.
    pub const INT8_STATIC: ScalarQuantKey = ScalarQuantKey {
        scalar_type: ScalarType::UINT8B128,
        scale: F16_STATIC_GROUP,
        symmetric: true,
    };
    /// MXFP4 (gpt-oss): `float4_e2m1f` weights with static e8m0 scales per 32 input columns,
    /// held as `uint8` exponents (moe-quant has no e8m0 dtype).
    pub const MXFP4_STATIC: ScalarQuantKey = ScalarQuantKey {
        scalar_type: ScalarType::FLOAT4_E2M1F,
        scale: ScaleDesc::new(DType::U8, true, GroupShape::new(1, 32)),
        symmetric: true,
    };
}

impl fmt::Display for ScalarQuantKey {
    /// vLLM's `QuantKey.__str__` with the scalar type's name as the dtype. Older vLLM crashed
    /// here (`dtype_abbrs` has no entry for scalar types); newer falls back to `str(dtype)`,
    /// which is what we print.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = if self.symmetric { "" } else { "a" };
        write!(
            f,
            "QuantKey({},scale({}),{a}symmetric)",
            self.scalar_type, self.scale
        )
    }
}

/// The weight key of a quantization scheme, as the support checks receive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WeightKey {
    /// A key over a torch dtype (W4A8, int8, fp8 families).
    Quant(QuantKey),
    /// A key over a vLLM scalar type (WNA16).
    Scalar(ScalarQuantKey),
}

impl From<QuantKey> for WeightKey {
    fn from(k: QuantKey) -> Self {
        WeightKey::Quant(k)
    }
}

impl From<ScalarQuantKey> for WeightKey {
    fn from(k: ScalarQuantKey) -> Self {
        WeightKey::Scalar(k)
    }
}

impl fmt::Display for WeightKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightKey::Quant(k) => write!(f, "{k}"),
            WeightKey::Scalar(k) => write!(f, "{k}"),
        }
    }
}

/// Python's rendering of an optional key: the key, or `None`.
pub(crate) struct PyOpt<'a, T>(pub Option<&'a T>);

impl<T: fmt::Display> fmt::Display for PyOpt<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v}"),
            None => f.write_str("None"),
        }
    }
}

/// The element type of a `FusedMoEQuantDesc`: a torch dtype or one of vLLM's string tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DescDtype {
    /// A torch dtype (`torch.int8`, `torch.float8_e4m3fn`).
    Torch(DType),
    /// A string tag such as `"int4"`.
    Tag(&'static str),
}

/// vLLM's `FusedMoEQuantDesc` without tensors: `dtype = None` means unquantized or already
/// quantized (packed) data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QuantDesc {
    /// Quantized element type, if the data is quantized by this config.
    pub dtype: Option<DescDtype>,
    /// Scale group shape.
    pub shape: Option<GroupShape>,
    /// Whether a bias tensor accompanies this operand.
    pub has_bias: bool,
}

/// vLLM's `FusedMoEQuantConfig` without tensors: descriptors of the two activations and the
/// two weights, and derived properties.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct MoeQuantConfig {
    /// Input of the first GEMM.
    pub a1: QuantDesc,
    /// Input of the second GEMM.
    pub a2: QuantDesc,
    /// w13.
    pub w1: QuantDesc,
    /// w2.
    pub w2: QuantDesc,
    /// Clamp limit applied after the first GEMM, if any.
    pub gemm1_clamp_limit: Option<f32>,
}

impl MoeQuantConfig {
    /// `quant_dtype = _a1.dtype`.
    pub fn quant_dtype(&self) -> Option<DescDtype> {
        self.a1.dtype
    }

    /// `_a1.shape == PER_TOKEN`.
    pub fn is_per_act_token(&self) -> bool {
        self.a1.shape == Some(GroupShape::PER_TOKEN)
    }

    /// `_w1.shape == PER_TOKEN` (vLLM's per-output-channel flag).
    pub fn per_out_ch_quant(&self) -> bool {
        self.w1.shape == Some(GroupShape::PER_TOKEN)
    }

    /// `[row, col]` of `_a1.shape` unless it is absent, per-tensor or per-token.
    pub fn block_shape(&self) -> Option<[i64; 2]> {
        let s = self.a1.shape?;
        if s.is_per_tensor() || s.is_per_token() {
            None
        } else {
            Some([s.row, s.col])
        }
    }

    /// Activations quantized to int8.
    pub fn use_int8_w8a8(&self) -> bool {
        self.quant_dtype() == Some(DescDtype::Torch(DType::I8))
    }

    /// Weight-only int8 (activations stay floating point).
    pub fn use_int8_w8a16(&self) -> bool {
        self.a1.dtype.is_none() && self.w1.dtype == Some(DescDtype::Torch(DType::I8))
    }

    /// The W4A8 kernel's weight grouping: channelwise for `[−1, 1]`, else groups of the column
    /// extent of the block shape (as `CPUExpertsInt4.apply` derives its group size); `None`
    /// without a block shape or with a column extent that is no group size.
    pub fn w4a8_groups(&self) -> Option<WeightGroups> {
        match self.block_shape()? {
            [-1, 1] => Some(WeightGroups::Channelwise),
            [_, col] => WeightGroups::from_config(col).ok(),
        }
    }

    /// vLLM's invariant: per-token activation scales exclude a block shape.
    pub fn validate(&self) -> Result<(), OracleError> {
        if self.is_per_act_token() && self.block_shape().is_some() {
            return Err(OracleError::InvalidConfig {
                field: "block_shape",
                reason: "per-token activation quantization excludes a block shape".to_string(),
            });
        }
        Ok(())
    }
}

/// The W4A8 weight key the compressed-tensors method builds for a weight grouping:
/// channelwise f32 scales, or bf16 scales in groups of `g` (block shape `(1, g)`, from
/// [`WeightGroups::group_shape`]).
pub fn w4a8_weight_key(groups: WeightGroups) -> QuantKey {
    QuantKey::int4_w4a8_static_sym(groups)
}

/// `make_w4a8_int8_moe_quant_config(block_shape)`: all four descriptors with `dtype = None`
/// (the kernel quantizes activations itself; weights arrive packed) and the block shape.
pub fn make_w4a8_int8_moe_quant_config(block_shape: Option<GroupShape>) -> MoeQuantConfig {
    let d = QuantDesc {
        dtype: None,
        shape: block_shape,
        has_bias: false,
    };
    MoeQuantConfig {
        a1: d,
        a2: d,
        w1: d,
        w2: d,
        gemm1_clamp_limit: None,
    }
}

/// Which activation scales an int8 config has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Int8ActScales {
    /// No activation scales: `int8_w8a16` (what the online int8 method builds).
    None,
    /// Static activation scales, per tensor or (with `per_token`) per token.
    Static {
        /// Per-token activation scales.
        per_token: bool,
    },
}

/// `make_int8_moe_quant_config`: W8A16 without activation scales, W8A8 with them. Biases are
/// recorded on the weight descriptors (`_maybe_inject_biases`).
pub fn make_int8_moe_quant_config(
    act_scales: Int8ActScales,
    w1_bias: bool,
    w2_bias: bool,
) -> MoeQuantConfig {
    let int8 = Some(DescDtype::Torch(DType::I8));
    let (a, w_shape) = match act_scales {
        Int8ActScales::None => (QuantDesc::default(), None),
        Int8ActScales::Static { per_token } => {
            let shape = if per_token {
                GroupShape::PER_TOKEN
            } else {
                GroupShape::PER_TENSOR
            };
            (
                QuantDesc {
                    dtype: int8,
                    shape: Some(shape),
                    has_bias: false,
                },
                None,
            )
        }
    };
    MoeQuantConfig {
        a1: a,
        a2: a,
        w1: QuantDesc {
            dtype: int8,
            shape: w_shape,
            has_bias: w1_bias,
        },
        w2: QuantDesc {
            dtype: int8,
            shape: w_shape,
            has_bias: w2_bias,
        },
        gemm1_clamp_limit: None,
    }
}

/// A WNA16 config (ours; vLLM's oracle has no helper): weights tagged `"int4"` or int8 with
/// the W4A8 block-shape convention, activations unquantized 16-bit.
pub fn make_wna16_moe_quant_config(
    weight_bits: u32,
    groups: WeightGroups,
) -> Result<MoeQuantConfig, OracleError> {
    let dtype = match weight_bits {
        4 => DescDtype::Tag("int4"),
        8 => DescDtype::Torch(DType::I8),
        b => {
            return Err(OracleError::InvalidConfig {
                field: "weight_bits",
                reason: format!("GPTQMarlinMoEMethod only supports int4 and int8 now. (got {b})"),
            });
        }
    };
    let shape = Some(groups.group_shape());
    let w = QuantDesc {
        dtype: Some(dtype),
        shape,
        has_bias: false,
    };
    let a = QuantDesc {
        dtype: None,
        shape,
        has_bias: false,
    };
    Ok(MoeQuantConfig {
        a1: a,
        a2: a,
        w1: w,
        w2: w,
        gemm1_clamp_limit: None,
    })
}

/// The WNA16 weight key for a bit width.
pub fn wna16_weight_key(weight_bits: u32) -> Result<ScalarQuantKey, OracleError> {
    match weight_bits {
        4 => Ok(ScalarQuantKey::INT4_STATIC),
        8 => Ok(ScalarQuantKey::INT8_STATIC),
        b => Err(OracleError::InvalidConfig {
            field: "weight_bits",
            reason: format!("GPTQMarlinMoEMethod only supports int4 and int8 now. (got {b})"),
        }),
    }
}

/// The MXFP4 weight key (gpt-oss experts): e2m1 codes, e8m0 scales per 32 columns.
pub fn mxfp4_weight_key() -> ScalarQuantKey {
    ScalarQuantKey::MXFP4_STATIC
}

/// An unquantized config: every descriptor empty.
pub fn make_unquantized_moe_quant_config() -> MoeQuantConfig {
    MoeQuantConfig::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w4a8_configs_from_group_size() {
        let channelwise = WeightGroups::Channelwise;
        let c = make_w4a8_int8_moe_quant_config(Some(channelwise.group_shape()));
        assert_eq!(c.block_shape(), Some([-1, 1]));
        assert!(!c.is_per_act_token());
        assert_eq!(c.w4a8_groups(), Some(channelwise));
        let g128 = WeightGroups::groups(128).unwrap();
        let c = make_w4a8_int8_moe_quant_config(Some(g128.group_shape()));
        assert_eq!(c.block_shape(), Some([1, 128]));
        assert_eq!(c.w4a8_groups(), Some(g128));
        c.validate().unwrap();
        assert_eq!(
            w4a8_weight_key(WeightGroups::groups(64).unwrap()),
            QuantKey::INT4_W4A8_STATIC_GROUP64_SYM
        );
        assert_eq!(
            w4a8_weight_key(channelwise),
            QuantKey::INT4_W4A8_STATIC_CHANNEL_SYM
        );
    }

    #[test]
    fn int8_configs() {
        let c = make_int8_moe_quant_config(Int8ActScales::None, true, false);
        assert!(c.use_int8_w8a16() && !c.use_int8_w8a8());
        assert!(c.w1.has_bias && !c.w2.has_bias);
        let c = make_int8_moe_quant_config(Int8ActScales::Static { per_token: true }, false, false);
        assert!(c.use_int8_w8a8() && c.is_per_act_token());
        assert_eq!(c.block_shape(), None);
        let bad = MoeQuantConfig {
            a1: QuantDesc {
                shape: Some(GroupShape::PER_TOKEN),
                ..QuantDesc::default()
            },
            ..MoeQuantConfig::default()
        };
        bad.validate().unwrap();
    }

    #[test]
    fn scalar_key_display() {
        assert_eq!(
            ScalarQuantKey::INT4_STATIC.to_string(),
            "QuantKey(uint4b8,scale(f16,static,per_token),symmetric)"
        );
        assert_eq!(wna16_weight_key(8).unwrap(), ScalarQuantKey::INT8_STATIC);
        assert!(wna16_weight_key(3).is_err());
        assert!(make_wna16_moe_quant_config(4, WeightGroups::groups(128).unwrap()).is_ok());
    }
}
