//! Concurrency and determinism of [`MoeLayer::apply`]: eight threads calling `apply` on one
//! shared layer at once get bitwise the results of sequential calls, and the results do not
//! depend on the rayon pool size (local pools of 1, 2 and 3 threads; the global pool is never
//! configured). The layer is large enough that the kernels split their work across threads.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use std::sync::{Arc, Barrier};

use half::bf16;
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_router::Logits;
use moe_testutil::SplitMix64;

const E: usize = 8;
const H: usize = 256;
const I: usize = 128;

/// The test layer; `tag` names a directory of its own (tests run in parallel).
fn layer(tag: &str) -> MoeLayer {
    let dir = checkpoint_support::temp_dir(tag);
    checkpoint_support::runnable_w4a8(E, H, I, 64, 0xc0c0).write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    MoeLayer::from_checkpoint(&ckpt, 0, 32).unwrap()
}

/// The inputs of call `n`: a different token count and content per call (up to 70 tokens, so
/// some calls are cut into several `max_tokens` pieces).
fn inputs(layer: &MoeLayer, n: u64) -> (Vec<bf16>, Vec<bf16>) {
    let mut rng = SplitMix64::new(1000 + n);
    let tokens = 1 + (n as usize * 13) % 70;
    let x: Vec<bf16> = rng
        .vec_uniform(tokens * H, -2.0, 2.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let logits = layer
        .router_logits(&x)
        .unwrap()
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    (x, logits)
}

fn apply(layer: &MoeLayer, x: &[bf16], logits: &[bf16]) -> Vec<u16> {
    let mut out = vec![bf16::ZERO; x.len()];
    layer.apply(x, Logits::Bf16(logits), &mut out).unwrap();
    out.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn eight_threads_on_one_layer_match_sequential_calls() {
    let layer = Arc::new(layer("concurrency-threads"));
    const THREADS: u64 = 8;
    const CALLS: u64 = 6;
    let inputs: Vec<_> = (0..THREADS * CALLS).map(|n| inputs(&layer, n)).collect();
    let sequential: Vec<Vec<u16>> = inputs.iter().map(|(x, l)| apply(&layer, x, l)).collect();
    let inputs = Arc::new(inputs);
    let start = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (layer, inputs, start) = (layer.clone(), inputs.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                // Each thread walks the calls in its own order, so different calls overlap.
                (0..CALLS)
                    .map(|c| {
                        let n = ((t + c * 3) % (THREADS * CALLS)) as usize;
                        (n, apply(&layer, &inputs[n].0, &inputs[n].1))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for (n, got) in h.join().expect("a thread panicked") {
            assert!(
                got == sequential[n],
                "call {n} differs from its sequential result"
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_the_rayon_pool_size() {
    let layer = layer("concurrency-pools");
    let calls: Vec<_> = (0..5).map(|n| inputs(&layer, 40 + n)).collect();
    let run_in = |threads: usize| -> Vec<Vec<u16>> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| calls.iter().map(|(x, l)| apply(&layer, x, l)).collect())
    };
    let one = run_in(1);
    for threads in [2, 3] {
        assert!(
            run_in(threads) == one,
            "{threads} rayon threads differ from 1"
        );
    }
}
