//! Applying: routing (`route`, `route_hidden`, the router logits of hidden states) and the
//! `apply` family, which takes a scratch from the layer's pool, runs the routed experts and
//! adds the shared experts.

use half::{bf16, f16};
use moe_kernels::moe::MoeFloat;
use moe_kernels::{MoeInput, MoeScratch};
use moe_quant::DType;
use moe_router::{IdsOut, Logits, RouterScratch};

use super::scratch::{CallScratch, GateScratch, SharedScratch, typed_zeros};
use super::{MoeLayer, Ready};
use crate::LayerError;

impl MoeLayer {
    /// A call scratch from the pool, or a new one when every pooled one is in use.
    fn take_scratch(&self, ready: &Ready) -> Result<CallScratch, LayerError> {
        match ready.pool.take() {
            Some(s) => Ok(s),
            None => Ok(CallScratch::new(
                ready
                    .moe
                    .scratch(self.cfg.max_tokens, self.cfg.top_k, ready.lanes)?,
                self.router.new_scratch(),
            )),
        }
    }

    /// Routes `router_logits` `[T, E]` into `topk_ids` / `topk_weights` `[T, k]` (global ids);
    /// returns `T`. On a processed layer the router's working memory comes from the layer's
    /// pool, so the call allocates nothing in steady state.
    pub fn route(
        &self,
        router_logits: Logits<'_>,
        topk_ids: &mut [i32],
        topk_weights: &mut [f32],
    ) -> Result<usize, LayerError> {
        let Ok(ready) = self.ready() else {
            let mut scratch = RouterScratch::new(self.router.config());
            return Ok(self.router.route_into(
                router_logits,
                topk_weights,
                IdsOut::I32(topk_ids),
                &mut scratch,
            )?);
        };
        let mut scratch = self.take_scratch(ready)?;
        let result = self.router.route_into(
            router_logits,
            topk_weights,
            IdsOut::I32(topk_ids),
            &mut scratch.router,
        );
        ready.pool.put(scratch);
        Ok(result?)
    }

    /// Computes the router logits of `x` `[T, H]` with the loaded gate weight, as the
    /// unquantized gate does in the model dtype (f32 dot products rounded once to `X`), and
    /// routes them; returns `T`. Allocates nothing in steady state on a processed layer.
    pub fn route_hidden<X: MoeFloat>(
        &self,
        x: &[X],
        topk_ids: &mut [i32],
        topk_weights: &mut [f32],
    ) -> Result<usize, LayerError> {
        let mut route = |gate: &mut GateScratch, router: &mut RouterScratch| {
            let logits = self.gate_logits(x, gate)?;
            Ok(self
                .router
                .route_into(logits, topk_weights, IdsOut::I32(topk_ids), router)?)
        };
        let Ok(ready) = self.ready() else {
            return route(
                &mut GateScratch::default(),
                &mut RouterScratch::new(self.router.config()),
            );
        };
        let mut scratch = self.take_scratch(ready)?;
        let CallScratch { router, gate, .. } = &mut scratch;
        let result = route(gate, router);
        ready.pool.put(scratch);
        result
    }

    /// `x · gateᵀ` `[T, E]` with f32 accumulation (on the dense GEMM of the dispatched rung,
    /// whose summation order is its own), each value rounded to `X` (as f32).
    pub fn router_logits<X: MoeFloat>(&self, x: &[X]) -> Result<Vec<f32>, LayerError> {
        let mut gate = GateScratch::default();
        self.gate_logits(x, &mut gate)?;
        Ok(gate.logits)
    }

    /// The router logits of `x` in `gate`'s buffers, as the router reads them for a model of
    /// dtype `X` (bf16 and f16 logits for 16-bit models, f32 otherwise).
    fn gate_logits<'g, X: MoeFloat>(
        &self,
        x: &[X],
        gate: &'g mut GateScratch,
    ) -> Result<Logits<'g>, LayerError> {
        let (h, e) = (self.cfg.hidden, self.cfg.num_experts);
        let w = self
            .router_weight
            .as_ref()
            .ok_or_else(|| LayerError::MissingParams {
                missing: vec!["router.weight".into()],
            })?;
        let tokens = check_rows("hidden_states", x.len(), h)?;
        gate.wide.clear();
        gate.wide.extend(x.iter().map(|v| v.to_f32()));
        gate.logits.clear();
        gate.logits.resize(tokens * e, 0.0);
        moe_kernels::dense_gemm(
            moe_kernels::kernels(),
            tokens,
            &gate.wide,
            w,
            &mut gate.logits,
            self.par,
        )?;
        match &self.router_bias {
            // A linear with a bias: the bias joins the f32 sum before the one rounding.
            Some(bias) => {
                for row in gate.logits.chunks_exact_mut(e) {
                    for (v, b) in row.iter_mut().zip(bias) {
                        *v = X::round_f32(*v + b);
                    }
                }
            }
            None => {
                for v in &mut gate.logits {
                    *v = X::round_f32(*v);
                }
            }
        }
        Ok(match X::DTYPE {
            DType::BF16 => {
                gate.bf16.clear();
                gate.bf16
                    .extend(gate.logits.iter().map(|&v| bf16::from_f32(v)));
                Logits::Bf16(&gate.bf16)
            }
            DType::F16 => {
                gate.f16.clear();
                gate.f16
                    .extend(gate.logits.iter().map(|&v| f16::from_f32(v)));
                Logits::F16(&gate.f16)
            }
            _ => Logits::F32(&gate.logits),
        })
    }

    /// The whole MoE block on `hidden_states` `[T, H]`: the router logits from the loaded gate
    /// weight ([`Self::router_logits`]), routing, the experts and the shared experts, written
    /// to `out` `[T, H]`. The same result as [`Self::apply`] given those logits; every buffer
    /// comes from the layer's pool, so the call allocates nothing in steady state.
    pub fn apply_with_gate<X: MoeFloat>(
        &self,
        hidden_states: &[X],
        out: &mut [X],
    ) -> Result<(), LayerError> {
        let ready = self.ready()?;
        check_rows("hidden_states", hidden_states.len(), self.cfg.hidden)?;
        check_out_len(out.len(), hidden_states.len())?;
        let mut scratch = self.take_scratch(ready)?;
        // The logits leave the scratch while the rest of it routes and runs; taking a vector
        // moves it without allocating.
        let mut gate = std::mem::take(&mut scratch.gate);
        let result = self
            .gate_logits(hidden_states, &mut gate)
            .and_then(|logits| self.route_and_run(ready, hidden_states, logits, out, &mut scratch));
        scratch.gate = gate;
        ready.pool.put(scratch);
        result
    }

    /// Routes `router_logits` `[T, E]` (vLLM's CPU softmax path for softmax models) and runs
    /// the experts on `hidden_states` `[T, H]`, writing `out` `[T, H]`.
    ///
    /// Non-finite input is refused, never computed on: a NaN or ±Inf logit is
    /// [`LayerError::Router`] (`RouterError::NonFiniteLogit`), a NaN or ±Inf hidden state is
    /// [`LayerError::NonFiniteInput`] naming its row and column. The whole call fails before
    /// `out` is written. Results are bitwise identical whatever the thread count and however
    /// many calls run at once (docs/reliability.md).
    pub fn apply<X: MoeFloat>(
        &self,
        hidden_states: &[X],
        router_logits: Logits<'_>,
        out: &mut [X],
    ) -> Result<(), LayerError> {
        self.ready()?;
        let tokens = check_rows("hidden_states", hidden_states.len(), self.cfg.hidden)?;
        let expected = tokens * self.cfg.num_experts;
        if router_logits.len() != expected {
            return Err(LayerError::InvalidArgument {
                field: "router_logits",
                reason: format!(
                    "{} values for {tokens} tokens of {} experts",
                    router_logits.len(),
                    self.cfg.num_experts
                ),
            });
        }
        check_out_len(out.len(), hidden_states.len())?;
        let ready = self.ready()?;
        let mut scratch = self.take_scratch(ready)?;
        let result = self.route_and_run(ready, hidden_states, router_logits, out, &mut scratch);
        ready.pool.put(scratch);
        result
    }

    /// [`Self::apply`] on a taken scratch: routes into its buffers, then runs the experts.
    fn route_and_run<X: MoeFloat>(
        &self,
        ready: &Ready,
        x: &[X],
        router_logits: Logits<'_>,
        out: &mut [X],
        scratch: &mut CallScratch,
    ) -> Result<(), LayerError> {
        let pairs = x.len() / self.cfg.hidden * self.cfg.top_k;
        let CallScratch {
            moe,
            router,
            ids,
            weights,
            shared,
            ..
        } = scratch;
        ids.clear();
        ids.resize(pairs, 0);
        weights.clear();
        weights.resize(pairs, 0.0);
        self.router
            .route_into(router_logits, weights, IdsOut::I32(ids), router)?;
        check_finite(
            "hidden_states",
            x.iter().map(|v| v.to_f32()),
            self.cfg.hidden,
        )?;
        check_finite("topk_weights", weights.iter().copied(), self.cfg.top_k)?;
        self.run_experts(ready, x, ids, weights, out, moe, shared)
    }

    /// Runs the experts on `x` `[T, H]` for precomputed routing (`topk_ids` global,
    /// `topk_weights` `[T, k]`), writing `out` `[T, H]`. Calls longer than `max_tokens` are
    /// cut into pieces (tokens are independent, so results do not change).
    ///
    /// A NaN or ±Inf in `x` or `topk_weights` is refused with
    /// [`LayerError::NonFiniteInput`] before anything is computed; an id outside
    /// `0..num_experts` is [`LayerError::Kernel`] (`KernelError::ExpertIdOutOfRange`).
    pub fn apply_with_topk<X: MoeFloat>(
        &self,
        x: &[X],
        topk_ids: &[i32],
        topk_weights: &[f32],
        out: &mut [X],
    ) -> Result<(), LayerError> {
        let ready = self.ready()?;
        let (h, k) = (self.cfg.hidden, self.cfg.top_k);
        let tokens = check_rows("hidden_states", x.len(), h)?;
        for (field, len) in [
            ("topk_ids", topk_ids.len()),
            ("topk_weights", topk_weights.len()),
        ] {
            if len != tokens * k {
                return Err(LayerError::InvalidArgument {
                    field,
                    reason: format!("{len} values for {tokens} tokens of top-{k}"),
                });
            }
        }
        if out.len() != x.len() {
            return Err(LayerError::InvalidArgument {
                field: "out",
                reason: format!("{} values, hidden_states has {}", out.len(), x.len()),
            });
        }
        check_finite("hidden_states", x.iter().map(|v| v.to_f32()), h)?;
        check_finite("topk_weights", topk_weights.iter().copied(), k)?;
        let mut scratch = self.take_scratch(ready)?;
        let CallScratch { moe, shared, .. } = &mut scratch;
        let result = self.run_experts(ready, x, topk_ids, topk_weights, out, moe, shared);
        ready.pool.put(scratch);
        result
    }

    /// Runs the routed experts in pieces of at most `max_tokens` tokens (tokens are
    /// independent, so results do not change), then adds the shared experts.
    #[allow(clippy::too_many_arguments)] // one call's inputs, output and two scratches
    fn run_experts<X: MoeFloat>(
        &self,
        ready: &Ready,
        x: &[X],
        topk_ids: &[i32],
        topk_weights: &[f32],
        out: &mut [X],
        moe: &mut MoeScratch,
        shared: &mut SharedScratch,
    ) -> Result<(), LayerError> {
        let (h, k) = (self.cfg.hidden, self.cfg.top_k);
        let tokens = x.len() / h;
        let step = self.cfg.max_tokens;
        for t0 in (0..tokens).step_by(step) {
            let t = step.min(tokens - t0);
            let input = MoeInput {
                tokens: t,
                top_k: k,
                x: &x[t0 * h..][..t * h],
                topk_ids: &topk_ids[t0 * k..][..t * k],
                topk_weights: &topk_weights[t0 * k..][..t * k],
            };
            ready
                .moe
                .apply(input, &mut out[t0 * h..][..t * h], moe, self.par)?;
        }
        self.add_shared(x, out, shared)
    }

    /// Adds the shared experts' output (gated per token for Qwen2-MoE) to the routed `out`,
    /// rounding each sum to `X` as the model dtype's addition does.
    ///
    /// Under expert parallelism the ranks' outputs are summed, and every rank holds the shared
    /// experts (sliced only by tensor parallelism), so only the rank holding global expert 0
    /// adds them: rank 0 under vLLM's linear and round-robin placements, and exactly one rank
    /// of any partition of the experts. The sum over ranks then counts them once.
    fn add_shared<X: MoeFloat>(
        &self,
        x: &[X],
        out: &mut [X],
        buf: &mut SharedScratch,
    ) -> Result<(), LayerError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        if !self.cfg.adds_shared_experts() {
            return Ok(());
        }
        let h = self.cfg.hidden;
        let tokens = x.len() / h;
        buf.gates.clear();
        match &self.shared_gate {
            Some(w) => buf.gates.extend(x.chunks_exact(h).map(|row| {
                let dot: f32 = row.iter().zip(w).map(|(a, b)| a.to_f32() * b).sum();
                1.0 / (1.0 + (-dot).exp())
            })),
            None => buf.gates.resize(tokens, 1.0),
        }
        buf.ids.clear();
        buf.ids.resize(tokens, 0);
        let y = typed_zeros(&mut buf.out, x.len(), X::from_f32(0.0));
        shared.apply_with_topk(x, &buf.ids, &buf.gates, y)?;
        for (o, s) in out.iter_mut().zip(y.iter()) {
            *o = X::from_f32(o.to_f32() + s.to_f32());
        }
        Ok(())
    }
}

/// Rejects the first NaN or infinite value of a row-major `[_, width]` argument, naming its row
/// and column (one pass, no allocation).
fn check_finite(
    field: &'static str,
    values: impl Iterator<Item = f32>,
    width: usize,
) -> Result<(), LayerError> {
    for (index, value) in values.enumerate() {
        if !value.is_finite() {
            return Err(LayerError::NonFiniteInput {
                field,
                row: index / width,
                column: index % width,
                value,
            });
        }
    }
    Ok(())
}

/// The output buffer must hold as many values as the hidden states: one row per token.
fn check_out_len(out: usize, hidden_states: usize) -> Result<(), LayerError> {
    if out == hidden_states {
        Ok(())
    } else {
        Err(LayerError::InvalidArgument {
            field: "out",
            reason: format!("{out} values, hidden_states has {hidden_states}"),
        })
    }
}

/// `len / width`, or an error when `len` is not whole rows.
fn check_rows(field: &'static str, len: usize, width: usize) -> Result<usize, LayerError> {
    if len.is_multiple_of(width) {
        Ok(len / width)
    } else {
        Err(LayerError::InvalidArgument {
            field,
            reason: format!("{len} values are not whole rows of {width}"),
        })
    }
}
