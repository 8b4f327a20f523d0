//! The fused pipeline's working memory, sized once from the layer shape and the largest call,
//! so that [`FusedMoe::apply`](super::FusedMoe::apply) allocates nothing.
//!
//! A call larger than the scratch was sized for is refused with
//! [`KernelError::ScratchTooSmall`]; the scratch never grows behind the caller's back. One
//! scratch serves one call at a time (`&mut`); concurrent callers of the same `FusedMoe` each
//! bring their own.

use std::time::Duration;

use crate::gemm::TokenParams;
use crate::{GemmScratch, KernelError};

/// Time spent in each stage of [`FusedMoe::apply`](super::FusedMoe::apply) calls, summed over
/// the calls since recording started and over the lanes that ran at once (so with several
/// lanes the stages add up to more than the wall time: read them as shares). The gate/up and
/// down stages include their GEMMs' activation quantisation and any threads a GEMM splits its
/// channels over.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct StageTimes {
    /// Bucketing the (token, slot) pairs by expert.
    pub route: Duration,
    /// Gathering (and, with the router weight on the input, scaling) the input rows; for the
    /// formats that quantise per token, quantising each token once instead (the gate/up GEMMs
    /// then gather the codes).
    pub gather: Duration,
    /// The gate/up GEMMs and their bias and rounding.
    pub gate_up: Duration,
    /// The activation.
    pub activation: Duration,
    /// The down GEMMs, their bias and rounding, and the router weight.
    pub down: Duration,
    /// Summing each token's expert outputs.
    pub reduce: Duration,
    /// Calls recorded.
    pub calls: u64,
}

impl std::ops::AddAssign for StageTimes {
    fn add_assign(&mut self, o: Self) {
        self.route += o.route;
        self.gather += o.gather;
        self.gate_up += o.gate_up;
        self.activation += o.activation;
        self.down += o.down;
        self.reduce += o.reduce;
        self.calls += o.calls;
    }
}

/// The sizes a [`MoeScratch`] is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoeScratchDims {
    /// Largest token count T of a call.
    pub max_tokens: usize,
    /// Largest top-k of a call (calls may trade T for k: the limit is `T·k`).
    pub top_k: usize,
    /// Hidden size H of the layer.
    pub hidden_size: usize,
    /// Intermediate size I of the layer (per expert, per partition).
    pub intermediate_size: usize,
    /// Local expert count E of the layer.
    pub num_experts: usize,
    /// How many expert groups may run at once (one GEMM scratch each); 1 runs experts one
    /// after another (each GEMM may still split its output channels over threads).
    pub lanes: usize,
}

/// Index marking a (token, slot) pair routed to no local expert.
pub(crate) const NOT_LOCAL: usize = usize::MAX;

/// Preallocated buffers of the fused pipeline; see the module docs.
#[derive(Debug, Clone)]
pub struct MoeScratch {
    pub(crate) dims: MoeScratchDims,
    /// Largest number of (token, slot) pairs, `max_tokens·top_k`.
    pub(crate) max_pairs: usize,
    /// Bucket starts per expert, `[E + 1]`.
    pub(crate) offsets: Vec<usize>,
    /// Per-expert counts, then fill cursors, `[E]`.
    pub(crate) cursor: Vec<usize>,
    /// Token of each bucketed row, `[pairs]`.
    pub(crate) tok: Vec<usize>,
    /// Router weight of each bucketed row, `[pairs]`.
    pub(crate) gate: Vec<f32>,
    /// Per token, the bucketed rows of its slots in ascending order ([`NOT_LOCAL`] last),
    /// `[T, k]`.
    pub(crate) order: Vec<usize>,
    /// Expert boundaries of the lanes, `[lanes + 1]`.
    pub(crate) lane_bounds: Vec<usize>,
    /// Gathered input rows, overwritten in place by the expert outputs, `[pairs, H]`.
    pub(crate) expert_rows: Vec<f32>,
    /// Gate/up projections, `[pairs, 2I]`.
    pub(crate) gate_up: Vec<f32>,
    /// Activation outputs, `[pairs, I]`.
    pub(crate) activated: Vec<f32>,
    /// Each token's activation codes, quantised once per call for formats whose GEMMs
    /// quantise per token, `[T, H]`.
    pub(crate) token_codes: Vec<i8>,
    /// Each token's quantisation parameters, `[T]`.
    pub(crate) token_params: Vec<TokenParams>,
    /// One GEMM scratch per lane.
    pub(crate) gemm: Vec<GemmScratch>,
    /// Per lane (and one for the stages outside the lanes), the stage times recorded, when
    /// recording is on.
    pub(crate) times: Option<Vec<StageTimes>>,
}

impl MoeScratch {
    /// Allocates every buffer for calls up to `dims`.
    ///
    /// Memory: about `max_tokens·top_k·(3H + 3I)·4` bytes plus `lanes·max_tokens·top_k·2·max(H, I)`
    /// bytes of quantised rows and `max_tokens·H` bytes of per-token codes; split very large
    /// batches into several calls instead.
    pub fn new(dims: MoeScratchDims) -> Result<Self, KernelError> {
        let overflow = |dim| KernelError::UnsupportedDim {
            dim,
            got: dims.max_tokens,
            reason: "scratch size overflows usize",
        };
        if dims.lanes == 0 {
            return Err(KernelError::UnsupportedDim {
                dim: "lanes",
                got: 0,
                reason: "a scratch needs at least one lane",
            });
        }
        let max_pairs = dims
            .max_tokens
            .checked_mul(dims.top_k)
            .ok_or(overflow("max_tokens·top_k"))?;
        let (h, i, e) = (dims.hidden_size, dims.intermediate_size, dims.num_experts);
        let rows = |width: usize| {
            max_pairs
                .checked_mul(width)
                .ok_or(overflow("max_tokens·top_k·width"))
        };
        Ok(Self {
            dims,
            max_pairs,
            offsets: vec![0; e + 1],
            cursor: vec![0; e],
            tok: vec![0; max_pairs],
            gate: vec![0.0; max_pairs],
            order: vec![NOT_LOCAL; max_pairs],
            lane_bounds: vec![0; dims.lanes + 1],
            expert_rows: vec![0.0; rows(h)?],
            gate_up: vec![0.0; rows(i.saturating_mul(2))?],
            activated: vec![0.0; rows(i)?],
            token_codes: vec![
                0;
                dims.max_tokens
                    .checked_mul(h)
                    .ok_or(overflow("max_tokens·H"))?
            ],
            token_params: vec![TokenParams::default(); dims.max_tokens],
            gemm: (0..dims.lanes)
                .map(|_| GemmScratch::with_capacity(max_pairs, h.max(i)))
                .collect(),
            times: None,
        })
    }

    /// Starts (from zero) or stops recording the time each stage of the calls on this scratch
    /// takes ([`Self::stage_times`]). Recording reads the clock a few times per expert.
    pub fn record_stage_times(&mut self, on: bool) {
        self.times = on.then(|| vec![StageTimes::default(); self.dims.lanes + 1]);
    }

    /// The stage times recorded since [`Self::record_stage_times`] (zero when it is off).
    pub fn stage_times(&self) -> StageTimes {
        let mut sum = StageTimes::default();
        for t in self.times.iter().flatten() {
            sum += *t;
        }
        sum
    }

    /// The sizes this scratch was built for.
    pub fn dims(&self) -> MoeScratchDims {
        self.dims
    }

    /// Refuses a call of `tokens × top_k` on a layer of shape `(h, i, e)` that does not fit.
    pub(crate) fn check_fits(
        &self,
        tokens: usize,
        top_k: usize,
        (h, i, e): (usize, usize, usize),
    ) -> Result<(), KernelError> {
        for (dim, scratch, layer) in [
            ("H", self.dims.hidden_size, h),
            ("I", self.dims.intermediate_size, i),
            ("E", self.dims.num_experts, e),
        ] {
            if scratch != layer {
                return Err(KernelError::ScratchMismatch {
                    dim,
                    scratch,
                    layer,
                });
            }
        }
        if tokens > self.dims.max_tokens {
            return Err(KernelError::ScratchTooSmall {
                what: "tokens",
                capacity: self.dims.max_tokens,
                needed: tokens,
            });
        }
        let pairs = tokens.saturating_mul(top_k);
        if pairs > self.max_pairs {
            return Err(KernelError::ScratchTooSmall {
                what: "token-expert pairs",
                capacity: self.max_pairs,
                needed: pairs,
            });
        }
        Ok(())
    }
}
