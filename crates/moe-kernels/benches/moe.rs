//! The fused W4A8 expert pipeline at a small Qwen3-like shape (E = 128, k = 8, H = 2048,
//! I = 768, group 128), M = 1 and 16 tokens, on each SIMD rung this CPU has.
//!
//! Groups are `"fused_moe_w4a8/{isa}"`, cases `BenchmarkId::new(isa, "M{m}_{par}")`;
//! throughput is counted in multiply-accumulates (`M·k·3·H·I`). `seq` runs on one thread;
//! `rayon2` runs inside a 2-thread pool (experts in 2 lanes, GEMM panels split further).
//! Routing: k distinct random experts per token, fixed seed.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_kernels::{
    Activation, FusedMoe, FusedMoeConfig, GateUpLayout, Isa, KernelSet, MoeInput, PackedExperts,
    PackedW4A8, Par, W4A8Scales,
};
use moe_testutil::SplitMix64;

const E: usize = 128;
const K: usize = 8;
const H: usize = 2048;
const I: usize = 768;
const GROUP: usize = 128;
const MS: &[usize] = &[1, 16];

fn pack(rng: &mut SplitMix64, n: usize, k: usize) -> PackedW4A8 {
    let w: Vec<i8> = (0..n * k)
        .map(|_| (rng.next_u64() % 16) as i8 - 8)
        .collect();
    let s: Vec<bf16> = (0..n * k / GROUP)
        .map(|_| bf16::from_f32(rng.uniform(0.001, 0.01)))
        .collect();
    let scales = W4A8Scales::Grouped {
        group_size: GROUP,
        scales: &s,
    };
    PackedW4A8::pack(n, k, &w, scales, None).unwrap()
}

/// k distinct experts per token.
fn route(rng: &mut SplitMix64, m: usize) -> (Vec<i32>, Vec<f32>) {
    let mut ids = Vec::with_capacity(m * K);
    for _ in 0..m {
        let mut row: Vec<i32> = Vec::with_capacity(K);
        while row.len() < K {
            let id = rng.below(E) as i32;
            if !row.contains(&id) {
                row.push(id);
            }
        }
        ids.extend(row);
    }
    let weights = rng.vec_uniform(m * K, 0.05, 0.3);
    (ids, weights)
}

fn fused_moe(c: &mut Criterion) {
    let mut rng = SplitMix64::new(3);
    let weights = PackedExperts {
        w13: (0..E).map(|_| pack(&mut rng, 2 * I, H)).collect(),
        w2: (0..E).map(|_| pack(&mut rng, H, I)).collect(),
        w13_bias: None,
        w2_bias: None,
    };
    let config = FusedMoeConfig {
        hidden_size: H,
        intermediate_size: I,
        activation: Activation::SILU,
        gate_up_layout: GateUpLayout::Concatenated,
        apply_router_weight_on_input: false,
        global_num_experts: E,
        expert_map: None,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // The scalar rung needs seconds per call at this shape.
    for isa in moe_kernels::available_isas()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
    {
        let ks = KernelSet::for_isa(isa).unwrap();
        // In the panel order the rung asks for, as a layer packs its experts.
        let order = |w: &Vec<PackedW4A8>| -> Vec<PackedW4A8> {
            w.iter()
                .map(|w| w.clone().with_order(ks.panel_order()))
                .collect()
        };
        let experts = PackedExperts {
            w13: order(&weights.w13),
            w2: order(&weights.w2),
            w13_bias: None,
            w2_bias: None,
        };
        let moe = FusedMoe::new(experts, config.clone(), ks).unwrap();
        let mut group = c.benchmark_group(format!("fused_moe_w4a8/{isa}"));
        group.sample_size(10);
        for &m in MS {
            let x = rng.vec_uniform(m * H, -1.0, 1.0);
            let (ids, gates) = route(&mut rng, m);
            let mut out = vec![0f32; m * H];
            let mut scratch = moe.scratch(m, K, 2).unwrap();
            group.throughput(Throughput::Elements((m * K * 3 * H * I) as u64));
            for (name, par) in [("seq", Par::Seq), ("rayon2", Par::Rayon)] {
                group.bench_function(BenchmarkId::new(isa.name(), format!("M{m}_{name}")), |b| {
                    let mut call = || {
                        let input = MoeInput {
                            tokens: m,
                            top_k: K,
                            x: &x,
                            topk_ids: &ids,
                            topk_weights: &gates,
                        };
                        moe.apply(input, &mut out, &mut scratch, par).unwrap()
                    };
                    if par == Par::Seq {
                        b.iter(&mut call)
                    } else {
                        pool.install(|| b.iter(&mut call))
                    }
                });
            }
        }
        group.finish();
    }
}

criterion_group!(benches, fused_moe);
criterion_main!(benches);
