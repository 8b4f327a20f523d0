//! [`Checkpoint`]: a model directory opened for reading, and [`MoeLayerTensors`], one MoE
//! layer's expert weights assembled in the fused layout the kernels take (spec sections 1 and
//! 6.3), sliced for tensor parallelism and filtered for expert parallelism.
//!
//! Layout of the result, per local expert `e` (local ids in ascending order):
//!
//! - `w13[e]` `[2I, H]`: rows `0..I` from the gate projection (`w1`), rows `I..2I` from the up
//!   projection (`w3`); `w2[e]` `[H, I]` from the down projection. `I` is the intermediate size
//!   per tensor-parallel rank.
//! - Quantized formats all become signed codes stored one per `i8` (int4 codes in `[-8, 7]`,
//!   int8 codes in `[-128, 127]`) with f32 scales `[E, 2I, H/g]` and `[E, H, I/g]` (one column
//!   for channelwise scales). Scales are widened to f32, which is exact for bf16 and f16; the
//!   stored dtype is kept in [`IntExperts::scale_dtype`] so a later stage can narrow back
//!   losslessly. GPTQ's K-major `qweight`/`scales` are transposed into this N-major layout.
//! - Asymmetric formats (GPTQ `sym: false`, AWQ, asymmetric `pack-quantized`) add unsigned zero
//!   points ([`ZeroPoints`]) laid out and sliced exactly like the scales; their codes are still
//!   signed `q − 2^(bits−1)`, so the weight is `(code + 2^(bits−1) − z)·s`.
//! - Float weights stay in their stored dtype ([`FloatData`]).
//!
//! Tensor parallelism (rank `r` of `tp`): the gate and up projections keep output rows
//! `[r·I, (r+1)·I)`, the down projection keeps input columns `[r·I, (r+1)·I)` and, for group
//! scales, scale columns `[r·I/g, (r+1)·I/g)`; channelwise `w2` scales and the `w2` bias are kept
//! whole. `I_full` must split into `tp` equal parts and, with group scales, each part into whole
//! groups. The `w2` bias is returned whole on every rank: whoever reduces across ranks must add
//! it exactly once. Act-order (`g_idx`) checkpoints are only read with `tp = 1`.
//!
//! Expert parallelism: with a global-to-local expert map (`-1` = held elsewhere), only local
//! experts are read, in local-id order. The router weight is always the full `[E, H]`.
//!
//! gpt-oss stores each layer's experts fused, as MXFP4 ([`Mxfp4Experts`]): its `w13` rows are
//! interleaved (row `2j` is gate `j`, `2j + 1` is up `j`), so a tensor-parallel rank keeps the
//! contiguous rows `[2·r·I, 2·(r+1)·I)` of `gate_up_proj_*` (biases alike); `down_proj_*` keeps
//! the 32-column blocks `[r·I/32, (r+1)·I/32)` of every row, so `I` must split into whole
//! blocks. The codes stay in the checkpoint's bytes: nothing is decoded while reading.
//!
//! Everything is validated before anything is returned; on error nothing is handed out.

use std::path::Path;

use moe_quant::{DType, WeightGroups};

use moe_kernels::packed::wna16::MXFP4_BLOCK;

use super::config::{ModelFamily, MoeModelSpec};
use super::decode::{FLOAT_DTYPES, FloatData, append_block, check_finite, f32_values};
use super::formats::{
    Dim, Format, LogicalProj, ProjRequest, Values, WordProj, groups_of, read_projection,
    read_projection_words,
};
use super::names::{MoeNames, ParamKind, ShardId};
use super::shards::{ShardAccess, TensorRef, TensorSource, dtype_name};
use crate::error::LayerError;

/// Which part of a layer to read. Start from [`ReadOptions::single_rank`] and adjust with the
/// `with_*` methods (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ReadOptions<'a> {
    /// This rank's tensor-parallel index, `0..tp_size`.
    pub tp_rank: usize,
    /// Number of tensor-parallel ranks (1 = no tensor parallelism).
    pub tp_size: usize,
    /// Global-to-local expert map of this expert-parallel rank (`-1` = not local), or `None`
    /// for all experts (spec section 7.5).
    pub expert_map: Option<&'a [i32]>,
    /// Whether to read the shared experts too (when the model has them).
    pub shared_experts: bool,
}

impl<'a> ReadOptions<'a> {
    /// One rank holding every expert whole, shared experts included.
    pub fn single_rank() -> Self {
        Self {
            tp_rank: 0,
            tp_size: 1,
            expert_map: None,
            shared_experts: true,
        }
    }

    /// Rank `tp_rank` of `tp_size` tensor-parallel ranks.
    pub fn with_tensor_parallel(mut self, tp_rank: usize, tp_size: usize) -> Self {
        self.tp_rank = tp_rank;
        self.tp_size = tp_size;
        self
    }

    /// This expert-parallel rank's global-to-local expert map (`-1` = not local).
    pub fn with_expert_map(mut self, expert_map: Option<&'a [i32]>) -> Self {
        self.expert_map = expert_map;
        self
    }

    /// Whether to read the shared experts too.
    pub fn with_shared_experts(mut self, shared_experts: bool) -> Self {
        self.shared_experts = shared_experts;
        self
    }
}

/// Quantized expert weights in the fused logical layout (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct IntExperts {
    /// Bits per code (4 or 8).
    pub bits: u32,
    /// The scale grouping: groups of input columns, or one scale per output channel.
    pub group_size: WeightGroups,
    /// The dtype the scales were stored in (they are returned widened to f32).
    pub scale_dtype: DType,
    /// `[E, 2I, H]` codes.
    pub w13: Vec<i8>,
    /// `[E, 2I, H/g]` (or `[E, 2I, 1]`) scales.
    pub w13_scales: Vec<f32>,
    /// `[E, H, I]` codes.
    pub w2: Vec<i8>,
    /// `[E, H, I/g]` (or `[E, H, 1]`) scales.
    pub w2_scales: Vec<f32>,
    /// Act-order group indices, when the checkpoint has them.
    pub act_order: Option<ActOrder>,
    /// Zero points of asymmetric checkpoints (GPTQ `sym: false`, AWQ); `None` = symmetric.
    pub zeros: Option<ZeroPoints>,
}

/// Unsigned zero points, laid out like the scales. With them a code `c` (signed, as in
/// [`IntExperts::w13`]) stands for the weight `(c + 2^(bits−1) − z)·s`: the stored unsigned
/// code minus the zero point, times the scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZeroPoints {
    /// `[E, 2I, H/g]` (or `[E, 2I, 1]`), each in `0..2^bits`.
    pub w13: Vec<u8>,
    /// `[E, H, I/g]` (or `[E, H, 1]`).
    pub w2: Vec<u8>,
}

/// Act-order group indices: `g_idx[k]` is the scale group of input column `k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActOrder {
    /// `[E, H]`: one vector per expert shared by gate and up (checked equal).
    pub w13_g_idx: Vec<i32>,
    /// `[E, I]`.
    pub w2_g_idx: Vec<i32>,
}

/// The routed experts' weights as the checkpoint stores them (before any packing): float,
/// integer codes with scales, or MXFP4 blocks.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StoredExperts {
    /// Unquantized weights in the stored dtype: `w13` `[E, 2I, H]`, `w2` `[E, H, I]`.
    Float {
        /// `[E, 2I, H]`.
        w13: FloatData,
        /// `[E, H, I]`.
        w2: FloatData,
    },
    /// Integer codes with scales.
    Int(IntExperts),
    /// MXFP4 blocks and e8m0 scales as the checkpoint stores them (gpt-oss).
    Mxfp4(Mxfp4Experts),
}

/// MXFP4 expert weights, this rank's slice, in the checkpoint's bytes: e2m1 codes in blocks of
/// 32 (16 bytes, element `2j` in the low nibble of byte `j`) with one e8m0 scale each
/// (`2^(e − 127)`; 255 is refused while reading). `w13` rows are interleaved: row `2j` is gate
/// `j`, row `2j + 1` up `j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mxfp4Experts {
    /// `[E, 2I, ceil(H/32), 16]`.
    pub w13_blocks: Vec<u8>,
    /// `[E, 2I, ceil(H/32)]`.
    pub w13_scales: Vec<u8>,
    /// `[E, H, I/32, 16]`.
    pub w2_blocks: Vec<u8>,
    /// `[E, H, I/32]`.
    pub w2_scales: Vec<u8>,
}

/// A group of experts (routed experts of a layer, or its shared MLP as one expert).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertTensors {
    /// Number of experts held (`E`).
    pub num_experts: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Intermediate size per tensor-parallel rank `I`.
    pub intermediate: usize,
    /// The weights.
    pub weights: StoredExperts,
    /// `[E, 2I]` bias of the gate/up projections, sliced like their rows.
    pub w13_bias: Option<FloatData>,
    /// `[E, H]` bias of the down projection, whole on every rank (add it once after the
    /// tensor-parallel reduction).
    pub w2_bias: Option<FloatData>,
}

/// The f32 biases of a layer's local experts: `w13` `[E_local, 2I]` and `w2` `[E_local, H]`.
pub(crate) type ExpertBiases = (Vec<f32>, Vec<f32>);

/// One routed expert's float weights as Llama 4 stores them, K-major, borrowed from the shard.
pub(crate) struct KMajorExpert<'a> {
    /// The stored dtype.
    pub dtype: safetensors::Dtype,
    /// `[H, 2I]`: row `k` holds the gate's `I` values, then the up projection's.
    pub w13: &'a [u8],
    /// `[I, H]`.
    pub w2: &'a [u8],
}

/// The router of a MoE layer.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterTensors {
    /// Gate weight `[E_global, H]` in its stored dtype.
    pub weight: FloatData,
    /// `e_score_correction_bias` `[E_global]` widened to f32 (DeepSeek-V3).
    pub correction_bias: Option<Vec<f32>>,
    /// The router linear's bias `[E_global]` widened to f32 (gpt-oss): added to the logits.
    pub bias: Option<Vec<f32>>,
}

/// The shared experts of a MoE layer, fused into one MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedExpertTensors {
    /// The MLP as a single expert (`num_experts == 1`).
    pub mlp: ExpertTensors,
    /// Sigmoid gate weight `[1, H]` (Qwen2-MoE), in its stored dtype.
    pub gate: Option<FloatData>,
}

/// One MoE layer's tensors, ready for the layer's processing step.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeLayerTensors {
    /// Decoder layer index.
    pub layer: usize,
    /// Global expert id of each local expert, in local-id order.
    pub local_experts: Vec<usize>,
    /// The routed experts held by this rank.
    pub experts: ExpertTensors,
    /// The router.
    pub router: RouterTensors,
    /// The shared experts, when the model has them and they were asked for.
    pub shared: Option<SharedExpertTensors>,
}

/// A model directory opened for reading MoE layers: its [`MoeModelSpec`] and its tensors.
#[derive(Debug)]
pub struct Checkpoint {
    spec: MoeModelSpec,
    source: TensorSource,
    names: MoeNames,
    format: Format,
}

impl Checkpoint {
    /// Opens `dir`: parses `config.json` (refusing unsupported families and schemes) and the
    /// shard layout. Shards are read with `access` (see [`ShardAccess`]).
    pub fn open(dir: &Path, access: ShardAccess) -> Result<Self, LayerError> {
        let spec = MoeModelSpec::from_dir(dir)?;
        let format = Format::from_scheme(&spec.quant);
        let source = TensorSource::open(dir, access)?;
        let names = MoeNames::new(spec.family);
        let names = source
            .names()
            .find_map(|(name, _)| names.in_language_model_of(name))
            .unwrap_or(names);
        Ok(Self {
            names,
            spec,
            source,
            format,
        })
    }

    /// The model's MoE description.
    pub fn spec(&self) -> &MoeModelSpec {
        &self.spec
    }

    /// The tensors, for lookups beyond the MoE layers.
    pub fn source(&self) -> &TensorSource {
        &self.source
    }

    /// The family's tensor names.
    pub fn names(&self) -> &MoeNames {
        &self.names
    }

    /// Reads every MoE layer, in ascending layer order.
    pub fn read_moe_layers(
        &self,
        opts: &ReadOptions<'_>,
    ) -> Result<Vec<MoeLayerTensors>, LayerError> {
        self.spec
            .moe_layers
            .iter()
            .map(|&l| self.read_layer(l, opts))
            .collect()
    }

    /// Reads one MoE layer (see the module docs for the layout and the checks).
    pub fn read_layer(
        &self,
        layer: usize,
        opts: &ReadOptions<'_>,
    ) -> Result<MoeLayerTensors, LayerError> {
        let spec = &self.spec;
        let (router, local_experts) = self.read_layer_head(layer, opts)?;
        let experts = if self.has_fused_float_experts(layer) {
            self.read_fused_float_experts(layer, &local_experts, opts)?
        } else if spec.family == ModelFamily::GptOss {
            self.read_mxfp4_experts(layer, &local_experts, opts)?
        } else if spec.family == ModelFamily::GraniteMoe {
            self.read_granite_experts(layer, &local_experts, opts)?
        } else {
            self.assemble(&self.routed_group(), &local_experts, opts, |e, shard| {
                self.names.expert_projection(layer, e, shard)
            })?
        };

        let shared = if opts.shared_experts {
            self.read_shared_experts(layer, opts)?
        } else {
            None
        };

        Ok(MoeLayerTensors {
            layer,
            local_experts,
            experts,
            router,
            shared,
        })
    }

    /// The shared experts of `layer` as [`Self::read_layer`] reads them (sliced for tensor
    /// parallelism, never filtered by the expert map), or `None` when the model has none.
    pub(crate) fn read_shared_experts(
        &self,
        layer: usize,
        opts: &ReadOptions<'_>,
    ) -> Result<Option<SharedExpertTensors>, LayerError> {
        let Some(shared) = self.spec.shared_experts else {
            return Ok(None);
        };
        if self.spec.family == ModelFamily::GraniteMoe {
            let intermediate = Dim {
                size: shared.intermediate,
                field: self.spec.family.shared_intermediate_field(),
            };
            let linear = |name: &str| self.names.shared_mlp_linear(layer, name);
            let mlp = self.read_n_major_experts(
                (&linear("input_linear"), &linear("output_linear")),
                None,
                intermediate,
                &[0],
                opts,
            )?;
            return Ok(Some(SharedExpertTensors { mlp, gate: None }));
        }
        let field = self.spec.family.shared_intermediate_field();
        let prefix = |shard| self.names.shared_projection(layer, shard);
        // Shared experts are often left unquantized by the quantization recipe.
        let format = match prefix(ShardId::W1) {
            Some(p)
                if !self
                    .source
                    .contains(&format!("{p}.{}", self.format.primary().suffix()))
                    && self.source.contains(&format!("{p}.weight")) =>
            {
                Format::Float
            }
            _ => self.format,
        };
        let group = Group {
            intermediate: Dim {
                size: shared.intermediate,
                field,
            },
            format,
        };
        let mlp = self.assemble(&group, &[0], opts, |_, shard| {
            prefix(shard).into_iter().collect()
        })?;
        let gate = match self.names.shared_expert_gate(layer) {
            Some(name) if shared.gated => {
                let t = self.source.get_as(&name, FLOAT_DTYPES)?;
                let h = self.hidden_dim();
                if t.shape.len() == 2 && t.shape[1] != h.size {
                    return Err(self.mismatch(&t, h, t.shape[1]));
                }
                t.expect_shape(&[1, h.size])?;
                check_finite(&t, &f32_values(&t)?)?;
                FloatData::from_le_bytes(t.dtype, t.bytes)
            }
            _ => None,
        };
        Ok(Some(SharedExpertTensors { mlp, gate }))
    }

    /// The checks of [`Self::read_layer`] that come before the experts, and the router and
    /// the global id of each local expert.
    pub(crate) fn read_layer_head(
        &self,
        layer: usize,
        opts: &ReadOptions<'_>,
    ) -> Result<(RouterTensors, Vec<usize>), LayerError> {
        let spec = &self.spec;
        if !spec.is_moe_layer(layer) {
            return Err(LayerError::NotMoeLayer {
                layer,
                moe_layers: spec.moe_layers.clone(),
            });
        }
        self.check_no_extra_experts(layer)?;
        // The router `[E, H]` is checked against the file before anything is sized by
        // `num_experts`, so a hostile config cannot make us allocate for experts that are not
        // there.
        let router = self.read_router(layer)?;
        let local_experts = local_experts(spec.num_experts, opts.expert_map)?;
        Ok((router, local_experts))
    }

    /// Routed expert `expert` (global id) of `layer` as [`Self::read_layer`] reads it, as a
    /// group of one expert: its part of the layer's tensors, checked the same way. Checks that
    /// involve several experts (one scale dtype for all) are the caller's.
    pub(crate) fn read_routed_expert(
        &self,
        layer: usize,
        expert: usize,
        opts: &ReadOptions<'_>,
    ) -> Result<ExpertTensors, LayerError> {
        if self.has_fused_float_experts(layer) {
            return self.read_fused_float_experts(layer, &[expert], opts);
        }
        if self.spec.family == ModelFamily::GraniteMoe {
            return self.read_granite_experts(layer, &[expert], opts);
        }
        self.assemble(&self.routed_group(), &[expert], opts, |e, shard| {
            self.names.expert_projection(layer, e, shard)
        })
    }

    /// Routed expert `expert` (global id) of `layer` on a single rank with its codes left in
    /// the int32 words the checkpoint stores, for packing them word by word; checked as
    /// [`Self::read_routed_expert`] checks them (biases refused, the up projection's `g_idx`
    /// equal to the gate's). `None` when the format does not store such words
    /// ([`Format::has_code_words`]).
    pub(crate) fn read_routed_expert_words(
        &self,
        layer: usize,
        expert: usize,
    ) -> Result<Option<ExpertWords<'_>>, LayerError> {
        let group = self.routed_group();
        if !group.format.has_code_words() {
            return Ok(None);
        }
        TpSlice::new(
            &ReadOptions::single_rank(),
            group.intermediate,
            group.format,
        )?;
        let read = |shard: ShardId| {
            let candidates = self.names.expert_projection(layer, expert, shard);
            self.read_shard(&group, &candidates, shard, read_projection_words)
        };
        let (Some(w1), Some(w3), Some(w2)) =
            (read(ShardId::W1)?, read(ShardId::W3)?, read(ShardId::W2)?)
        else {
            return Ok(None);
        };
        if w1.g_idx != w3.g_idx {
            let t = w3.g_idx_tensor.as_ref().unwrap_or(&w3.scale_tensor);
            return Err(LayerError::BadGroupIndex {
                tensor: t.name.clone(),
                file: t.file.to_path_buf(),
                reason: "differs from the gate projection's g_idx".into(),
            });
        }
        // One scale dtype per expert, as the whole-layer read requires.
        let scale_dtype = w1.scales.dtype;
        for p in [&w3, &w2] {
            if p.scales.dtype != scale_dtype {
                return Err(LayerError::WrongDtype {
                    tensor: p.scale_tensor.name.clone(),
                    file: p.scale_tensor.file.to_path_buf(),
                    expected: scale_dtype.to_string(),
                    actual: p.scales.dtype.to_string(),
                });
            }
        }
        Ok(Some(ExpertWords {
            w13: [w1, w3],
            w2,
            scale_dtype,
        }))
    }

    /// Routed expert `expert` (global id) of `layer` stored unquantized one projection per
    /// tensor, on a single rank, borrowed from the shards for packing without a copy; checked
    /// as [`Self::read_routed_expert`] checks it (shapes against the config, one dtype for
    /// the three projections). `None` for other layouts and for experts with biases, which
    /// take the owned read.
    pub(crate) fn read_routed_expert_float(
        &self,
        layer: usize,
        expert: usize,
    ) -> Result<Option<FloatExpert<'_>>, LayerError> {
        if !matches!(self.format, Format::Float)
            || self.has_fused_float_experts(layer)
            || self.spec.family == ModelFamily::GraniteMoe
        {
            return Ok(None);
        }
        let group = self.routed_group();
        let mut projections = Vec::with_capacity(3);
        for shard in ShardId::ALL {
            let candidates = self.names.expert_projection(layer, expert, shard);
            let proj = self.read_shard(&group, &candidates, shard, read_projection)?;
            if proj.bias.is_some() {
                return Ok(None);
            }
            let Values::Float { dtype, bytes } = proj.values else {
                return Ok(None);
            };
            if let Some((first, _)) = projections.first() {
                proj.primary.expect_dtype(&[*first])?;
            }
            projections.push((dtype, bytes));
        }
        let [(dtype, gate), (_, up), (_, down)] = projections[..] else {
            return Ok(None);
        };
        Ok(Some(FloatExpert {
            dtype,
            w13: [gate, up],
            w2: down,
        }))
    }

    /// One projection (`shard`) of an expert of `group`, stored under the first of
    /// `candidates` the shards hold, read by `read` (as values or as words) and checked
    /// against the config's dimensions.
    fn read_shard<'a, T>(
        &'a self,
        group: &Group,
        candidates: &[String],
        shard: ShardId,
        read: impl FnOnce(&'a TensorSource, Format, &ProjRequest<'_>) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        let hidden = self.hidden_dim();
        let prefix = self.pick_prefix(candidates, group.format.primary());
        let (n, k) = match shard {
            ShardId::W1 | ShardId::W3 => (group.intermediate, hidden),
            ShardId::W2 => (hidden, group.intermediate),
        };
        let req = ProjRequest {
            prefix: &prefix,
            n,
            k,
            config: &self.spec.config_path,
        };
        read(&self.source, group.format, &req)
    }

    fn routed_group(&self) -> Group {
        let field = self.spec.family.intermediate_field();
        Group {
            intermediate: Dim {
                size: self.spec.intermediate,
                field,
            },
            format: self.format,
        }
    }

    fn hidden_dim(&self) -> Dim {
        Dim {
            size: self.spec.hidden,
            field: "hidden_size",
        }
    }

    fn experts_dim(&self) -> Dim {
        Dim {
            size: self.spec.num_experts,
            field: self.spec.family.experts_field(),
        }
    }

    /// The float tensor `name`, of shape `dims`: a dimension that differs from its config
    /// value is a [`LayerError::ConfigMismatch`] naming the config field, any other shape a
    /// [`LayerError::WrongShape`].
    fn float_tensor_shaped(&self, name: &str, dims: &[Dim]) -> Result<TensorRef<'_>, LayerError> {
        let t = self.source.get_as(name, FLOAT_DTYPES)?;
        if t.shape.len() == dims.len()
            && let Some((dim, &actual)) = dims
                .iter()
                .zip(t.shape)
                .find(|(dim, actual)| dim.size != **actual)
        {
            return Err(self.mismatch(&t, *dim, actual));
        }
        t.expect_shape(&dims.iter().map(|d| d.size).collect::<Vec<_>>())?;
        Ok(t)
    }

    fn mismatch(&self, t: &TensorRef<'_>, dim: Dim, actual: usize) -> LayerError {
        LayerError::ConfigMismatch {
            config: self.spec.config_path.clone(),
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            field: dim.field,
            config_value: dim.size,
            tensor_value: actual,
        }
    }

    /// Refuses any routed-expert tensor of `layer` whose expert index is `>= num_experts`.
    fn check_no_extra_experts(&self, layer: usize) -> Result<(), LayerError> {
        let block = format!("{}.experts.", self.names.block_prefix(layer));
        for (name, file) in self.source.names() {
            let Some(rest) = name.strip_prefix(&block) else {
                continue;
            };
            let Some(Ok(expert)) = rest.split('.').next().map(str::parse::<usize>) else {
                continue;
            };
            if expert >= self.spec.num_experts {
                return Err(LayerError::ExtraExpert {
                    tensor: name.to_string(),
                    file: file.to_path_buf(),
                    expert,
                    num_experts: self.spec.num_experts,
                });
            }
        }
        Ok(())
    }

    fn read_router(&self, layer: usize) -> Result<RouterTensors, LayerError> {
        let (e, h) = (self.experts_dim(), self.hidden_dim());
        let t = self.float_tensor_shaped(&self.names.router_weight(layer), &[e, h])?;
        check_finite(&t, &f32_values(&t)?)?;
        let weight = FloatData::from_le_bytes(t.dtype, t.bytes).unwrap_or(FloatData::F32(vec![]));
        let correction_bias = if self.spec.routing.has_correction_bias {
            let name = self.names.correction_bias(layer);
            // ERNIE-4.5 stores one row per modality, a single one in its language models.
            let b = if self.spec.family == ModelFamily::Ernie45Moe {
                let one_row = Dim {
                    size: 1,
                    field: "moe_statics rows (modalities)",
                };
                self.float_tensor_shaped(&name, &[one_row, e])?
            } else {
                self.float_tensor_shaped(&name, &[e])?
            };
            let values = f32_values(&b)?;
            check_finite(&b, &values)?;
            Some(values)
        } else {
            None
        };
        let bias = match self.names.router_bias(layer) {
            Some(name) => {
                let b = self.float_tensor_shaped(&name, &[e])?;
                let values = f32_values(&b)?;
                check_finite(&b, &values)?;
                Some(values)
            }
            None => None,
        };
        Ok(RouterTensors {
            weight,
            correction_bias,
            bias,
        })
    }

    /// Reads and fuses the projections of `experts` (global ids); `prefixes(e, shard)` lists
    /// the accepted module prefixes of a projection, preferred first.
    fn assemble(
        &self,
        group: &Group,
        experts: &[usize],
        opts: &ReadOptions<'_>,
        prefixes: impl Fn(usize, ShardId) -> Vec<String>,
    ) -> Result<ExpertTensors, LayerError> {
        let hidden = self.hidden_dim();
        let tp = TpSlice::new(opts, group.intermediate, group.format)?;
        let mut acc = Accumulator::new(group.format);
        for &e in experts {
            let mut gate_g_idx: Option<Vec<i32>> = None;
            for shard in ShardId::ALL {
                let proj = self.read_shard(group, &prefixes(e, shard), shard, read_projection)?;
                if let (ShardId::W3, Some(gate), Some(up)) = (shard, &gate_g_idx, &proj.g_idx)
                    && gate != up
                {
                    let t = proj.g_idx_tensor.as_ref().unwrap_or(&proj.primary);
                    return Err(LayerError::BadGroupIndex {
                        tensor: t.name.clone(),
                        file: t.file.to_path_buf(),
                        reason: "differs from the gate projection's g_idx".into(),
                    });
                }
                if shard == ShardId::W1 {
                    gate_g_idx = proj.g_idx.clone();
                }
                acc.push(shard, proj, &tp)?;
            }
        }
        acc.finish(experts.len(), hidden.size, tp.local)
    }

    /// Whether `layer` stores its experts as the bf16 checkpoints of Llama 4, Qwen3-VL and
    /// gpt-oss do: fused per layer and transposed (see [`Self::read_fused_float_experts`]).
    fn has_fused_float_experts(&self, layer: usize) -> bool {
        // gpt-oss stores no other layout, so its missing tensors are named in this one.
        matches!(self.format, Format::Float)
            && (self.spec.family == ModelFamily::GptOss
                || self
                    .source
                    .contains(&self.names.fused_experts(layer, "gate_up_proj")))
    }

    /// Float experts stored fused per layer with K leading (Llama 4, Qwen3-VL, gpt-oss):
    /// `experts.gate_up_proj` `[E, H, 2I]` (gate columns `0..I`, up columns `I..2I`; gpt-oss
    /// interleaves them, gate `j` at column `2j`, up `j` at `2j + 1`, and adds biases) and
    /// `experts.down_proj` `[E, I, H]`. They become the `w13` `[E, 2I, H]` and `w2`
    /// `[E, H, I]` of the per-expert formats (gpt-oss's rows kept interleaved, as its layer
    /// reads them), local experts only, sliced for tensor parallelism, in the stored dtype.
    fn read_fused_float_experts(
        &self,
        layer: usize,
        local: &[usize],
        opts: &ReadOptions<'_>,
    ) -> Result<ExpertTensors, LayerError> {
        let group = self.routed_group();
        let tp = TpSlice::new(opts, group.intermediate, group.format)?;
        let (gate_up, down) = self.fused_float_refs(layer)?;
        let interleaved = self.spec.family == ModelFamily::GptOss;
        let (h, i) = (self.spec.hidden, self.spec.intermediate);
        let size = dtype_bytes(gate_up.dtype);
        let rows = tp.rows();
        let il = rows.len();
        let mut w13 = vec![0u8; local.len() * 2 * il * h * size];
        let mut w2 = vec![0u8; local.len() * h * il * size];
        for (x, (w13, w2)) in local.iter().zip(
            w13.chunks_exact_mut(2 * il * h * size)
                .zip(w2.chunks_exact_mut(h * il * size)),
        ) {
            let gate_up = &gate_up.bytes[x * h * 2 * i * size..][..h * 2 * i * size];
            let down = &down.bytes[x * i * h * size..][..i * h * size];
            if interleaved {
                let cols = 2 * rows.start..2 * rows.end;
                transpose(size, gate_up, 2 * i, 0..h, cols, w13);
            } else {
                let (gate, up) = w13.split_at_mut(il * h * size);
                let gate_cols = rows.clone();
                let up_cols = i + rows.start..i + rows.end;
                for (dst, cols) in [(gate, gate_cols), (up, up_cols)] {
                    transpose(size, gate_up, 2 * i, 0..h, cols, dst);
                }
            }
            transpose(size, down, h, rows.clone(), 0..h, w2);
        }
        let float = |bytes: &[u8]| {
            FloatData::from_le_bytes(gate_up.dtype, bytes).unwrap_or(FloatData::F32(Vec::new()))
        };
        let (w13_bias, w2_bias) = if interleaved {
            self.fused_float_biases(layer, local, 2 * rows.start..2 * rows.end)?
        } else {
            (None, None)
        };
        Ok(ExpertTensors {
            num_experts: local.len(),
            hidden: h,
            intermediate: rows.len(),
            weights: StoredExperts::Float {
                w13: float(&w13),
                w2: float(&w2),
            },
            w13_bias,
            w2_bias,
        })
    }

    /// gpt-oss's expert biases for [`Self::fused_float_expert_k_major`] on a single rank:
    /// `[E_local, 2I]` and `[E_local, H]` widened to f32, or `None` for layers without them.
    pub(crate) fn fused_float_expert_biases(
        &self,
        layer: usize,
        local: &[usize],
    ) -> Result<Option<ExpertBiases>, LayerError> {
        if !self.has_fused_float_experts(layer) || self.spec.family != ModelFamily::GptOss {
            return Ok(None);
        }
        let (w13, w2) = self.fused_float_biases(layer, local, 0..2 * self.spec.intermediate)?;
        Ok(w13.zip(w2).map(|(a, b)| (a.to_f32_vec(), b.to_f32_vec())))
    }

    /// gpt-oss's expert biases beside its fused float weights: `gate_up_proj_bias` `[E, 2I]`
    /// (the columns `w13_cols` of each local expert, interleaved as the weights) and
    /// `down_proj_bias` `[E, H]` (whole on every rank), checked against the config and for
    /// finite values.
    fn fused_float_biases(
        &self,
        layer: usize,
        local: &[usize],
        w13_cols: std::ops::Range<usize>,
    ) -> Result<(Option<FloatData>, Option<FloatData>), LayerError> {
        let (e, h, i) = (
            self.experts_dim(),
            self.hidden_dim(),
            self.routed_group().intermediate,
        );
        let two_i = Dim {
            size: 2 * i.size,
            field: i.field,
        };
        let mut out = [None, None];
        for (slot, (tensor, n, cols)) in out.iter_mut().zip([
            ("gate_up_proj_bias", two_i, w13_cols),
            ("down_proj_bias", h, 0..h.size),
        ]) {
            let t = self.float_tensor_shaped(&self.names.fused_experts(layer, tensor), &[e, n])?;
            check_finite(&t, &f32_values(&t)?)?;
            let size = dtype_bytes(t.dtype);
            let mut bytes = Vec::with_capacity(local.len() * cols.len() * size);
            for &x in local {
                let row = &t.bytes[x * n.size * size..][..n.size * size];
                bytes.extend_from_slice(&row[cols.start * size..cols.end * size]);
            }
            *slot = FloatData::from_le_bytes(t.dtype, &bytes);
        }
        let [w13, w2] = out;
        Ok((w13, w2))
    }

    /// Granite MoE's routed experts: `input_linear` `[E, 2I, H]` (gate rows, then up rows) and
    /// `output_linear` `[E, H, I]`, already in the per-expert layout.
    fn read_granite_experts(
        &self,
        layer: usize,
        local: &[usize],
        opts: &ReadOptions<'_>,
    ) -> Result<ExpertTensors, LayerError> {
        let linear = |name: &str| self.names.fused_linear(layer, name);
        self.read_n_major_experts(
            (&linear("input_linear"), &linear("output_linear")),
            Some(self.experts_dim()),
            self.routed_group().intermediate,
            local,
            opts,
        )
    }

    /// Float experts stored N-major in one tensor per linear: `w13` `[E, 2I, H]` (gate rows,
    /// then up rows) and `w2` `[E, H, I]`, or without the leading `E` (`experts: None`, one
    /// MLP), checked against the config; the local experts' tensor-parallel slices, copied row
    /// by row.
    fn read_n_major_experts(
        &self,
        (w13_name, w2_name): (&str, &str),
        experts: Option<Dim>,
        i: Dim,
        local: &[usize],
        opts: &ReadOptions<'_>,
    ) -> Result<ExpertTensors, LayerError> {
        let tp = TpSlice::new(opts, i, Format::Float)?;
        let h = self.hidden_dim();
        let two_i = Dim {
            size: 2 * i.size,
            field: i.field,
        };
        let read = |name: &str, dims: [Dim; 2]| {
            let dims: Vec<Dim> = experts.into_iter().chain(dims).collect();
            self.float_tensor_shaped(name, &dims)
        };
        let w13 = read(w13_name, [two_i, h])?;
        let w2 = read(w2_name, [h, i])?;
        w2.expect_dtype(&[w13.dtype])?;
        let size = dtype_bytes(w13.dtype);
        let (h, i) = (h.size, i.size);
        let rows = tp.rows();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for &x in local {
            let src13 = &w13.bytes[x * 2 * i * h * size..][..2 * i * h * size];
            for first in [0, i] {
                let gate_or_up = first + rows.start..first + rows.end;
                append_block(src13, h * size, gate_or_up, 0..h * size, &mut a);
            }
            let src2 = &w2.bytes[x * h * i * size..][..h * i * size];
            let cols = rows.start * size..rows.end * size;
            append_block(src2, i * size, 0..h, cols, &mut b);
        }
        let float = |bytes: &[u8]| {
            FloatData::from_le_bytes(w13.dtype, bytes).unwrap_or(FloatData::F32(Vec::new()))
        };
        Ok(ExpertTensors {
            num_experts: local.len(),
            hidden: h,
            intermediate: rows.len(),
            weights: StoredExperts::Float {
                w13: float(&a),
                w2: float(&b),
            },
            w13_bias: None,
            w2_bias: None,
        })
    }

    /// The fused float tensors of `layer` (Llama 4, Qwen3-VL, gpt-oss), checked against the
    /// config: `gate_up_proj` `[E, H, 2I]` and `down_proj` `[E, I, H]`, of one float dtype.
    fn fused_float_refs(&self, layer: usize) -> Result<(TensorRef<'_>, TensorRef<'_>), LayerError> {
        let (e, h, i) = (
            self.experts_dim(),
            self.hidden_dim(),
            self.routed_group().intermediate,
        );
        let two_i = Dim {
            size: 2 * i.size,
            field: i.field,
        };
        let read = |tensor: &str, dims: [Dim; 3]| {
            self.float_tensor_shaped(&self.names.fused_experts(layer, tensor), &dims)
        };
        let gate_up = read("gate_up_proj", [e, h, two_i])?;
        let down = read("down_proj", [e, i, h])?;
        down.expect_dtype(&[gate_up.dtype])?;
        Ok((gate_up, down))
    }

    /// One expert of a layer stored as the bf16 checkpoints of Llama 4, Qwen3-VL and gpt-oss
    /// store it, on a single rank, left K-major as stored (gpt-oss's gate and up columns
    /// interleaved) and borrowed from the shard; gpt-oss's biases are
    /// [`Self::fused_float_expert_biases`]. `None` for other layouts.
    pub(crate) fn fused_float_expert_k_major(
        &self,
        layer: usize,
        expert: usize,
    ) -> Result<Option<KMajorExpert<'_>>, LayerError> {
        if !self.has_fused_float_experts(layer) {
            return Ok(None);
        }
        let (gate_up, down) = self.fused_float_refs(layer)?;
        let size = dtype_bytes(gate_up.dtype);
        let (h, i) = (self.spec.hidden, self.spec.intermediate);
        let (w13, w2) = (h * 2 * i * size, i * h * size);
        Ok(Some(KMajorExpert {
            dtype: gate_up.dtype,
            w13: &gate_up.bytes[expert * w13..][..w13],
            w2: &down.bytes[expert * w2..][..w2],
        }))
    }

    /// The fused MXFP4 tensors of a gpt-oss layer, every expert, checked: dtypes and shapes
    /// against `config.json`, no e8m0 255 (NaN), finite biases.
    pub(crate) fn mxfp4_refs(&self, layer: usize) -> Result<Mxfp4Refs<'_>, LayerError> {
        let group = self.routed_group();
        let (e, h, i) = (self.experts_dim(), self.hidden_dim(), group.intermediate);
        let w13_n = Dim {
            size: 2 * i.size,
            field: i.field,
        };
        let get = |tensor: &str, dtypes: &[safetensors::Dtype]| {
            self.source
                .get_as(&self.names.fused_experts(layer, tensor), dtypes)
        };
        // Checks a `[E, N, K/32 (, 16)]` tensor dimension by dimension against the config,
        // then as a whole (rank, trailing 16).
        let check = |t: &TensorRef<'_>, dims: &[(Dim, usize)], tail: &[usize]| {
            // The block count is not a config value: a wrong one is a plain shape error.
            for (at, &(dim, expected)) in dims.iter().enumerate().take(2) {
                if let Some(&actual) = t.shape.get(at)
                    && t.shape.len() == dims.len() + tail.len()
                    && actual != expected
                {
                    return Err(self.mismatch(t, dim, actual));
                }
            }
            let mut want: Vec<usize> = dims.iter().map(|&(_, v)| v).collect();
            want.extend_from_slice(tail);
            t.expect_shape(&want)
        };
        let mut out = Vec::with_capacity(2);
        for (proj, n, k) in [("gate_up_proj", w13_n, h), ("down_proj", h, i)] {
            let kb = k.size.div_ceil(MXFP4_BLOCK);
            let blocks_dim = Dim {
                size: kb,
                field: k.field,
            };
            let dims = [(e, e.size), (n, n.size), (blocks_dim, kb)];
            let blocks = get(&format!("{proj}_blocks"), &[safetensors::Dtype::U8])?;
            check(&blocks, &dims, &[16])?;
            let scales = get(&format!("{proj}_scales"), &[safetensors::Dtype::U8])?;
            check(&scales, &dims, &[])?;
            if let Some(index) = scales.bytes.iter().position(|&s| s == u8::MAX) {
                return Err(LayerError::BadScale {
                    tensor: scales.name.clone(),
                    file: scales.file.to_path_buf(),
                    index,
                    value: f32::NAN,
                });
            }
            let bias = get(&format!("{proj}_bias"), FLOAT_DTYPES)?;
            check(&bias, &dims[..2], &[])?;
            let bias_values = f32_values(&bias)?;
            check_finite(&bias, &bias_values)?;
            out.push(Mxfp4Proj {
                n: n.size,
                kb,
                blocks,
                scales,
                bias,
                bias_values,
            });
        }
        let w2 = out.pop().expect("two projections");
        let w13 = out.pop().expect("two projections");
        Ok(Mxfp4Refs { w13, w2 })
    }

    /// The fused MXFP4 experts of a gpt-oss layer (see the module docs): every tensor's dtype
    /// and shape checked against `config.json`, every scale and bias checked, then this rank's
    /// slice of each local expert copied as bytes.
    fn read_mxfp4_experts(
        &self,
        layer: usize,
        experts: &[usize],
        opts: &ReadOptions<'_>,
    ) -> Result<ExpertTensors, LayerError> {
        let group = self.routed_group();
        let tp = TpSlice::new(opts, group.intermediate, group.format)?;
        let il = tp.local;
        let refs = self.mxfp4_refs(layer)?;
        let out = [
            (
                refs.w13.n,
                refs.w13.kb,
                &refs.w13.blocks,
                &refs.w13.scales,
                &refs.w13.bias,
            ),
            (
                refs.w2.n,
                refs.w2.kb,
                &refs.w2.blocks,
                &refs.w2.scales,
                &refs.w2.bias,
            ),
        ];
        let (w13, w2) = (&out[0], &out[1]);
        let (rows13, cols2) = (
            2 * tp.rank * il..2 * (tp.rank + 1) * il,
            tp.rank * il / MXFP4_BLOCK..(tp.rank + 1) * il / MXFP4_BLOCK,
        );
        let mut m = Mxfp4Experts {
            w13_blocks: Vec::new(),
            w13_scales: Vec::new(),
            w2_blocks: Vec::new(),
            w2_scales: Vec::new(),
        };
        let (mut b13, mut b2) = (Vec::new(), Vec::new());
        let es13 = dtype_bytes(w13.4.dtype);
        let es2 = dtype_bytes(w2.4.dtype);
        for &g in experts {
            let (n13, kb13) = (w13.0, w13.1);
            let blocks = &w13.2.bytes[g * n13 * kb13 * 16..][..n13 * kb13 * 16];
            append_block(
                blocks,
                kb13 * 16,
                rows13.clone(),
                0..kb13 * 16,
                &mut m.w13_blocks,
            );
            let scales = &w13.3.bytes[g * n13 * kb13..][..n13 * kb13];
            append_block(scales, kb13, rows13.clone(), 0..kb13, &mut m.w13_scales);
            let bias = &w13.4.bytes[g * n13 * es13..][..n13 * es13];
            b13.extend_from_slice(&bias[rows13.start * es13..rows13.end * es13]);

            let (n2, kb2) = (w2.0, w2.1);
            let blocks = &w2.2.bytes[g * n2 * kb2 * 16..][..n2 * kb2 * 16];
            let cols = cols2.start * 16..cols2.end * 16;
            append_block(blocks, kb2 * 16, 0..n2, cols, &mut m.w2_blocks);
            let scales = &w2.3.bytes[g * n2 * kb2..][..n2 * kb2];
            append_block(scales, kb2, 0..n2, cols2.clone(), &mut m.w2_scales);
            b2.extend_from_slice(&w2.4.bytes[g * n2 * es2..][..n2 * es2]);
        }
        Ok(ExpertTensors {
            num_experts: experts.len(),
            hidden: self.spec.hidden,
            intermediate: il,
            weights: StoredExperts::Mxfp4(m),
            w13_bias: FloatData::from_le_bytes(w13.4.dtype, &b13),
            w2_bias: FloatData::from_le_bytes(w2.4.dtype, &b2),
        })
    }

    /// The first candidate prefix whose primary tensor exists, else the first (so that the
    /// missing-tensor error names the preferred spelling).
    fn pick_prefix(&self, candidates: &[String], primary: ParamKind) -> String {
        candidates
            .iter()
            .find(|p| self.source.contains(&format!("{p}.{}", primary.suffix())))
            .or(candidates.first())
            .cloned()
            .unwrap_or_default()
    }
}

/// One routed expert read by [`Checkpoint::read_routed_expert_float`]: row-major
/// little-endian values as stored.
pub(crate) struct FloatExpert<'a> {
    /// The dtype of all three projections.
    pub(crate) dtype: safetensors::Dtype,
    /// The gate and up projections `[I, H]`, the rows `0..I` and `I..2I` of `w13`.
    pub(crate) w13: [&'a [u8]; 2],
    /// The down projection `[H, I]`.
    pub(crate) w2: &'a [u8],
}

/// One routed expert read by [`Checkpoint::read_routed_expert_words`].
pub(crate) struct ExpertWords<'a> {
    /// The gate and up projections, the rows `0..I` and `I..2I` of `w13`.
    pub(crate) w13: [WordProj<'a>; 2],
    /// The down projection.
    pub(crate) w2: WordProj<'a>,
    /// The dtype all three projections store their scales in.
    pub(crate) scale_dtype: DType,
}

/// A gpt-oss layer's fused MXFP4 tensors, checked by [`Checkpoint::mxfp4_refs`], borrowed
/// from the shards (so experts can be packed straight from them).
pub(crate) struct Mxfp4Refs<'a> {
    /// `gate_up_proj_*`: `n = 2I`, `kb = ceil(H/32)`.
    pub(crate) w13: Mxfp4Proj<'a>,
    /// `down_proj_*`: `n = H`, `kb = I/32`.
    pub(crate) w2: Mxfp4Proj<'a>,
}

/// One fused MXFP4 projection of every expert: `[E, n, kb, 16]` blocks, `[E, n, kb]` scales,
/// `[E, n]` bias (also widened to f32).
pub(crate) struct Mxfp4Proj<'a> {
    pub(crate) n: usize,
    pub(crate) kb: usize,
    pub(crate) blocks: TensorRef<'a>,
    pub(crate) scales: TensorRef<'a>,
    pub(crate) bias: TensorRef<'a>,
    pub(crate) bias_values: Vec<f32>,
}

/// A set of experts sharing an intermediate size and storage format.
struct Group {
    intermediate: Dim,
    format: Format,
}

/// Validates an expert map and returns the global id of each local expert.
fn local_experts(num_experts: usize, map: Option<&[i32]>) -> Result<Vec<usize>, LayerError> {
    let Some(map) = map else {
        return Ok((0..num_experts).collect());
    };
    let bad = |reason: String| LayerError::ExpertMap { reason };
    if map.len() != num_experts {
        return Err(bad(format!(
            "has {} entries, expected num_experts = {num_experts}",
            map.len()
        )));
    }
    let num_local = map.iter().filter(|&&l| l >= 0).count();
    let mut global_of: Vec<Option<usize>> = vec![None; num_local];
    for (global, &local) in map.iter().enumerate() {
        if local == -1 {
            continue;
        }
        let slot = usize::try_from(local)
            .ok()
            .and_then(|l| global_of.get_mut(l))
            .ok_or_else(|| {
                bad(format!(
                    "entry {global} = {local} is neither -1 nor a local id in 0..{num_local}"
                ))
            })?;
        if let Some(other) = slot {
            return Err(bad(format!(
                "local id {local} is given to experts {other} and {global}"
            )));
        }
        *slot = Some(global);
    }
    Ok(global_of.into_iter().flatten().collect())
}

/// The tensor-parallel slice of one group of experts.
struct TpSlice {
    rank: usize,
    /// Intermediate size per rank.
    local: usize,
    /// Group size along the intermediate dimension (`None` = channelwise or float).
    group: Option<usize>,
}

impl TpSlice {
    fn new(opts: &ReadOptions<'_>, intermediate: Dim, format: Format) -> Result<Self, LayerError> {
        let (rank, size) = (opts.tp_rank, opts.tp_size);
        let err = |reason: String| LayerError::TensorParallel {
            tp_rank: rank,
            tp_size: size,
            reason,
        };
        if size == 0 || rank >= size {
            return Err(err("tp_rank must lie in 0..tp_size".into()));
        }
        let full = intermediate.size;
        if !full.is_multiple_of(size) {
            return Err(err(format!(
                "{} = {full} is not divisible by tp_size",
                intermediate.field
            )));
        }
        let local = full / size;
        let group = format.group_size();
        if let Some(g) = group {
            groups_of(format.groups(), full, intermediate.field)?;
            if !local.is_multiple_of(g) {
                return Err(err(format!(
                    "the per-rank {} {local} is not a multiple of the group size {g}",
                    intermediate.field
                )));
            }
        }
        if size > 1 && format.act_order() {
            return Err(err(
                "act-order (g_idx) checkpoints are only read without tensor parallelism".into(),
            ));
        }
        Ok(Self { rank, local, group })
    }

    fn rows(&self) -> std::ops::Range<usize> {
        self.rank * self.local..(self.rank + 1) * self.local
    }
}

/// Collects sliced projections into the fused buffers.
struct Accumulator {
    format: Format,
    /// Float weight dtype, fixed by the first projection.
    float_dtype: Option<safetensors::Dtype>,
    w13: Vec<u8>,
    w2: Vec<u8>,
    w13_codes: Vec<i8>,
    w2_codes: Vec<i8>,
    w13_scales: Vec<f32>,
    w2_scales: Vec<f32>,
    /// Scale dtype, fixed by the first projection.
    scale_dtype: Option<DType>,
    w13_g_idx: Vec<i32>,
    w2_g_idx: Vec<i32>,
    w13_zeros: Vec<u8>,
    w2_zeros: Vec<u8>,
    /// Bias dtype, fixed by the first projection (`None` inside = no biases).
    bias: Option<Option<safetensors::Dtype>>,
    first_bias_name: String,
    w13_bias: Vec<u8>,
    w2_bias: Vec<u8>,
}

impl Accumulator {
    fn new(format: Format) -> Self {
        Self {
            format,
            float_dtype: None,
            w13: Vec::new(),
            w2: Vec::new(),
            w13_codes: Vec::new(),
            w2_codes: Vec::new(),
            w13_scales: Vec::new(),
            w2_scales: Vec::new(),
            scale_dtype: None,
            w13_g_idx: Vec::new(),
            w2_g_idx: Vec::new(),
            w13_zeros: Vec::new(),
            w2_zeros: Vec::new(),
            bias: None,
            first_bias_name: String::new(),
            w13_bias: Vec::new(),
            w2_bias: Vec::new(),
        }
    }

    fn push(&mut self, shard: ShardId, p: LogicalProj<'_>, tp: &TpSlice) -> Result<(), LayerError> {
        let (n, k) = (p.n, p.k);
        let (rows, cols) = match shard {
            ShardId::W1 | ShardId::W3 => (tp.rows(), 0..k),
            ShardId::W2 => (0..n, tp.rows()),
        };
        let is_w2 = shard == ShardId::W2;
        match &p.values {
            Values::Float { dtype, bytes } => {
                match self.float_dtype {
                    None => self.float_dtype = Some(*dtype),
                    Some(first) => p.primary.expect_dtype(&[first])?,
                }
                let es = dtype_bytes(*dtype);
                let dst = if is_w2 { &mut self.w2 } else { &mut self.w13 };
                append_block(bytes, k * es, rows, cols.start * es..cols.end * es, dst);
            }
            Values::Codes(codes) => {
                let dst = if is_w2 {
                    &mut self.w2_codes
                } else {
                    &mut self.w13_codes
                };
                append_block(codes, k, rows.clone(), cols, dst);
            }
        }
        if let Some(s) = &p.scales {
            let st = p.scale_tensor.as_ref().unwrap_or(&p.primary);
            match self.scale_dtype {
                None => self.scale_dtype = Some(s.dtype),
                Some(first) if first != s.dtype => {
                    return Err(LayerError::WrongDtype {
                        tensor: st.name.clone(),
                        file: st.file.to_path_buf(),
                        expected: first.to_string(),
                        actual: s.dtype.to_string(),
                    });
                }
                Some(_) => {}
            }
            let g = s.groups;
            let scale_cols = match (is_w2, tp.group) {
                // Group scales of w2 follow its column slice; channelwise ones stay whole.
                (true, Some(gs)) => (tp.rank * tp.local / gs)..((tp.rank + 1) * tp.local / gs),
                _ => 0..g,
            };
            let scale_rows = if is_w2 { 0..n } else { tp.rows() };
            let dst = if is_w2 {
                &mut self.w2_scales
            } else {
                &mut self.w13_scales
            };
            append_block(&s.values, g, scale_rows.clone(), scale_cols.clone(), dst);
            // Zero points are laid out like the scales and sliced the same way.
            if let Some(z) = &p.zeros {
                let dst = if is_w2 {
                    &mut self.w2_zeros
                } else {
                    &mut self.w13_zeros
                };
                append_block(z, g, scale_rows, scale_cols, dst);
            }
        }
        if let Some(g_idx) = &p.g_idx {
            match shard {
                ShardId::W1 => self.w13_g_idx.extend_from_slice(g_idx),
                ShardId::W3 => {}
                ShardId::W2 => self.w2_g_idx.extend_from_slice(g_idx),
            }
        }
        self.push_bias(shard, &p, tp)
    }

    fn push_bias(
        &mut self,
        shard: ShardId,
        p: &LogicalProj<'_>,
        tp: &TpSlice,
    ) -> Result<(), LayerError> {
        let this = p.bias.map(|(d, _)| d);
        let bias_name = |p: &LogicalProj<'_>| {
            let base = p.primary.name.rsplit_once('.').map_or("", |(b, _)| b);
            format!("{base}.bias")
        };
        match self.bias {
            None => {
                self.bias = Some(this);
                self.first_bias_name = bias_name(p);
            }
            Some(first) if first.is_some() != this.is_some() => {
                // One projection has a bias and another has none: name the missing one.
                let (tensor, file) = if this.is_none() {
                    (bias_name(p), p.primary.file.to_path_buf())
                } else {
                    (self.first_bias_name.clone(), p.primary.file.to_path_buf())
                };
                return Err(LayerError::MissingTensor { tensor, file });
            }
            Some(Some(first)) if Some(first) != this => {
                return Err(LayerError::WrongDtype {
                    tensor: bias_name(p),
                    file: p.primary.file.to_path_buf(),
                    expected: dtype_name(first),
                    actual: this.map(dtype_name).unwrap_or_default(),
                });
            }
            Some(_) => {}
        }
        if let Some((dtype, bytes)) = p.bias {
            let es = dtype_bytes(dtype);
            match shard {
                ShardId::W1 | ShardId::W3 => {
                    let r = tp.rows();
                    self.w13_bias
                        .extend_from_slice(&bytes[r.start * es..r.end * es]);
                }
                ShardId::W2 => self.w2_bias.extend_from_slice(bytes),
            }
        }
        Ok(())
    }

    fn finish(
        self,
        num_experts: usize,
        hidden: usize,
        local: usize,
    ) -> Result<ExpertTensors, LayerError> {
        let bias_dtype = self.bias.flatten();
        let decode = |bytes: &[u8]| bias_dtype.and_then(|d| FloatData::from_le_bytes(d, bytes));
        let weights = match self.format {
            Format::Float => {
                let dtype = self.float_dtype.unwrap_or(safetensors::Dtype::F32);
                StoredExperts::Float {
                    w13: FloatData::from_le_bytes(dtype, &self.w13)
                        .unwrap_or(FloatData::F32(Vec::new())),
                    w2: FloatData::from_le_bytes(dtype, &self.w2)
                        .unwrap_or(FloatData::F32(Vec::new())),
                }
            }
            format => StoredExperts::Int(IntExperts {
                bits: format.bits().unwrap_or(4),
                group_size: format.groups(),
                scale_dtype: self.scale_dtype.unwrap_or(DType::F32),
                w13: self.w13_codes,
                w13_scales: self.w13_scales,
                w2: self.w2_codes,
                w2_scales: self.w2_scales,
                act_order: format.act_order().then_some(ActOrder {
                    w13_g_idx: self.w13_g_idx,
                    w2_g_idx: self.w2_g_idx,
                }),
                zeros: format.has_zeros().then_some(ZeroPoints {
                    w13: self.w13_zeros,
                    w2: self.w2_zeros,
                }),
            }),
        };
        Ok(ExpertTensors {
            num_experts,
            hidden,
            intermediate: local,
            weights,
            w13_bias: decode(&self.w13_bias),
            w2_bias: decode(&self.w2_bias),
        })
    }
}

/// Writes the transpose of the block `rows × cols` of the row-major matrix `src` (`src_cols`
/// columns of `size`-byte elements) into `dst`, `[cols.len()][rows.len()]`, tile by tile so
/// both sides stay in cache.
fn transpose(
    size: usize,
    src: &[u8],
    src_cols: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    match size {
        2 => transpose_elements::<2>(src, src_cols, rows, cols, dst),
        4 => transpose_elements::<4>(src, src_cols, rows, cols, dst),
        _ => transpose_elements::<1>(src, src_cols, rows, cols, dst),
    }
}

fn transpose_elements<const S: usize>(
    src: &[u8],
    src_cols: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    const TILE: usize = 64;
    let (n_rows, n_cols) = (rows.len(), cols.len());
    for r0 in (0..n_rows).step_by(TILE) {
        for c0 in (0..n_cols).step_by(TILE) {
            for r in r0..n_rows.min(r0 + TILE) {
                let line = &src[((rows.start + r) * src_cols + cols.start) * S..][..n_cols * S];
                let line = line.as_chunks::<S>().0;
                for (c, element) in line.iter().enumerate().skip(c0).take(TILE) {
                    let at = (c * n_rows + r) * S;
                    dst[at..at + S].copy_from_slice(element);
                }
            }
        }
    }
}

fn dtype_bytes(d: safetensors::Dtype) -> usize {
    d.bitsize() / 8
}
