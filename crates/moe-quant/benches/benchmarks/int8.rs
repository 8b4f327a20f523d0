//! Per-row int8 weight quantization (`Int8OnlineMoEMethod` emulation) on bf16 expert matrices.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use half::bf16;
use moe_quant::int8::quantize_int8_per_row;

use super::random_f32;

fn int8_per_row(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant/int8_per_row");
    // w13 and w2 of one expert at Qwen3-30B-A3B-like sizes (2I x H, H x I).
    for (rows, cols) in [(1536usize, 2048usize), (2048, 768)] {
        let w: Vec<bf16> = random_f32(rows * cols, 1)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        group.throughput(Throughput::Elements((rows * cols) as u64));
        group.bench_with_input(
            BenchmarkId::new("scalar", format!("bf16_{rows}x{cols}")),
            &w,
            |b, w| b.iter(|| quantize_int8_per_row(black_box(w), rows, cols).unwrap()),
        );
    }
    group.finish();
}

criterion_group!(benches, int8_per_row);
