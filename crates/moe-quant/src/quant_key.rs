//! [`ScaleDesc`] and [`QuantKey`]: how a tensor is quantized (element dtype, scale dtype, static
//! or dynamic scales, scale granularity, symmetry), as vLLM's `quant_utils.py` describes it
//! (spec section 7.1). Backend oracles compare keys by value and print them in error messages,
//! so [`Display`](fmt::Display) reproduces vLLM's strings exactly.
//!
//! vLLM's named keys are associated constants here, renamed to Rust's constant style:
//! `kInt8StaticChannelSym` is [`QuantKey::INT8_STATIC_CHANNEL_SYM`],
//! `kInt4W4A8StaticGroup128Sym` is [`QuantKey::INT4_W4A8_STATIC_GROUP128_SYM`], and so on
//! (`k` prefix dropped, camel case split at word boundaries, numbers attached to the word they
//! follow). [`QuantKey::int4_w4a8_static_group_sym`] builds the group key for any `g`.

use std::fmt;

use crate::dtype::DType;
use crate::group_shape::GroupShape;
use crate::weight_groups::WeightGroups;

/// How the scales of a quantized tensor are stored and computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScaleDesc {
    /// Element type of the scales (normally f32; bf16 for W4A8 group weights).
    pub dtype: DType,
    /// `true` for scales fixed at load time (`static`), `false` for scales computed per call
    /// (`dynamic`). vLLM's field is called `static`.
    pub is_static: bool,
    /// Which block of elements shares one scale.
    pub group_shape: GroupShape,
}

impl ScaleDesc {
    /// A scale descriptor.
    pub const fn new(dtype: DType, is_static: bool, group_shape: GroupShape) -> Self {
        Self {
            dtype,
            is_static,
            group_shape,
        }
    }
}

impl fmt::Display for ScaleDesc {
    /// `"{dtype},{static|dynamic},{per_tensor|per_token|per_channel|GroupShape(row=…, col=…)}"`,
    /// e.g. `f32,dynamic,per_token` or `bf16,static,GroupShape(row=1, col=128)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.is_static { "static" } else { "dynamic" };
        write!(f, "{},{mode},", self.dtype)?;
        let gs = self.group_shape;
        if gs == GroupShape::PER_TENSOR {
            f.write_str("per_tensor")
        } else if gs == GroupShape::PER_TOKEN {
            f.write_str("per_token")
        } else if gs == GroupShape::PER_CHANNEL {
            f.write_str("per_channel")
        } else {
            write!(f, "{gs}")
        }
    }
}

/// Identifies a quantization scheme: quantized element dtype, primary scale, optional
/// second-level scale (NVFP4-style) and symmetry. Equality is by value on all fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantKey {
    /// Element type of the quantized tensor (int4 weights are stored as `I8`).
    pub dtype: DType,
    /// The primary scale.
    pub scale: ScaleDesc,
    /// A second-level scale, if any.
    pub scale2: Option<ScaleDesc>,
    /// `true` for symmetric quantization (no zero point).
    pub symmetric: bool,
}

const F32_STATIC_TENSOR: ScaleDesc = ScaleDesc::new(DType::F32, true, GroupShape::PER_TENSOR);
const F32_DYNAMIC_TENSOR: ScaleDesc = ScaleDesc::new(DType::F32, false, GroupShape::PER_TENSOR);
const F32_STATIC_TOKEN: ScaleDesc = ScaleDesc::new(DType::F32, true, GroupShape::PER_TOKEN);
const F32_DYNAMIC_TOKEN: ScaleDesc = ScaleDesc::new(DType::F32, false, GroupShape::PER_TOKEN);
const F32_STATIC_CHANNEL: ScaleDesc = ScaleDesc::new(DType::F32, true, GroupShape::PER_CHANNEL);

/// The fp8 element type vLLM uses on CPUs (`current_platform.fp8_dtype()`).
const FP8: DType = DType::F8E4M3Fn;

impl QuantKey {
    /// A key with no second-level scale.
    pub const fn new(dtype: DType, scale: ScaleDesc, symmetric: bool) -> Self {
        Self {
            dtype,
            scale,
            scale2: None,
            symmetric,
        }
    }

    /// `kInt8StaticChannelSym`: int8, static f32 scale per output channel, symmetric.
    pub const INT8_STATIC_CHANNEL_SYM: QuantKey =
        QuantKey::new(DType::I8, F32_STATIC_CHANNEL, true);
    /// `kInt8StaticTensorSym`: int8, static f32 per-tensor scale, symmetric.
    pub const INT8_STATIC_TENSOR_SYM: QuantKey = QuantKey::new(DType::I8, F32_STATIC_TENSOR, true);
    /// `kInt8StaticTensorAsym`: as [`Self::INT8_STATIC_TENSOR_SYM`] with a zero point.
    pub const INT8_STATIC_TENSOR_ASYM: QuantKey =
        QuantKey::new(DType::I8, F32_STATIC_TENSOR, false);
    /// `kInt8DynamicTensorSym`: int8, dynamic f32 per-tensor scale, symmetric.
    pub const INT8_DYNAMIC_TENSOR_SYM: QuantKey =
        QuantKey::new(DType::I8, F32_DYNAMIC_TENSOR, true);
    /// `kInt8DynamicTensorAsym`: as [`Self::INT8_DYNAMIC_TENSOR_SYM`] with a zero point.
    pub const INT8_DYNAMIC_TENSOR_ASYM: QuantKey =
        QuantKey::new(DType::I8, F32_DYNAMIC_TENSOR, false);
    /// `kInt8DynamicTokenSym`: int8, dynamic f32 scale per token, symmetric.
    pub const INT8_DYNAMIC_TOKEN_SYM: QuantKey = QuantKey::new(DType::I8, F32_DYNAMIC_TOKEN, true);
    /// `kInt8DynamicTokenAsym`: as [`Self::INT8_DYNAMIC_TOKEN_SYM`] with a zero point.
    pub const INT8_DYNAMIC_TOKEN_ASYM: QuantKey =
        QuantKey::new(DType::I8, F32_DYNAMIC_TOKEN, false);

    /// `kFp8StaticTensorSym`: fp8 e4m3, static f32 per-tensor scale.
    pub const FP8_STATIC_TENSOR_SYM: QuantKey = QuantKey::new(FP8, F32_STATIC_TENSOR, true);
    /// `kFp8DynamicTensorSym`: fp8 e4m3, dynamic f32 per-tensor scale.
    pub const FP8_DYNAMIC_TENSOR_SYM: QuantKey = QuantKey::new(FP8, F32_DYNAMIC_TENSOR, true);
    /// `kFp8StaticTokenSym`: fp8 e4m3, static f32 scale per token.
    pub const FP8_STATIC_TOKEN_SYM: QuantKey = QuantKey::new(FP8, F32_STATIC_TOKEN, true);
    /// `kFp8StaticChannelSym`: fp8 e4m3, static f32 scale per output channel.
    pub const FP8_STATIC_CHANNEL_SYM: QuantKey = QuantKey::new(FP8, F32_STATIC_CHANNEL, true);
    /// `kFp8DynamicTokenSym`: fp8 e4m3, dynamic f32 scale per token.
    pub const FP8_DYNAMIC_TOKEN_SYM: QuantKey = QuantKey::new(FP8, F32_DYNAMIC_TOKEN, true);
    /// `kFp8Dynamic128Sym`: fp8 e4m3, dynamic f32 scale per token and group of 128.
    pub const FP8_DYNAMIC_128_SYM: QuantKey = QuantKey::new(
        FP8,
        ScaleDesc::new(DType::F32, false, GroupShape::new(1, 128)),
        true,
    );
    /// `kFp8Static128BlockSym`: fp8 e4m3, static f32 scale per 128×128 block.
    pub const FP8_STATIC_128_BLOCK_SYM: QuantKey = QuantKey::new(
        FP8,
        ScaleDesc::new(DType::F32, true, GroupShape::new(128, 128)),
        true,
    );

    /// `kInt4W4A8StaticChannelSym` (inferred, spec 7.1): int4 weights stored as int8, static
    /// f32 scale per output channel.
    pub const INT4_W4A8_STATIC_CHANNEL_SYM: QuantKey =
        QuantKey::new(DType::I8, F32_STATIC_CHANNEL, true);
    /// `kInt4W4A8StaticGroup32Sym` (inferred): int4 weights stored as int8, static bf16 scales
    /// per group of 32 input columns.
    pub const INT4_W4A8_STATIC_GROUP32_SYM: QuantKey = Self::w4a8_group(32);
    /// `kInt4W4A8StaticGroup64Sym` (inferred): as above with groups of 64.
    pub const INT4_W4A8_STATIC_GROUP64_SYM: QuantKey = Self::w4a8_group(64);
    /// `kInt4W4A8StaticGroup128Sym` (inferred): as above with groups of 128.
    pub const INT4_W4A8_STATIC_GROUP128_SYM: QuantKey = Self::w4a8_group(128);

    const fn w4a8_group(g: i64) -> QuantKey {
        QuantKey::new(
            DType::I8,
            ScaleDesc::new(DType::BF16, true, GroupShape::new(1, g)),
            true,
        )
    }

    /// The W4A8 group weight key for any group size `g`: int8 storage, static bf16 scales with
    /// group shape `(1, g)`, symmetric. This is the key the compressed-tensors W4A8 method
    /// builds; it equals one of the `INT4_W4A8_STATIC_GROUP*_SYM` constants for g ∈ {32, 64, 128}.
    pub const fn int4_w4a8_static_group_sym(g: u32) -> QuantKey {
        Self::w4a8_group(g as i64)
    }

    /// The W4A8 weight key the compressed-tensors method builds for a grouping:
    /// [`Self::INT4_W4A8_STATIC_CHANNEL_SYM`] for channelwise f32 scales, else the group key
    /// with bf16 scales and the grouping's [`GroupShape`] `(1, g)`.
    pub fn int4_w4a8_static_sym(groups: WeightGroups) -> QuantKey {
        match groups {
            WeightGroups::Channelwise => Self::INT4_W4A8_STATIC_CHANNEL_SYM,
            WeightGroups::Groups(_) => Self::w4a8_group(groups.to_config()),
        }
    }
}

impl fmt::Display for QuantKey {
    /// `"QuantKey({dtype},scale({scale}),[scale2({scale2}),]{a?}symmetric)"`, e.g.
    /// `QuantKey(i8,scale(f32,dynamic,per_token),symmetric)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QuantKey({},scale({}),", self.dtype, self.scale)?;
        if let Some(s2) = &self.scale2 {
            write!(f, "scale2({s2}),")?;
        }
        let a = if self.symmetric { "" } else { "a" };
        write!(f, "{a}symmetric)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_vllm() {
        assert_eq!(
            QuantKey::INT8_STATIC_CHANNEL_SYM.to_string(),
            "QuantKey(i8,scale(f32,static,per_channel),symmetric)"
        );
        assert_eq!(
            QuantKey::INT8_DYNAMIC_TOKEN_SYM.to_string(),
            "QuantKey(i8,scale(f32,dynamic,per_token),symmetric)"
        );
        assert_eq!(
            QuantKey::INT8_DYNAMIC_TENSOR_ASYM.to_string(),
            "QuantKey(i8,scale(f32,dynamic,per_tensor),asymmetric)"
        );
        assert_eq!(
            QuantKey::FP8_STATIC_TENSOR_SYM.to_string(),
            "QuantKey(f8e4m3fn,scale(f32,static,per_tensor),symmetric)"
        );
        assert_eq!(
            QuantKey::INT4_W4A8_STATIC_GROUP128_SYM.to_string(),
            "QuantKey(i8,scale(bf16,static,GroupShape(row=1, col=128)),symmetric)"
        );
        let with_scale2 = QuantKey {
            scale2: Some(F32_STATIC_TENSOR),
            ..QuantKey::FP8_DYNAMIC_128_SYM
        };
        assert_eq!(
            with_scale2.to_string(),
            "QuantKey(f8e4m3fn,scale(f32,dynamic,GroupShape(row=1, col=128)),\
             scale2(f32,static,per_tensor),symmetric)"
        );
    }

    #[test]
    fn equality_is_by_value() {
        assert_eq!(
            QuantKey::int4_w4a8_static_group_sym(64),
            QuantKey::INT4_W4A8_STATIC_GROUP64_SYM
        );
        assert_ne!(
            QuantKey::int4_w4a8_static_group_sym(64),
            QuantKey::INT4_W4A8_STATIC_GROUP32_SYM
        );
        assert_eq!(
            QuantKey::int4_w4a8_static_sym(WeightGroups::groups(128).unwrap()),
            QuantKey::INT4_W4A8_STATIC_GROUP128_SYM
        );
        assert_eq!(
            QuantKey::int4_w4a8_static_sym(WeightGroups::Channelwise),
            QuantKey::INT4_W4A8_STATIC_CHANNEL_SYM
        );
        // The channelwise W4A8 key is indistinguishable from the int8 channel key, as in vLLM.
        assert_eq!(
            QuantKey::INT4_W4A8_STATIC_CHANNEL_SYM,
            QuantKey::INT8_STATIC_CHANNEL_SYM
        );
    }
}
