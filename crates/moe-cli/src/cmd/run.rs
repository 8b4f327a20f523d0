//! `moe run`: runs one MoE block (router + experts) of a checkpoint on hidden states read from
//! a safetensors file, writes the output and the routing to another, and reports what ran
//! (scheme, backend, kernel, tokens, time) as text or JSON.

use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use half::{bf16, f16};
use moe_kernels::moe::MoeFloat;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{LoadOptions, LoadProgress, MoeLayer, Par};
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
    /// Wall time of routing plus experts, in milliseconds (loading excluded).
    pub run_ms: f64,
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
    let moe = load_layer(&ckpt, layer, args.json)?;
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
    let run_start = Instant::now();
    let (out, ids, weights) = match view.dtype() {
        Dtype::BF16 => run_typed(&moe, &decode(data, bf16::from_le_bytes))?,
        Dtype::F16 => run_typed(&moe, &decode(data, f16::from_le_bytes))?,
        Dtype::F32 => run_typed(&moe, &decode(data, f32::from_le_bytes))?,
        other => {
            return Err(format!(
                "{}: tensor {:?} is {other:?}; expected bf16, f16 or f32",
                args.input.display(),
                args.input_tensor
            )
            .into());
        }
    };
    let run_ms = run_start.elapsed().as_secs_f64() * 1e3;
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
        println!(
            "{} tokens × H {} ({}), top-{}: {:.3} ms (load + process {:.1} ms) → {}",
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

/// Below this many experts a layer loads in a blink and gets no progress bar.
const PROGRESS_MIN_EXPERTS: usize = 16;

/// Loads and processes `layer`, experts in parallel on rayon's global pool (the one `apply`
/// runs on), with a progress bar of experts packed on stderr for layers with many experts
/// (hidden with `--json` or when stderr is not a terminal; cleared when done).
fn load_layer(ckpt: &Checkpoint, layer: usize, json: bool) -> Result<MoeLayer, Box<dyn Error>> {
    let experts = ckpt.spec().num_experts;
    let opts = LoadOptions::new().with_par(Par::Rayon);
    if experts < PROGRESS_MIN_EXPERTS {
        return Ok(MoeLayer::from_checkpoint_with(
            ckpt,
            layer,
            MAX_TOKENS_PER_CALL,
            &opts,
        )?);
    }
    let bar = Output { json }.progress(experts as u64, &format!("loading layer {layer}"));
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

/// Routes with the layer's gate and runs the experts in the input's dtype; returns the output
/// widened to f32 and the routing.
type Routed = (Vec<f32>, Vec<i32>, Vec<f32>);
fn run_typed<X: MoeFloat>(moe: &MoeLayer, x: &[X]) -> Result<Routed, Box<dyn Error>> {
    let cfg = moe.config();
    let tokens = x.len() / cfg.hidden;
    let (mut ids, mut weights) = (
        vec![0i32; tokens * cfg.top_k],
        vec![0f32; tokens * cfg.top_k],
    );
    moe.route_hidden(x, &mut ids, &mut weights)?;
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
            let args = RunArgs {
                model: dir.clone(),
                layer: None,
                input: dir.join("expected.safetensors"),
                input_tensor: "x".into(),
                output: output.clone(),
                json: true,
            };
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

    #[test]
    fn missing_input_tensor_is_an_error() {
        let dir = fixtures().join("qwen3moe-w4a8-g32");
        if !dir.is_dir() {
            return;
        }
        let args = RunArgs {
            model: dir.clone(),
            layer: None,
            input: dir.join("expected.safetensors"),
            input_tensor: "no_such_tensor".into(),
            output: std::env::temp_dir().join("moe_run_never_written.safetensors"),
            json: false,
        };
        let e = run(&args).unwrap_err().to_string();
        assert!(e.contains("no_such_tensor"), "{e}");
    }
}
