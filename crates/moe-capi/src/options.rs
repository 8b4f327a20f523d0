//! [`MoeLayerOptions`]: the settings of a layer beyond its sizes and weight scheme (the gated
//! activation, the routing method and its parameters, what WNA16 weights are multiplied
//! with, the numerics of W4A8 prefill), and their translation into the layer's configuration.
//!
//! The struct starts with its own size, so that a later version of the library can append
//! fields and still read what an older caller wrote: fields past the caller's
//! `struct_size` keep their defaults. The first version of the struct ended with
//! `wna16_activations` ([`OPTIONS_FIRST_VERSION_SIZE`] bytes); the smallest size read is that.

use moe_kernels::Activation;
use moe_layer::checkpoint::RoutingSpec;
use moe_layer::{MoeLayerConfig, W4A8Prefill, Wna16Activations};
use moe_router::ScoringFunc;

use crate::status::CapiError;

/// gpt-oss's clamp limit, what SwiGLU-OAI takes when `activation_limit` is 0.
const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// The gated activation of the experts (`MoeLayerOptions::activation`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeActivation {
    /// `silu(gate)·up`; with `activation_limit > 0`, `silu(min(gate, L))·clamp(up, −L, L)`.
    Silu = 0,
    /// `gelu(gate)·up` with the exact (erf) GELU.
    Gelu = 1,
    /// `gelu(gate)·up` with the tanh approximation.
    GeluTanh = 2,
    /// SwiGLU-OAI (gpt-oss): `g = min(gate, L)`, `u = clamp(up, −L, L)`,
    /// `g·σ(α·g)·(u + 1)`, with `α = activation_alpha` and `L = activation_limit`.
    SwigluOai = 3,
    /// SwiGLU-step: `min(silu(gate), 7)·clamp(up, −7, 7)`.
    SwigluStep = 4,
}

/// How router logits become expert ids and weights (`MoeLayerOptions::routing`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRouting {
    /// Softmax over all experts, then top-k (vLLM's CPU router; Qwen-MoE, Mixtral).
    Softmax = 0,
    /// Sigmoid scores, then top-k.
    Sigmoid = 1,
    /// Grouped top-k on softmax scores (DeepSeek-V2): the best `topk_group` of
    /// `num_groups` expert groups, then top-k among their experts.
    GroupedSoftmax = 2,
    /// Grouped top-k on sigmoid scores (DeepSeek-V3), usually with a correction bias.
    GroupedSigmoid = 3,
    /// Llama 4: the top-k raw logits, each weighted by its sigmoid, the weight multiplying
    /// the token before its expert rather than the expert's output. Not renormalized (the
    /// layer's `renormalize` must be 0), without groups or correction bias.
    Llama4 = 4,
}

/// What WNA16 weights are multiplied with (`MoeLayerOptions::wna16_activations`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeWna16Activations {
    /// Float activations, f32 accumulation: the checkpoint's own numerics.
    Float = 0,
    /// Dynamic per-token int8 activations on the W4A8 kernels: faster decode with W4A8's
    /// numerics; symmetric int4 weights without act-order only.
    Int8 = 1,
}

/// The numerics of W4A8 prefill, from the kernels' row threshold on
/// (`MoeLayerOptions::w4a8_prefill`); decode calls run the exact int8 path whatever is chosen.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeW4a8Prefill {
    /// What the process chose: `MOE_KERNELS_W4A8_PREFILL`, or exact int8 when it is unset.
    Process = 0,
    /// Int8 activations with the group scales applied per group: bit-equal to vLLM's W4A8
    /// kernel (`int8`).
    Int8 = 1,
    /// Activations and dequantized weights in bf16 on the AMX-BF16 tiles, f32 sums (`bf16`);
    /// where the CPU has no AMX-BF16, the same as `MOE_W4A8_PREFILL_INT8`.
    Bf16 = 2,
    /// Weights requantised to int8 with one scale per channel once per call, int8
    /// activations, one int32 sum over all of K (`int8-channel`): faster prefill, outputs
    /// about 1 % (relative L2) from the exact ones; on the AMX and AVX-512 VNNI rungs.
    Int8Channel = 3,
}

/// Settings of a layer beyond `MoeLayerDesc`, for `moe_layer_create_with` and
/// `moe_layer_open_checkpoint_with`. Start from `moe_layer_options_default` and change the
/// fields you need. A checkpoint's `config.json` decides its activation and routing, so
/// `moe_layer_open_checkpoint_with` reads only `wna16_activations` and `w4a8_prefill`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeLayerOptions {
    /// `sizeof(MoeLayerOptions)` as the caller was compiled (set by
    /// `moe_layer_options_default`); fields past it keep their defaults.
    pub struct_size: usize,
    /// A `MoeActivation` value (default `MOE_ACTIVATION_SILU`).
    pub activation: u32,
    /// Sigmoid slope α of `MOE_ACTIVATION_SWIGLU_OAI` (default 1.702).
    pub activation_alpha: f32,
    /// Clamp limit of `MOE_ACTIVATION_SWIGLU_OAI`, or of `MOE_ACTIVATION_SILU` when positive.
    /// The default, 0, means each activation's own: none for SiLU, gpt-oss's 7 for
    /// SwiGLU-OAI.
    pub activation_limit: f32,
    /// A `MoeRouting` value (default `MOE_ROUTING_SOFTMAX`).
    pub routing: u32,
    /// Grouped routings: expert groups (`n_group`).
    pub num_groups: usize,
    /// Grouped routings: groups kept per token (`topk_group`).
    pub topk_group: usize,
    /// Factor on the routing weights (`routed_scaling_factor`, default 1).
    pub routed_scaling_factor: f32,
    /// Non-zero: the router adds a per-expert bias to the scores for selection only
    /// (DeepSeek-V3's `e_score_correction_bias`), loaded with `moe_layer_load_tensor` as
    /// `gate.e_score_correction_bias` (f32 `[E]`) before `moe_layer_process`.
    pub correction_bias: u32,
    /// A `MoeWna16Activations` value (default `MOE_WNA16_ACTIVATIONS_FLOAT`).
    pub wna16_activations: u32,
    /// A `MoeW4a8Prefill` value (default `MOE_W4A8_PREFILL_PROCESS`). Read when
    /// `struct_size` covers it.
    pub w4a8_prefill: u32,
    /// Zero; refused otherwise, so that a later meaning cannot be misread.
    pub reserved: u32,
}

/// Bytes of the struct's first version, which ended with `wna16_activations`: the smallest
/// `struct_size` read.
pub const OPTIONS_FIRST_VERSION_SIZE: usize = std::mem::offset_of!(MoeLayerOptions, w4a8_prefill)
    .next_multiple_of(std::mem::align_of::<MoeLayerOptions>());

impl Default for MoeLayerOptions {
    fn default() -> Self {
        Self {
            struct_size: size_of::<Self>(),
            activation: MoeActivation::Silu as u32,
            activation_alpha: 1.702,
            activation_limit: 0.0,
            routing: MoeRouting::Softmax as u32,
            num_groups: 0,
            topk_group: 0,
            routed_scaling_factor: 1.0,
            correction_bias: 0,
            wna16_activations: MoeWna16Activations::Float as u32,
            w4a8_prefill: MoeW4a8Prefill::Process as u32,
            reserved: 0,
        }
    }
}

impl MoeLayerOptions {
    /// The options at `ptr`: the defaults for NULL; the caller's fields up to its
    /// `struct_size`, the defaults after.
    ///
    /// # Safety
    /// - `ptr` is NULL, or points to a readable, aligned `usize` (`struct_size`) followed by
    ///   at least `struct_size` bytes in all of the caller's struct.
    pub(crate) unsafe fn read(ptr: *const Self) -> Result<Self, CapiError> {
        if ptr.is_null() {
            return Ok(Self::default());
        }
        if !ptr.is_aligned() {
            return Err(CapiError::invalid("options: misaligned pointer"));
        }
        // SAFETY: non-NULL and aligned (checked); its first field is readable per this
        // function's contract.
        let size = unsafe { ptr.cast::<usize>().read() };
        if size >= size_of::<Self>() {
            // SAFETY: the caller's struct holds `size ≥ size_of::<Self>()` readable bytes
            // (this function's contract) and the pointer is aligned; every field is a plain
            // integer or float, valid for any bits.
            return Ok(unsafe { ptr.read() });
        }
        if size < OPTIONS_FIRST_VERSION_SIZE {
            return Err(CapiError::invalid(format!(
                "options.struct_size: {size} is smaller than any MoeLayerOptions this library \
                 reads ({OPTIONS_FIRST_VERSION_SIZE} to {} bytes); fill the struct with \
                 moe_layer_options_default",
                size_of::<Self>()
            )));
        }
        // An older caller's struct: its fields over the defaults of the later ones. Its
        // padding after `wna16_activations` is not read.
        let mut options = Self::default();
        let prefix = std::mem::offset_of!(Self, w4a8_prefill);
        // SAFETY: the caller's struct holds `size ≥ OPTIONS_FIRST_VERSION_SIZE > prefix` readable
        // bytes (this function's contract); `options` is a distinct local of at least
        // `prefix` bytes, and the first `prefix` bytes are the first version's fields, with no
        // padding between them, each a plain integer or float valid for any bits.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut options).cast::<u8>(), prefix)
        };
        Ok(options)
    }

    /// The activation these options name.
    fn activation(&self) -> Result<Activation, CapiError> {
        let limit = self.activation_limit;
        Ok(match self.activation {
            0 => Activation::Silu {
                limit: (limit > 0.0).then_some(limit),
            },
            1 => Activation::Gelu,
            2 => Activation::GeluTanh,
            3 => {
                let limit = if limit == 0.0 {
                    SWIGLU_OAI_LIMIT
                } else {
                    limit
                };
                if !(self.activation_alpha.is_finite() && limit.is_finite() && limit > 0.0) {
                    return Err(CapiError::invalid(format!(
                        "options: SwiGLU-OAI needs a finite alpha and a positive limit, got \
                         alpha {} and limit {limit}",
                        self.activation_alpha
                    )));
                }
                Activation::SwigluOai {
                    alpha: self.activation_alpha,
                    limit,
                }
            }
            4 => Activation::SwigluStep,
            other => {
                return Err(CapiError::invalid(format!(
                    "options.activation: {other} is not a MoeActivation (0 = silu, 1 = gelu, \
                     2 = gelu_tanh, 3 = swiglu_oai, 4 = swiglu_step)"
                )));
            }
        })
    }

    /// The routing these options name, as a model config would state it.
    fn routing(&self, renormalize: bool) -> Result<RoutingSpec, CapiError> {
        let (scoring, grouped) = match self.routing {
            0 => (ScoringFunc::Softmax, false),
            1 => (ScoringFunc::Sigmoid, false),
            2 => (ScoringFunc::Softmax, true),
            3 => (ScoringFunc::Sigmoid, true),
            4 => return self.llama4_routing(renormalize),
            other => {
                return Err(CapiError::invalid(format!(
                    "options.routing: {other} is not a MoeRouting (0 = softmax, 1 = sigmoid, \
                     2 = grouped_softmax, 3 = grouped_sigmoid, 4 = llama4)"
                )));
            }
        };
        if grouped && (self.num_groups < 2 || self.topk_group == 0) {
            return Err(CapiError::invalid(format!(
                "options: grouped routing needs num_groups ≥ 2 and topk_group ≥ 1, got {} and {}",
                self.num_groups, self.topk_group
            )));
        }
        if !(self.routed_scaling_factor.is_finite() && self.routed_scaling_factor > 0.0) {
            return Err(CapiError::invalid(format!(
                "options.routed_scaling_factor: {} is not a positive number",
                self.routed_scaling_factor
            )));
        }
        Ok(RoutingSpec {
            scoring,
            renormalize,
            num_expert_group: grouped.then_some(self.num_groups),
            topk_group: grouped.then_some(self.topk_group),
            routed_scaling_factor: self.routed_scaling_factor,
            has_correction_bias: self.correction_bias != 0,
            topk_method: None,
            llama4: false,
            sparse_mixer_jitter: None,
        })
    }

    /// Llama 4's routing, which has none of the other routings' options.
    fn llama4_routing(&self, renormalize: bool) -> Result<RoutingSpec, CapiError> {
        if renormalize {
            return Err(CapiError::invalid(
                "desc.renormalize: llama4 routing weighs each expert by the sigmoid of its \
                 logit and does not renormalize; set renormalize to 0",
            ));
        }
        if self.correction_bias != 0 {
            return Err(CapiError::invalid(
                "options.correction_bias: llama4 routing has no correction bias",
            ));
        }
        if self.routed_scaling_factor != 1.0 {
            return Err(CapiError::invalid(format!(
                "options.routed_scaling_factor: llama4 routing takes no scaling factor, got {}",
                self.routed_scaling_factor
            )));
        }
        Ok(RoutingSpec {
            scoring: ScoringFunc::Sigmoid,
            renormalize: false,
            num_expert_group: None,
            topk_group: None,
            routed_scaling_factor: 1.0,
            has_correction_bias: false,
            topk_method: None,
            llama4: true,
            sparse_mixer_jitter: None,
        })
    }

    /// What WNA16 weights are multiplied with.
    pub(crate) fn wna16_activations(&self) -> Result<Wna16Activations, CapiError> {
        match self.wna16_activations {
            0 => Ok(Wna16Activations::Float),
            1 => Ok(Wna16Activations::DynamicInt8),
            other => Err(CapiError::invalid(format!(
                "options.wna16_activations: {other} is not a MoeWna16Activations (0 = float, \
                 1 = int8)"
            ))),
        }
    }

    /// The numerics of W4A8 prefill these options choose; `None` leaves the process's choice.
    pub(crate) fn w4a8_prefill(&self) -> Result<Option<W4A8Prefill>, CapiError> {
        if self.reserved != 0 {
            return Err(CapiError::invalid(format!(
                "options.reserved: {} where 0 is required",
                self.reserved
            )));
        }
        match self.w4a8_prefill {
            0 => Ok(None),
            1 => Ok(Some(W4A8Prefill::ExactInt8)),
            2 => Ok(Some(W4A8Prefill::Bf16Tiles)),
            3 => Ok(Some(W4A8Prefill::ChannelInt8)),
            other => Err(CapiError::invalid(format!(
                "options.w4a8_prefill: {other} is not a MoeW4a8Prefill (0 = process, 1 = int8, \
                 2 = bf16, 3 = int8_channel)"
            ))),
        }
    }

    /// `cfg` with these options' activation, routing (renormalized when `renormalize`), WNA16
    /// activations and W4A8 prefill; the router is built by the rules the checkpoint loader
    /// uses.
    pub(crate) fn configure(
        &self,
        cfg: MoeLayerConfig,
        renormalize: bool,
    ) -> Result<MoeLayerConfig, CapiError> {
        let spec = self.routing(renormalize)?;
        let router = moe_layer::layer::router_from_spec(&spec, cfg.num_experts, cfg.top_k)
            .map_err(|reason| CapiError::invalid(format!("options: {reason}")))?;
        let mut cfg = cfg
            .with_activation(self.activation()?)
            .with_router(router)
            .with_wna16_activations(self.wna16_activations()?);
        if let Some(prefill) = self.w4a8_prefill()? {
            cfg = cfg.with_w4a8_prefill(prefill);
        }
        cfg.router_bias_pending = spec.has_correction_bias;
        Ok(cfg)
    }
}

/// Fills `*options` with the defaults: SiLU experts, softmax routing, float activations for
/// WNA16 weights, the process's W4A8 prefill numerics, and `struct_size` set to this
/// library's `sizeof(MoeLayerOptions)`. Does nothing for NULL.
///
/// # Safety
/// - `options` is NULL or valid for one write of a `MoeLayerOptions`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_options_default(options: *mut MoeLayerOptions) {
    if !options.is_null() && options.is_aligned() {
        // SAFETY: non-NULL and aligned (checked), writable per this function's contract.
        unsafe { options.write(MoeLayerOptions::default()) };
    }
}
