//! The configuration the support checks read: vLLM's `FusedMoEParallelConfig` (with its `make`
//! flattening of TP across DP and PCP), the expert map of expert parallelism, and the subset of
//! `FusedMoEConfig` that matters to backend selection (spec sections 7.3 to 7.5).
//!
//! Constructors validate (sizes positive, ranks in range, `I` divisible by the TP size), so a
//! `MoeConfig` that exists always describes a real layer.

use std::fmt;

use moe_quant::DType;

use crate::activation::MoEActivation;
use crate::error::OracleError;
use crate::routing::RoutingMethodType;

/// The all-to-all backends whose kernels take the batched activation format
/// (`[E, max_tokens, H]`): DeepEP low-latency and NIXL EP.
pub const BATCHED_ALL2ALL_BACKENDS: [&str; 2] = ["deepep_low_latency", "nixl_ep"];

/// vLLM's default all-to-all backend name.
pub const DEFAULT_ALL2ALL_BACKEND: &str = "allgather_reducescatter";

/// The user-facing parallel settings and this rank's position, before flattening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelRequest {
    /// Tensor-parallel size and rank.
    pub tp: (usize, usize),
    /// Prefill-context-parallel size and rank.
    pub pcp: (usize, usize),
    /// Data-parallel size and rank.
    pub dp: (usize, usize),
    /// Sequence-parallel size.
    pub sp_size: usize,
    /// `--enable-expert-parallel`.
    pub enable_expert_parallel: bool,
    /// All-to-all backend name.
    pub all2all_backend: String,
    /// Expert-parallel load balancing.
    pub enable_eplb: bool,
}

impl ParallelRequest {
    /// TP of `tp` ranks at rank `rank`, nothing else parallel.
    pub fn tp(tp: usize, rank: usize) -> Self {
        Self {
            tp: (tp, rank),
            pcp: (1, 0),
            dp: (1, 0),
            sp_size: 1,
            enable_expert_parallel: false,
            all2all_backend: DEFAULT_ALL2ALL_BACKEND.to_string(),
            enable_eplb: false,
        }
    }

    /// The same request with expert parallelism switched on.
    pub fn with_ep(mut self) -> Self {
        self.enable_expert_parallel = true;
        self
    }

    /// The same request with `dp` data-parallel ranks at rank `rank`.
    pub fn with_dp(mut self, dp: usize, rank: usize) -> Self {
        self.dp = (dp, rank);
        self
    }

    /// The same request with another all-to-all backend.
    pub fn with_all2all(mut self, backend: &str) -> Self {
        self.all2all_backend = backend.to_string();
        self
    }
}

/// vLLM's `FusedMoEParallelConfig`: the flattened parallel layout one MoE layer sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelConfig {
    /// TP size after flattening (1 under EP).
    pub tp_size: usize,
    /// TP rank after flattening.
    pub tp_rank: usize,
    /// Prefill-context-parallel size.
    pub pcp_size: usize,
    /// Prefill-context-parallel rank.
    pub pcp_rank: usize,
    /// Data-parallel size.
    pub dp_size: usize,
    /// Data-parallel rank.
    pub dp_rank: usize,
    /// Expert-parallel size (1 without EP).
    pub ep_size: usize,
    /// Expert-parallel rank.
    pub ep_rank: usize,
    /// Sequence-parallel size.
    pub sp_size: usize,
    /// Whether experts are partitioned across ranks.
    pub use_ep: bool,
    /// All-to-all backend name.
    pub all2all_backend: String,
    /// Expert-parallel load balancing.
    pub enable_eplb: bool,
}

fn check_rank(field: &'static str, size: usize, rank: usize) -> Result<(), OracleError> {
    if size == 0 {
        return Err(OracleError::InvalidConfig {
            field,
            reason: "size must be at least 1".to_string(),
        });
    }
    if rank >= size {
        return Err(OracleError::InvalidConfig {
            field,
            reason: format!("rank {rank} is not below size {size}"),
        });
    }
    Ok(())
}

impl ParallelConfig {
    /// vLLM's `make_no_parallel()`: one rank, default all-to-all backend.
    pub fn no_parallel() -> Self {
        Self {
            tp_size: 1,
            tp_rank: 0,
            pcp_size: 1,
            pcp_rank: 0,
            dp_size: 1,
            dp_rank: 0,
            ep_size: 1,
            ep_rank: 0,
            sp_size: 1,
            use_ep: false,
            all2all_backend: DEFAULT_ALL2ALL_BACKEND.to_string(),
            enable_eplb: false,
        }
    }

    /// vLLM's `make`: flatten TP across DP and PCP (`tp' = dp·pcp·tp`), then, when EP is
    /// enabled and `tp' > 1`, give each rank whole experts (`ep = tp'`, `tp = 1`).
    pub fn make(req: &ParallelRequest) -> Result<Self, OracleError> {
        let (tp, tp_rank) = req.tp;
        let (pcp, pcp_rank) = req.pcp;
        let (dp, dp_rank) = req.dp;
        check_rank("tp", tp, tp_rank)?;
        check_rank("pcp", pcp, pcp_rank)?;
        check_rank("dp", dp, dp_rank)?;
        check_rank("sp", req.sp_size, 0)?;
        let overflow = || OracleError::InvalidConfig {
            field: "tp",
            reason: "dp·pcp·tp overflows".to_string(),
        };
        let flat_tp = dp
            .checked_mul(pcp)
            .and_then(|x| x.checked_mul(tp))
            .ok_or_else(overflow)?;
        let flat_rank = dp_rank * pcp * tp + pcp_rank * tp + tp_rank;
        let use_ep = flat_tp > 1 && req.enable_expert_parallel;
        let (tp_size, tp_rank, ep_size, ep_rank) = if use_ep {
            (1, 0, flat_tp, flat_rank)
        } else {
            (flat_tp, flat_rank, 1, 0)
        };
        Ok(Self {
            tp_size,
            tp_rank,
            pcp_size: pcp,
            pcp_rank,
            dp_size: dp,
            dp_rank,
            ep_size,
            ep_rank,
            sp_size: req.sp_size,
            use_ep,
            all2all_backend: req.all2all_backend.clone(),
            enable_eplb: req.enable_eplb,
        })
    }

    /// `dp_size > 1 && use_ep`.
    pub fn use_all2all_kernels(&self) -> bool {
        self.dp_size > 1 && self.use_ep
    }

    /// Whether the all-to-all kernels in use exchange the batched `[E, max_tokens, H]` format.
    pub fn use_batched_activation_format(&self) -> bool {
        self.use_all2all_kernels()
            && BATCHED_ALL2ALL_BACKENDS.contains(&self.all2all_backend.as_str())
    }

    /// `sp_size > 1`.
    pub fn is_sequence_parallel(&self) -> bool {
        self.sp_size > 1
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

impl fmt::Display for ParallelConfig {
    /// The Python dataclass repr vLLM prints in `parallel config {pcfg}` (fields in the spec's
    /// order).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FusedMoEParallelConfig(tp_size={}, tp_rank={}, pcp_size={}, pcp_rank={}, \
             dp_size={}, dp_rank={}, ep_size={}, ep_rank={}, sp_size={}, use_ep={}, \
             all2all_backend='{}', enable_eplb={})",
            self.tp_size,
            self.tp_rank,
            self.pcp_size,
            self.pcp_rank,
            self.dp_size,
            self.dp_rank,
            self.ep_size,
            self.ep_rank,
            self.sp_size,
            py_bool(self.use_ep),
            self.all2all_backend,
            py_bool(self.enable_eplb)
        )
    }
}

/// How global experts are dealt out to EP ranks (`expert_placement_strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpertPlacement {
    /// Rank `r` owns a contiguous block.
    Linear,
    /// Rank `r` owns `r, r + ep, r + 2·ep, …`.
    RoundRobin,
}

/// vLLM's `determine_expert_map`: the number of local experts and, under EP, the map from
/// global expert id to local id (−1 for experts owned by other ranks).
pub fn determine_expert_map(
    ep_size: usize,
    ep_rank: usize,
    global_num_experts: usize,
    placement: ExpertPlacement,
) -> Result<(usize, Option<Vec<i32>>), OracleError> {
    check_rank("ep", ep_size, ep_rank)?;
    if ep_size == 1 {
        return Ok((global_num_experts, None));
    }
    if i32::try_from(global_num_experts).is_err() {
        return Err(OracleError::InvalidConfig {
            field: "num_experts",
            reason: format!("{global_num_experts} experts do not fit the i32 expert map"),
        });
    }
    let base = global_num_experts / ep_size;
    let rem = global_num_experts % ep_size;
    let local = base + usize::from(ep_rank < rem);
    let mut map = vec![-1i32; global_num_experts];
    for (local_id, slot) in (0..local).enumerate() {
        let global = match placement {
            ExpertPlacement::Linear => ep_rank * base + ep_rank.min(rem) + slot,
            ExpertPlacement::RoundRobin => ep_rank + slot * ep_size,
        };
        // Both strategies stay below E by construction; the guard keeps bad math from panicking.
        if let Some(m) = map.get_mut(global) {
            *m = local_id as i32;
        }
    }
    Ok((local, Some(map)))
}

/// The sizes of one MoE layer, before TP partitioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// Global number of experts `E`.
    pub num_experts: usize,
    /// Experts per token `K` (top-k).
    pub experts_per_token: usize,
    /// Hidden size `H`.
    pub hidden_dim: usize,
    /// Full intermediate size (before division by the TP size).
    pub intermediate_size: usize,
}

/// The subset of vLLM's `FusedMoEConfig` that backend selection reads.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    shape: MoeShape,
    intermediate_size_per_partition: usize,
    num_local_experts: usize,
    expert_map: Option<Vec<i32>>,
    /// Expert activation.
    pub activation: MoEActivation,
    /// Routing method.
    pub routing_method: RoutingMethodType,
    /// Whether a validated moe-router configuration computes the routing (the layer's own
    /// router) rather than the kernel. vLLM labels some routings it computes elsewhere
    /// `Unspecified` (softmax scores with a correction bias, ERNIE-4.5's); our kernels then
    /// take any label, since moe-router computes what the configuration says. vLLM's
    /// kernels read the label alone.
    pub routing_by_moe_router: bool,
    parallel: ParallelConfig,
    /// Activation (input and output) dtype.
    pub in_dtype: DType,
    /// Router logits dtype; `None` means "same as `in_dtype`", vLLM's default.
    pub router_logits_dtype: Option<DType>,
    /// `"auto"` or a user-requested backend name.
    pub moe_backend: String,
    /// Whether the experts carry biases.
    pub has_bias: bool,
    /// Whether LoRA adapters apply to the experts.
    pub is_lora_enabled: bool,
    /// SwiGLU clamp limit, if the model configures one.
    pub swiglu_limit: Option<f32>,
}

impl MoeConfig {
    /// A validated configuration with `moe_backend = "auto"`, no biases, no LoRA, linear expert
    /// placement. Rejects zero sizes, `K > E`, `I` not divisible by the TP size, and more EP
    /// ranks than experts.
    pub fn new(
        shape: MoeShape,
        activation: MoEActivation,
        routing_method: RoutingMethodType,
        in_dtype: DType,
        parallel: ParallelConfig,
    ) -> Result<Self, OracleError> {
        Self::with_placement(
            shape,
            activation,
            routing_method,
            in_dtype,
            parallel,
            ExpertPlacement::Linear,
        )
    }

    /// As [`Self::new`] with an explicit expert placement strategy.
    pub fn with_placement(
        shape: MoeShape,
        activation: MoEActivation,
        routing_method: RoutingMethodType,
        in_dtype: DType,
        parallel: ParallelConfig,
        placement: ExpertPlacement,
    ) -> Result<Self, OracleError> {
        let positive = |field: &'static str, v: usize| {
            if v == 0 {
                Err(OracleError::InvalidConfig {
                    field,
                    reason: "must be positive".to_string(),
                })
            } else {
                Ok(())
            }
        };
        positive("num_experts", shape.num_experts)?;
        positive("experts_per_token", shape.experts_per_token)?;
        positive("hidden_dim", shape.hidden_dim)?;
        positive("intermediate_size", shape.intermediate_size)?;
        if shape.experts_per_token > shape.num_experts {
            return Err(OracleError::InvalidConfig {
                field: "experts_per_token",
                reason: format!(
                    "top-k {} exceeds the {} experts",
                    shape.experts_per_token, shape.num_experts
                ),
            });
        }
        check_rank("tp", parallel.tp_size, parallel.tp_rank)?;
        if !shape.intermediate_size.is_multiple_of(parallel.tp_size) {
            return Err(OracleError::InvalidConfig {
                field: "intermediate_size",
                reason: format!(
                    "{} is not divisible by tp_size {}",
                    shape.intermediate_size, parallel.tp_size
                ),
            });
        }
        if parallel.ep_size > shape.num_experts {
            return Err(OracleError::InvalidConfig {
                field: "ep_size",
                reason: format!(
                    "{} EP ranks for {} experts leaves ranks without experts",
                    parallel.ep_size, shape.num_experts
                ),
            });
        }
        let (num_local_experts, expert_map) = determine_expert_map(
            parallel.ep_size,
            parallel.ep_rank,
            shape.num_experts,
            placement,
        )?;
        Ok(Self {
            shape,
            intermediate_size_per_partition: shape.intermediate_size / parallel.tp_size,
            num_local_experts,
            expert_map,
            activation,
            routing_method,
            routing_by_moe_router: false,
            parallel,
            in_dtype,
            router_logits_dtype: None,
            moe_backend: "auto".to_string(),
            has_bias: false,
            is_lora_enabled: false,
            swiglu_limit: None,
        })
    }

    /// The same configuration with its routing computed by a validated moe-router
    /// configuration (see [`Self::routing_by_moe_router`]).
    pub fn with_routing_by_moe_router(mut self) -> Self {
        self.routing_by_moe_router = true;
        self
    }

    /// The same configuration with a user-requested backend name.
    pub fn with_backend(mut self, name: &str) -> Self {
        self.moe_backend = name.to_string();
        self
    }

    /// Global number of experts.
    pub fn num_experts(&self) -> usize {
        self.shape.num_experts
    }

    /// Top-k.
    pub fn experts_per_token(&self) -> usize {
        self.shape.experts_per_token
    }

    /// Hidden size `H`.
    pub fn hidden_dim(&self) -> usize {
        self.shape.hidden_dim
    }

    /// Full intermediate size.
    pub fn intermediate_size(&self) -> usize {
        self.shape.intermediate_size
    }

    /// `I` of this TP partition.
    pub fn intermediate_size_per_partition(&self) -> usize {
        self.intermediate_size_per_partition
    }

    /// Experts held on this rank.
    pub fn num_local_experts(&self) -> usize {
        self.num_local_experts
    }

    /// The EP expert map (global id → local id or −1), `None` without EP.
    pub fn expert_map(&self) -> Option<&[i32]> {
        self.expert_map.as_deref()
    }

    /// The parallel layout.
    pub fn parallel(&self) -> &ParallelConfig {
        &self.parallel
    }

    /// `activation.is_gated`.
    pub fn is_act_and_mul(&self) -> bool {
        self.activation.is_gated()
    }

    /// Router logits dtype with vLLM's default applied.
    pub fn effective_router_logits_dtype(&self) -> DType {
        self.router_logits_dtype.unwrap_or(self.in_dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn make_flattens_tp_across_dp() {
        let p = ParallelConfig::make(&ParallelRequest::tp(2, 1).with_dp(2, 1)).unwrap();
        assert_eq!(
            (p.tp_size, p.tp_rank, p.ep_size, p.use_ep),
            (4, 3, 1, false)
        );
        let p = ParallelConfig::make(&ParallelRequest::tp(2, 1).with_dp(2, 1).with_ep()).unwrap();
        assert_eq!((p.tp_size, p.tp_rank, p.ep_size, p.ep_rank), (1, 0, 4, 3));
        assert!(p.use_all2all_kernels());
        assert!(!p.use_batched_activation_format());
        let p = ParallelConfig::make(&ParallelRequest::tp(1, 0).with_ep()).unwrap();
        assert!(!p.use_ep, "EP needs more than one rank");
        assert!(ParallelConfig::make(&ParallelRequest::tp(2, 2)).is_err());
        assert_eq!(
            ParallelConfig::no_parallel().to_string(),
            "FusedMoEParallelConfig(tp_size=1, tp_rank=0, pcp_size=1, pcp_rank=0, dp_size=1, \
             dp_rank=0, ep_size=1, ep_rank=0, sp_size=1, use_ep=False, \
             all2all_backend='allgather_reducescatter', enable_eplb=False)"
        );
    }

    #[test]
    fn expert_maps() {
        let (n, map) = determine_expert_map(3, 1, 8, ExpertPlacement::Linear).unwrap();
        assert_eq!(n, 3);
        assert_eq!(map.unwrap(), vec![-1, -1, -1, 0, 1, 2, -1, -1]);
        let (n, map) = determine_expert_map(3, 2, 8, ExpertPlacement::Linear).unwrap();
        assert_eq!(n, 2);
        assert_eq!(map.unwrap(), vec![-1, -1, -1, -1, -1, -1, 0, 1]);
        let (n, map) = determine_expert_map(3, 0, 8, ExpertPlacement::RoundRobin).unwrap();
        assert_eq!(n, 3);
        assert_eq!(map.unwrap(), vec![0, -1, -1, 1, -1, -1, 2, -1]);
        assert_eq!(
            determine_expert_map(1, 0, 8, ExpertPlacement::Linear).unwrap(),
            (8, None)
        );
    }

    #[test]
    fn config_validation() {
        let shape = MoeShape {
            num_experts: 8,
            experts_per_token: 2,
            hidden_dim: 512,
            intermediate_size: 256,
        };
        let p = ParallelConfig::make(&ParallelRequest::tp(3, 0)).unwrap();
        let err = MoeConfig::new(
            shape,
            MoEActivation::Silu,
            RoutingMethodType::Default,
            DType::BF16,
            p,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            OracleError::InvalidConfig {
                field: "intermediate_size",
                ..
            }
        ));
        let bad_k = MoeShape {
            experts_per_token: 9,
            ..shape
        };
        assert!(
            MoeConfig::new(
                bad_k,
                MoEActivation::Silu,
                RoutingMethodType::Default,
                DType::BF16,
                ParallelConfig::no_parallel()
            )
            .is_err()
        );
        let c = MoeConfig::new(
            shape,
            MoEActivation::Silu,
            RoutingMethodType::Default,
            DType::BF16,
            ParallelConfig::make(&ParallelRequest::tp(2, 1)).unwrap(),
        )
        .unwrap();
        assert_eq!(c.intermediate_size_per_partition(), 128);
        assert_eq!(c.effective_router_logits_dtype(), DType::BF16);
    }
}
