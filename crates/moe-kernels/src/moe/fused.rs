//! [`FusedMoe`]: a layer's packed expert weights plus the fused expert pipeline of spec §4.1
//! (bucket, gather, gate/up GEMM, activation, down GEMM, gating, ordered per-token sum).
//!
//! Threads: experts are cut into contiguous groups ("lanes", balanced by row count), lanes run
//! as rayon tasks, and every GEMM may further split its output channels ([`Par::Rayon`]).
//! Every output element is produced by one fixed sequence of operations whatever the split,
//! and the per-token sum runs in ascending expert order afterwards, so results are bitwise
//! independent of the thread count and of the number of lanes.

use std::time::{Duration, Instant};

use super::activation::{Activation, GateUpLayout};
use super::bucket::Routing;
use super::experts::sealed::Sealed;
use super::experts::{ExpertMatrix, WeightFormat};
use super::numerics::{ExpertId, MoeFloat, Numerics, Round, SumMode};
use super::scratch::{MoeScratch, MoeScratchDims, NOT_LOCAL, StageTimes};
use crate::gemm::{TokenCodes, TokenParams, TokenQuant, quantize_tokens};
use crate::packed::check_len;
use crate::par::{self, Par, join, pool_threads};
use crate::{GemmScratch, KernelError, KernelSet};

/// The packed weight matrices of one layer's experts (local experts only), one gate/up and one
/// down matrix per expert, with their optional biases: what a [`FusedMoe`] multiplies with.
#[derive(Debug, Clone)]
pub struct PackedExperts<W> {
    /// Gate/up projections, one `[2I, H]` matrix per expert.
    pub w13: Vec<W>,
    /// Down projections, one `[H, I]` matrix per expert.
    pub w2: Vec<W>,
    /// Optional f32 bias of `w13`, `[E, 2I]` (added after the GEMM, before any rounding; for
    /// W4A8 it may equally be packed into the matrices).
    pub w13_bias: Option<Vec<f32>>,
    /// Optional f32 bias of `w2`, `[E, H]`.
    pub w2_bias: Option<Vec<f32>>,
}

/// What the layer computes besides its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedMoeConfig {
    /// Hidden size H.
    pub hidden_size: usize,
    /// Intermediate size I per expert (this partition's).
    pub intermediate_size: usize,
    /// The gated activation.
    pub activation: Activation,
    /// How gate and up rows are arranged in `w13`.
    pub gate_up_layout: GateUpLayout,
    /// Multiply the router weight into the gathered input rows instead of the expert outputs.
    pub apply_router_weight_on_input: bool,
    /// Number of experts of the whole model; `topk_ids` must lie in `0..global_num_experts`.
    /// Without an expert map it must equal the number of local experts.
    pub global_num_experts: usize,
    /// Expert parallelism (spec §7.5): global id → local id, or −1 for an expert held by
    /// another rank (its contributions are skipped). Length `global_num_experts`.
    pub expert_map: Option<Vec<i32>>,
}

/// One call's routed tokens.
#[derive(Debug, Clone, Copy)]
pub struct MoeInput<'a, X, Id> {
    /// Number of tokens T.
    pub tokens: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Hidden states `[T, H]`.
    pub x: &'a [X],
    /// Global expert ids `[T, k]`.
    pub topk_ids: &'a [Id],
    /// Router weights `[T, k]`.
    pub topk_weights: &'a [f32],
}

/// A MoE layer's experts, ready to apply; immutable and shareable between threads.
#[derive(Debug, Clone)]
pub struct FusedMoe<W> {
    config: FusedMoeConfig,
    weights: PackedExperts<W>,
    all_channelwise: bool,
    kernels: KernelSet,
}

impl<W: ExpertMatrix> FusedMoe<W> {
    /// Validates the weights against the configuration and keeps the kernel set that
    /// [`FusedMoe::apply`] will use (normally `*moe_kernels::kernels()`).
    pub fn new(
        weights: PackedExperts<W>,
        config: FusedMoeConfig,
        kernels: KernelSet,
    ) -> Result<Self, KernelError> {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let e = weights.w13.len();
        for (dim, got) in [("H", h), ("I", i), ("E", e)] {
            if got == 0 {
                return Err(KernelError::UnsupportedDim {
                    dim,
                    got,
                    reason: "a MoE layer needs at least one expert, hidden and intermediate value",
                });
            }
        }
        if weights.w2.len() != e {
            return Err(KernelError::ShapeMismatch {
                tensor: "w2",
                dim: "E",
                other: "w13",
                expected: e,
                got: weights.w2.len(),
            });
        }
        let two_i = i.checked_mul(2).ok_or(KernelError::UnsupportedDim {
            dim: "I",
            got: i,
            reason: "2·I overflows usize",
        })?;
        check_experts("w13", &weights.w13, two_i, h)?;
        check_experts("w2", &weights.w2, h, i)?;
        if let Some(b) = &weights.w13_bias {
            check_len("w13_bias", e * two_i, b.len())?;
        }
        if let Some(b) = &weights.w2_bias {
            check_len("w2_bias", e * h, b.len())?;
        }
        config.activation.validate(config.gate_up_layout)?;
        if W::FORMAT != WeightFormat::W4A8
            && matches!(config.activation, Activation::VllmCpuInt4Compat(_))
        {
            return Err(KernelError::Unsupported {
                reason: "the vLLM CPU int4 compatibility activation applies to W4A8 weights only",
            });
        }
        match &config.expert_map {
            None if config.global_num_experts != e => {
                return Err(KernelError::ShapeMismatch {
                    tensor: "global_num_experts",
                    dim: "E",
                    other: "w13 (no expert map)",
                    expected: e,
                    got: config.global_num_experts,
                });
            }
            None => {}
            Some(map) => {
                check_len("expert_map", config.global_num_experts, map.len())?;
                if let Some(index) = map.iter().position(|&l| l < -1 || l as i64 >= e as i64) {
                    return Err(KernelError::ValueOutOfRange {
                        tensor: "expert_map",
                        index,
                        value: i64::from(map[index]),
                        min: -1,
                        max: e as i64 - 1,
                    });
                }
            }
        }
        let all_channelwise = weights
            .w13
            .iter()
            .chain(&weights.w2)
            .all(ExpertMatrix::is_channelwise);
        Ok(Self {
            config,
            weights,
            all_channelwise,
            kernels,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FusedMoeConfig {
        &self.config
    }

    /// The packed weights (for inspection, and to check that two builds of a layer agree).
    pub fn weights(&self) -> &PackedExperts<W> {
        &self.weights
    }

    /// Number of local experts E.
    pub fn num_experts(&self) -> usize {
        self.weights.w13.len()
    }

    /// The kernel set the pipeline calls.
    pub fn kernels(&self) -> &KernelSet {
        &self.kernels
    }

    /// The same layer calling `kernels` instead: one set of packed weights run on several
    /// rungs, as benchmarks comparing rungs do. Every rung reads the same packed formats.
    pub fn with_kernels(mut self, kernels: KernelSet) -> Self {
        self.kernels = kernels;
        self
    }

    /// A scratch for calls of up to `max_tokens` tokens with `top_k` experts each, running up
    /// to `lanes` expert groups at once (the rayon pool size is a good choice).
    pub fn scratch(
        &self,
        max_tokens: usize,
        top_k: usize,
        lanes: usize,
    ) -> Result<MoeScratch, KernelError> {
        let mut scratch = MoeScratch::new(MoeScratchDims {
            max_tokens,
            top_k,
            hidden_size: self.config.hidden_size,
            intermediate_size: self.config.intermediate_size,
            num_experts: self.num_experts(),
            lanes,
        })?;
        let w = &self.weights;
        let max_rows = scratch.max_pairs;
        for gemm in &mut scratch.gemm {
            for m in w.w13.iter().chain(&w.w2) {
                m.reserve_scratch(&self.kernels, gemm, max_rows);
            }
        }
        let layout = self.kernels.layout_bytes(
            scratch.max_pairs,
            self.config.hidden_size.max(self.config.intermediate_size),
        );
        if layout > 0 {
            scratch
                .gemm
                .iter_mut()
                .for_each(|g| g.reserve_tiles(layout));
        }
        Ok(scratch)
    }

    /// `out[T, H] = Σ_j topk_weights[t, j] · expert_{topk_ids[t, j]}(x[t])` per spec §4.1.
    ///
    /// `X` is f32, bf16 or f16; the output has the input's dtype and the rounding rules of the
    /// weight format (see `numerics`). A token whose row holds a NaN gets an all-NaN output row
    /// (spec §4.6); NaN router weights poison the rows they touch. Pairs whose expert maps to
    /// −1 contribute nothing; a token with no local expert gets zeros.
    ///
    /// Allocates nothing: every buffer comes from `scratch`, and a call that does not fit it is
    /// refused with [`KernelError::ScratchTooSmall`]. All arguments are checked before `out`
    /// is written.
    pub fn apply<X: MoeFloat, Id: ExpertId>(
        &self,
        input: MoeInput<'_, X, Id>,
        out: &mut [X],
        scratch: &mut MoeScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        let (h, i, e) = (
            self.config.hidden_size,
            self.config.intermediate_size,
            self.num_experts(),
        );
        let MoeInput {
            tokens,
            top_k,
            x,
            topk_ids,
            topk_weights,
        } = input;
        scratch.check_fits(tokens, top_k, (h, i, e))?;
        // Saturating products: an absurd size must fail the check, not overflow.
        let (x_len, pairs) = (tokens.saturating_mul(h), tokens.saturating_mul(top_k));
        check_len("x", x_len, x.len())?;
        check_len("topk_ids", pairs, topk_ids.len())?;
        check_len("topk_weights", pairs, topk_weights.len())?;
        check_len("out", x_len, out.len())?;
        let routing = Routing {
            ids: topk_ids,
            weights: topk_weights,
            top_k,
            expert_map: self.config.expert_map.as_deref(),
            global_experts: self.config.global_num_experts,
            local_experts: e,
        };
        let started = scratch.times.is_some().then(Instant::now);
        let rows = routing.bucket(scratch)?;
        if let (Some(t0), Some(times)) = (started, scratch.times.as_mut()) {
            times[0].route += t0.elapsed();
            times[0].calls += 1;
        }
        if tokens == 0 {
            return Ok(());
        }
        if top_k == 0 || rows == 0 {
            out.fill(X::from_f32(0.0));
            return Ok(());
        }

        let numerics = match W::FORMAT {
            WeightFormat::W4A8 => Numerics::w4a8::<X>(self.all_channelwise),
            WeightFormat::W8A8 => Numerics::w8a8::<X>(),
            WeightFormat::Dense | WeightFormat::Wna16 => Numerics::float(),
        };
        let MoeScratch {
            offsets,
            tok,
            gate,
            order,
            lane_bounds,
            expert_rows,
            gate_up,
            activated,
            token_codes,
            token_params,
            gemm,
            times,
            ..
        } = scratch;
        // Lane `l` records into `lane_times[l]`, the stages outside the lanes into `outer`.
        let (mut outer, lane_times): (Option<&mut StageTimes>, Option<&mut [StageTimes]>) =
            match times.as_deref_mut() {
                Some([outer, lanes @ ..]) => (Some(outer), Some(lanes)),
                _ => (None, None),
            };
        // Formats that quantise per token share one quantisation of each token among its
        // experts, unless the router weight scales each expert's copy of the row first.
        let token_rule = self
            .weights
            .w13
            .first()
            .and_then(Sealed::token_quant)
            .filter(|_| !self.config.apply_router_weight_on_input);
        let codes = match token_rule {
            Some(rule) => {
                let started = outer.is_some().then(Instant::now);
                let (codes, params) = (&mut token_codes[..tokens * h], &mut token_params[..tokens]);
                let quantiser = TokenQuantiser {
                    ks: &self.kernels,
                    rule,
                    hidden: h,
                };
                quantiser.run(x, &mut expert_rows[..tokens * h], codes, params, par);
                if let (Some(t0), Some(outer)) = (started, outer.as_deref_mut()) {
                    outer.gather += t0.elapsed();
                }
                Some(TokenCodes {
                    k: h,
                    codes: &token_codes[..tokens * h],
                    params: &token_params[..tokens],
                })
            }
            None => None,
        };
        let active = offsets.windows(2).filter(|w| w[1] > w[0]).count();
        let lanes = match par {
            Par::Seq => 1,
            Par::Rayon => gemm.len().min(pool_threads()).min(active).max(1),
        };
        split_lanes(&offsets[..=e], rows, &mut lane_bounds[..=lanes]);
        let ctx = ExpertCtx {
            moe: self,
            x,
            tok: &tok[..rows],
            gate: &gate[..rows],
            offsets: &offsets[..=e],
            codes,
            numerics,
            par,
        };
        ctx.run_lanes(
            &lane_bounds[..=lanes],
            LaneBufs {
                expert_rows: &mut expert_rows[..rows * h],
                gate_up: &mut gate_up[..rows * 2 * i],
                activated: &mut activated[..rows * i],
                gemm: &mut gemm[..lanes],
                times: lane_times.map(|t| &mut t[..lanes]),
            },
        )?;
        let started = outer.is_some().then(Instant::now);
        Reduce {
            y: &expert_rows[..rows * h],
            order: &order[..tokens * top_k],
            top_k,
            hidden: h,
            sum: numerics.sum,
        }
        .run(out, par);
        if let (Some(t0), Some(outer)) = (started, outer) {
            outer.reduce += t0.elapsed();
        }
        Ok(())
    }
}

/// Checks every expert matrix of a stack against `[n, k]`.
fn check_experts<W: ExpertMatrix>(
    tensor: &'static str,
    stack: &[W],
    n: usize,
    k: usize,
) -> Result<(), KernelError> {
    for (expert, w) in stack.iter().enumerate() {
        for (dim, expected, got) in [("N", n, w.n()), ("K", k, w.k())] {
            if expected != got {
                return Err(KernelError::ExpertShapeMismatch {
                    tensor,
                    expert,
                    dim,
                    expected,
                    got,
                });
            }
        }
    }
    Ok(())
}

/// Cuts experts `0..E` into `bounds.len() − 1` contiguous groups of roughly equal row counts:
/// `bounds[l]` is the first expert of lane `l`.
fn split_lanes(offsets: &[usize], rows: usize, bounds: &mut [usize]) {
    let lanes = bounds.len() - 1;
    let e = offsets.len() - 1;
    for (l, b) in bounds.iter_mut().enumerate() {
        *b = if l == lanes {
            e
        } else {
            let target = l * rows / lanes;
            offsets[..e].partition_point(|&o| o < target)
        };
    }
}

/// The read-only state shared by all lanes of one call.
struct ExpertCtx<'a, W, X> {
    moe: &'a FusedMoe<W>,
    x: &'a [X],
    tok: &'a [usize],
    gate: &'a [f32],
    offsets: &'a [usize],
    /// Every token's activation codes, when the format quantises per token.
    codes: Option<TokenCodes<'a>>,
    numerics: Numerics,
    par: Par,
}

/// The mutable buffers of a run of lanes: rows of the lanes' experts only.
struct LaneBufs<'s> {
    /// Expert outputs, `[rows, H]`; the expert in progress gathers its input rows into the
    /// last of them.
    expert_rows: &'s mut [f32],
    /// Gate/up projections of the expert in progress, from the start, `[rows, 2I]`.
    gate_up: &'s mut [f32],
    /// Activation outputs of the expert in progress, from the start, `[rows, I]`.
    activated: &'s mut [f32],
    gemm: &'s mut [GemmScratch],
    /// One stage-time record per lane, when recording.
    times: Option<&'s mut [StageTimes]>,
}

impl<W: ExpertMatrix, X: MoeFloat> ExpertCtx<'_, W, X> {
    /// Runs the lanes of `bounds` (expert boundaries), splitting them in halves over rayon.
    fn run_lanes(&self, bounds: &[usize], bufs: LaneBufs<'_>) -> Result<(), KernelError> {
        let lanes = bounds.len() - 1;
        if lanes == 1 {
            let times = bufs.times.and_then(|t| t.first_mut());
            return self.run_experts(
                bounds[0],
                bounds[1],
                bufs.expert_rows,
                bufs.gate_up,
                bufs.activated,
                bufs.gemm,
                times,
            );
        }
        let mid = lanes / 2;
        let split_row = self.offsets[bounds[mid]] - self.offsets[bounds[0]];
        let (h, i) = (
            self.moe.config.hidden_size,
            self.moe.config.intermediate_size,
        );
        let (rows_l, rows_r) = bufs.expert_rows.split_at_mut(split_row * h);
        let (gate_up_l, gate_up_r) = bufs.gate_up.split_at_mut(split_row * 2 * i);
        let (act_l, act_r) = bufs.activated.split_at_mut(split_row * i);
        let (g_l, g_r) = bufs.gemm.split_at_mut(mid);
        let (t_l, t_r) = match bufs.times {
            Some(t) => {
                let (l, r) = t.split_at_mut(mid);
                (Some(l), Some(r))
            }
            None => (None, None),
        };
        let left = LaneBufs {
            expert_rows: rows_l,
            gate_up: gate_up_l,
            activated: act_l,
            gemm: g_l,
            times: t_l,
        };
        let right = LaneBufs {
            expert_rows: rows_r,
            gate_up: gate_up_r,
            activated: act_r,
            gemm: g_r,
            times: t_r,
        };
        let (l, r) = join(
            || self.run_lanes(&bounds[..=mid], left),
            || self.run_lanes(&bounds[mid..], right),
        );
        l.and(r)
    }

    /// Experts `e0..e1` one after another; the buffers start at expert `e0`'s first row.
    /// With `times`, each stage's time is added to it.
    #[allow(clippy::too_many_arguments)] // one lane's expert range and buffers
    fn run_experts(
        &self,
        e0: usize,
        e1: usize,
        expert_rows: &mut [f32],
        gate_up: &mut [f32],
        activated: &mut [f32],
        gemm: &mut [GemmScratch],
        mut times: Option<&mut StageTimes>,
    ) -> Result<(), KernelError> {
        let mut clock = times.as_ref().map(|_| Instant::now());
        // Adds the time since the last mark to the stage `field` picks.
        let mut mark = |times: &mut Option<&mut StageTimes>,
                        field: fn(&mut StageTimes) -> &mut Duration| {
            if let (Some(t), Some(c)) = (times.as_deref_mut(), clock.as_mut()) {
                let now = Instant::now();
                *field(t) += now - *c;
                *c = now;
            }
        };
        let cfg = &self.moe.config;
        let weights = &self.moe.weights;
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let nm = self.numerics;
        let on_input = cfg.apply_router_weight_on_input;
        let scratch = &mut gemm[0];
        let base = self.offsets[e0];
        let lane_rows = expert_rows.len() / h;
        for e in e0..e1 {
            let (start, end) = (self.offsets[e], self.offsets[e + 1]);
            let n_e = end - start;
            if n_e == 0 {
                continue;
            }
            let r0 = start - base;
            // Every expert of the lane reuses the same places for its gathered rows, its
            // gate/up projections and its activations, so those stay in the caches from one
            // expert to the next instead of each expert writing memory of its own. The
            // gathered rows sit at the end of the lane's output rows: at or after this
            // expert's own rows, so they never cover an earlier expert's outputs, and they
            // are read by the gate/up GEMM before the down GEMM writes this expert's rows.
            let gate_up_e = &mut gate_up[..n_e * 2 * i];
            let act_e = &mut activated[..n_e * i];

            // Gate/up projection from the tokens' shared codes, or from the gathered (and
            // optionally gated) input rows.
            let from_codes = match self.codes {
                Some(codes) => weights.w13[e].gemm_tokens(
                    &self.moe.kernels,
                    &self.tok[start..end],
                    codes,
                    gate_up_e,
                    scratch,
                    self.par,
                )?,
                None => false,
            };
            if !from_codes {
                let gathered = &mut expert_rows[(lane_rows - n_e) * h..lane_rows * h];
                for (pos, row) in (start..end).zip(gathered.chunks_exact_mut(h)) {
                    let src = &self.x[self.tok[pos] * h..][..h];
                    for (d, s) in row.iter_mut().zip(src) {
                        *d = s.to_f32();
                    }
                    if on_input {
                        let g = nm.gate(self.gate[pos]);
                        Round::map_twice(row, nm.compute, Round::F32, |v| v * g);
                    }
                }
                mark(&mut times, |t| &mut t.gather);
                weights.w13[e].gemm(
                    &self.moe.kernels,
                    n_e,
                    gathered,
                    gate_up_e,
                    scratch,
                    self.par,
                )?;
            }
            let b13 = weights
                .w13_bias
                .as_deref()
                .map(|b| &b[e * 2 * i..][..2 * i]);
            finish_gemm_rows(gate_up_e, 2 * i, b13, &nm);
            mark(&mut times, |t| &mut t.gate_up);
            for (hr, ar) in gate_up_e.chunks_exact(2 * i).zip(act_e.chunks_exact_mut(i)) {
                cfg.activation
                    .apply_row(cfg.gate_up_layout, hr, ar, nm.compute);
            }
            mark(&mut times, |t| &mut t.activation);

            // Down projection into the expert's rows, bias, gating, output dtype.
            let rows_e = &mut expert_rows[r0 * h..][..n_e * h];
            weights.w2[e].gemm(&self.moe.kernels, n_e, act_e, rows_e, scratch, self.par)?;
            let b2 = weights.w2_bias.as_deref().map(|b| &b[e * h..][..h]);
            finish_gemm_rows(rows_e, h, b2, &nm);
            for (pos, row) in (start..end).zip(rows_e.chunks_exact_mut(h)) {
                if on_input {
                    Round::map_twice(row, Round::F32, nm.expert_out, |v| v);
                } else {
                    let g = nm.gate(self.gate[pos]);
                    Round::map_twice(row, nm.compute, nm.expert_out, |v| v * g);
                }
            }
            mark(&mut times, |t| &mut t.down);
        }
        Ok(())
    }
}

/// Below this many values the tokens' rows are quantised on one thread.
const PARALLEL_QUANT_MIN: usize = 1 << 15;

/// Quantises every token's row once per call for the formats whose GEMMs quantise per token
/// (see [`crate::gemm::TokenCodes`]).
struct TokenQuantiser<'a> {
    ks: &'a KernelSet,
    rule: TokenQuant,
    hidden: usize,
}

impl TokenQuantiser<'_> {
    /// Rows of `x` into `codes` and `params` (one per token), each widened to f32 in
    /// `staging` first; halves of the tokens run on two threads when asked and worth it, and
    /// each row's codes depend on that row alone, so the split never changes them.
    fn run<X: MoeFloat>(
        &self,
        x: &[X],
        staging: &mut [f32],
        codes: &mut [i8],
        params: &mut [TokenParams],
        par: Par,
    ) {
        let (t, h) = (params.len(), self.hidden);
        if par == Par::Rayon && t >= 2 && t * h >= PARALLEL_QUANT_MIN {
            let mid = t / 2;
            let (x0, x1) = x.split_at(mid * h);
            let (s0, s1) = staging.split_at_mut(mid * h);
            let (c0, c1) = codes.split_at_mut(mid * h);
            let (p0, p1) = params.split_at_mut(mid);
            join(
                || self.run(x0, s0, c0, p0, par),
                || self.run(x1, s1, c1, p1, par),
            );
            return;
        }
        for (d, s) in staging.iter_mut().zip(x) {
            *d = s.to_f32();
        }
        quantize_tokens(self.ks, self.rule, staging, h, codes, params);
    }
}

/// Adds the bias (if any) to each row of `width` values and applies the format's GEMM-output
/// rounding.
fn finish_gemm_rows(rows: &mut [f32], width: usize, bias: Option<&[f32]>, nm: &Numerics) {
    match bias {
        Some(b) => {
            for row in rows.chunks_exact_mut(width) {
                for (v, &bv) in row.iter_mut().zip(b) {
                    *v += bv;
                }
                Round::map_twice(row, nm.gemm_out, Round::F32, |v| v);
            }
        }
        None if nm.gemm_out != Round::F32 => {
            Round::map_twice(rows, nm.gemm_out, Round::F32, |v| v);
        }
        None => {}
    }
}

/// Below this many output elements × contributions the sum runs on one thread.
const PARALLEL_REDUCE_MIN: usize = 1 << 16;

/// Step 5 of spec §4.1: each token's contributions, in ascending expert order, into `out`.
struct Reduce<'a> {
    /// Expert outputs `[rows, H]`, already gated and in the output dtype.
    y: &'a [f32],
    /// Per token, its rows in ascending order, [`NOT_LOCAL`] last, `[T, k]`.
    order: &'a [usize],
    top_k: usize,
    hidden: usize,
    sum: SumMode,
}

impl Reduce<'_> {
    /// One token's output row, a chunk of channels at a time: each channel still starts at 0
    /// and adds its contributions in slot order, but the loops run over channels, so they
    /// vectorise.
    fn token<X: MoeFloat>(&self, dst: &mut [X], slots: &[usize]) {
        const CHUNK: usize = 64;
        let local = slots.iter().take_while(|&&p| p != NOT_LOCAL).count();
        let slots = &slots[..local];
        for (c0, d) in (0..).step_by(CHUNK).zip(dst.chunks_mut(CHUNK)) {
            let mut acc = [0.0f32; CHUNK];
            let acc = &mut acc[..d.len()];
            for &pos in slots {
                let src = &self.y[pos * self.hidden + c0..][..d.len()];
                match self.sum {
                    SumMode::RoundEachAdd => {
                        for (a, &v) in acc.iter_mut().zip(src) {
                            *a = X::round_f32(*a + v);
                        }
                    }
                    SumMode::F32ThenRound => {
                        for (a, &v) in acc.iter_mut().zip(src) {
                            *a += v;
                        }
                    }
                }
            }
            for (o, &a) in d.iter_mut().zip(acc.iter()) {
                *o = X::from_f32(a);
            }
        }
    }

    /// Every token, in parallel when asked and worth it (rows are independent).
    fn run<X: MoeFloat>(&self, out: &mut [X], par: Par) {
        if par == Par::Rayon && out.len() * self.top_k >= PARALLEL_REDUCE_MIN {
            self.run_parallel(out);
        } else {
            for (dst, slots) in out
                .chunks_exact_mut(self.hidden)
                .zip(self.order.chunks_exact(self.top_k))
            {
                self.token(dst, slots);
            }
        }
    }

    fn run_parallel<X: MoeFloat>(&self, out: &mut [X]) {
        par::for_each_chunk(
            out,
            self.hidden,
            Par::Rayon,
            || (),
            |_, t, dst| self.token(dst, &self.order[t * self.top_k..][..self.top_k]),
        );
    }
}
