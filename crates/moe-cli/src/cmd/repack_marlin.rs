//! `moe repack-marlin`: converts a GPTQ or compressed-tensors `pack-quantized` (WNA16)
//! checkpoint into a Marlin-packed one, offline, on the CPU.
//!
//! It streams one MoE layer at a time: read the layer's experts with moe-layer's reader (which
//! decodes either format into signed codes and scales), put them back into the GPTQ layout
//! vLLM's post-processing takes (`[E, K/pf, N]` words, `[E, G, N]` scales), run
//! [`process_wna16_moe`] (repack, scale and bias permutations, act-order sort, FP8/INT8 steps,
//! with every check), and write that layer's Marlin tensors to their own shard. Every other
//! tensor (embeddings, attention, routers, shared experts) is copied unchanged into one more
//! shard. `config.json` is copied with a `moe_rs_marlin` marker; the index lists every tensor.
//! The tensor names are documented in `docs/marlin.md`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use half::{bf16, f16};
use moe_kernels::Par;
use moe_kernels::marlin::{
    ActDtype, MarlinMoeWeights, MarlinScales, MarlinTensor, Scale16, ScaleRule, Wna16Config,
    Wna16Tensor, process_wna16_moe,
};
use moe_layer::checkpoint::{
    Checkpoint, Dtype, FloatData, IntExperts, QuantScheme, ReadOptions, ShardAccess, StoredExperts,
};
use moe_quant::DType;
use safetensors::tensor::TensorView;
use serde::Serialize;

use super::{CliError, Output};

/// The format marker written into the output's `config.json`.
pub const MARLIN_FORMAT: &str = "moe-rs-marlin/1";

/// Activation dtype the Marlin kernel will run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputDtypeArg {
    /// fp16/bf16 activations (W4A16 / W8A16).
    #[value(name = "16bit")]
    Bits16,
    /// int8 activations (W4A8-INT8; 4-bit weights only).
    Int8,
    /// fp8-e4m3 activations (W4A8-FP8; 4-bit weights only).
    Fp8,
}

impl InputDtypeArg {
    fn act(self) -> ActDtype {
        match self {
            Self::Bits16 => ActDtype::Bits16,
            Self::Int8 => ActDtype::Int8,
            Self::Fp8 => ActDtype::Fp8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bits16 => "16bit",
            Self::Int8 => "int8",
            Self::Fp8 => "fp8",
        }
    }
}

/// Arguments of `moe repack-marlin`.
#[derive(Debug, Args)]
pub struct RepackMarlinArgs {
    /// The WNA16 model directory (GPTQ or compressed-tensors `pack-quantized`).
    #[arg(long)]
    pub model: PathBuf,
    /// The output directory (created; must be empty or absent).
    #[arg(long)]
    pub output: PathBuf,
    /// The activation dtype the weights are prepared for.
    #[arg(long, value_enum, default_value = "16bit")]
    pub input_dtype: InputDtypeArg,
    /// Worker threads for the repack (default: all available).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The report, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct RepackReport {
    /// Input directory.
    pub model: String,
    /// Output directory.
    pub output: String,
    /// Output format marker.
    pub format: &'static str,
    /// Source quantization scheme.
    pub source_scheme: String,
    /// Weight bits.
    pub bits: u32,
    /// Group size (`None` = channelwise).
    pub group_size: Option<usize>,
    /// Whether act-order permutations were applied.
    pub act_order: bool,
    /// Activation dtype prepared for.
    pub input_dtype: &'static str,
    /// MoE layers converted.
    pub moe_layers: usize,
    /// Experts per layer.
    pub experts: usize,
    /// Bytes of packed expert weights repacked.
    pub packed_bytes: u64,
    /// Tensors copied unchanged.
    pub copied_tensors: usize,
    /// Seconds in the post-processing (repack and permutations) only.
    pub repack_seconds: f64,
    /// Seconds end to end.
    pub total_seconds: f64,
    /// Output shard files.
    pub files: Vec<String>,
}

/// Runs the command.
pub fn run(args: &RepackMarlinArgs, out: Output) -> Result<(), CliError> {
    let threads = args.threads.unwrap_or_else(super::default_threads).max(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CliError::context("building the thread pool", e))?;
    let report = pool.install(|| convert(args, out))?;
    if out.json {
        return out.print_json(&report);
    }
    println!(
        "repacked {} MoE layers x {} experts ({}-bit, group {}, act-order {}, {} activations) from {} into {}",
        report.moe_layers,
        report.experts,
        report.bits,
        report
            .group_size
            .map_or("channelwise".to_string(), |g| g.to_string()),
        report.act_order,
        report.input_dtype,
        report.model,
        report.output
    );
    let gb = report.packed_bytes as f64 / 1e9;
    println!(
        "  {:.3} MB of packed weights, post-processing {:.3} s ({:.2} GB/s), total {:.3} s; {} other tensors copied",
        report.packed_bytes as f64 / 1e6,
        report.repack_seconds,
        if report.repack_seconds > 0.0 {
            gb / report.repack_seconds
        } else {
            0.0
        },
        report.total_seconds,
        report.copied_tensors
    );
    for f in &report.files {
        println!("  wrote {f}");
    }
    Ok(())
}

/// The quantization facts the conversion needs, from the source scheme.
struct Source {
    bits: u32,
    group_size: Option<usize>,
    act_order: bool,
}

fn source_of(scheme: &QuantScheme) -> Result<Source, CliError> {
    match scheme {
        QuantScheme::Gptq {
            bits,
            group_size,
            desc_act,
            sym: true,
            ..
        } => Ok(Source {
            bits: *bits,
            group_size: group_size.group_size(),
            act_order: *desc_act && !group_size.is_channelwise(),
        }),
        QuantScheme::Gptq { sym: false, .. } => Err(CliError(
            "asymmetric GPTQ has no Marlin MoE path (spec marlin.md §1); only sym: true converts"
                .into(),
        )),
        QuantScheme::CompressedTensorsWna16 {
            symmetric: false, ..
        }
        | QuantScheme::Awq { .. } => Err(CliError(format!(
            "{} weights with zero points have no Marlin MoE path; only symmetric WNA16 converts",
            scheme.name()
        ))),
        QuantScheme::CompressedTensorsWna16 {
            bits, group_size, ..
        } => Ok(Source {
            bits: *bits,
            group_size: group_size.group_size(),
            act_order: scheme.has_act_order() && !group_size.is_channelwise(),
        }),
        other => Err(CliError(format!(
            "{} is not a WNA16 checkpoint (expected gptq or compressed-tensors pack-quantized)",
            other.name()
        ))),
    }
}

fn convert(args: &RepackMarlinArgs, out: Output) -> Result<RepackReport, CliError> {
    let started = Instant::now();
    let ckpt = Checkpoint::open(&args.model, ShardAccess::Mmap)
        .map_err(|e| CliError::context(args.model.display(), e))?;
    let spec = ckpt.spec();
    let src = source_of(&spec.quant)?;
    prepare_output(&args.output)?;
    let opts = ReadOptions::single_rank().with_shared_experts(false);
    let bar = out.progress(spec.moe_layers.len() as u64 + 1, "repacking MoE layers");
    let mut weight_map = BTreeMap::new();
    let mut files = Vec::new();
    let mut packed_bytes = 0u64;
    let mut repack_seconds = 0f64;
    for &layer in &spec.moe_layers {
        let tensors = ckpt
            .read_layer(layer, &opts)
            .map_err(|e| CliError::context(format!("layer {layer}"), e))?;
        let StoredExperts::Int(int) = &tensors.experts.weights else {
            return Err(CliError(format!(
                "layer {layer}: experts are not quantized"
            )));
        };
        let e = tensors.experts.num_experts;
        let (h, i) = (tensors.experts.hidden, tensors.experts.intermediate);
        let config = Wna16Config {
            num_experts: e,
            hidden_size: h,
            intermediate_size: i,
            num_bits: src.bits,
            group_size: src.group_size,
            act_order: src.act_order,
            input_dtype: args.input_dtype.act(),
            scale_rule: ScaleRule::Kernel,
        };
        let block = ckpt.names().block_prefix(layer);
        let file = format!("model-marlin-layer{layer:05}.safetensors");
        let t0 = Instant::now();
        let written = match int.scale_dtype {
            DType::F16 => layer_tensors::<f16>(&config, int, &tensors.experts, &block)?,
            DType::BF16 => layer_tensors::<bf16>(&config, int, &tensors.experts, &block)?,
            other => {
                return Err(CliError(format!(
                    "layer {layer}: scales are {other:?}; Marlin takes fp16 or bf16 scales"
                )));
            }
        };
        repack_seconds += t0.elapsed().as_secs_f64();
        packed_bytes += (int.w13.len() + int.w2.len()) as u64 * u64::from(src.bits) / 8;
        write_shard(
            &args.output.join(&file),
            &written,
            &config,
            args.input_dtype,
        )?;
        for (name, _) in &written {
            weight_map.insert(name.clone(), file.clone());
        }
        files.push(file);
        bar.inc(1);
    }
    // Everything that is not a routed-expert tensor of a MoE layer is copied unchanged.
    let source = ckpt.source();
    let names = ckpt.names();
    let rest: Vec<(String, TensorView<'_>)> = source
        .names()
        .map(|(n, _)| n.to_string())
        .filter(|n| {
            !spec
                .moe_layers
                .iter()
                .any(|&l| names.is_layer_expert_tensor(l, n))
        })
        .map(|n| {
            let t = source.get(&n).map_err(|e| CliError::context(&n, e))?;
            let view = TensorView::new(t.dtype, t.shape.to_vec(), t.bytes)
                .map_err(|e| CliError::context(&n, e))?;
            Ok((n, view))
        })
        .collect::<Result<_, CliError>>()?;
    let copied_tensors = rest.len();
    if !rest.is_empty() {
        let file = "model-rest.safetensors".to_string();
        for (n, _) in &rest {
            weight_map.insert(n.clone(), file.clone());
        }
        safetensors::tensor::serialize_to_file(rest, None, &args.output.join(&file))
            .map_err(|e| CliError::context(&file, e))?;
        files.push(file);
    }
    bar.inc(1);
    bar.finish_and_clear();
    write_index(&args.output, &weight_map)?;
    write_config(&args.model, &args.output, &src, args.input_dtype)?;
    Ok(RepackReport {
        model: args.model.display().to_string(),
        output: args.output.display().to_string(),
        format: MARLIN_FORMAT,
        source_scheme: spec.quant.name().to_string(),
        bits: src.bits,
        group_size: src.group_size,
        act_order: src.act_order,
        input_dtype: args.input_dtype.name(),
        moe_layers: spec.moe_layers.len(),
        experts: spec.num_experts,
        packed_bytes,
        copied_tensors,
        repack_seconds,
        total_seconds: started.elapsed().as_secs_f64(),
        files,
    })
}

/// Refuses an output directory that holds anything; creates it otherwise.
fn prepare_output(dir: &Path) -> Result<(), CliError> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).map_err(|e| CliError::context(dir.display(), e))?;
        if entries.next().is_some() {
            return Err(CliError(format!(
                "--output {}: directory is not empty",
                dir.display()
            )));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| CliError::context(dir.display(), e))
}

/// One output tensor: name, dtype, shape, little-endian bytes.
type OutTensor = (String, (Dtype, Vec<usize>, Vec<u8>));

/// A projection's GPTQ-layout inputs rebuilt from the reader's N-major signed codes.
struct GptqProj<S> {
    qweight: Vec<u32>,
    scales: Vec<S>,
    g_idx: Vec<u32>,
    bias: Option<Vec<S>>,
}

impl<S> GptqProj<S> {
    fn view(&self) -> Wna16Tensor<'_, S> {
        Wna16Tensor {
            qweight: &self.qweight,
            scales: &self.scales,
            g_idx: &self.g_idx,
            sort_indices: None,
            bias: self.bias.as_deref(),
        }
    }
}

/// The shape of one projection: experts, output and reduction dimensions, weight bits.
#[derive(Debug, Clone, Copy)]
struct ProjDims {
    e: usize,
    n: usize,
    k: usize,
    bits: u32,
}

/// `codes [E, N, K]` (signed) and `scales [E, N, G]` (f32) → GPTQ words `[E, K/pf, N]` and
/// scales `[E, G, N]` in `S`; exact (the reader widened 16-bit scales losslessly).
fn to_gptq<S: Scale16>(
    dims: ProjDims,
    codes: &[i8],
    scales: &[f32],
    g_idx: Option<&[i32]>,
    bias: Option<&FloatData>,
) -> GptqProj<S> {
    let ProjDims { e, n, k, bits } = dims;
    let pf = (32 / bits) as usize;
    let offset = 1i32 << (bits - 1);
    let mask = (1u32 << bits) - 1;
    let mut qweight = vec![0u32; e * k * n / pf];
    for x in 0..e {
        for col in 0..n {
            let row = &codes[(x * n + col) * k..(x * n + col + 1) * k];
            for (kk, &c) in row.iter().enumerate() {
                let u = ((i32::from(c) + offset) as u32) & mask;
                qweight[(x * (k / pf) + kk / pf) * n + col] |= u << (bits as usize * (kk % pf));
            }
        }
    }
    let g = scales.len() / (e * n).max(1);
    let mut s = Vec::with_capacity(scales.len());
    for x in 0..e {
        for gi in 0..g {
            s.extend((0..n).map(|col| S::from_f32(scales[(x * n + col) * g + gi])));
        }
    }
    GptqProj {
        qweight,
        scales: s,
        g_idx: g_idx.map_or_else(Vec::new, |v| v.iter().map(|&x| x as u32).collect()),
        bias: bias.map(|b| b.to_f32_vec().into_iter().map(S::from_f32).collect()),
    }
}

/// Post-processes one layer and names its output tensors.
fn layer_tensors<S: Scale16>(
    config: &Wna16Config,
    int: &IntExperts,
    experts: &moe_layer::checkpoint::ExpertTensors,
    block: &str,
) -> Result<Vec<OutTensor>, CliError> {
    let (e, h, i) = (
        config.num_experts,
        config.hidden_size,
        config.intermediate_size,
    );
    let act = int.act_order.as_ref();
    let w13 = to_gptq::<S>(
        ProjDims {
            e,
            n: 2 * i,
            k: h,
            bits: int.bits,
        },
        &int.w13,
        &int.w13_scales,
        act.map(|a| &a.w13_g_idx[..]),
        experts.w13_bias.as_ref(),
    );
    let w2 = to_gptq::<S>(
        ProjDims {
            e,
            n: h,
            k: i,
            bits: int.bits,
        },
        &int.w2,
        &int.w2_scales,
        act.map(|a| &a.w2_g_idx[..]),
        experts.w2_bias.as_ref(),
    );
    let MarlinMoeWeights { w13: m13, w2: m2 } =
        process_wna16_moe(config, w13.view(), w2.view(), Par::Rayon)
            .map_err(|err| CliError::context(block, err))?;
    let mut outv = Vec::new();
    let dtype = if S::NAME == "float16" {
        Dtype::F16
    } else {
        Dtype::BF16
    };
    for (p, t) in [("w13", &m13), ("w2", &m2)] {
        push_projection(&mut outv, &format!("{block}.experts.{p}"), e, t, dtype);
    }
    Ok(outv)
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn push_projection<S: Scale16>(
    outv: &mut Vec<OutTensor>,
    prefix: &str,
    e: usize,
    t: &MarlinTensor<S>,
    dtype: Dtype,
) {
    let (k, n, g) = (t.size_k, t.size_n, t.num_groups);
    let words_per_row = t.qweight.len() / (e * k / 16).max(1);
    outv.push((
        format!("{prefix}.marlin_qweight"),
        (
            Dtype::I32,
            vec![e, k / 16, words_per_row],
            u32_bytes(&t.qweight),
        ),
    ));
    match &t.scales {
        MarlinScales::Plain(s) => outv.push((
            format!("{prefix}.marlin_scales"),
            (
                dtype,
                vec![e, g, n],
                s.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            ),
        )),
        MarlinScales::Int8 {
            scales,
            global_scale,
        } => {
            outv.push((
                format!("{prefix}.marlin_scales"),
                (
                    Dtype::I16,
                    vec![e, g, n],
                    scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ),
            ));
            outv.push((
                format!("{prefix}.input_global_scale"),
                (Dtype::F32, vec![], global_scale.to_le_bytes().to_vec()),
            ));
        }
    }
    if !t.sort_indices.is_empty() {
        outv.push((
            format!("{prefix}.sort_indices"),
            (Dtype::I32, vec![e, k], u32_bytes(&t.sort_indices)),
        ));
        outv.push((
            format!("{prefix}.g_idx_sorted"),
            (Dtype::I32, vec![e, k], u32_bytes(&t.g_idx_sorted)),
        ));
    }
    if let Some(b) = &t.bias {
        outv.push((
            format!("{prefix}.marlin_bias"),
            (
                dtype,
                vec![e, n],
                b.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            ),
        ));
    }
}

fn write_shard(
    path: &Path,
    tensors: &[OutTensor],
    config: &Wna16Config,
    input: InputDtypeArg,
) -> Result<(), CliError> {
    let views = tensors
        .iter()
        .map(|(name, (dtype, shape, bytes))| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| CliError::context(name, e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta = HashMap::from([
        ("format".to_string(), MARLIN_FORMAT.to_string()),
        ("num_bits".to_string(), config.num_bits.to_string()),
        (
            "group_size".to_string(),
            config.group_size.map_or(-1, |g| g as i64).to_string(),
        ),
        ("input_dtype".to_string(), input.name().to_string()),
    ]);
    safetensors::tensor::serialize_to_file(views, Some(meta), path)
        .map_err(|e| CliError::context(path.display(), e))
}

fn write_index(dir: &Path, weight_map: &BTreeMap<String, String>) -> Result<(), CliError> {
    let index = serde_json::json!({
        "metadata": { "format": MARLIN_FORMAT },
        "weight_map": weight_map,
    });
    let path = dir.join("model.safetensors.index.json");
    let text =
        serde_json::to_string_pretty(&index).map_err(|e| CliError::context(path.display(), e))?;
    std::fs::write(&path, text).map_err(|e| CliError::context(path.display(), e))
}

/// Copies `config.json` with a `moe_rs_marlin` marker describing the repacked experts; the
/// original `quantization_config` stays for the tensors that were copied unchanged.
fn write_config(
    model: &Path,
    output: &Path,
    src: &Source,
    input: InputDtypeArg,
) -> Result<(), CliError> {
    let path = model.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| CliError::context(path.display(), e))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| CliError::context(path.display(), e))?;
    let Some(obj) = json.as_object_mut() else {
        return Err(CliError(format!("{}: not a JSON object", path.display())));
    };
    obj.insert(
        "moe_rs_marlin".to_string(),
        serde_json::json!({
            "format": MARLIN_FORMAT,
            "num_bits": src.bits,
            "group_size": src.group_size.map_or(-1, |g| g as i64),
            "act_order": src.act_order,
            "input_dtype": input.name(),
            "is_a_8bit": input.act().is_8bit(),
            "scale_layout": "kernel",
            "tensors": "<block>.experts.{w13,w2}.{marlin_qweight,marlin_scales,input_global_scale,sort_indices,g_idx_sorted,marlin_bias}",
        }),
    );
    let out_path = output.join("config.json");
    let text = serde_json::to_string_pretty(&json)
        .map_err(|e| CliError::context(out_path.display(), e))?;
    std::fs::write(&out_path, text).map_err(|e| CliError::context(out_path.display(), e))
}
