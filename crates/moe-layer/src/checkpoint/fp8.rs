//! FP8 block-quantized checkpoints (`quant_method: fp8` with `weight_block_size: [128, 128]`):
//! the `quantization_config` and one expert's projections.
//!
//! Each projection stores `weight` as e4m3fn bytes `[n, k]` (safetensors `F8_E4M3`) and
//! `weight_scale_inv` as f32 `[ceil(n/128), ceil(k/128)]`; despite its name the scale
//! multiplies: the weight at `[r, c]` is `e4m3(weight[r, c])·weight_scale_inv[r/128][c/128]`
//! (the quantizer stored `amax/448` per block). The last block row and column may be short.
//!
//! The codes are handed to the packer as they are stored (borrowed from the shard when nothing
//! is sliced), with their block scales, so the layer never widens a weight. The checkpoint's
//! `activation_scheme: dynamic` quantizes activations to fp8 per token and block on GPUs; here
//! activations stay in float (f32 compute), which is the dequantized model's arithmetic with
//! one rounding less.
//!
//! Tensor parallelism slices the intermediate dimension: rows of the gate and up projections,
//! columns of the down projection. A slice must start and end on block boundaries (the per-rank
//! intermediate size a multiple of 128), so that its scales are whole block rows or columns;
//! anything else is a [`LayerError::TensorParallel`].

use std::borrow::Cow;
use std::path::Path;

use moe_kernels::FP8_BLOCK;

use super::decode::{check_scales, f32_values};
use super::formats::{Dim, check_config_shape};
use super::names::ShardId;
use super::read::Checkpoint;
use super::shards::{Dtype, TensorRef};
use crate::error::LayerError;

/// The block shape every FP8 checkpoint here must declare.
const BLOCK: [u64; 2] = [FP8_BLOCK as u64, FP8_BLOCK as u64];

/// Normalizes an fp8 `quantization_config`: `weight_block_size` must be `[128, 128]` (per-tensor
/// and per-channel fp8 are other formats), `activation_scheme` `dynamic` (static activation
/// scales are not read), `fmt` absent or `e4m3`.
pub(super) fn fp8_scheme(
    file: &Path,
    qc: &serde_json::Value,
) -> Result<super::QuantScheme, LayerError> {
    let refuse = |reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme: "fp8".into(),
        reason,
    };
    match qc.get("weight_block_size") {
        None | Some(serde_json::Value::Null) => {
            return Err(refuse(
                "no weight_block_size: only block-quantized fp8 ([128, 128]) is supported".into(),
            ));
        }
        Some(v) => {
            let block: Option<Vec<u64>> = v
                .as_array()
                .map(|a| a.iter().map(serde_json::Value::as_u64).collect())
                .and_then(|b: Option<Vec<u64>>| b);
            if block.as_deref() != Some(&BLOCK[..]) {
                return Err(refuse(format!(
                    "weight_block_size {v}: only [128, 128] is supported"
                )));
            }
        }
    }
    let scheme = qc
        .get("activation_scheme")
        .and_then(serde_json::Value::as_str);
    if scheme != Some("dynamic") {
        return Err(refuse(format!(
            "activation_scheme {}: only dynamic is supported (activations run in float)",
            qc.get("activation_scheme")
                .map_or_else(|| "absent".to_string(), ToString::to_string)
        )));
    }
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
    Ok(super::QuantScheme::Fp8Block { ignored })
}

/// One projection of one expert, sliced for this rank: `n` output channels, `k` input columns.
pub(crate) struct Fp8Proj<'a> {
    /// Output channels.
    pub(crate) n: usize,
    /// Input columns (the reduction dimension).
    pub(crate) k: usize,
    /// e4m3fn codes `[n, k]`, borrowed from the shard unless columns were sliced.
    pub(crate) codes: Cow<'a, [u8]>,
    /// Block scales `[ceil(n/128), ceil(k/128)]`, widened to f32.
    pub(crate) scales: Vec<f32>,
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
                field: match spec.family {
                    super::ModelFamily::Mixtral => "intermediate_size",
                    _ => "moe_intermediate_size",
                },
            },
            Fp8Group::Shared => Dim {
                size: spec.shared_experts.map_or(0, |s| s.intermediate),
                field: match spec.family {
                    super::ModelFamily::Qwen2Moe => "shared_expert_intermediate_size",
                    _ => "n_shared_experts",
                },
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
        if tp_size > 1 && !local.is_multiple_of(FP8_BLOCK) {
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

    /// Reads and checks one whole projection `[n, k]`.
    fn read_fp8_proj(&self, prefix: &str, n: Dim, k: Dim) -> Result<Fp8Proj<'_>, LayerError> {
        let src = self.source();
        let config = &self.spec().config_path;
        let bias = format!("{prefix}.bias");
        if src.contains(&bias) {
            let t = src.get(&bias)?;
            return Err(LayerError::UnsupportedScheme {
                file: t.file.to_path_buf(),
                scheme: "fp8".into(),
                reason: format!("{bias}: expert biases are not read with fp8 weights"),
            });
        }
        let w = src.get_as(&format!("{prefix}.weight"), &[Dtype::F8_E4M3])?;
        check_config_shape(&w, n, k, config)?;
        let s = src.get_as(
            &format!("{prefix}.weight_scale_inv"),
            &[Dtype::F32, Dtype::BF16],
        )?;
        let (nb, kb) = (n.size.div_ceil(FP8_BLOCK), k.size.div_ceil(FP8_BLOCK));
        s.expect_shape(&[nb, kb])?;
        let scales = f32_values(&s)?;
        check_scales(&s, &scales)?;
        check_codes(&w)?;
        Ok(Fp8Proj {
            n: n.size,
            k: k.size,
            codes: Cow::Borrowed(w.bytes),
            scales,
        })
    }
}

/// Refuses the NaN codes of e4m3fn (`0x7F`, `0xFF`; the format has no infinities).
fn check_codes(t: &TensorRef<'_>) -> Result<(), LayerError> {
    match t.bytes.iter().position(|&b| b & 0x7F == 0x7F) {
        Some(index) => Err(LayerError::NonFinite {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            index,
            value: f32::NAN,
        }),
        None => Ok(()),
    }
}

/// Keeps output rows `rows` (block-aligned, or all of them).
fn slice_rows(p: Fp8Proj<'_>, rows: std::ops::Range<usize>) -> Fp8Proj<'_> {
    if rows == (0..p.n) {
        return p;
    }
    let kb = p.k.div_ceil(FP8_BLOCK);
    let blocks = rows.start / FP8_BLOCK..rows.end.div_ceil(FP8_BLOCK);
    let codes = match p.codes {
        Cow::Borrowed(b) => Cow::Borrowed(&b[rows.start * p.k..rows.end * p.k]),
        Cow::Owned(v) => Cow::Owned(v[rows.start * p.k..rows.end * p.k].to_vec()),
    };
    Fp8Proj {
        n: rows.len(),
        k: p.k,
        codes,
        scales: p.scales[blocks.start * kb..blocks.end * kb].to_vec(),
    }
}

/// Keeps input columns `cols` (block-aligned, or all of them).
fn slice_cols(p: Fp8Proj<'_>, cols: std::ops::Range<usize>) -> Fp8Proj<'_> {
    if cols == (0..p.k) {
        return p;
    }
    let kb = p.k.div_ceil(FP8_BLOCK);
    let blocks = cols.start / FP8_BLOCK..cols.end.div_ceil(FP8_BLOCK);
    let mut codes = Vec::with_capacity(p.n * cols.len());
    for row in p.codes.chunks_exact(p.k) {
        codes.extend_from_slice(&row[cols.clone()]);
    }
    let scales = p
        .scales
        .chunks_exact(kb)
        .flat_map(|r| r[blocks.clone()].iter().copied())
        .collect();
    Fp8Proj {
        n: p.n,
        k: cols.len(),
        codes: Cow::Owned(codes),
        scales,
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
        if !matches!(spec.quant, super::QuantScheme::Fp8Block { .. }) {
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
