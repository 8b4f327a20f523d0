//! `MoeLayer::apply`, `apply_with_topk`, `apply_with_gate`, `route` and `route_hidden` allocate
//! nothing in steady state, for every weight format the layer runs (W4A8, online int8 on the
//! W8A8 kernels, WNA16 on its native kernels and on the Marlin executor, dense) and with shared
//! experts: routing buffers, the router's scratch,
//! the gate's logits, the kernels' scratch and the shared experts' buffers all come from the
//! layer's pool. Counted per thread, with the layer on the calling
//! thread (`Par::Seq`), after one call of the largest size.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use checkpoint_support::{Ckpt, Fmt, runnable, runnable_w4a8, temp_dir};
use half::bf16;
use moe_kernels::Par;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{
    DisabledKernels, ExpertShard, LayerQuant, LoadOptions, MoeLayer, MoeLayerConfig, TensorData,
    TensorKind, TensorView,
};
use moe_router::Logits;
use moe_testutil::SplitMix64;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Counts allocations per thread, otherwise the system allocator.
struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments, so `System`'s
// guarantees carry over; the counter is a const-initialised thread-local without destructor,
// which itself never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` (through `alloc`) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as `GlobalAlloc::realloc` requires of our caller, passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const MAX_TOKENS: usize = 16;

fn open(ck: &Ckpt, tag: &str) -> Checkpoint {
    let dir = temp_dir(tag);
    ck.write(&dir);
    Checkpoint::open(&dir, ShardAccess::Read).unwrap()
}

fn loaded(ck: &Ckpt, tag: &str) -> MoeLayer {
    MoeLayer::from_checkpoint(&open(ck, tag), 0, MAX_TOKENS).unwrap()
}

/// A WNA16 layer on the Marlin executor: `cpu-wna16` disabled through the load options.
fn loaded_on_marlin(ck: &Ckpt, tag: &str) -> MoeLayer {
    let disabled = DisabledKernels::parse("cpu-wna16");
    let opts = LoadOptions::new().with_disabled_kernels(&disabled);
    let layer = MoeLayer::from_checkpoint_with(&open(ck, tag), 0, MAX_TOKENS, &opts).unwrap();
    let kernel = layer.backend().unwrap().kernel;
    assert!(kernel.starts_with("cpu-marlin"), "{kernel}");
    layer
}

/// A layer of vLLM's online int8 method (bf16 weights quantized in `process`), with random
/// weights loaded tensor by tensor.
fn online_int8(e: usize, h: usize, i: usize) -> MoeLayer {
    let cfg = MoeLayerConfig::new(e, 2, h, i, LayerQuant::Int8Online).with_max_tokens(MAX_TOKENS);
    let mut layer = MoeLayer::create(cfg).unwrap();
    let mut rng = SplitMix64::new(9);
    for expert in 0..e {
        for (shard, shape) in [
            (ExpertShard::W1, [i, h]),
            (ExpertShard::W3, [i, h]),
            (ExpertShard::W2, [h, i]),
        ] {
            let w: Vec<bf16> = (0..h * i)
                .map(|_| bf16::from_f32(rng.uniform(-0.1, 0.1)))
                .collect();
            let view = TensorView {
                name: "weight",
                shape: &shape,
                data: TensorData::Bf16(&w),
            };
            layer
                .load_expert_tensor(expert, shard, TensorKind::Weight, &view)
                .unwrap();
        }
    }
    layer
        .load_router_weight(&rng.vec_uniform(e * h, -0.1, 0.1))
        .unwrap();
    layer.process().unwrap();
    layer
}

/// Calls of several sizes after a warm-up call of the largest: none may allocate.
fn assert_steady_state_allocates_nothing(name: &str, mut layer: MoeLayer) {
    layer.set_parallelism(Par::Seq);
    let cfg = layer.config().clone();
    let (h, e, k) = (cfg.hidden, cfg.num_experts, cfg.top_k);
    let mut rng = SplitMix64::new(3);
    let mut ids = vec![0i32; MAX_TOKENS * k];
    let mut weights = vec![0f32; MAX_TOKENS * k];
    for (round, t) in [MAX_TOKENS, MAX_TOKENS, 5, 1, 0].into_iter().enumerate() {
        let x: Vec<bf16> = (0..t * h)
            .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
            .collect();
        let logits = rng.vec_uniform(t * e, -2.0, 2.0);
        let mut out = vec![bf16::ZERO; t * h];
        layer
            .route(
                Logits::F32(&logits),
                &mut ids[..t * k],
                &mut weights[..t * k],
            )
            .unwrap();
        let mut counts = Vec::new();
        let mut count = |what: &'static str, call: &mut dyn FnMut()| {
            let before = ALLOCATIONS.with(Cell::get);
            call();
            counts.push((what, ALLOCATIONS.with(Cell::get) - before));
        };
        count("apply", &mut || {
            layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        });
        count("apply_with_topk", &mut || {
            layer
                .apply_with_topk(&x, &ids[..t * k], &weights[..t * k], &mut out)
                .unwrap();
        });
        count("apply_with_gate", &mut || {
            layer.apply_with_gate(&x, &mut out).unwrap();
        });
        count("route", &mut || {
            layer
                .route(
                    Logits::F32(&logits),
                    &mut ids[..t * k],
                    &mut weights[..t * k],
                )
                .unwrap();
        });
        count("route_hidden", &mut || {
            layer
                .route_hidden(&x, &mut ids[..t * k], &mut weights[..t * k])
                .unwrap();
        });
        if round > 0 {
            for (what, n) in counts {
                assert_eq!(n, 0, "{name}: {what} allocated {n} times with T = {t}");
            }
        }
    }
}

#[test]
fn apply_allocates_nothing_in_steady_state() {
    let w4a8 = runnable_w4a8(8, 64, 64, 32, 1);
    assert_steady_state_allocates_nothing("w4a8", loaded(&w4a8, "alloc-w4a8"));
    let wna16 = runnable(Fmt::PackQuantized, [8, 2, 64, 64], 32, 2);
    assert_steady_state_allocates_nothing("wna16", loaded(&wna16, "alloc-wna16"));
    assert_steady_state_allocates_nothing(
        "wna16 on marlin",
        loaded_on_marlin(&wna16, "alloc-wna16-marlin"),
    );
    let (dense, _) = Ckpt::build("qwen3_moe", Fmt::Float, 3);
    assert_steady_state_allocates_nothing("dense", loaded(&dense, "alloc-dense"));
    assert_steady_state_allocates_nothing("int8", online_int8(8, 64, 64));
    let (shared, _) = Ckpt::build("deepseek_v3", Fmt::Float, 4);
    assert_steady_state_allocates_nothing("dense + shared", loaded(&shared, "alloc-shared"));
    let (gated, _) = Ckpt::build("qwen2_moe", Fmt::Float, 5);
    assert_steady_state_allocates_nothing("dense + gated shared", loaded(&gated, "alloc-gated"));
}
