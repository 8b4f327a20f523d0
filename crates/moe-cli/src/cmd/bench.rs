//! `moe bench`: times a MoE layer in one of the weight formats (`--format`: W4A8 group 32 by
//! default, W8A8, weight-only int4/int8 with or without zero points, dense bf16/f32) on
//! standard MoE shapes, cycling through enough independent copies of the layer that the
//! weights cannot stay in the caches, and relates each time to this machine's DRAM bound.
//!
//! Two roads. By default the road a runtime takes ([`super::bench_layer`]): `MoeLayer`s built
//! through `create`, the per-tensor loaders and `process`, timed from router logits (`block`)
//! and from a precomputed routing (`experts`). With `--experts-only`, the fused expert pipeline
//! alone (`FusedMoe::apply`, uniform random routing), which also offers `--isa`,
//! `--w4a8-prefill` and `--breakdown`; its copies are clones of one packed layer in separate
//! allocations: what defeats the caches is distinct memory, not distinct values.
//!
//! Weights are random codes and scales drawn directly (values do not change the work).

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

/// gpt-oss-20b's MoE block: a named shape, and one of the defaults of `--format mxfp4` only
/// (its 2880 is no multiple of the 128-column groups other formats are often run with).
const GPT_OSS_20B: (&str, [usize; 4]) = ("gpt-oss-20b", [32, 4, 2880, 2880]);

/// Parses a standard shape name or a custom `eE-kK-hH-iI` (e.g. `e8-k2-h128-i64`).
fn parse_shape(text: &str) -> Result<BenchShape, String> {
    let make = |name: &str, [experts, top_k, hidden, intermediate]: [usize; 4]| BenchShape {
        name: name.to_string(),
        experts,
        top_k,
        hidden,
        intermediate,
    };
    if let Some((name, dims)) = STANDARD
        .iter()
        .chain([&GPT_OSS_20B])
        .find(|(n, _)| *n == text)
    {
        return Ok(make(name, *dims));
    }
    let usage = || {
        let names: Vec<&str> = STANDARD
            .iter()
            .chain([&GPT_OSS_20B])
            .map(|(n, _)| *n)
            .collect();
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
    /// Int8 weights with per-channel scales, int8 symmetric per-token activations (on the
    /// layer road: bf16 weights quantized by the online int8 method in `process`).
    W8a8,
    /// Int4 weights with bf16 group scales, float activations (weight-only): f32 FMA, or the
    /// rung's int4 dot-product body (15-bit integer or bf16 activations, exact codes, f32 sums)
    /// and bf16 tiles where it has them (the report names what runs).
    W4a16,
    /// Int8 weights with bf16 group scales, float activations (weight-only), computed as W4A16.
    W8a16,
    /// Unquantized bf16 weights, float activations: f32 FMA, or bf16 products with f32 sums
    /// from the rung's bf16-path row count on.
    Bf16,
    /// Unquantized f32 weights.
    F32,
    /// MXFP4 (gpt-oss): e2m1 codes with an e8m0 scale per 32 columns, float activations on the
    /// WNA16 kernels, SwiGLU-OAI on interleaved gate/up rows.
    Mxfp4,
    /// FP8 block-quantized weights (e4m3, f32 scales per 128 × 128 block; `--group-size` is
    /// ignored), float activations on the WNA16 kernels.
    Fp8,
}

impl BenchFormat {
    /// How the report names the format.
    pub(crate) fn describe(self, group_size: usize, zero_points: bool) -> String {
        let zp = if zero_points { ", zero points" } else { "" };
        match self {
            Self::W4a8 => format!("W4A8 (int4 groups of {group_size})"),
            Self::W8a8 => "W8A8 (int8 per channel)".to_string(),
            Self::W4a16 => format!("W4A16 (int4 groups of {group_size}{zp})"),
            Self::W8a16 => format!("W8A16 (int8 groups of {group_size}{zp})"),
            Self::Bf16 => "dense bf16".to_string(),
            Self::F32 => "dense f32".to_string(),
            Self::Mxfp4 => "MXFP4 (e2m1, e8m0 scales per 32 columns)".to_string(),
            Self::Fp8 => "FP8 (e4m3, 128 x 128 blocks)".to_string(),
        }
    }

    /// The weight-only integer formats: their bits per code.
    pub(crate) fn wna16_bits(self) -> Option<u32> {
        match self {
            Self::W4a16 => Some(4),
            Self::W8a16 => Some(8),
            _ => None,
        }
    }

    /// Whether the format has int4/int8 group scales (and so a `--group-size`).
    pub(crate) fn grouped(self) -> bool {
        matches!(self, Self::W4a8 | Self::W4a16 | Self::W8a16)
    }
}

/// What `moe bench` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Road {
    /// `MoeLayer` built through its lifecycle: `block` and `experts` rows.
    Layer,
    /// `FusedMoe::apply` alone: `fused` rows.
    ExpertsOnly,
}

impl Road {
    /// How the report names the road.
    pub fn name(self) -> &'static str {
        match self {
            Self::Layer => "layer",
            Self::ExpertsOnly => "experts-only",
        }
    }
}

/// Options of `moe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Expert weight format.
    #[arg(long, value_enum, default_value = "w4a8")]
    pub format: BenchFormat,
    /// Shapes to run (standard names, `gpt-oss-20b`, or eE-kK-hH-iI), comma-separated;
    /// default: all standard ones (and `gpt-oss-20b` with `--format mxfp4`).
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
    /// Group size of the int4/int8 scales (W4A8, W4A16, W8A16; MXFP4 blocks are always 32).
    #[arg(long, default_value_t = 32)]
    pub group_size: usize,
    /// Asymmetric weight-only codes: a zero point per scale group (W4A16, W8A16).
    #[arg(long)]
    pub zero_points: bool,
    /// What W4A16 weights are multiplied with on the layer road: `float` (their own numerics)
    /// or `int8` (dynamic per-token int8 activations on the W4A8 kernels, as
    /// `moe run --wna16-activations int8`).
    #[arg(long, value_name = "float|int8", default_value = "float", value_parser = super::parse_wna16_activations)]
    pub wna16_activations: moe_layer::Wna16Activations,
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
    /// kernel), `bf16` (bf16 activations and weights on the AMX-BF16 tiles, where the rung
    /// has them) or `int8-channel` (group-scaled weights requantised to int8 per channel on the
    /// AMX-INT8 tiles, where the rung has them); default: the process's
    /// (`MOE_KERNELS_W4A8_PREFILL`, else int8).
    #[arg(long, value_parser = super::parse_w4a8_prefill)]
    pub w4a8_prefill: Option<W4A8Prefill>,
    /// DRAM read bandwidth the bound divides by, GB/s; default: measured here by a streaming
    /// read on the benchmark's threads before the rows.
    #[arg(long)]
    pub dram_gbs: Option<f64>,
    /// Peak multiply-accumulates per second of the benchmark's threads, G/s (a microbenchmark
    /// of the rung's dot-product instruction gives it); when given, the report carries it and
    /// `--plot` also draws each shape's compute bound, `M·k·3·H·I` MACs / peak.
    #[arg(long)]
    pub peak_gmacs: Option<f64>,
    /// Time the fused expert pipeline alone (`FusedMoe::apply`) instead of the road a runtime
    /// takes (the default: `MoeLayer::apply` from router logits, `block`, and
    /// `apply_with_topk` with the routing precomputed, `experts`, on layers built through
    /// `create`, the tensor loaders and `process`).
    #[arg(long)]
    pub experts_only: bool,
    /// The road a runtime takes, which is the default (kept so that older command lines run).
    #[arg(long, hide = true, conflicts_with = "experts_only")]
    pub layer: bool,
    /// Also time each stage of the fused pipeline (route, gather, gate/up, activation, down,
    /// reduce; the GEMM stages include their activation quantisation, except that W4A8 and
    /// W8A8 quantise each token once in the gather stage), in ms per call summed over the lanes
    /// that run at once (with `--experts-only`).
    #[arg(long)]
    pub breakdown: bool,
    /// Also draw the rows as an SVG chart (ms per call against tokens per call, log axes, one
    /// line per shape and stage, the DRAM bound dashed).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// The road the options ask for.
    pub fn road(&self) -> Road {
        if self.experts_only {
            Road::ExpertsOnly
        } else {
            Road::Layer
        }
    }
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

/// The report, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// The expert weight format.
    pub format: BenchFormat,
    /// The format in words (group size and zero points included).
    pub format_label: String,
    /// What was timed: `layer` (`MoeLayer`, `block` and `experts` rows) or `experts-only`
    /// (`FusedMoe`, `fused` rows).
    pub road: &'static str,
    /// Worker threads.
    pub threads: usize,
    /// The DRAM bandwidth the bound assumes, bytes per second.
    pub dram_bytes_per_s: f64,
    /// Where that figure comes from (`measured` or `given`).
    pub dram_source: &'static str,
    /// The peak multiply-accumulates per second given with `--peak-gmacs`, in G/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_gmacs: Option<f64>,
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
    /// Multiply-accumulates per second, `M·k·3·H·I / t`, in G/s (int8 ones for W4A8 and W8A8,
    /// float ones for the weight-only and dense formats).
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
        let extra = (args.format == BenchFormat::Mxfp4).then_some(&GPT_OSS_20B);
        STANDARD
            .iter()
            .chain(extra)
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
    check_format_options(args)?;
    if let Some(g) = args.peak_gmacs
        && !(g.is_finite() && g > 0.0)
    {
        return Err(CliError(format!(
            "--peak-gmacs must be a positive number of G MAC/s, not {g}"
        )));
    }
    let road = args.road();
    if road == Road::Layer {
        for (given, flag) in [
            (!args.isa.is_empty(), "--isa"),
            (args.w4a8_prefill.is_some(), "--w4a8-prefill"),
            (args.breakdown, "--breakdown"),
        ] {
            if given {
                return Err(CliError(format!(
                    "{flag} applies to the fused pipeline: add --experts-only (the layer road runs the kernels the layer selects)"
                )));
            }
        }
    }
    let rungs: Vec<KernelSet> = rung_sets(&args.isa)?
        .into_iter()
        .map(|ks| match args.w4a8_prefill {
            Some(p) => ks.with_w4a8_prefill(p),
            None => ks,
        })
        .collect();
    let mut format_label = args.format.describe(args.group_size, args.zero_points);
    if args.wna16_activations == moe_layer::Wna16Activations::DynamicInt8 {
        format_label.push_str(" with dynamic int8 activations on the W4A8 kernels");
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
        match road {
            Road::Layer => {
                println!(
                    "moe bench (road: layer): MoeLayer with {format_label} experts, built by create, load, process; softmax top-k routing of random logits, {threads} threads, rung {isa}"
                );
                println!(
                    "  block = apply(hidden, logits): routing + experts + shared; experts = apply_with_topk on that routing; last column: ratio to experts"
                );
            }
            Road::ExpertsOnly => println!(
                "moe bench (road: experts only): fused {format_label} MoE (FusedMoe::apply), uniform random routing, {threads} threads, rung {isa}"
            ),
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
        if road == Road::ExpertsOnly && args.format == BenchFormat::W4a8 {
            let numerics: Vec<&str> = rungs.iter().map(|ks| ks.w4a8_prefill().name()).collect();
            println!(
                "  W4A8 prefill numerics in force: {} (int8 is bit-equal to the reference; --w4a8-prefill chooses)",
                numerics.join(", ")
            );
        }
        if matches!(
            args.format,
            BenchFormat::W4a16 | BenchFormat::W8a16 | BenchFormat::Mxfp4 | BenchFormat::Fp8
        ) {
            for ks in &rungs {
                let ops = ks.describe_ops();
                if let Some(line) = ops.iter().find(|l| l.starts_with("wna16_gemm")) {
                    println!("  {line}");
                }
            }
        }
        if let Some(g) = args.peak_gmacs {
            println!(
                "  compute bound = M·k·3·H·I MACs / {g} G MAC/s (given with --peak-gmacs; drawn by --plot)"
            );
        }
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
            match road {
                Road::Layer => "rung/stage",
                Road::ExpertsOnly => "rung",
            },
            match road {
                Road::Layer => "vs experts",
                Road::ExpertsOnly => "vs first",
            }
        );
    }
    let mut rows = Vec::new();
    for shape in &shapes {
        match road {
            Road::Layer => rows.extend(super::bench_layer::bench_shape(
                args, shape, dram, &pool, out,
            )?),
            Road::ExpertsOnly => {
                rows.extend(bench_shape(args, shape, &rungs, dram, &pool, out)?);
            }
        }
    }
    let report = BenchReport {
        format: args.format,
        format_label,
        road: road.name(),
        threads,
        dram_bytes_per_s: dram,
        dram_source,
        peak_gmacs: args.peak_gmacs,
        isa,
        rows,
    };
    if let Some(path) = &args.plot {
        super::plot::write_svg(path, &super::plot::bench_chart(&report))?;
        if !out.json {
            println!();
            println!("plot: {}", path.display());
        }
    }
    if out.json {
        out.print_json(&report)?;
    }
    Ok(())
}

/// Rejects options the format does not have, naming them.
fn check_format_options(args: &BenchArgs) -> Result<(), CliError> {
    if args.wna16_activations == moe_layer::Wna16Activations::DynamicInt8 {
        if args.format != BenchFormat::W4a16 || args.zero_points {
            return Err(CliError(
                "--wna16-activations int8 applies to symmetric int4 weights (--format w4a16 \
                 without --zero-points)"
                    .into(),
            ));
        }
        if args.experts_only {
            return Err(CliError(
                "--wna16-activations int8 is a layer setting: drop --experts-only".into(),
            ));
        }
    }
    if args.zero_points && args.format.wna16_bits().is_none() {
        return Err(CliError(
            "--zero-points applies to the weight-only formats (--format w4a16 or w8a16)".into(),
        ));
    }
    let g = args.group_size;
    if args.format.grouped() && (g == 0 || !g.is_multiple_of(32)) {
        return Err(CliError(format!(
            "--group-size {g} must be a positive multiple of 32"
        )));
    }
    Ok(())
}

/// The best of three timed reads of `bytes` of freshly written memory by every pool thread, in
/// bytes per second: what the weight stream of a decode call can reach at most here. Each
/// thread reads its share as four interleaved streams ([`sum_four_streams`]).
pub(crate) fn measure_dram(pool: &rayon::ThreadPool, bytes: usize) -> f64 {
    use rayon::prelude::*;
    let words = (bytes / 8).max(1);
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(pool.current_num_threads().max(1));
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let sum = pool.install(|| {
            buf.par_chunks(chunk)
                .map(sum_four_streams)
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    }
    best
}

/// The wrapping sum of `words`, read as four streams in lockstep (one per quarter). One
/// sequential stream per thread leaves the hardware prefetcher too few misses in flight to
/// fill the memory pipe: on a 2-vCPU Intel guest it read 14.6-16.2 GB/s where four streams
/// read 24.7-26.4, about what the decode kernels' weight streams reach there.
fn sum_four_streams(words: &[u64]) -> u64 {
    let quarter = words.len() / 4;
    let (a, rest) = words.split_at(quarter);
    let (b, rest) = rest.split_at(quarter);
    let (c, rest) = rest.split_at(quarter);
    let (d, tail) = rest.split_at(quarter);
    let mut sums = [0u64; 4];
    for (((&a, &b), &c), &d) in a.iter().zip(b).zip(c).zip(d) {
        sums[0] = sums[0].wrapping_add(a);
        sums[1] = sums[1].wrapping_add(b);
        sums[2] = sums[2].wrapping_add(c);
        sums[3] = sums[3].wrapping_add(d);
    }
    tail.iter()
        .chain(&sums)
        .fold(0u64, |acc, &v| acc.wrapping_add(v))
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
    let seed = args.seed;
    match args.format {
        BenchFormat::W4a8 => {
            let layer = pool.install(|| synth::random_codes_layer(layer_shape, seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::W8a8 => {
            let layer = pool.install(|| synth::random_int8_layer(layer_shape, seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::W4a16 | BenchFormat::W8a16 => {
            let codes = synth::Wna16Codes {
                bits: args.format.wna16_bits().unwrap_or(4),
                zero_points: args.zero_points,
            };
            let layer =
                pool.install(|| synth::random_wna16_layer(layer_shape, codes, seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::Bf16 | BenchFormat::F32 => {
            let bf16 = args.format == BenchFormat::Bf16;
            let layer =
                pool.install(|| synth::random_dense_layer(layer_shape, bf16, seed, &bar))?;
            bar.finish_and_clear();
            measure_layer(args, shape, layer, rungs, dram, pool, out)
        }
        BenchFormat::Mxfp4 => {
            let layer_shape = LayerShape {
                group_size: moe_kernels::packed::wna16::MXFP4_BLOCK,
                ..layer_shape
            };
            let layer = pool.install(|| synth::random_mxfp4_layer(layer_shape, args.seed, &bar))?;
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

/// Packed bytes of one expert of `shape` in the format `args` asks for, from one expert
/// packed by the same packers the layer's `process` calls.
pub(crate) fn expert_bytes(args: &BenchArgs, shape: &BenchShape) -> Result<usize, CliError> {
    let one = LayerShape {
        experts: 1,
        hidden: shape.hidden,
        intermediate: shape.intermediate,
        group_size: args.group_size,
    };
    let bar = indicatif::ProgressBar::hidden();
    Ok(match args.format {
        BenchFormat::W4a8 => synth::random_codes_layer(one, 0, &bar)?.expert_bytes,
        // Int8 activations pack the int4 codes as W4A8 weights.
        BenchFormat::W4a16
            if args.wna16_activations == moe_layer::Wna16Activations::DynamicInt8 =>
        {
            synth::random_codes_layer(one, 0, &bar)?.expert_bytes
        }
        BenchFormat::W8a8 => synth::random_int8_layer(one, 0, &bar)?.expert_bytes,
        BenchFormat::W4a16 | BenchFormat::W8a16 => {
            let codes = synth::Wna16Codes {
                bits: args.format.wna16_bits().unwrap_or(4),
                zero_points: args.zero_points,
            };
            synth::random_wna16_layer(one, codes, 0, &bar)?.expert_bytes
        }
        BenchFormat::Bf16 | BenchFormat::F32 => {
            synth::random_dense_layer(one, args.format == BenchFormat::Bf16, 0, &bar)?.expert_bytes
        }
        BenchFormat::Mxfp4 => synth::random_mxfp4_layer(one, 0, &bar)?.expert_bytes,
        BenchFormat::Fp8 => synth::random_fp8_layer(one, 0, &bar)?.expert_bytes,
    })
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
    fn four_streams_sum_every_word_once() {
        for len in [0usize, 1, 3, 4, 5, 8, 13, 4096 + 3] {
            let words: Vec<u64> = (0..len as u64)
                .map(|v| v.wrapping_mul(0x9E37_79B9))
                .collect();
            let want = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            assert_eq!(sum_four_streams(&words), want, "len {len}");
        }
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
