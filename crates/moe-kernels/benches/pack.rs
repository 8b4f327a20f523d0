//! Packing a checkpoint's int4 words into the WNA16 kernels' layout, the step a load takes
//! per expert and projection.
//!
//! `pack_words/<order>`: one Qwen3-30B-A3B w13 expert (N = 2I = 1536, K = H = 2048, int4,
//! groups of 128, bf16 scales) stored as compressed-tensors `weight_packed` (channel-major
//! `[N, K/8]`), GPTQ `qweight` (step-major `[K/8, N]`) and AWQ `qweight` (`[K, N/8]`), and as
//! int8 words in both of the first two orders, and GPTQ's int4 words with act-order (K values
//! in a random order, as `g_idx` sorting permutes them), on one thread. 64 experts' words are
//! cycled (100-200 MB) so the caches do not hold the source.
//! `pack_bf16_rows`: the same expert as unquantized bf16 rows (`PackedDense::pack_bf16_rows_le`),
//! 16 experts' rows cycled (100 MB).
//! Throughput is in bytes of stored words, so criterion's GB/s is the packing rate per core.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_kernels::{PackedDense, PackedWna16, Wna16Scales, Wna16WordsDesc, WordOrder, WordRows};
use moe_testutil::SplitMix64;

const N: usize = 1536;
const K: usize = 2048;
const GROUP: usize = 128;
const EXPERTS: usize = 64;

fn pack_words(c: &mut Criterion) {
    // Each expert's slot holds its int8 words (one byte per weight); int4 words use half.
    let mut rng = SplitMix64::new(7);
    let bytes: Vec<u8> = (0..EXPERTS * N * K).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<bf16> = (0..N * K / GROUP)
        .map(|i| bf16::from_f32(0.01 + (i % 7) as f32 * 1e-3))
        .collect();
    // Act-order: packed K value `j` is stored K value `perm[j]`.
    let mut perm: Vec<u32> = (0..K as u32).collect();
    for i in (1..K).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let mut group = c.benchmark_group("pack_words");
    group.sample_size(20);
    for (name, order, bits, perm) in [
        ("channel_major", WordOrder::ChannelMajor, 4, None),
        ("step_major", WordOrder::StepMajor, 4, None),
        (
            "step_major_act_order",
            WordOrder::StepMajor,
            4,
            Some(&perm[..]),
        ),
        ("awq", WordOrder::Awq, 4, None),
        ("channel_major_int8", WordOrder::ChannelMajor, 8, None),
        ("step_major_int8", WordOrder::StepMajor, 8, None),
    ] {
        let words_per_expert = N * K * bits as usize / 32;
        group.throughput(Throughput::Bytes((words_per_expert * 4) as u64));
        let mut e = 0;
        group.bench_function(BenchmarkId::new(name, "n1536_k2048_g128"), |b| {
            b.iter(|| {
                let stored = &bytes[e * N * K..][..words_per_expert * 4];
                e = (e + 1) % EXPERTS;
                let rows = [WordRows {
                    channels: N,
                    bytes: stored,
                }];
                let packed = PackedWna16::pack_words(Wna16WordsDesc {
                    n: N,
                    k: K,
                    bits,
                    order,
                    rows: &rows,
                    group_size: moe_quant::WeightGroups::groups(GROUP).unwrap(),
                    scales: Wna16Scales::Bf16(&scales),
                    zeros: None,
                    bias: None,
                    perm,
                })
                .unwrap();
                black_box(packed)
            })
        });
    }
    group.finish();
}

fn pack_bf16_rows(c: &mut Criterion) {
    const BF16_EXPERTS: usize = 16;
    let mut rng = SplitMix64::new(8);
    // Finite bf16 values in [-2, 2).
    let bytes: Vec<u8> = (0..BF16_EXPERTS * N * K)
        .flat_map(|_| bf16::from_f32(rng.next_u64() as u16 as f32 / 16384.0 - 2.0).to_le_bytes())
        .collect();
    let mut group = c.benchmark_group("pack_bf16_rows");
    group.sample_size(20);
    group.throughput(Throughput::Bytes((N * K * 2) as u64));
    let mut e = 0;
    group.bench_function(BenchmarkId::new("rows", "n1536_k2048"), |b| {
        b.iter(|| {
            let rows = &bytes[e * N * K * 2..][..N * K * 2];
            e = (e + 1) % BF16_EXPERTS;
            black_box(PackedDense::pack_bf16_rows_le(N, K, &[rows]).unwrap())
        })
    });
    group.finish();
}

criterion_group!(benches, pack_words, pack_bf16_rows);
criterion_main!(benches);
