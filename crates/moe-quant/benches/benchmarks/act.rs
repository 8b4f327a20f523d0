//! Dynamic per-row activation quantization: asymmetric (W4A8) and symmetric (W8A8) rows.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};

use super::random_f32;

/// Row lengths: an intermediate size, and two hidden sizes.
const ROW_LENGTHS: [usize; 3] = [768, 2048, 4096];

fn act_asym(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant/act_asym_i8");
    for k in ROW_LENGTHS {
        let x = random_f32(k, 2);
        let mut q = vec![0i8; k];
        group.throughput(Throughput::Elements(k as u64));
        group.bench_with_input(BenchmarkId::new("scalar", k), &x, |b, x| {
            b.iter(|| quantize_row_asym_i8(black_box(x), &mut q))
        });
    }
    group.finish();
}

fn act_sym(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant/act_sym_i8");
    for k in ROW_LENGTHS {
        let x = random_f32(k, 3);
        let mut q = vec![0i8; k];
        group.throughput(Throughput::Elements(k as u64));
        group.bench_with_input(BenchmarkId::new("scalar", k), &x, |b, x| {
            b.iter(|| quantize_row_sym_i8(black_box(x), &mut q))
        });
    }
    group.finish();
}

criterion_group!(benches, act_asym, act_sym);
