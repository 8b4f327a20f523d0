//! `moe bench` on the road a runtime takes (its default): `MoeLayer`, on the same shapes as
//! the fused benchmark, timed two ways call by call on the same layer copies: `apply` from
//! router logits (routing, experts, shared experts: the whole block after the gate GEMM) and
//! `apply_with_topk` with that routing precomputed (the experts alone, through the layer).
//!
//! The layers are built as a runtime builds them, for every format `moe bench` offers:
//! `MoeLayer::create`, every expert's tensors through `load_expert_tensor` (int4/int8 codes
//! with bf16 group scales, or bf16/f32 weights, which online int8 quantizes in `process`), then
//! `process`, which packs them and asks the oracle for the backend. Weight-only codes with zero
//! points are loaded with `load_layer_tensors`, the whole-layer loader, because zero points
//! have no per-tensor loader; so are MXFP4 layers, in the checkpoint's bytes (e2m1 blocks and
//! e8m0 scales, gpt-oss's SwiGLU-OAI on interleaved gate/up rows), which have none either. FP8
//! block-quantized experts have no loader by name at all: each copy packs its experts with
//! `PackedWna16::pack_fp8` and hands them to `load_packed_fp8_experts`, as a runtime
//! holding them in memory would.
//!
//! Every copy is drawn from the same seeded streams, a few experts at a time, so the copies
//! hold the same values in separate allocations while only one copy's unpacked tensors exist
//! at once (the zero-point road holds one layer's codes, shared by every copy); enough copies
//! that the weights cycle through more than `--min-bytes`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use half::bf16;
use moe_kernels::{Activation, GateUpLayout};
use moe_layer::checkpoint::{
    ExpertTensors, FloatData, IntExperts, MoeLayerTensors, Mxfp4Experts, RouterTensors,
    StoredExperts, ZeroPoints,
};
use moe_layer::{
    ExpertShard, Fp8Scaling, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind,
    TensorView,
};
use moe_quant::{DType, WeightGroups};
use moe_router::Logits;
use rayon::prelude::*;

use super::bench::{self, BenchArgs, BenchFormat, BenchRow, BenchShape, print_row};
use super::synth::{self, Rng};
use super::{CliError, Output, median_ms};

/// The stages a layer row times.
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

/// The three projections of an expert: gate and up `[I, H]`, down `[H, I]`.
const PROJECTIONS: [ExpertShard; 3] = [ExpertShard::W1, ExpertShard::W3, ExpertShard::W2];

/// One projection's weight as a checkpoint stores it.
enum Weight {
    /// Signed integer codes.
    I8(Vec<i8>),
    /// bf16 weights.
    Bf16(Vec<bf16>),
    /// f32 weights.
    F32(Vec<f32>),
}

impl Weight {
    fn data(&self) -> TensorData<'_> {
        match self {
            Self::I8(v) => TensorData::I8(v),
            Self::Bf16(v) => TensorData::Bf16(v),
            Self::F32(v) => TensorData::F32(v),
        }
    }
}

/// One projection of one expert: its weight, and for the integer formats its bf16 group
/// scales and (with `--zero-points`) its zero points, `[rows, cols / g]`.
struct Projection {
    weight: Weight,
    scales: Option<Vec<bf16>>,
    zeros: Option<Vec<u8>>,
}

/// What the options ask the layer to be.
fn layer_quant(args: &BenchArgs) -> Result<LayerQuant, CliError> {
    let groups =
        || WeightGroups::groups(args.group_size).map_err(|e| CliError::context("--group-size", e));
    Ok(match args.format {
        BenchFormat::W4a8 => LayerQuant::W4A8 {
            group_size: groups()?,
        },
        BenchFormat::W8a8 => LayerQuant::Int8Online,
        BenchFormat::W4a16 | BenchFormat::W8a16 => LayerQuant::Wna16 {
            bits: args.format.wna16_bits().unwrap_or(4),
            group_size: groups()?,
            act_order: false,
            zero_points: args.zero_points,
        },
        BenchFormat::Bf16 | BenchFormat::F32 => LayerQuant::Unquantized,
        BenchFormat::Mxfp4 => LayerQuant::Mxfp4,
        BenchFormat::Fp8 => LayerQuant::Fp8 {
            scaling: Fp8Scaling::Blocks,
        },
    })
}

/// `(rows, cols)` of a projection.
fn dims(shape: &BenchShape, proj: ExpertShard) -> (usize, usize) {
    match proj {
        ExpertShard::W2 => (shape.hidden, shape.intermediate),
        _ => (shape.intermediate, shape.hidden),
    }
}

/// Projection `j` of expert `e`, drawn from its own stream of `seed`, so every copy draws the
/// same values.
fn draw(args: &BenchArgs, shape: &BenchShape, e: usize, j: usize) -> Projection {
    let (rows, cols) = dims(shape, PROJECTIONS[j]);
    let g = args.group_size;
    let mut rng = Rng::stream(args.seed, (e * PROJECTIONS.len() + j) as u64);
    let mut codes = |bits: u32| -> Vec<i8> {
        let mut u = vec![0u8; rows * cols];
        synth::fill_codes(&mut rng, bits, &mut u);
        let offset = 1i16 << (bits - 1);
        u.into_iter()
            .map(|c| (i16::from(c) - offset) as i8)
            .collect()
    };
    let floats = |rng: &mut Rng| -> Vec<f32> {
        let mut w = vec![0f32; rows * cols];
        synth::fill_small(rng, &mut w);
        w
    };
    match args.format {
        BenchFormat::W4a8 | BenchFormat::W4a16 | BenchFormat::W8a16 => {
            let bits = args.format.wna16_bits().unwrap_or(4);
            let weight = Weight::I8(codes(bits));
            let scales = (0..rows * cols / g)
                .map(|_| bf16::from_f32(0.001 + (rng.next_u64() % 1000) as f32 * 2e-6))
                .collect();
            let zeros = args.zero_points.then(|| {
                let mut z = vec![0u8; rows * cols / g];
                synth::fill_codes(&mut rng, bits, &mut z);
                z
            });
            Projection {
                weight,
                scales: Some(scales),
                zeros,
            }
        }
        BenchFormat::W8a8 | BenchFormat::Bf16 => Projection {
            weight: Weight::Bf16(floats(&mut rng).into_iter().map(bf16::from_f32).collect()),
            scales: None,
            zeros: None,
        },
        BenchFormat::F32 => Projection {
            weight: Weight::F32(floats(&mut rng)),
            scales: None,
            zeros: None,
        },
        BenchFormat::Mxfp4 | BenchFormat::Fp8 => {
            unreachable!("MXFP4 and FP8 layers are built by their own functions")
        }
    }
}

/// Every projection of experts `experts`, drawn in parallel on the current pool.
fn draw_experts(
    args: &BenchArgs,
    shape: &BenchShape,
    experts: std::ops::Range<usize>,
) -> Vec<[Projection; 3]> {
    experts
        .into_par_iter()
        .map(|e| [0, 1, 2].map(|j| draw(args, shape, e, j)))
        .collect()
}

/// A created, unloaded layer for the options.
fn create_layer(
    args: &BenchArgs,
    shape: &BenchShape,
    max_tokens: usize,
) -> Result<MoeLayer, CliError> {
    let cfg = MoeLayerConfig::new(
        shape.experts,
        shape.top_k,
        shape.hidden,
        shape.intermediate,
        layer_quant(args)?,
    )
    .with_in_dtype(DType::F32)
    .with_max_tokens(max_tokens)
    .with_wna16_activations(args.wna16_activations);
    // MXFP4 runs as gpt-oss does (and as `--experts-only` times it).
    let mut cfg = cfg;
    if args.format == BenchFormat::Mxfp4 {
        cfg = cfg.with_activation(Activation::SWIGLU_OAI);
        cfg.gate_up_layout = GateUpLayout::Interleaved;
    }
    MoeLayer::create(cfg).map_err(|err| CliError::context("creating the layer", err))
}

/// One FP8 layer: created, then readied around experts packed from random e4m3 codes and
/// block scales (each expert from its own stream of `seed`, so every copy holds the same
/// values in its own allocations), packed in parallel on the current pool.
fn build_fp8_layer(
    args: &BenchArgs,
    shape: &BenchShape,
    max_tokens: usize,
) -> Result<MoeLayer, CliError> {
    let mut layer = create_layer(args, shape, max_tokens)?;
    let (h, i) = (shape.hidden, shape.intermediate);
    let (w13, w2): (Vec<_>, Vec<_>) = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(args.seed, e as u64);
            let w13 = synth::random_fp8_packed(&mut rng, 2 * i, h)?;
            Ok((w13, synth::random_fp8_packed(&mut rng, h, i)?))
        })
        .collect::<Result<Vec<_>, CliError>>()?
        .into_iter()
        .unzip();
    layer
        .load_packed_fp8_experts(w13, w2)
        .map_err(|err| CliError::context("loading packed FP8 experts", err))?;
    Ok(layer)
}

/// The whole MXFP4 layer in the reader's layout (`w13` rows interleaved, gate then up; every
/// expert from its own stream of `seed`), with a router gate weight, which the whole-layer
/// loader requires.
fn mxfp4_tensors(args: &BenchArgs, shape: &BenchShape) -> MoeLayerTensors {
    let (e, h, i) = (shape.experts, shape.hidden, shape.intermediate);
    let drawn: Vec<_> = (0..e)
        .into_par_iter()
        .map(|x| {
            let mut rng = Rng::stream(args.seed, x as u64);
            let w13 = synth::random_mxfp4_bytes(&mut rng, 2 * i, h);
            (w13, synth::random_mxfp4_bytes(&mut rng, h, i))
        })
        .collect();
    let mut m = Mxfp4Experts {
        w13_blocks: Vec::new(),
        w13_scales: Vec::new(),
        w2_blocks: Vec::new(),
        w2_scales: Vec::new(),
    };
    for ((b13, s13), (b2, s2)) in drawn {
        m.w13_blocks.extend_from_slice(&b13);
        m.w13_scales.extend_from_slice(&s13);
        m.w2_blocks.extend_from_slice(&b2);
        m.w2_scales.extend_from_slice(&s2);
    }
    MoeLayerTensors {
        layer: 0,
        local_experts: (0..e).collect(),
        experts: ExpertTensors {
            num_experts: e,
            hidden: h,
            intermediate: i,
            weights: StoredExperts::Mxfp4(m),
            w13_bias: None,
            w2_bias: None,
        },
        router: router_tensors(args, shape),
        shared: None,
    }
}

/// A random router gate weight `[E, H]`.
fn router_tensors(args: &BenchArgs, shape: &BenchShape) -> RouterTensors {
    let mut rng = Rng::stream(args.seed, 0x6A7E);
    let mut router = vec![0f32; shape.experts * shape.hidden];
    synth::fill_small(&mut rng, &mut router);
    RouterTensors {
        weight: FloatData::F32(router),
        correction_bias: None,
        bias: None,
    }
}

/// One layer loaded tensor by tensor through `load_expert_tensor` and processed; experts are
/// drawn as many at a time as the pool has threads.
fn build_layer(
    args: &BenchArgs,
    shape: &BenchShape,
    max_tokens: usize,
) -> Result<MoeLayer, CliError> {
    let mut layer = create_layer(args, shape, max_tokens)?;
    let g = args.group_size;
    let batch = rayon::current_num_threads().max(1);
    for first in (0..shape.experts).step_by(batch) {
        let drawn = draw_experts(args, shape, first..(first + batch).min(shape.experts));
        for (offset, projections) in drawn.iter().enumerate() {
            let e = first + offset;
            for (proj, p) in PROJECTIONS.iter().zip(projections) {
                let (rows, cols) = dims(shape, *proj);
                let weight = TensorView {
                    name: "weight",
                    shape: &[rows, cols],
                    data: p.weight.data(),
                };
                layer
                    .load_expert_tensor(e, *proj, TensorKind::Weight, &weight)
                    .map_err(|err| CliError::context("loading", err))?;
                if let Some(scales) = &p.scales {
                    let scale = TensorView {
                        name: "weight_scale",
                        shape: &[rows, cols / g],
                        data: TensorData::Bf16(scales),
                    };
                    layer
                        .load_expert_tensor(e, *proj, TensorKind::Scale, &scale)
                        .map_err(|err| CliError::context("loading", err))?;
                }
            }
        }
    }
    layer
        .process()
        .map_err(|err| CliError::context("processing", err))?;
    Ok(layer)
}

/// The whole layer's tensors in the reader's fused layout (`w13` `[E, 2I, H]`: gate rows then
/// up rows), for the weight-only formats with zero points, which only the whole-layer loader
/// takes; with a router gate weight, which that loader requires.
fn layer_tensors(args: &BenchArgs, shape: &BenchShape) -> Result<MoeLayerTensors, CliError> {
    let (e, h, i, g) = (
        shape.experts,
        shape.hidden,
        shape.intermediate,
        args.group_size,
    );
    let mut w13 = Vec::with_capacity(e * 2 * i * h);
    let mut w2 = Vec::with_capacity(e * h * i);
    let (mut s13, mut s2, mut z13, mut z2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let batch = rayon::current_num_threads().max(1);
    for first in (0..e).step_by(batch) {
        for projections in draw_experts(args, shape, first..(first + batch).min(e)) {
            for (j, p) in projections.into_iter().enumerate() {
                let (codes, scales, zeros) = if j == 2 {
                    (&mut w2, &mut s2, &mut z2)
                } else {
                    (&mut w13, &mut s13, &mut z13)
                };
                if let Weight::I8(c) = p.weight {
                    codes.extend_from_slice(&c);
                }
                scales.extend(p.scales.unwrap_or_default().iter().map(|s| s.to_f32()));
                zeros.extend(p.zeros.unwrap_or_default());
            }
        }
    }
    Ok(MoeLayerTensors {
        layer: 0,
        local_experts: (0..e).collect(),
        experts: ExpertTensors {
            num_experts: e,
            hidden: h,
            intermediate: i,
            weights: StoredExperts::Int(IntExperts {
                bits: args.format.wna16_bits().unwrap_or(4),
                group_size: WeightGroups::groups(g)
                    .map_err(|e| CliError::context("--group-size", e))?,
                scale_dtype: DType::BF16,
                w13,
                w13_scales: s13,
                w2,
                w2_scales: s2,
                act_order: None,
                zeros: Some(ZeroPoints { w13: z13, w2: z2 }),
            }),
            w13_bias: None,
            w2_bias: None,
        },
        router: router_tensors(args, shape),
        shared: None,
    })
}

/// Times the layer rows for one shape.
pub(super) fn bench_shape(
    args: &BenchArgs,
    shape: &BenchShape,
    dram: f64,
    pool: &rayon::ThreadPool,
    out: Output,
) -> Result<Vec<BenchRow>, CliError> {
    let (e, k, h, i) = (shape.experts, shape.top_k, shape.hidden, shape.intermediate);
    if k == 0 || k > e {
        return Err(CliError(format!(
            "shape {}: top-k {k} must be between 1 and the expert count {e}",
            shape.name
        )));
    }
    let g = args.group_size;
    if args.format.grouped() && (g == 0 || !h.is_multiple_of(g) || !i.is_multiple_of(g)) {
        return Err(CliError(format!(
            "--group-size {g} must divide the hidden size {h} and the intermediate size {i}"
        )));
    }
    let max_m = args.batch_sizes.iter().copied().max().unwrap_or(1);
    // The packed bytes a copy holds, from one expert packed by the same packers.
    let expert_bytes = pool.install(|| bench::expert_bytes(args, shape))?;
    let layer_bytes = (expert_bytes * e) as u64;
    let copies = args.min_bytes.div_ceil(layer_bytes.max(1)).max(1) as usize;
    let bar = out.progress(copies as u64, &format!("{}: building layers", shape.name));
    let mut layers = Vec::with_capacity(copies);
    if args.format == BenchFormat::Fp8 {
        for _ in 0..copies {
            layers.push(pool.install(|| build_fp8_layer(args, shape, max_m))?);
            bar.inc(1);
        }
    } else if args.zero_points || args.format == BenchFormat::Mxfp4 {
        let tensors = pool.install(|| {
            if args.format == BenchFormat::Mxfp4 {
                Ok(mxfp4_tensors(args, shape))
            } else {
                layer_tensors(args, shape)
            }
        })?;
        for _ in 0..copies {
            let mut layer = create_layer(args, shape, max_m)?;
            pool.install(|| {
                layer
                    .load_layer_tensors(&tensors)
                    .and_then(|()| layer.process())
            })
            .map_err(|err| CliError::context("loading and processing", err))?;
            layers.push(layer);
            bar.inc(1);
        }
    } else {
        for _ in 0..copies {
            layers.push(pool.install(|| build_layer(args, shape, max_m))?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let backend = layers[0]
        .backend()
        .ok_or_else(|| CliError("the layer did not report its backend".into()))?;
    if !out.json {
        println!(
            "{:<18} layer: kernel {} ({} copies, {:.0} MiB)",
            shape.name,
            backend.kernel,
            copies,
            (layer_bytes * copies as u64) as f64 / (1 << 20) as f64
        );
    }
    let ops = backend.ops;
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
        // The loop runs on one of the pool's threads, which takes part in every call; the
        // stages alternate call by call so that drifts of the machine reach both alike.
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
