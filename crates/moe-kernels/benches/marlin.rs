//! Marlin repack throughput and the Marlin CPU executor.
//!
//! `marlin_repack/{seq,rayon}`: a Mixtral-8x7B w13 (E = 8, K = H = 4096, N = 2I = 28672, 4-bit,
//! 470 MB of packed words), without act-order, and one expert with act-order (the gather path).
//! Throughput is in bytes of packed weights, so criterion's GB/s is the repack rate; for the
//! sequential case, CPU-seconds per GB = 1 / that rate. `rayon` uses the current pool (set
//! `RAYON_NUM_THREADS`). `marlin_exec/scalar`: the executor on a Qwen3-30B-A3B w13 expert
//! (K = 2048, N = 1536), counted in multiply-accumulates.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_kernels::Par;
use moe_kernels::marlin::{
    MarlinWeights, MarlinWeightsDesc, RepackSpec, ScaleLayout, ScaleValues, repack_experts,
    stable_argsort,
};
use moe_testutil::SplitMix64;

fn random_words(len: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| rng.next_u64() as u32).collect()
}

fn repack(c: &mut Criterion) {
    let (e, k, n, bits) = (8usize, 4096usize, 28672usize, 4u32);
    let pf = 32 / bits as usize;
    let q = random_words(e * k * n / pf, 1);
    let mut out = vec![0u32; q.len()];
    let spec = RepackSpec {
        size_k: k,
        size_n: n,
        num_bits: bits,
        is_a_8bit: false,
    };
    let mut group = c.benchmark_group("marlin_repack");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((q.len() * 4) as u64));
    for (name, par) in [("seq", Par::Seq), ("rayon", Par::Rayon)] {
        group.bench_function(
            BenchmarkId::new(name, "mixtral_w13_e8_k4096_n28672_b4"),
            |b| b.iter(|| repack_experts(&q, [e, k / pf, n], &[], spec, &mut out, par).unwrap()),
        );
    }
    // One expert with act-order (the gather path), and the 8-bit-activation layout.
    let one = &q[..k * n / pf];
    let mut out1 = vec![0u32; one.len()];
    let g_idx: Vec<u32> = (0..k as u32).map(|r| (r * 7919 % k as u32) / 128).collect();
    let (perm, _) = stable_argsort(&g_idx);
    group.throughput(Throughput::Bytes((one.len() * 4) as u64));
    group.bench_function(
        BenchmarkId::new("seq", "act_order_e1_k4096_n28672_b4"),
        |b| {
            b.iter(|| {
                repack_experts(one, [1, k / pf, n], &perm, spec, &mut out1, Par::Seq).unwrap()
            })
        },
    );
    let a8 = RepackSpec {
        is_a_8bit: true,
        ..spec
    };
    group.bench_function(BenchmarkId::new("seq", "a8_e1_k4096_n28672_b4"), |b| {
        b.iter(|| repack_experts(one, [1, k / pf, n], &[], a8, &mut out1, Par::Seq).unwrap())
    });
    group.finish();
}

fn exec(c: &mut Criterion) {
    let (k, n, gs) = (2048usize, 1536usize, 128usize);
    let q = random_words(k * n / 8, 2);
    let mut marlin = vec![0u32; q.len()];
    let spec = RepackSpec {
        size_k: k,
        size_n: n,
        num_bits: 4,
        is_a_8bit: false,
    };
    repack_experts(&q, [1, k / 8, n], &[], spec, &mut marlin, Par::Seq).unwrap();
    let mut rng = SplitMix64::new(3);
    let scales: Vec<bf16> = (0..k / gs * n)
        .map(|_| bf16::from_f32(rng.uniform(0.001, 0.01)))
        .collect();
    let w = MarlinWeights::new(MarlinWeightsDesc {
        size_k: k,
        size_n: n,
        num_bits: 4,
        is_a_8bit: false,
        group_size: Some(gs),
        qweight: &marlin,
        scales: ScaleValues::Bf16(&scales),
        scale_layout: ScaleLayout::Grouped,
        sort_indices: &[],
        g_idx_sorted: &[],
        fp8_preprocessed: false,
    })
    .unwrap();
    let mut group = c.benchmark_group("marlin_exec/scalar");
    group.sample_size(10);
    for m in [1usize, 16] {
        let x = rng.vec_uniform(m * k, -1.0, 1.0);
        let mut out = vec![0f32; m * n];
        group.throughput(Throughput::Elements((m * n * k) as u64));
        group.bench_function(
            BenchmarkId::new("scalar", format!("{m}x{n}x{k}_g{gs}")),
            |b| b.iter(|| w.gemm(&x, m, &mut out, Par::Seq).unwrap()),
        );
    }
    group.finish();
}

criterion_group!(benches, repack, exec);
criterion_main!(benches);
