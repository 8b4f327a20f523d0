//! [`RoutingMethodType`] with vLLM's newest numbering, and its derivation from a model's
//! routing parameters (spec section 2.1).
//!
//! moe-router was not yet on `main` when this was written, so the enum lives here; when
//! moe-router lands, one of the two should re-export the other.

use std::fmt;

/// How router logits become top-k weights and ids (vLLM `RoutingMethodType`, newest values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutingMethodType {
    /// Softmax over all experts, then top-k; weights not renormalized.
    Default,
    /// Top-k on logits, then softmax over the k selected.
    Renormalize,
    /// DeepSeek-V3 grouped sigmoid routing with correction bias.
    DeepSeekV3,
    /// Top-1, weight = sigmoid(logit).
    Llama4,
    /// Softmax over all experts, top-k, divide by the sum of the k.
    RenormalizeNaive,
    /// Top-k without a score function.
    TopK,
    /// Sigmoid, top-k, renormalize.
    SigmoidRenorm,
    /// Sigmoid plus correction bias, no groups, renormalize.
    MiniMax2,
    /// Sigmoid, top-k, no renormalize.
    Sigmoid,
    /// Anything else.
    Unspecified,
    /// DeepSeek-V4 sqrt-softplus scoring.
    DeepseekV4,
    /// Model-supplied routing function.
    Custom,
    /// Routing simulator (testing).
    Simulated,
}

impl RoutingMethodType {
    /// Every variant in value order.
    pub const ALL: [RoutingMethodType; 13] = [
        RoutingMethodType::Default,
        RoutingMethodType::Renormalize,
        RoutingMethodType::DeepSeekV3,
        RoutingMethodType::Llama4,
        RoutingMethodType::RenormalizeNaive,
        RoutingMethodType::TopK,
        RoutingMethodType::SigmoidRenorm,
        RoutingMethodType::MiniMax2,
        RoutingMethodType::Sigmoid,
        RoutingMethodType::Unspecified,
        RoutingMethodType::DeepseekV4,
        RoutingMethodType::Custom,
        RoutingMethodType::Simulated,
    ];

    /// vLLM's integer value (newest numbering). Used only to reproduce vLLM's messages, where
    /// the `IntEnum` prints as its integer; never serialized.
    pub fn vllm_value(self) -> u32 {
        match self {
            RoutingMethodType::Default => 0,
            RoutingMethodType::Renormalize => 1,
            RoutingMethodType::DeepSeekV3 => 2,
            RoutingMethodType::Llama4 => 3,
            RoutingMethodType::RenormalizeNaive => 4,
            RoutingMethodType::TopK => 5,
            RoutingMethodType::SigmoidRenorm => 6,
            RoutingMethodType::MiniMax2 => 7,
            RoutingMethodType::Sigmoid => 8,
            RoutingMethodType::Unspecified => 9,
            RoutingMethodType::DeepseekV4 => 100,
            RoutingMethodType::Custom => 101,
            RoutingMethodType::Simulated => 102,
        }
    }

    /// The member name (`"DeepSeekV3"`).
    pub fn name(self) -> &'static str {
        match self {
            RoutingMethodType::Default => "Default",
            RoutingMethodType::Renormalize => "Renormalize",
            RoutingMethodType::DeepSeekV3 => "DeepSeekV3",
            RoutingMethodType::Llama4 => "Llama4",
            RoutingMethodType::RenormalizeNaive => "RenormalizeNaive",
            RoutingMethodType::TopK => "TopK",
            RoutingMethodType::SigmoidRenorm => "SigmoidRenorm",
            RoutingMethodType::MiniMax2 => "MiniMax2",
            RoutingMethodType::Sigmoid => "Sigmoid",
            RoutingMethodType::Unspecified => "Unspecified",
            RoutingMethodType::DeepseekV4 => "DeepseekV4",
            RoutingMethodType::Custom => "Custom",
            RoutingMethodType::Simulated => "Simulated",
        }
    }

    /// The methods moe-router implements, which our monolithic kernels therefore accept.
    pub const MOE_ROUTER: [RoutingMethodType; 10] = [
        RoutingMethodType::Default,
        RoutingMethodType::Renormalize,
        RoutingMethodType::RenormalizeNaive,
        RoutingMethodType::DeepSeekV3,
        RoutingMethodType::Llama4,
        RoutingMethodType::SigmoidRenorm,
        RoutingMethodType::Sigmoid,
        RoutingMethodType::MiniMax2,
        RoutingMethodType::TopK,
        RoutingMethodType::Custom,
    ];

    /// The softmax-only set vLLM's CPU experts accept.
    pub const VLLM_CPU: [RoutingMethodType; 3] = [
        RoutingMethodType::Default,
        RoutingMethodType::Renormalize,
        RoutingMethodType::RenormalizeNaive,
    ];
}

impl fmt::Display for RoutingMethodType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The router's score function (`scoring_func` in model configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScoringFunc {
    /// `"softmax"`.
    Softmax,
    /// `"sigmoid"`.
    Sigmoid,
    /// `"sqrtsoftplus"` (DeepSeek-V4).
    SqrtSoftplus,
}

/// vLLM's `get_routing_method_type` **[newest]**: which method a model's routing parameters
/// describe. `num_expert_group` of `None` or 0 means no groups; `routed_scaling_factor` of
/// `None` counts as 1.0.
pub fn routing_method_type(
    scoring: ScoringFunc,
    renormalize: bool,
    num_expert_group: Option<u32>,
    has_e_score_bias: bool,
    routed_scaling_factor: Option<f64>,
) -> RoutingMethodType {
    use RoutingMethodType as R;
    match scoring {
        ScoringFunc::SqrtSoftplus => {
            if renormalize {
                R::DeepseekV4
            } else {
                R::Unspecified
            }
        }
        ScoringFunc::Sigmoid if has_e_score_bias => {
            if !renormalize {
                R::Unspecified
            } else if num_expert_group.unwrap_or(0) > 0 {
                R::DeepSeekV3
            } else if routed_scaling_factor.is_none_or(|f| f == 1.0) {
                R::MiniMax2
            } else {
                R::Unspecified
            }
        }
        _ if has_e_score_bias => R::Unspecified,
        ScoringFunc::Sigmoid => {
            if renormalize {
                R::SigmoidRenorm
            } else {
                R::Sigmoid
            }
        }
        ScoringFunc::Softmax => {
            if renormalize {
                R::RenormalizeNaive
            } else {
                R::Default
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RoutingMethodType as R;
    use super::*;

    #[test]
    fn derivation_follows_spec() {
        use ScoringFunc::*;
        assert_eq!(
            routing_method_type(Softmax, false, None, false, None),
            R::Default
        );
        assert_eq!(
            routing_method_type(Softmax, true, None, false, None),
            R::RenormalizeNaive
        );
        assert_eq!(
            routing_method_type(Sigmoid, true, None, false, None),
            R::SigmoidRenorm
        );
        assert_eq!(
            routing_method_type(Sigmoid, false, None, false, None),
            R::Sigmoid
        );
        assert_eq!(
            routing_method_type(Sigmoid, true, Some(8), true, Some(2.5)),
            R::DeepSeekV3
        );
        assert_eq!(
            routing_method_type(Sigmoid, true, Some(0), true, Some(1.0)),
            R::MiniMax2
        );
        assert_eq!(
            routing_method_type(Sigmoid, true, None, true, None),
            R::MiniMax2
        );
        assert_eq!(
            routing_method_type(Sigmoid, true, None, true, Some(2.0)),
            R::Unspecified
        );
        assert_eq!(
            routing_method_type(Sigmoid, false, Some(8), true, None),
            R::Unspecified
        );
        assert_eq!(
            routing_method_type(Softmax, true, None, true, None),
            R::Unspecified
        );
        assert_eq!(
            routing_method_type(SqrtSoftplus, true, None, true, None),
            R::DeepseekV4
        );
        assert_eq!(
            routing_method_type(SqrtSoftplus, false, None, false, None),
            R::Unspecified
        );
        assert_eq!(R::Custom.vllm_value(), 101);
    }
}
