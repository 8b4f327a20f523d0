//! FP8 checkpoints written by the test (Qwen3-MoE shaped, `quant_method: fp8` with `[128, 128]`
//! blocks, and compressed-tensors `float-quantized` with bf16 channel scales; H = 160 and I = 72
//! so that every block column and row of the intermediate side is short) through `moe inspect`
//! and `moe run`: inspect names the scheme, the scales and the native WNA16 kernel, and run's
//! f32 output matches an f64 evaluation of the dequantized weights on the routing given in the
//! input file (relative L2 below 1e-5).

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use moe_testutil::SplitMix64;
use safetensors::Dtype;
use serde_json::json;
use support::{
    SafetensorsFile, ScratchDir, bench_rows, bytes_per_expert, f32_bytes, moe_json, moe_run_args,
    path_arg, qwen3_moe_config, rel_l2, silu_moe_forward, write_json, write_routed_input,
    write_safetensors,
};

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

/// One projection: e4m3 codes `[n, k]`, block or channel scales, and its dequantized weights.
struct Proj {
    n: usize,
    k: usize,
    codes: Vec<u8>,
    scales: Vec<f32>,
    channel_scales: bool,
}

impl Proj {
    /// Random codes, and scales per block, or per channel rounded to bf16 (as they are stored).
    fn random(rng: &mut SplitMix64, n: usize, k: usize, channel_scales: bool) -> Self {
        let codes = (0..n * k)
            .map(|_| match rng.below(256) as u8 {
                b if b & 0x7F == 0x7F => 0x80,
                b => b,
            })
            .collect();
        let scales = if channel_scales {
            rng.vec_uniform(n, 2e-5, 4e-4)
                .into_iter()
                .map(|v| half::bf16::from_f32(v).to_f32())
                .collect()
        } else {
            rng.vec_uniform(n.div_ceil(128) * k.div_ceil(128), 2e-5, 4e-4)
        };
        Self {
            n,
            k,
            codes,
            scales,
            channel_scales,
        }
    }

    fn matvec(&self, x: &[f64]) -> Vec<f64> {
        let kb = self.k.div_ceil(128);
        (0..self.n)
            .map(|r| {
                (0..self.k)
                    .map(|c| {
                        let s = f64::from(if self.channel_scales {
                            self.scales[r]
                        } else {
                            self.scales[(r / 128) * kb + c / 128]
                        });
                        x[c] * e4m3(self.codes[r * self.k + c]) * s
                    })
                    .sum()
            })
            .collect()
    }
}

/// Writes an FP8 checkpoint into `dir`, a gate and E experts drawn from `rng`, and returns the
/// experts' `[gate, up, down]` projections: `quant_method: fp8` with block scales, or with
/// `channel_scales` compressed-tensors `FP8_DYNAMIC` (bf16 `weight_scale` `[n, 1]`).
fn write_fp8_model(dir: &Path, rng: &mut SplitMix64, channel_scales: bool) -> Vec<[Proj; 3]> {
    let mut config = qwen3_moe_config(H, E, TOP_K, I);
    config["quantization_config"] = if channel_scales {
        json!({"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "symmetric": true,
                            "strategy": "channel", "dynamic": false},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": true,
                                      "strategy": "token", "dynamic": true}}},
            "ignore": ["lm_head"]})
    } else {
        json!({"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    };
    write_json(&dir.join("config.json"), &config);
    let mut tensors = BTreeMap::new();
    let gate = rng.vec_uniform(E * H, -0.5, 0.5);
    tensors.insert(
        "model.layers.0.mlp.gate.weight".to_string(),
        (Dtype::F32, vec![E, H], f32_bytes(&gate)),
    );
    let mut experts = Vec::new();
    for e in 0..E {
        let ps = [
            Proj::random(rng, I, H, channel_scales),
            Proj::random(rng, I, H, channel_scales),
            Proj::random(rng, H, I, channel_scales),
        ];
        for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            let prefix = format!("model.layers.0.mlp.experts.{e}.{name}");
            tensors.insert(
                format!("{prefix}.weight"),
                (Dtype::F8_E4M3, vec![p.n, p.k], p.codes.clone()),
            );
            let scales = if channel_scales {
                let bytes = p
                    .scales
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect();
                ("weight_scale", (Dtype::BF16, vec![p.n, 1], bytes))
            } else {
                let blocks = vec![p.n.div_ceil(128), p.k.div_ceil(128)];
                (
                    "weight_scale_inv",
                    (Dtype::F32, blocks, f32_bytes(&p.scales)),
                )
            };
            tensors.insert(format!("{prefix}.{}", scales.0), scales.1);
        }
        experts.push(ps);
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    experts
}

#[test]
fn fp8_block_checkpoint_through_inspect_and_run() {
    through_inspect_and_run(false, "fp8", "per 128 x 128 block");
}

#[test]
fn fp8_channel_checkpoint_through_inspect_and_run() {
    through_inspect_and_run(
        true,
        "compressed-tensors/float-quantized",
        "per output channel",
    );
}

/// Writes a checkpoint, checks what `moe inspect` says of it (`scheme`, and `scales` in the
/// weights' description) and runs it with `moe run` against the f64 reference.
fn through_inspect_and_run(channel_scales: bool, scheme: &str, scales: &str) {
    let tmp = ScratchDir::new("fp8");
    let dir = tmp.path();
    let mut rng = SplitMix64::new(0xf8);
    let experts = write_fp8_model(dir, &mut rng, channel_scales);

    let v = moe_json(&[
        "inspect",
        "--json",
        "--model",
        path_arg(dir),
        "--layer",
        "0",
    ]);
    assert_eq!(v["quant_scheme"], scheme, "{v}");
    let kernel = v["backend"]["kernel"].as_str().expect("a backend");
    assert!(kernel.starts_with("cpu-wna16/"), "{v}");
    assert_eq!(v["layer"]["experts"], E, "{v}");
    assert_eq!(v["layer"]["intermediate"], I, "{v}");
    let weights = v["layer"]["weights"].as_str().unwrap();
    assert!(
        weights.starts_with("fp8") && weights.contains(scales),
        "{v}"
    );

    // The routing is given: every token takes two distinct experts with its own weights.
    let x = rng.vec_uniform(T * H, -2.0, 2.0);
    let ids: Vec<i32> = (0..T * TOP_K)
        .map(|j| ((j / TOP_K + 3 * (j % TOP_K)) % E) as i32)
        .collect();
    let weights: Vec<f32> = (0..T * TOP_K).map(|j| 0.25 + 0.1 * j as f32).collect();
    let input_file = dir.join("input.safetensors");
    write_routed_input(&input_file, H, TOP_K, &x, &ids, &weights);
    let out_file = dir.join("out.safetensors");
    let mut args = moe_run_args(dir, &input_file, &out_file);
    args.extend(["--topk-ids-tensor", "ids", "--topk-weights-tensor", "w"]);
    let v = moe_json(&args);
    assert!(
        v["kernel"].as_str().unwrap().starts_with("cpu-wna16"),
        "{v}"
    );
    let got = SafetensorsFile::read(&out_file).f32s("output");
    let want = silu_moe_forward(H, TOP_K, &x, &ids, &weights, |e, p, v| {
        experts[e][p].matvec(v)
    });
    let rel = rel_l2(&got[..T * H], &want);
    assert!(rel < 1e-5, "moe run vs f64 reference: rel L2 {rel}");
}

/// `moe bench --format fp8` times FP8 experts against the bytes they stream: per weight one
/// code byte, plus an f32 scale per channel and block column (the packed layout repeats each
/// block row's scales for its channels), with channels padded to panels of 16 and K to steps
/// of 4.
#[test]
fn bench_fp8_reads_its_own_bytes() {
    let v = moe_json(&[
        "bench",
        "--json",
        "--format",
        "fp8",
        "--experts-only",
        "--shape",
        "e8-k2-h160-i72",
        "--batch-sizes",
        "1,3",
        "--min-bytes",
        "1M",
        "--iters",
        "3",
    ]);
    assert_eq!(v["format"], "fp8");
    let bytes = |n: usize, k: usize| {
        let channels = n.div_ceil(16) * 16;
        channels * k.div_ceil(4) * 4 + channels * k.div_ceil(128) * 4
    };
    let want = (bytes(2 * 72, 160) + bytes(160, 72)) as f64;
    for row in bench_rows(&v) {
        let per_expert = bytes_per_expert(row);
        assert_eq!(per_expert, want, "{row}");
        assert!(row["ms_per_call"].as_f64().unwrap() > 0.0);
    }
}
