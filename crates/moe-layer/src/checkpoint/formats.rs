//! Decoding of one projection (one expert's `gate_proj`, `up_proj` or `down_proj`) from its
//! storage format into the logical layout every format shares: values `[n, k]` row-major
//! (`n` = output features, `k` = input features, the reduction dimension), scales `[n, G]`
//! with `G = k / g` (or 1 for channelwise), an optional act-order `g_idx` `[k]` and an
//! optional bias `[n]`. Nothing is sliced for tensor parallelism here (see `read.rs`).
//!
//! | format | tensors | decoding |
//! |---|---|---|
//! | unquantized | `weight` f32/bf16/f16 `[n, k]` | bytes kept as stored |
//! | compressed-tensors `int-quantized` | `weight` i8 `[n, k]` in [-8, 7], `weight_scale` `[n, G]` | codes checked for range |
//! | compressed-tensors `pack-quantized` | `weight_packed` i32 `[n, ceil(k·b/32)]`, `weight_shape` `[2]`, `weight_scale` `[n, G]`, `weight_g_idx` `[k]`, `weight_zero_point` i32 `[ceil(n·b/32), G]` (asymmetric only) | `moe_quant::unpack_from_int32`; zero points unpacked along N |
//! | GPTQ | `qweight` i32 `[k/pf, n]`, `scales` `[G, n]`, `g_idx` `[k]`, `qzeros` i32 `[G, n/pf]` (asymmetric only) | unpacked along K and transposed; scales and zeros transposed |
//! | AWQ (`gemm`) | `qweight` i32 `[k, n/8]`, `qzeros` i32 `[G, n/8]`, `scales` `[G, n]` | unpacked along N in AWQ's nibble order; scales and zeros transposed |
//!
//! Zero points. Codes are always returned signed, `q − 2^(bits−1)` for a stored unsigned `q`,
//! so symmetric formats need nothing more. Asymmetric formats also return their zero points
//! `z` unsigned `[n, G]`, and the weight is `(q − z)·s = (code + 2^(bits−1) − z)·s`. GPTQ's
//! original ("v1") format stores `z − 1` (its quantizer subtracted one before packing and
//! every kernel adds it back, wrapping within the field's bits); `gptq_v2` stores `z` itself,
//! and so does AWQ. compressed-tensors quantizes to signed values and packs codes and zero
//! points alike with the offset `2^(bits−1)`, so its stored zero field is already the unsigned
//! `z` that goes with the unsigned code.
//!
//! Every size is checked against `config.json` (a disagreement is [`LayerError::ConfigMismatch`]
//! naming the config field), every derived shape against the format
//! ([`LayerError::WrongShape`]), every scale for being finite and non-negative.

use std::borrow::Cow;
use std::path::Path;

use moe_kernels::WordOrder;
use moe_quant::{DType, WeightGroups};

use super::config::QuantScheme;
use super::decode::{
    FLOAT_DTYPES, check_scales, f32_values, float_dtype, i32_words, int_values, safetensors_float,
};
use super::names::ParamKind;
use super::shards::{Dtype, TensorRef, TensorSource};
use crate::error::LayerError;

/// How the projections of a checkpoint are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Float weights.
    Float,
    /// compressed-tensors `int-quantized`: 4-bit (W4A8) or 8-bit (W8A8) codes stored as int8.
    IntQuantized {
        bits: u32,
        group_size: WeightGroups,
        scale_dtype: Option<DType>,
    },
    /// compressed-tensors `pack-quantized`; `zeros` when asymmetric.
    PackQuantized {
        bits: u32,
        group_size: WeightGroups,
        act_order: bool,
        scale_dtype: Option<DType>,
        zeros: bool,
    },
    /// GPTQ; `zeros` is `None` for symmetric checkpoints (their `qzeros` are not read).
    Gptq {
        bits: u32,
        group_size: WeightGroups,
        act_order: bool,
        zeros: Option<GptqZeros>,
    },
    /// AWQ `gemm`: 4-bit codes with zero points.
    Awq { group_size: WeightGroups },
    /// MXFP4 (gpt-oss): fused per layer, read by the reader's own path, never per projection.
    Mxfp4,
    /// FP8 (any scaling): read by `checkpoint::fp8`, not through the logical layout.
    Fp8,
}

/// How an asymmetric GPTQ checkpoint stores its zero points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GptqZeros {
    /// `checkpoint_format: gptq` (or none): the stored field is `z − 1`.
    MinusOne,
    /// `checkpoint_format: gptq_v2`: the stored field is `z`.
    Exact,
}

impl Format {
    /// The format of a scheme (every scheme the config parser accepts has one).
    pub(crate) fn from_scheme(scheme: &QuantScheme) -> Self {
        match *scheme {
            QuantScheme::Unquantized(_) => Self::Float,
            QuantScheme::CompressedTensorsW4A8 {
                group_size,
                scale_dtype,
                ..
            } => Self::IntQuantized {
                bits: 4,
                group_size,
                scale_dtype,
            },
            QuantScheme::CompressedTensorsW8A8 { scale_dtype, .. } => Self::IntQuantized {
                bits: 8,
                group_size: WeightGroups::Channelwise,
                scale_dtype,
            },
            QuantScheme::CompressedTensorsWna16 {
                bits,
                group_size,
                scale_dtype,
                symmetric,
                ..
            } => Self::PackQuantized {
                bits,
                group_size,
                act_order: scheme.has_act_order(),
                scale_dtype,
                zeros: !symmetric,
            },
            QuantScheme::Gptq {
                bits,
                group_size,
                desc_act,
                sym,
                ref checkpoint_format,
            } => Self::Gptq {
                bits,
                group_size,
                act_order: desc_act,
                zeros: (!sym).then_some(match checkpoint_format.as_deref() {
                    Some("gptq_v2") => GptqZeros::Exact,
                    _ => GptqZeros::MinusOne,
                }),
            },
            QuantScheme::Awq { group_size } => Self::Awq { group_size },
            QuantScheme::Mxfp4 => Self::Mxfp4,
            QuantScheme::Fp8 { .. } => Self::Fp8,
        }
    }

    /// The tensor whose presence identifies a projection in this format.
    pub(crate) fn primary(self) -> ParamKind {
        match self {
            Self::Float | Self::IntQuantized { .. } | Self::Mxfp4 | Self::Fp8 => ParamKind::Weight,
            Self::PackQuantized { .. } => ParamKind::WeightPacked,
            Self::Gptq { .. } | Self::Awq { .. } => ParamKind::QWeight,
        }
    }

    /// Bits per code (`None` for float weights).
    pub(crate) fn bits(self) -> Option<u32> {
        match self {
            Self::Float => None,
            Self::Awq { .. } | Self::Mxfp4 => Some(4),
            Self::IntQuantized { bits, .. } => Some(bits),
            Self::Fp8 => Some(8),
            Self::PackQuantized { bits, .. } | Self::Gptq { bits, .. } => Some(bits),
        }
    }

    /// Columns per scale group (`None` for float weights or channelwise scales).
    pub(crate) fn group_size(self) -> Option<usize> {
        match self {
            Self::Float | Self::Fp8 => None,
            Self::IntQuantized { group_size, .. }
            | Self::PackQuantized { group_size, .. }
            | Self::Gptq { group_size, .. }
            | Self::Awq { group_size } => group_size.group_size(),
            Self::Mxfp4 => Some(moe_kernels::packed::wna16::MXFP4_BLOCK),
        }
    }

    /// The scale grouping of integer weights (channelwise for float weights, which have none).
    pub(crate) fn groups(self) -> WeightGroups {
        match self {
            Self::IntQuantized { group_size, .. }
            | Self::PackQuantized { group_size, .. }
            | Self::Gptq { group_size, .. }
            | Self::Awq { group_size } => group_size,
            Self::Mxfp4 => moe_kernels::packed::wna16::MXFP4_GROUPS,
            Self::Float | Self::Fp8 => WeightGroups::Channelwise,
        }
    }

    /// Whether the projections carry zero points (asymmetric codes).
    pub(crate) fn has_zeros(self) -> bool {
        matches!(
            self,
            Self::Gptq { zeros: Some(_), .. }
                | Self::Awq { .. }
                | Self::PackQuantized { zeros: true, .. }
        )
    }

    /// Whether the projections carry act-order `g_idx`.
    pub(crate) fn act_order(self) -> bool {
        matches!(
            self,
            Self::PackQuantized {
                act_order: true,
                ..
            } | Self::Gptq {
                act_order: true,
                ..
            }
        )
    }

    fn declared_scale_dtype(self) -> Option<DType> {
        match self {
            Self::IntQuantized { scale_dtype, .. } | Self::PackQuantized { scale_dtype, .. } => {
                scale_dtype
            }
            _ => None,
        }
    }
}

/// A size the config implies, with the config field it comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dim {
    pub size: usize,
    pub field: &'static str,
}

/// What to read: the projection's module prefix and its expected `[n, k]`.
pub(crate) struct ProjRequest<'p> {
    /// Module prefix (`model.layers.0.mlp.experts.3.gate_proj`); tensor names append `.{suffix}`.
    pub prefix: &'p str,
    pub n: Dim,
    pub k: Dim,
    /// `config.json`, named in [`LayerError::ConfigMismatch`].
    pub config: &'p Path,
}

/// Decoded values of a projection.
pub(crate) enum Values<'a> {
    /// Float weights, bytes as stored.
    Float { dtype: Dtype, bytes: &'a [u8] },
    /// Signed integer codes: borrowed from the shard where it stores them as int8 already,
    /// else decoded.
    Codes(Cow<'a, [i8]>),
}

/// Decoded scales `[n, groups]` (f32, widened exactly from `dtype`).
pub(crate) struct Scales {
    pub values: Vec<f32>,
    pub groups: usize,
    pub dtype: DType,
}

/// One projection in logical `[n, k]` layout.
pub(crate) struct LogicalProj<'a> {
    pub n: usize,
    pub k: usize,
    pub values: Values<'a>,
    pub scales: Option<Scales>,
    pub g_idx: Option<Vec<i32>>,
    /// Unsigned zero points `[n, G]` of asymmetric formats (see the module docs).
    pub zeros: Option<Vec<u8>>,
    /// Bias `[n]`: dtype and bytes as stored.
    pub bias: Option<(Dtype, &'a [u8])>,
    /// The primary tensor (names the projection in errors).
    pub primary: TensorRef<'a>,
    /// The scale tensor, if any (names it in dtype errors).
    pub scale_tensor: Option<TensorRef<'a>>,
    /// The g_idx tensor, if any.
    pub g_idx_tensor: Option<TensorRef<'a>>,
}

fn name(prefix: &str, kind: ParamKind) -> String {
    format!("{prefix}.{}", kind.suffix())
}

/// Checks a 2-D tensor against `[rows, cols]` where each dim comes from a config field.
pub(crate) fn check_config_shape(
    t: &TensorRef<'_>,
    rows: Dim,
    cols: Dim,
    config: &Path,
) -> Result<(), LayerError> {
    if t.shape.len() != 2 {
        return t.expect_shape(&[rows.size, cols.size]);
    }
    for (dim, actual) in [rows, cols].into_iter().zip(t.shape.iter().copied()) {
        if dim.size != actual {
            return Err(config_mismatch(t, dim, actual, config));
        }
    }
    Ok(())
}

fn config_mismatch(t: &TensorRef<'_>, dim: Dim, actual: usize, config: &Path) -> LayerError {
    LayerError::ConfigMismatch {
        config: config.to_path_buf(),
        tensor: t.name.clone(),
        file: t.file.to_path_buf(),
        field: dim.field,
        config_value: dim.size,
        tensor_value: actual,
    }
}

/// Groups along `k` and the group size actually used (`k` for channelwise), rejecting a group
/// size that does not divide `k`.
pub(crate) fn groups_of(
    group_size: WeightGroups,
    k: usize,
    tensor: &str,
) -> Result<(usize, usize), LayerError> {
    match group_size {
        WeightGroups::Channelwise => Ok((1, k)),
        WeightGroups::Groups(g) if k.is_multiple_of(g.get()) => Ok((k / g, g.get())),
        WeightGroups::Groups(g) => Err(LayerError::GroupSizeNotDividing {
            tensor: tensor.to_string(),
            group_size: g.get(),
            k,
        }),
    }
}

/// Reads the scale tensor `[n, G]` (or, when `transposed`, GPTQ's `[G, n]`), checks dtype,
/// values and the declared dtype, and returns it as `[n, G]`.
fn read_scales(
    t: &TensorRef<'_>,
    n: usize,
    groups: usize,
    transposed: bool,
    declared: Option<DType>,
) -> Result<Scales, LayerError> {
    t.expect_dtype(FLOAT_DTYPES)?;
    if let Some(d) = declared.and_then(safetensors_float) {
        t.expect_dtype(&[d])?;
    }
    let shape_ok = if transposed {
        t.shape == [groups, n]
    } else {
        // Channelwise scales are `[n, 1]`; a few producers write `[n]`.
        t.shape == [n, groups] || (groups == 1 && t.shape == [n])
    };
    if !shape_ok {
        let expected = if transposed {
            vec![groups, n]
        } else {
            vec![n, groups]
        };
        return Err(LayerError::WrongShape {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            expected,
            actual: t.shape.to_vec(),
        });
    }
    let stored = f32_values(t)?;
    check_scales(t, &stored)?;
    let values = if transposed {
        let mut v = vec![0.0f32; n * groups];
        for (g, row) in stored.chunks_exact(n).enumerate() {
            for (c, &s) in row.iter().enumerate() {
                v[c * groups + g] = s;
            }
        }
        v
    } else {
        stored
    };
    Ok(Scales {
        values,
        groups,
        dtype: float_dtype(t.dtype).unwrap_or(DType::F32),
    })
}

/// Reads `g_idx` `[k]`, checking every entry is a group index below `groups`.
fn read_g_idx<'a>(
    src: &'a TensorSource,
    name: &str,
    k: usize,
    groups: usize,
) -> Result<(Vec<i32>, TensorRef<'a>), LayerError> {
    let t = src.get(name)?;
    t.expect_shape(&[k])?;
    let values = int_values(&t, &[Dtype::I32, Dtype::I64])?;
    if let Some(i) = values.iter().position(|&g| g < 0 || g >= groups as i64) {
        return Err(LayerError::BadGroupIndex {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            reason: format!("entry {i} = {} is outside 0..{groups}", values[i]),
        });
    }
    Ok((values.into_iter().map(|g| g as i32).collect(), t))
}

/// Reads the optional bias `[n]`.
fn read_bias<'a>(
    src: &'a TensorSource,
    prefix: &str,
    n: usize,
) -> Result<Option<(Dtype, &'a [u8])>, LayerError> {
    let bias_name = name(prefix, ParamKind::Bias);
    if !src.contains(&bias_name) {
        return Ok(None);
    }
    let t = src.get_as(&bias_name, FLOAT_DTYPES)?;
    t.expect_shape(&[n])?;
    Ok(Some((t.dtype, t.bytes)))
}

/// Reads one projection in `format`.
pub(crate) fn read_projection<'a>(
    src: &'a TensorSource,
    format: Format,
    req: &ProjRequest<'_>,
) -> Result<LogicalProj<'a>, LayerError> {
    let (n, k) = (req.n.size, req.k.size);
    let bias = read_bias(src, req.prefix, n)?;
    match format {
        // The reader takes MXFP4 layers through its fused-tensor path; a per-projection read
        // of one is a caller's mistake, reported rather than guessed at.
        Format::Mxfp4 => Err(LayerError::InvalidArgument {
            field: "format",
            reason: format!(
                "{}: MXFP4 experts are stored fused per layer, not per projection",
                req.prefix
            ),
        }),
        Format::Fp8 => Err(LayerError::UnsupportedScheme {
            file: req.config.to_path_buf(),
            scheme: "fp8".into(),
            reason: format!(
                "{}: FP8 experts are loaded by MoeLayer::from_checkpoint, not \
                 read into the fused integer layout",
                req.prefix
            ),
        }),
        Format::Float => {
            let t = src.get_as(&name(req.prefix, ParamKind::Weight), FLOAT_DTYPES)?;
            check_config_shape(&t, req.n, req.k, req.config)?;
            Ok(LogicalProj {
                n,
                k,
                values: Values::Float {
                    dtype: t.dtype,
                    bytes: t.bytes,
                },
                scales: None,
                g_idx: None,
                zeros: None,
                bias,
                primary: t,
                scale_tensor: None,
                g_idx_tensor: None,
            })
        }
        Format::IntQuantized {
            bits, group_size, ..
        } => {
            let t = src.get_as(&name(req.prefix, ParamKind::Weight), &[Dtype::I8])?;
            check_config_shape(&t, req.n, req.k, req.config)?;
            let codes: &[i8] = bytemuck::cast_slice(t.bytes);
            check_code_range(&t, codes, bits)?;
            let (groups, _) = groups_of(group_size, k, &t.name)?;
            let st = src.get(&name(req.prefix, ParamKind::WeightScale))?;
            let scales = read_scales(&st, n, groups, false, format.declared_scale_dtype())?;
            Ok(LogicalProj {
                n,
                k,
                values: Values::Codes(Cow::Borrowed(codes)),
                scales: Some(scales),
                g_idx: None,
                zeros: None,
                bias,
                primary: t,
                scale_tensor: Some(st),
                g_idx_tensor: None,
            })
        }
        Format::PackQuantized { bits, .. } => {
            let t = pack_quantized_words(src, bits, req)?;
            let codes =
                moe_quant::unpack_from_int32(&i32_words(&t)?, n, k, bits).map_err(|source| {
                    LayerError::Quant {
                        tensor: t.name.clone(),
                        file: t.file.to_path_buf(),
                        source,
                    }
                })?;
            let side = pack_quantized_side(src, format, req, &t)?;
            Ok(LogicalProj {
                n,
                k,
                values: Values::Codes(Cow::Owned(codes)),
                scales: Some(side.scales),
                g_idx: side.g_idx,
                zeros: side.zeros,
                bias,
                primary: t,
                scale_tensor: Some(side.scale_tensor),
                g_idx_tensor: side.g_idx_tensor,
            })
        }
        Format::Gptq { bits, .. } => {
            let t = gptq_words(src, bits, req)?;
            let codes = unpack_gptq(&i32_words(&t)?, k, n, bits);
            let side = gptq_side(src, format, req)?;
            Ok(LogicalProj {
                n,
                k,
                values: Values::Codes(Cow::Owned(codes)),
                scales: Some(side.scales),
                g_idx: side.g_idx,
                zeros: side.zeros,
                bias,
                primary: t,
                scale_tensor: Some(side.scale_tensor),
                g_idx_tensor: side.g_idx_tensor,
            })
        }
        Format::Awq { group_size } => {
            let (t, side) = awq_tensors(src, group_size, req)?;
            let q = unpack_awq(&i32_words(&t)?, k, n);
            let codes = q.into_iter().map(|q| (q as i8) - 8).collect();
            Ok(LogicalProj {
                n,
                k,
                values: Values::Codes(Cow::Owned(codes)),
                scales: Some(side.scales),
                g_idx: None,
                zeros: side.zeros,
                bias,
                primary: t,
                scale_tensor: Some(side.scale_tensor),
                g_idx_tensor: None,
            })
        }
    }
}

/// The scales `[n, G]`, act-order `g_idx` and zero points of a quantized projection.
struct Side<'a> {
    scales: Scales,
    scale_tensor: TensorRef<'a>,
    g_idx: Option<Vec<i32>>,
    g_idx_tensor: Option<TensorRef<'a>>,
    zeros: Option<Vec<u8>>,
}

/// compressed-tensors `pack-quantized`: checks `weight_shape` against the config and returns
/// `weight_packed` checked for dtype and shape `[n, ceil(k·b/32)]`.
fn pack_quantized_words<'a>(
    src: &'a TensorSource,
    bits: u32,
    req: &ProjRequest<'_>,
) -> Result<TensorRef<'a>, LayerError> {
    let (n, k) = (req.n.size, req.k.size);
    let shape_t = src.get(&name(req.prefix, ParamKind::WeightShape))?;
    shape_t.expect_shape(&[2])?;
    let stored = int_values(&shape_t, &[Dtype::I64, Dtype::I32])?;
    for (dim, &v) in [req.n, req.k].into_iter().zip(&stored) {
        if v != dim.size as i64 {
            return Err(config_mismatch(
                &shape_t,
                dim,
                usize::try_from(v).unwrap_or(usize::MAX),
                req.config,
            ));
        }
    }
    let t = src.get_as(&name(req.prefix, ParamKind::WeightPacked), &[Dtype::I32])?;
    let words = moe_quant::pack::packed_int32_cols(k, bits);
    if t.shape.len() == 2 && t.shape[0] != n {
        return Err(config_mismatch(&t, req.n, t.shape[0], req.config));
    }
    t.expect_shape(&[n, words])?;
    Ok(t)
}

/// compressed-tensors `pack-quantized`: the scales, `g_idx` (act-order) and zero points of the
/// projection whose `weight_packed` is `t`.
fn pack_quantized_side<'a>(
    src: &'a TensorSource,
    format: Format,
    req: &ProjRequest<'_>,
    t: &TensorRef<'_>,
) -> Result<Side<'a>, LayerError> {
    let Format::PackQuantized {
        bits,
        group_size,
        act_order,
        zeros,
        ..
    } = format
    else {
        return Err(LayerError::InvalidArgument {
            field: "format",
            reason: format!("{format:?} is not a pack-quantized format"),
        });
    };
    let (n, k) = (req.n.size, req.k.size);
    let (groups, _) = groups_of(group_size, k, &t.name)?;
    let st = src.get(&name(req.prefix, ParamKind::WeightScale))?;
    let scales = read_scales(&st, n, groups, false, format.declared_scale_dtype())?;
    let (g_idx, g_idx_tensor) = if act_order {
        let (g, gt) = read_g_idx(src, &name(req.prefix, ParamKind::WeightGIdx), k, groups)?;
        (Some(g), Some(gt))
    } else {
        (None, None)
    };
    let zeros = if zeros {
        let zt = src.get_as(&name(req.prefix, ParamKind::WeightZeroPoint), &[Dtype::I32])?;
        let rows = moe_quant::pack::packed_int32_cols(n, bits);
        zt.expect_shape(&[rows, groups])?;
        Some(unpack_rows_int32(&i32_words(&zt)?, n, groups, bits))
    } else {
        None
    };
    Ok(Side {
        scales,
        scale_tensor: st,
        g_idx,
        g_idx_tensor,
        zeros,
    })
}

/// GPTQ: `qweight` checked for dtype and shape `[k/pf, n]` (`k` a multiple of the pack factor).
fn gptq_words<'a>(
    src: &'a TensorSource,
    bits: u32,
    req: &ProjRequest<'_>,
) -> Result<TensorRef<'a>, LayerError> {
    let (n, k) = (req.n.size, req.k.size);
    let pf = (32 / bits) as usize;
    if !k.is_multiple_of(pf) {
        return Err(LayerError::ConfigField {
            file: req.config.to_path_buf(),
            field: req.k.field,
            reason: format!("{k} is not a multiple of the GPTQ pack factor {pf}"),
        });
    }
    let t = src.get_as(&name(req.prefix, ParamKind::QWeight), &[Dtype::I32])?;
    if t.shape.len() == 2 {
        if t.shape[1] != n {
            return Err(config_mismatch(&t, req.n, t.shape[1], req.config));
        }
        if t.shape[0] != k / pf {
            return Err(config_mismatch(&t, req.k, t.shape[0] * pf, req.config));
        }
    }
    t.expect_shape(&[k / pf, n])?;
    Ok(t)
}

/// GPTQ: the scales (stored `[G, n]`), `g_idx` (act-order) and zero points of a projection.
fn gptq_side<'a>(
    src: &'a TensorSource,
    format: Format,
    req: &ProjRequest<'_>,
) -> Result<Side<'a>, LayerError> {
    let Format::Gptq {
        bits,
        group_size,
        act_order,
        zeros,
    } = format
    else {
        return Err(LayerError::InvalidArgument {
            field: "format",
            reason: format!("{format:?} is not a GPTQ format"),
        });
    };
    let (n, k) = (req.n.size, req.k.size);
    let pf = (32 / bits) as usize;
    let (groups, _) = groups_of(group_size, k, &name(req.prefix, ParamKind::QWeight))?;
    let st = src.get(&name(req.prefix, ParamKind::Scales))?;
    let scales = read_scales(&st, n, groups, true, None)?;
    let (g_idx, g_idx_tensor) = if act_order {
        let (g, gt) = read_g_idx(src, &name(req.prefix, ParamKind::GIdx), k, groups)?;
        (Some(g), Some(gt))
    } else {
        (None, None)
    };
    let zeros = match zeros {
        None => None,
        Some(stored) => {
            let zt = src.get_as(&name(req.prefix, ParamKind::QZeros), &[Dtype::I32])?;
            if !n.is_multiple_of(pf) {
                return Err(LayerError::ConfigField {
                    file: req.config.to_path_buf(),
                    field: req.n.field,
                    reason: format!("{n} is not a multiple of the GPTQ pack factor {pf} (qzeros)"),
                });
            }
            zt.expect_shape(&[groups, n / pf])?;
            let add = u32::from(stored == GptqZeros::MinusOne);
            Some(unpack_gptq_zeros(&i32_words(&zt)?, groups, n, bits, add))
        }
    };
    Ok(Side {
        scales,
        scale_tensor: st,
        g_idx,
        g_idx_tensor,
        zeros,
    })
}

/// One int4 or int8 projection whose codes stay in the int32 words the checkpoint stores, for
/// [`moe_kernels::PackedWna16::pack_words`].
pub(crate) struct WordProj<'a> {
    /// Output channels.
    pub n: usize,
    /// Input features (the reduction dimension).
    pub k: usize,
    /// Bits per code (4 or 8).
    pub bits: u32,
    /// How the words are laid out: `[n, ceil(k·bits/32)]`, `[k·bits/32, n]` or AWQ's
    /// `[k, n/8]`.
    pub order: WordOrder,
    /// The words as stored (little-endian, borrowed from the shard).
    pub bytes: &'a [u8],
    /// Scales `[n, G]`.
    pub scales: Scales,
    /// Unsigned zero points `[n, G]` of asymmetric formats.
    pub zeros: Option<Vec<u8>>,
    /// Act-order group indices `[k]`, checked to lie in `0..G`.
    pub g_idx: Option<Vec<i32>>,
    /// The scale tensor (names it in errors).
    pub scale_tensor: TensorRef<'a>,
    /// The `g_idx` tensor, if any (names it in errors).
    pub g_idx_tensor: Option<TensorRef<'a>>,
}

impl Format {
    /// Whether [`read_projection_words`] reads this format: int4 or int8 codes packed in int32
    /// words (compressed-tensors `pack-quantized`, GPTQ, AWQ), with or without act-order.
    pub(crate) fn has_code_words(self) -> bool {
        matches!(
            self,
            Self::PackQuantized { bits: 4 | 8, .. }
                | Self::Gptq { bits: 4 | 8, .. }
                | Self::Awq { .. }
        )
    }
}

/// Reads one projection of a format with [`Format::has_code_words`] with the checks of
/// [`read_projection`], leaving the codes in their words (`None` for other formats). A bias is
/// refused: only layers without expert biases are packed from words.
pub(crate) fn read_projection_words<'a>(
    src: &'a TensorSource,
    format: Format,
    req: &ProjRequest<'_>,
) -> Result<Option<WordProj<'a>>, LayerError> {
    if !format.has_code_words() {
        return Ok(None);
    }
    let (n, k) = (req.n.size, req.k.size);
    if let Some((_, _)) = read_bias(src, req.prefix, n)? {
        return Err(LayerError::InvalidArgument {
            field: "bias",
            reason: format!("{}: expert biases are not packed from words", req.prefix),
        });
    }
    let (t, side, order, bits) = match format {
        Format::PackQuantized { bits, .. } => {
            if n == 0 || k == 0 {
                return Err(LayerError::InvalidArgument {
                    field: "weight_shape",
                    reason: format!("{}: [{n}, {k}] is empty", req.prefix),
                });
            }
            let t = pack_quantized_words(src, bits, req)?;
            let side = pack_quantized_side(src, format, req, &t)?;
            (t, side, WordOrder::ChannelMajor, bits)
        }
        Format::Gptq { bits, .. } => {
            let t = gptq_words(src, bits, req)?;
            (t, gptq_side(src, format, req)?, WordOrder::StepMajor, bits)
        }
        Format::Awq { group_size } => {
            let (t, side) = awq_tensors(src, group_size, req)?;
            (t, side, WordOrder::Awq, 4)
        }
        _ => return Ok(None),
    };
    Ok(Some(WordProj {
        n,
        k,
        bits,
        order,
        bytes: t.bytes,
        scales: side.scales,
        zeros: side.zeros,
        g_idx: side.g_idx,
        scale_tensor: side.scale_tensor,
        g_idx_tensor: side.g_idx_tensor,
    }))
}

/// AWQ: `qweight` checked for dtype and shape `[k, n/8]` against the config, with its scales
/// (stored `[G, n]`) and zero points (`qzeros` `[G, n/8]`, unpacked to `[n, G]`).
fn awq_tensors<'a>(
    src: &'a TensorSource,
    group_size: WeightGroups,
    req: &ProjRequest<'_>,
) -> Result<(TensorRef<'a>, Side<'a>), LayerError> {
    let (n, k) = (req.n.size, req.k.size);
    if !n.is_multiple_of(AWQ_PACK) {
        return Err(LayerError::ConfigField {
            file: req.config.to_path_buf(),
            field: req.n.field,
            reason: format!("{n} is not a multiple of the AWQ pack factor {AWQ_PACK}"),
        });
    }
    let words = n / AWQ_PACK;
    let t = src.get_as(&name(req.prefix, ParamKind::QWeight), &[Dtype::I32])?;
    if t.shape.len() == 2 {
        if t.shape[0] != k {
            return Err(config_mismatch(&t, req.k, t.shape[0], req.config));
        }
        if t.shape[1] != words {
            return Err(config_mismatch(
                &t,
                req.n,
                t.shape[1].saturating_mul(AWQ_PACK),
                req.config,
            ));
        }
    }
    t.expect_shape(&[k, words])?;
    let (groups, _) = groups_of(group_size, k, &t.name)?;
    let st = src.get(&name(req.prefix, ParamKind::Scales))?;
    let scales = read_scales(&st, n, groups, true, None)?;
    let zt = src.get_as(&name(req.prefix, ParamKind::QZeros), &[Dtype::I32])?;
    zt.expect_shape(&[groups, words])?;
    // Zero points share the codes' packing: `[G, n/8]` words → `[n, G]` values.
    let zeros = unpack_awq(&i32_words(&zt)?, groups, n);
    Ok((
        t,
        Side {
            scales,
            scale_tensor: st,
            g_idx: None,
            g_idx_tensor: None,
            zeros: Some(zeros),
        },
    ))
}

/// Values per AWQ int32 word.
const AWQ_PACK: usize = 8;

/// AWQ's `gemm` packing: the nibble (4-bit field index) holding column `8j + c` of word `j`
/// (the kernels' packer reads the same order).
const AWQ_FIELD_OF_COLUMN: [usize; AWQ_PACK] = moe_kernels::AWQ_FIELD_OF_CHANNEL;

/// Unpacks an AWQ tensor `[rows, n/8]` (qweight with `rows = k`, qzeros with `rows = G`)
/// into unsigned 4-bit values transposed to `[n, rows]`.
fn unpack_awq(words: &[i32], rows: usize, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n * rows];
    for (r, row) in words.chunks_exact(n / AWQ_PACK).enumerate().take(rows) {
        for (j, &w) in row.iter().enumerate() {
            let w = w as u32;
            for (c, &field) in AWQ_FIELD_OF_COLUMN.iter().enumerate() {
                out[(j * AWQ_PACK + c) * rows + r] = ((w >> (4 * field)) & 0xF) as u8;
            }
        }
    }
    out
}

/// Unpacks GPTQ `qzeros` `[G, n/pf]` (field `t` of word `[g][j]` = zero of column `j·pf + t`)
/// into unsigned zero points `[n, G]`, adding `add` within the field's bits (1 for the v1
/// format, which stores `z − 1`).
fn unpack_gptq_zeros(words: &[i32], groups: usize, n: usize, bits: u32, add: u32) -> Vec<u8> {
    let pf = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    let mut zeros = vec![0u8; n * groups];
    for (g, row) in words.chunks_exact(n / pf).enumerate().take(groups) {
        for (j, &w) in row.iter().enumerate() {
            let w = w as u32;
            for t in 0..pf {
                let z = (((w >> (bits as usize * t)) & mask) + add) & mask;
                zeros[(j * pf + t) * groups + g] = z as u8;
            }
        }
    }
    zeros
}

/// Unpacks compressed-tensors' zero points `[ceil(n·b/32), G]` (field `t` of word `[r][g]` =
/// row `r·pf + t`, padding fields past `n` ignored) into unsigned values `[n, G]`.
fn unpack_rows_int32(words: &[i32], n: usize, groups: usize, bits: u32) -> Vec<u8> {
    let pf = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    let mut out = vec![0u8; n * groups];
    for (r, row) in words.chunks_exact(groups).enumerate() {
        for (g, &w) in row.iter().enumerate() {
            for t in 0..pf {
                let c = r * pf + t;
                if c < n {
                    out[c * groups + g] = (((w as u32) >> (bits as usize * t)) & mask) as u8;
                }
            }
        }
    }
    out
}

/// Rejects the first code outside the signed range of `bits`.
fn check_code_range(t: &TensorRef<'_>, codes: &[i8], bits: u32) -> Result<(), LayerError> {
    let (min, max) = (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1);
    let (lo, hi) = (min.max(-128) as i8, max.min(127) as i8);
    if super::decode::all_branch_free(codes, |c| (c >= lo) & (c <= hi)) {
        return Ok(());
    }
    match codes
        .iter()
        .position(|&c| !(min..=max).contains(&i64::from(c)))
    {
        None => Ok(()),
        Some(index) => Err(LayerError::CodeOutOfRange {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            index,
            value: i64::from(codes[index]),
            min,
            max,
        }),
    }
}

/// Unpacks GPTQ `qweight` `[k/pf, n]` (field `t` of word `[r][c]` = code of row `r·pf + t`,
/// column `c`; stored with the symmetric offset `2^(bits−1)`) into signed codes `[n, k]`.
fn unpack_gptq(words: &[i32], k: usize, n: usize, bits: u32) -> Vec<i8> {
    let pf = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    let offset = 1i32 << (bits - 1);
    let mut codes = vec![0i8; n * k];
    for (r, row) in words.chunks_exact(n).enumerate() {
        for (c, &w) in row.iter().enumerate() {
            let w = w as u32;
            for t in 0..pf {
                let q = ((w >> (bits as usize * t)) & mask) as i32;
                codes[c * k + r * pf + t] = (q - offset) as i8;
            }
        }
    }
    codes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gptq_unpack_reads_fields_along_k() {
        // k = 8, n = 2, 4-bit: column 0 holds codes 0..8 (values -8..-1), column 1 holds 15..8.
        let col0: u32 = (0..8).fold(0, |w, t| w | (t << (4 * t)));
        let col1: u32 = (0..8).fold(0, |w, t| w | ((15 - t) << (4 * t)));
        let codes = unpack_gptq(&[col0 as i32, col1 as i32], 8, 2, 4);
        assert_eq!(&codes[..8], &[-8, -7, -6, -5, -4, -3, -2, -1]);
        assert_eq!(&codes[8..], &[7, 6, 5, 4, 3, 2, 1, 0]);
        // 8-bit: 4 codes per word.
        let w: u32 = 0x80_81_7F_00;
        assert_eq!(unpack_gptq(&[w as i32], 4, 1, 8), [-128, -1, 1, 0]);
    }

    #[test]
    fn awq_unpack_follows_the_gemm_field_order() {
        // One word holding columns 0..8: column c is written to field [0,4,1,5,2,6,3,7][c].
        let word: u32 = [0u32, 4, 1, 5, 2, 6, 3, 7]
            .iter()
            .enumerate()
            .fold(0, |w, (c, &f)| w | ((c as u32 + 1) << (4 * f)));
        assert_eq!(unpack_awq(&[word as i32], 1, 8), [1, 2, 3, 4, 5, 6, 7, 8]);
        // Two rows: the output is transposed to [n, rows].
        let rows = [0x7654_3210u32 as i32, 0xFEDC_BA98u32 as i32];
        let v = unpack_awq(&rows, 2, 8);
        // Field f of row 0 holds f, of row 1 holds 8 + f; column c sits in field FIELD[c].
        for c in 0..8 {
            let f = AWQ_FIELD_OF_COLUMN[c] as u8;
            assert_eq!(v[c * 2], f);
            assert_eq!(v[c * 2 + 1], 8 + f);
        }
    }

    #[test]
    fn gptq_zeros_unpack_along_n_with_the_v1_offset() {
        // 4-bit, n = 8, one group: stored fields 0..8, and 15 wraps to 0 with the v1 offset.
        let w: u32 = (0..8).fold(0, |w, t| w | ((if t == 7 { 15 } else { t }) << (4 * t)));
        assert_eq!(
            unpack_gptq_zeros(&[w as i32], 1, 8, 4, 0),
            [0, 1, 2, 3, 4, 5, 6, 15]
        );
        assert_eq!(
            unpack_gptq_zeros(&[w as i32], 1, 8, 4, 1),
            [1, 2, 3, 4, 5, 6, 7, 0]
        );
    }
}
