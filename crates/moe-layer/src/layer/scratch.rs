//! The working memory of one `apply` call, pooled by the layer so that calls in steady state
//! allocate nothing: the experts' scratch, the routing result with the router's scratch, the
//! router gate's input and logits, and the shared experts' gates, ids and output.

use std::any::Any;
use std::sync::Mutex;

use half::{bf16, f16};
use moe_kernels::MoeScratch;
use moe_router::RouterScratch;

/// One call's buffers; they only grow, so a scratch that has served the largest call serves
/// every later one without allocating.
#[derive(Debug)]
pub(super) struct CallScratch {
    /// The fused experts' scratch, sized for the layer's `max_tokens`.
    pub(super) moe: MoeScratch,
    /// The router's working memory.
    pub(super) router: RouterScratch,
    /// Global expert ids `[T, k]` chosen by the router.
    pub(super) ids: Vec<i32>,
    /// Their weights `[T, k]`.
    pub(super) weights: Vec<f32>,
    /// The shared experts' buffers.
    pub(super) shared: SharedScratch,
    /// The router gate's buffers.
    pub(super) gate: GateScratch,
}

impl CallScratch {
    pub(super) fn new(moe: MoeScratch, router: RouterScratch) -> Self {
        Self {
            moe,
            router,
            ids: Vec::new(),
            weights: Vec::new(),
            shared: SharedScratch::default(),
            gate: GateScratch::default(),
        }
    }
}

/// The router gate's input widened to f32 and its logits `[T, E]`, in f32 and rounded to the
/// model dtype (the router reads logits in the dtype a model would hand it).
#[derive(Debug, Default)]
pub(super) struct GateScratch {
    /// `x` widened to f32 `[T, H]`.
    pub(super) wide: Vec<f32>,
    /// `x · gateᵀ` `[T, E]`, rounded to the model dtype.
    pub(super) logits: Vec<f32>,
    /// The logits as bf16, for bf16 models.
    pub(super) bf16: Vec<bf16>,
    /// The logits as f16, for f16 models.
    pub(super) f16: Vec<f16>,
}

/// The shared experts' per-token gates and ids and their output.
#[derive(Debug, Default)]
pub(super) struct SharedScratch {
    /// Per-token gates (1, or the Qwen2-MoE sigmoid gate).
    pub(super) gates: Vec<f32>,
    /// Ids, all 0: the shared experts are the one expert of their own layer.
    pub(super) ids: Vec<i32>,
    /// The output, a `Vec<X>` of the call's element type ([`typed_zeros`]).
    pub(super) out: Option<Box<dyn Any + Send>>,
}

/// `slot`'s buffer as `len` copies of `zero`, reusing the buffer of the previous call when it
/// held the same element type (always, for a host with one model dtype).
pub(super) fn typed_zeros<X: Copy + Send + 'static>(
    slot: &mut Option<Box<dyn Any + Send>>,
    len: usize,
    zero: X,
) -> &mut [X] {
    if !slot.as_ref().is_some_and(|b| b.is::<Vec<X>>()) {
        *slot = Some(Box::new(Vec::<X>::new()));
    }
    let buf = slot
        .as_mut()
        .and_then(|b| b.downcast_mut::<Vec<X>>())
        .expect("the slot was just given a Vec<X>");
    buf.clear();
    buf.resize(len, zero);
    buf
}

/// The pool of call scratches: a call takes one (or makes one when all are in use) and puts it
/// back when done, so the pool holds as many as calls ever ran at once.
#[derive(Debug, Default)]
pub(super) struct ScratchPool(Mutex<Vec<CallScratch>>);

impl ScratchPool {
    pub(super) fn with(first: CallScratch) -> Self {
        Self(Mutex::new(vec![first]))
    }

    /// A scratch from the pool, if one is free.
    pub(super) fn take(&self) -> Option<CallScratch> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// Returns a scratch to the pool.
    pub(super) fn put(&self, scratch: CallScratch) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(scratch);
    }
}
