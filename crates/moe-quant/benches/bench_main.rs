//! Criterion benches of moe-quant's scalar quantizers: per-row int8 weight quantization and the
//! per-row activation quantizers, on typical MoE row lengths.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};
use moe_quant::int8::quantize_int8_per_row;
use moe_testutil::SplitMix64;

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform(-2.0, 2.0)).collect()
}

fn int8_per_row(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant/int8_per_row");
    for (rows, cols) in [(256usize, 2048usize), (2048, 768)] {
        let w: Vec<bf16> = random_f32(rows * cols, 1)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        group.throughput(Throughput::Elements((rows * cols) as u64));
        group.bench_with_input(
            BenchmarkId::new("bf16", format!("{rows}x{cols}")),
            &w,
            |b, w| b.iter(|| quantize_int8_per_row(black_box(w), rows, cols).unwrap()),
        );
    }
    group.finish();
}

fn act_rows(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant/act_row");
    for k in [768usize, 2048, 4096] {
        let x = random_f32(k, 2);
        let mut q = vec![0i8; k];
        group.throughput(Throughput::Elements(k as u64));
        group.bench_with_input(BenchmarkId::new("asym_i8", k), &x, |b, x| {
            b.iter(|| quantize_row_asym_i8(black_box(x), &mut q))
        });
        group.bench_with_input(BenchmarkId::new("sym_i8", k), &x, |b, x| {
            b.iter(|| quantize_row_sym_i8(black_box(x), &mut q))
        });
    }
    group.finish();
}

criterion_group!(benches, int8_per_row, act_rows);
criterion_main!(benches);
