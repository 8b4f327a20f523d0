//! Pool injection: a host runs `apply` inside its own rayon pool (`ThreadPool::install`) or
//! sequentially ([`Par::Seq`]), gets the same bits either way, and the library never touches
//! rayon's global pool. This file holds one test on purpose: it proves the global pool was
//! never built by building it at the end, which only succeeds when nothing in this process
//! created it first.

#![cfg(feature = "checkpoint")]

use half::bf16;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{MoeLayer, Par};
use moe_testutil::{GoldenCase, fixtures_dir};

#[test]
fn apply_runs_on_the_callers_pool_or_sequentially_and_never_builds_the_global_pool() {
    let dir = fixtures_dir().join("qwen3moe-w4a8-g32");
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).expect("fixture checkpoint");
    let layer = ckpt.spec().moe_layers[0];
    let mut moe = MoeLayer::from_checkpoint(&ckpt, layer, 64).expect("layer");
    assert_eq!(
        moe.parallelism(),
        Par::Rayon,
        "the default splits over the current pool"
    );
    let case = GoldenCase::open(&dir.join("expected.safetensors")).expect("expected file");
    // 13 copies of the fixture's 5 tokens, so that the experts have enough rows to split.
    let x: Vec<f32> = case
        .u16_bits("x")
        .into_iter()
        .map(|b| bf16::from_bits(b).to_f32())
        .collect::<Vec<_>>()
        .repeat(13);
    let h = ckpt.spec().hidden;
    let k = ckpt.spec().top_k;
    let t = x.len() / h;
    let (mut ids, mut weights) = (vec![0i32; t * k], vec![0f32; t * k]);
    moe.route_hidden(&x, &mut ids, &mut weights).unwrap();

    let run = |moe: &MoeLayer| {
        let mut out = vec![0f32; x.len()];
        moe.apply_with_topk(&x, &ids, &weights, &mut out).unwrap();
        out
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .expect("local pool");
    let on_pool = pool.install(|| {
        assert_eq!(rayon::current_num_threads(), 3);
        run(&moe)
    });
    // Many host threads sharing one layer inside the same pool.
    let shared: Vec<Vec<f32>> = pool.install(|| {
        use rayon::prelude::*;
        (0..6).into_par_iter().map(|_| run(&moe)).collect()
    });
    moe.set_parallelism(Par::Seq);
    let sequential = run(&moe);

    assert!(on_pool.iter().any(|v| *v != 0.0));
    assert_eq!(on_pool, sequential, "pool and sequential results differ");
    for out in &shared {
        assert_eq!(*out, sequential, "concurrent calls on the pool differ");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global()
        .expect("the global pool was built by someone else than the host");
}
