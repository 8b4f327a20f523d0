//! Building and loading a [`MoeLayer`] from a [`Checkpoint`]: the layer configuration derived
//! from the model's [`MoeModelSpec`], and the copy of the reader's [`MoeLayerTensors`] (already
//! fused, sliced for tensor parallelism and filtered by the expert map) into the parameters.

use std::borrow::Cow;

use moe_kernels::{Activation, GateUpLayout};
use moe_quant::{DType, WeightGroups};

use moe_kernels::{PackedDense, PackedW4A8, PackedW8A8, PackedWna16, Par, W4A8Prefill};
use moe_oracle::DisabledKernels;

use super::MoeLayer;
use super::config::{
    LayerQuant, MoeLayerConfig, SharedExperts, Wna16Activations, router_from_spec,
};
use super::params::{Params, check_scales};
use crate::LayerError;
use crate::checkpoint::{
    Checkpoint, ExpertTensors, FloatData, ModelFamily, MoeLayerTensors, MoeModelSpec, QuantScheme,
    ReadOptions, StoredExperts,
};

impl MoeLayerConfig {
    /// The layer configuration of a model for one rank: sizes and routing from the spec,
    /// the router its routing calls for ([`router_from_spec`]), SiLU experts, unquantized or
    /// W4A8 / WNA16 weights, shared experts when the model has them. Refuses schemes and
    /// activations not supported here, rather than computing something else.
    pub fn from_spec(
        spec: &MoeModelSpec,
        tp_rank: usize,
        tp_size: usize,
        expert_map: Option<Vec<i32>>,
        max_tokens: usize,
    ) -> Result<Self, LayerError> {
        let quant = match &spec.quant {
            QuantScheme::CompressedTensorsW4A8 { group_size, .. } => LayerQuant::W4A8 {
                group_size: *group_size,
            },
            QuantScheme::Unquantized(_) => LayerQuant::Unquantized,
            QuantScheme::CompressedTensorsW8A8 { .. } => LayerQuant::W8A8,
            QuantScheme::CompressedTensorsWna16 {
                bits,
                group_size,
                symmetric,
                ..
            } => LayerQuant::Wna16 {
                bits: *bits,
                group_size: *group_size,
                act_order: spec.quant.has_act_order(),
                zero_points: !*symmetric,
            },
            QuantScheme::Gptq {
                bits,
                group_size,
                desc_act,
                sym,
                ..
            } => LayerQuant::Wna16 {
                bits: *bits,
                group_size: *group_size,
                act_order: *desc_act,
                zero_points: !*sym,
            },
            QuantScheme::Awq { group_size } => LayerQuant::Wna16 {
                bits: 4,
                group_size: *group_size,
                act_order: false,
                zero_points: true,
            },
            QuantScheme::Mxfp4 => LayerQuant::Mxfp4,
            QuantScheme::Fp8 { scaling, .. } => LayerQuant::Fp8 { scaling: *scaling },
        };
        let gpt_oss = spec.family == ModelFamily::GptOss;
        let activation = match spec.activation.as_str() {
            // gpt-oss's experts are SwiGLU-OAI whatever `hidden_act` says (it says "silu").
            _ if gpt_oss => Activation::SwigluOai {
                alpha: 1.702,
                limit: spec.swiglu_limit.unwrap_or(7.0),
            },
            "silu" | "swiglu" => Activation::SILU,
            // Hugging Face's `gelu` is the erf form, as vLLM's GeluAndMul.
            "gelu" => Activation::Gelu,
            other => {
                return Err(LayerError::ConfigField {
                    file: spec.config_path.clone(),
                    field: "hidden_act",
                    reason: format!("activation {other:?} is not supported by the layer yet"),
                });
            }
        };
        let r = &spec.routing;
        let router = router_from_spec(r, spec.num_experts, spec.top_k).map_err(|reason| {
            LayerError::ConfigField {
                file: spec.config_path.clone(),
                field: "n_group / topk_group",
                reason,
            }
        })?;
        Ok(Self {
            num_experts: spec.num_experts,
            top_k: spec.top_k,
            hidden: spec.hidden,
            intermediate: spec.intermediate,
            tp_rank,
            tp_size,
            expert_map,
            ep_rank: 0,
            ep_size: 1,
            activation,
            gate_up_layout: if gpt_oss {
                GateUpLayout::Interleaved
            } else {
                GateUpLayout::Concatenated
            },
            router_has_bias: gpt_oss,
            router,
            router_bias_pending: r.has_correction_bias,
            shared_experts: spec.shared_experts.map(|s| SharedExperts {
                intermediate: s.intermediate,
                gated: s.gated,
            }),
            quant,
            wna16_activations: Wna16Activations::Float,
            in_dtype: spec.dtype.unwrap_or(DType::BF16),
            max_tokens,
            disabled_kernels: None,
            w4a8_prefill: None,
        })
    }
}

/// How [`MoeLayer::from_checkpoint_with`] loads a layer: over how many threads, and whom to
/// tell how far it got. Start from [`LoadOptions::new`] (the struct is `#[non_exhaustive]`).
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct LoadOptions<'a> {
    /// [`Par::Seq`] (the default) reads and packs experts on the calling thread;
    /// [`Par::Rayon`] on the current rayon pool (the pool of the caller's
    /// `ThreadPool::install`, else rayon's global pool, which the library then brings up: so
    /// it is the host's choice, not the default). The packed weights are the same either way.
    pub par: Par,
    /// Called after each expert is packed, possibly from several threads at once and not
    /// necessarily in increasing order of [`LoadProgress::done`]. The library itself never
    /// prints; a front end can draw a progress bar from this.
    pub progress: Option<&'a (dyn Fn(LoadProgress) + Sync)>,
    /// What a WNA16 layer's weights are multiplied with ([`Wna16Activations::Float`] by
    /// default; ignored by the other schemes).
    pub wna16_activations: Wna16Activations,
    /// Kernels the backend selection must not choose; `None` (the default) reads
    /// `MOE_DISABLED_KERNELS` ([`MoeLayerConfig::disabled_kernels`]).
    pub disabled_kernels: Option<&'a DisabledKernels>,
    /// The numerics of W4A8 calls with many rows per expert; `None` (the default) reads
    /// `MOE_KERNELS_W4A8_PREFILL` ([`MoeLayerConfig::w4a8_prefill`]).
    pub w4a8_prefill: Option<W4A8Prefill>,
    /// This rank's `(ep_rank, ep_size)` in an expert-parallel group, for the oracle
    /// ([`MoeLayerConfig::with_expert_parallel`]); `(0, 1)` by default. Only
    /// [`MoeLayer::from_checkpoint_ranked_with`] reads it, with the expert map it is given.
    pub expert_parallel: (usize, usize),
}

impl<'a> LoadOptions<'a> {
    /// Experts on the calling thread, no progress reports.
    pub fn new() -> Self {
        Self {
            par: Par::Seq,
            progress: None,
            wna16_activations: Wna16Activations::Float,
            disabled_kernels: None,
            w4a8_prefill: None,
            expert_parallel: (0, 1),
        }
    }

    /// Keeps backend selection off the kernels in `disabled`.
    pub fn with_disabled_kernels(mut self, disabled: &'a DisabledKernels) -> Self {
        self.disabled_kernels = Some(disabled);
        self
    }

    /// `cfg` with what these options decide about the layer itself (its WNA16 activations,
    /// its W4A8 prefill numerics and the kernels its backend selection avoids).
    fn configure(&self, cfg: MoeLayerConfig) -> MoeLayerConfig {
        let mut cfg = cfg.with_wna16_activations(self.wna16_activations);
        cfg.w4a8_prefill = self.w4a8_prefill;
        match self.disabled_kernels {
            Some(disabled) => cfg.with_disabled_kernels(disabled.clone()),
            None => cfg,
        }
    }

    /// Runs W4A8 calls with many rows per expert with `prefill`.
    pub fn with_w4a8_prefill(mut self, prefill: W4A8Prefill) -> Self {
        self.w4a8_prefill = Some(prefill);
        self
    }

    /// This rank's place in an expert-parallel group, for the oracle.
    pub fn with_expert_parallel(mut self, ep_rank: usize, ep_size: usize) -> Self {
        self.expert_parallel = (ep_rank, ep_size);
        self
    }

    /// Multiplies WNA16 weights with `activations`.
    pub fn with_wna16_activations(mut self, activations: Wna16Activations) -> Self {
        self.wna16_activations = activations;
        self
    }

    /// Reads and packs experts with `par`.
    pub fn with_par(mut self, par: Par) -> Self {
        self.par = par;
        self
    }

    /// Reports progress to `progress`.
    pub fn with_progress(mut self, progress: &'a (dyn Fn(LoadProgress) + Sync)) -> Self {
        self.progress = Some(progress);
        self
    }
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LoadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("par", &self.par)
            .field("progress", &self.progress.map(|_| "callback"))
            .field("wna16_activations", &self.wna16_activations)
            .field("disabled_kernels", &self.disabled_kernels)
            .field("w4a8_prefill", &self.w4a8_prefill)
            .field("expert_parallel", &self.expert_parallel)
            .finish()
    }
}

/// How far a load has got: experts read, checked and packed, out of the layer's local experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadProgress {
    /// Experts done so far.
    pub done: usize,
    /// Experts in the layer on this rank.
    pub total: usize,
}

impl MoeLayer {
    /// Creates, loads and processes layer `layer` of `ckpt` on a single rank holding every
    /// expert, for calls of up to `max_tokens` tokens, on the calling thread (see
    /// [`Self::from_checkpoint_with`] for threads and progress).
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        layer: usize,
        max_tokens: usize,
    ) -> Result<Self, LayerError> {
        Self::from_checkpoint_with(ckpt, layer, max_tokens, &LoadOptions::new())
    }

    /// [`Self::from_checkpoint`] with a choice of threads and a progress callback.
    ///
    /// W4A8, W8A8, native WNA16 and unquantized layers on one tensor-parallel rank are read and
    /// packed one expert at a time, experts in parallel: each expert goes from the
    /// (memory-mapped) shard through the same checks and the same packing as the whole-layer
    /// path, so the packed weights are identical, but the unpacked weights of the whole layer
    /// never exist at once (the shared experts, one MLP, are read whole). Any failure
    /// on that road, and every other layer, takes the whole-layer road (read, load, process),
    /// which reports the error exactly as it always has.
    pub fn from_checkpoint_with(
        ckpt: &Checkpoint,
        layer: usize,
        max_tokens: usize,
        opts: &LoadOptions<'_>,
    ) -> Result<Self, LayerError> {
        let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, max_tokens)?;
        let cfg = opts.configure(cfg);
        if matches!(cfg.quant, LayerQuant::Fp8 { .. }) {
            return Self::fp8_from_checkpoint(ckpt, layer, cfg, opts);
        }
        if let Some(moe) = Self::streamed(ckpt, layer, &cfg, opts) {
            return Ok(moe);
        }
        let mut moe = Self::whole_layer(ckpt, layer, cfg)?;
        moe.set_parallelism(opts.par);
        moe.process()?;
        moe.set_parallelism(Par::Rayon);
        if let Some(report) = opts.progress {
            let total = moe.cfg.local_experts().len();
            report(LoadProgress { done: total, total });
        }
        Ok(moe)
    }

    /// Decoder layer `layer`'s MoE block of `ckpt` as one rank of a parallel group: tensor
    /// parallelism `tp = (rank, size)` keeps this rank's slice of the intermediate dimension,
    /// `expert_map` (global to local ids, `-1` for another rank's; see
    /// `moe_router::ExpertMap`) this rank's experts. Loaded and processed; summing the
    /// outputs of all ranks gives the single-rank block.
    pub fn from_checkpoint_ranked(
        ckpt: &Checkpoint,
        layer: usize,
        max_tokens: usize,
        tp: (usize, usize),
        expert_map: Option<Vec<i32>>,
    ) -> Result<Self, LayerError> {
        Self::from_checkpoint_ranked_with(
            ckpt,
            layer,
            max_tokens,
            tp,
            expert_map,
            &LoadOptions::new().with_par(Par::Rayon),
        )
    }

    /// [`Self::from_checkpoint_ranked`] with the choices of [`LoadOptions`] (threads for the
    /// packing, the WNA16 activations; the whole layer is read at once, so progress is
    /// reported when it is done).
    pub fn from_checkpoint_ranked_with(
        ckpt: &Checkpoint,
        layer: usize,
        max_tokens: usize,
        tp: (usize, usize),
        expert_map: Option<Vec<i32>>,
        load: &LoadOptions<'_>,
    ) -> Result<Self, LayerError> {
        let (tp_rank, tp_size) = tp;
        let cfg = MoeLayerConfig::from_spec(
            ckpt.spec(),
            tp_rank,
            tp_size,
            expert_map.clone(),
            max_tokens,
        )?;
        let cfg = load
            .configure(cfg)
            .with_expert_parallel(load.expert_parallel.0, load.expert_parallel.1);
        // The oracle judges the rank before anything is read, as `moe inspect` does, so a
        // configuration it refuses is refused for its reason whatever the tensors hold.
        cfg.select_backend()?;
        if matches!(cfg.quant, LayerQuant::Fp8 { .. }) {
            return Self::fp8_from_checkpoint(ckpt, layer, cfg, load);
        }
        cfg.validate()?;
        let opts = ReadOptions {
            shared_experts: cfg.shared_experts.is_some(),
            ..ReadOptions::single_rank()
        }
        .with_tensor_parallel(tp_rank, tp_size)
        .with_expert_map(expert_map.as_deref());
        let tensors = ckpt.read_layer(layer, &opts)?;
        let mut moe = Self::create(cfg)?;
        moe.load_tensors(Cow::Owned(tensors))?;
        moe.set_parallelism(load.par);
        moe.process()?;
        moe.set_parallelism(Par::Rayon);
        if let Some(report) = load.progress {
            let total = moe.cfg.local_experts().len();
            report(LoadProgress { done: total, total });
        }
        Ok(moe)
    }

    /// Reads and loads every tensor of the layer at once (the road of every layer the
    /// streamed one does not take), leaving it to be processed.
    fn whole_layer(
        ckpt: &Checkpoint,
        layer: usize,
        cfg: MoeLayerConfig,
    ) -> Result<Self, LayerError> {
        // Read (and so validate against the files) before `create` allocates parameters sized
        // by `config.json`: a config declaring huge sizes must fail on the tensors, not abort
        // on an allocation.
        let opts = ReadOptions {
            shared_experts: cfg.shared_experts.is_some(),
            ..ReadOptions::single_rank()
        };
        let tensors = ckpt.read_layer(layer, &opts)?;
        let mut moe = Self::create(cfg)?;
        moe.load_tensors(Cow::Owned(tensors))?;
        Ok(moe)
    }

    /// The expert-at-a-time road of [`Self::from_checkpoint_with`]; `None` when the layer is
    /// not one it takes or anything fails (the caller then takes the whole-layer road).
    fn streamed(
        ckpt: &Checkpoint,
        layer: usize,
        cfg: &MoeLayerConfig,
        opts: &LoadOptions<'_>,
    ) -> Option<Self> {
        if cfg.quant == LayerQuant::Mxfp4 {
            return Self::streamed_mxfp4(ckpt, layer, cfg, opts);
        }
        if cfg.tp_size != 1
            || !matches!(
                cfg.quant,
                LayerQuant::W4A8 { .. }
                    | LayerQuant::W8A8
                    | LayerQuant::Wna16 { .. }
                    | LayerQuant::Unquantized
            )
        {
            return None;
        }
        let read = ReadOptions {
            shared_experts: false,
            ..ReadOptions::single_rank()
        };
        let (router, local) = ckpt.read_layer_head(layer, &read).ok()?;
        // `create` allocates by the sizes of `config.json`: the router has backed E, the first
        // expert's tensors back H and I.
        ckpt.read_routed_expert(layer, *local.first()?, &read)
            .ok()?;
        let mut moe = Self::create(cfg.clone()).ok()?;
        moe.load_router_weight(&router.weight.to_f32_vec()).ok()?;
        if let Some(bias) = &router.correction_bias {
            moe.load_router_correction_bias(bias).ok()?;
        }
        if let Some(bias) = &router.bias {
            moe.load_router_bias(bias).ok()?;
        }
        if moe.cfg.router_bias_pending
            || (moe.cfg.router_has_bias && moe.router_bias.is_none())
            || local != moe.cfg.local_experts()
        {
            return None;
        }
        // gpt-oss's bf16 experts carry biases, read once for the layer.
        let biases = match cfg.quant {
            LayerQuant::Unquantized => ckpt.fused_float_expert_biases(layer, &local).ok()?,
            _ => None,
        };
        if moe.cfg.shared_experts.is_some() {
            let shared = ckpt
                .read_shared_experts(layer, &ReadOptions::single_rank())
                .ok()??;
            let loaded = moe
                .shared
                .as_mut()?
                .guarded(|c, p| copy_experts(c, p, Cow::Owned(shared.mlp), layer, &[0]));
            loaded.ok()?;
            if let Some(gate) = &shared.gate {
                moe.load_shared_expert_gate(&gate.to_f32_vec()).ok()?;
            }
            moe.process_shared().ok()?;
        }
        let (selection, kernels) = super::backend::select(&moe.cfg, &moe.router).ok()?;
        let native_wna16 = selection.kernel.id == moe_oracle::KernelId::CpuWna16;
        let order = kernels.panel_order();
        // One expert's parameters, filled and packed by the whole-layer code.
        let one = MoeLayerConfig {
            num_experts: 1,
            expert_map: None,
            ..moe.cfg.clone()
        };
        let (h, i) = (one.hidden, one.intermediate_per_rank());
        let done = std::sync::atomic::AtomicUsize::new(0);
        let total = local.len();
        let experts = moe_kernels::par::map_indexed(total, opts.par, |x| {
            if one.quant == LayerQuant::Unquantized {
                let (w13, w2, dtype) = pack_float_expert(ckpt, layer, local[x], &one)?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if let Some(report) = opts.progress {
                    report(LoadProgress { done: n, total });
                }
                // Every expert must share the layer's float dtype, as on the other road.
                return Ok((Packed::Dense(vec![w13], vec![w2]), Some(dtype)));
            }
            if matches!(one.quant, LayerQuant::Wna16 { .. })
                && native_wna16
                && let Some(words) = ckpt.read_routed_expert_words(layer, local[x])?
            {
                // The codes go from the checkpoint's words to the packed layout directly.
                let (w13, w2) = super::wna16::pack_expert_words(&words, one.quant)?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if let Some(report) = opts.progress {
                    report(LoadProgress { done: n, total });
                }
                return Ok((Packed::Wna16(vec![w13], vec![w2]), Some(words.scale_dtype)));
            }
            let ex = ckpt.read_routed_expert(layer, local[x], &read)?;
            let mut p = Params::create(&one);
            copy_experts(&one, &mut p, Cow::Owned(ex), layer, &[0])?;
            if p.has_biases() {
                return Err(LayerError::InvalidArgument {
                    field: "bias",
                    reason: "expert biases are loaded by the whole-layer road".into(),
                });
            }
            let packed = match one.quant {
                LayerQuant::Wna16 { group_size, .. } if one.wna16_on_w4a8() => {
                    let (w13, w2) =
                        super::process::pack_w4a8(&p, group_size, h, i, Par::Seq, order)?;
                    Packed::W4A8(w13, w2)
                }
                LayerQuant::W4A8 { group_size } => {
                    let (w13, w2) =
                        super::process::pack_w4a8(&p, group_size, h, i, Par::Seq, order)?;
                    Packed::W4A8(w13, w2)
                }
                LayerQuant::W8A8 => {
                    let (w13, w2) = super::process::pack_w8a8(&p, h, i, Par::Seq, order)?;
                    Packed::W8A8(w13, w2)
                }
                LayerQuant::Wna16 {
                    bits,
                    group_size,
                    act_order,
                    zero_points,
                } if native_wna16 => {
                    let shape = super::wna16::LayerShape {
                        bits,
                        group_size,
                        act_order,
                        zero_points,
                        h,
                        i,
                    };
                    let (w13, w2) = super::wna16::pack_layer(&p, &shape, Par::Seq)?;
                    Packed::Wna16(w13, w2)
                }
                _ => {
                    return Err(LayerError::InvalidArgument {
                        field: "quant",
                        reason: "not packed expert by expert".into(),
                    });
                }
            };
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if let Some(report) = opts.progress {
                report(LoadProgress { done: n, total });
            }
            Ok((packed, p.scale_dtype))
        });
        let experts: Vec<(Packed, Option<DType>)> = experts
            .into_iter()
            .collect::<Result<_, LayerError>>()
            .ok()?;
        // The whole-layer read requires one scale dtype (one float dtype) for the layer.
        if experts.windows(2).any(|w| w[0].1 != w[1].1) {
            return None;
        }
        let moe_cfg = moe.fused_config();
        // The experts packed one by one, as one layer of a single format (biases only where
        // read for the layer at once: other layers with biases take the whole-layer road).
        let (b13, b2) = biases.map_or((None, None), |(a, b)| (Some(a), Some(b)));
        fn one_format<W: moe_kernels::moe::ExpertMatrix>(
            experts: impl Iterator<Item = Option<(Vec<W>, Vec<W>)>>,
            (b13, b2): (Option<Vec<f32>>, Option<Vec<f32>>),
            moe_cfg: moe_kernels::FusedMoeConfig,
            kernels: moe_kernels::KernelSet,
        ) -> Option<moe_kernels::FusedMoe<W>> {
            let (w13, w2) = experts
                .map(|pair| {
                    let (a, b) = pair?;
                    Some((a.into_iter().next()?, b.into_iter().next()?))
                })
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .unzip();
            super::process::fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels).ok()
        }
        let on_w4a8 = matches!(cfg.quant, LayerQuant::W4A8 { .. }) || cfg.wna16_on_w4a8();
        let packed = experts.into_iter().map(|(p, _)| p);
        let fused = if on_w4a8 {
            super::Experts::W4A8(one_format(
                packed.map(|p| match p {
                    Packed::W4A8(a, b) => Some((a, b)),
                    _ => None,
                }),
                (b13, b2),
                moe_cfg,
                kernels,
            )?)
        } else if cfg.quant == LayerQuant::Unquantized {
            super::Experts::Dense(one_format(
                packed.map(|p| match p {
                    Packed::Dense(a, b) => Some((a, b)),
                    _ => None,
                }),
                (b13, b2),
                moe_cfg,
                kernels,
            )?)
        } else if cfg.quant == LayerQuant::W8A8 {
            super::Experts::W8A8(one_format(
                packed.map(|p| match p {
                    Packed::W8A8(a, b) => Some((a, b)),
                    _ => None,
                }),
                (b13, b2),
                moe_cfg,
                kernels,
            )?)
        } else {
            super::Experts::Wna16Native(one_format(
                packed.map(|p| match p {
                    Packed::Wna16(a, b) => Some((a, b)),
                    _ => None,
                }),
                (b13, b2),
                moe_cfg,
                kernels,
            )?)
        };
        let ready = moe.ready_with(fused, selection).ok()?;
        moe.state = super::State::Ready(Box::new(ready));
        Some(moe)
    }

    /// The streamed road of an MXFP4 layer on one rank holding every expert: each expert is
    /// packed straight from the (memory-mapped) fused tensors, experts in parallel, after the
    /// whole-layer road's checks ([`Checkpoint::mxfp4_refs`]), so no copy of the layer's bytes
    /// is made; the packed weights and biases are the whole-layer road's.
    fn streamed_mxfp4(
        ckpt: &Checkpoint,
        layer: usize,
        cfg: &MoeLayerConfig,
        opts: &LoadOptions<'_>,
    ) -> Option<Self> {
        if cfg.tp_size != 1 || cfg.expert_map.is_some() || cfg.shared_experts.is_some() {
            return None;
        }
        let read = ReadOptions {
            shared_experts: false,
            ..ReadOptions::single_rank()
        };
        let (router, local) = ckpt.read_layer_head(layer, &read).ok()?;
        let refs = ckpt.mxfp4_refs(layer).ok()?;
        let mut moe = Self::create(cfg.clone()).ok()?;
        moe.load_router_weight(&router.weight.to_f32_vec()).ok()?;
        moe.load_router_bias(router.bias.as_deref()?).ok()?;
        if local != moe.cfg.local_experts() {
            return None;
        }
        let (selection, kernels) = super::backend::select(&moe.cfg, &moe.router).ok()?;
        if selection.kernel.id != moe_oracle::KernelId::CpuWna16 {
            return None;
        }
        let (h, i) = (cfg.hidden, cfg.intermediate);
        let pack = |p: &crate::checkpoint::Mxfp4Proj<'_>, g: usize, k: usize| {
            let (n, kb) = (p.n, p.kb);
            PackedWna16::pack_mxfp4(moe_kernels::Mxfp4Desc {
                n,
                k,
                blocks: p.blocks.bytes.get(g * n * kb * 16..)?.get(..n * kb * 16)?,
                scales: p.scales.bytes.get(g * n * kb..)?.get(..n * kb)?,
                bias: None,
            })
            .ok()
        };
        let done = std::sync::atomic::AtomicUsize::new(0);
        let total = local.len();
        let experts = moe_kernels::par::map_indexed(total, opts.par, |x| {
            let pair = (pack(&refs.w13, local[x], h)?, pack(&refs.w2, local[x], i)?);
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if let Some(report) = opts.progress {
                report(LoadProgress { done: n, total });
            }
            Some(pair)
        });
        let (w13, w2) = experts
            .into_iter()
            .collect::<Option<Vec<_>>>()?
            .into_iter()
            .unzip();
        let biases = (
            Some(refs.w13.bias_values.clone()),
            Some(refs.w2.bias_values.clone()),
        );
        let fused =
            super::process::fused_pipeline((w13, w2), biases, &moe.fused_config(), kernels).ok()?;
        let ready = moe
            .ready_with(super::Experts::Wna16Native(fused), selection)
            .ok()?;
        moe.state = super::State::Ready(Box::new(ready));
        Some(moe)
    }

    /// Loads every expert tensor and the router weight of `layer` from `ckpt`, through the
    /// checkpoint reader (which fuses, slices this rank's shard and skips other ranks'
    /// experts). A processed or unusable layer refuses it and stays as it was; any other
    /// failure leaves the layer unusable.
    pub fn load_from_checkpoint(
        &mut self,
        ckpt: &Checkpoint,
        layer: usize,
    ) -> Result<(), LayerError> {
        self.params_ref()?;
        let cfg = self.cfg.clone();
        if matches!(cfg.quant, LayerQuant::Fp8 { .. }) {
            // Packed as read, so the layer comes back processed (`process` then does nothing).
            let par = self.par;
            let loaded =
                Self::fp8_from_checkpoint(ckpt, layer, cfg, &LoadOptions::new().with_par(par));
            let mut moe = self.unusable_on_err(loaded)?;
            moe.set_parallelism(par);
            *self = moe;
            return Ok(());
        }
        let opts = ReadOptions {
            tp_rank: cfg.tp_rank,
            tp_size: cfg.tp_size,
            expert_map: cfg.expert_map.as_deref(),
            shared_experts: cfg.shared_experts.is_some(),
        };
        let read = ckpt.read_layer(layer, &opts);
        let tensors = self.unusable_on_err(read)?;
        self.load_tensors(Cow::Owned(tensors))
    }

    /// Loads a whole layer as the checkpoint reader returns it (see
    /// [`Self::load_from_checkpoint`]). A failure leaves the layer unusable.
    pub fn load_layer_tensors(&mut self, t: &MoeLayerTensors) -> Result<(), LayerError> {
        self.load_tensors(Cow::Borrowed(t))
    }

    /// [`Self::load_layer_tensors`], moving the expert weights in when they are owned (a
    /// layer's worth of bytes is not copied twice).
    fn load_tensors(&mut self, t: Cow<'_, MoeLayerTensors>) -> Result<(), LayerError> {
        let router = t.router.weight.to_f32_vec();
        self.load_router_weight(&router)?;
        if let Some(bias) = &t.router.correction_bias {
            self.load_router_correction_bias(bias)?;
        }
        if let Some(bias) = &t.router.bias {
            self.load_router_bias(bias)?;
        }
        if let (Some(sh), Some(layer)) = (&t.shared, self.shared.as_mut()) {
            let loaded =
                layer.guarded(|cfg, p| copy_experts(cfg, p, Cow::Borrowed(&sh.mlp), t.layer, &[0]));
            self.unusable_on_err(loaded)?;
            if let Some(gate) = &sh.gate {
                self.load_shared_expert_gate(&gate.to_f32_vec())?;
            }
        }
        let (layer, local) = (t.layer, t.local_experts.clone());
        let experts = match t {
            Cow::Owned(t) => Cow::Owned(t.experts),
            Cow::Borrowed(t) => Cow::Borrowed(&t.experts),
        };
        self.guarded(|cfg, p| copy_experts(cfg, p, experts, layer, &local))
    }
}

/// One unquantized expert packed for the dense kernels straight from the checkpoint, as
/// `process` packs it (bf16 kept, other float dtypes widened to f32), without the layer's f32
/// parameters in between; Llama 4's K-major tensors are packed as stored. Returns the weights'
/// dtype, which must be the layer's.
fn pack_float_expert(
    ckpt: &Checkpoint,
    layer: usize,
    expert: usize,
    one: &MoeLayerConfig,
) -> Result<(PackedDense, PackedDense, DType), LayerError> {
    let (h, i) = (one.hidden, one.intermediate_per_rank());
    let pack = |w: &FloatData, n: usize, k: usize| {
        Ok::<_, LayerError>(match w {
            FloatData::BF16(v) => PackedDense::pack_bf16(n, k, v)?,
            other => PackedDense::pack_f32(n, k, &other.to_f32_vec())?,
        })
    };
    if let Some(crate::checkpoint::read::KMajorExpert { dtype, w13, w2 }) =
        ckpt.fused_float_expert_k_major(layer, expert)?
    {
        if dtype == safetensors::Dtype::BF16 {
            let (w13, w2) = (
                PackedDense::pack_bf16_k_major_le(2 * i, h, w13)?,
                PackedDense::pack_bf16_k_major_le(h, i, w2)?,
            );
            return Ok((w13, w2, DType::BF16));
        }
        // f16 and f32 widen to f32, as `process` packs them.
        let float =
            |bytes| FloatData::from_le_bytes(dtype, bytes).unwrap_or(FloatData::F32(vec![]));
        let (w13, w2) = (float(w13), float(w2));
        return Ok((
            PackedDense::pack_f32_k_major(2 * i, h, &w13.to_f32_vec())?,
            PackedDense::pack_f32_k_major(h, i, &w2.to_f32_vec())?,
            w13.dtype(),
        ));
    }
    if let Some(ex) = ckpt.read_routed_expert_float(layer, expert)?
        && ex.dtype == safetensors::Dtype::BF16
    {
        // Packed from the shards' bytes: no owned copy of the expert in between.
        return Ok((
            PackedDense::pack_bf16_rows_le(2 * i, h, &ex.w13)?,
            PackedDense::pack_bf16_rows_le(h, i, &[ex.w2])?,
            DType::BF16,
        ));
    }
    let read = ReadOptions {
        shared_experts: false,
        ..ReadOptions::single_rank()
    };
    let ex = ckpt.read_routed_expert(layer, expert, &read)?;
    let StoredExperts::Float { w13, w2 } = &ex.weights else {
        return Err(LayerError::InvalidArgument {
            field: "quant",
            reason: "unquantized layers take float weights".into(),
        });
    };
    if ex.w13_bias.is_some() || ex.w2_bias.is_some() {
        return Err(LayerError::InvalidArgument {
            field: "bias",
            reason: "expert biases are loaded by the whole-layer road".into(),
        });
    }
    if w13.dtype() != w2.dtype() {
        return Err(LayerError::ParamDtype {
            tensor: "w2".into(),
            expected: format!("{:?} (the dtype of w13)", w13.dtype()),
            actual: format!("{:?}", w2.dtype()),
        });
    }
    let dtype = w13.dtype();
    Ok((pack(w13, 2 * i, h)?, pack(w2, h, i)?, dtype))
}

/// One expert packed on the streamed road: its `w13` and `w2` (one matrix each).
enum Packed {
    W4A8(Vec<PackedW4A8>, Vec<PackedW4A8>),
    W8A8(Vec<PackedW8A8>, Vec<PackedW8A8>),
    Wna16(Vec<PackedWna16>, Vec<PackedWna16>),
    Dense(Vec<PackedDense>, Vec<PackedDense>),
}

/// Checks the reader's tensors of one expert group (the routed experts, or the shared MLP as
/// one expert) against the layer's shapes and copies them in (moves them, when they are owned).
fn copy_experts(
    cfg: &MoeLayerConfig,
    p: &mut Params,
    tensors: Cow<'_, ExpertTensors>,
    layer: usize,
    local_experts: &[usize],
) -> Result<(), LayerError> {
    let ex: &ExpertTensors = &tensors;
    let mismatch = |field: &'static str, expected: String, actual: String| {
        Err(LayerError::InvalidArgument {
            field,
            reason: format!("layer {layer}: expected {expected}, checkpoint has {actual}"),
        })
    };
    let local = cfg.local_experts();
    if local_experts != local {
        return mismatch(
            "local_experts",
            format!("{local:?}"),
            format!("{local_experts:?}"),
        );
    }
    let (h, i) = (cfg.hidden, cfg.intermediate_per_rank());
    if (ex.num_experts, ex.hidden, ex.intermediate) != (local.len(), h, i) {
        return mismatch(
            "experts",
            format!("[E {}, H {h}, I {i}]", local.len()),
            format!(
                "[E {}, H {}, I {}]",
                ex.num_experts, ex.hidden, ex.intermediate
            ),
        );
    }
    copy_biases(p, ex, h, i)?;
    if let StoredExperts::Mxfp4(m) = &ex.weights {
        if cfg.quant != LayerQuant::Mxfp4 {
            return mismatch(
                "weights",
                format!("weights for a {} layer", cfg.quant.name()),
                "MXFP4 blocks".into(),
            );
        }
        let block = moe_kernels::packed::wna16::MXFP4_BLOCK;
        let (e, hb, ib) = (local.len(), h.div_ceil(block), i.div_ceil(block));
        for (name, got, want) in [
            ("w13_blocks", m.w13_blocks.len(), e * 2 * i * hb * 16),
            ("w13_scales", m.w13_scales.len(), e * 2 * i * hb),
            ("w2_blocks", m.w2_blocks.len(), e * h * ib * 16),
            ("w2_scales", m.w2_scales.len(), e * h * ib),
        ] {
            if got != want {
                return Err(LayerError::ParamShape {
                    tensor: name.into(),
                    expected: vec![want],
                    actual: vec![got],
                });
            }
        }
        p.mx = match tensors {
            Cow::Owned(ExpertTensors {
                weights: StoredExperts::Mxfp4(m),
                ..
            }) => super::params::MxBytes {
                w13_blocks: m.w13_blocks,
                w13_scales: m.w13_scales,
                w2_blocks: m.w2_blocks,
                w2_scales: m.w2_scales,
            },
            _ => super::params::MxBytes {
                w13_blocks: m.w13_blocks.clone(),
                w13_scales: m.w13_scales.clone(),
                w2_blocks: m.w2_blocks.clone(),
                w2_scales: m.w2_scales.clone(),
            },
        };
        p.mark_all_loaded();
        return Ok(());
    }
    if let StoredExperts::Float { w13, w2 } = &ex.weights
        && cfg.quant.loads_float_weights()
    {
        if cfg.quant == LayerQuant::Int8Online && cfg.tp_size > 1 {
            // The w2 row scales need the amax of the whole row, which a sliced read lacks.
            return mismatch(
                "tp_size",
                "1 for online int8 from a checkpoint".into(),
                format!("{}", cfg.tp_size),
            );
        }
        return copy_float_experts(p, w13, w2);
    }
    let StoredExperts::Int(q) = &ex.weights else {
        return mismatch(
            "weights",
            format!("weights for a {} layer", cfg.quant.name()),
            "float weights".into(),
        );
    };
    let (bits, group_size, act_order, zero_points) = match cfg.quant {
        LayerQuant::W4A8 { group_size } => (4, group_size, false, false),
        LayerQuant::W8A8 => (8, WeightGroups::Channelwise, false, false),
        LayerQuant::Wna16 {
            bits,
            group_size,
            act_order,
            zero_points,
        } => (
            bits,
            group_size,
            act_order && !group_size.is_channelwise(),
            zero_points,
        ),
        _ => {
            return mismatch(
                "weights",
                format!("weights for a {} layer", cfg.quant.name()),
                "integer codes".into(),
            );
        }
    };
    if q.bits != bits
        || q.group_size != group_size
        || q.act_order.is_some() != act_order
        || q.zeros.is_some() != zero_points
    {
        return mismatch(
            "weights",
            format!(
                "int{bits}, group size {:?}, act-order {act_order}, zero points \
                 {zero_points}",
                group_size.group_size()
            ),
            format!(
                "int{}, group size {:?}, act-order {}, zero points {}",
                q.bits,
                q.group_size.group_size(),
                q.act_order.is_some(),
                q.zeros.is_some()
            ),
        );
    }
    if let Some(z) = &q.zeros {
        for (name, zeros, scales) in [
            ("w13_qzeros", &z.w13, p.w13_scale.len()),
            ("w2_qzeros", &z.w2, p.w2_scale.len()),
        ] {
            if zeros.len() != scales {
                return Err(LayerError::ParamShape {
                    tensor: name.into(),
                    expected: vec![scales],
                    actual: vec![zeros.len()],
                });
            }
            if let Some(index) = zeros.iter().position(|&v| u32::from(v) >> bits != 0) {
                return Err(LayerError::ParamValue {
                    tensor: name.into(),
                    index,
                    value: f64::from(zeros[index]),
                    reason: "zero points must lie in [0, 2^bits)",
                });
            }
        }
        p.w13_zeros = z.w13.clone();
        p.w2_zeros = z.w2.clone();
    }
    if let Some(ao) = &q.act_order {
        let e = local.len();
        if ao.w13_g_idx.len() != e * h || ao.w2_g_idx.len() != e * i {
            return Err(LayerError::ParamShape {
                tensor: "g_idx".into(),
                expected: vec![e * h, e * i],
                actual: vec![ao.w13_g_idx.len(), ao.w2_g_idx.len()],
            });
        }
        p.w13_g_idx = ao.w13_g_idx.clone();
        p.w2_g_idx = ao.w2_g_idx.clone();
    }
    p.scale_dtype = Some(q.scale_dtype);
    for (name, got, want) in [
        ("w13", q.w13.len(), p.w13.len()),
        ("w2", q.w2.len(), p.w2.len()),
        ("w13_weight_scale", q.w13_scales.len(), p.w13_scale.len()),
        ("w2_weight_scale", q.w2_scales.len(), p.w2_scale.len()),
    ] {
        if got != want {
            return Err(LayerError::ParamShape {
                tensor: name.into(),
                expected: vec![want],
                actual: vec![got],
            });
        }
    }
    for (name, s) in [
        ("w13_weight_scale", &q.w13_scales),
        ("w2_weight_scale", &q.w2_scales),
    ] {
        check_scales(name, 0, s, cfg.quant)?;
    }
    match tensors {
        Cow::Owned(ExpertTensors {
            weights: StoredExperts::Int(q),
            ..
        }) => {
            // Lengths checked equal above.
            p.w13 = q.w13;
            p.w2 = q.w2;
            p.w13_scale = q.w13_scales;
            p.w2_scale = q.w2_scales;
        }
        _ => {
            p.w13.copy_from_slice(&q.w13);
            p.w2.copy_from_slice(&q.w2);
            p.w13_scale.copy_from_slice(&q.w13_scales);
            p.w2_scale.copy_from_slice(&q.w2_scales);
        }
    }
    p.mark_all_loaded();
    Ok(())
}

/// Copies float expert weights (already fused and sliced by the reader) into the parameters,
/// widened to f32, refusing non-finite values.
/// Copies the experts' biases, when the checkpoint has them: `w13` `[E_local, 2I]` (already
/// this rank's rows) and `w2` `[E_local, H]`, finite.
fn copy_biases(p: &mut Params, ex: &ExpertTensors, h: usize, i: usize) -> Result<(), LayerError> {
    let e = ex.num_experts;
    match (&ex.w13_bias, &ex.w2_bias) {
        (None, None) => return Ok(()),
        (Some(w13), Some(w2)) => {
            for (name, data, want, dst) in [
                ("w13_bias", w13, e * 2 * i, &mut p.w13_bias),
                ("w2_bias", w2, e * h, &mut p.w2_bias),
            ] {
                let v = data.to_f32_vec();
                if v.len() != want {
                    return Err(LayerError::ParamShape {
                        tensor: name.into(),
                        expected: vec![want],
                        actual: vec![v.len()],
                    });
                }
                if let Some(index) = v.iter().position(|x| !x.is_finite()) {
                    return Err(LayerError::ParamValue {
                        tensor: name.into(),
                        index,
                        value: f64::from(v[index]),
                        reason: "biases must be finite",
                    });
                }
                *dst = v;
            }
        }
        (w13, _) => {
            let missing = if w13.is_some() { "w2_bias" } else { "w13_bias" };
            return Err(LayerError::MissingParams {
                missing: vec![missing.into()],
            });
        }
    }
    p.mark_biases_loaded();
    Ok(())
}

fn copy_float_experts(p: &mut Params, w13: &FloatData, w2: &FloatData) -> Result<(), LayerError> {
    if w13.dtype() != w2.dtype() {
        return Err(LayerError::ParamDtype {
            tensor: "w2".into(),
            expected: format!("{:?} (the dtype of w13)", w13.dtype()),
            actual: format!("{:?}", w2.dtype()),
        });
    }
    for (name, src, dst) in [("w13", w13, &mut p.w13_f), ("w2", w2, &mut p.w2_f)] {
        if src.len() != dst.len() {
            return Err(LayerError::ParamShape {
                tensor: name.into(),
                expected: vec![dst.len()],
                actual: vec![src.len()],
            });
        }
        for (index, (d, v)) in dst.iter_mut().zip(src.to_f32_vec()).enumerate() {
            if !v.is_finite() {
                return Err(LayerError::ParamValue {
                    tensor: name.into(),
                    index,
                    value: f64::from(v),
                    reason: "weights must be finite",
                });
            }
            *d = v;
        }
    }
    // The whole-row amax of w2 (only online int8 reads it; the read is unsharded here).
    let i = p.w2_f.len() / p.w2_amax.len().max(1);
    if i > 0 {
        for (amax, row) in p.w2_amax.iter_mut().zip(p.w2_f.chunks_exact(i)) {
            *amax = moe_quant::int8::row_amax(row);
        }
    }
    p.float_dtype = Some(w13.dtype());
    p.mark_all_loaded();
    Ok(())
}

/// The checkpoint writers of the integration tests.
#[cfg(test)]
#[path = "../../tests/checkpoint_support/mod.rs"]
mod test_support;

#[cfg(test)]
mod tests {
    //! The expert-at-a-time road packs exactly what the whole-layer road packs, on every
    //! thread count.

    use super::test_support::{Fmt, runnable, temp_dir};
    use super::*;
    use crate::checkpoint::ShardAccess;

    /// The packed experts of a processed layer, compared by their bytes.
    fn same_packed(a: &MoeLayer, b: &MoeLayer) -> bool {
        let (super::super::State::Ready(a), super::super::State::Ready(b)) = (&a.state, &b.state)
        else {
            panic!("both layers must be processed");
        };
        match (&a.moe, &b.moe) {
            (super::super::Experts::W4A8(a), super::super::Experts::W4A8(b)) => {
                a.weights().w13 == b.weights().w13 && a.weights().w2 == b.weights().w2
            }
            (super::super::Experts::Wna16Native(a), super::super::Experts::Wna16Native(b)) => {
                a.weights().w13 == b.weights().w13 && a.weights().w2 == b.weights().w2
            }
            _ => false,
        }
    }

    #[test]
    fn bad_words_are_typed_errors_naming_the_tensor() {
        let good = runnable(Fmt::PackQuantized, [4, 2, 64, 32], 32, 0xbad);
        let packed = "model.layers.0.mlp.experts.2.up_proj.weight_packed";
        let scale = "model.layers.0.mlp.experts.1.down_proj.weight_scale";
        // A word tensor one word short per row, and a NaN scale.
        let mut short = good.clone();
        let t = short.tensors.get_mut(packed).unwrap();
        t.shape = vec![32, 7];
        t.bytes.truncate(32 * 7 * 4);
        let mut nan = good.clone();
        nan.tensors.get_mut(scale).unwrap().bytes[..2]
            .copy_from_slice(&half::bf16::NAN.to_le_bytes());
        for (tag, ck, tensor, expert) in [
            ("words-short", short, packed, 2),
            ("words-nan", nan, scale, 1),
        ] {
            let dir = temp_dir(tag);
            ck.write(&dir);
            let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
            let named = |e: &LayerError| match e {
                LayerError::WrongShape {
                    tensor: t,
                    expected,
                    actual,
                    ..
                } => t == tensor && expected == &[32, 8] && actual == &[32, 7],
                LayerError::BadScale { tensor: t, .. } => t == tensor,
                _ => false,
            };
            let e = ckpt.read_routed_expert_words(0, expert).err().unwrap();
            assert!(named(&e), "{tag}: {e}");
            let opts = LoadOptions::new().with_par(Par::Rayon);
            let e = MoeLayer::from_checkpoint_with(&ckpt, 0, 8, &opts)
                .err()
                .unwrap();
            assert!(named(&e), "{tag}: {e}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// Random zero points for every projection of `ck`, making it asymmetric: compressed-tensors
    /// `weight_zero_point` `[ceil(n/8), G]` packed along N, or GPTQ `qzeros` `[G, n/8]`.
    fn make_asymmetric(ck: &mut test_support::Ckpt, seed: u64) {
        use test_support::i32_bytes;
        let mut rng = moe_testutil::SplitMix64::new(seed);
        let names: Vec<String> = ck.tensors.keys().cloned().collect();
        for name in names {
            let (prefix, gptq) = match name.strip_suffix(".weight_scale") {
                Some(p) => (p, false),
                None => match name.strip_suffix(".scales") {
                    Some(p) => (p, true),
                    None => continue,
                },
            };
            let shape = ck.tensors[&name].shape.clone();
            let ((n, g), zname) = if gptq {
                ((shape[1], shape[0]), format!("{prefix}.qzeros"))
            } else {
                ((shape[0], shape[1]), format!("{prefix}.weight_zero_point"))
            };
            let words: Vec<i32> = (0..n.div_ceil(8) * g)
                .map(|_| rng.next_u64() as i32)
                .collect();
            let shape = if gptq { [g, n / 8] } else { [n.div_ceil(8), g] };
            ck.put(&zname, safetensors::Dtype::I32, &shape, i32_bytes(&words));
        }
        let qc = &mut ck.config["quantization_config"];
        if qc["quant_method"] == "gptq" {
            qc["sym"] = false.into();
        } else {
            qc["config_groups"]["group_0"]["weights"]["symmetric"] = false.into();
        }
    }

    /// gpt-oss's MXFP4 experts packed straight from the shards equal the whole-layer road's
    /// packed weights, biases and outputs.
    #[test]
    fn streamed_mxfp4_load_packs_the_same_bytes_as_the_whole_layer() {
        let m = moe_testutil::gpt_oss::GptOss::random(0x57e, [4, 2, 80, 64], 0.75);
        let dir = temp_dir("stream-mxfp4");
        m.write(&dir);
        let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
        let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 8).unwrap();
        let mut whole = MoeLayer::whole_layer(&ckpt, 0, cfg.clone()).unwrap();
        whole.process().unwrap();
        let x = moe_testutil::SplitMix64::new(9).vec_uniform(3 * m.h, -1.0, 1.0);
        let run = |layer: &MoeLayer| {
            let (mut ids, mut w) = (vec![0i32; 6], vec![0f32; 6]);
            layer.route_hidden(&x, &mut ids, &mut w).unwrap();
            let mut out = vec![0f32; x.len()];
            layer.apply_with_topk(&x, &ids, &w, &mut out).unwrap();
            out
        };
        for par in [Par::Seq, Par::Rayon] {
            let opts = LoadOptions::new().with_par(par);
            let streamed =
                MoeLayer::streamed(&ckpt, 0, &cfg, &opts).expect("the streamed road was taken");
            assert!(same_packed(&streamed, &whole), "{par:?}");
            let (super::super::State::Ready(a), super::super::State::Ready(b)) =
                (&streamed.state, &whole.state)
            else {
                panic!("both processed");
            };
            let (super::super::Experts::Wna16Native(a), super::super::Experts::Wna16Native(b)) =
                (&a.moe, &b.moe)
            else {
                panic!("both on the native WNA16 kernels");
            };
            assert_eq!(a.weights().w13_bias, b.weights().w13_bias);
            assert_eq!(a.weights().w2_bias, b.weights().w2_bias);
            assert_eq!(run(&streamed), run(&whole), "{par:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Unquantized layers (per-expert bf16 names, Llama 4's fused transposed tensors in bf16
    /// and f32, gpt-oss's with biases and a router bias) and layers with shared experts
    /// (plain, gated, quantized) take the streamed road and compute bit for bit what the
    /// whole-layer road computes, on every thread count.
    #[test]
    fn streamed_float_and_shared_expert_layers_run_as_the_whole_layer() {
        use test_support::{Ckpt, H};
        let cases = [
            ("stream-bf16", Ckpt::build("qwen3_moe", Fmt::Float, 0x5f0).0),
            (
                "stream-bf16-shared",
                Ckpt::build("deepseek_v3", Fmt::Float, 0x5f1).0,
            ),
            (
                "stream-bf16-gated",
                Ckpt::build("qwen3_next", Fmt::Float, 0x5f2).0,
            ),
            (
                "stream-llama4",
                Ckpt::build("llama4_text", Fmt::Float, 0x5f3).0,
            ),
            (
                "stream-llama4-fused",
                Ckpt::build("llama4_text", Fmt::Float, 0x5f4)
                    .0
                    .fused_llama4_experts(),
            ),
            ("stream-llama4-fused-f32", {
                // The same layout in f32: packed through the widening K-major road.
                let mut ck = Ckpt::build("llama4_text", Fmt::Float, 0x5f7)
                    .0
                    .fused_llama4_experts();
                for t in ck.tensors.values_mut() {
                    let wide = t.bytes.chunks_exact(2).flat_map(|b| {
                        half::bf16::from_le_bytes([b[0], b[1]])
                            .to_f32()
                            .to_le_bytes()
                    });
                    t.bytes = wide.collect();
                    t.dtype = safetensors::Dtype::F32;
                }
                ck.config["torch_dtype"] = "float32".into();
                ck
            }),
            (
                "stream-wna16-shared",
                Ckpt::build("glm4_moe", Fmt::Gptq, 0x5f5).0,
            ),
            (
                "stream-gpt-oss-bf16",
                Ckpt::gpt_oss_bf16(&moe_testutil::gpt_oss::GptOss::random(
                    0x5f6,
                    [4, 2, H, 32],
                    7.0,
                )),
            ),
        ];
        let x = moe_testutil::SplitMix64::new(10).vec_uniform(5 * H, -1.0, 1.0);
        for (tag, ck) in cases {
            let dir = temp_dir(tag);
            ck.write(&dir);
            let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
            let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 8).unwrap();
            let k = cfg.top_k;
            let run = |layer: &MoeLayer| {
                let (mut ids, mut w) = (vec![0i32; 5 * k], vec![0f32; 5 * k]);
                layer.route_hidden(&x, &mut ids, &mut w).unwrap();
                let mut out = vec![0f32; x.len()];
                layer.apply_with_topk(&x, &ids, &w, &mut out).unwrap();
                out
            };
            let mut whole = MoeLayer::whole_layer(&ckpt, 0, cfg.clone()).unwrap();
            whole.process().unwrap();
            let want = run(&whole);
            for par in [Par::Seq, Par::Rayon] {
                let opts = LoadOptions::new().with_par(par);
                let streamed = MoeLayer::streamed(&ckpt, 0, &cfg, &opts)
                    .unwrap_or_else(|| panic!("{tag}: the streamed road was not taken"));
                assert_eq!(run(&streamed), want, "{tag} {par:?}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn streamed_load_packs_the_same_bytes_as_the_whole_layer() {
        let gptq = |seed| test_support::Ckpt::build("qwen3_moe", Fmt::Gptq, seed).0;
        let cases = [
            (
                "stream-w4a8",
                runnable(Fmt::IntQuantized, [6, 2, 256, 128], 32, 0x10ad),
                false,
                false,
            ),
            (
                "stream-wna16",
                runnable(Fmt::PackQuantized, [6, 2, 256, 128], 128, 0x10ad),
                false,
                true,
            ),
            (
                "stream-wna16-odd",
                runnable(Fmt::PackQuantized, [3, 2, 24, 40], 8, 0x10ae),
                false,
                true,
            ),
            (
                "stream-wna16-asym",
                runnable(Fmt::PackQuantized, [6, 2, 256, 128], 64, 0x10af),
                true,
                true,
            ),
            ("stream-gptq", gptq(0x10b0), false, true),
            ("stream-gptq-asym", gptq(0x10b1), true, true),
        ];
        // AWQ, act-order and 8-bit codes on ragged shapes (K past a step or a word, N past a
        // panel), each format, grouped and channelwise.
        use test_support::{Wna16Spec, Wna16Store};
        let spec = |store, bits, group, act_order, asym, shape| Wna16Spec {
            store,
            bits,
            group,
            act_order,
            asym,
            shape,
        };
        let (ragged, odd) = ([3, 2, 24, 40], [3, 2, 20, 12]);
        let specs = [
            spec(Wna16Store::Awq, 4, Some(8), false, true, ragged),
            spec(Wna16Store::Awq, 4, None, false, true, [2, 2, 40, 24]),
            spec(Wna16Store::Gptq, 4, Some(8), true, false, ragged),
            spec(Wna16Store::Gptq, 4, Some(8), true, true, ragged),
            spec(Wna16Store::Gptq, 8, Some(8), false, false, ragged),
            spec(Wna16Store::Gptq, 8, Some(8), true, true, ragged),
            spec(Wna16Store::Gptq, 8, None, false, false, [2, 2, 36, 20]),
            spec(Wna16Store::PackQuantized, 4, Some(8), true, false, ragged),
            spec(
                Wna16Store::PackQuantized,
                4,
                Some(16),
                true,
                true,
                [2, 2, 48, 32],
            ),
            spec(Wna16Store::PackQuantized, 8, Some(8), false, false, ragged),
            spec(Wna16Store::PackQuantized, 8, Some(8), true, true, ragged),
            spec(Wna16Store::PackQuantized, 8, None, false, true, odd),
            spec(Wna16Store::PackQuantized, 8, None, false, false, odd),
        ];
        let cases = cases
            .into_iter()
            .map(|(tag, ck, asym, words)| (tag.to_string(), ck, asym, words))
            .chain(specs.iter().enumerate().map(|(x, s)| {
                let ck = test_support::wna16(s, 0x3000 + x as u64);
                (format!("stream-words-{x} {s:?}"), ck, false, true)
            }));
        for (tag, mut ck, asym, words) in cases {
            if asym {
                make_asymmetric(&mut ck, 0x2e50);
            }
            let dir = temp_dir(tag.split(' ').next().unwrap_or("stream"));
            ck.write(&dir);
            let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
            // The word formats are read as words: the road under test.
            let read = ckpt.read_routed_expert_words(0, 0).unwrap();
            assert_eq!(read.is_some(), words, "{tag}");
            let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 8).unwrap();
            let mut whole = MoeLayer::whole_layer(&ckpt, 0, cfg.clone()).unwrap();
            whole.set_parallelism(Par::Seq);
            whole.process().unwrap();
            let experts = cfg.local_experts().len();
            for par in [Par::Seq, Par::Rayon] {
                let seen = std::sync::Mutex::new(Vec::new());
                let report = |p: LoadProgress| seen.lock().unwrap().push(p.done);
                let opts = LoadOptions::new().with_par(par).with_progress(&report);
                let streamed = MoeLayer::streamed(&ckpt, 0, &cfg, &opts)
                    .unwrap_or_else(|| panic!("{tag}: the streamed road was not taken"));
                assert!(same_packed(&streamed, &whole), "{tag} {par:?}");
                let mut seen = seen.into_inner().unwrap();
                seen.sort_unstable();
                assert_eq!(seen, (1..=experts).collect::<Vec<_>>(), "{tag} {par:?}");
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
