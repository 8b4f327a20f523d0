//! `moe bench --layer`: times the road a runtime takes, `MoeLayer`, on the same shapes as the
//! fused benchmark: `apply` from router logits (routing, experts, shared experts: the whole
//! block after the gate GEMM) against `apply_with_topk` with that routing precomputed (the
//! experts alone, through the layer), call by call on the same layer copies.
//!
//! The layers are built as a runtime builds them: `MoeLayer::create`, every expert's int4
//! codes and bf16 group scales through `load_expert_tensor`, then `process`, which packs them
//! and asks the oracle for the backend. The copies hold the same values in separate
//! allocations, enough of them that the weights cycle through more than `--min-bytes`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use half::bf16;
use moe_layer::{
    ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind, TensorView,
};
use moe_quant::DType;
use moe_router::Logits;

use super::bench::{BenchArgs, BenchFormat, BenchRow, BenchShape, print_row};
use super::synth::Rng;
use super::{CliError, Output, median_ms};

/// The stages a `--layer` row times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `MoeLayer::apply` from router logits.
    Block,
    /// `MoeLayer::apply_with_topk` with the routing precomputed.
    Experts,
}

impl Stage {
    const BOTH: [Self; 2] = [Self::Block, Self::Experts];

    fn name(self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Experts => "experts",
        }
    }
}

/// The codes and scales of one expert's three projections, shared by every copy.
struct ExpertData {
    /// `w1`, `w3` `[I, H]` and `w2` `[H, I]` codes in `[-8, 7]`.
    codes: [Vec<i8>; 3],
    /// Their bf16 group scales `[rows, cols / g]`.
    scales: [Vec<bf16>; 3],
}

/// Random W4A8 expert data for `shape` with groups of `g`.
fn expert_data(shape: &BenchShape, g: usize, seed: u64) -> Vec<ExpertData> {
    let (h, i) = (shape.hidden, shape.intermediate);
    (0..shape.experts)
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let mut codes =
                |n: usize| -> Vec<i8> { (0..n).map(|_| rng.below(16) as i8 - 8).collect() };
            let codes = [codes(i * h), codes(i * h), codes(h * i)];
            let mut rng = Rng::stream(seed ^ 0x5CA1E, e as u64);
            let mut scales = |n: usize| -> Vec<bf16> {
                (0..n)
                    .map(|_| bf16::from_f32(0.005 + 0.015 * rng.unit()))
                    .collect()
            };
            let scales = [scales(i * h / g), scales(i * h / g), scales(h * i / g)];
            ExpertData { codes, scales }
        })
        .collect()
}

/// One layer built from `data` through the layer's own loading road.
fn build_layer(
    shape: &BenchShape,
    g: usize,
    max_tokens: usize,
    data: &[ExpertData],
) -> Result<MoeLayer, CliError> {
    let (h, i) = (shape.hidden, shape.intermediate);
    let cfg = MoeLayerConfig::new(
        shape.experts,
        shape.top_k,
        h,
        i,
        LayerQuant::W4A8 {
            group_size: Some(g),
        },
    )
    .with_in_dtype(DType::F32)
    .with_max_tokens(max_tokens);
    let mut layer = MoeLayer::create(cfg).map_err(|err| CliError::context("creating", err))?;
    for (e, d) in data.iter().enumerate() {
        for (j, (shard, rows, cols)) in [
            (ExpertShard::W1, i, h),
            (ExpertShard::W3, i, h),
            (ExpertShard::W2, h, i),
        ]
        .into_iter()
        .enumerate()
        {
            let weight = TensorView {
                name: "weight",
                shape: &[rows, cols],
                data: TensorData::I8(&d.codes[j]),
            };
            let scale = TensorView {
                name: "weight_scale",
                shape: &[rows, cols / g],
                data: TensorData::Bf16(&d.scales[j]),
            };
            layer
                .load_expert_tensor(e, shard, TensorKind::Weight, &weight)
                .and_then(|()| layer.load_expert_tensor(e, shard, TensorKind::Scale, &scale))
                .map_err(|err| CliError::context("loading", err))?;
        }
    }
    layer
        .process()
        .map_err(|err| CliError::context("processing", err))?;
    Ok(layer)
}

/// Times `--layer` rows for one shape.
pub(super) fn bench_shape(
    args: &BenchArgs,
    shape: &BenchShape,
    dram: f64,
    pool: &rayon::ThreadPool,
    out: Output,
) -> Result<Vec<BenchRow>, CliError> {
    if args.format != BenchFormat::W4a8 {
        return Err(CliError(
            "--layer times W4A8 layers (--format w4a8) for now".into(),
        ));
    }
    let (e, k, h, i) = (shape.experts, shape.top_k, shape.hidden, shape.intermediate);
    let g = args.group_size;
    if g == 0 || h % g != 0 || i % g != 0 {
        return Err(CliError(format!(
            "--group-size {g} must divide the hidden size {h} and the intermediate size {i}"
        )));
    }
    let max_m = args.batch_sizes.iter().copied().max().unwrap_or(1);
    let data = pool.install(|| expert_data(shape, g, args.seed));
    // int4 nibbles plus a bf16 scale per group: the packed bytes a copy holds.
    let expert_bytes = 3 * h * i / 2 + 3 * h * i / g * 2;
    let layer_bytes = (expert_bytes * e) as u64;
    let copies = args.min_bytes.div_ceil(layer_bytes.max(1)).max(1) as usize;
    let bar = out.progress(copies as u64, &format!("{}: building layers", shape.name));
    let mut layers = Vec::with_capacity(copies);
    for _ in 0..copies {
        layers.push(pool.install(|| build_layer(shape, g, max_m, &data))?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(data);
    let ops = layers[0].backend().map(|b| b.ops).unwrap_or_default();
    let isa = moe_kernels::kernels().isa().name();

    let mut rng = Rng::stream(args.seed, 0xB10C);
    let mut x = vec![0.0f32; max_m * h];
    rng.fill_normal(&mut x, 1.0);
    let mut output = vec![0.0f32; max_m * h];
    let mut rows = Vec::new();
    for &m in &args.batch_sizes {
        // Router logits per call, and the routing the layer makes of them (for the experts
        // stage and for counting the experts a call touches).
        let calls: Vec<(Vec<f32>, Vec<i32>, Vec<f32>)> = (0..args.iters)
            .map(|_| {
                let mut logits = vec![0.0f32; m * e];
                rng.fill_normal(&mut logits, 1.0);
                let (mut ids, mut weights) = (vec![0i32; m * k], vec![0f32; m * k]);
                layers[0]
                    .route(Logits::F32(&logits), &mut ids, &mut weights)
                    .map_err(|err| CliError::context("routing", err))?;
                Ok((logits, ids, weights))
            })
            .collect::<Result<_, CliError>>()?;
        let out_m = &mut output[..m * h];
        let x_m = &x[..m * h];
        let call = |stage: Stage, c: usize, copy: usize, out_m: &mut [f32]| {
            let (logits, ids, weights) = &calls[c % calls.len()];
            let layer = &layers[copy % copies];
            let t0 = Instant::now();
            match stage {
                Stage::Block => layer.apply(x_m, Logits::F32(logits), out_m),
                Stage::Experts => layer.apply_with_topk(x_m, ids, weights, out_m),
            }
            .map_err(|err| CliError::context("applying the layer", err))?;
            Ok::<_, CliError>(t0.elapsed())
        };
        let mut samples: [Vec<Duration>; 2] = Default::default();
        let warmup = Duration::from_millis(args.warmup_ms);
        pool.install(|| -> Result<(), CliError> {
            let (mut rounds, mut warm, mut copy) = (0usize, Duration::ZERO, 0usize);
            while rounds == 0 || warm < warmup {
                for stage in Stage::BOTH {
                    warm += call(stage, rounds, copy, out_m)?;
                    copy += 1;
                }
                rounds += 1;
            }
            for it in 0..args.iters {
                for (s, stage) in Stage::BOTH.into_iter().enumerate() {
                    samples[s].push(call(stage, it, copy, out_m)?);
                    copy += 1;
                }
            }
            Ok(())
        })?;
        let touched = calls
            .iter()
            .map(|(_, ids, _)| ids.iter().collect::<HashSet<_>>().len())
            .sum::<usize>() as f64
            / calls.len() as f64;
        let bytes = touched * expert_bytes as f64;
        let dram_ms = bytes / dram * 1e3;
        let medians = samples.map(|mut s| median_ms(&mut s));
        for (stage, ms) in Stage::BOTH.into_iter().zip(medians) {
            let secs = (ms / 1e3).max(f64::MIN_POSITIVE);
            let row = BenchRow {
                shape: shape.clone(),
                isa,
                stage: stage.name(),
                ops: ops.clone(),
                copies,
                distinct_bytes: layer_bytes * copies as u64,
                batch: m,
                ms_per_call: ms,
                tokens_per_s: m as f64 / secs,
                experts_touched: touched,
                bytes_touched: bytes,
                weight_gb_per_s: bytes / secs / 1e9,
                gmac_per_s: (m * k * 3 * h * i) as f64 / secs / 1e9,
                dram_bound_ms: dram_ms,
                dram_ratio: dram_ms / ms.max(f64::MIN_POSITIVE),
                stages: None,
            };
            if !out.json {
                let label = format!("{isa}/{}", stage.name());
                print_row(&row, &label, ms / medians[1].max(f64::MIN_POSITIVE));
            }
            rows.push(row);
        }
    }
    Ok(rows)
}
