//! What the `moe` binary's integration tests share: running the binary and saying what it
//! printed when it does not do what a test expects, the fixtures and scratch directories, and
//! the small safetensors and JSON files the tests exchange with the binary.
//!
//! Every file under `tests/` is its own crate and uses only part of these helpers.
#![allow(dead_code)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// One finished run of the `moe` binary: its arguments, exit status and output.
pub struct MoeRun {
    args: Vec<String>,
    output: Output,
}

impl MoeRun {
    /// The exit status.
    pub fn status(&self) -> ExitStatus {
        self.output.status
    }

    /// Standard output as text.
    pub fn stdout(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.output.stdout)
    }

    /// Standard error as text.
    pub fn stderr(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.output.stderr)
    }

    /// Panics unless the run succeeded, with the arguments and what the binary said on stderr.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.output.status.success(),
            "moe {:?} failed ({}):\n{}",
            self.args,
            self.output.status,
            self.stderr()
        );
        self
    }

    /// Panics unless the run failed, with the arguments and what the binary printed.
    #[track_caller]
    pub fn assert_failure(&self) -> &Self {
        assert!(
            !self.output.status.success(),
            "moe {:?} succeeded where it should fail; stdout:\n{}",
            self.args,
            self.stdout()
        );
        self
    }

    /// Asserts a failing run with a message holding `needle` on stderr and no panic.
    #[track_caller]
    pub fn assert_clean_failure(&self, needle: &str) {
        self.assert_failure();
        let stderr = self.stderr();
        assert!(
            !stderr.contains("panicked"),
            "moe {:?} panicked: {stderr}",
            self.args
        );
        self.assert_stderr_has(needle);
    }

    /// Asserts that the binary reported an error rather than panicking: exit status 1, the one
    /// `main` exits with after printing the error, and `needle` on stderr.
    #[track_caller]
    pub fn assert_reported_error(&self, needle: &str) {
        let stderr = self.stderr();
        assert_eq!(
            self.output.status.code(),
            Some(1),
            "moe {:?} did not exit with status 1: {stderr}",
            self.args
        );
        self.assert_stderr_has(needle);
    }

    /// Asserts that stderr holds `needle`.
    #[track_caller]
    fn assert_stderr_has(&self, needle: &str) {
        let stderr = self.stderr();
        assert!(
            stderr.contains(needle),
            "moe {:?}: {stderr:?} lacks {needle:?}",
            self.args
        );
    }

    /// The JSON the run printed on stdout, after checking that it succeeded.
    #[track_caller]
    pub fn json(&self) -> Value {
        self.assert_success();
        serde_json::from_slice(&self.output.stdout).unwrap_or_else(|e| {
            panic!(
                "moe {:?} printed no JSON ({e}): {}",
                self.args,
                self.stdout()
            )
        })
    }
}

/// Runs `moe` with `args` in the test's environment.
#[track_caller]
pub fn moe(args: &[&str]) -> MoeRun {
    moe_with_env(args, &[])
}

/// Runs `moe` with `args` and the variables `env` set on top of the test's environment.
#[track_caller]
pub fn moe_with_env(args: &[&str], env: &[(&str, &str)]) -> MoeRun {
    let output = Command::new(env!("CARGO_BIN_EXE_moe"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the moe binary runs");
    MoeRun {
        args: args.iter().map(|a| a.to_string()).collect(),
        output,
    }
}

/// Runs `moe` expecting success and JSON on stdout.
#[track_caller]
pub fn moe_json(args: &[&str]) -> Value {
    moe(args).json()
}

/// Runs `moe` expecting it to fail with a message holding `needle` on stderr and no panic.
#[track_caller]
pub fn assert_clean_failure(args: &[&str], needle: &str) {
    moe(args).assert_clean_failure(needle);
}

/// The checkpoint fixture `name`, under `$MOE_FIXTURES` or the shared fixtures directory.
pub fn fixture(name: &str) -> PathBuf {
    moe_testutil::fixtures_dir().join(name)
}

/// `path` as a command-line argument; the fixture and temporary paths are UTF-8.
pub fn path_arg(path: &Path) -> &str {
    path.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
}

/// The arguments of `moe run --json` on `model`, the hidden states read from tensor `x` of
/// `input` and the output written to `output`; callers append the routing and rank flags.
pub fn moe_run_args<'a>(model: &'a Path, input: &'a Path, output: &'a Path) -> Vec<&'a str> {
    vec![
        "run",
        "--json",
        "--model",
        path_arg(model),
        "--input",
        path_arg(input),
        "--input-tensor",
        "x",
        "--output",
        path_arg(output),
    ]
}

/// A directory of its own under the temporary directory, removed when dropped so that a test
/// leaves nothing behind; its name holds the process id so that test binaries running at the
/// same time do not share it, and a tag that each test picks for itself.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates the directory `moe-cli-<tag>-<pid>`, empty even where an earlier run left one.
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!("moe-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies every file of directory `from` into directory `to`.
pub fn copy_files(from: &Path, to: &Path) {
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("listing {}: {e}", from.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap()))
            .unwrap_or_else(|e| panic!("copying {}: {e}", path.display()));
    }
}

/// The JSON document in file `path`.
#[track_caller]
pub fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Writes `value` to file `path` as JSON.
pub fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, value.to_string())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Little-endian bytes of `values`, as safetensors stores F32.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Little-endian bytes of `values` rounded to bf16, as safetensors stores BF16.
pub fn bf16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// `len` uniform values in `[-scale, scale)`, each rounded to bf16 and widened back, so a
/// checkpoint written in bf16 holds exactly them.
pub fn random_bf16(rng: &mut moe_testutil::SplitMix64, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| bf16::from_f32(rng.uniform(-scale, scale)).to_f32())
        .collect()
}

/// Writes hidden states `x` `[tokens, hidden]` (f32) as tensor `x` of
/// `dir/input.safetensors`, for `moe run --input … --input-tensor x`; returns the file.
pub fn write_hidden_input(dir: &Path, x: &[f32], tokens: usize, hidden: usize) -> PathBuf {
    let mut input = BTreeMap::new();
    input.insert(
        "x".to_string(),
        (Dtype::F32, vec![tokens, hidden], f32_bytes(x)),
    );
    let file = dir.join("input.safetensors");
    write_safetensors(&file, &input);
    file
}

/// Little-endian bytes of `values`, as safetensors stores I32.
pub fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One tensor to write: dtype, shape and little-endian bytes.
pub type Tensor = (Dtype, Vec<usize>, Vec<u8>);

/// Writes `tensors` (name to dtype, shape and bytes) as a safetensors file at `path`.
pub fn write_safetensors(path: &Path, tensors: &BTreeMap<String, Tensor>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap())
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// A safetensors file read into memory, whose tensors the tests take as typed values.
pub struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl SafetensorsFile {
    /// Reads the file at `path`.
    #[track_caller]
    pub fn read(path: &Path) -> Self {
        let bytes =
            std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        Self {
            path: path.to_path_buf(),
            bytes,
        }
    }

    /// The raw bytes of tensor `name`.
    #[track_caller]
    pub fn data(&self, name: &str) -> &[u8] {
        let st = SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{} is not safetensors: {e}", self.path.display()));
        st.tensor(name)
            .unwrap_or_else(|e| panic!("{} has no tensor {name:?}: {e}", self.path.display()))
            .data()
    }

    /// Tensor `name` read as little-endian f32.
    #[track_caller]
    pub fn f32s(&self, name: &str) -> Vec<f32> {
        self.data(name)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Tensor `name` read as little-endian i32.
    #[track_caller]
    pub fn i32s(&self, name: &str) -> Vec<i32> {
        self.data(name)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Tensor `name` read as little-endian u32.
    #[track_caller]
    pub fn u32s(&self, name: &str) -> Vec<u32> {
        self.data(name)
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Tensor `name` read as little-endian bf16.
    #[track_caller]
    pub fn bf16s(&self, name: &str) -> Vec<bf16> {
        self.data(name)
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Tensor `name` read as little-endian f16.
    #[track_caller]
    pub fn f16s(&self, name: &str) -> Vec<f16> {
        self.data(name)
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

/// The largest absolute difference between `got` and `want`, element by element.
pub fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()))
}

/// The rows of a `moe bench --json` report.
#[track_caller]
pub fn bench_rows(report: &Value) -> &Vec<Value> {
    report["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("no rows in {report}"))
}

/// The bytes one bench row streams per expert it touches.
#[track_caller]
pub fn bytes_per_expert(row: &Value) -> f64 {
    row["bytes_touched"].as_f64().unwrap() / row["experts_touched"].as_f64().unwrap()
}

/// The f64 forward of a SiLU-gated MoE block on a given routing: per token, the sum over its
/// `top_k` experts of `weight · down(silu(gate(x)) · up(x))`, `[tokens, hidden]`.
/// `matvec(e, p, v)` multiplies projection `p` (0 gate, 1 up, 2 down) of expert `e` by `v`.
pub fn silu_moe_forward(
    hidden: usize,
    top_k: usize,
    x: &[f32],
    ids: &[i32],
    weights: &[f32],
    matvec: impl Fn(usize, usize, &[f64]) -> Vec<f64>,
) -> Vec<f64> {
    let tokens = x.len() / hidden;
    let mut out = Vec::with_capacity(tokens * hidden);
    for t in 0..tokens {
        let xt: Vec<f64> = x[t * hidden..][..hidden]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let mut want = vec![0f64; hidden];
        for j in 0..top_k {
            let e = ids[t * top_k + j] as usize;
            let a: Vec<f64> = matvec(e, 0, &xt)
                .iter()
                .zip(matvec(e, 1, &xt))
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (w, y) in want.iter_mut().zip(matvec(e, 2, &a)) {
                *w += f64::from(weights[t * top_k + j]) * y;
            }
        }
        out.extend(want);
    }
    out
}

/// Writes hidden states `x` (`[tokens, hidden]`, tensor `x`) with a given routing (`ids` and
/// `w`, `[tokens, top_k]`) into the safetensors file `path`, for `moe run --input-tensor x
/// --topk-ids-tensor ids --topk-weights-tensor w`.
pub fn write_routed_input(
    path: &Path,
    hidden: usize,
    top_k: usize,
    x: &[f32],
    ids: &[i32],
    weights: &[f32],
) {
    let tokens = x.len() / hidden;
    let mut input = BTreeMap::new();
    input.insert(
        "x".to_string(),
        (Dtype::F32, vec![tokens, hidden], f32_bytes(x)),
    );
    input.insert(
        "ids".to_string(),
        (Dtype::I32, vec![tokens, top_k], i32_bytes(ids)),
    );
    input.insert(
        "w".to_string(),
        (Dtype::F32, vec![tokens, top_k], f32_bytes(weights)),
    );
    write_safetensors(path, &input);
}

/// The relative L2 error of `got` against `want`.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += (f64::from(*g) - w).powi(2);
        den += w.powi(2);
    }
    (num / den).sqrt()
}

/// The `config.json` of a one-layer Qwen3-MoE checkpoint (SiLU experts, normalised top-k
/// weights), without a `quantization_config`.
pub fn qwen3_moe_config(hidden: usize, experts: usize, top_k: usize, intermediate: usize) -> Value {
    serde_json::json!({
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "torch_dtype": "bfloat16", "hidden_act": "silu", "hidden_size": hidden,
        "num_hidden_layers": 1, "num_experts": experts, "num_experts_per_tok": top_k,
        "moe_intermediate_size": intermediate, "norm_topk_prob": true,
    })
}
