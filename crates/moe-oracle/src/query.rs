//! What a support check reads ([`SupportQuery`]) and the activation layout a parallel
//! configuration implies ([`ActivationFormat`]).

use moe_quant::{QuantKey, WeightGroups};

use crate::config::MoeConfig;
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

impl SupportQuery<'_> {
    /// The scale grouping of the weight key: channelwise or groups of `g` input columns, read
    /// from a quantized key's group-shape tag; `None` for unquantized weights, scalar-type keys
    /// and tags that are no weight grouping.
    pub fn weight_groups(&self) -> Option<WeightGroups> {
        match self.weight_key {
            Some(WeightKey::Quant(k)) => WeightGroups::from_group_shape(k.scale.group_shape).ok(),
            _ => None,
        }
    }
}
