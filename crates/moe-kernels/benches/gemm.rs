//! W4A8, W8A8 and WNA16 GEMM throughput per ISA rung, each rung run explicitly through its
//! kernel set.
//!
//! Groups are `"{op}/{isa}"`, cases `BenchmarkId::new(isa, "MxNxK")`; throughput is counted in
//! elements = multiply-accumulates (M·N·K). Shapes: Qwen3-30B-A3B w13 (N 1536, K 2048) and w2
//! (N 2048, K 768), a Mixtral-sized w13 half (N 14336, K 4096) and Mixtral's w2 (N 4096,
//! K 14336); M = 1, 16, 64, 256;
//! W4A8 with groups of 32 and 128 (`w4a8_gemm/g{group}/{isa}`).
//! Single-threaded (`Par::Seq`) so the figures are per core. `act_quant/scalar` times the
//! activation quantisation alone. WNA16 runs each rung as dispatched and, where the rung has
//! a bf16 path, again with f32 at every row count (`wna16_gemm/{isa}-f32`), with int4 codes
//! and, as `wna16_gemm/int8/...`, int8 codes (`wna16_gemm/fp8/...`: e4m3 codes with
//! block scales). `dense_gemm/{isa}` times unquantized bf16 weights
//! (`dense_gemm/f32/{isa}`: f32 weights) on the body every rung shares the bits of.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moe_kernels::{
    Fp8Desc, Fp8Rows, Fp8Scales, GemmScratch, Isa, KernelSet, PackedDense, PackedW4A8, PackedW8A8,
    PackedWna16, Par, W4A8Prefill, W4A8Scales, Wna16Desc, Wna16Scales,
};
use moe_testutil::SplitMix64;

const SHAPES: &[(usize, usize)] = &[(1536, 2048), (2048, 768), (14336, 4096), (4096, 14336)];
const MS: &[usize] = &[1, 16, 64, 256];
const GROUPS: &[usize] = &[32, 128];

/// The scalar rung is slow; keep its cases short.
fn too_slow(isa: Isa, macs: usize) -> bool {
    isa == Isa::Scalar && macs > 200_000_000
}

fn w4a8(c: &mut Criterion) {
    let mut rng = SplitMix64::new(1);
    let mut sets = Vec::new();
    for isa in moe_kernels::available_isas() {
        let ks = KernelSet::for_isa(isa).unwrap();
        sets.push((isa.to_string(), ks));
        if ks.has_bf16_tiles() {
            let bf16 = ks.with_w4a8_prefill(W4A8Prefill::Bf16Tiles);
            sets.push((format!("{isa}-bf16"), bf16));
        }
    }
    for (name, ks) in sets {
        let isa = ks.isa();
        for &g in GROUPS {
            let mut group = c.benchmark_group(format!("w4a8_gemm/g{g}/{name}"));
            group.sample_size(10);
            for &(n, k) in SHAPES {
                let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
                let s: Vec<bf16> = (0..n * k / g)
                    .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                    .collect();
                let scales = W4A8Scales::Grouped {
                    group_size: g,
                    scales: &s,
                };
                // In the panel order the rung asks for, as a layer packs its experts.
                let packed = PackedW4A8::pack(n, k, &w, scales, None)
                    .unwrap()
                    .with_order(ks.panel_order());
                for &m in MS {
                    let macs = m * n * k;
                    if too_slow(isa, macs) {
                        continue;
                    }
                    let x = rng.vec_uniform(m * k, -1.0, 1.0);
                    let mut out = vec![0f32; m * n];
                    let mut scratch = GemmScratch::with_capacity(m, k);
                    group.throughput(Throughput::Elements(macs as u64));
                    group.bench_function(BenchmarkId::new(&name, format!("{m}x{n}x{k}")), |b| {
                        b.iter(|| {
                            moe_kernels::w4a8_gemm(
                                &ks,
                                m,
                                &x,
                                &packed,
                                &mut out,
                                &mut scratch,
                                Par::Seq,
                            )
                            .unwrap()
                        })
                    });
                }
            }
            group.finish();
        }
    }
}

fn w8a8(c: &mut Criterion) {
    let mut rng = SplitMix64::new(2);
    let packed: Vec<PackedW8A8> = SHAPES
        .iter()
        .map(|&(n, k)| {
            let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-127, 127) as i8).collect();
            PackedW8A8::pack(n, k, &w, &rng.vec_uniform(n, 0.001, 0.01)).unwrap()
        })
        .collect();
    for isa in moe_kernels::available_isas() {
        let ks = KernelSet::for_isa(isa).unwrap();
        let mut group = c.benchmark_group(format!("w8a8_gemm/{isa}"));
        group.sample_size(10);
        for w in &packed {
            // In the panel order the rung asks for, as a layer packs its experts.
            let w = &w.clone().with_order(ks.panel_order());
            let (n, k) = (w.n(), w.k());
            for &m in MS {
                let macs = m * n * k;
                if too_slow(isa, macs) {
                    continue;
                }
                let x = rng.vec_uniform(m * k, -1.0, 1.0);
                let mut out = vec![0f32; m * n];
                let mut scratch = GemmScratch::with_capacity(m, k);
                group.throughput(Throughput::Elements(macs as u64));
                group.bench_function(BenchmarkId::new(isa.name(), format!("{m}x{n}x{k}")), |b| {
                    b.iter(|| {
                        moe_kernels::w8a8_gemm(&ks, m, &x, w, &mut out, &mut scratch, Par::Seq)
                            .unwrap()
                    })
                });
            }
        }
        group.finish();
    }
}

/// The weight-only GEMM (symmetric, bf16 scales in groups of 128) on the W4A8 shapes, with
/// int4 and int8 codes.
fn wna16(c: &mut Criterion) {
    for bits in [4u32, 8] {
        wna16_integer(c, bits);
    }
    wna16_fp8(c);
}

/// [`wna16`] for integer codes of `bits` bits, groups of 128 with bf16 scales.
fn wna16_integer(c: &mut Criterion, bits: u32) {
    const GROUP: usize = 128;
    let mut rng = SplitMix64::new(4);
    let packed: Vec<PackedWna16> = SHAPES
        .iter()
        .map(|&(n, k)| {
            let codes: Vec<u8> = (0..n * k).map(|_| rng.below(1 << bits) as u8).collect();
            let s: Vec<bf16> = (0..n * k / GROUP)
                .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                .collect();
            PackedWna16::pack(Wna16Desc {
                n,
                k,
                bits,
                codes: &codes,
                group_size: moe_quant::WeightGroups::groups(GROUP).unwrap(),
                scales: Wna16Scales::Bf16(&s),
                zeros: None,
                bias: None,
                perm: None,
            })
            .unwrap()
        })
        .collect();
    let prefix = if bits == 4 {
        String::new()
    } else {
        format!("int{bits}/")
    };
    wna16_sets(c, &prefix, &packed, &mut rng);
}

/// [`wna16`] for e4m3 codes with f32 scales per `128 × 128` block (FP8 checkpoints).
fn wna16_fp8(c: &mut Criterion) {
    let mut rng = SplitMix64::new(5);
    let packed: Vec<PackedWna16> = SHAPES
        .iter()
        .map(|&(n, k)| {
            // Finite e4m3 codes: 0x7F and 0xFF are NaN.
            let codes: Vec<u8> = (0..n * k)
                .map(|_| match rng.below(256) as u8 {
                    0x7F | 0xFF => 0,
                    c => c,
                })
                .collect();
            let scales = rng.vec_uniform(n.div_ceil(128) * k.div_ceil(128), 1e-3, 1e-2);
            PackedWna16::pack_fp8(Fp8Desc {
                n,
                k,
                rows: &[Fp8Rows {
                    channels: n,
                    codes: &codes,
                    scales: Fp8Scales::Blocks(&scales),
                }],
                bias: None,
            })
            .unwrap()
        })
        .collect();
    wna16_sets(c, "fp8/", &packed, &mut rng);
}

/// Times `packed` on every rung's kernel set, groups named `wna16_gemm/{prefix}{set}`.
fn wna16_sets(c: &mut Criterion, prefix: &str, packed: &[PackedWna16], rng: &mut SplitMix64) {
    // Each rung as dispatched, and, where it has a path with other numerics (bf16 or 15-bit
    // integer activations), also with f32 at every row count.
    let mut sets = Vec::new();
    for isa in moe_kernels::available_isas() {
        let ks = KernelSet::for_isa(isa).unwrap();
        sets.push((isa.to_string(), ks));
        if ks.describe_ops() != ks.without_bf16_path().describe_ops() {
            sets.push((format!("{isa}-f32"), ks.without_bf16_path()));
        }
    }
    for (name, ks) in sets {
        let isa = ks.isa();
        let mut group = c.benchmark_group(format!("wna16_gemm/{prefix}{name}"));
        group.sample_size(10);
        for w in packed {
            let (n, k) = (w.n(), w.k());
            for &m in MS {
                let macs = m * n * k;
                if too_slow(isa, macs) {
                    continue;
                }
                let x = rng.vec_uniform(m * k, -1.0, 1.0);
                let mut out = vec![0f32; m * n];
                let mut scratch = GemmScratch::new();
                group.throughput(Throughput::Elements(macs as u64));
                group.bench_function(BenchmarkId::new(&name, format!("{m}x{n}x{k}")), |b| {
                    b.iter(|| {
                        moe_kernels::wna16_gemm(&ks, m, &x, w, &mut out, &mut scratch, Par::Seq)
                            .unwrap()
                    })
                });
            }
        }
        group.finish();
    }
}

fn dense(c: &mut Criterion) {
    let mut rng = SplitMix64::new(4);
    for bf16_weights in [true, false] {
        let packed: Vec<PackedDense> = SHAPES[..2]
            .iter()
            .map(|&(n, k)| {
                let w = rng.vec_uniform(n * k, -1.0, 1.0);
                if bf16_weights {
                    let w: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
                    PackedDense::pack_bf16(n, k, &w).unwrap()
                } else {
                    PackedDense::pack_f32(n, k, &w).unwrap()
                }
            })
            .collect();
        for isa in moe_kernels::available_isas() {
            let ks = KernelSet::for_isa(isa).unwrap();
            let prefix = if bf16_weights { "" } else { "f32/" };
            let mut group = c.benchmark_group(format!("dense_gemm/{prefix}{isa}"));
            group.sample_size(10);
            for w in &packed {
                let (n, k) = (w.n(), w.k());
                for &m in MS {
                    let macs = m * n * k;
                    if too_slow(isa, macs) {
                        continue;
                    }
                    let x = rng.vec_uniform(m * k, -1.0, 1.0);
                    let mut out = vec![0f32; m * n];
                    group.throughput(Throughput::Elements(macs as u64));
                    let id = BenchmarkId::new(isa.name(), format!("{m}x{n}x{k}"));
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            moe_kernels::dense_gemm(&ks, m, &x, w, &mut out, Par::Seq).unwrap()
                        })
                    });
                }
            }
            group.finish();
        }
    }
}

/// The activation quantisation the W4A8 driver runs per call (scalar `moe_quant::act`), to see
/// its share of a GEMM.
fn act_quant(c: &mut Criterion) {
    let mut rng = SplitMix64::new(3);
    let mut group = c.benchmark_group("act_quant/scalar");
    group.sample_size(10);
    for &(m, k) in &[(1usize, 2048usize), (256, 2048), (256, 4096)] {
        let x = rng.vec_uniform(m * k, -1.0, 1.0);
        let mut q = vec![0i8; m * k];
        group.throughput(Throughput::Elements((m * k) as u64));
        group.bench_function(BenchmarkId::new("asym_i8", format!("{m}x{k}")), |b| {
            b.iter(|| {
                for (row, q_row) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
                    std::hint::black_box(moe_quant::act::quantize_row_asym_i8(row, q_row));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, w4a8, w8a8, wna16, dense, act_quant);
criterion_main!(benches);
