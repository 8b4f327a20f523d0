//! FP8 checkpoints: the `quantization_config` (vLLM's `quant_method: fp8`, or compressed-tensors
//! `float-quantized`) and one expert's projections.
//!
//! Each projection stores `weight` as e4m3fn bytes `[n, k]` (safetensors `F8_E4M3`) and scales
//! that multiply: the weight at `[r, c]` is `e4m3(weight[r, c])` times the scale of its
//! `128 × 128` block, of its channel or of the whole tensor (the quantizer stored `amax/448` of
//! each). Block scales are `weight_scale_inv` `[ceil(n/128), ceil(k/128)]` under
//! `quant_method: fp8` (despite the name) and `weight_scale` under compressed-tensors; the last
//! block row and column may be short. Channel scales are `weight_scale` `[n, 1]`, tensor scales
//! `weight_scale` of one value.
//!
//! The codes are handed to the packer as they are stored (borrowed from the shard when nothing
//! is sliced), with their scales, so the layer never widens a weight. Per-tensor scales stay
//! per projection: vLLM's GPU kernels need one scale for gate and up together and requantize
//! both to the larger one at load, which moves their weights by up to half an e4m3 step; here
//! each weight keeps its checkpoint value. The checkpoint's fp8 activation quantization
//! (dynamic per token or block, or static with an `input_scale` per projection) is what GPUs
//! do; here activations stay in float (f32 compute), which is the dequantized model's
//! arithmetic without the activations' rounding, and static `input_scale`s are not read.
//!
//! Tensor parallelism slices the intermediate dimension: rows of the gate and up projections,
//! columns of the down projection. With block scales a slice must start and end on block
//! boundaries (the per-rank intermediate size a multiple of 128), so that its scales are whole
//! block rows or columns; anything else is a [`LayerError::TensorParallel`]. Channel and tensor
//! scales slice anywhere.

use std::borrow::Cow;
use std::path::Path;

use moe_kernels::{FP8_BLOCK, Fp8Scales};
use moe_quant::QuantizationScheme;
use moe_quant::ct_args::{QuantizationStrategy, QuantizationType};

use super::config::Fp8Source;
use super::decode::{all_branch_free, check_scales, f32_values};
use super::formats::{Dim, check_config_shape};
use super::names::ShardId;
use super::read::Checkpoint;
use super::shards::{Dtype, TensorRef};
use crate::Fp8Scaling;
use crate::error::LayerError;

/// The block shape every FP8 checkpoint here must declare.
const BLOCK: [u64; 2] = [FP8_BLOCK as u64, FP8_BLOCK as u64];

/// Normalizes an fp8 `quantization_config` (vLLM's `Fp8Config`): `weight_block_size`
/// `[128, 128]` (block scales, `activation_scheme: dynamic`) or absent (AutoFP8's per-tensor
/// scales, activations `dynamic` or `static`; static `input_scale`s are not read, as the
/// activations run in float), `fmt` absent or `e4m3`. Other block shapes are refused.
pub(super) fn fp8_scheme(
    file: &Path,
    qc: &serde_json::Value,
) -> Result<super::QuantScheme, LayerError> {
    let refuse = |reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme: "fp8".into(),
        reason,
    };
    let scaling = match qc.get("weight_block_size") {
        None | Some(serde_json::Value::Null) => Fp8Scaling::Tensor,
        Some(v) => {
            let block: Option<Vec<u64>> = v
                .as_array()
                .map(|a| a.iter().map(serde_json::Value::as_u64).collect())
                .and_then(|b: Option<Vec<u64>>| b);
            if block.as_deref() != Some(&BLOCK[..]) {
                return Err(refuse(format!(
                    "weight_block_size {v}: only [128, 128] blocks (or per-tensor scales, \
                     without weight_block_size) are supported"
                )));
            }
            Fp8Scaling::Blocks
        }
    };
    let activations = qc
        .get("activation_scheme")
        .and_then(serde_json::Value::as_str);
    let static_activations = match (activations, scaling) {
        (Some("dynamic"), _) => false,
        (Some("static"), Fp8Scaling::Tensor) => true,
        _ => {
            return Err(refuse(format!(
                "activation_scheme {} with {} scales: dynamic is supported, and static with \
                 per-tensor scales (activations run in float)",
                qc.get("activation_scheme")
                    .map_or_else(|| "absent".to_string(), ToString::to_string),
                scaling.name()
            )));
        }
    };
    if let Some(fmt) = qc.get("fmt")
        && fmt.as_str() != Some("e4m3")
    {
        return Err(refuse(format!("fmt {fmt}: only e4m3 is supported")));
    }
    let mut ignored = Vec::new();
    for field in ["ignored_layers", "modules_to_not_convert"] {
        match qc.get(field) {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(a)) => {
                for m in a {
                    match m.as_str() {
                        Some(s) => ignored.push(s.to_string()),
                        None => {
                            return Err(LayerError::ConfigField {
                                file: file.to_path_buf(),
                                field,
                                reason: format!("entries must be strings, got {m}"),
                            });
                        }
                    }
                }
            }
            Some(other) => {
                return Err(LayerError::ConfigField {
                    file: file.to_path_buf(),
                    field,
                    reason: format!("must be a list of module names, got {other}"),
                });
            }
        }
    }
    Ok(super::QuantScheme::Fp8 {
        scaling,
        source: Fp8Source::QuantMethodFp8,
        static_activations,
        ignored,
    })
}

/// Normalizes the config group of a compressed-tensors `float-quantized` checkpoint (the
/// `FP8`, `FP8_DYNAMIC` and `FP8_BLOCK` presets, and weight-only fp8): 8-bit symmetric float
/// weights with static scales per tensor, channel or `[128, 128]` block; input activations
/// absent, or 8-bit floats (dynamic per token or group, or static per tensor, whose
/// `input_scale`s are not read: the activations run in float).
pub(super) fn compressed_tensors_fp8(
    file: &Path,
    group_name: &str,
    group: &QuantizationScheme,
    ignore: &[String],
) -> Result<super::QuantScheme, LayerError> {
    let refuse = |reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme: "compressed-tensors/float-quantized".into(),
        reason: format!("{group_name}: {reason}"),
    };
    let Some(w) = group.weights.as_ref() else {
        return Err(refuse("the group quantizes no weights".into()));
    };
    if w.kind != QuantizationType::Float || w.num_bits != 8 {
        return Err(refuse(format!(
            "weights are {}-bit {:?}; float-quantized experts are read as 8-bit floats (e4m3)",
            w.num_bits, w.kind
        )));
    }
    if !w.symmetric {
        return Err(refuse("asymmetric fp8 weights are not supported".into()));
    }
    if w.dynamic.is_truthy() {
        return Err(refuse("dynamic weight scales are not supported".into()));
    }
    let scaling = match w.effective_strategy() {
        QuantizationStrategy::Tensor => Fp8Scaling::Tensor,
        QuantizationStrategy::Channel => Fp8Scaling::Channels,
        QuantizationStrategy::Block
            if w.block_structure.as_deref() == Some(&[BLOCK[0] as i64, BLOCK[1] as i64][..]) =>
        {
            Fp8Scaling::Blocks
        }
        QuantizationStrategy::Block => {
            return Err(refuse(format!(
                "block_structure {:?}: only [128, 128] blocks are supported",
                w.block_structure.as_deref().unwrap_or_default()
            )));
        }
        other => {
            return Err(refuse(format!(
                "weight strategy {other:?}: fp8 weights are read per tensor, channel or block"
            )));
        }
    };
    let static_activations = match group.input_activations.as_ref() {
        None => false,
        Some(a) if a.kind != QuantizationType::Float || a.num_bits != 8 => {
            return Err(refuse(format!(
                "input activations are {}-bit {:?}; with fp8 weights they must be 8-bit floats \
                 or absent",
                a.num_bits, a.kind
            )));
        }
        Some(a) => !a.dynamic.is_truthy(),
    };
    Ok(super::QuantScheme::Fp8 {
        scaling,
        source: Fp8Source::CompressedTensors,
        static_activations,
        ignored: ignore.to_vec(),
    })
}

/// One projection of one expert, sliced for this rank: `n` output channels, `k` input columns.
pub(crate) struct Fp8Proj<'a> {
    /// Output channels.
    pub(crate) n: usize,
    /// Input columns (the reduction dimension).
    pub(crate) k: usize,
    /// e4m3fn codes `[n, k]`, borrowed from the shard unless columns were sliced.
    pub(crate) codes: Cow<'a, [u8]>,
    /// The scales, widened to f32, as `scaling` lays them out: `[ceil(n/128), ceil(k/128)]`
    /// blocks, `[n]` channels, or one value.
    pub(crate) scales: Vec<f32>,
    /// How the scales are laid out.
    pub(crate) scaling: Fp8Scaling,
}

impl Fp8Proj<'_> {
    /// The scales as the packer takes them.
    pub(crate) fn kernel_scales(&self) -> Fp8Scales<'_> {
        match self.scaling {
            Fp8Scaling::Blocks => Fp8Scales::Blocks(&self.scales),
            Fp8Scaling::Channels => Fp8Scales::Channels(&self.scales),
            Fp8Scaling::Tensor => Fp8Scales::Tensor(self.scales[0]),
        }
    }
}

/// One expert's projections: gate and up (the rows `0..I` and `I..2I` of `w13`), and down.
pub(crate) struct Fp8Expert<'a> {
    /// Gate, then up.
    pub(crate) w13: [Fp8Proj<'a>; 2],
    /// Down.
    pub(crate) w2: Fp8Proj<'a>,
}

/// A set of experts read together: the routed experts of a layer, or its shared MLP.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fp8Group {
    /// Routed experts.
    Routed,
    /// The shared experts, fused into one MLP.
    Shared,
}

impl Checkpoint {
    /// Reads expert `expert` (global id; ignored for the shared group) of `layer` from an FP8
    /// block-quantized checkpoint, for rank `tp_rank` of `tp_size`: every tensor checked (dtype,
    /// shape against `config.json`, NaN codes, finite non-negative scales) and sliced.
    pub(crate) fn read_fp8_expert(
        &self,
        layer: usize,
        expert: usize,
        group: Fp8Group,
        (tp_rank, tp_size): (usize, usize),
    ) -> Result<Fp8Expert<'_>, LayerError> {
        let spec = self.spec();
        let intermediate = match group {
            Fp8Group::Routed => Dim {
                size: spec.intermediate,
                field: spec.family.intermediate_field(),
            },
            Fp8Group::Shared => Dim {
                size: spec.shared_experts.map_or(0, |s| s.intermediate),
                field: spec.family.shared_intermediate_field(),
            },
        };
        let hidden = Dim {
            size: spec.hidden,
            field: "hidden_size",
        };
        let tp_err = |reason: String| LayerError::TensorParallel {
            tp_rank,
            tp_size,
            reason,
        };
        if tp_size == 0 || tp_rank >= tp_size {
            return Err(tp_err("tp_rank must lie in 0..tp_size".into()));
        }
        let full = intermediate.size;
        if !full.is_multiple_of(tp_size) {
            return Err(tp_err(format!(
                "{} = {full} is not divisible by tp_size",
                intermediate.field
            )));
        }
        let local = full / tp_size;
        let blocks = matches!(
            spec.quant,
            super::QuantScheme::Fp8 {
                scaling: Fp8Scaling::Blocks,
                ..
            }
        );
        if blocks && tp_size > 1 && !local.is_multiple_of(FP8_BLOCK) {
            return Err(tp_err(format!(
                "the per-rank {} {local} is not a multiple of the fp8 block size {FP8_BLOCK}, so \
                 the slice would split scale blocks",
                intermediate.field
            )));
        }
        let slice = tp_rank * local..(tp_rank + 1) * local;
        let read = |shard: ShardId| -> Result<Fp8Proj<'_>, LayerError> {
            let prefix = self.fp8_prefix(layer, expert, group, shard)?;
            let (n, k) = match shard {
                ShardId::W1 | ShardId::W3 => (intermediate, hidden),
                ShardId::W2 => (hidden, intermediate),
            };
            let p = self.read_fp8_proj(&prefix, n, k)?;
            Ok(match shard {
                ShardId::W1 | ShardId::W3 => slice_rows(p, slice.clone()),
                ShardId::W2 => slice_cols(p, slice.clone()),
            })
        };
        Ok(Fp8Expert {
            w13: [read(ShardId::W1)?, read(ShardId::W3)?],
            w2: read(ShardId::W2)?,
        })
    }

    /// The module prefix of one projection: the first candidate spelling whose `weight`
    /// exists, else the preferred one (so that the missing-tensor error names it).
    fn fp8_prefix(
        &self,
        layer: usize,
        expert: usize,
        group: Fp8Group,
        shard: ShardId,
    ) -> Result<String, LayerError> {
        let candidates = match group {
            Fp8Group::Routed => self.names().expert_projection(layer, expert, shard),
            Fp8Group::Shared => self
                .names()
                .shared_projection(layer, shard)
                .into_iter()
                .collect(),
        };
        candidates
            .iter()
            .find(|p| self.source().contains(&format!("{p}.weight")))
            .or(candidates.first())
            .cloned()
            .ok_or_else(|| LayerError::InvalidArgument {
                field: "shared_experts",
                reason: format!("layer {layer}: the family names no shared expert tensors"),
            })
    }

    /// Reads and checks one whole projection `[n, k]`: the e4m3 `weight` and its scale tensor,
    /// whose name and shape the scheme gives (`[ceil(n/128), ceil(k/128)]` blocks, `[n, 1]` or
    /// `[n]` channels, `[]` or `[1]` for a tensor), f32, bf16 or f16.
    fn read_fp8_proj(&self, prefix: &str, n: Dim, k: Dim) -> Result<Fp8Proj<'_>, LayerError> {
        let src = self.source();
        let spec = self.spec();
        let config = &spec.config_path;
        let super::QuantScheme::Fp8 {
            scaling, source, ..
        } = spec.quant
        else {
            return Err(LayerError::UnsupportedScheme {
                file: config.clone(),
                scheme: spec.quant.name().into(),
                reason: "the fp8 reader reads fp8 checkpoints only".into(),
            });
        };
        let bias = format!("{prefix}.bias");
        if src.contains(&bias) {
            let t = src.get(&bias)?;
            return Err(LayerError::UnsupportedScheme {
                file: t.file.to_path_buf(),
                scheme: spec.quant.name().into(),
                reason: format!("{bias}: expert biases are not read with fp8 weights"),
            });
        }
        let w = src.get_as(&format!("{prefix}.weight"), &[Dtype::F8_E4M3])?;
        check_config_shape(&w, n, k, config)?;
        let s = src.get_as(
            &format!("{prefix}.{}", source.scale_tensor(scaling)),
            &[Dtype::F32, Dtype::BF16, Dtype::F16],
        )?;
        match scaling {
            Fp8Scaling::Blocks => {
                s.expect_shape(&[n.size.div_ceil(FP8_BLOCK), k.size.div_ceil(FP8_BLOCK)])?;
            }
            Fp8Scaling::Channels if s.shape.len() == 1 => s.expect_shape(&[n.size])?,
            Fp8Scaling::Channels => s.expect_shape(&[n.size, 1])?,
            Fp8Scaling::Tensor if s.shape.is_empty() => {}
            Fp8Scaling::Tensor => s.expect_shape(&[1])?,
        }
        let scales = f32_values(&s)?;
        check_scales(&s, &scales)?;
        check_codes(&w)?;
        Ok(Fp8Proj {
            n: n.size,
            k: k.size,
            codes: Cow::Borrowed(w.bytes),
            scales,
            scaling,
        })
    }
}

/// Refuses the NaN codes of e4m3fn (`0x7F`, `0xFF`; the format has no infinities).
fn check_codes(t: &TensorRef<'_>) -> Result<(), LayerError> {
    let nan = |b: u8| b & 0x7F == 0x7F;
    if all_branch_free(t.bytes, |b| !nan(b)) {
        return Ok(());
    }
    match t.bytes.iter().position(|&b| nan(b)) {
        Some(index) => Err(LayerError::NonFinite {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            index,
            value: f32::NAN,
        }),
        None => Ok(()),
    }
}

/// Keeps output rows `rows` (block-aligned for block scales, or all of them) and their scales.
fn slice_rows(p: Fp8Proj<'_>, rows: std::ops::Range<usize>) -> Fp8Proj<'_> {
    if rows == (0..p.n) {
        return p;
    }
    let scales = match p.scaling {
        Fp8Scaling::Blocks => {
            let kb = p.k.div_ceil(FP8_BLOCK);
            let blocks = rows.start / FP8_BLOCK..rows.end.div_ceil(FP8_BLOCK);
            p.scales[blocks.start * kb..blocks.end * kb].to_vec()
        }
        Fp8Scaling::Channels => p.scales[rows.clone()].to_vec(),
        Fp8Scaling::Tensor => p.scales,
    };
    let codes = match p.codes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[rows.start * p.k..rows.end * p.k]),
        Cow::Owned(v) => Cow::Owned(v[rows.start * p.k..rows.end * p.k].to_vec()),
    };
    Fp8Proj {
        n: rows.len(),
        k: p.k,
        codes,
        scales,
        scaling: p.scaling,
    }
}

/// Keeps input columns `cols` (block-aligned for block scales, or all of them); channel and
/// tensor scales do not depend on the column.
fn slice_cols(p: Fp8Proj<'_>, cols: std::ops::Range<usize>) -> Fp8Proj<'_> {
    if cols == (0..p.k) {
        return p;
    }
    let mut codes = Vec::with_capacity(p.n * cols.len());
    for row in p.codes.chunks_exact(p.k) {
        codes.extend_from_slice(&row[cols.clone()]);
    }
    let scales = match p.scaling {
        Fp8Scaling::Blocks => {
            let kb = p.k.div_ceil(FP8_BLOCK);
            let blocks = cols.start / FP8_BLOCK..cols.end.div_ceil(FP8_BLOCK);
            p.scales
                .chunks_exact(kb)
                .flat_map(|r| r[blocks.clone()].iter().copied())
                .collect()
        }
        Fp8Scaling::Channels | Fp8Scaling::Tensor => p.scales,
    };
    Fp8Proj {
        n: p.n,
        k: cols.len(),
        codes: Cow::Owned(codes),
        scales,
        scaling: p.scaling,
    }
}

/// What [`Checkpoint::check_fp8_layer`] found: one FP8 layer's sizes on this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fp8LayerInfo {
    /// Decoder layer index.
    pub layer: usize,
    /// Global expert id of each local expert, in local-id order.
    pub local_experts: Vec<usize>,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Intermediate size per tensor-parallel rank.
    pub intermediate: usize,
    /// Router weight values (`E·H`).
    pub router_values: usize,
    /// Whether shared experts were read.
    pub shared_experts: bool,
}

impl Checkpoint {
    /// Reads and checks every tensor of FP8 layer `layer` that `opts` selects (router, local
    /// experts, shared experts) one expert at a time, keeping none: FP8 experts are not read
    /// into [`super::MoeLayerTensors`] (the layer packs them as it reads them), so this is the
    /// whole-layer check of such a checkpoint. Other schemes are refused.
    pub fn check_fp8_layer(
        &self,
        layer: usize,
        opts: &super::ReadOptions<'_>,
    ) -> Result<Fp8LayerInfo, LayerError> {
        let spec = self.spec();
        if !matches!(spec.quant, super::QuantScheme::Fp8 { .. }) {
            return Err(LayerError::UnsupportedScheme {
                file: spec.config_path.clone(),
                scheme: spec.quant.name().into(),
                reason: "check_fp8_layer reads fp8 checkpoints; use read_layer".into(),
            });
        }
        let (router, local_experts) = self.read_layer_head(layer, opts)?;
        let tp = (opts.tp_rank, opts.tp_size);
        let mut intermediate = spec.intermediate / tp.1.max(1);
        for &e in &local_experts {
            let ex = self.read_fp8_expert(layer, e, Fp8Group::Routed, tp)?;
            intermediate = ex.w2.k;
        }
        let shared_experts = opts.shared_experts && spec.shared_experts.is_some();
        if shared_experts {
            self.read_fp8_expert(layer, 0, Fp8Group::Shared, tp)?;
        }
        Ok(Fp8LayerInfo {
            layer,
            local_experts,
            hidden: spec.hidden,
            intermediate,
            router_values: router.weight.len(),
            shared_experts,
        })
    }
}
