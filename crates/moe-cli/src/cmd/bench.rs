//! `moe bench`: times the fused W4A8 pipeline (group 32), or with `--format w8a8` the W8A8 one
//! (int8 per channel), or with `--format w4a16` the weight-only int4 one (f32 compute), on
//! standard MoE shapes with uniform random routing, cycling through
//! enough independent copies of the layer that the weights cannot stay in the caches, and
//! relates each time to this machine's DRAM bound.
//!
//! Weights are random codes and scales drawn directly (values do not change the work), and
//! the copies are clones of one packed layer in separate allocations: what defeats the caches
//! is distinct memory, not distinct values.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use moe_kernels::moe::ExpertMatrix;
use moe_kernels::{Isa, KernelSet, MoeInput, Par, W4A8Prefill, kernels};
use serde::Serialize;

use super::synth::{self, LayerShape, Rng};
use super::{CliError, Output, median_ms, parse_bytes, thread_pool};

/// Bytes the DRAM bound's streaming read covers at most: far beyond the caches of the machines
/// this runs on, and quick (a few tenths of a second).
const DRAM_PROBE_MAX_BYTES: u64 = 1 << 30;
/// ... and at least, so that the probe does not measure the L3 when `--min-bytes` is small.
const DRAM_PROBE_MIN_BYTES: u64 = 256 << 20;

/// A named MoE shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BenchShape {
    /// Name (`qwen3-30b-a3b`, or `custom` for `eE-kK-hH-iI`).
    pub name: String,
    /// Experts E.
    pub experts: usize,
    /// Experts per token k.
    pub top_k: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
}

/// The standard shapes, by name.
const STANDARD: [(&str, [usize; 4]); 3] = [
    ("qwen3-30b-a3b", [128, 8, 2048, 768]),
    ("mixtral-8x7b", [8, 2, 4096, 14336]),
    ("deepseek-v2-lite", [64, 6, 2048, 1408]),
];

/// Parses a standard shape name or a custom `eE-kK-hH-iI` (e.g. `e8-k2-h128-i64`).
fn parse_shape(text: &str) -> Result<BenchShape, String> {
    let make = |name: &str, [experts, top_k, hidden, intermediate]: [usize; 4]| BenchShape {
        name: name.to_string(),
        experts,
        top_k,
        hidden,
        intermediate,
    };
    if let Some((name, dims)) = STANDARD.iter().find(|(n, _)| *n == text) {
        return Ok(make(name, *dims));
    }
    let usage = || {
        let names: Vec<&str> = STANDARD.iter().map(|(n, _)| *n).collect();
        format!(
            "unknown shape {text:?}: use one of {} or eE-kK-hH-iI (e.g. e8-k2-h128-i64)",
            names.join(", ")
        )
    };
    let parts: Vec<&str> = text.split('-').collect();
    if parts.len() != 4 {
        return Err(usage());
    }
    let mut dims = [0usize; 4];
    for ((part, prefix), dim) in parts.iter().zip(["e", "k", "h", "i"]).zip(&mut dims) {
        *dim = part
            .strip_prefix(prefix)
            .and_then(|v| v.parse().ok())
            .ok_or_else(usage)?;
    }
    Ok(make(text, dims))
}

/// The expert weight format a benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchFormat {
    /// Int4 weights with bf16 group scales, int8 asymmetric per-token activations.
    W4a8,
    /// Int8 weights with per-channel scales, int8 symmetric per-token activations.
    W8a8,
    /// Int4 weights with bf16 group scales, float activations, f32 compute (weight-only).
    W4a16,
    /// FP8 block-quantized weights (e4m3, f32 scales per 128 × 128 block; `--group-size` is
    /// ignored), float activations, f32 compute on the WNA16 kernels.
    Fp8,
}

impl BenchFormat {
    /// How the report names the format.
    fn describe(self, group_size: usize) -> String {
        match self {
            Self::W4a8 => format!("W4A8 (int4 groups of {group_size})"),
            Self::W8a8 => "W8A8 (int8 per channel)".to_string(),
            Self::W4a16 => format!("W4A16 (int4 groups of {group_size}, f32 compute)"),
            Self::Fp8 => "FP8 (e4m3, 128 x 128 blocks, f32 compute)".to_string(),
        }
    }
}

/// Options of `moe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Expert weight format.
    #[arg(long, value_enum, default_value = "w4a8")]
    pub format: BenchFormat,
    /// Shapes to run (standard names or eE-kK-hH-iI), comma-separated; default: all standard.
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub shape: Vec<BenchShape>,
    /// Batch sizes (tokens per call), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub batch_sizes: Vec<usize>,
    /// Timed calls per (shape, batch size); the median is reported.
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Untimed calls before the timed ones, for at least this many milliseconds (at least one
    /// call).
    #[arg(long, default_value_t = 500)]
    pub warmup_ms: u64,
    /// Least total bytes of distinct packed weights to cycle through (K, M, G suffixes).
    #[arg(long, default_value = "2G", value_parser = parse_bytes)]
    pub min_bytes: u64,
    /// Int4 group size (W4A8 and W4A16).
    #[arg(long, default_value_t = 32)]
    pub group_size: usize,
    /// Worker threads (0 = available parallelism).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Seed of weights, inputs and routing.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Rungs to run, comma-separated (e.g. `amx,avx512-vnni`): every (shape, batch size) runs
    /// on each in turn, on the same weights, and the rows name their rung; default: the
    /// dispatcher's choice.
    #[arg(long, value_delimiter = ',')]
    pub isa: Vec<Isa>,
    /// W4A8 numerics for calls with many rows per expert: `int8` (bit-equal to vLLM's W4A8
    /// kernel) or `bf16` (bf16 activations and weights on the AMX-BF16 tiles, where the rung
    /// has them); default: the process's (`MOE_KERNELS_W4A8_PREFILL`, else int8).
    #[arg(long, value_parser = parse_prefill)]
    pub w4a8_prefill: Option<W4A8Prefill>,
    /// DRAM read bandwidth the bound divides by, GB/s; default: measured here by a streaming
    /// read on the benchmark's threads before the rows.
    #[arg(long)]
    pub dram_gbs: Option<f64>,
    /// Time the road a runtime takes instead of the fused pipeline: `MoeLayer::apply` from
    /// router logits (`block`: routing, experts, shared experts) and `apply_with_topk` with
    /// the routing precomputed (`experts`), on layers built through `load_expert_tensor` and
    /// `process` (W4A8).
    #[arg(long)]
    pub layer: bool,
    /// Also time each stage of the fused pipeline (route, gather, gate/up, activation, down,
    /// reduce; the GEMM stages include their activation quantisation), in ms per call summed
    /// over the lanes that run at once.
    #[arg(long, conflicts_with = "layer")]
    pub breakdown: bool,
}

/// Milliseconds per call spent in each stage of the fused pipeline, summed over the lanes
/// that ran at once (`--breakdown`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StageBreakdown {
    /// Bucketing the routed pairs by expert.
    pub route_ms: f64,
    /// Gathering the input rows.
    pub gather_ms: f64,
    /// Gate/up GEMMs (with activation quantisation).
    pub gate_up_ms: f64,
    /// The activation.
    pub activation_ms: f64,
    /// Down GEMMs (with activation quantisation) and the router weight.
    pub down_ms: f64,
    /// Summing each token's expert outputs.
    pub reduce_ms: f64,
}

impl StageBreakdown {
    fn per_call(t: moe_kernels::StageTimes) -> Self {
        let calls = t.calls.max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3 / calls;
        Self {
            route_ms: ms(t.route),
            gather_ms: ms(t.gather),
            gate_up_ms: ms(t.gate_up),
            activation_ms: ms(t.activation),
            down_ms: ms(t.down),
            reduce_ms: ms(t.reduce),
        }
    }
}

/// Parses `int8` or `bf16`.
fn parse_prefill(text: &str) -> Result<W4A8Prefill, String> {
    match text {
        "int8" => Ok(W4A8Prefill::ExactInt8),
        "bf16" => Ok(W4A8Prefill::Bf16Tiles),
        _ => Err(format!("unknown W4A8 prefill {text:?}: use int8 or bf16")),
    }
}

/// The report, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// The expert weight format.
    pub format: BenchFormat,
    /// Worker threads.
    pub threads: usize,
    /// The DRAM bandwidth the bound assumes, bytes per second.
    pub dram_bytes_per_s: f64,
    /// Where that figure comes from (`measured` or `given`).
    pub dram_source: &'static str,
    /// The rung moe-kernels dispatches to.
    pub isa: &'static str,
    /// One row per (shape, batch size).
    pub rows: Vec<BenchRow>,
}

/// One measurement.
#[derive(Debug, Serialize)]
pub struct BenchRow {
    /// The shape.
    pub shape: BenchShape,
    /// The rung that ran.
    pub isa: &'static str,
    /// What was timed: `fused` (`FusedMoe::apply`), or with `--layer` `block`
    /// (`MoeLayer::apply` from router logits) and `experts` (`MoeLayer::apply_with_topk`).
    pub stage: &'static str,
    /// What the rung's kernel set runs per op (e.g. `w4a8_gemm: avx512-vnni below 16 rows,
    /// amx from 16`).
    pub ops: Vec<String>,
    /// Layer copies cycled through.
    pub copies: usize,
    /// Total distinct packed weight bytes (all copies).
    pub distinct_bytes: u64,
    /// Tokens per call M.
    pub batch: usize,
    /// Median milliseconds per call.
    pub ms_per_call: f64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Mean distinct experts a call touches.
    pub experts_touched: f64,
    /// Mean packed bytes a call reads.
    pub bytes_touched: f64,
    /// Weight bytes read per second, GB/s.
    pub weight_gb_per_s: f64,
    /// int8 multiply-accumulates per second, `M·k·3·H·I / t`, in G/s.
    pub gmac_per_s: f64,
    /// The time reading the touched weights from DRAM takes, ms.
    pub dram_bound_ms: f64,
    /// `dram_bound_ms / ms_per_call` (1 = at the DRAM bound; above 1 = partly cache-served).
    pub dram_ratio: f64,
    /// With `--breakdown`, the time per stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stages: Option<StageBreakdown>,
}

/// Prints one row of the human report: `label` in the rung column, `ratio` in the last, and
/// the stage times on a line of their own when the row has them.
pub(super) fn print_row(row: &BenchRow, label: &str, ratio: f64) {
    println!(
        "{:<18} {:>5} {:>10.3} {:>11.1} {:>8.1} {:>9.2} {:>9.2} {:>10.3} {:>6.2}  {:<12} {:>8.2}",
        row.shape.name,
        row.batch,
        row.ms_per_call,
        row.tokens_per_s,
        row.experts_touched,
        row.weight_gb_per_s,
        row.gmac_per_s,
        row.dram_bound_ms,
        row.dram_ratio,
        label,
        ratio
    );
    if let Some(b) = &row.stages {
        println!(
            "{:<24} route {:.3}, gather {:.3}, gate/up {:.3}, activation {:.3}, down {:.3}, reduce {:.3} (ms per call, summed over lanes)",
            "  stages:",
            b.route_ms,
            b.gather_ms,
            b.gate_up_ms,
            b.activation_ms,
            b.down_ms,
            b.reduce_ms
        );
    }
}

/// `k` distinct experts out of `e` per token, uniformly, with random renormalized weights.
fn uniform_routing(rng: &mut Rng, m: usize, e: usize, k: usize) -> (Vec<i32>, Vec<f32>) {
    let mut ids = Vec::with_capacity(m * k);
    let mut weights = Vec::with_capacity(m * k);
    let mut perm: Vec<i32> = (0..e as i32).collect();
    for _ in 0..m {
        for j in 0..k {
            let pick = j + rng.below(e - j);
            perm.swap(j, pick);
        }
        ids.extend_from_slice(&perm[..k]);
        let w: Vec<f32> = (0..k).map(|_| rng.unit()).collect();
        let sum: f32 = w.iter().sum();
        weights.extend(w.iter().map(|v| v / sum));
    }
    (ids, weights)
}

/// Runs `moe bench`.
pub fn run(args: &BenchArgs, out: Output) -> Result<(), CliError> {
    let shapes: Vec<BenchShape> = if args.shape.is_empty() {
        STANDARD
            .iter()
            .map(|(n, _)| parse_shape(n).map_err(CliError))
            .collect::<Result<_, _>>()?
    } else {
        args.shape.clone()
    };
    if args.batch_sizes.is_empty() || args.batch_sizes.contains(&0) {
        return Err(CliError("--batch-sizes must be positive numbers".into()));
    }
    if args.iters == 0 {
        return Err(CliError("--iters must be at least 1".into()));
    }
    let rungs: Vec<KernelSet> = rung_sets(&args.isa)?
        .into_iter()
        .map(|ks| match args.w4a8_prefill {
            Some(p) => ks.with_w4a8_prefill(p),
            None => ks,
        })
        .collect();
    if args.layer && !args.isa.is_empty() {
        return Err(CliError(
            "--layer runs the kernels the layer selects; leave out --isa".into(),
        ));
    }
    let pool = thread_pool(args.threads)?;
    let threads = pool.current_num_threads();
    let isa = kernels().isa().name();
    let (dram, dram_source) = match args.dram_gbs {
        Some(g) if g.is_finite() && g > 0.0 => (g * 1e9, "given"),
        Some(g) => {
            return Err(CliError(format!(
                "--dram-gbs must be a positive number of GB/s, not {g}"
            )));
        }
        None => {
            let bytes = args
                .min_bytes
                .clamp(DRAM_PROBE_MIN_BYTES, DRAM_PROBE_MAX_BYTES);
            (measure_dram(&pool, bytes as usize), "measured")
        }
    };
    if !out.json {
        if args.layer {
            println!(
                "moe bench --layer: MoeLayer with {} experts, softmax top-k routing of random logits, {threads} threads, rung {isa}",
                args.format.describe(args.group_size)
            );
            println!(
                "  block = apply(hidden, logits): routing + experts + shared; experts = apply_with_topk on that routing; last column: ratio to experts"
            );
        } else {
            println!(
                "moe bench: fused {} MoE, uniform random routing, {threads} threads, rung {isa}",
                args.format.describe(args.group_size)
            );
        }
        let how = match dram_source {
            "given" => "given with --dram-gbs".to_string(),
            _ => format!("measured: streaming read on {threads} threads"),
        };
        println!(
            "  cycling through >= {:.0} MiB of distinct weights; DRAM bound = bytes / {:.1} GB/s ({how})",
            args.min_bytes as f64 / (1 << 20) as f64,
            dram / 1e9
        );
        println!();
        println!(
            "{:<18} {:>5} {:>10} {:>11} {:>8} {:>9} {:>9} {:>10} {:>6}  {:<12} {:>8}",
            "shape",
            "M",
            "ms/call",
            "tokens/s",
            "experts",
            "GB/s",
            "GMAC/s",
            "DRAM ms",
            "ratio",
            "rung",
            "vs first"
        );
    }
    let mut rows = Vec::new();
    for shape in &shapes {
        if args.layer {
            rows.extend(super::bench_layer::bench_shape(
                args, shape, dram, &pool, out,
            )?);
        } else {
            rows.extend(bench_shape(args, shape, &rungs, dram, &pool, out)?);
        }
    }
    if out.json {
        out.print_json(&BenchReport {
            format: args.format,
            threads,
            dram_bytes_per_s: dram,
            dram_source,
            isa,
            rows,
        })?;
    }
    Ok(())
}

/// The best of three timed reads of `bytes` of freshly written memory by every pool thread, in
/// bytes per second: what the weight stream of a decode call can reach at most here.
fn measure_dram(pool: &rayon::ThreadPool, bytes: usize) -> f64 {
    use rayon::prelude::*;
    let words = (bytes / 8).max(1);
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(pool.current_num_threads().max(1));
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let sum = pool.install(|| {
            buf.par_chunks(chunk)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    }
    best
}

/// The kernel sets of the requested rungs, or the dispatcher's when none is named.
fn rung_sets(isas: &[Isa]) -> Result<Vec<KernelSet>, CliError> {
    if isas.is_empty() {
        return Ok(vec![*kernels()]);
    }
    isas.iter()
        .map(|&isa| {
            KernelSet::for_isa(isa).ok_or_else(|| {
                CliError(format!(
                    "--isa {}: this CPU (or MOE_KERNELS_MAX_ISA) does not allow that rung; `moe cpu` lists the ladder",
                    isa.name()
                ))
            })
        })
        .collect()
}

/// Generates one shape's layer in the requested format and measures it on every rung.
fn bench_shape(
    args: &BenchArgs,
    shape: &BenchShape,
    rungs: &[KernelSet],
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
    let layer_shape = LayerShape {
        experts: e,
        hidden: h,
        intermediate: i,
        group_size: args.group_size,
    };
    let bar = out.progress(e as u64, &format!("{}: packing", shape.name));
    match args.format {
        BenchFormat::W4a8 => {
            let layer = pool.install(|| synth::random_codes_layer(layer_shape, args.seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::W8a8 => {
            let layer = pool.install(|| synth::random_int8_layer(layer_shape, args.seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::W4a16 => {
            let layer = pool.install(|| synth::random_wna16_layer(layer_shape, args.seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::Fp8 => {
            let layer = pool.install(|| synth::random_fp8_layer(layer_shape, args.seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
    }
}

/// Points every copy at `ks`.
fn retarget<W: ExpertMatrix>(layers: &mut Vec<moe_kernels::FusedMoe<W>>, ks: KernelSet) {
    let taken = std::mem::take(layers);
    layers.extend(taken.into_iter().map(|l| l.with_kernels(ks)));
}

/// Cycles copies of `layer` and measures every batch size on every rung.
fn measure_layer<W: ExpertMatrix + Clone>(
    args: &BenchArgs,
    shape: &BenchShape,
    layer: synth::SynthLayer<W>,
    rungs: &[KernelSet],
    dram: f64,
    pool: &rayon::ThreadPool,
    out: Output,
) -> Result<Vec<BenchRow>, CliError> {
    let (e, k, h, i) = (shape.experts, shape.top_k, shape.hidden, shape.intermediate);
    let layer_bytes = (layer.expert_bytes * e) as u64;
    let copies = args.min_bytes.div_ceil(layer_bytes.max(1)).max(1) as usize;
    let bar = out.progress(copies as u64, &format!("{}: copying layer", shape.name));
    bar.inc(1);
    let mut layers = Vec::with_capacity(copies);
    for _ in 1..copies {
        layers.push(layer.moe.clone());
        bar.inc(1);
    }
    layers.push(layer.moe);
    bar.finish_and_clear();

    let max_m = args.batch_sizes.iter().copied().max().unwrap_or(1);
    let threads = pool.current_num_threads();
    let mut scratch = layers[0]
        .scratch(max_m, k, threads)
        .map_err(|err| CliError::context("scratch", err))?;
    let mut rng = Rng::stream(args.seed, 0xBE_7C);
    let mut x = vec![0.0f32; max_m * h];
    rng.fill_normal(&mut x, 1.0);
    let mut output = vec![0.0f32; max_m * h];
    let mut rows = Vec::new();
    for &m in &args.batch_sizes {
        let routings: Vec<(Vec<i32>, Vec<f32>)> = (0..args.iters)
            .map(|_| uniform_routing(&mut rng, m, e, k))
            .collect();
        let out_m = &mut output[..m * h];
        let bar = out.progress(args.iters as u64 + 1, &format!("{}: M={m}", shape.name));
        let mut stage_sums = vec![moe_kernels::StageTimes::default(); rungs.len()];
        // Call `(routing, copy)` on rung `r`: the copies rotate over every call, so no call
        // finds the weights another rung has just read in the caches.
        let mut call = |layers: &mut Vec<_>, r: usize, routing: usize, copy: usize, timed: bool| {
            let (ids, weights) = &routings[routing % routings.len()];
            let input = MoeInput {
                tokens: m,
                top_k: k,
                x: &x[..m * h],
                topk_ids: ids,
                topk_weights: weights,
            };
            retarget(layers, rungs[r]);
            let moe: &moe_kernels::FusedMoe<W> = &layers[copy % copies];
            if args.breakdown {
                scratch.record_stage_times(true);
            }
            let t0 = Instant::now();
            moe.apply(input, &mut *out_m, &mut scratch, Par::Rayon)
                .map_err(|err| CliError::context("applying the layer", err))?;
            let elapsed = t0.elapsed();
            if timed {
                stage_sums[r] += scratch.stage_times();
            }
            Ok::<_, CliError>(elapsed)
        };
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(args.iters); rungs.len()];
        // The whole loop runs on one of the pool's threads, which then takes part in every
        // call, as the calling thread of an OpenMP runtime (vLLM's) does; a call from outside
        // the pool would add a hand-off to the pool and back to each call. With several rungs
        // the calls go round the rungs, so that drifts of the machine (clock, neighbours)
        // reach all of them alike.
        let warmup = Duration::from_millis(args.warmup_ms);
        let warm_rounds = pool.install(|| -> Result<usize, CliError> {
            // Untimed calls until the warm-up time has passed (at least one round): on a VM
            // the second vCPU and the pool's threads reach their steady pace only after some
            // sustained work, and a layer inside a model runs back to back with its
            // neighbours, not cold.
            let (mut rounds, mut warm_time, mut copy) = (0usize, Duration::ZERO, 0usize);
            while rounds == 0 || warm_time < warmup {
                for r in 0..rungs.len() {
                    warm_time += call(&mut layers, r, rounds, copy, false)?;
                    copy += 1;
                }
                rounds += 1;
            }
            bar.inc(1);
            for it in 0..args.iters {
                for (r, rung_samples) in samples.iter_mut().enumerate() {
                    rung_samples.push(call(&mut layers, r, rounds + it, copy, true)?);
                    copy += 1;
                }
                bar.inc(1);
            }
            Ok(rounds)
        })?;
        bar.finish_and_clear();
        let touched: usize = (0..args.iters)
            .map(|it| {
                routings[(warm_rounds + it) % routings.len()]
                    .0
                    .iter()
                    .collect::<HashSet<_>>()
                    .len()
            })
            .sum();
        let mut first_ms = None;
        for ((ks, mut samples), stage_sum) in rungs.iter().zip(samples).zip(stage_sums) {
            let ms = median_ms(&mut samples);
            let secs = (ms / 1e3).max(f64::MIN_POSITIVE);
            let experts_touched = touched as f64 / args.iters as f64;
            let bytes = experts_touched * layer.expert_bytes as f64;
            let macs = (m * k * 3 * h * i) as f64;
            let dram_ms = bytes / dram * 1e3;
            let first = *first_ms.get_or_insert(ms);
            let row = BenchRow {
                shape: shape.clone(),
                isa: ks.isa().name(),
                stage: "fused",
                ops: ks.describe_ops(),
                copies,
                distinct_bytes: layer_bytes * copies as u64,
                batch: m,
                ms_per_call: ms,
                tokens_per_s: m as f64 / secs,
                experts_touched,
                bytes_touched: bytes,
                weight_gb_per_s: bytes / secs / 1e9,
                gmac_per_s: macs / secs / 1e9,
                dram_bound_ms: dram_ms,
                dram_ratio: dram_ms / ms.max(f64::MIN_POSITIVE),
                stages: args.breakdown.then(|| StageBreakdown::per_call(stage_sum)),
            };
            if !out.json {
                print_row(&row, row.isa, ms / first);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_by_name_and_by_dimensions() {
        assert_eq!(parse_shape("mixtral-8x7b").unwrap().intermediate, 14336);
        let s = parse_shape("e8-k2-h128-i64").unwrap();
        assert_eq!(
            (s.experts, s.top_k, s.hidden, s.intermediate),
            (8, 2, 128, 64)
        );
        assert!(parse_shape("llama").is_err());
        assert!(parse_shape("e8-k2-h128").is_err());
    }

    #[test]
    fn uniform_routing_picks_distinct_experts() {
        let (ids, w) = uniform_routing(&mut Rng::new(1), 50, 8, 3);
        for (row, wr) in ids.chunks(3).zip(w.chunks(3)) {
            let set: HashSet<_> = row.iter().collect();
            assert_eq!(set.len(), 3);
            assert!((wr.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}
