//! The one error type of moe-router: every way a configuration, a buffer or a logit row can be
//! rejected, with the argument named and the expected and actual values carried as fields.

use thiserror::Error;

/// Everything that can go wrong when building a [`crate::Router`] or routing a batch.
///
/// Configuration errors come from [`crate::Router::new`] and [`crate::ExpertMap::new`];
/// per-call errors (buffer sizes, non-finite logits, a failing custom hook) come from
/// [`crate::Router::route_into`]. Routing never panics on bad input.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum RouterError {
    /// The router needs at least one expert.
    #[error("num_experts must be at least 1")]
    NoExperts,

    /// `top_k` must lie in `1..=num_experts`.
    #[error("top_k = {top_k} is out of range 1..={num_experts} (num_experts)")]
    TopKOutOfRange {
        /// Requested number of experts per token.
        top_k: usize,
        /// Number of experts the router chooses from.
        num_experts: usize,
    },

    /// Expert ids are written as i32, so there can be at most `i32::MAX` experts.
    #[error("num_experts = {num_experts} exceeds the i32 id range")]
    TooManyExperts {
        /// Number of experts requested.
        num_experts: usize,
    },

    /// Grouped routing needs at least one group.
    #[error("num_expert_group must be at least 1")]
    NoGroups,

    /// Groups are contiguous and equal-sized, so `num_experts` must be a multiple of the group count.
    #[error("num_experts = {num_experts} is not divisible by num_expert_group = {num_groups}")]
    ExpertsNotDivisibleByGroups {
        /// Number of experts.
        num_experts: usize,
        /// Number of expert groups.
        num_groups: usize,
    },

    /// `topk_group` must lie in `1..=num_expert_group`.
    #[error("topk_group = {topk_group} is out of range 1..={num_groups} (num_expert_group)")]
    TopkGroupOutOfRange {
        /// Requested number of kept groups.
        topk_group: usize,
        /// Number of expert groups.
        num_groups: usize,
    },

    /// With a correction bias the group score is the sum of the two best experts of the group.
    #[error("a correction bias needs groups of at least 2 experts, got {group_size}")]
    GroupTooSmallForBias {
        /// Experts per group.
        group_size: usize,
    },

    /// `top_k` larger than the experts of the kept groups would select masked experts (spec §2.4).
    #[error("top_k = {top_k} exceeds the {kept_experts} experts of the topk_group kept groups")]
    TopKExceedsKeptExperts {
        /// Requested number of experts per token.
        top_k: usize,
        /// `topk_group * num_experts / num_expert_group`.
        kept_experts: usize,
    },

    /// The correction bias must hold one value per expert.
    #[error("e_score_correction_bias has {got} values, expected {expected} (num_experts)")]
    BiasLength {
        /// `num_experts`.
        expected: usize,
        /// Length of the bias given.
        got: usize,
    },

    /// Bias values must be finite numbers.
    #[error("e_score_correction_bias[{expert}] = {value} is not finite")]
    NonFiniteBias {
        /// Index of the offending value.
        expert: usize,
        /// The value.
        value: f32,
    },

    /// The routed scaling factor must be finite.
    #[error("routed_scaling_factor = {value} is not finite")]
    InvalidScalingFactor {
        /// The factor given.
        value: f32,
    },

    /// An option was set that the chosen routing algorithm does not use.
    #[error("routing algorithm {algorithm} does not support {option}")]
    UnsupportedOption {
        /// The algorithm (`"cpu_softmax"`, `"llama4"`, `"custom"`).
        algorithm: &'static str,
        /// The option (`"e_score_correction_bias"`, `"renormalize"`).
        option: &'static str,
    },

    /// The expert map covers a different number of global experts than the router.
    #[error("expert_map covers {map_experts} global experts, the router has {num_experts}")]
    ExpertMapMismatch {
        /// Global experts of the map.
        map_experts: usize,
        /// `num_experts` of the router.
        num_experts: usize,
    },

    /// Expert parallelism needs `ep_size >= 1` and `ep_rank < ep_size`.
    #[error("ep_rank = {ep_rank} is out of range for ep_size = {ep_size}")]
    EpRankOutOfRange {
        /// Rank of this process.
        ep_rank: usize,
        /// Number of expert-parallel ranks.
        ep_size: usize,
    },

    /// An unknown name was parsed (scoring function or expert placement strategy).
    #[error("unknown {what} {name:?}")]
    UnknownName {
        /// What was being parsed (`"scoring_func"`, `"expert_placement_strategy"`).
        what: &'static str,
        /// The string given.
        name: String,
    },

    /// The logits slice is not a whole number of rows of `num_experts`.
    #[error("logits has {len} values, not a multiple of num_experts = {num_experts}")]
    LogitsShape {
        /// Number of logits given.
        len: usize,
        /// `num_experts`.
        num_experts: usize,
    },

    /// An output buffer does not hold exactly `num_tokens * top_k` values.
    #[error("{buffer} holds {got} values, expected {expected} (num_tokens * top_k)")]
    BufferSize {
        /// `"weights_out"` or `"ids_out"`.
        buffer: &'static str,
        /// `num_tokens * top_k`.
        expected: usize,
        /// Length of the buffer given.
        got: usize,
    },

    /// The scratch is too small for this router (it was sized for a smaller configuration).
    #[error("scratch holds room for {got} {what}, this router needs {needed}")]
    ScratchTooSmall {
        /// What the scratch lacks room for (`"experts"`, `"top_k"`, `"groups"`, `"kept groups"`).
        what: &'static str,
        /// What this router needs.
        needed: usize,
        /// What the scratch holds.
        got: usize,
    },

    /// A logit is NaN or infinite. Rows before `row` have been written; the rest are untouched.
    #[error("logits[{row}, {expert}] = {value} is not finite")]
    NonFiniteLogit {
        /// Token row.
        row: usize,
        /// Expert column.
        expert: usize,
        /// The value (widened to f32).
        value: f32,
    },

    /// The custom routing hook reported a failure.
    #[error("custom routing failed on token row {row}: {reason}")]
    CustomRouting {
        /// Token row.
        row: usize,
        /// The hook's message.
        reason: String,
    },

    /// The custom routing hook returned an id outside `0..num_experts`.
    #[error(
        "custom routing returned expert id {id} on token row {row}; num_experts = {num_experts}"
    )]
    CustomIdOutOfRange {
        /// Token row.
        row: usize,
        /// The id returned.
        id: u32,
        /// `num_experts`.
        num_experts: usize,
    },

    /// The custom routing hook returned the same expert twice for one token.
    #[error("custom routing returned expert id {id} twice on token row {row}")]
    CustomDuplicateId {
        /// Token row.
        row: usize,
        /// The repeated id.
        id: u32,
    },
}
