//! An FP8 block-quantized checkpoint written by the test (Qwen3-MoE shaped, `quant_method:
//! fp8` with `[128, 128]` blocks, H = 160 and I = 72 so that every block column and row of the
//! intermediate side is short) through `moe inspect` and `moe run`: inspect names the scheme and
//! the native WNA16 kernel, and run's f32 output matches an f64 evaluation of the dequantized
//! weights on the routing given in the input file (relative L2 below 1e-5).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use moe_testutil::SplitMix64;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

const E: usize = 4;
const TOP_K: usize = 2;
const H: usize = 160;
const I: usize = 72;
const T: usize = 5;

/// The value of an e4m3fn byte from the format's definition, in f64.
fn e4m3(b: u8) -> f64 {
    let (e, m) = (i32::from((b >> 3) & 0xF), f64::from(b & 7));
    let mag = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if b & 0x80 != 0 { -mag } else { mag }
}

/// One projection: e4m3 codes `[n, k]`, block scales, and its dequantized weights.
struct Proj {
    n: usize,
    k: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
}

impl Proj {
    fn random(rng: &mut SplitMix64, n: usize, k: usize) -> Self {
        let codes = (0..n * k)
            .map(|_| match rng.below(256) as u8 {
                b if b & 0x7F == 0x7F => 0x80,
                b => b,
            })
            .collect();
        let scales = rng.vec_uniform(n.div_ceil(128) * k.div_ceil(128), 2e-5, 4e-4);
        Self {
            n,
            k,
            codes,
            scales,
        }
    }

    fn matvec(&self, x: &[f64]) -> Vec<f64> {
        let kb = self.k.div_ceil(128);
        (0..self.n)
            .map(|r| {
                (0..self.k)
                    .map(|c| {
                        let s = f64::from(self.scales[(r / 128) * kb + c / 128]);
                        x[c] * e4m3(self.codes[r * self.k + c]) * s
                    })
                    .sum()
            })
            .collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write(path: &Path, tensors: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn fp8_block_checkpoint_through_inspect_and_run() {
    let dir = std::env::temp_dir().join(format!("moe-cli-fp8-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = json!({
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "torch_dtype": "bfloat16", "hidden_act": "silu", "hidden_size": H,
        "num_hidden_layers": 1, "num_experts": E, "num_experts_per_tok": TOP_K,
        "moe_intermediate_size": I, "norm_topk_prob": true,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = SplitMix64::new(0xf8);
    let mut tensors = BTreeMap::new();
    let gate = rng.vec_uniform(E * H, -0.5, 0.5);
    tensors.insert(
        "model.layers.0.mlp.gate.weight".to_string(),
        (Dtype::F32, vec![E, H], f32_bytes(&gate)),
    );
    let mut experts = Vec::new();
    for e in 0..E {
        let ps = [
            Proj::random(&mut rng, I, H),
            Proj::random(&mut rng, I, H),
            Proj::random(&mut rng, H, I),
        ];
        for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            let prefix = format!("model.layers.0.mlp.experts.{e}.{name}");
            tensors.insert(
                format!("{prefix}.weight"),
                (Dtype::F8_E4M3, vec![p.n, p.k], p.codes.clone()),
            );
            tensors.insert(
                format!("{prefix}.weight_scale_inv"),
                (
                    Dtype::F32,
                    vec![p.n.div_ceil(128), p.k.div_ceil(128)],
                    f32_bytes(&p.scales),
                ),
            );
        }
        experts.push(ps);
    }
    write(&dir.join("model.safetensors"), &tensors);

    let model = dir.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moe"))
        .args(["inspect", "--json", "--model", model, "--layer", "0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["quant_scheme"], "fp8", "{v}");
    let kernel = v["backend"]["kernel"].as_str().expect("a backend");
    assert!(kernel.starts_with("cpu-wna16/"), "{v}");
    assert_eq!(v["layer"]["experts"], E, "{v}");
    assert_eq!(v["layer"]["intermediate"], I, "{v}");
    assert!(
        v["layer"]["weights"].as_str().unwrap().starts_with("fp8"),
        "{v}"
    );

    // The routing is given: every token takes two distinct experts with its own weights.
    let x = rng.vec_uniform(T * H, -2.0, 2.0);
    let ids: Vec<i32> = (0..T * TOP_K)
        .map(|j| ((j / TOP_K + 3 * (j % TOP_K)) % E) as i32)
        .collect();
    let weights: Vec<f32> = (0..T * TOP_K).map(|j| 0.25 + 0.1 * j as f32).collect();
    let mut input = BTreeMap::new();
    input.insert("x".to_string(), (Dtype::F32, vec![T, H], f32_bytes(&x)));
    let id_bytes = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    input.insert("ids".to_string(), (Dtype::I32, vec![T, TOP_K], id_bytes));
    input.insert(
        "w".to_string(),
        (Dtype::F32, vec![T, TOP_K], f32_bytes(&weights)),
    );
    let input_file = dir.join("input.safetensors");
    write(&input_file, &input);
    let out_file = dir.join("out.safetensors");
    let out = Command::new(env!("CARGO_BIN_EXE_moe"))
        .args(["run", "--json", "--model", model])
        .args([
            "--input",
            input_file.to_str().unwrap(),
            "--input-tensor",
            "x",
        ])
        .args(["--topk-ids-tensor", "ids", "--topk-weights-tensor", "w"])
        .args(["--output", out_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["kernel"].as_str().unwrap().starts_with("cpu-wna16"),
        "{v}"
    );
    let bytes = std::fs::read(&out_file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<f32> = st
        .tensor("output")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (mut num, mut den) = (0f64, 0f64);
    for t in 0..T {
        let xt: Vec<f64> = x[t * H..][..H].iter().map(|&v| f64::from(v)).collect();
        let mut want = vec![0f64; H];
        for j in 0..TOP_K {
            let [g, u, d] = &experts[ids[t * TOP_K + j] as usize];
            let a: Vec<f64> = g
                .matvec(&xt)
                .iter()
                .zip(u.matvec(&xt))
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            for (w, y) in want.iter_mut().zip(d.matvec(&a)) {
                *w += f64::from(weights[t * TOP_K + j]) * y;
            }
        }
        for (g, w) in got[t * H..][..H].iter().zip(&want) {
            num += (f64::from(*g) - w).powi(2);
            den += w.powi(2);
        }
    }
    let rel = (num / den).sqrt();
    assert!(rel < 1e-5, "moe run vs f64 reference: rel L2 {rel}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moe bench --format fp8` times FP8 experts against the bytes they stream: per weight one
/// code byte, plus an f32 scale per channel and block column (the packed layout repeats each
/// block row's scales for its channels), with channels padded to panels of 16 and K to steps
/// of 4.
#[test]
fn bench_fp8_reads_its_own_bytes() {
    let out = Command::new(env!("CARGO_BIN_EXE_moe"))
        .args([
            "bench",
            "--json",
            "--format",
            "fp8",
            "--experts-only",
            "--shape",
            "e8-k2-h160-i72",
        ])
        .args(["--batch-sizes", "1,3", "--min-bytes", "1M", "--iters", "3"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "fp8");
    let bytes = |n: usize, k: usize| {
        let channels = n.div_ceil(16) * 16;
        channels * k.div_ceil(4) * 4 + channels * k.div_ceil(128) * 4
    };
    let want = (bytes(2 * 72, 160) + bytes(160, 72)) as f64;
    for row in v["rows"].as_array().expect("rows") {
        let per_expert =
            row["bytes_touched"].as_f64().unwrap() / row["experts_touched"].as_f64().unwrap();
        assert_eq!(per_expert, want, "{row}");
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0);
    }
}
