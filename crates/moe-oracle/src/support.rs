//! The support check driver: asks one kernel's hooks in vLLM's order
//! (`FusedMoEExperts.is_supported_config`, spec 7.6) and returns the first refusal.
//!
//! Order: the kernel's own pre-checks, then device, act_and_mul, activation, quantization
//! scheme, parallel config, routing method, router logits dtype, hidden-dim shape, activation
//! format, batch invariance (when required), LoRA (when enabled), then the kernel's
//! post-checks.

use moe_quant::QuantKey;

use crate::config::MoeConfig;
use crate::error::Unsupported;
use crate::kernels::KernelId;
use crate::platform::Platform;
use crate::quant_config::WeightKey;

/// The layout of activations handed to the experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ActivationFormat {
    /// `[T, H]` rows.
    Standard,
    /// `[E, max_tokens, H]`, from batched all-to-all kernels.
    BatchedExperts,
}

impl ActivationFormat {
    /// vLLM's enum value, as its messages print it.
    pub fn value(self) -> &'static str {
        match self {
            ActivationFormat::Standard => "standard",
            ActivationFormat::BatchedExperts => "batched_experts",
        }
    }

    /// The format a parallel configuration implies.
    pub fn for_config(config: &MoeConfig) -> Self {
        if config.parallel().use_batched_activation_format() {
            ActivationFormat::BatchedExperts
        } else {
            ActivationFormat::Standard
        }
    }
}

/// Everything a support check reads.
#[derive(Debug, Clone, Copy)]
pub struct SupportQuery<'a> {
    /// The layer configuration.
    pub config: &'a MoeConfig,
    /// The weight quantization key (`None` for unquantized weights).
    pub weight_key: Option<&'a WeightKey>,
    /// The activation quantization key (`None` when the kernel quantizes, or for 16-bit).
    pub activation_key: Option<&'a QuantKey>,
    /// The activation format the parallel configuration implies.
    pub activation_format: ActivationFormat,
    /// The machine.
    pub platform: &'a Platform,
    /// Whether batch-invariant results are required (vLLM's `VLLM_BATCH_INVARIANT`).
    pub batch_invariant: bool,
}

/// vLLM's `is_supported_config` for one kernel: `Ok(())` or the first refusal.
pub fn is_supported_config(kernel: KernelId, q: &SupportQuery<'_>) -> Result<(), Unsupported> {
    let c = q.config;
    kernel.pre_check(q)?;
    kernel.supports_current_device(q.platform)?;
    kernel.supports_act_and_mul(c.is_act_and_mul())?;
    kernel.supports_activation(c.activation)?;
    kernel.supports_quant_scheme(q.weight_key, q.activation_key)?;
    kernel.supports_parallel_config(c.parallel())?;
    kernel.supports_routing_method(c.routing_method)?;
    kernel.supports_router_logits_dtype(c.effective_router_logits_dtype())?;
    kernel.supports_shape(c.hidden_dim())?;
    kernel.supports_activation_format(q.activation_format)?;
    if q.batch_invariant {
        kernel.supports_batch_invariance()?;
    }
    if c.is_lora_enabled {
        kernel.supports_lora()?;
    }
    kernel.post_check(q)
}
