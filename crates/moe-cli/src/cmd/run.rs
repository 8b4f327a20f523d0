//! `moe run`: runs one MoE block (router + experts) of a checkpoint on hidden states read from
//! a safetensors file, writes the output and the routing to another, and reports what ran
//! (scheme, backend, kernel, tokens, time) as text or JSON. The routing comes from the
//! checkpoint's gate, or from router logits or a precomputed top-k in the input file; the
//! layer can be one tensor- or expert-parallel rank.

use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use half::{bf16, f16};
use moe_kernels::moe::MoeFloat;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{LoadOptions, LoadProgress, MoeLayer, Par, W4A8Prefill, Wna16Activations};
use moe_router::Logits;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::Serialize;

use super::Output;

/// Tokens per kernel call (longer inputs are cut into pieces of this size).
const MAX_TOKENS_PER_CALL: usize = 256;

/// Arguments of `moe run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Model directory (`config.json` + safetensors shards).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Decoder layer whose MoE block runs (default: the first MoE layer).
    #[arg(long, value_name = "N")]
    pub layer: Option<usize>,
    /// Safetensors file holding the hidden states `[T, H]` (bf16, f16 or f32).
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// Name of the hidden-states tensor in `--input`.
    #[arg(long, value_name = "NAME", default_value = "hidden_states")]
    pub input_tensor: String,
    /// Safetensors file to write: `output` f32 `[T, H]`, `topk_ids` i32 `[T, k]`,
    /// `topk_weights` f32 `[T, k]`.
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
    /// Route these router logits `[T, E]` from `--input` (bf16, f16 or f32) instead of
    /// computing them with the checkpoint's gate.
    #[arg(long, value_name = "NAME", conflicts_with = "topk_ids_tensor")]
    pub logits_tensor: Option<String>,
    /// Run the experts for this precomputed routing from `--input`: global expert ids
    /// `[T, k]` (i32 or i64), with `--topk-weights-tensor`.
    #[arg(long, value_name = "NAME", requires = "topk_weights_tensor")]
    pub topk_ids_tensor: Option<String>,
    /// The routing weights `[T, k]` (f32) of `--topk-ids-tensor`.
    #[arg(long, value_name = "NAME", requires = "topk_ids_tensor")]
    pub topk_weights_tensor: Option<String>,
    /// This rank's tensor-parallel index (with `--tp-size`); the output is this rank's part.
    #[arg(long, default_value_t = 0)]
    pub tp_rank: usize,
    /// Tensor-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub tp_size: usize,
    /// This rank's expert-parallel index (with `--ep-size`; vLLM's linear placement); the
    /// output is this rank's part.
    #[arg(long, default_value_t = 0)]
    pub ep_rank: usize,
    /// Expert-parallel ranks.
    #[arg(long, default_value_t = 1)]
    pub ep_size: usize,
    /// What WNA16 weights are multiplied with: `float` (the checkpoint's numerics) or `int8`
    /// (dynamic per-token int8 activations on the W4A8 kernels: faster decode, W4A8's
    /// numerics; symmetric int4 weights without act-order only).
    #[arg(long, value_name = "float|int8", default_value = "float", value_parser = super::parse_wna16_activations)]
    pub wna16_activations: Wna16Activations,
    /// Numerics of W4A8 calls with many rows per expert: `int8` (bit-equal to vLLM's W4A8
    /// kernel), `bf16` or `int8-channel` (faster, other numerics, where the CPU has them; see
    /// docs/kernels.md); default: `MOE_KERNELS_W4A8_PREFILL`, else int8. The report's kernel
    /// lines say what is in force.
    #[arg(long, value_name = "int8|bf16|int8-channel", value_parser = super::parse_w4a8_prefill)]
    pub w4a8_prefill: Option<W4A8Prefill>,
    /// Run the block this many times on the same input and report the median call: a
    /// process's first call also wakes the thread pool and touches the buffers for the first
    /// time, which at a few tokens can take as long as the call itself. Every call reads the
    /// same experts, so from the second on their weights may come from the caches; `moe bench`
    /// cycles its weights for times against the memory's bound.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Print the report as JSON instead of text (set from the global `--json` flag).
    #[arg(skip)]
    pub json: bool,
}

/// What `moe run` did.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The model directory.
    pub model: String,
    /// The decoder layer.
    pub layer: usize,
    /// The checkpoint's quantization scheme.
    pub scheme: String,
    /// The backend the oracle chose.
    pub backend: String,
    /// The kernel (and rung) that ran.
    pub kernel: String,
    /// What the kernel set runs per operation, numerics choices included.
    pub kernel_ops: Vec<String>,
    /// Tokens processed.
    pub tokens: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The input dtype (the compute follows it, as vLLM's does).
    pub input_dtype: String,
    /// Wall time of routing plus experts, in milliseconds (loading excluded): the median of
    /// the `runs` calls.
    pub run_ms: f64,
    /// Wall time of the first call, in milliseconds.
    pub first_run_ms: f64,
    /// Calls made (`--repeat`); every call computes the same output.
    pub runs: usize,
    /// Wall time of loading and processing the layer, in milliseconds.
    pub load_ms: f64,
    /// The output file.
    pub output: String,
}

/// Runs `moe run` and prints its report (text, or JSON with `--json`) to stdout.
pub fn run(args: &RunArgs) -> Result<RunReport, Box<dyn Error>> {
    let load_start = Instant::now();
    let ckpt = Checkpoint::open(&args.model, ShardAccess::Mmap)?;
    let spec = ckpt.spec();
    let layer = match args.layer {
        Some(l) => l,
        None => *spec
            .moe_layers
            .first()
            .ok_or("the model has no MoE layer")?,
    };
    let moe = if (args.tp_size, args.ep_size) == (1, 1) && (args.tp_rank, args.ep_rank) == (0, 0) {
        load_layer(&ckpt, layer, args)?
    } else {
        let map = moe_layer::layer::linear_expert_map(spec.num_experts, args.ep_rank, args.ep_size)
            .map_err(|e| format!("--ep-rank/--ep-size: {e}"))?;
        MoeLayer::from_checkpoint_ranked_with(
            &ckpt,
            layer,
            MAX_TOKENS_PER_CALL,
            (args.tp_rank, args.tp_size),
            map,
            &load_options(args).with_expert_parallel(args.ep_rank, args.ep_size),
        )?
    };
    let load_ms = load_start.elapsed().as_secs_f64() * 1e3;

    let bytes = std::fs::read(&args.input).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let file =
        SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let view = file.tensor(&args.input_tensor).map_err(|e| {
        format!(
            "{}: tensor {:?}: {e}",
            args.input.display(),
            args.input_tensor
        )
    })?;
    let h = spec.hidden;
    let shape = view.shape();
    if shape.len() != 2 || shape[1] != h {
        return Err(format!(
            "{}: tensor {:?} has shape {shape:?}, expected [T, {h}]",
            args.input.display(),
            args.input_tensor
        )
        .into());
    }
    let data = view.data();
    let routing = read_routing(&file, args, shape[0], spec.num_experts, spec.top_k)?;
    let input = match view.dtype() {
        Dtype::BF16 => Hidden::Bf16(decode(data, bf16::from_le_bytes)),
        Dtype::F16 => Hidden::F16(decode(data, f16::from_le_bytes)),
        Dtype::F32 => Hidden::F32(decode(data, f32::from_le_bytes)),
        other => {
            return Err(format!(
                "{}: tensor {:?} is {other:?}; expected bf16, f16 or f32",
                args.input.display(),
                args.input_tensor
            )
            .into());
        }
    };
    let mut times = Vec::with_capacity(args.repeat as usize);
    let mut routed = None;
    for _ in 0..args.repeat {
        let run_start = Instant::now();
        let result = match &input {
            Hidden::Bf16(x) => run_typed(&moe, x, &routing)?,
            Hidden::F16(x) => run_typed(&moe, x, &routing)?,
            Hidden::F32(x) => run_typed(&moe, x, &routing)?,
        };
        times.push(run_start.elapsed().as_secs_f64() * 1e3);
        routed = Some(result);
    }
    let (out, ids, weights) = routed.ok_or("--repeat must be at least 1")?;
    let first_run_ms = times[0];
    times.sort_by(f64::total_cmp);
    let run_ms = times[times.len() / 2];
    let tokens = shape[0];
    let k = spec.top_k;
    write_output(&args.output, &out, &ids, &weights, tokens, h, k)?;

    let backend = moe.backend().ok_or("the layer was not processed")?;
    let report = RunReport {
        model: args.model.display().to_string(),
        layer,
        scheme: spec.quant.name().to_string(),
        backend: backend.backend,
        kernel: backend.kernel,
        kernel_ops: backend.ops,
        tokens,
        hidden: h,
        top_k: k,
        input_dtype: format!("{:?}", view.dtype()).to_lowercase(),
        run_ms,
        first_run_ms,
        runs: times.len(),
        load_ms,
        output: args.output.display().to_string(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "model {} layer {} ({}), backend {} kernel {}",
            report.model, report.layer, report.scheme, report.backend, report.kernel
        );
        let calls = if report.runs > 1 {
            format!(
                ", the median of {} calls; the first {:.3} ms",
                report.runs, report.first_run_ms
            )
        } else {
            String::new()
        };
        println!(
            "{} tokens × H {} ({}), top-{}: {:.3} ms{calls} (load + process {:.1} ms) → {}",
            report.tokens,
            report.hidden,
            report.input_dtype,
            report.top_k,
            report.run_ms,
            report.load_ms,
            report.output
        );
        println!("kernels: {}", report.kernel_ops.join("; "));
    }
    Ok(report)
}

/// The hidden states of `--input`, in their stored precision.
enum Hidden {
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// Below this many experts a layer loads in a blink and gets no progress bar.
const PROGRESS_MIN_EXPERTS: usize = 16;

/// How `moe run` loads: experts in parallel, with the activations and prefill numerics asked
/// for.
fn load_options<'a>(args: &RunArgs) -> LoadOptions<'a> {
    let opts = LoadOptions::new()
        .with_par(Par::Rayon)
        .with_wna16_activations(args.wna16_activations);
    match args.w4a8_prefill {
        Some(prefill) => opts.with_w4a8_prefill(prefill),
        None => opts,
    }
}

/// Loads and processes `layer`, experts in parallel on rayon's global pool (the one `apply`
/// runs on), with a progress bar of experts packed on stderr for layers with many experts
/// (hidden with `--json` or when stderr is not a terminal; cleared when done).
fn load_layer(ckpt: &Checkpoint, layer: usize, args: &RunArgs) -> Result<MoeLayer, Box<dyn Error>> {
    let experts = ckpt.spec().num_experts;
    let opts = load_options(args);
    if experts < PROGRESS_MIN_EXPERTS {
        return Ok(MoeLayer::from_checkpoint_with(
            ckpt,
            layer,
            MAX_TOKENS_PER_CALL,
            &opts,
        )?);
    }
    let bar =
        Output { json: args.json }.progress(experts as u64, &format!("loading layer {layer}"));
    // Reports come from several threads, not always in order: the bar shows the most seen.
    let most = Mutex::new(0usize);
    let report = |p: LoadProgress| {
        let mut most = most.lock().unwrap_or_else(|e| e.into_inner());
        if p.done > *most {
            *most = p.done;
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
        }
    };
    let opts = opts.with_progress(&report);
    let moe = MoeLayer::from_checkpoint_with(ckpt, layer, MAX_TOKENS_PER_CALL, &opts);
    bar.finish_and_clear();
    Ok(moe?)
}

/// Little-endian elements of width `N` decoded with `f`.
fn decode<T, const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|c| {
            let mut b = [0u8; N];
            b.copy_from_slice(c);
            f(b)
        })
        .collect()
}

/// Where the routing of a run comes from.
enum Routing {
    /// The checkpoint's gate on the hidden states.
    Gate,
    /// Router logits `[T, E]` given in the input file.
    Logits(LogitsData),
    /// Top-k ids and weights given in the input file.
    TopK(Vec<i32>, Vec<f32>),
}

/// Router logits in their own dtype.
enum LogitsData {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

/// Reads the routing `--logits-tensor` or `--topk-ids-tensor`/`--topk-weights-tensor` name
/// from the input file, checking shapes and dtypes.
fn read_routing(
    file: &SafeTensors<'_>,
    args: &RunArgs,
    tokens: usize,
    experts: usize,
    k: usize,
) -> Result<Routing, Box<dyn Error>> {
    let input = args.input.display();
    let tensor = |name: &str, cols: usize| -> Result<TensorView<'_>, Box<dyn Error>> {
        let v = file
            .tensor(name)
            .map_err(|e| format!("{input}: tensor {name:?}: {e}"))?;
        if v.shape() != [tokens, cols] {
            return Err(format!(
                "{input}: tensor {name:?} has shape {:?}, expected [{tokens}, {cols}]",
                v.shape()
            )
            .into());
        }
        Ok(v)
    };
    if let Some(name) = &args.logits_tensor {
        let v = tensor(name, experts)?;
        let data = v.data();
        return Ok(Routing::Logits(match v.dtype() {
            Dtype::F32 => LogitsData::F32(decode(data, f32::from_le_bytes)),
            Dtype::BF16 => LogitsData::Bf16(decode(data, bf16::from_le_bytes)),
            Dtype::F16 => LogitsData::F16(decode(data, f16::from_le_bytes)),
            other => {
                return Err(format!(
                    "{input}: tensor {name:?} is {other:?}; expected bf16, f16 or f32"
                )
                .into());
            }
        }));
    }
    if let (Some(ids_name), Some(w_name)) = (&args.topk_ids_tensor, &args.topk_weights_tensor) {
        let v = tensor(ids_name, k)?;
        let ids: Vec<i32> = match v.dtype() {
            Dtype::I32 => decode(v.data(), i32::from_le_bytes),
            Dtype::I64 => decode(v.data(), i64::from_le_bytes)
                .into_iter()
                .map(|id| i32::try_from(id).unwrap_or(-1))
                .collect(),
            other => {
                return Err(format!(
                    "{input}: tensor {ids_name:?} is {other:?}; expected i32 or i64"
                )
                .into());
            }
        };
        let v = tensor(w_name, k)?;
        if v.dtype() != Dtype::F32 {
            return Err(format!(
                "{input}: tensor {w_name:?} is {:?}; expected f32",
                v.dtype()
            )
            .into());
        }
        return Ok(Routing::TopK(ids, decode(v.data(), f32::from_le_bytes)));
    }
    Ok(Routing::Gate)
}

/// Routes as `routing` says and runs the experts in the input's dtype; returns the output
/// widened to f32 and the routing.
type Routed = (Vec<f32>, Vec<i32>, Vec<f32>);
fn run_typed<X: MoeFloat>(
    moe: &MoeLayer,
    x: &[X],
    routing: &Routing,
) -> Result<Routed, Box<dyn Error>> {
    let cfg = moe.config();
    let tokens = x.len() / cfg.hidden;
    let (mut ids, mut weights) = (
        vec![0i32; tokens * cfg.top_k],
        vec![0f32; tokens * cfg.top_k],
    );
    match routing {
        Routing::Gate => {
            moe.route_hidden(x, &mut ids, &mut weights)?;
        }
        Routing::Logits(l) => {
            let logits = match l {
                LogitsData::F32(v) => Logits::F32(v),
                LogitsData::Bf16(v) => Logits::Bf16(v),
                LogitsData::F16(v) => Logits::F16(v),
            };
            moe.route(logits, &mut ids, &mut weights)?;
        }
        Routing::TopK(i, w) => {
            ids.copy_from_slice(i);
            weights.copy_from_slice(w);
        }
    }
    let mut out = vec![X::from_f32(0.0); x.len()];
    moe.apply_with_topk(x, &ids, &weights, &mut out)?;
    Ok((out.iter().map(|v| v.to_f32()).collect(), ids, weights))
}

/// Writes `output`, `topk_ids` and `topk_weights`.
fn write_output(
    path: &Path,
    out: &[f32],
    ids: &[i32],
    weights: &[f32],
    tokens: usize,
    h: usize,
    k: usize,
) -> Result<(), Box<dyn Error>> {
    let out_b: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ids_b: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let w_b: Vec<u8> = weights.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = vec![
        (
            "output",
            TensorView::new(Dtype::F32, vec![tokens, h], &out_b)?,
        ),
        (
            "topk_ids",
            TensorView::new(Dtype::I32, vec![tokens, k], &ids_b)?,
        ),
        (
            "topk_weights",
            TensorView::new(Dtype::F32, vec![tokens, k], &w_b)?,
        ),
    ];
    let meta = HashMap::from([("producer".to_string(), "moe run".to_string())]);
    safetensors::serialize_to_file(tensors, Some(meta), path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    //! `moe run` on every W4A8 fixture: the written output matches `out_vllm` within the
    //! fixtures README's tolerance, and the routing matches vLLM's ids as sets.

    use super::*;

    /// The fixture directory `name`, or `None` when it is missing and the run may skip
    /// (`MOE_REQUIRE_TEST_TOOLS` unset; set, a missing fixture fails the test).
    fn fixture(name: &str) -> Option<PathBuf> {
        let dir = fixtures().join(name);
        if dir.is_dir() {
            return Some(dir);
        }
        assert!(
            std::env::var_os("MOE_REQUIRE_TEST_TOOLS").is_none(),
            "{} is missing, and MOE_REQUIRE_TEST_TOOLS forbids skipping",
            dir.display()
        );
        None
    }

    fn fixtures() -> PathBuf {
        match std::env::var_os("MOE_FIXTURES") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures"),
        }
    }

    fn f32s(t: &TensorView<'_>) -> Vec<f32> {
        match t.dtype() {
            Dtype::BF16 => decode(t.data(), |b| bf16::from_le_bytes(b).to_f32()),
            Dtype::F32 => decode(t.data(), f32::from_le_bytes),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn run_matches_out_vllm_on_w4a8_fixtures() {
        let mut seen = 0;
        for entry in std::fs::read_dir(fixtures()).unwrap() {
            let dir = entry.unwrap().path();
            let Ok(config) = std::fs::read_to_string(dir.join("config.json")) else {
                continue;
            };
            if !config.contains("int-quantized") {
                continue;
            }
            seen += 1;
            let output = std::env::temp_dir().join(format!(
                "moe_run_test_{}_{}.safetensors",
                std::process::id(),
                seen
            ));
            let args = fixture_args(&dir, output.clone());
            let report = run(&args).unwrap();
            let got_bytes = std::fs::read(&output).unwrap();
            let _ = std::fs::remove_file(&output);
            let got = SafeTensors::deserialize(&got_bytes).unwrap();
            let want_bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
            let want = SafeTensors::deserialize(&want_bytes).unwrap();
            let out = f32s(&got.tensor("output").unwrap());
            let vllm = f32s(&want.tensor("out_vllm").unwrap());
            let scale = vllm.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = out
                .iter()
                .zip(&vllm)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= 1e-2 * scale, "{}: {diff} vs {scale}", dir.display());
            let ids: Vec<i32> = decode(got.tensor("topk_ids").unwrap().data(), i32::from_le_bytes);
            let want_ids: Vec<i32> =
                decode(want.tensor("topk_ids").unwrap().data(), i32::from_le_bytes);
            for (a, b) in ids.chunks(report.top_k).zip(want_ids.chunks(report.top_k)) {
                let (mut a, mut b) = (a.to_vec(), b.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{}", dir.display());
            }
        }
        assert!(seen > 0, "no W4A8 fixture under {}", fixtures().display());
    }

    /// A run of fixture `dir` on its hidden states `x`, routed by the gate, as JSON.
    fn fixture_args(dir: &Path, output: PathBuf) -> RunArgs {
        RunArgs {
            model: dir.to_path_buf(),
            layer: None,
            input: dir.join("expected.safetensors"),
            input_tensor: "x".into(),
            output,
            logits_tensor: None,
            topk_ids_tensor: None,
            topk_weights_tensor: None,
            tp_rank: 0,
            tp_size: 1,
            ep_rank: 0,
            ep_size: 1,
            wna16_activations: Wna16Activations::Float,
            w4a8_prefill: None,
            repeat: 1,
            json: true,
        }
    }

    fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
        let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (num / den).sqrt()
    }

    /// Runs `dir` with `activations` and returns the written output.
    fn run_output(dir: &Path, activations: Wna16Activations, tag: &str) -> Vec<f32> {
        let output = std::env::temp_dir().join(format!(
            "moe_run_test_{}_{tag}.safetensors",
            std::process::id()
        ));
        let args = RunArgs {
            wna16_activations: activations,
            ..fixture_args(dir, output.clone())
        };
        run(&args).unwrap();
        let bytes = std::fs::read(&output).unwrap();
        let _ = std::fs::remove_file(&output);
        let got = SafeTensors::deserialize(&bytes).unwrap();
        f32s(&got.tensor("output").unwrap())
    }

    /// `--w4a8-prefill` reaches the layer: the report's kernel lines say what is in force (the
    /// requantised path where the rung has it, the exact one always for `int8`), and the
    /// fixture's output stays within the int4 tolerance of the f32 reference and of vLLM.
    #[test]
    fn w4a8_prefill_choice_reaches_the_layer() {
        let Some(dir) = fixture("qwen3moe-w4a8-g32") else {
            return;
        };
        let want_bytes = std::fs::read(dir.join("expected.safetensors")).unwrap();
        let want = SafeTensors::deserialize(&want_bytes).unwrap();
        let hf = f32s(&want.tensor("out_hf_dequant_f32").unwrap());
        let vllm = f32s(&want.tensor("out_vllm").unwrap());
        for (prefill, tag) in [
            (W4A8Prefill::ExactInt8, "exact"),
            (W4A8Prefill::ChannelInt8, "channel"),
        ] {
            let output = std::env::temp_dir().join(format!(
                "moe_run_test_{}_prefill_{tag}.safetensors",
                std::process::id()
            ));
            let args = RunArgs {
                w4a8_prefill: Some(prefill),
                ..fixture_args(&dir, output.clone())
            };
            let report = run(&args).unwrap();
            let ops = report.kernel_ops.join("; ");
            let requantised = ops.contains("requantised to int8 per channel from");
            let has_body = ops.contains("int8-channel");
            assert_eq!(
                requantised,
                prefill == W4A8Prefill::ChannelInt8 && has_body,
                "{tag}: {ops}"
            );
            let bytes = std::fs::read(&output).unwrap();
            let _ = std::fs::remove_file(&output);
            let got = SafeTensors::deserialize(&bytes).unwrap();
            let got = f32s(&got.tensor("output").unwrap());
            assert!(rel_l2(&got, &hf) < 3e-2, "{tag}: {}", rel_l2(&got, &hf));
            assert!(rel_l2(&got, &vllm) < 3e-2, "{tag}: {}", rel_l2(&got, &vllm));
        }
    }

    /// The two fixtures hold the same int4 codes and bf16 scales, so the WNA16 one run with
    /// int8 activations is the W4A8 computation: the same numbers as the W4A8 fixture, bit
    /// for bit, and within the int4 tolerance of the f32 reference and of vLLM (whose x86
    /// kernel also quantizes this checkpoint's activations to int8).
    #[test]
    fn wna16_fixture_with_int8_activations_is_the_w4a8_computation() {
        let (Some(w4a16), Some(w4a8)) =
            (fixture("qwen3moe-w4a16-g32"), fixture("qwen3moe-w4a8-g32"))
        else {
            return;
        };
        let int8 = run_output(&w4a16, Wna16Activations::DynamicInt8, "wna16_int8");
        let w4a8_out = run_output(&w4a8, Wna16Activations::Float, "w4a8");
        let float = run_output(&w4a16, Wna16Activations::Float, "wna16_float");
        assert_eq!(int8, w4a8_out);
        assert_ne!(int8, float, "the float road must differ from the int8 one");
        let want_bytes = std::fs::read(w4a16.join("expected.safetensors")).unwrap();
        let want = SafeTensors::deserialize(&want_bytes).unwrap();
        let hf = f32s(&want.tensor("out_hf_dequant_f32").unwrap());
        let vllm = f32s(&want.tensor("out_vllm").unwrap());
        assert!(rel_l2(&int8, &hf) < 3e-2, "{}", rel_l2(&int8, &hf));
        assert!(rel_l2(&int8, &vllm) < 3e-2, "{}", rel_l2(&int8, &vllm));
        assert!(rel_l2(&float, &hf) < 1e-2, "{}", rel_l2(&float, &hf));
    }

    #[test]
    fn missing_input_tensor_is_an_error() {
        let Some(dir) = fixture("qwen3moe-w4a8-g32") else {
            return;
        };
        let args = RunArgs {
            input_tensor: "no_such_tensor".into(),
            json: false,
            ..fixture_args(
                &dir,
                std::env::temp_dir().join("moe_run_never_written.safetensors"),
            )
        };
        let e = run(&args).unwrap_err().to_string();
        assert!(e.contains("no_such_tensor"), "{e}");
    }
}
