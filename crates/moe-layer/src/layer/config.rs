//! [`MoeLayerConfig`]: everything a MoE layer is created from (sizes, parallelism, activation,
//! routing, quantization scheme, largest call), and its derivation from a checkpoint's
//! [`MoeModelSpec`](crate::checkpoint::MoeModelSpec).

use moe_kernels::{Activation, GateUpLayout, W4A8Prefill};
use moe_oracle::DisabledKernels;
use moe_quant::{DType, QuantKey, WeightGroups};
#[cfg(feature = "checkpoint")]
use moe_router::{Grouping, ScalingPlacement, ScoringFunc};
use moe_router::{RoundingProfile, RouterConfig};

use crate::LayerError;

/// How the experts' weights are stored and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerQuant {
    /// compressed-tensors `int-quantized` W4A8: int4 codes stored as int8, static symmetric
    /// scales (groups of `g` input columns per scale, or channelwise), dynamic per-token int8
    /// activations. Group scales are run as bf16 (the kernels' format): f32 checkpoint
    /// scales are rounded to bf16 at load, as vLLM does.
    W4A8 {
        /// The scale grouping: groups of input columns, or one scale per output channel.
        group_size: WeightGroups,
    },
    /// vLLM's online int8 method (seed 004): bf16/f16/f32 weights are loaded and quantized per
    /// output row to int8 in `process` (moe-quant's `int8` module, bit-exact with vLLM), then
    /// run on the W8A8 kernels with dynamic per-token int8 activations. The `w2` rows' scale
    /// uses the amax of the whole (unsharded) row, as the newest vLLM all-reduces it.
    Int8Online,
    /// compressed-tensors `int-quantized` W8A8 (`INT8_W8A8`): int8 codes (any of `−128..=127`)
    /// with static symmetric per-output-channel scales, run on the W8A8 kernels with dynamic
    /// per-token int8 activations: the online int8 method's compute on the checkpoint's own
    /// codes. Scales are widened to f32 (exact), as vLLM's int8 MoE method keeps them.
    W8A8,
    /// Unquantized experts: bf16/f16/f32 weights kept in their precision (bf16 stays bf16,
    /// f16 is widened to f32 exactly) and run with f32 compute, no activation quantization.
    Unquantized,
    /// Weight-only integers (WNA16: GPTQ, AWQ or compressed-tensors `pack-quantized`),
    /// 4 or 8 bits, group sizes 32/64/128 or channelwise, optional act-order, optional zero
    /// points, float activations and f32 accumulation, packed for the native WNA16 kernels in
    /// `process` (act-order sorted by group once); with the `cpu-wna16` kernel disabled
    /// symmetric weights are repacked into Marlin's layout for the CPU Marlin executor (which
    /// has no zero points). Scales must be bf16 or f16.
    Wna16 {
        /// Bits per code, 4 or 8.
        bits: u32,
        /// The scale grouping: groups of input columns, or channelwise.
        group_size: WeightGroups,
        /// Rows carry act-order group indices (`g_idx`).
        act_order: bool,
        /// Asymmetric codes: every scale group has a zero point (GPTQ `sym: false`, AWQ),
        /// loaded from a checkpoint with the weights.
        zero_points: bool,
    },
    /// MXFP4 (gpt-oss): e2m1 codes with an e8m0 scale per 32 input columns, float
    /// activations and f32 compute, on the native WNA16 kernels (the codes decode through the
    /// e2m1 table). Loaded from a checkpoint's fused tensors
    /// ([`crate::MoeLayer::load_from_checkpoint`], or `load_layer_tensors` with the reader's
    /// MXFP4 experts), not tensor by tensor.
    Mxfp4,
    /// FP8 weights: e4m3 codes with f32 scales per `128 × 128` block (DeepSeek-V3/R1, Qwen3
    /// `-FP8`), per output channel (compressed-tensors `FP8_DYNAMIC`) or per tensor (AutoFP8,
    /// compressed-tensors `FP8`), run on the native WNA16 kernels (a block row's scales are
    /// its channels' group scales of 128; channel and tensor scales make channelwise weights)
    /// with float activations and f32 accumulation; the checkpoint's fp8 activation
    /// quantization (dynamic, or static `input_scale`s) is not emulated. Loaded from a
    /// checkpoint (`MoeLayer::from_checkpoint` and its variants, with the `checkpoint`
    /// feature), which packs each expert straight from the stored bytes, or from experts the
    /// caller packed ([`crate::MoeLayer::load_packed_fp8_experts`]), never tensor by tensor; H
    /// and I need not be multiples of 128, but a tensor-parallel slice of I of block-scaled
    /// weights must be.
    Fp8 {
        /// How the weights are scaled.
        scaling: Fp8Scaling,
    },
}

/// How the f32 scales of FP8 weights are laid out (each projection has its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fp8Scaling {
    /// One scale per `128 × 128` block of `[N, K]`.
    Blocks,
    /// One scale per output channel.
    Channels,
    /// One scale for the whole projection (gate, up and down each have their own).
    Tensor,
}

impl Fp8Scaling {
    /// A short name for reports: `block`, `channel`, `tensor`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Blocks => "block",
            Self::Channels => "channel",
            Self::Tensor => "tensor",
        }
    }

    /// The oracle's weight key for these scales.
    pub(crate) fn weight_key(self) -> QuantKey {
        match self {
            Self::Blocks => QuantKey::FP8_STATIC_128_BLOCK_SYM,
            Self::Channels => QuantKey::FP8_STATIC_CHANNEL_SYM,
            Self::Tensor => QuantKey::FP8_STATIC_TENSOR_SYM,
        }
    }
}

impl LayerQuant {
    /// Scale columns per row of a `[rows, k]` weight.
    pub(crate) fn scale_cols(self, k: usize) -> usize {
        match self {
            Self::W4A8 { group_size } | Self::Wna16 { group_size, .. } => group_size.scale_cols(k),
            Self::Int8Online | Self::W8A8 | Self::Unquantized | Self::Mxfp4 | Self::Fp8 { .. } => 1,
        }
    }

    /// The scale grouping of the integer and MXFP4 schemes (`None` for float weights and FP8,
    /// whose block scales are not grouped along K alone).
    pub(crate) fn groups(self) -> Option<WeightGroups> {
        match self {
            Self::W4A8 { group_size } | Self::Wna16 { group_size, .. } => Some(group_size),
            Self::Mxfp4 => Some(moe_kernels::packed::wna16::MXFP4_GROUPS),
            Self::W8A8 => Some(WeightGroups::Channelwise),
            Self::Int8Online | Self::Unquantized | Self::Fp8 { .. } => None,
        }
    }

    /// Input columns per scale group of the integer schemes (`None`: channelwise or float).
    pub(crate) fn group_size(self) -> Option<usize> {
        self.groups().and_then(WeightGroups::group_size)
    }

    /// The range of the signed integer codes the layer loads.
    pub(crate) fn code_range(self) -> (i8, i8) {
        match self {
            Self::Wna16 { bits: 8, .. } | Self::W8A8 => (i8::MIN, i8::MAX),
            _ => (-8, 7),
        }
    }

    /// Whether the layer loads float expert weights (and no scales).
    pub(crate) fn loads_float_weights(self) -> bool {
        matches!(self, Self::Int8Online | Self::Unquantized)
    }

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::W4A8 { .. } => "w4a8-int8",
            Self::Int8Online => "int8-online",
            Self::W8A8 => "w8a8-int8",
            Self::Unquantized => "unquantized",
            Self::Wna16 { .. } => "wna16",
            Self::Mxfp4 => "mxfp4",
            Self::Fp8 {
                scaling: Fp8Scaling::Blocks,
            } => "fp8-block",
            Self::Fp8 {
                scaling: Fp8Scaling::Channels,
            } => "fp8-channel",
            Self::Fp8 {
                scaling: Fp8Scaling::Tensor,
            } => "fp8-tensor",
        }
    }
}

/// What the activations of a WNA16 layer are multiplied in.
///
/// WNA16 checkpoints are calibrated for float activations, and [`Self::Float`] computes
/// exactly that. [`Self::DynamicInt8`] is a trade the caller makes knowingly: symmetric int4
/// weights without act-order run on the W4A8 int8 dot-product kernels, with each token's
/// activations quantized to int8 per row (asymmetric, as W4A8 does) and the group scales
/// rounded to bf16. That does twice the multiply-adds per instruction of the float path,
/// which is what decode of several tokens per expert needs to stay at the memory bound, at the
/// cost of W4A8's numerics (an extra error of about 1 % relative L2 on typical layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Wna16Activations {
    /// Float activations, f32 accumulation: the checkpoint's own numerics.
    #[default]
    Float,
    /// Dynamic per-token int8 activations on the W4A8 kernels.
    DynamicInt8,
}

impl Wna16Activations {
    /// The name used by the CLI and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Float => "float",
            Self::DynamicInt8 => "int8",
        }
    }
}

/// The shared experts of a MoE block, fused into one MLP (`n_shared_experts` experts of the
/// routed width, or Qwen2-MoE's `shared_expert_intermediate_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedExperts {
    /// Full intermediate size of the fused shared MLP (before tensor-parallel division).
    pub intermediate: usize,
    /// Whether a sigmoid gate `shared_expert_gate` `[1, H]` scales its output per token
    /// (Qwen2-MoE).
    pub gated: bool,
}

/// The description of one MoE layer on one rank.
///
/// Build it with [`MoeLayerConfig::new`] (one rank, every expert local, SiLU experts, vLLM's
/// CPU softmax router) and adjust it with the `with_*` methods or by assigning the public
/// fields; the struct is `#[non_exhaustive]` so that new settings can be added with defaults.
///
/// ```
/// use moe_layer::{LayerQuant, MoeLayerConfig, WeightGroups};
///
/// let quant = LayerQuant::W4A8 { group_size: WeightGroups::groups(32)? };
/// let cfg = MoeLayerConfig::new(8, 2, 128, 64, quant)
///     .with_tensor_parallel(1, 2)
///     .with_max_tokens(16);
/// assert_eq!(cfg.intermediate_per_rank(), 32);
/// # Ok::<(), moe_quant::QuantError>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MoeLayerConfig {
    /// Experts of the whole model (`E`).
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Full intermediate size (before tensor-parallel division).
    pub intermediate: usize,
    /// This rank's tensor-parallel index.
    pub tp_rank: usize,
    /// Tensor-parallel ranks.
    pub tp_size: usize,
    /// Global-to-local expert map (`-1` = another rank's), or `None` for every expert local.
    pub expert_map: Option<Vec<i32>>,
    /// This rank's expert-parallel index (with [`Self::ep_size`]).
    pub ep_rank: usize,
    /// Expert-parallel ranks (1 = no expert parallelism). The oracle judges the layer with
    /// this parallel configuration, so a layer is refused under expert parallelism exactly
    /// where the oracle refuses it; the experts this rank holds are `expert_map`'s, which
    /// with more than one rank must hold this rank's share (`E / ep_size`, one more on the
    /// first `E % ep_size` ranks; [`LayerError::ExpertParallelMap`] otherwise).
    pub ep_size: usize,
    /// The gated activation.
    pub activation: Activation,
    /// How the gate and up rows of `w13` are laid out: gate rows then up rows
    /// (`Concatenated`, the default), or alternating (`Interleaved`, gpt-oss).
    pub gate_up_layout: GateUpLayout,
    /// The router linear has a bias `[E]` (gpt-oss) that
    /// [`crate::MoeLayer::load_router_bias`] must load before `process` finishes; it is added
    /// to the logits [`crate::MoeLayer::route_hidden`] computes.
    pub router_has_bias: bool,
    /// The router (global expert ids: keep its expert map unset; the layer's `expert_map`
    /// applies in the kernels).
    pub router: RouterConfig,
    /// The router's `e_score_correction_bias` is a checkpoint tensor still to be loaded
    /// ([`crate::MoeLayer::load_router_correction_bias`]): `process` refuses to finish until it
    /// is, because grouped top-k without the bias is a different algorithm, not an
    /// approximation.
    pub router_bias_pending: bool,
    /// The always-active shared experts of the block (DeepSeek, Qwen2-MoE), run as one more
    /// MLP on every token and added to the routed output; `None` when the block has none.
    pub shared_experts: Option<SharedExperts>,
    /// The weight scheme.
    pub quant: LayerQuant,
    /// What WNA16 weights are multiplied with (the other schemes ignore it).
    pub wna16_activations: Wna16Activations,
    /// The model (activation) dtype, for backend selection.
    pub in_dtype: DType,
    /// Largest token count of one kernel call: scratch is sized for it, larger calls are cut
    /// into pieces of this size (which does not change results: every token is independent).
    pub max_tokens: usize,
    /// Kernels the backend selection must not choose; `None` reads the process-wide
    /// `MOE_DISABLED_KERNELS` when the layer is processed.
    pub disabled_kernels: Option<DisabledKernels>,
    /// The numerics of W4A8 calls with many rows per expert ([`W4A8Prefill`]: exact int8, the
    /// default, or one of the faster paths with other numerics where the CPU has it); `None`
    /// reads the process-wide `MOE_KERNELS_W4A8_PREFILL` when the layer is processed. WNA16
    /// layers on int8 activations ([`Wna16Activations::DynamicInt8`]) follow it too.
    pub w4a8_prefill: Option<W4A8Prefill>,
}

impl MoeLayerConfig {
    /// A layer of `num_experts` experts (`top_k` per token, hidden size `hidden`, full
    /// intermediate size `intermediate`) stored as `quant`, on a single rank holding every
    /// expert, with SiLU experts, vLLM's CPU softmax router renormalizing the top-k weights
    /// ([`vllm_cpu_softmax_router`]), bf16 activations and calls of up to 256 tokens.
    /// Nothing is checked until [`MoeLayer::create`](crate::MoeLayer::create).
    pub fn new(
        num_experts: usize,
        top_k: usize,
        hidden: usize,
        intermediate: usize,
        quant: LayerQuant,
    ) -> Self {
        Self {
            num_experts,
            top_k,
            hidden,
            intermediate,
            tp_rank: 0,
            tp_size: 1,
            expert_map: None,
            ep_rank: 0,
            ep_size: 1,
            activation: Activation::SILU,
            gate_up_layout: GateUpLayout::Concatenated,
            router_has_bias: false,
            router: vllm_cpu_softmax_router(num_experts, top_k, true),
            router_bias_pending: false,
            shared_experts: None,
            quant,
            wna16_activations: Wna16Activations::Float,
            in_dtype: DType::BF16,
            max_tokens: 256,
            disabled_kernels: None,
            w4a8_prefill: None,
        }
    }

    /// Multiplies WNA16 weights with `activations` ([`Wna16Activations`]).
    pub fn with_wna16_activations(mut self, activations: Wna16Activations) -> Self {
        self.wna16_activations = activations;
        self
    }

    /// Whether the experts run on the W4A8 kernels with int8 activations although the
    /// weights are WNA16 ([`Wna16Activations::DynamicInt8`]).
    pub(crate) fn wna16_on_w4a8(&self) -> bool {
        matches!(self.quant, LayerQuant::Wna16 { .. })
            && self.wna16_activations == Wna16Activations::DynamicInt8
    }

    /// This rank's place in a tensor-parallel group of `tp_size` ranks.
    pub fn with_tensor_parallel(mut self, tp_rank: usize, tp_size: usize) -> Self {
        self.tp_rank = tp_rank;
        self.tp_size = tp_size;
        self
    }

    /// The global-to-local expert map (`-1` = another rank's expert), for expert parallelism.
    ///
    /// With `ep_size` 1 (the default) any map is accepted, unlike vLLM, which passes none
    /// there: a host that places experts on its own layers sums their outputs as it would
    /// expert-parallel ranks', and the shared experts are added by the layer holding global
    /// expert 0 only ([`Self::adds_shared_experts`]).
    pub fn with_expert_map(mut self, expert_map: Option<Vec<i32>>) -> Self {
        self.expert_map = expert_map;
        self
    }

    /// This rank's place in an expert-parallel group of `ep_size` ranks, as the oracle sees
    /// it (the experts held are [`Self::with_expert_map`]'s, which must number this rank's
    /// share when `ep_size > 1`; [`linear_expert_map`] gives vLLM's linear placement).
    pub fn with_expert_parallel(mut self, ep_rank: usize, ep_size: usize) -> Self {
        self.ep_rank = ep_rank;
        self.ep_size = ep_size;
        self
    }

    /// The gated activation of the experts.
    pub fn with_activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// The router (it must produce global ids and agree on `num_experts` and `top_k`).
    pub fn with_router(mut self, router: RouterConfig) -> Self {
        self.router = router;
        self
    }

    /// The model (activation) dtype, used by backend selection.
    pub fn with_in_dtype(mut self, in_dtype: DType) -> Self {
        self.in_dtype = in_dtype;
        self
    }

    /// The largest token count of one kernel call (scratch is sized for it).
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Keeps backend selection off the kernels in `disabled` (in place of
    /// `MOE_DISABLED_KERNELS`), e.g. to run WNA16 weights on the Marlin executor by disabling
    /// `cpu-wna16`.
    pub fn with_disabled_kernels(mut self, disabled: DisabledKernels) -> Self {
        self.disabled_kernels = Some(disabled);
        self
    }

    /// Runs W4A8 calls with many rows per expert with `prefill` (in place of
    /// `MOE_KERNELS_W4A8_PREFILL`); the layer's `BackendInfo::ops` says what is in force.
    pub fn with_w4a8_prefill(mut self, prefill: W4A8Prefill) -> Self {
        self.w4a8_prefill = Some(prefill);
        self
    }

    /// Intermediate size per tensor-parallel rank.
    pub fn intermediate_per_rank(&self) -> usize {
        self.intermediate / self.tp_size.max(1)
    }

    /// Global ids of the local experts, in local-id order.
    pub fn local_experts(&self) -> Vec<usize> {
        match &self.expert_map {
            None => (0..self.num_experts).collect(),
            Some(map) => {
                let mut local: Vec<(i32, usize)> = map
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| **l >= 0)
                    .map(|(g, l)| (*l, g))
                    .collect();
                local.sort_unstable();
                local.into_iter().map(|(_, g)| g).collect()
            }
        }
    }

    /// The backend and kernel a layer of this configuration runs on here, chosen by the rules
    /// `process` applies (the oracle's native rules, this machine's rungs, the deny-list of
    /// [`Self::disabled_kernels`] or `MOE_DISABLED_KERNELS`), or why none can: what `moe inspect` reports is what
    /// `moe run` then runs.
    pub fn select_backend(&self) -> Result<moe_oracle::Selection, LayerError> {
        self.validate()?;
        let router = moe_router::Router::new(self.router.clone())?;
        Ok(super::backend::select(self, &router)?.0)
    }

    /// Whether this rank adds the shared experts' output: without expert parallelism always,
    /// with it only on the rank holding global expert 0, so that the sum over the ranks
    /// counts the shared experts once.
    pub fn adds_shared_experts(&self) -> bool {
        self.expert_map
            .as_ref()
            .is_none_or(|map| map.first().is_some_and(|&local| local >= 0))
    }

    /// The shared MLP as a layer of its own: one expert, top-1, the shared width, the same
    /// weights scheme, activation and tensor parallelism, every expert local.
    pub(crate) fn shared_view(&self) -> Option<MoeLayerConfig> {
        let shared = self.shared_experts?;
        Some(MoeLayerConfig {
            num_experts: 1,
            top_k: 1,
            intermediate: shared.intermediate,
            expert_map: None,
            ep_rank: 0,
            ep_size: 1,
            router: RouterConfig::cpu_softmax(1, 1),
            router_bias_pending: false,
            router_has_bias: false,
            shared_experts: None,
            ..self.clone()
        })
    }

    /// Checks sizes, parallelism and the expert map.
    pub(crate) fn validate(&self) -> Result<(), LayerError> {
        if let Some(shared) = self.shared_view() {
            shared.validate()?;
        }
        let bad = |field, reason: String| Err(LayerError::InvalidArgument { field, reason });
        for (field, v) in [
            ("num_experts", self.num_experts),
            ("top_k", self.top_k),
            ("hidden", self.hidden),
            ("intermediate", self.intermediate),
            ("tp_size", self.tp_size),
            ("ep_size", self.ep_size),
            ("max_tokens", self.max_tokens),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        // Every parameter buffer `create` allocates (up to 4 bytes per weight element) must be
        // representable: a hostile or mistaken config is an error, not an overflow or an
        // abort in the allocator.
        let i = self.intermediate / self.tp_size;
        let bytes = [self.num_experts, 2, i, self.hidden, 4]
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return bad(
                "hidden",
                format!(
                    "expert weights of {} experts × 2·{i} × {} elements do not fit in memory",
                    self.num_experts, self.hidden
                ),
            );
        }
        if self.top_k > self.num_experts {
            return bad(
                "top_k",
                format!("{} exceeds num_experts {}", self.top_k, self.num_experts),
            );
        }
        if self.ep_rank >= self.ep_size {
            return bad(
                "ep_rank",
                format!("{} is outside 0..ep_size {}", self.ep_rank, self.ep_size),
            );
        }
        if self.tp_rank >= self.tp_size {
            return Err(LayerError::TensorParallel {
                tp_rank: self.tp_rank,
                tp_size: self.tp_size,
                reason: "rank outside 0..tp_size".into(),
            });
        }
        if !self.intermediate.is_multiple_of(self.tp_size) {
            return Err(LayerError::TensorParallel {
                tp_rank: self.tp_rank,
                tp_size: self.tp_size,
                reason: format!(
                    "intermediate size {} does not split into {} equal parts",
                    self.intermediate, self.tp_size
                ),
            });
        }
        if let LayerQuant::Wna16 { bits, .. } = self.quant
            && bits != 4
            && bits != 8
        {
            return bad("quant", format!("WNA16 codes are 4 or 8 bits, not {bits}"));
        }
        self.validate_wna16_activations()?;
        if let Some(g) = self.quant.group_size() {
            let i = self.intermediate_per_rank();
            // An MXFP4 row may end in a partial block (its nibbles past H are ignored); the
            // down projection's K is sliced by rank, so it must hold whole blocks.
            let ragged_h = self.quant == LayerQuant::Mxfp4;
            if !(ragged_h || self.hidden.is_multiple_of(g)) {
                return Err(LayerError::GroupSizeNotDividing {
                    tensor: "w13".into(),
                    group_size: g,
                    k: self.hidden,
                });
            }
            if !i.is_multiple_of(g) {
                return Err(LayerError::GroupSizeNotDividing {
                    tensor: "w2 (per tensor-parallel rank)".into(),
                    group_size: g,
                    k: i,
                });
            }
        }
        if self.router.num_experts != self.num_experts || self.router.top_k != self.top_k {
            return bad(
                "router",
                format!(
                    "router has {} experts / top-{}, layer {} / top-{}",
                    self.router.num_experts, self.router.top_k, self.num_experts, self.top_k
                ),
            );
        }
        if self.router.expert_map.is_some() {
            return bad(
                "router",
                "the router must produce global ids (the layer's expert_map applies)".into(),
            );
        }
        if let Some(map) = &self.expert_map {
            if map.len() != self.num_experts {
                return Err(LayerError::ExpertMap {
                    reason: format!(
                        "length {} but num_experts = {}",
                        map.len(),
                        self.num_experts
                    ),
                });
            }
            let local = self.local_experts();
            let mut ids: Vec<i32> = map.iter().copied().filter(|&l| l >= 0).collect();
            ids.sort_unstable();
            let dense = ids.iter().enumerate().all(|(i, &l)| l as usize == i);
            if local.is_empty() || !dense || map.iter().any(|&l| l < -1) {
                return Err(LayerError::ExpertMap {
                    reason: "local ids must be 0..n_local, each once, others -1".into(),
                });
            }
        }
        self.validate_expert_parallel()
    }

    /// Under expert parallelism (`ep_size > 1`) the expert map must hold this rank's share of
    /// the experts, as vLLM's `determine_expert_map` gives it: `E / ep_size`, one more on the
    /// first `E % ep_size` ranks, under either placement (linear or round robin) or any
    /// rearrangement of one. Without a map every rank would hold every expert, and the sum
    /// over the ranks would count each expert `ep_size` times. With `ep_size == 1` the oracle
    /// judges a single rank and the map, if any, is the caller's own placement.
    fn validate_expert_parallel(&self) -> Result<(), LayerError> {
        if self.ep_size <= 1 {
            return Ok(());
        }
        let expected =
            moe_router::ExpertMap::local_count(self.num_experts, self.ep_size, self.ep_rank)?;
        let actual = self
            .expert_map
            .as_ref()
            .map(|map| map.iter().filter(|&&l| l >= 0).count());
        if actual != Some(expected) {
            return Err(LayerError::ExpertParallelMap {
                ep_rank: self.ep_rank,
                ep_size: self.ep_size,
                num_experts: self.num_experts,
                expected,
                actual,
            });
        }
        Ok(())
    }
}

impl MoeLayerConfig {
    /// Checks that int8 activations were asked of WNA16 weights the W4A8 kernels hold: int4 codes
    /// that are symmetric (W4A8 has no zero points), in activation order (it has no column
    /// permutation), with groups of a multiple of 32 or one scale per channel.
    fn validate_wna16_activations(&self) -> Result<(), LayerError> {
        if self.wna16_activations == Wna16Activations::Float {
            return Ok(());
        }
        let refuse = |reason: String| {
            Err(LayerError::InvalidArgument {
                field: "wna16_activations",
                reason,
            })
        };
        if matches!(self.quant, LayerQuant::Fp8 { .. }) {
            return refuse(
                "int8 activations run on the W4A8 kernels, which hold 4-bit integer codes, not \
                 e4m3 ones"
                    .into(),
            );
        }
        let LayerQuant::Wna16 {
            bits,
            group_size,
            act_order,
            zero_points,
        } = self.quant
        else {
            // The setting is about WNA16 weights; the other schemes have their own numerics.
            return Ok(());
        };
        if bits != 4 {
            return refuse(format!(
                "int8 activations run on the W4A8 kernels, which hold 4-bit codes, not {bits}-bit"
            ));
        }
        if zero_points {
            return refuse(
                "int8 activations need symmetric weights: the W4A8 kernels have no zero points"
                    .into(),
            );
        }
        if act_order && !group_size.is_channelwise() {
            return refuse(
                "int8 activations need weights in activation order: the W4A8 kernels cannot \
                 permute act-order columns"
                    .into(),
            );
        }
        if let Some(g) = group_size.group_size()
            && !g.is_multiple_of(32)
        {
            return refuse(format!(
                "int8 activations need groups of a multiple of 32 values, not {g}"
            ));
        }
        Ok(())
    }
}

/// The router vLLM's CPU path uses for softmax models (Qwen2/3-MoE, Mixtral):
/// `cpu_router._softmax_topk`, renormalized when the model says so, with every op rounded to
/// the logits dtype as eager PyTorch does ([`RoundingProfile::TorchEager`]; identical to f32
/// for f32 logits).
pub fn vllm_cpu_softmax_router(
    num_experts: usize,
    top_k: usize,
    renormalize: bool,
) -> RouterConfig {
    RouterConfig::cpu_softmax(num_experts, top_k)
        .with_renormalize(renormalize)
        .with_rounding(RoundingProfile::TorchEager)
}

/// vLLM's linear placement of `num_experts` experts on `ep_size` expert-parallel ranks (rank
/// `r` holds a contiguous range, the first `E % ep_size` ranks one more): rank `ep_rank`'s
/// global-to-local map, or `None` for a single rank.
pub fn linear_expert_map(
    num_experts: usize,
    ep_rank: usize,
    ep_size: usize,
) -> Result<Option<Vec<i32>>, LayerError> {
    if (ep_rank, ep_size) == (0, 1) {
        return Ok(None);
    }
    let map = moe_router::ExpertMap::new(
        num_experts,
        ep_size,
        ep_rank,
        moe_router::ExpertPlacement::Linear,
    )
    .map_err(|e| LayerError::InvalidArgument {
        field: "ep_rank",
        reason: e.to_string(),
    })?;
    Ok(Some(map.as_slice().to_vec()))
}

/// The router a checkpoint's routing calls for (spec section 2): Llama 4's top-k sigmoid on the
/// token; vLLM's CPU softmax top-k for plain softmax models; otherwise scored top-k (softmax, sigmoid, ...) or grouped top-k
/// (DeepSeek's `n_group`/`topk_group`, top-2 group sums when the model has a correction
/// bias), with the routed scaling factor applied to the weights as vLLM's grouped and biased
/// routers do. The correction bias itself is a tensor, loaded later.
#[cfg(feature = "checkpoint")]
pub fn router_from_spec(
    routing: &crate::checkpoint::RoutingSpec,
    num_experts: usize,
    top_k: usize,
) -> Result<RouterConfig, String> {
    let r = routing;
    if r.llama4 {
        return Ok(RouterConfig::llama4(num_experts, top_k));
    }
    if let Some(jitter) = r.sparse_mixer_jitter {
        if top_k != 2 {
            return Err(format!(
                "the sparse mixer routes two experts per token, not {top_k}"
            ));
        }
        return Ok(RouterConfig::sparse_mixer(num_experts, jitter));
    }
    // One group is no grouping, except in the label vLLM gives a biased router: with
    // `num_expert_group` set it is DeepSeekV3 (GLM-4 MoE, Kimi-K2), which kernels accept with
    // any scaling factor, where the ungrouped biased router is MiniMax2 only at a factor of 1.
    let grouped = r
        .num_expert_group
        .filter(|&g| g > 1 || r.has_correction_bias);
    let plain_softmax = r.scoring == ScoringFunc::Softmax && !r.has_correction_bias;
    let cfg = match grouped {
        Some(groups) => {
            let topk_group = r
                .topk_group
                .ok_or_else(|| format!("n_group = {groups} needs topk_group"))?;
            RouterConfig::grouped_topk(
                num_experts,
                top_k,
                r.scoring,
                Grouping::new(groups, topk_group),
            )
            .with_renormalize(r.renormalize)
            .with_rounding(RoundingProfile::TorchCompiled)
        }
        None if plain_softmax && r.routed_scaling_factor == 1.0 => {
            return Ok(vllm_cpu_softmax_router(num_experts, top_k, r.renormalize));
        }
        None => RouterConfig::scored_topk(num_experts, top_k, r.scoring)
            .with_renormalize(r.renormalize)
            .with_rounding(RoundingProfile::TorchEager),
    };
    Ok(cfg.with_routed_scaling(r.routed_scaling_factor, ScalingPlacement::OnWeights))
}
