//! `moe demo`: the newcomer's first run. Builds a Qwen3-30B-A3B-shaped MoE layer from seeded
//! random weights (no download), quantizes it to W4A8 (int4 weights in groups of 32 with bf16
//! scales, int8 activations), routes random tokens with renormalized softmax top-k, lets the
//! oracle pick the backend, then times the layer for a few batch sizes and checks it against an
//! f32 reference on the dequantized weights.
//!
//! By default the layer takes the road a runtime takes: `MoeLayer::create`, every expert's codes
//! and scales through `load_expert_tensor`, `process`, and `apply` from the router logits.
//! `--experts-only` runs the fused expert pipeline alone (`FusedMoe::apply` on the demo's own
//! routing of the same logits), as the demo did before.

use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use moe_kernels::{Par, kernels};
use moe_layer::{
    ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind, TensorView,
};
use moe_oracle::MoeShape;
use moe_quant::{DType, WeightGroups};
use moe_router::{IdsOut, Logits, Router, RouterConfig};
use rayon::prelude::*;
use serde::Serialize;

use super::reference::{self, Contributions, RefTokens};
use super::synth::{self, ExpertQuant, LayerShape, NormalExpert, Rng};
use super::{CliError, Output, backend, median_ms, thread_pool};

/// Relative L2 error above which the demo's verdict is a failure (W4A8 is expected at ~1–2 %).
const MAX_REL_ERROR: f64 = 0.05;

/// Options of `moe demo`; the defaults are one MoE layer of Qwen3-30B-A3B.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of experts E.
    #[arg(long, default_value_t = 128)]
    pub experts: usize,
    /// Experts per token k.
    #[arg(long, default_value_t = 8)]
    pub top_k: usize,
    /// Hidden size H.
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    /// Intermediate size I per expert.
    #[arg(long, default_value_t = 768)]
    pub intermediate: usize,
    /// Int4 group size (a multiple of 32 dividing H and I).
    #[arg(long, default_value_t = 32)]
    pub group_size: usize,
    /// Batch sizes (tokens per call) to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub batch_sizes: Vec<usize>,
    /// Worker threads (0 = available parallelism).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Seed of the weights, hidden states and router logits.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Timed calls per batch size (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Tokens checked against the f32 reference (the first ones of each batch).
    #[arg(long, default_value_t = 8)]
    pub ref_tokens: usize,
    /// Run the fused expert pipeline alone (`FusedMoe::apply`) instead of the road a runtime
    /// takes (`MoeLayer` built by create, load, process, applied from router logits).
    #[arg(long)]
    pub experts_only: bool,
}

/// The demo's result, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// Experts E.
    pub experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    /// Int4 group size.
    pub group_size: usize,
    /// Worker threads.
    pub threads: usize,
    /// Seed.
    pub seed: u64,
    /// The oracle's backend (e.g. `cpu`).
    pub backend: String,
    /// The oracle's kernel and rung (e.g. `cpu-int4-w4a8/avx512-vnni`).
    pub kernel: String,
    /// The rung moe-kernels dispatches to.
    pub isa: &'static str,
    /// What was timed: `layer` (`MoeLayer::apply` from router logits) or `experts-only`
    /// (`FusedMoe::apply`).
    pub road: &'static str,
    /// Packed weight bytes of the layer.
    pub packed_bytes: usize,
    /// Seconds spent generating, quantizing and packing the weights (reference included).
    pub generation_s: f64,
    /// One row per batch size.
    pub results: Vec<DemoRow>,
    /// Whether every batch size stayed under the error threshold.
    pub ok: bool,
}

/// One batch size's figures.
#[derive(Debug, Serialize)]
pub struct DemoRow {
    /// Tokens per call.
    pub batch: usize,
    /// Median milliseconds per call.
    pub ms_per_call: f64,
    /// Tokens per second at that median.
    pub tokens_per_s: f64,
    /// The rung the W4A8 GEMM runs on for this many rows.
    pub gemm_isa: &'static str,
    /// Tokens compared with the reference.
    pub ref_tokens: usize,
    /// Relative L2 error against the f32 reference.
    pub rel_l2_error: f64,
    /// Largest absolute difference to the f32 reference.
    pub max_abs_error: f64,
}

/// Runs `moe demo`.
pub fn run(args: &DemoArgs, out: Output) -> Result<(), CliError> {
    let shape = LayerShape {
        experts: args.experts,
        hidden: args.hidden,
        intermediate: args.intermediate,
        group_size: args.group_size,
    };
    shape.validate()?;
    let (e, k, h, i) = (args.experts, args.top_k, args.hidden, args.intermediate);
    if k == 0 || k > e {
        return Err(CliError(format!(
            "--top-k {k} must be between 1 and --experts {e}"
        )));
    }
    let max_m = args.batch_sizes.iter().copied().max().unwrap_or(0);
    if max_m == 0 || args.batch_sizes.contains(&0) {
        return Err(CliError("--batch-sizes must be positive numbers".into()));
    }
    let pool = thread_pool(args.threads)?;
    let threads = pool.current_num_threads();

    if !out.json {
        let origin = if (e, k, h, i) == (128, 8, 2048, 768) {
            " (the shape of a Qwen3-30B-A3B MoE layer)"
        } else {
            ""
        };
        println!("moe demo: one MoE layer, E={e} experts, top-k={k}, H={h}, I={i}{origin}");
        println!(
            "  weights: seeded random normal(0, 0.02) f32 -> int4, groups of {} with bf16 scales (W4A8: int8 activations)",
            args.group_size
        );
        println!(
            "  routing: softmax top-{k} over random logits, renormalized; {threads} threads, seed {}",
            args.seed
        );
        if args.experts_only {
            println!(
                "  road: experts only (FusedMoe::apply on that routing; the layer's own routing and checks not run)"
            );
        } else {
            println!(
                "  road: layer (MoeLayer built by create, load_expert_tensor, process; apply from the router logits)"
            );
        }
    }
    let selection = backend::select_w4a8(
        MoeShape {
            num_experts: e,
            experts_per_token: k,
            hidden_dim: h,
            intermediate_size: i,
        },
        WeightGroups::groups(args.group_size).map_err(|e| CliError::context("--group-size", e))?,
    )?;
    let isa = kernels().isa().name();
    if !out.json {
        println!(
            "  backend: {} -> kernel {} (moe-kernels rung: {isa})",
            selection.backend, selection.kernel
        );
    }

    // Inputs for the largest batch; a batch of m tokens is its first m rows.
    let mut rng = Rng::new(args.seed ^ 0xD3E0);
    let mut x = vec![0.0f32; max_m * h];
    rng.fill_normal(&mut x, 1.0);
    let mut logits = vec![0.0f32; max_m * e];
    rng.fill_normal(&mut logits, 1.0);
    let router = Router::new(RouterConfig::cpu_softmax(e, k).with_renormalize(true))
        .map_err(|err| CliError::context("router", err))?;
    let mut weights = vec![0.0f32; max_m * k];
    let mut ids = vec![0i32; max_m * k];
    router
        .route_into(
            Logits::F32(&logits),
            &mut weights,
            IdsOut::I32(&mut ids),
            &mut router.new_scratch(),
        )
        .map_err(|err| CliError::context("routing", err))?;

    let r = args.ref_tokens.min(max_m);
    let tokens = RefTokens {
        x: &x[..r * h],
        ids: &ids[..r * k],
        top_k: k,
        hidden: h,
        intermediate: i,
        group_size: args.group_size,
    };
    let started = Instant::now();
    let bar = out.progress(e as u64, "quantizing + packing experts");
    let contribute = |q: ExpertQuant<'_>| reference::expert_contributions(&tokens, &q);
    let (road, contributions) = if args.experts_only {
        let (layer, seen) =
            pool.install(|| synth::normal_layer(shape, args.seed, &bar, contribute))?;
        (Road::Fused(Box::new(layer)), seen)
    } else {
        let (layer, seen) =
            pool.install(|| build_layer(shape, k, max_m, args.seed, &bar, contribute))?;
        (Road::Layer(Box::new(layer)), seen)
    };
    bar.finish_and_clear();
    let contributions = contributions.into_iter().collect::<Result<Vec<_>, _>>()?;
    let want = reference::combine(r, k, h, &weights[..r * k], contributions);
    let generation_s = started.elapsed().as_secs_f64();
    let packed_bytes = match &road {
        Road::Fused(layer) => layer.expert_bytes * e,
        // int4 nibbles and a bf16 scale per group, as the fused layer's packer counts them.
        Road::Layer(_) => e * (3 * h * i / 2 + 3 * h * i / args.group_size * 2),
    };
    let kernel = match &road {
        Road::Layer(layer) => layer
            .backend()
            .map_or_else(|| selection.kernel.to_string(), |b| b.kernel),
        Road::Fused(_) => selection.kernel.to_string(),
    };
    if !out.json {
        println!(
            "  packed {:.1} MiB of expert weights in {generation_s:.1} s",
            packed_bytes as f64 / (1 << 20) as f64
        );
    }

    let mut scratch = match &road {
        Road::Fused(layer) => Some(
            layer
                .moe
                .scratch(max_m, k, threads)
                .map_err(|err| CliError::context("scratch", err))?,
        ),
        Road::Layer(_) => None,
    };
    let mut output = vec![0.0f32; max_m * h];
    let mut results = Vec::new();
    for &m in &args.batch_sizes {
        let input = moe_kernels::MoeInput {
            tokens: m,
            top_k: k,
            x: &x[..m * h],
            topk_ids: &ids[..m * k],
            topk_weights: &weights[..m * k],
        };
        let out_m = &mut output[..m * h];
        let mut samples = Vec::with_capacity(args.reps);
        for rep in 0..=args.reps.max(1) {
            let t0 = Instant::now();
            pool.install(|| match (&road, scratch.as_mut()) {
                (Road::Fused(layer), Some(scratch)) => layer
                    .moe
                    .apply(input, &mut *out_m, scratch, Par::Rayon)
                    .map_err(|err| CliError::context("applying the layer", err)),
                (Road::Layer(layer), _) => layer
                    .apply(&x[..m * h], Logits::F32(&logits[..m * e]), &mut *out_m)
                    .map_err(|err| CliError::context("applying the layer", err)),
                (Road::Fused(_), None) => Err(CliError("no scratch for the fused layer".into())),
            })?;
            // The first call warms caches and pages; it is not timed.
            if rep > 0 {
                samples.push(t0.elapsed());
            }
        }
        let ms = median_ms(&mut samples);
        let rm = r.min(m);
        let (rel, max_abs) = reference::compare(&out_m[..rm * h], &want[..rm * h]);
        results.push(DemoRow {
            batch: m,
            ms_per_call: ms,
            tokens_per_s: m as f64 / (ms / 1e3).max(f64::MIN_POSITIVE),
            gemm_isa: kernels().w4a8_isa(m, args.group_size).name(),
            ref_tokens: rm,
            rel_l2_error: rel,
            max_abs_error: max_abs,
        });
    }
    let ok = results
        .iter()
        .all(|row| row.rel_l2_error.is_finite() && row.rel_l2_error < MAX_REL_ERROR);
    let report = DemoReport {
        experts: e,
        top_k: k,
        hidden: h,
        intermediate: i,
        group_size: args.group_size,
        threads,
        seed: args.seed,
        backend: selection.backend.to_string(),
        kernel,
        isa,
        road: if args.experts_only {
            "experts-only"
        } else {
            "layer"
        },
        packed_bytes,
        generation_s,
        results,
        ok,
    };
    if out.json {
        out.print_json(&report)?;
    } else {
        print_table(&report);
    }
    if ok {
        Ok(())
    } else {
        Err(CliError(format!(
            "relative error above {:.0} % against the f32 reference",
            MAX_REL_ERROR * 100.0
        )))
    }
}

/// The layer being timed, on either road.
enum Road {
    /// `FusedMoe` alone.
    Fused(Box<synth::SynthLayer>),
    /// `MoeLayer`, processed.
    Layer(Box<MoeLayer>),
}

/// One projection as `load_expert_tensor` takes it: which, `[rows, cols]`, codes, scales.
type Projection<'a> = (ExpertShard, usize, usize, &'a [i8], &'a [half::bf16]);

/// The demo layer built as a runtime builds it: `MoeLayer::create` (softmax top-k,
/// renormalized, f32 activations), every expert's gate, up and down codes and bf16 scales
/// through `load_expert_tensor`, then `process`. Experts are drawn and quantized in parallel,
/// as many at a time as the pool has threads, ticking `bar` once per expert; `visit` sees each
/// one's codes and scales, and its results are returned in expert order.
fn build_layer(
    shape: LayerShape,
    top_k: usize,
    max_tokens: usize,
    seed: u64,
    bar: &ProgressBar,
    visit: impl Fn(ExpertQuant<'_>) -> Result<Contributions, CliError> + Sync,
) -> Result<(MoeLayer, Vec<Result<Contributions, CliError>>), CliError> {
    let (e, h, i, g) = (
        shape.experts,
        shape.hidden,
        shape.intermediate,
        shape.group_size,
    );
    let cfg = MoeLayerConfig::new(
        e,
        top_k,
        h,
        i,
        LayerQuant::W4A8 {
            group_size: WeightGroups::groups(g)
                .map_err(|e| CliError::context("--group-size", e))?,
        },
    )
    .with_router(RouterConfig::cpu_softmax(e, top_k).with_renormalize(true))
    .with_in_dtype(DType::F32)
    .with_max_tokens(max_tokens);
    let mut layer = MoeLayer::create(cfg).map_err(|err| CliError::context("creating", err))?;
    let mut seen = Vec::with_capacity(e);
    let batch = rayon::current_num_threads().max(1);
    for first in (0..e).step_by(batch) {
        let drawn = (first..(first + batch).min(e))
            .into_par_iter()
            .map(|x| {
                let q = NormalExpert::draw(shape, seed, x)?;
                let contributions = q.visit(x, &visit);
                Ok((q, contributions))
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        for (offset, (q, contributions)) in drawn.into_iter().enumerate() {
            let (w13, s13) = (i * h, i * (h / g));
            let tensors: [Projection<'_>; 3] = [
                (
                    ExpertShard::W1,
                    i,
                    h,
                    &q.w13_codes[..w13],
                    &q.w13_scales[..s13],
                ),
                (
                    ExpertShard::W3,
                    i,
                    h,
                    &q.w13_codes[w13..],
                    &q.w13_scales[s13..],
                ),
                (ExpertShard::W2, h, i, &q.w2_codes, &q.w2_scales),
            ];
            for (proj, rows, cols, codes, scales) in tensors {
                let weight = TensorView {
                    name: "weight",
                    shape: &[rows, cols],
                    data: TensorData::I8(codes),
                };
                let scale = TensorView {
                    name: "weight_scale",
                    shape: &[rows, cols / g],
                    data: TensorData::Bf16(scales),
                };
                layer
                    .load_expert_tensor(first + offset, proj, TensorKind::Weight, &weight)
                    .and_then(|()| {
                        layer.load_expert_tensor(first + offset, proj, TensorKind::Scale, &scale)
                    })
                    .map_err(|err| CliError::context("loading", err))?;
            }
            seen.push(contributions);
            bar.inc(1);
        }
    }
    layer
        .process()
        .map_err(|err| CliError::context("processing", err))?;
    Ok((layer, seen))
}

/// The human table and verdict.
fn print_table(r: &DemoReport) {
    println!();
    println!(
        "{:>6} {:>11} {:>12} {:>12} {:>9} {:>13} {:>11}",
        "batch", "ms/call", "tokens/s", "gemm rung", "checked", "rel L2 error", "max |err|"
    );
    for row in &r.results {
        println!(
            "{:>6} {:>11.3} {:>12.1} {:>12} {:>9} {:>12.2}% {:>11.2e}",
            row.batch,
            row.ms_per_call,
            row.tokens_per_s,
            row.gemm_isa,
            row.ref_tokens,
            row.rel_l2_error * 100.0,
            row.max_abs_error
        );
    }
    println!();
    let worst = r
        .results
        .iter()
        .map(|row| row.rel_l2_error)
        .fold(0.0f64, f64::max);
    if r.ok {
        println!(
            "verdict: OK - {} matches the f32 reference within {:.2}% (W4A8 is expected at ~1-2%; the gap is int8 activation rounding)",
            r.kernel,
            worst * 100.0
        );
    } else {
        println!(
            "verdict: FAILED - error up to {:.2}% against the f32 reference (threshold {:.0}%)",
            worst * 100.0,
            MAX_REL_ERROR * 100.0
        );
    }
}
