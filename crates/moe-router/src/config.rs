//! What a router computes: the algorithm (spec §2.2–2.6), its options, and their validation.
//!
//! A [`RouterConfig`] is built with one constructor per algorithm and `with_*` methods for the
//! options; [`crate::Router::new`] validates it once, so routing calls only check buffers.

use std::sync::Arc;

use crate::RouterError;
use crate::custom::CustomRouting;
use crate::expert_map::ExpertMap;
use crate::method::{RoutingMethodType, ScoringFunc};
use crate::precision::RoundingProfile;

/// The routing algorithm.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Algorithm {
    /// vLLM's CPU path (`cpu_router._softmax_topk`, spec §2.2): top-k on the raw logits, then
    /// softmax over the k chosen logits (renormalised) or `exp(v - logsumexp(all logits))`.
    /// Ignores correction bias; vLLM also ignores the routed scaling factor here.
    CpuSoftmax,
    /// Score every expert, select the top-k of the scores (plus the correction bias when set),
    /// weight by the unbiased scores (`fused_topk`, `fused_topk_bias`, `biased_topk_cpu`, §2.3).
    ScoredTopK {
        /// How logits become scores.
        scoring: ScoringFunc,
    },
    /// DeepSeek-V2/V3 grouped top-k (§2.4): keep the best `topk_group` groups, then top-k inside.
    GroupedTopK {
        /// How logits become scores.
        scoring: ScoringFunc,
        /// The group layout.
        grouping: Grouping,
    },
    /// Llama4 (§2.6): top-k (k = 1 in Llama4) on the raw logits, weight = sigmoid(logit).
    Llama4,
    /// A model-supplied routing function.
    Custom(Arc<dyn CustomRouting>),
    /// PhiMoE's sparse mixer (vLLM's `phimoe_routing_function`): two experts chosen in turn,
    /// each weighted by a softmax over the logits within a relative `2·jitter_eps` of it, not
    /// renormalized. vLLM passes it as a custom routing function, labelled `Custom`.
    SparseMixer {
        /// `ε` (`router_jitter_noise`); 0 keeps only ties.
        jitter_eps: f32,
    },
}

impl Algorithm {
    /// A short name for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::CpuSoftmax => "cpu_softmax",
            Self::ScoredTopK { .. } => "scored_topk",
            Self::GroupedTopK { .. } => "grouped_topk",
            Self::Llama4 => "llama4",
            Self::Custom(_) => "custom",
            Self::SparseMixer { .. } => "sparse_mixer",
        }
    }
}

/// Contiguous, equal-sized expert groups: group `g` holds experts `[g E/G, (g+1) E/G)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grouping {
    /// Number of groups `G` (`num_expert_group`).
    pub num_groups: usize,
    /// Groups kept per token `Gk` (`topk_group`).
    pub topk_group: usize,
}

impl Grouping {
    /// `num_groups` groups of which the best `topk_group` are kept per token.
    pub fn new(num_groups: usize, topk_group: usize) -> Self {
        Self {
            num_groups,
            topk_group,
        }
    }
}

/// Where the routed scaling factor is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ScalingPlacement {
    /// Multiply the final weights (after renormalisation), as vLLM's grouped and biased top-k do.
    #[default]
    OnWeights,
    /// Leave the weights unscaled: the caller multiplies the MoE output by
    /// [`crate::Router::output_scale`], as some model files do. Equal to `OnWeights` only up to
    /// rounding.
    OnOutput,
}

/// The routed scaling factor and where it goes (spec §2.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutedScaling {
    /// The factor `r` (`routed_scaling_factor`); 1 means no scaling.
    pub factor: f32,
    /// Where `r` is applied.
    pub placement: ScalingPlacement,
}

impl RoutedScaling {
    /// No scaling (factor 1).
    pub const NONE: Self = Self {
        factor: 1.0,
        placement: ScalingPlacement::OnWeights,
    };
}

/// A routing configuration; validated by [`crate::Router::new`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RouterConfig {
    /// Number of global experts `E` (the logits row length).
    pub num_experts: usize,
    /// Experts per token `k`.
    pub top_k: usize,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Renormalise the k weights to sum to 1 (for `CpuSoftmax`: softmax over the chosen logits).
    pub renormalize: bool,
    /// `e_score_correction_bias`, one value per expert, used for selection only.
    pub correction_bias: Option<Arc<[f32]>>,
    /// The routed scaling factor and its placement.
    pub routed_scaling: RoutedScaling,
    /// How 16-bit logits are rounded along the way; see [`RoundingProfile`].
    pub rounding: RoundingProfile,
    /// When set, ids are written as this rank's local ids, [`ExpertMap::NOT_LOCAL`] for experts
    /// of other ranks; otherwise as global ids.
    pub expert_map: Option<ExpertMap>,
}

impl RouterConfig {
    fn with_algorithm(num_experts: usize, top_k: usize, algorithm: Algorithm) -> Self {
        Self {
            num_experts,
            top_k,
            algorithm,
            renormalize: false,
            correction_bias: None,
            routed_scaling: RoutedScaling::NONE,
            rounding: RoundingProfile::F32,
            expert_map: None,
        }
    }

    /// vLLM's CPU softmax top-k (§2.2). Pair with [`RoundingProfile::TorchEager`] for bit parity
    /// on bf16 logits.
    pub fn cpu_softmax(num_experts: usize, top_k: usize) -> Self {
        Self::with_algorithm(num_experts, top_k, Algorithm::CpuSoftmax)
    }

    /// Score, optionally bias, select, weight (§2.2 generic path, §2.3).
    pub fn scored_topk(num_experts: usize, top_k: usize, scoring: ScoringFunc) -> Self {
        Self::with_algorithm(num_experts, top_k, Algorithm::ScoredTopK { scoring })
    }

    /// Grouped top-k (§2.4).
    pub fn grouped_topk(
        num_experts: usize,
        top_k: usize,
        scoring: ScoringFunc,
        grouping: Grouping,
    ) -> Self {
        Self::with_algorithm(
            num_experts,
            top_k,
            Algorithm::GroupedTopK { scoring, grouping },
        )
    }

    /// Llama4 top-k sigmoid routing (§2.6); Llama4 itself uses `top_k = 1` and applies the weight
    /// to the token before the expert ([`crate::Router::apply_router_weight_on_input`]).
    pub fn llama4(num_experts: usize, top_k: usize) -> Self {
        Self::with_algorithm(num_experts, top_k, Algorithm::Llama4)
    }

    /// A model-supplied routing function.
    pub fn custom(num_experts: usize, top_k: usize, hook: Arc<dyn CustomRouting>) -> Self {
        Self::with_algorithm(num_experts, top_k, Algorithm::Custom(hook))
    }

    /// PhiMoE's sparse mixer with jitter `jitter_eps` (top-2, never renormalized).
    pub fn sparse_mixer(num_experts: usize, jitter_eps: f32) -> Self {
        Self::with_algorithm(num_experts, 2, Algorithm::SparseMixer { jitter_eps })
    }

    /// Sets renormalisation.
    pub fn with_renormalize(mut self, renormalize: bool) -> Self {
        self.renormalize = renormalize;
        self
    }

    /// Sets the correction bias (one value per expert; selection only).
    pub fn with_correction_bias(mut self, bias: impl Into<Arc<[f32]>>) -> Self {
        self.correction_bias = Some(bias.into());
        self
    }

    /// Sets the routed scaling factor and where it is applied.
    pub fn with_routed_scaling(mut self, factor: f32, placement: ScalingPlacement) -> Self {
        self.routed_scaling = RoutedScaling { factor, placement };
        self
    }

    /// Sets the rounding profile.
    pub fn with_rounding(mut self, rounding: RoundingProfile) -> Self {
        self.rounding = rounding;
        self
    }

    /// Sets the expert map: ids are then written as local ids.
    pub fn with_expert_map(mut self, map: ExpertMap) -> Self {
        self.expert_map = Some(map);
        self
    }

    /// The grouping, for grouped top-k.
    pub fn grouping(&self) -> Option<Grouping> {
        match self.algorithm {
            Algorithm::GroupedTopK { grouping, .. } => Some(grouping),
            _ => None,
        }
    }

    /// The scoring function, for the algorithms that have one (Llama4 counts as sigmoid).
    pub fn scoring(&self) -> Option<ScoringFunc> {
        match self.algorithm {
            Algorithm::CpuSoftmax => Some(ScoringFunc::Softmax),
            Algorithm::ScoredTopK { scoring } | Algorithm::GroupedTopK { scoring, .. } => {
                Some(scoring)
            }
            Algorithm::Llama4 => Some(ScoringFunc::Sigmoid),
            Algorithm::Custom(_) | Algorithm::SparseMixer { .. } => None,
        }
    }

    /// The label vLLM would give this configuration (§2.1 derivation; `Llama4` and `Custom` are
    /// set by the model rather than derived).
    pub fn routing_method_type(&self) -> RoutingMethodType {
        match &self.algorithm {
            Algorithm::Llama4 => RoutingMethodType::Llama4,
            Algorithm::Custom(_) | Algorithm::SparseMixer { .. } => RoutingMethodType::Custom,
            _ => RoutingMethodType::derive(
                self.scoring().unwrap_or(ScoringFunc::Softmax),
                self.top_k,
                self.renormalize,
                self.grouping().map(|g| g.num_groups),
                self.correction_bias.is_some(),
                Some(self.routed_scaling.factor),
            ),
        }
    }

    /// Checks every invariant routing relies on.
    pub(crate) fn validate(&self) -> Result<(), RouterError> {
        let e = self.num_experts;
        if e == 0 {
            return Err(RouterError::NoExperts);
        }
        if self.top_k == 0 || self.top_k > e {
            return Err(RouterError::TopKOutOfRange {
                top_k: self.top_k,
                num_experts: e,
            });
        }
        // Ids are written as i32.
        if e > i32::MAX as usize {
            return Err(RouterError::TooManyExperts { num_experts: e });
        }
        let unsupported = |option| RouterError::UnsupportedOption {
            algorithm: self.algorithm.name(),
            option,
        };
        match &self.algorithm {
            Algorithm::CpuSoftmax
            | Algorithm::Llama4
            | Algorithm::Custom(_)
            | Algorithm::SparseMixer { .. }
                if self.correction_bias.is_some() =>
            {
                return Err(unsupported("e_score_correction_bias"));
            }
            Algorithm::Llama4 | Algorithm::Custom(_) | Algorithm::SparseMixer { .. }
                if self.renormalize =>
            {
                return Err(unsupported("renormalize"));
            }
            Algorithm::SparseMixer { .. } if self.top_k != 2 => {
                return Err(unsupported("top_k other than 2"));
            }
            Algorithm::SparseMixer { jitter_eps }
                if !(jitter_eps.is_finite() && *jitter_eps >= 0.0) =>
            {
                return Err(unsupported("a negative or non-finite jitter_eps"));
            }
            _ => {}
        }
        if let Some(bias) = &self.correction_bias {
            if bias.len() != e {
                return Err(RouterError::BiasLength {
                    expected: e,
                    got: bias.len(),
                });
            }
            if let Some((expert, &value)) = bias.iter().enumerate().find(|(_, b)| !b.is_finite()) {
                return Err(RouterError::NonFiniteBias { expert, value });
            }
        }
        if let Some(grouping) = self.grouping() {
            let g = grouping.num_groups;
            if g == 0 {
                return Err(RouterError::NoGroups);
            }
            if !e.is_multiple_of(g) {
                return Err(RouterError::ExpertsNotDivisibleByGroups {
                    num_experts: e,
                    num_groups: g,
                });
            }
            if grouping.topk_group == 0 || grouping.topk_group > g {
                return Err(RouterError::TopkGroupOutOfRange {
                    topk_group: grouping.topk_group,
                    num_groups: g,
                });
            }
            let group_size = e / g;
            if self.correction_bias.is_some() && group_size < 2 {
                return Err(RouterError::GroupTooSmallForBias { group_size });
            }
            let kept_experts = grouping.topk_group * group_size;
            if self.top_k > kept_experts {
                return Err(RouterError::TopKExceedsKeptExperts {
                    top_k: self.top_k,
                    kept_experts,
                });
            }
        }
        if !self.routed_scaling.factor.is_finite() {
            return Err(RouterError::InvalidScalingFactor {
                value: self.routed_scaling.factor,
            });
        }
        if let Some(map) = &self.expert_map
            && map.num_global_experts() != e
        {
            return Err(RouterError::ExpertMapMismatch {
                map_experts: map.num_global_experts(),
                num_experts: e,
            });
        }
        Ok(())
    }
}
