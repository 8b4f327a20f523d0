//! [`MoeLayer`]: the lifecycle of one MoE layer (spec section 7.8): `create` allocates the
//! parameters with their local shapes, `load_*` writes checkpoint tensors into them (cutting the
//! tensor-parallel shard), `process` packs them for our kernels and picks the backend through
//! moe-oracle, and `apply` routes and runs the experts.
//!
//! States: loading → processed, or unusable after any failed load or process (a half-written
//! layer must never compute). `process` is idempotent. Both `apply` forms take `&self` and may be
//! called from many threads at once: each call takes a scratch (kernel scratch, routing
//! buffers, router scratch, shared-expert buffers) from a small mutex-protected pool, making
//! one when the pool is empty, and returns it afterwards, so steady-state calls allocate
//! nothing. Results do not depend on the number of threads or of concurrent calls.
//!
//! Supported today: compressed-tensors W4A8 (int4 codes stored as int8, channelwise or group
//! scales) on the packed W4A8 kernels, vLLM's online int8 method (float weights quantized per
//! row in `process`) on the W8A8 kernels, and unquantized bf16/f16/f32 experts on the dense
//! f32-compute GEMM (bf16 kept as bf16), and symmetric WNA16 (GPTQ or compressed-tensors
//! pack-quantized, 4 or 8 bits, act-order) packed into our panels for the native WNA16 kernels
//! (the CPU Marlin executor remains the fallback when `cpu-wna16` is disabled), and gpt-oss's
//! MXFP4 experts (loaded from a checkpoint's fused tensors, on the same native kernels, gate/up
//! rows interleaved, router linear with a bias). Shared experts (DeepSeek, Qwen2-MoE with its sigmoid gate) run as a
//! nested one-expert layer added to the routed output. Expert biases (`w13` and `w2`, as gpt-oss
//! has them) are added inside each expert, the `w2` bias on tensor-parallel rank 0 only.

mod backend;
mod config;
mod fp8;
#[cfg(feature = "checkpoint")]
mod from_checkpoint;
mod marlin;
mod online;
mod params;
mod scratch;
mod wna16;

use half::{bf16, f16};
use moe_kernels::marlin::MarlinWeights;
use moe_kernels::moe::MoeFloat;
use moe_kernels::{
    FusedMoe, FusedMoeConfig, MoeInput, MoeScratch, PackedDense, PackedExperts, PackedW4A8,
    PackedW8A8, PackedWna16, Par, W4A8Scales,
};
use moe_oracle::Selection;
use moe_quant::DType;
use moe_router::{IdsOut, Logits, Router, RouterScratch};

#[cfg(feature = "checkpoint")]
pub use config::router_from_spec;
pub use config::{
    LayerQuant, MoeLayerConfig, SharedExperts, Wna16Activations, linear_expert_map,
    vllm_cpu_softmax_router,
};
#[cfg(feature = "checkpoint")]
pub use from_checkpoint::{LoadOptions, LoadProgress};
pub use params::{ExpertShard, TensorData, TensorKind, TensorView};

use crate::LayerError;
use moe_kernels::par;
use params::Params;
use scratch::{CallScratch, GateScratch, ScratchPool, SharedScratch, typed_zeros};

/// What a processed layer runs on, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The oracle's backend (`"cpu"`, ...).
    pub backend: String,
    /// The kernel and its rung (`"cpu-int4-w4a8/avx512-vnni"`).
    pub kernel: String,
    /// The ISA rung of the kernel set the experts call (`portable` for the CPU Marlin
    /// executor, which calls none).
    pub isa: String,
    /// What that kernel set runs per operation, numerics choices included (e.g.
    /// `w4a8_gemm: avx512-vnni below 32 rows, amx from 32`).
    pub ops: Vec<String>,
}

/// The packed experts of a processed layer, per weight format.
#[derive(Debug)]
enum Experts {
    W4A8(FusedMoe<PackedW4A8>),
    W8A8(FusedMoe<PackedW8A8>),
    Dense(FusedMoe<PackedDense>),
    Wna16(FusedMoe<MarlinWeights>),
    Wna16Native(FusedMoe<PackedWna16>),
}

impl Experts {
    fn kernels(&self) -> &moe_kernels::KernelSet {
        match self {
            Self::W4A8(m) => m.kernels(),
            Self::W8A8(m) => m.kernels(),
            Self::Dense(m) => m.kernels(),
            Self::Wna16(m) => m.kernels(),
            Self::Wna16Native(m) => m.kernels(),
        }
    }

    fn scratch(
        &self,
        max_tokens: usize,
        top_k: usize,
        lanes: usize,
    ) -> Result<MoeScratch, LayerError> {
        Ok(match self {
            Self::W4A8(m) => m.scratch(max_tokens, top_k, lanes)?,
            Self::W8A8(m) => m.scratch(max_tokens, top_k, lanes)?,
            Self::Dense(m) => m.scratch(max_tokens, top_k, lanes)?,
            Self::Wna16(m) => m.scratch(max_tokens, top_k, lanes)?,
            Self::Wna16Native(m) => m.scratch(max_tokens, top_k, lanes)?,
        })
    }

    fn apply<X: MoeFloat>(
        &self,
        input: MoeInput<'_, X, i32>,
        out: &mut [X],
        scratch: &mut MoeScratch,
        par: Par,
    ) -> Result<(), moe_kernels::KernelError> {
        match self {
            Self::W4A8(m) => m.apply(input, out, scratch, par),
            Self::W8A8(m) => m.apply(input, out, scratch, par),
            Self::Dense(m) => m.apply(input, out, scratch, par),
            Self::Wna16(m) => m.apply(input, out, scratch, par),
            Self::Wna16Native(m) => m.apply(input, out, scratch, par),
        }
    }
}

/// A processed layer's kernels and scratch pool.
#[derive(Debug)]
struct Ready {
    moe: Experts,
    selection: Selection,
    pool: ScratchPool,
    lanes: usize,
}

#[derive(Debug)]
enum State {
    Loading(Box<Params>),
    Ready(Box<Ready>),
    Unusable(String),
}

/// One MoE layer on one rank; see the module docs.
#[derive(Debug)]
pub struct MoeLayer {
    cfg: MoeLayerConfig,
    router: Router,
    /// Gate weight `[E, H]`, widened to f32 and packed for the dense GEMM, when loaded
    /// (needed only to route from hidden states; `apply` takes logits).
    router_weight: Option<PackedDense>,
    /// The router linear's bias `[E]` (gpt-oss), when the config has one and it is loaded.
    router_bias: Option<Vec<f32>>,
    /// How `apply` spreads its work over threads.
    par: Par,
    /// The shared experts as a one-expert layer of their own, and the Qwen2-MoE sigmoid gate
    /// weight `[H]` when they are gated.
    shared: Option<Box<MoeLayer>>,
    shared_gate: Option<Vec<f32>>,
    state: State,
}

impl MoeLayer {
    /// Validates `cfg` and allocates zeroed parameters with local shapes: `w13`
    /// `[E_local, 2I/tp, H]`, `w2` `[E_local, H, I/tp]` and their scales.
    pub fn create(cfg: MoeLayerConfig) -> Result<Self, LayerError> {
        cfg.validate()?;
        let router = Router::new(cfg.router.clone())?;
        let params = Params::create(&cfg);
        let shared = match cfg.shared_view() {
            Some(view) => Some(Box::new(Self::create(view)?)),
            None => None,
        };
        Ok(Self {
            cfg,
            router,
            router_weight: None,
            router_bias: None,
            par: Par::Rayon,
            shared,
            shared_gate: None,
            state: State::Loading(Box::new(params)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MoeLayerConfig {
        &self.cfg
    }

    /// How `apply` uses threads: [`Par::Rayon`] (the default) splits each call over the
    /// *current* rayon pool, which is the pool of the caller's `ThreadPool::install` closure
    /// when there is one and rayon's global pool otherwise; [`Par::Seq`] runs every call on
    /// the calling thread only, for hosts that schedule their own threads. The library never
    /// builds or configures the global pool. Results are identical either way.
    pub fn set_parallelism(&mut self, par: Par) {
        self.par = par;
        if let Some(shared) = self.shared.as_mut() {
            shared.set_parallelism(par);
        }
    }

    /// How `apply` uses threads; see [`Self::set_parallelism`].
    pub fn parallelism(&self) -> Par {
        self.par
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Whether `process` has succeeded.
    pub fn is_processed(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// The chosen backend and kernel, once processed.
    pub fn backend(&self) -> Option<BackendInfo> {
        match &self.state {
            State::Ready(r) => Some(BackendInfo {
                backend: r.selection.backend.value().to_string(),
                kernel: r.selection.kernel.to_string(),
                isa: match r.moe {
                    // The Marlin executor is portable code; the kernel set is not called.
                    Experts::Wna16(_) => "portable".to_string(),
                    _ => r.moe.kernels().isa().name().to_string(),
                },
                ops: r.moe.kernels().describe_ops(),
            }),
            _ => None,
        }
    }

    /// The parameters while loading, or why there are none.
    fn params_mut(&mut self) -> Result<&mut Params, LayerError> {
        match &mut self.state {
            State::Loading(p) => Ok(p),
            State::Ready(_) => Err(LayerError::AlreadyProcessed),
            State::Unusable(reason) => Err(LayerError::Unusable {
                reason: reason.clone(),
            }),
        }
    }

    /// Runs a load step; any failure leaves the layer unusable.
    fn guarded<T>(
        &mut self,
        step: impl FnOnce(&MoeLayerConfig, &mut Params) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        let cfg = self.cfg.clone();
        let params = self.params_mut()?;
        let result = step(&cfg, params);
        if let Err(e) = &result {
            self.state = State::Unusable(e.to_string());
        }
        result
    }

    /// Loads one whole checkpoint tensor of global expert `expert` (vLLM's `weight_loader`,
    /// spec 6.3): experts of other ranks are skipped; `w1`/`w3` keep rows
    /// `[r·I, (r+1)·I)` and land in rows `0..I` / `I..2I` of `w13`; `w2` keeps columns
    /// `[r·I, (r+1)·I)` (group scales `[r·I/g, (r+1)·I/g)`, channelwise scales whole).
    /// Weights are i8 int4 codes; scales f32, bf16 or f16. A wrong shape, dtype or value is
    /// a typed error naming the tensor, and leaves the layer unusable.
    pub fn load_expert_tensor(
        &mut self,
        expert: usize,
        shard: ExpertShard,
        kind: TensorKind,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        self.guarded(|cfg, p| {
            if cfg.quant == LayerQuant::Fp8Block {
                return Err(fp8::not_by_name(view.name));
            }
            p.load_expert_tensor(cfg, expert, shard, kind, view)
        })
    }

    /// Loads one whole checkpoint tensor of the shared experts (the fused shared MLP as one
    /// expert: `w1`/`w3` `[I_shared, H]`, `w2` `[H, I_shared]`, sliced for tensor parallelism
    /// like the routed experts). A layer without shared experts refuses it.
    pub fn load_shared_expert_tensor(
        &mut self,
        shard: ExpertShard,
        kind: TensorKind,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        let result = match self.shared.as_mut() {
            Some(shared) => shared.load_expert_tensor(0, shard, kind, view),
            None => Err(LayerError::InvalidArgument {
                field: "shared_experts",
                reason: format!("{}: the layer has no shared experts", view.name),
            }),
        };
        if let Err(e) = &result {
            self.state = State::Unusable(e.to_string());
        }
        result
    }

    /// Sets the sigmoid gate of gated shared experts (Qwen2-MoE `shared_expert_gate` `[1, H]`).
    pub fn load_shared_expert_gate(&mut self, weight: &[f32]) -> Result<(), LayerError> {
        let result = self.check_shared_gate(weight);
        match &result {
            Ok(()) => self.shared_gate = Some(weight.to_vec()),
            Err(e) => self.state = State::Unusable(e.to_string()),
        }
        result
    }

    fn check_shared_gate(&self, weight: &[f32]) -> Result<(), LayerError> {
        self.params_ref()?;
        if !self.cfg.shared_experts.is_some_and(|s| s.gated) {
            return Err(LayerError::InvalidArgument {
                field: "shared_expert_gate",
                reason: "the layer has no gated shared experts".into(),
            });
        }
        check_values(
            "shared_expert_gate.weight",
            weight,
            &[1, self.cfg.hidden],
            "gate weights must be finite",
        )
    }

    /// Like [`Self::params_mut`], for checks that only need the state.
    fn params_ref(&self) -> Result<(), LayerError> {
        match &self.state {
            State::Loading(_) => Ok(()),
            State::Ready(_) => Err(LayerError::AlreadyProcessed),
            State::Unusable(reason) => Err(LayerError::Unusable {
                reason: reason.clone(),
            }),
        }
    }

    /// Sets the router's gate weight `[E, H]` (used by [`Self::route_hidden`]). A wrong size
    /// or a non-finite value leaves the layer unusable, like any failed load.
    pub fn load_router_weight(&mut self, weight: &[f32]) -> Result<(), LayerError> {
        let result = self.check_router_weight(weight);
        match result {
            Ok(()) => {
                let (e, h) = (self.cfg.num_experts, self.cfg.hidden);
                match PackedDense::pack_f32(e, h, weight) {
                    Ok(w) => self.router_weight = Some(w),
                    Err(err) => {
                        let err = LayerError::from(err);
                        self.state = State::Unusable(err.to_string());
                        return Err(err);
                    }
                }
            }
            Err(ref e) => self.state = State::Unusable(e.to_string()),
        }
        result
    }

    /// Sets the router linear's bias `[E]` (gpt-oss), added to the logits
    /// [`Self::route_hidden`] computes. A wrong size, a non-finite value or a layer whose
    /// config says its router has no bias leaves the layer unusable.
    pub fn load_router_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        let result = self.check_router_bias(bias);
        match result {
            Ok(()) => self.router_bias = Some(bias.to_vec()),
            Err(ref e) => self.state = State::Unusable(e.to_string()),
        }
        result
    }

    fn check_router_bias(&self, bias: &[f32]) -> Result<(), LayerError> {
        self.params_ref()?;
        if !self.cfg.router_has_bias {
            return Err(LayerError::InvalidArgument {
                field: "router.bias",
                reason: "the layer's router has no bias (router_has_bias is false)".into(),
            });
        }
        check_values(
            "router.bias",
            bias,
            &[self.cfg.num_experts],
            "router biases must be finite",
        )
    }

    /// Sets the router's `e_score_correction_bias` `[E]` (DeepSeek-V3 style grouped routing;
    /// it steers selection only). A wrong size or a non-finite value leaves the layer unusable.
    pub fn load_router_correction_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        let result = self.install_correction_bias(bias);
        if let Err(e) = &result {
            self.state = State::Unusable(e.to_string());
        }
        result
    }

    fn install_correction_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        self.params_mut()?;
        check_values(
            "router.e_score_correction_bias",
            bias,
            &[self.cfg.num_experts],
            "the correction bias must be finite",
        )?;
        let router_cfg = self.cfg.router.clone().with_correction_bias(bias.to_vec());
        self.router = Router::new(router_cfg.clone())?;
        self.cfg.router = router_cfg;
        self.cfg.router_bias_pending = false;
        Ok(())
    }

    fn check_router_weight(&self, weight: &[f32]) -> Result<(), LayerError> {
        check_values(
            "router.weight",
            weight,
            &[self.cfg.num_experts, self.cfg.hidden],
            "router weights must be finite",
        )
    }

    /// Checks that every parameter was loaded, packs the experts for the W4A8 kernels (bf16
    /// group scales) or quantizes them per row for the W8A8 kernels (online int8), selects the backend through moe-oracle, frees the unpacked tensors and
    /// readies the scratch pool. Idempotent; a failure leaves the layer unusable.
    pub fn process(&mut self) -> Result<(), LayerError> {
        let params = match std::mem::replace(
            &mut self.state,
            State::Unusable("process did not finish".into()),
        ) {
            State::Loading(p) => p,
            ready @ State::Ready(_) => {
                self.state = ready;
                return Ok(());
            }
            State::Unusable(reason) => {
                self.state = State::Unusable(reason.clone());
                return Err(LayerError::Unusable { reason });
            }
        };
        if let Err(e) = self.process_shared() {
            self.state = State::Unusable(e.to_string());
            return Err(e);
        }
        match self.build(&params) {
            Ok(ready) => {
                self.state = State::Ready(Box::new(ready));
                Ok(())
            }
            Err(e) => {
                self.state = State::Unusable(e.to_string());
                Err(e)
            }
        }
    }

    /// Processes the shared experts' layer; their missing tensors are named under
    /// `shared_experts.`.
    fn process_shared(&mut self) -> Result<(), LayerError> {
        let Some(shared) = self.shared.as_mut() else {
            return Ok(());
        };
        let mut missing = Vec::new();
        if self.cfg.shared_experts.is_some_and(|s| s.gated) && self.shared_gate.is_none() {
            missing.push("shared_expert_gate.weight".to_string());
        }
        match shared.process() {
            Ok(()) => {}
            Err(LayerError::MissingParams { missing: m }) => {
                missing.extend(m.into_iter().map(|name| format!("shared_experts.{name}")));
            }
            Err(e) => return Err(e),
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(LayerError::MissingParams { missing })
        }
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

    fn build(&self, params: &Params) -> Result<Ready, LayerError> {
        let mut missing = params.missing();
        if self.cfg.router_bias_pending {
            missing.push("router.e_score_correction_bias".into());
        }
        if self.cfg.router_has_bias && self.router_bias.is_none() {
            missing.push("router.bias".into());
        }
        if !missing.is_empty() {
            return Err(LayerError::MissingParams { missing });
        }
        let cfg = &self.cfg;
        let (h, i) = (cfg.hidden, cfg.intermediate_per_rank());
        let (selection, kernels) = backend::select(cfg, &self.router)?;
        let moe_cfg = self.fused_config();
        let (b13, b2) = params.expert_biases(cfg.tp_rank);
        let moe = match cfg.quant {
            LayerQuant::W4A8 { group_size } => {
                let (w13, w2) = pack_w4a8(params, group_size, h, i, self.par)?;
                Experts::W4A8(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Int8Online => {
                let (w13, w2) = online::quantize_and_pack(params, h, i)?;
                Experts::W8A8(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 { group_size, .. } if cfg.wna16_on_w4a8() => {
                // Symmetric int4 codes are stored signed (`q − 8`), the W4A8 kernels' values.
                let (w13, w2) = pack_w4a8(params, group_size, h, i, self.par)?;
                Experts::W4A8(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 {
                bits,
                group_size,
                act_order,
                zero_points,
            } if selection.kernel.id == moe_oracle::KernelId::CpuWna16 => {
                let shape = wna16::LayerShape {
                    bits,
                    group_size,
                    act_order,
                    zero_points,
                    h,
                    i,
                };
                let (w13, w2) = wna16::pack_layer(params, &shape, self.par)?;
                Experts::Wna16Native(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 {
                zero_points: true, ..
            } => {
                // Marlin's CPU executor applies the implicit symmetric zero only.
                return Err(LayerError::InvalidArgument {
                    field: "quant",
                    reason: format!(
                        "WNA16 weights with zero points run on the cpu-wna16 kernel only, \
                         and {} was selected",
                        selection.kernel.id.name()
                    ),
                });
            }
            LayerQuant::Wna16 {
                bits,
                group_size,
                act_order,
                ..
            } => {
                let (w13, w2) = marlin::repack_layer(params, bits, group_size, act_order, h, i)?;
                Experts::Wna16(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Mxfp4 if selection.kernel.id == moe_oracle::KernelId::CpuWna16 => {
                let (w13, w2) = wna16::pack_mxfp4_layer(params, h, i, self.par)?;
                Experts::Wna16Native(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Mxfp4 => {
                return Err(LayerError::InvalidArgument {
                    field: "quant",
                    reason: format!(
                        "MXFP4 weights run on the cpu-wna16 kernel only, and {} was selected",
                        selection.kernel.id.name()
                    ),
                });
            }
            LayerQuant::Fp8Block => return Err(fp8::not_by_name("the expert weights")),
            LayerQuant::Unquantized => {
                let (w13, w2) = pack_dense(params, h, i)?;
                Experts::Dense(fused_pipeline((w13, w2), (&b13, &b2), &moe_cfg, kernels)?)
            }
        };
        self.ready_with(moe, selection)
    }

    /// The fused-MoE configuration of this layer's experts.
    fn fused_config(&self) -> FusedMoeConfig {
        let cfg = &self.cfg;
        FusedMoeConfig {
            hidden_size: cfg.hidden,
            intermediate_size: cfg.intermediate_per_rank(),
            activation: cfg.activation,
            gate_up_layout: cfg.gate_up_layout,
            apply_router_weight_on_input: self.router.apply_router_weight_on_input(),
            global_num_experts: cfg.num_experts,
            expert_map: cfg.expert_map.clone(),
        }
    }

    /// The processed state around packed experts: the scratch pool with its first scratch.
    fn ready_with(&self, moe: Experts, selection: Selection) -> Result<Ready, LayerError> {
        let cfg = &self.cfg;
        let lanes = std::thread::available_parallelism().map_or(1, |n| n.get());
        // One scratch up front so that the first call does not allocate it.
        let first = CallScratch::new(
            moe.scratch(cfg.max_tokens, cfg.top_k, lanes)?,
            self.router.new_scratch(),
        );
        Ok(Ready {
            moe,
            selection,
            pool: ScratchPool::with(first),
            lanes,
        })
    }

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

    fn ready(&self) -> Result<&Ready, LayerError> {
        match &self.state {
            State::Ready(r) => Ok(r),
            State::Loading(_) => Err(LayerError::NotProcessed),
            State::Unusable(reason) => Err(LayerError::Unusable {
                reason: reason.clone(),
            }),
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
        if out.len() != hidden_states.len() {
            return Err(LayerError::InvalidArgument {
                field: "out",
                reason: format!(
                    "{} values, hidden_states has {}",
                    out.len(),
                    hidden_states.len()
                ),
            });
        }
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
        if out.len() != hidden_states.len() {
            return Err(LayerError::InvalidArgument {
                field: "out",
                reason: format!(
                    "{} values, hidden_states has {}",
                    out.len(),
                    hidden_states.len()
                ),
            });
        }
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
}

/// The fused pipeline of one format's packed stacks with the layer's expert biases,
/// configuration and kernels: the same for every format.
fn fused_pipeline<W: moe_kernels::moe::ExpertMatrix>(
    (w13, w2): Stacks<W>,
    (b13, b2): (&Option<Vec<f32>>, &Option<Vec<f32>>),
    cfg: &FusedMoeConfig,
    kernels: moe_kernels::KernelSet,
) -> Result<FusedMoe<W>, LayerError> {
    Ok(FusedMoe::new(
        PackedExperts {
            w13,
            w2,
            w13_bias: b13.clone(),
            w2_bias: b2.clone(),
        },
        cfg.clone(),
        kernels,
    )?)
}

/// Packs the int4 experts (bf16 group scales or f32 channel scales) for the W4A8 kernels,
/// experts spread over threads as `par` allows (each expert is packed the same either way).
type Stacks<W> = (Vec<W>, Vec<W>);
fn pack_w4a8(
    params: &Params,
    group_size: Option<usize>,
    h: usize,
    i: usize,
    par: Par,
) -> Result<Stacks<PackedW4A8>, LayerError> {
    let quant = LayerQuant::W4A8 { group_size };
    let e = params.w2.len() / (h * i);
    let pack = |w: &[i8], s: &[f32], n: usize, k: usize| -> Result<PackedW4A8, LayerError> {
        Ok(match group_size {
            None => PackedW4A8::pack(n, k, w, W4A8Scales::Channelwise(s), None)?,
            Some(g) => {
                let scales: Vec<bf16> = s.iter().map(|&v| bf16::from_f32(v)).collect();
                PackedW4A8::pack(
                    n,
                    k,
                    w,
                    W4A8Scales::Grouped {
                        group_size: g,
                        scales: &scales,
                    },
                    None,
                )?
            }
        })
    };
    let (s13, s2) = (quant.scale_cols(h), quant.scale_cols(i));
    let experts = par::map_indexed(e, par, |x| {
        let w13 = pack(
            &params.w13[x * 2 * i * h..][..2 * i * h],
            &params.w13_scale[x * 2 * i * s13..][..2 * i * s13],
            2 * i,
            h,
        )?;
        let w2 = pack(
            &params.w2[x * h * i..][..h * i],
            &params.w2_scale[x * h * s2..][..h * s2],
            h,
            i,
        )?;
        Ok((w13, w2))
    });
    experts
        .into_iter()
        .collect::<Result<Vec<_>, LayerError>>()
        .map(|v| v.into_iter().unzip())
}

/// Checks a router-side parameter (gate weight, biases, shared-expert gate): `shape`'s element
/// count, then that every value is finite; errors name `tensor`.
fn check_values(
    tensor: &str,
    values: &[f32],
    shape: &[usize],
    reason: &'static str,
) -> Result<(), LayerError> {
    if values.len() != shape.iter().product::<usize>() {
        return Err(LayerError::ParamShape {
            tensor: tensor.into(),
            expected: shape.to_vec(),
            actual: vec![values.len()],
        });
    }
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(LayerError::ParamValue {
            tensor: tensor.into(),
            index,
            value: f64::from(values[index]),
            reason,
        });
    }
    Ok(())
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

/// Packs unquantized experts for the dense GEMM: bf16 weights stay bf16 (exact, half the
/// bytes), f16 and f32 become f32 (exact).
fn pack_dense(params: &Params, h: usize, i: usize) -> Result<Stacks<PackedDense>, LayerError> {
    let e = params.w2_f.len() / (h * i);
    let keep_bf16 = params.float_dtype == Some(DType::BF16);
    let pack = |w: &[f32], n: usize, k: usize| -> Result<PackedDense, LayerError> {
        Ok(if keep_bf16 {
            let narrow: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            PackedDense::pack_bf16(n, k, &narrow)?
        } else {
            PackedDense::pack_f32(n, k, w)?
        })
    };
    let mut w13 = Vec::with_capacity(e);
    let mut w2 = Vec::with_capacity(e);
    for x in 0..e {
        w13.push(pack(&params.w13_f[x * 2 * i * h..][..2 * i * h], 2 * i, h)?);
        w2.push(pack(&params.w2_f[x * h * i..][..h * i], h, i)?);
    }
    Ok((w13, w2))
}
