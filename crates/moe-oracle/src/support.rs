//! The support check driver: asks one kernel's hooks (the methods [`crate::kernels`] adds to
//! [`KernelId`]) in vLLM's order (`FusedMoEExperts.is_supported_config`, spec 7.6) and returns
//! the first refusal.
//!
//! Order: the kernel's own pre-checks, then device, act_and_mul, activation, quantization
//! scheme, parallel config, routing method, router logits dtype, hidden-dim shape, activation
//! format, batch invariance (when required), LoRA (when enabled), then the kernel's
//! post-checks.

use crate::kernels::KernelId;
pub use crate::query::{ActivationFormat, SupportQuery};
use crate::unsupported::Unsupported;

/// vLLM's `is_supported_config` for one kernel: `Ok(())` or the first refusal.
pub fn is_supported_config(kernel: KernelId, q: &SupportQuery<'_>) -> Result<(), Unsupported> {
    let c = q.config;
    kernel.pre_check(q)?;
    kernel.supports_current_device(q.platform)?;
    kernel.supports_act_and_mul(c.is_act_and_mul())?;
    kernel.supports_activation(c.activation)?;
    kernel.supports_quant_scheme(q.weight_key, q.activation_key)?;
    kernel.supports_parallel_config(c.parallel())?;
    kernel.supports_routing_method(c.routing_method, c.routing_by_moe_router)?;
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
