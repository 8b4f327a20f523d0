//! vLLM's routing vocabulary: the scoring functions and the `RoutingMethodType` label with its
//! derivation from a model's routing parameters (spec §2.1, newest numbering).

use std::fmt;
use std::str::FromStr;

use crate::RouterError;

/// How a logit becomes an expert score (vLLM's `scoring_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScoringFunc {
    /// Softmax over all experts of the token.
    Softmax,
    /// Element-wise logistic sigmoid, `1 / (1 + exp(-x))`.
    Sigmoid,
    /// Element-wise `sqrt(softplus(x))` (DeepSeek-V4 style scoring).
    SqrtSoftplus,
}

impl ScoringFunc {
    /// The spelling vLLM uses in model configs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Softmax => "softmax",
            Self::Sigmoid => "sigmoid",
            Self::SqrtSoftplus => "sqrtsoftplus",
        }
    }
}

impl fmt::Display for ScoringFunc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ScoringFunc {
    type Err = RouterError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "softmax" => Ok(Self::Softmax),
            "sigmoid" => Ok(Self::Sigmoid),
            "sqrtsoftplus" => Ok(Self::SqrtSoftplus),
            _ => Err(RouterError::UnknownName {
                what: "scoring_func",
                name: s.to_string(),
            }),
        }
    }
}

/// The routing label vLLM hands to fused kernels (FlashInfer's TRT-LLM runner), newest numbering.
///
/// The label describes the maths a kernel must implement; [`crate::RouterConfig`] describes what
/// this crate computes. The integer values are those of the newest vLLM; older versions numbered
/// `Custom`, `Simulated` and `Unspecified` differently, so the value is exposed by
/// [`RoutingMethodType::value`] for logging only and never serialised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoutingMethodType {
    /// Softmax over all experts, then top-k; weights are the un-renormalised probabilities.
    Default,
    /// Top-k on the logits, then softmax over the k selected logits.
    Renormalize,
    /// Sigmoid, correction bias for selection, grouped top-k (top-2 sum), renormalised, scaled.
    DeepSeekV3,
    /// Top-1 on the logits, weight = sigmoid of the selected logit.
    Llama4,
    /// Softmax (or sigmoid) over all experts, top-k, divided by the sum of the k weights.
    RenormalizeNaive,
    /// Top-k with no score function.
    TopK,
    /// Sigmoid, top-k, renormalised.
    SigmoidRenorm,
    /// Sigmoid with correction bias for selection, no groups, renormalised, scale 1.
    MiniMax2,
    /// Sigmoid, top-k, not renormalised.
    Sigmoid,
    /// Anything the other labels do not describe.
    Unspecified,
    /// `sqrt(softplus)` scoring with bias or hash routing.
    DeepseekV4,
    /// A model-supplied routing function.
    Custom,
    /// The routing simulator used for testing.
    Simulated,
}

impl RoutingMethodType {
    /// The newest vLLM integer value (for logs; never a wire format).
    pub fn value(self) -> u32 {
        match self {
            Self::Default => 0,
            Self::Renormalize => 1,
            Self::DeepSeekV3 => 2,
            Self::Llama4 => 3,
            Self::RenormalizeNaive => 4,
            Self::TopK => 5,
            Self::SigmoidRenorm => 6,
            Self::MiniMax2 => 7,
            Self::Sigmoid => 8,
            Self::Unspecified => 9,
            Self::DeepseekV4 => 100,
            Self::Custom => 101,
            Self::Simulated => 102,
        }
    }

    /// The label vLLM derives from a model's routing parameters (`get_routing_method_type`, newest).
    ///
    /// `num_expert_group` is `None` or `Some(0)` without groups. `routed_scaling_factor` is `None`
    /// when the model sets none. `top_k` is accepted for parity with vLLM's signature; the newest
    /// derivation no longer looks at it (older versions mapped sigmoid with `top_k == 1` to
    /// `Llama4`).
    pub fn derive(
        scoring: ScoringFunc,
        top_k: usize,
        renormalize: bool,
        num_expert_group: Option<usize>,
        has_correction_bias: bool,
        routed_scaling_factor: Option<f32>,
    ) -> Self {
        let _ = top_k;
        let grouped = num_expert_group.is_some_and(|g| g > 0);
        match scoring {
            ScoringFunc::SqrtSoftplus => {
                if renormalize {
                    Self::DeepseekV4
                } else {
                    Self::Unspecified
                }
            }
            ScoringFunc::Sigmoid if has_correction_bias => {
                if !renormalize {
                    Self::Unspecified
                } else if grouped {
                    Self::DeepSeekV3
                } else if routed_scaling_factor.is_none_or(|r| r == 1.0) {
                    Self::MiniMax2
                } else {
                    Self::Unspecified
                }
            }
            _ if has_correction_bias => Self::Unspecified,
            ScoringFunc::Sigmoid => {
                if renormalize {
                    Self::SigmoidRenorm
                } else {
                    Self::Sigmoid
                }
            }
            ScoringFunc::Softmax => {
                if renormalize {
                    Self::RenormalizeNaive
                } else {
                    Self::Default
                }
            }
        }
    }

    /// Whether a kernel that implements this label computes "renormalised softmax".
    ///
    /// `Renormalize` and `RenormalizeNaive` agree in exact arithmetic (they differ only in
    /// rounding), so kernels accepting one should accept both, as vLLM's do.
    pub fn is_renormalized_softmax(self) -> bool {
        matches!(self, Self::Renormalize | Self::RenormalizeNaive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_numbering() {
        assert_eq!(RoutingMethodType::Sigmoid.value(), 8);
        assert_eq!(RoutingMethodType::Unspecified.value(), 9);
        assert_eq!(RoutingMethodType::Custom.value(), 101);
        assert_eq!(RoutingMethodType::Simulated.value(), 102);
    }

    #[test]
    fn derivation_follows_spec() {
        use RoutingMethodType as R;
        use ScoringFunc as S;
        let d = R::derive;
        assert_eq!(d(S::SqrtSoftplus, 8, true, None, true, None), R::DeepseekV4);
        assert_eq!(
            d(S::SqrtSoftplus, 8, false, None, false, None),
            R::Unspecified
        );
        assert_eq!(d(S::Sigmoid, 8, false, Some(8), true, None), R::Unspecified);
        assert_eq!(
            d(S::Sigmoid, 8, true, Some(8), true, Some(2.5)),
            R::DeepSeekV3
        );
        assert_eq!(d(S::Sigmoid, 8, true, Some(0), true, None), R::MiniMax2);
        assert_eq!(d(S::Sigmoid, 8, true, None, true, Some(1.0)), R::MiniMax2);
        assert_eq!(
            d(S::Sigmoid, 8, true, None, true, Some(2.5)),
            R::Unspecified
        );
        assert_eq!(d(S::Softmax, 8, true, None, true, None), R::Unspecified);
        assert_eq!(d(S::Sigmoid, 1, true, None, false, None), R::SigmoidRenorm);
        assert_eq!(d(S::Sigmoid, 1, false, None, false, None), R::Sigmoid);
        assert_eq!(
            d(S::Softmax, 8, true, Some(8), false, None),
            R::RenormalizeNaive
        );
        assert_eq!(d(S::Softmax, 8, false, None, false, None), R::Default);
        assert!(R::Renormalize.is_renormalized_softmax());
        assert!(R::RenormalizeNaive.is_renormalized_softmax());
    }

    #[test]
    fn scoring_names_round_trip() {
        for s in [
            ScoringFunc::Softmax,
            ScoringFunc::Sigmoid,
            ScoringFunc::SqrtSoftplus,
        ] {
            assert_eq!(s.as_str().parse::<ScoringFunc>().unwrap(), s);
        }
        assert!(matches!(
            "relu".parse::<ScoringFunc>(),
            Err(RouterError::UnknownName { .. })
        ));
    }
}
