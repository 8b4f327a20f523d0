//! The routing labels the support checks read. The vocabulary itself ([`RoutingMethodType`],
//! [`ScoringFunc`] and the derivation `RoutingMethodType::derive`) lives in moe-router; this
//! module only adds the acceptance sets the kernels are checked against.

pub use moe_router::{RoutingMethodType, ScoringFunc};

/// The methods moe-router implements, which our monolithic kernels therefore accept by label
/// alone. When the caller's own moe-router configuration computes the routing, they accept any
/// label (vLLM leaves some of what moe-router computes `Unspecified`).
pub const MOE_ROUTER_METHODS: [RoutingMethodType; 10] = [
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
pub const VLLM_CPU_METHODS: [RoutingMethodType; 3] = [
    RoutingMethodType::Default,
    RoutingMethodType::Renormalize,
    RoutingMethodType::RenormalizeNaive,
];
