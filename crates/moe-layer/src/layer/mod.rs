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
//! GEMM (bf16 kept as bf16, on the bf16 path from its row count on), and symmetric WNA16 (GPTQ
//! or compressed-tensors pack-quantized, 4 or 8 bits, act-order) packed into our panels for
//! the native WNA16 kernels (the CPU Marlin executor remains the fallback when `cpu-wna16` is
//! disabled), and gpt-oss's MXFP4 experts (loaded from a checkpoint's fused tensors, on the
//! same native kernels, gate/up rows interleaved, router linear with a bias). Shared experts
//! (DeepSeek, Qwen2-MoE with its sigmoid gate) run as a nested one-expert layer added to the
//! routed output. Expert biases (`w13` and `w2`, as gpt-oss has them) are added inside each
//! expert, the `w2` bias on tensor-parallel rank 0 only.
//!
//! This module holds the layer, its states and its accessors; each stage of the lifecycle has
//! a module of its own: `load` (the `load_*` methods and their checks), `process` (packing
//! and the backend choice) and `apply` (routing and the `apply` family).

mod apply;
mod backend;
mod config;
mod fp8;
#[cfg(feature = "checkpoint")]
mod from_checkpoint;
mod load;
mod marlin;
mod online;
mod params;
mod process;
mod scratch;
mod wna16;

use moe_kernels::marlin::MarlinWeights;
use moe_kernels::moe::MoeFloat;
use moe_kernels::{
    FusedMoe, MoeInput, MoeScratch, PackedDense, PackedW4A8, PackedW8A8, PackedWna16, Par,
};
use moe_oracle::Selection;
use moe_router::Router;

#[cfg(feature = "checkpoint")]
pub use config::router_from_spec;
pub use config::{
    Fp8Scaling, LayerQuant, MoeLayerConfig, SharedExperts, Wna16Activations, linear_expert_map,
    vllm_cpu_softmax_router,
};
#[cfg(feature = "checkpoint")]
pub use from_checkpoint::{LoadOptions, LoadProgress};
pub use params::{ExpertShard, TensorData, TensorKind, TensorView};

use crate::LayerError;
use params::Params;
use scratch::ScratchPool;

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
    /// `w8a8_gemm: avx512-vnni below 16 rows, amx from 16`).
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

    /// The processed state, or why there is none.
    fn ready(&self) -> Result<&Ready, LayerError> {
        match &self.state {
            State::Ready(r) => Ok(r),
            State::Loading(_) => Err(LayerError::NotProcessed),
            State::Unusable(reason) => Err(LayerError::Unusable {
                reason: reason.clone(),
            }),
        }
    }
}
