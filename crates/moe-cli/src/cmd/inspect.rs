//! `moe inspect --model DIR [--layer N]`: what a checkpoint holds (family, layers, experts,
//! sizes, quantization, shards, tensors) and which backend would serve its MoE layers according
//! to the oracle in native mode, or every candidate's reason for refusing.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Args;
use moe_layer::checkpoint::{
    Checkpoint, ModelFamily, MoeModelSpec, QuantScheme, ReadOptions, ShardAccess, StoredExperts,
};
use moe_layer::{Fp8Scaling, LayerError, MoeLayerConfig};
use moe_oracle::Selection;
use serde::Serialize;

use super::{CliError, Output};

/// Options of `moe inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The model directory (`config.json` plus safetensors shards).
    #[arg(long)]
    pub model: PathBuf,
    /// Also read this decoder layer's MoE tensors and describe them.
    #[arg(long)]
    pub layer: Option<usize>,
    /// The backend for WNA16 weights multiplied with `float` or `int8` activations, as
    /// `moe run --wna16-activations` chooses.
    #[arg(long, value_name = "float|int8", default_value = "float", value_parser = super::parse_wna16_activations)]
    pub wna16_activations: moe_layer::Wna16Activations,
    /// The backend of this tensor-parallel rank (with `--tp-size`), as `moe run --tp-rank`.
    #[arg(long, default_value_t = 0)]
    pub tp_rank: usize,
    /// Tensor-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub tp_size: usize,
    /// The backend of this expert-parallel rank (with `--ep-size`), as `moe run --ep-rank`.
    #[arg(long, default_value_t = 0)]
    pub ep_rank: usize,
    /// Expert-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub ep_size: usize,
}

/// The report, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct InspectReport {
    /// The directory inspected.
    pub model: String,
    /// Model family.
    pub family: String,
    /// `model_type` as written.
    pub model_type: String,
    /// Decoder layers.
    pub num_layers: usize,
    /// Indices of the MoE layers.
    pub moe_layers: Vec<usize>,
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Expert intermediate size.
    pub intermediate: usize,
    /// Expert activation as written.
    pub activation: String,
    /// The activation the layer runs when it is not what `activation` names (gpt-oss's
    /// config says `silu`; its experts are SwiGLU-OAI with the config's clamp).
    pub runs_activation: Option<String>,
    /// How the router weighs the experts: vLLM's routing method and the config's parameters.
    pub routing: String,
    /// The shared (always active) experts, when the model has them.
    pub shared_experts: Option<String>,
    /// Model dtype.
    pub dtype: Option<String>,
    /// Quantization scheme name.
    pub quant_scheme: &'static str,
    /// Quantization details.
    pub quant_detail: String,
    /// Shard files.
    pub shard_files: Vec<String>,
    /// Number of tensors.
    pub tensor_count: usize,
    /// The oracle's choice, when one backend accepts.
    pub backend: Option<BackendChoice>,
    /// Why nothing was selected (with every refusal), when nothing accepts.
    pub no_backend: Option<NoBackend>,
    /// The layer read with `--layer`.
    pub layer: Option<LayerReport>,
}

/// The oracle's accepted backend.
#[derive(Debug, Serialize)]
pub struct BackendChoice {
    /// Family backend.
    pub backend: String,
    /// Kernel and rung.
    pub kernel: String,
}

/// The oracle's refusal.
#[derive(Debug, Serialize)]
pub struct NoBackend {
    /// The oracle's message.
    pub message: String,
    /// One line per refused candidate.
    pub refusals: Vec<String>,
}

/// One MoE layer as read from the shards.
#[derive(Debug, Serialize)]
pub struct LayerReport {
    /// Decoder layer index.
    pub layer: usize,
    /// Experts read.
    pub experts: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Intermediate size.
    pub intermediate: usize,
    /// How the expert weights are stored.
    pub weights: String,
    /// Router weight values.
    pub router_values: usize,
    /// Whether the router linear has a bias (gpt-oss).
    pub router_bias: bool,
    /// Whether shared experts were read.
    pub shared_experts: bool,
}

/// Runs `moe inspect`.
pub fn run(args: &InspectArgs, out: Output) -> Result<(), CliError> {
    let dir = &args.model;
    if !dir.is_dir() {
        return Err(CliError(format!(
            "--model {}: not a directory (expected a model directory with config.json and safetensors shards)",
            dir.display()
        )));
    }
    let ckpt = Checkpoint::open(dir, ShardAccess::Mmap)
        .map_err(|e| CliError::context("opening the checkpoint", e))?;
    let spec = ckpt.spec();
    let names: Vec<(&str, &std::path::Path)> = ckpt.source().names().collect();
    let files: BTreeSet<String> = names
        .iter()
        .map(|(_, f)| {
            f.file_name().map_or_else(
                || f.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let (backend, no_backend) = match select(spec, args) {
        Ok(s) => (
            Some(BackendChoice {
                backend: s.backend.to_string(),
                kernel: s.kernel.to_string(),
            }),
            None,
        ),
        Err(e) => (
            None,
            Some(NoBackend {
                message: e.to_string(),
                refusals: match &e {
                    LayerError::Oracle(o) => o.refusals().iter().map(ToString::to_string).collect(),
                    _ => Vec::new(),
                },
            }),
        ),
    };
    let layer = match args.layer {
        None => None,
        Some(n) => Some(read_layer(&ckpt, n)?),
    };
    let report = InspectReport {
        model: dir.display().to_string(),
        family: format!("{:?}", spec.family),
        model_type: spec.model_type.clone(),
        num_layers: spec.num_layers,
        moe_layers: spec.moe_layers.clone(),
        experts: spec.num_experts,
        top_k: spec.top_k,
        hidden: spec.hidden,
        intermediate: spec.intermediate,
        activation: spec.activation.clone(),
        runs_activation: MoeLayerConfig::from_spec(spec, 0, 1, None, 1)
            .ok()
            .and_then(|c| match c.activation {
                moe_kernels::Activation::SwigluOai { alpha, limit } => Some(format!(
                    "swigluoai (alpha {alpha}, limit {limit}, gate/up {:?})",
                    c.gate_up_layout
                )),
                _ => None,
            }),
        routing: describe_routing(spec),
        shared_experts: spec.shared_experts.map(|s| {
            let gate = if s.gated {
                ", behind a sigmoid gate"
            } else {
                ""
            };
            format!("one MLP of intermediate {}{gate}", s.intermediate)
        }),
        dtype: spec.dtype.map(|d| format!("{d:?}")),
        quant_scheme: spec.quant.name(),
        quant_detail: format!("{:?}", spec.quant),
        shard_files: files.into_iter().collect(),
        tensor_count: names.len(),
        backend,
        no_backend,
        layer,
    };
    if out.json {
        return out.print_json(&report);
    }
    print_report(&report);
    Ok(())
}

/// The backend a layer of the checkpoint would run on, decided as `moe run` decides it: the
/// layer's configuration from the spec (which refuses what the layer cannot run) for the
/// requested rank, then the layer's own backend selection.
fn select(spec: &MoeModelSpec, args: &InspectArgs) -> Result<Selection, LayerError> {
    let map = moe_layer::layer::linear_expert_map(spec.num_experts, args.ep_rank, args.ep_size)?;
    MoeLayerConfig::from_spec(spec, args.tp_rank, args.tp_size, map, 1)?
        .with_wna16_activations(args.wna16_activations)
        .with_expert_parallel(args.ep_rank, args.ep_size)
        .select_backend()
}

/// Reads one MoE layer and summarizes it.
fn read_layer(ckpt: &Checkpoint, n: usize) -> Result<LayerReport, CliError> {
    if let QuantScheme::Fp8 {
        scaling,
        static_activations,
        ..
    } = ckpt.spec().quant
    {
        // FP8 experts are packed as they are read, never held whole: checked expert by expert.
        let info = ckpt
            .check_fp8_layer(n, &ReadOptions::single_rank())
            .map_err(|e| CliError::context(format!("reading layer {n}"), e))?;
        return Ok(LayerReport {
            layer: info.layer,
            experts: info.local_experts.len(),
            hidden: info.hidden,
            intermediate: info.intermediate,
            weights: format!(
                "fp8 e4m3 codes, f32 scales {}{}",
                match scaling {
                    Fp8Scaling::Blocks => "per 128 x 128 block",
                    Fp8Scaling::Channels => "per output channel",
                    _ => "per tensor",
                },
                if static_activations {
                    "; static activation scales not applied (activations run in float)"
                } else {
                    ""
                }
            ),
            router_values: info.router_values,
            router_bias: false,
            shared_experts: info.shared_experts,
        });
    }
    let t = ckpt
        .read_layer(n, &ReadOptions::single_rank())
        .map_err(|e| CliError::context(format!("reading layer {n}"), e))?;
    let weights = match &t.experts.weights {
        StoredExperts::Float { w13, .. } => format!("float {:?}", w13.dtype()),
        StoredExperts::Int(q) => format!(
            "int{} codes, {}, {:?} scales{}{}",
            q.bits,
            q.group_size,
            q.scale_dtype,
            if q.act_order.is_some() {
                ", act-order"
            } else {
                ""
            },
            if q.zeros.is_some() {
                ", zero points"
            } else {
                ""
            }
        ),
        StoredExperts::Mxfp4(_) => "MXFP4: e2m1 codes, e8m0 scales per 32 columns, \
                                    gate/up rows interleaved, expert biases"
            .to_string(),
        _ => "other".to_string(),
    };
    Ok(LayerReport {
        layer: t.layer,
        experts: t.experts.num_experts,
        hidden: t.experts.hidden,
        intermediate: t.experts.intermediate,
        weights,
        router_values: t.router.weight.len(),
        router_bias: t.router.bias.is_some(),
        shared_experts: t.shared.is_some(),
    })
}

/// The routing of `spec` in words: the method vLLM would label it with, then what it does.
fn describe_routing(spec: &MoeModelSpec) -> String {
    let r = &spec.routing;
    // The layer's router takes the correction bias when the tensor is loaded; its label
    // depends on the bias being there, not on its values.
    let method = MoeLayerConfig::from_spec(spec, 0, 1, None, 1)
        .map(|c| match r.has_correction_bias {
            true => c.router.with_correction_bias(vec![0.0; spec.num_experts]),
            false => c.router,
        })
        .map(|router| router.routing_method_type().name())
        .unwrap_or("refused");
    if r.llama4 {
        return format!(
            "{method}: the top-{} logits, each weighted by its sigmoid, the weight scaling the \
             token before its expert",
            spec.top_k
        );
    }
    if let Some(jitter) = r.sparse_mixer_jitter {
        return format!(
            "{method}: the sparse mixer, two experts chosen in turn, each weighted by a softmax \
             over the logits within a relative {} of it, not renormalized",
            2.0 * jitter
        );
    }
    let mut words = vec![format!("{method}: {} scores", r.scoring)];
    if spec.family == ModelFamily::GptOss {
        words.push("the router's bias added to the logits".into());
    }
    if r.has_correction_bias {
        words.push("a correction bias for selection".into());
    }
    if let (Some(groups), Some(kept)) = (r.num_expert_group, r.topk_group) {
        words.push(format!("{kept} of {groups} expert groups kept"));
    }
    words.push(format!("top-{}", spec.top_k));
    words.push(if r.renormalize {
        "renormalized".into()
    } else {
        "not renormalized".into()
    });
    if r.routed_scaling_factor != 1.0 {
        words.push(format!("weights × {}", r.routed_scaling_factor));
    }
    words.join(", ")
}

/// The human report.
fn print_report(r: &InspectReport) {
    println!("checkpoint {}", r.model);
    println!(
        "  family:        {} (model_type {})",
        r.family, r.model_type
    );
    println!(
        "  layers:        {} ({} MoE: {:?})",
        r.num_layers,
        r.moe_layers.len(),
        r.moe_layers
    );
    println!(
        "  experts:       {} routed, top-{}; hidden {}, expert intermediate {}; activation {}{}",
        r.experts,
        r.top_k,
        r.hidden,
        r.intermediate,
        r.activation,
        r.runs_activation
            .as_ref()
            .map_or_else(String::new, |a| format!(", run as {a}"))
    );
    println!("  routing:       {}", r.routing);
    if let Some(shared) = &r.shared_experts {
        println!("  shared:        {shared}");
    }
    println!(
        "  dtype:         {}",
        r.dtype.as_deref().unwrap_or("(not stated)")
    );
    println!("  quantization:  {} - {}", r.quant_scheme, r.quant_detail);
    println!(
        "  files:         {} ({} tensors)",
        r.shard_files.join(", "),
        r.tensor_count
    );
    match (&r.backend, &r.no_backend) {
        (Some(b), _) => println!("  backend:       {} -> kernel {}", b.backend, b.kernel),
        (None, Some(n)) => {
            println!("  backend:       none - {}", n.message);
            for refusal in &n.refusals {
                println!("    - {refusal}");
            }
        }
        (None, None) => {}
    }
    if let Some(l) = &r.layer {
        println!(
            "  layer {}:       {} experts, H {}, I {}, {}; router {} values{}; shared experts: {}",
            l.layer,
            l.experts,
            l.hidden,
            l.intermediate,
            l.weights,
            l.router_values,
            if l.router_bias { " and a bias" } else { "" },
            if l.shared_experts { "yes" } else { "no" }
        );
    }
}
