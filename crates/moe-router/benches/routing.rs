//! Criterion benches of routing throughput (tokens per second): the CPU softmax top-k with
//! E = 128, k = 8, and the DeepSeek-V3 grouped top-k with bias (E = 256, k = 8, 8 groups, 4 kept),
//! each for M = 1, 64 and 1024 tokens of f32 and bf16 logits.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_router::{
    Grouping, IdsOut, Logits, RoundingProfile, Router, RouterConfig, ScalingPlacement, ScoringFunc,
};
use moe_testutil::SplitMix64;
use std::hint::black_box;

const TOKENS: [usize; 3] = [1, 64, 1024];

fn bench_router(c: &mut Criterion, group_name: &str, routers: &[(&str, Router)]) {
    let mut group = c.benchmark_group(group_name);
    let mut rng = SplitMix64::new(42);
    for (label, router) in routers {
        let e = router.config().num_experts;
        let k = router.config().top_k;
        let mut scratch = router.new_scratch();
        for m in TOKENS {
            let logits = rng.vec_uniform(m * e, -3.0, 3.0);
            let logits_bf16: Vec<bf16> = logits.iter().map(|&v| bf16::from_f32(v)).collect();
            let mut weights = vec![0f32; m * k];
            let mut ids = vec![0i32; m * k];
            group.throughput(Throughput::Elements(m as u64));
            group.bench_function(BenchmarkId::new(format!("{label}/f32"), m), |b| {
                b.iter(|| {
                    router
                        .route_into(
                            Logits::F32(black_box(&logits)),
                            &mut weights,
                            IdsOut::I32(&mut ids),
                            &mut scratch,
                        )
                        .unwrap()
                })
            });
            group.bench_function(BenchmarkId::new(format!("{label}/bf16"), m), |b| {
                b.iter(|| {
                    router
                        .route_into(
                            Logits::Bf16(black_box(&logits_bf16)),
                            &mut weights,
                            IdsOut::I32(&mut ids),
                            &mut scratch,
                        )
                        .unwrap()
                })
            });
        }
    }
    group.finish();
}

fn softmax(c: &mut Criterion) {
    let config = RouterConfig::cpu_softmax(128, 8).with_renormalize(true);
    let routers = [
        ("e128_k8", Router::new(config.clone()).unwrap()),
        (
            "e128_k8_torch_eager",
            Router::new(config.with_rounding(RoundingProfile::TorchEager)).unwrap(),
        ),
    ];
    bench_router(c, "route/softmax", &routers);
}

fn grouped_bias(c: &mut Criterion) {
    let mut rng = SplitMix64::new(7);
    let config = RouterConfig::grouped_topk(256, 8, ScoringFunc::Sigmoid, Grouping::new(8, 4))
        .with_renormalize(true)
        .with_correction_bias(rng.vec_uniform(256, -0.1, 0.1))
        .with_routed_scaling(2.5, ScalingPlacement::OnWeights);
    bench_router(
        c,
        "route/grouped_bias",
        &[("e256_k8_g8_tg4", Router::new(config).unwrap())],
    );
}

criterion_group!(benches, softmax, grouped_bias);
criterion_main!(benches);
