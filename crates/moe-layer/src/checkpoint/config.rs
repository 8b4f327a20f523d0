//! `config.json` of a Hugging Face model directory → [`MoeModelSpec`], the normalized MoE
//! description the loader works from.
//!
//! The families differ in spelling, not in substance:
//!
//! | quantity | Qwen2-MoE / Qwen3-MoE | Mixtral | DeepSeek-V2 / V3 |
//! |---|---|---|---|
//! | experts | `num_experts` (also `num_local_experts`) | `num_local_experts` | `n_routed_experts` |
//! | top-k | `num_experts_per_tok` | same | same |
//! | expert intermediate | `moe_intermediate_size` | `intermediate_size` | `moe_intermediate_size` |
//! | MoE layers | `(l+1) % decoder_sparse_step == 0`, not in `mlp_only_layers` | all | `l >= first_k_dense_replace`, `l % moe_layer_freq == 0` |
//! | renormalize | `norm_topk_prob` (default false) | always | `norm_topk_prob` (V2 default false, V3 true) |
//! | scoring | softmax | softmax | `scoring_func` (V2 default softmax, V3 sigmoid) |
//! | shared experts | Qwen2: `shared_expert_intermediate_size`, sigmoid-gated | none | `n_shared_experts × moe_intermediate_size` |
//!
//! gpt-oss (`gpt_oss`) spells it as Mixtral does (`num_local_experts`, `intermediate_size`,
//! every layer MoE; top-k `num_experts_per_tok` or `experts_per_token`), routes by a softmax
//! over the top-k logits (equal to the renormalized softmax), and adds `swiglu_limit` (the
//! SwiGLU-OAI clamp) and MXFP4 experts (`quant_method: mxfp4`).
//!
//! Defaults for absent routing fields are those of the transformers config classes; sizes have
//! no defaults (a missing size is a [`LayerError::ConfigField`]). The `quantization_config`
//! (or a GPTQ `quantize_config.json` next to `config.json`) becomes a [`QuantScheme`]; schemes
//! the loader cannot read are refused here with [`LayerError::UnsupportedScheme`], before any
//! tensor is touched.

use std::path::{Path, PathBuf};

use moe_quant::ct_args::{
    ActivationOrdering, QuantizationStrategy, QuantizationType, check_w4a8_int_moe,
    is_dynamic_token_w4a8_int,
};
use moe_quant::{DType, QuantError, QuantizationConfig, WeightGroups};
use moe_router::ScoringFunc;
use serde::Deserialize;

use crate::error::LayerError;

/// Largest `num_hidden_layers` accepted. Real models have a few hundred layers at most; the
/// limit keeps a hostile `config.json` from making the loader enumerate (and store) billions of
/// layer indices before any tensor is read.
pub const MAX_LAYERS: usize = 1 << 16;

/// The model families whose MoE tensor names the loader knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModelFamily {
    /// Qwen2-MoE (`qwen2_moe`): softmax routing, one sigmoid-gated shared expert.
    Qwen2Moe,
    /// Qwen3-MoE (`qwen3_moe`): softmax routing, no shared expert.
    Qwen3Moe,
    /// Mixtral (`mixtral`): `block_sparse_moe` module, renormalized softmax routing.
    Mixtral,
    /// DeepSeek-V2 (`deepseek_v2`): grouped routing, shared experts.
    DeepseekV2,
    /// DeepSeek-V3 (`deepseek_v3`, also Kimi-K2): sigmoid scoring with correction bias.
    DeepseekV3,
    /// gpt-oss (`gpt_oss`): experts fused per layer as 3-D MXFP4 tensors with biases, gate and
    /// up rows interleaved, SwiGLU-OAI, a router linear with a bias; bf16 checkpoints store the
    /// experts fused with K leading (`gate_up_proj` `[E, H, 2I]`, columns interleaved).
    GptOss,
    /// GLM-4.5/4.6 MoE (`glm4_moe`): DeepSeek-V3's tensor names and routing (sigmoid scores, a
    /// correction bias for selection, `n_group`/`topk_group` as configured, the routed
    /// scaling factor), shared experts, dense layers below `first_k_dense_replace`.
    Glm4Moe,
    /// Qwen3-Next (`qwen3_next`): Qwen2-MoE's block (softmax routing, one sigmoid-gated shared
    /// expert) with renormalized top-k weights unless the config says otherwise.
    Qwen3Next,
    /// MiniMax-M2 (`minimax_m2`): a `block_sparse_moe` module with `w1`/`w3`/`w2` experts and
    /// sigmoid scores with a correction bias for selection
    /// (`block_sparse_moe.e_score_correction_bias`), renormalized, without groups or shared
    /// experts.
    MiniMaxM2,
    /// Llama 4 (`llama4`, its language model `llama4_text`): a `feed_forward` module with a
    /// `router`, top-1 routing weighted by the sigmoid of the logit and applied to the token
    /// before the expert, one ungated shared expert of the experts' width, MoE layers every
    /// `interleave_moe_layer_step`. bf16 checkpoints fuse the experts per layer, transposed
    /// (`experts.gate_up_proj` `[E, H, 2I]`, `experts.down_proj` `[E, I, H]`); quantized ones
    /// store them one by one. Multimodal checkpoints keep the language model under
    /// `language_model.` and its config under `text_config`.
    Llama4,
    /// Qwen3-VL-MoE (`qwen3_vl_moe`): Qwen3-MoE's language model (softmax routing,
    /// renormalized) inside a multimodal wrapper: config under `text_config`, names under
    /// `model.language_model.`; bf16 checkpoints fuse each layer's experts as Llama 4 does
    /// (`experts.gate_up_proj` `[E, H, 2I]`, `experts.down_proj` `[E, I, H]`).
    Qwen3VlMoe,
    /// Granite MoE (`granitemoe`, `granitemoeshared`, Granite 4.0's `granitemoehybrid`): a
    /// `block_sparse_moe` whose experts are stored fused per layer, gate rows then up rows
    /// (`input_linear.weight` `[E, 2I, H]`, `output_linear.weight` `[E, H, I]`), routed by
    /// `router.layer` (softmax over the top-k logits: renormalized softmax), and a shared MLP
    /// of `shared_intermediate_size` beside it (`shared_mlp`, gate and up fused). Read
    /// unquantized only.
    GraniteMoe,
    /// OLMoE (`olmoe`): Qwen3-MoE's names with the expert size in `intermediate_size`, softmax
    /// routing never renormalized (vLLM's block passes `renormalize=False` whatever
    /// `norm_topk_prob` says), every layer MoE.
    Olmoe,
    /// ERNIE-4.5 MoE (`ernie4_5_moe`): softmax scores with a correction bias for selection
    /// (`mlp.moe_statics.e_score_correction_bias`, `[1, E]`), the unbiased scores of the
    /// selected experts renormalized; `moe_num_shared_experts` shared experts fused in one MLP;
    /// MoE layers from `moe_layer_start_index` to `moe_layer_end_index`, every
    /// `moe_layer_interval`. The config spells the experts `moe_num_experts` and the top-k
    /// `moe_k`.
    Ernie45Moe,
    /// PhiMoE (`phimoe`, Phi-3.5-MoE): Mixtral's `block_sparse_moe` names and fields, routed by
    /// the sparse mixer (top-2, `router_jitter_noise`).
    PhiMoe,
}

impl ModelFamily {
    /// Recognises a family from `model_type`, then from `architectures`.
    fn detect(model_type: Option<&str>, architectures: &[String]) -> Option<Self> {
        let by_type = model_type.and_then(|t| match t {
            "qwen2_moe" => Some(Self::Qwen2Moe),
            "qwen3_moe" => Some(Self::Qwen3Moe),
            "mixtral" => Some(Self::Mixtral),
            "deepseek_v2" => Some(Self::DeepseekV2),
            "deepseek_v3" | "kimi_k2" => Some(Self::DeepseekV3),
            "gpt_oss" => Some(Self::GptOss),
            "glm4_moe" => Some(Self::Glm4Moe),
            "qwen3_next" => Some(Self::Qwen3Next),
            "minimax_m2" => Some(Self::MiniMaxM2),
            "llama4" | "llama4_text" => Some(Self::Llama4),
            "qwen3_vl_moe" | "qwen3_vl_moe_text" => Some(Self::Qwen3VlMoe),
            "granitemoe" | "granitemoeshared" | "granitemoehybrid" => Some(Self::GraniteMoe),
            "olmoe" => Some(Self::Olmoe),
            "ernie4_5_moe" => Some(Self::Ernie45Moe),
            "phimoe" => Some(Self::PhiMoe),
            _ => None,
        });
        by_type.or_else(|| {
            architectures.iter().find_map(|a| match a.as_str() {
                "Qwen2MoeForCausalLM" => Some(Self::Qwen2Moe),
                "Qwen3MoeForCausalLM" => Some(Self::Qwen3Moe),
                "MixtralForCausalLM" => Some(Self::Mixtral),
                "DeepseekV2ForCausalLM" => Some(Self::DeepseekV2),
                "DeepseekV3ForCausalLM" => Some(Self::DeepseekV3),
                "GptOssForCausalLM" => Some(Self::GptOss),
                "Glm4MoeForCausalLM" => Some(Self::Glm4Moe),
                "Qwen3NextForCausalLM" => Some(Self::Qwen3Next),
                "MiniMaxM2ForCausalLM" => Some(Self::MiniMaxM2),
                "Llama4ForConditionalGeneration" | "Llama4ForCausalLM" => Some(Self::Llama4),
                "Qwen3VLMoeForConditionalGeneration" => Some(Self::Qwen3VlMoe),
                "GraniteMoeForCausalLM"
                | "GraniteMoeSharedForCausalLM"
                | "GraniteMoeHybridForCausalLM" => Some(Self::GraniteMoe),
                "OlmoeForCausalLM" => Some(Self::Olmoe),
                "Ernie4_5_MoeForCausalLM" => Some(Self::Ernie45Moe),
                "PhiMoEForCausalLM" => Some(Self::PhiMoe),
                _ => None,
            })
        })
    }

    fn is_deepseek(self) -> bool {
        matches!(self, Self::DeepseekV2 | Self::DeepseekV3)
    }

    /// Whether the block is Qwen2-MoE's: one shared expert behind a sigmoid gate.
    fn has_gated_shared_expert(self) -> bool {
        matches!(self, Self::Qwen2Moe | Self::Qwen3Next)
    }

    /// The config field that counts the routed experts.
    pub(crate) fn experts_field(self) -> &'static str {
        match self {
            Self::Qwen2Moe | Self::Qwen3Moe | Self::Qwen3Next | Self::Qwen3VlMoe | Self::Olmoe => {
                "num_experts"
            }
            Self::Mixtral
            | Self::GptOss
            | Self::MiniMaxM2
            | Self::Llama4
            | Self::GraniteMoe
            | Self::PhiMoe => "num_local_experts",
            Self::DeepseekV2 | Self::DeepseekV3 | Self::Glm4Moe => "n_routed_experts",
            Self::Ernie45Moe => "moe_num_experts",
        }
    }

    /// The config field that counts the experts per token.
    pub(crate) fn top_k_field(self) -> &'static str {
        match self {
            Self::GptOss => "experts_per_token",
            Self::Ernie45Moe => "moe_k",
            _ => "num_experts_per_tok",
        }
    }

    /// The config field that sizes one routed expert.
    pub(crate) fn intermediate_field(self) -> &'static str {
        match self {
            Self::Mixtral
            | Self::GptOss
            | Self::MiniMaxM2
            | Self::Llama4
            | Self::GraniteMoe
            | Self::Olmoe
            | Self::PhiMoe => "intermediate_size",
            _ => "moe_intermediate_size",
        }
    }

    /// The config field that sizes the shared experts.
    pub(crate) fn shared_intermediate_field(self) -> &'static str {
        match self {
            _ if self.has_gated_shared_expert() => "shared_expert_intermediate_size",
            // Llama 4's shared expert is as wide as a routed one.
            Self::Llama4 => "intermediate_size",
            Self::GraniteMoe => "shared_intermediate_size",
            Self::Ernie45Moe => "moe_num_shared_experts",
            _ => "n_shared_experts",
        }
    }
}

/// How the router turns logits into expert weights, as the model config states it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingSpec {
    /// Score function applied to the logits.
    pub scoring: ScoringFunc,
    /// Whether the top-k weights are divided by their sum.
    pub renormalize: bool,
    /// Number of expert groups for grouped top-k (`n_group`), if the model routes by groups.
    pub num_expert_group: Option<usize>,
    /// Number of groups kept per token (`topk_group`).
    pub topk_group: Option<usize>,
    /// Factor applied to the routed experts' output (`routed_scaling_factor`, 1 when absent).
    pub routed_scaling_factor: f32,
    /// Whether the router has an `e_score_correction_bias` (DeepSeek `topk_method: noaux_tc`,
    /// GLM-4 MoE always, MiniMax-M2 with `use_routing_bias`).
    pub has_correction_bias: bool,
    /// DeepSeek's `topk_method` as written (`greedy`, `group_limited_greedy`, `noaux_tc`).
    pub topk_method: Option<String>,
    /// Llama 4's routing (spec section 2.6): the top-k raw logits, each weighted by its
    /// sigmoid, the weight multiplying the token before the expert rather than the expert's
    /// output. `scoring` is then sigmoid and `renormalize` false.
    pub llama4: bool,
    /// PhiMoE's sparse mixer with this jitter `ε` (`router_jitter_noise`): two experts chosen
    /// in turn, each weighted by a softmax over the logits within a relative `2ε` of it, not
    /// renormalized (vLLM's `phimoe_routing_function`). `scoring` is then softmax.
    pub sparse_mixer_jitter: Option<f32>,
}

/// The shared (always active) experts of a MoE block, loaded as one MLP of this width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedExpertSpec {
    /// Intermediate size of the shared MLP (all shared experts fused).
    pub intermediate: usize,
    /// Whether a sigmoid gate `shared_expert_gate` `[1, H]` scales its output (Qwen2-MoE).
    pub gated: bool,
}

/// How the expert weights are stored, normalized across quantization tools.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum QuantScheme {
    /// Plain floating-point weights in the model dtype (`None` when the config names none).
    Unquantized(Option<DType>),
    /// compressed-tensors `int-quantized` W4A8: int4 codes stored as int8, static symmetric
    /// scales, dynamic per-token int8 activations.
    CompressedTensorsW4A8 {
        /// The scale grouping: groups of input columns, or one scale per output channel.
        group_size: WeightGroups,
        /// Scale dtype declared in the config (`None` = the model dtype; the tensors decide).
        scale_dtype: Option<DType>,
        /// Whether the declared activation quantization is symmetric (informational: the
        /// W4A8 kernel quantizes activations itself).
        activations_symmetric: bool,
    },
    /// compressed-tensors `int-quantized` W8A8 (the `INT8_W8A8` preset): int8 codes with
    /// static symmetric per-channel scales, dynamic per-token int8 activations, which vLLM
    /// runs on its CPU int8 experts.
    CompressedTensorsW8A8 {
        /// Scale dtype declared in the config (`None` = the model dtype; the tensors decide).
        scale_dtype: Option<DType>,
        /// Whether the declared activation quantization is symmetric (informational: the
        /// W8A8 kernel quantizes activations itself, symmetrically per token).
        activations_symmetric: bool,
    },
    /// compressed-tensors `pack-quantized` weight-only int (WNA16): codes packed into int32.
    CompressedTensorsWna16 {
        /// Bits per code (4 or 8).
        bits: u32,
        /// The scale grouping: groups of input columns, or channelwise.
        group_size: WeightGroups,
        /// Activation ordering (`Some(Group)`/`Some(Dynamic)` → the tensors carry `weight_g_idx`).
        actorder: Option<ActivationOrdering>,
        /// Scale dtype declared in the config.
        scale_dtype: Option<DType>,
        /// Symmetric codes; asymmetric ones carry `weight_zero_point` (group or channel).
        symmetric: bool,
    },
    /// GPTQ (AutoGPTQ / GPTQModel): `qweight` packed along K, `scales`, `qzeros`, `g_idx`.
    Gptq {
        /// Bits per code (2, 4 or 8).
        bits: u32,
        /// The scale grouping: rows of K per group, or channelwise (`group_size: -1`).
        group_size: WeightGroups,
        /// Act-order (`desc_act`); forced false for channelwise.
        desc_act: bool,
        /// Symmetric codes (`uint4b8` / `uint8b128`); asymmetric needs `qzeros`.
        sym: bool,
        /// `checkpoint_format` (`gptq` = v1, `gptq_v2`), if stated.
        checkpoint_format: Option<String>,
    },
    /// AWQ (AutoAWQ `gemm` packing): `qweight` `[k, n/8]`, `qzeros` `[G, n/8]` and `scales`
    /// `[G, n]`, unsigned 4-bit codes with a zero point per group.
    Awq {
        /// The scale grouping: rows of K per group, or channelwise (`group_size: -1`).
        group_size: WeightGroups,
    },
    /// MXFP4 (`quant_method: mxfp4`, gpt-oss): e2m1 codes in `*_blocks` `[E, N, K/32, 16]`,
    /// e8m0 scales in `*_scales` `[E, N, K/32]`, one per 32 input columns.
    Mxfp4,
    /// FP8 weights: e4m3 `weight` `[n, k]` per projection with scales that multiply (the
    /// weight at `[r, c]` is `e4m3·scale` of its block, channel or tensor). Read from
    /// `quant_method: fp8` (`weight_block_size: [128, 128]`: DeepSeek-V3/R1, Qwen3 `-FP8`, f32
    /// `weight_scale_inv` `[ceil(n/128), ceil(k/128)]`; none: AutoFP8's per-tensor
    /// `weight_scale`) and from compressed-tensors `float-quantized` (strategy `block`,
    /// `channel` or `tensor`, `weight_scale` `[ceil(n/128), ceil(k/128)]`, `[n, 1]` or one
    /// value). The activations run in float here (see `checkpoint::fp8`).
    Fp8 {
        /// How the scales are laid out.
        scaling: crate::Fp8Scaling,
        /// The config that declared the weights, which also names the scale tensors.
        source: Fp8Source,
        /// Whether the checkpoint quantizes activations with static scales (`input_scale`
        /// tensors), which are not read: the activations run in float.
        static_activations: bool,
        /// Modules the recipe left unquantized (`ignored_layers`, `modules_to_not_convert` or
        /// compressed-tensors `ignore`), as written; an expert projection found unquantized is
        /// refused by its dtype.
        ignored: Vec<String>,
    },
}

/// The config an FP8 checkpoint declares its weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fp8Source {
    /// `quant_method: fp8` (vLLM's `Fp8Config`: DeepSeek-V3, Qwen3 `-FP8`, AutoFP8): block
    /// scales in `weight_scale_inv`, tensor scales in `weight_scale`.
    QuantMethodFp8,
    /// compressed-tensors `float-quantized`: every kind of scale in `weight_scale`.
    CompressedTensors,
}

impl Fp8Source {
    /// The scale tensor's name after a projection's prefix.
    pub fn scale_tensor(self, scaling: crate::Fp8Scaling) -> &'static str {
        match (self, scaling) {
            (Self::QuantMethodFp8, crate::Fp8Scaling::Blocks) => "weight_scale_inv",
            _ => "weight_scale",
        }
    }
}

impl QuantScheme {
    /// A short name for messages: `unquantized`, `compressed-tensors/int-quantized`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unquantized(_) => "unquantized",
            Self::CompressedTensorsW4A8 { .. } | Self::CompressedTensorsW8A8 { .. } => {
                "compressed-tensors/int-quantized"
            }
            Self::CompressedTensorsWna16 { .. } => "compressed-tensors/pack-quantized",
            Self::Gptq { .. } => "gptq",
            Self::Awq { .. } => "awq",
            Self::Mxfp4 => "mxfp4",
            Self::Fp8 {
                source: Fp8Source::QuantMethodFp8,
                ..
            } => "fp8",
            Self::Fp8 {
                source: Fp8Source::CompressedTensors,
                ..
            } => "compressed-tensors/float-quantized",
        }
    }

    /// Whether the weights carry per-group act-order indices (`g_idx`).
    pub fn has_act_order(&self) -> bool {
        match self {
            Self::CompressedTensorsWna16 { actorder, .. } => matches!(
                actorder,
                Some(ActivationOrdering::Group | ActivationOrdering::Dynamic)
            ),
            Self::Gptq { desc_act, .. } => *desc_act,
            _ => false,
        }
    }
}

/// The normalized MoE description of a model, read from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeModelSpec {
    /// The file this was read from (named in errors about the config).
    pub config_path: PathBuf,
    /// The model family (decides the tensor names).
    pub family: ModelFamily,
    /// `model_type` as written.
    pub model_type: String,
    /// `architectures` as written.
    pub architectures: Vec<String>,
    /// The model dtype (`torch_dtype` or `dtype`), if stated.
    pub dtype: Option<DType>,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Indices of the layers whose MLP is a MoE block, ascending.
    pub moe_layers: Vec<usize>,
    /// Number of routed experts (global).
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Full (unsharded) expert intermediate size `I`.
    pub intermediate: usize,
    /// Routing parameters.
    pub routing: RoutingSpec,
    /// The expert activation as written (`hidden_act`, e.g. `"silu"`).
    pub activation: String,
    /// Shared experts, if the model has them.
    pub shared_experts: Option<SharedExpertSpec>,
    /// How the expert weights are stored.
    pub quant: QuantScheme,
    /// The SwiGLU-OAI clamp limit (`swiglu_limit`, gpt-oss), if the config states one.
    pub swiglu_limit: Option<f32>,
}

/// The fields of `config.json` the loader reads, every one optional so that each family's
/// spelling can be picked afterwards.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Option<Vec<String>>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
    hidden_act: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<usize>,
    moe_intermediate_size: Option<usize>,
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    n_routed_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    shared_expert_intermediate_size: Option<usize>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    routed_scaling_factor: Option<f64>,
    scoring_func: Option<String>,
    topk_method: Option<String>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    n_shared_experts: Option<usize>,
    /// gpt-oss's spelling of the top-k.
    experts_per_token: Option<usize>,
    /// MiniMax-M2: whether the router has a correction bias.
    use_routing_bias: Option<bool>,
    /// Granite MoE: the shared MLP's intermediate size (0 or absent: none).
    shared_intermediate_size: Option<usize>,
    /// Llama 4: every how many layers one is MoE (0: none).
    interleave_moe_layer_step: Option<usize>,
    /// Llama 4: the MoE layers, listed.
    moe_layers: Option<Vec<usize>>,
    /// PhiMoE: the sparse mixer's jitter `ε`.
    router_jitter_noise: Option<f64>,
    /// ERNIE-4.5's spellings (kept as JSON values: ERNIE-4.5-VL's configs list one per
    /// modality, refused by name rather than by a parse error).
    moe_num_experts: Option<serde_json::Value>,
    moe_k: Option<serde_json::Value>,
    moe_num_shared_experts: Option<serde_json::Value>,
    moe_layer_start_index: Option<serde_json::Value>,
    moe_layer_end_index: Option<serde_json::Value>,
    moe_layer_interval: Option<serde_json::Value>,
    use_moe: Option<bool>,
    swiglu_limit: Option<f64>,
    quantization_config: Option<serde_json::Value>,
    /// Older compressed-tensors spelling of `quantization_config`.
    compression_config: Option<serde_json::Value>,
}

impl RawConfig {
    /// Parses `config.json`. A multimodal wrapper (Llama 4's `Llama4ForConditionalGeneration`)
    /// keeps its language model's fields under `text_config`: those are read, with the
    /// wrapper's `model_type`, `architectures`, dtype and quantization config, which describe
    /// the checkpoint as a whole.
    fn parse(file: &Path, json: &str) -> Result<Self, LayerError> {
        let parse_error = |e: serde_json::Error| LayerError::JsonParse {
            file: file.to_path_buf(),
            message: e.to_string(),
        };
        let mut value: serde_json::Value = serde_json::from_str(json).map_err(parse_error)?;
        if let Some(outer) = value.as_object_mut()
            && !outer.contains_key("hidden_size")
            && let Some(serde_json::Value::Object(mut text)) = outer.remove("text_config")
        {
            const WHOLE_MODEL: [&str; 6] = [
                "model_type",
                "architectures",
                "torch_dtype",
                "dtype",
                "quantization_config",
                "compression_config",
            ];
            for (key, v) in std::mem::take(outer) {
                if WHOLE_MODEL.contains(&key.as_str()) || !text.contains_key(&key) {
                    text.insert(key, v);
                }
            }
            value = serde_json::Value::Object(text);
        }
        serde_json::from_value(value).map_err(parse_error)
    }
}

/// GPTQ's `quantization_config` / `quantize_config.json` keys.
#[derive(Debug, Deserialize)]
struct GptqConfig {
    bits: u32,
    group_size: i64,
    #[serde(default)]
    desc_act: bool,
    #[serde(default = "default_true")]
    sym: bool,
    #[serde(default)]
    checkpoint_format: Option<String>,
}

/// AWQ's `quantization_config` keys.
#[derive(Debug, Deserialize)]
struct AwqConfig {
    #[serde(default = "default_awq_bits")]
    bits: u32,
    group_size: i64,
    #[serde(default = "default_true")]
    zero_point: bool,
    #[serde(default)]
    version: Option<String>,
}

fn default_awq_bits() -> u32 {
    4
}

fn default_true() -> bool {
    true
}

impl MoeModelSpec {
    /// Reads `<dir>/config.json` (and, for GPTQ models without a `quantization_config`,
    /// `<dir>/quantize_config.json`).
    pub fn from_dir(dir: &Path) -> Result<Self, LayerError> {
        let config_path = dir.join("config.json");
        let text = read_text(&config_path)?;
        let raw = RawConfig::parse(&config_path, &text)?;
        let side_file = dir.join("quantize_config.json");
        let side = if raw.quantization_config.is_none()
            && raw.compression_config.is_none()
            && side_file.is_file()
        {
            let text = read_text(&side_file)?;
            let value: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| LayerError::JsonParse {
                    file: side_file.clone(),
                    message: e.to_string(),
                })?;
            Some((side_file, value))
        } else {
            None
        };
        Self::from_raw(config_path, raw, side)
    }

    /// Parses a `config.json` given as text; `config_path` is only used in error messages.
    pub fn from_json_str(config_path: &Path, json: &str) -> Result<Self, LayerError> {
        let raw = RawConfig::parse(config_path, json)?;
        Self::from_raw(config_path.to_path_buf(), raw, None)
    }

    fn from_raw(
        config_path: PathBuf,
        raw: RawConfig,
        side_quant: Option<(PathBuf, serde_json::Value)>,
    ) -> Result<Self, LayerError> {
        let file = &config_path;
        let architectures = raw.architectures.clone().unwrap_or_default();
        let family =
            ModelFamily::detect(raw.model_type.as_deref(), &architectures).ok_or_else(|| {
                LayerError::UnsupportedModel {
                    file: file.clone(),
                    model_type: raw.model_type.clone().unwrap_or_default(),
                    architectures: architectures.clone(),
                }
            })?;
        let field = |field: &'static str, reason: String| LayerError::ConfigField {
            file: file.clone(),
            field,
            reason,
        };
        let required = |value: Option<usize>, name: &'static str| {
            value
                .filter(|&v| v > 0)
                .ok_or_else(|| field(name, "missing or zero".into()))
        };

        let dtype = match raw.torch_dtype.as_deref().or(raw.dtype.as_deref()) {
            None => None,
            Some(s) => Some(
                s.parse::<DType>()
                    .map_err(|_| field("torch_dtype", format!("unknown dtype {s:?}")))?,
            ),
        };
        let num_layers = required(raw.num_hidden_layers, "num_hidden_layers")?;
        if num_layers > MAX_LAYERS {
            return Err(field(
                "num_hidden_layers",
                format!("{num_layers} exceeds the supported maximum {MAX_LAYERS}"),
            ));
        }
        let hidden = required(raw.hidden_size, "hidden_size")?;
        // ERNIE-4.5's integer fields, which transformers defaults where the config is silent.
        let ernie_int = |name: &'static str, v: &Option<serde_json::Value>| {
            match v {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| {
                field(
                    name,
                    format!("expected an integer, got {v} (ERNIE-4.5-VL's per-modality lists are not read)"),
                )
            }),
        }
        };
        let ernie_count = |name: &'static str, v: &Option<serde_json::Value>| {
            ernie_int(name, v)?
                .map(|n| usize::try_from(n).map_err(|_| field(name, format!("{n} is negative"))))
                .transpose()
        };
        let top_k = match (family, raw.num_experts_per_tok) {
            (ModelFamily::GptOss, None) => required(raw.experts_per_token, "experts_per_token")?,
            (ModelFamily::Ernie45Moe, _) => {
                required(ernie_count("moe_k", &raw.moe_k)?, family.top_k_field())?
            }
            (_, top_k) => required(top_k, "num_experts_per_tok")?,
        };
        let experts_field = family.experts_field();
        let num_experts = match (family, raw.num_experts) {
            // Qwen-MoE configs have been seen with Mixtral's spelling too.
            (
                ModelFamily::Qwen2Moe
                | ModelFamily::Qwen3Moe
                | ModelFamily::Qwen3Next
                | ModelFamily::Qwen3VlMoe,
                None,
            ) => required(raw.num_local_experts, "num_experts")?,
            (
                ModelFamily::Qwen2Moe
                | ModelFamily::Qwen3Moe
                | ModelFamily::Qwen3Next
                | ModelFamily::Qwen3VlMoe,
                n,
            ) => required(n, "num_experts")?,
            (
                ModelFamily::Mixtral
                | ModelFamily::GptOss
                | ModelFamily::MiniMaxM2
                | ModelFamily::Llama4
                | ModelFamily::GraniteMoe
                | ModelFamily::PhiMoe,
                _,
            ) => required(raw.num_local_experts, "num_local_experts")?,
            (ModelFamily::DeepseekV2 | ModelFamily::DeepseekV3 | ModelFamily::Glm4Moe, _) => {
                required(raw.n_routed_experts, "n_routed_experts")?
            }
            (ModelFamily::Olmoe, _) => required(raw.num_experts, "num_experts")?,
            (ModelFamily::Ernie45Moe, _) => required(
                ernie_count("moe_num_experts", &raw.moe_num_experts)?,
                "moe_num_experts",
            )?,
        };
        if family == ModelFamily::PhiMoe && top_k != 2 {
            return Err(field(
                "num_experts_per_tok",
                format!("the sparse mixer routes two experts per token, not {top_k}"),
            ));
        }
        if top_k > num_experts {
            return Err(field(
                family.top_k_field(),
                format!("{top_k} exceeds the {num_experts} experts ({experts_field})"),
            ));
        }
        let intermediate = match family.intermediate_field() {
            "intermediate_size" => required(raw.intermediate_size, "intermediate_size")?,
            _ => required(raw.moe_intermediate_size, "moe_intermediate_size")?,
        };

        let moe_layers: Vec<usize> = match family {
            ModelFamily::Qwen2Moe
            | ModelFamily::Qwen3Moe
            | ModelFamily::Qwen3Next
            | ModelFamily::Qwen3VlMoe => {
                let step = raw.decoder_sparse_step.unwrap_or(1);
                if step == 0 {
                    return Err(field("decoder_sparse_step", "must be positive".into()));
                }
                let dense = raw.mlp_only_layers.clone().unwrap_or_default();
                (0..num_layers)
                    .filter(|l| !dense.contains(l) && (l + 1) % step == 0)
                    .collect()
            }
            ModelFamily::Mixtral
            | ModelFamily::GptOss
            | ModelFamily::MiniMaxM2
            | ModelFamily::GraniteMoe
            | ModelFamily::Olmoe
            | ModelFamily::PhiMoe => (0..num_layers).collect(),
            ModelFamily::DeepseekV2 | ModelFamily::DeepseekV3 => {
                let freq = raw.moe_layer_freq.unwrap_or(1);
                if freq == 0 {
                    return Err(field("moe_layer_freq", "must be positive".into()));
                }
                let first = raw.first_k_dense_replace.unwrap_or(0);
                (first..num_layers).filter(|l| l % freq == 0).collect()
            }
            // Every layer from `first_k_dense_replace` (1 when unstated, as transformers has
            // it); GLM has no `moe_layer_freq`. Multi-token-prediction layers sit at
            // `num_hidden_layers` and above, outside this range.
            ModelFamily::Glm4Moe => (raw.first_k_dense_replace.unwrap_or(1)..num_layers).collect(),
            // transformers states the list in `moe_layers`; older configs give the step, 0
            // meaning none.
            ModelFamily::Llama4 => match &raw.moe_layers {
                Some(layers) => {
                    if let Some(&l) = layers.iter().find(|&&l| l >= num_layers) {
                        return Err(field(
                            "moe_layers",
                            format!("layer {l} is outside the {num_layers} layers"),
                        ));
                    }
                    let mut layers = layers.clone();
                    layers.sort_unstable();
                    layers.dedup();
                    layers
                }
                None => match raw.interleave_moe_layer_step.unwrap_or(1) {
                    0 => Vec::new(),
                    step => (0..num_layers).filter(|l| (l + 1) % step == 0).collect(),
                },
            },
            // As transformers' config: from layer 1, to the last (`-1`), every layer, unless
            // the config says otherwise; `use_moe: false` makes every layer dense.
            ModelFamily::Ernie45Moe => {
                let start =
                    ernie_count("moe_layer_start_index", &raw.moe_layer_start_index)?.unwrap_or(1);
                let end = match ernie_int("moe_layer_end_index", &raw.moe_layer_end_index)? {
                    None | Some(-1) => num_layers - 1,
                    Some(e) => usize::try_from(e).map_err(|_| {
                        field(
                            "moe_layer_end_index",
                            format!("{e} is neither -1 nor a layer"),
                        )
                    })?,
                };
                let interval =
                    ernie_count("moe_layer_interval", &raw.moe_layer_interval)?.unwrap_or(1);
                if interval == 0 {
                    return Err(field("moe_layer_interval", "must be positive".into()));
                }
                if raw.use_moe == Some(false) {
                    Vec::new()
                } else {
                    (start..num_layers)
                        .filter(|&l| l <= end && (l + 1) % interval == 0)
                        .collect()
                }
            }
        };

        let routing = routing_spec(family, &raw, num_experts, &field)?;
        let shared_experts = match family {
            ModelFamily::Qwen2Moe | ModelFamily::Qwen3Next => raw
                .shared_expert_intermediate_size
                .filter(|&s| s > 0)
                .map(|intermediate| SharedExpertSpec {
                    intermediate,
                    gated: true,
                }),
            ModelFamily::DeepseekV2 | ModelFamily::DeepseekV3 => raw
                .n_shared_experts
                .filter(|&n| n > 0)
                .map(|n| SharedExpertSpec {
                    intermediate: n * intermediate,
                    gated: false,
                }),
            ModelFamily::Llama4 => Some(SharedExpertSpec {
                intermediate,
                gated: false,
            }),
            ModelFamily::GraniteMoe => {
                raw.shared_intermediate_size
                    .filter(|&n| n > 0)
                    .map(|intermediate| SharedExpertSpec {
                        intermediate,
                        gated: false,
                    })
            }
            // transformers' default is two shared experts.
            ModelFamily::Ernie45Moe => {
                ernie_count("moe_num_shared_experts", &raw.moe_num_shared_experts)?
                    .or(Some(2))
                    .filter(|&n| n > 0)
                    .map(|n| SharedExpertSpec {
                        intermediate: n * intermediate,
                        gated: false,
                    })
            }
            // transformers' default is one shared expert, and vLLM builds what it says.
            ModelFamily::Glm4Moe => Some(raw.n_shared_experts.unwrap_or(1))
                .filter(|&n| n > 0)
                .map(|n| SharedExpertSpec {
                    intermediate: n * intermediate,
                    gated: false,
                }),
            _ => None,
        };

        let quant = match (
            raw.quantization_config
                .as_ref()
                .or(raw.compression_config.as_ref()),
            side_quant,
        ) {
            (Some(qc), _) => quant_scheme(file, qc)?,
            (None, Some((side_file, qc))) => quant_scheme(&side_file, &qc)?,
            (None, None) => QuantScheme::Unquantized(dtype),
        };
        // gpt-oss ships MXFP4; its bf16 checkpoints store the experts fused and transposed
        // (`gate_up_proj` `[E, H, 2I]`). Other families have no MXFP4 tensors to read.
        match (family, &quant) {
            (ModelFamily::GptOss, QuantScheme::Mxfp4 | QuantScheme::Unquantized(_)) => {}
            (ModelFamily::GptOss, other) => {
                return Err(LayerError::UnsupportedScheme {
                    file: file.clone(),
                    scheme: other.name().into(),
                    reason: "gpt-oss experts are read as MXFP4 or unquantized only".into(),
                });
            }
            (ModelFamily::GraniteMoe, QuantScheme::Unquantized(_)) => {}
            (ModelFamily::GraniteMoe, other) => {
                return Err(LayerError::UnsupportedScheme {
                    file: file.clone(),
                    scheme: other.name().into(),
                    reason: "Granite MoE experts are read unquantized only".into(),
                });
            }
            (_, QuantScheme::Mxfp4) => {
                return Err(LayerError::UnsupportedScheme {
                    file: file.clone(),
                    scheme: "mxfp4".into(),
                    reason: "MXFP4 experts are read for gpt-oss (model_type gpt_oss) only".into(),
                });
            }
            _ => {}
        }
        let swiglu_limit = match raw.swiglu_limit {
            Some(l) if !(l.is_finite() && l > 0.0) => {
                return Err(field(
                    "swiglu_limit",
                    format!("must be finite and positive, got {l}"),
                ));
            }
            l => l.map(|l| l as f32),
        };

        Ok(Self {
            config_path: config_path.clone(),
            family,
            model_type: raw.model_type.unwrap_or_default(),
            architectures,
            dtype,
            num_layers,
            moe_layers,
            num_experts,
            top_k,
            hidden,
            intermediate,
            routing,
            activation: raw.hidden_act.unwrap_or_else(|| "silu".into()),
            shared_experts,
            quant,
            swiglu_limit,
        })
    }

    /// Whether `layer` is a MoE layer.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe_layers.binary_search(&layer).is_ok()
    }
}

fn read_text(path: &Path) -> Result<String, LayerError> {
    std::fs::read_to_string(path).map_err(|source| LayerError::Io {
        file: path.to_path_buf(),
        source,
    })
}

fn routing_spec(
    family: ModelFamily,
    raw: &RawConfig,
    num_experts: usize,
    field: &dyn Fn(&'static str, String) -> LayerError,
) -> Result<RoutingSpec, LayerError> {
    let parse_scoring = |s: &str| {
        s.parse::<ScoringFunc>()
            .map_err(|_| field("scoring_func", format!("unknown scoring function {s:?}")))
    };
    let scoring = match (family, raw.scoring_func.as_deref()) {
        // GLM's model code fixes sigmoid scores; its configs name none.
        (ModelFamily::Glm4Moe, _) => ScoringFunc::Sigmoid,
        (f, Some(s)) if f.is_deepseek() || f == ModelFamily::MiniMaxM2 => parse_scoring(s)?,
        (ModelFamily::DeepseekV3 | ModelFamily::MiniMaxM2 | ModelFamily::Llama4, _) => {
            ScoringFunc::Sigmoid
        }
        _ => ScoringFunc::Softmax,
    };
    let renormalize = match family {
        // gpt-oss: softmax over the top-k logits, which is the renormalized full softmax.
        // MiniMax-M2's block always renormalizes; Granite's softmax runs over the top-k logits.
        ModelFamily::Mixtral
        | ModelFamily::GptOss
        | ModelFamily::MiniMaxM2
        | ModelFamily::GraniteMoe => true,
        ModelFamily::Llama4 | ModelFamily::Olmoe | ModelFamily::PhiMoe => false,
        // vLLM's block always renormalizes.
        ModelFamily::Ernie45Moe => true,
        ModelFamily::DeepseekV3
        | ModelFamily::Glm4Moe
        | ModelFamily::Qwen3Next
        | ModelFamily::Qwen3VlMoe => raw.norm_topk_prob.unwrap_or(true),
        _ => raw.norm_topk_prob.unwrap_or(false),
    };
    let ungrouped = |has_correction_bias| RoutingSpec {
        scoring,
        renormalize,
        num_expert_group: None,
        topk_group: None,
        routed_scaling_factor: 1.0,
        has_correction_bias,
        topk_method: None,
        llama4: family == ModelFamily::Llama4,
        sparse_mixer_jitter: None,
    };
    let (n_group, topk_group, default_scale, topk_method) = match family {
        ModelFamily::DeepseekV3 => (
            raw.n_group.or(Some(8)),
            raw.topk_group.or(Some(4)),
            2.5,
            Some(raw.topk_method.clone().unwrap_or_else(|| "noaux_tc".into())),
        ),
        ModelFamily::DeepseekV2 => (
            raw.n_group,
            raw.topk_group,
            1.0,
            Some(raw.topk_method.clone().unwrap_or_else(|| "greedy".into())),
        ),
        // transformers' defaults: one group, kept; no scaling.
        ModelFamily::Glm4Moe => (
            raw.n_group.or(Some(1)),
            raw.topk_group.or(Some(1)),
            1.0,
            None,
        ),
        // The bias is there when the config asks for it (`use_routing_bias`); the routed
        // scaling factor is not applied, as vLLM's block passes none.
        ModelFamily::MiniMaxM2 => return Ok(ungrouped(raw.use_routing_bias.unwrap_or(false))),
        // Softmax scores, the bias steering selection only (spec section 2.3).
        ModelFamily::Ernie45Moe => return Ok(ungrouped(true)),
        // transformers' default jitter is 0.01; the released config states it.
        ModelFamily::PhiMoe => {
            let eps = raw.router_jitter_noise.unwrap_or(0.01);
            if !(eps.is_finite() && eps >= 0.0) {
                return Err(field(
                    "router_jitter_noise",
                    format!("must be finite and not negative, got {eps}"),
                ));
            }
            return Ok(RoutingSpec {
                sparse_mixer_jitter: Some(eps as f32),
                ..ungrouped(false)
            });
        }
        _ => return Ok(ungrouped(false)),
    };
    if let Some(g) = n_group {
        if g == 0 || !num_experts.is_multiple_of(g) {
            return Err(field(
                "n_group",
                format!("{g} does not divide the {num_experts} experts"),
            ));
        }
        if let Some(t) = topk_group
            && (t == 0 || t > g)
        {
            return Err(field(
                "topk_group",
                format!("{t} is outside 1..={g} (n_group)"),
            ));
        }
    }
    let scale = raw.routed_scaling_factor.unwrap_or(default_scale);
    if !scale.is_finite() || scale <= 0.0 {
        return Err(field(
            "routed_scaling_factor",
            format!("must be finite and positive, got {scale}"),
        ));
    }
    Ok(RoutingSpec {
        scoring,
        renormalize,
        num_expert_group: n_group,
        topk_group,
        routed_scaling_factor: scale as f32,
        // GLM's block always has the bias; DeepSeek's with `noaux_tc`.
        has_correction_bias: family == ModelFamily::Glm4Moe
            || topk_method.as_deref() == Some("noaux_tc"),
        topk_method,
        llama4: false,
        sparse_mixer_jitter: None,
    })
}

/// Normalizes a `quantization_config` object.
fn quant_scheme(file: &Path, qc: &serde_json::Value) -> Result<QuantScheme, LayerError> {
    let method = qc
        .get("quant_method")
        .and_then(serde_json::Value::as_str)
        // AutoGPTQ's quantize_config.json carries no quant_method.
        .unwrap_or(if qc.get("bits").is_some() { "gptq" } else { "" });
    let unsupported = |scheme: String, reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme,
        reason,
    };
    match method {
        "compressed-tensors" => compressed_tensors_scheme(file, qc),
        "gptq" => {
            let cfg: GptqConfig =
                serde_json::from_value(qc.clone()).map_err(|e| LayerError::JsonParse {
                    file: file.to_path_buf(),
                    message: format!("quantization_config (gptq): {e}"),
                })?;
            if !matches!(cfg.bits, 2 | 4 | 8) {
                return Err(unsupported(
                    "gptq".into(),
                    format!(
                        "bits = {}; only 2, 4 and 8 pack whole codes into int32",
                        cfg.bits
                    ),
                ));
            }
            let group_size = config_groups(file, cfg.group_size)?;
            if let Some(f) = cfg.checkpoint_format.as_deref()
                && f != "gptq"
                && f != "gptq_v2"
            {
                return Err(unsupported(
                    format!("gptq/{f}"),
                    "checkpoint_format must be gptq or gptq_v2".into(),
                ));
            }
            Ok(QuantScheme::Gptq {
                bits: cfg.bits,
                group_size,
                // A single group makes the ordering irrelevant (vLLM forces it off).
                desc_act: cfg.desc_act && !group_size.is_channelwise(),
                sym: cfg.sym,
                checkpoint_format: cfg.checkpoint_format,
            })
        }
        "awq" => awq_scheme(file, qc),
        "mxfp4" => mxfp4_scheme(file, qc),
        "fp8" => super::fp8::fp8_scheme(file, qc),
        "" => Err(unsupported(
            "unknown".into(),
            "quantization_config has no quant_method".into(),
        )),
        other => Err(unsupported(
            other.to_string(),
            "moe-rs loads compressed-tensors (int-quantized, pack-quantized, float-quantized), \
             gptq, awq, mxfp4 and fp8"
                .into(),
        )),
    }
}

/// MXFP4 as gpt-oss ships it: every expert tensor quantized, the modules listed in
/// `modules_to_not_convert` (attention, router, embeddings) left in bf16. A list naming the
/// experts would mean float experts, which are refused rather than misread.
fn mxfp4_scheme(file: &Path, qc: &serde_json::Value) -> Result<QuantScheme, LayerError> {
    let skipped = match qc.get("modules_to_not_convert") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().ok_or_else(|| LayerError::ConfigField {
                    file: file.to_path_buf(),
                    field: "modules_to_not_convert",
                    reason: format!("entries must be strings, got {v}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(LayerError::ConfigField {
                file: file.to_path_buf(),
                field: "modules_to_not_convert",
                reason: format!("must be a list of module names, got {other}"),
            });
        }
    };
    if let Some(m) = skipped.iter().find(|m| m.contains("experts")) {
        return Err(LayerError::UnsupportedScheme {
            file: file.to_path_buf(),
            scheme: "mxfp4".into(),
            reason: format!("modules_to_not_convert lists {m:?}: float experts are not read"),
        });
    }
    Ok(QuantScheme::Mxfp4)
}

/// AWQ as AutoAWQ writes it: 4-bit codes with zero points in the `gemm` packing. The `gemv`
/// packings interleave differently and symmetric AWQ (`zero_point: false`) stores no zeros; both
/// are refused rather than read with the wrong layout.
fn awq_scheme(file: &Path, qc: &serde_json::Value) -> Result<QuantScheme, LayerError> {
    let cfg: AwqConfig = serde_json::from_value(qc.clone()).map_err(|e| LayerError::JsonParse {
        file: file.to_path_buf(),
        message: format!("quantization_config (awq): {e}"),
    })?;
    let unsupported = |reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme: "awq".into(),
        reason,
    };
    if cfg.bits != 4 {
        return Err(unsupported(format!(
            "bits = {}; AWQ is read as 4-bit only",
            cfg.bits
        )));
    }
    if let Some(v) = cfg.version.as_deref()
        && !v.eq_ignore_ascii_case("gemm")
    {
        return Err(unsupported(format!(
            "version {v:?}; only the gemm packing is supported"
        )));
    }
    if !cfg.zero_point {
        return Err(unsupported(
            "zero_point = false; only AWQ with zero points is supported".into(),
        ));
    }
    let group_size = config_groups(file, cfg.group_size)?;
    Ok(QuantScheme::Awq { group_size })
}

fn compressed_tensors_scheme(
    file: &Path,
    qc: &serde_json::Value,
) -> Result<QuantScheme, LayerError> {
    let cfg: QuantizationConfig =
        serde_json::from_value(qc.clone()).map_err(|e| LayerError::JsonParse {
            file: file.to_path_buf(),
            message: format!("quantization_config: {e}"),
        })?;
    cfg.validate().map_err(|source| LayerError::QuantConfig {
        file: file.to_path_buf(),
        source,
    })?;
    let unsupported = |scheme: String, reason: String| LayerError::UnsupportedScheme {
        file: file.to_path_buf(),
        scheme,
        reason,
    };
    // The group that quantizes the experts: targets `Linear` or a pattern naming the experts.
    let candidates: Vec<_> = cfg
        .config_groups
        .iter()
        .filter(|(_, g)| g.weights.is_some())
        .filter(|(_, g)| {
            g.targets
                .iter()
                .any(|t| t == "Linear" || t.contains("expert") || t.contains("mlp"))
        })
        .collect();
    let (group_name, group) = match candidates.as_slice() {
        [one] => *one,
        [] => {
            return Err(unsupported(
                "compressed-tensors".into(),
                "no config group with weights targets Linear or the experts".into(),
            ));
        }
        many => {
            let first = &many[0].1;
            if many.iter().all(|(_, g)| {
                g.weights == first.weights
                    && g.input_activations == first.input_activations
                    && g.format == first.format
            }) {
                many[0]
            } else {
                let names: Vec<_> = many.iter().map(|(n, _)| n.as_str()).collect();
                return Err(unsupported(
                    "compressed-tensors".into(),
                    format!("several config groups may target the experts: {names:?}"),
                ));
            }
        }
    };
    let weights = group.weights.as_ref().expect("filtered on weights");
    let format = group
        .format
        .as_deref()
        .or(cfg.format.as_deref())
        .unwrap_or("")
        .to_string();
    let scheme_name = format!("compressed-tensors/{format}");
    // `naive-quantized` stores weights in their quantized dtype as they are, as the
    // `int-quantized` and `float-quantized` compressors do: the weight type tells them apart.
    let naive = format == "naive-quantized";
    if format == "float-quantized" || (naive && weights.kind == QuantizationType::Float) {
        return super::fp8::compressed_tensors_fp8(file, group_name, group, &cfg.ignore);
    }
    if weights.kind != QuantizationType::Int {
        return Err(unsupported(
            scheme_name,
            format!(
                "{group_name}: float weights are read from the float-quantized format (8-bit \
                 e4m3) only"
            ),
        ));
    }
    // Zero points are read for pack-quantized weights only (W4A8's kernels are symmetric).
    if !weights.symmetric && format != "pack-quantized" {
        return Err(unsupported(
            scheme_name,
            format!("{group_name}: asymmetric weights (zero points) are not supported"),
        ));
    }
    if weights.dynamic.is_truthy() {
        return Err(unsupported(
            scheme_name,
            format!("{group_name}: dynamic weight scales are not supported"),
        ));
    }
    let group_size = weights
        .weight_groups()
        .map_err(|source| LayerError::QuantConfig {
            file: file.to_path_buf(),
            source,
        })?
        .ok_or_else(|| {
            let s = weights.effective_strategy();
            unsupported(
                scheme_name.clone(),
                format!("{group_name}: weight strategy {s:?} is not supported (group or channel)"),
            )
        })?;
    let scale_dtype = weights
        .scale_dtype()
        .map_err(|source| LayerError::QuantConfig {
            file: file.to_path_buf(),
            source,
        })?;
    match format.as_str() {
        "int-quantized" | "naive-quantized" if weights.num_bits == 8 => {
            w8a8_int_scheme(weights, group.input_activations.as_ref(), scale_dtype)
                .map_err(|reason| unsupported(scheme_name, format!("{group_name}: {reason}")))
        }
        "int-quantized" | "naive-quantized" => {
            let input = group.input_activations.as_ref();
            if !is_dynamic_token_w4a8_int(weights, input) {
                check_w4a8_int_moe(weights, input)
                    .map_err(|e| unsupported(scheme_name.clone(), format!("{group_name}: {e}")))?;
                return Err(unsupported(
                    scheme_name,
                    format!(
                        "{group_name}: only W4A8-int (4-bit symmetric static weights, 8-bit \
                         dynamic per-token activations) is supported"
                    ),
                ));
            }
            Ok(QuantScheme::CompressedTensorsW4A8 {
                group_size,
                scale_dtype,
                activations_symmetric: input.is_some_and(|a| a.symmetric),
            })
        }
        "pack-quantized" => {
            if !matches!(weights.num_bits, 4 | 8) {
                return Err(unsupported(
                    scheme_name,
                    format!(
                        "{group_name}: num_bits = {}; only 4 and 8 are supported",
                        weights.num_bits
                    ),
                ));
            }
            if group.input_activations.is_some() {
                return Err(unsupported(
                    scheme_name,
                    format!(
                        "{group_name}: quantized input activations with pack-quantized weights"
                    ),
                ));
            }
            Ok(QuantScheme::CompressedTensorsWna16 {
                bits: weights.num_bits,
                group_size,
                actorder: weights.actorder,
                scale_dtype,
                symmetric: weights.symmetric,
            })
        }
        _ => Err(unsupported(
            scheme_name,
            "supported formats are int-quantized (W4A8, W8A8), pack-quantized (WNA16), \
             float-quantized (FP8) and naive-quantized (any of int-quantized's or \
             float-quantized's)"
                .into(),
        )),
    }
}

/// The W8A8 int8 scheme of an `int-quantized` group with 8-bit weights, under vLLM's int8 MoE
/// method's conditions: channelwise static weights, dynamic per-token activations (and, as
/// its kernels are symmetric, symmetric 8-bit integer weights and activations).
fn w8a8_int_scheme(
    weights: &moe_quant::QuantizationArgs,
    input: Option<&moe_quant::QuantizationArgs>,
    scale_dtype: Option<DType>,
) -> Result<QuantScheme, String> {
    if weights.effective_strategy() != QuantizationStrategy::Channel {
        return Err(format!(
            "8-bit int weights need channelwise scales, got strategy {:?}",
            weights.effective_strategy()
        ));
    }
    let Some(a) = input else {
        return Err(
            "8-bit int weights without input activations (W8A16) are read from the \
             pack-quantized format only"
                .into(),
        );
    };
    let dynamic_token_int8 = a.kind == QuantizationType::Int
        && a.num_bits == 8
        && a.effective_strategy() == QuantizationStrategy::Token
        && a.dynamic.is_truthy();
    if !dynamic_token_int8 {
        return Err(format!(
            "W8A8 needs dynamic per-token 8-bit int activations, got {}-bit {:?} per {:?}{}",
            a.num_bits,
            a.kind,
            a.effective_strategy(),
            if a.dynamic.is_truthy() {
                ""
            } else {
                " (static)"
            }
        ));
    }
    Ok(QuantScheme::CompressedTensorsW8A8 {
        scale_dtype,
        activations_symmetric: a.symmetric,
    })
}

/// Parses the `group_size` of a GPTQ or AWQ config (`-1` channelwise, `g > 0` groups of `g`).
fn config_groups(file: &Path, group_size: i64) -> Result<WeightGroups, LayerError> {
    WeightGroups::from_config(group_size).map_err(|e| LayerError::ConfigField {
        file: file.to_path_buf(),
        field: "group_size",
        reason: match e {
            QuantError::InvalidGroupSize { group_size, .. } => {
                format!("must be positive or -1, got {group_size}")
            }
            other => other.to_string(),
        },
    })
}
