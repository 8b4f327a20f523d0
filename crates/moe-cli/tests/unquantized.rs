//! An unquantized bf16 checkpoint written by the test (Qwen3-MoE shaped, no
//! `quantization_config`, every tensor in bf16) through `moe inspect` and `moe run`: inspect
//! names the unquantized kernel, and run's f32 output matches an f64 evaluation of the bf16
//! weights on the routing given in the input file. On the f32 road (`MOE_KERNELS_BF16_DOT=0`)
//! the bound is a relative L2 error of 1e-5; on the CPU's default road, whose expert GEMMs may
//! round their activations to bf16 (relative 2^-8 each; the weights are bf16 already), it is
//! 1e-2, the fixtures' budget for weight-only formats. With 40 tokens on 4 experts (20 rows per
//! expert) the calls reach the bf16 path wherever the CPU has one.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use moe_testutil::SplitMix64;
use safetensors::Dtype;
use support::{
    SafetensorsFile, ScratchDir, moe_json, moe_run_args, moe_with_env, path_arg, qwen3_moe_config,
    rel_l2, silu_moe_forward, write_json, write_routed_input, write_safetensors,
};

const E: usize = 4;
const TOP_K: usize = 2;
const H: usize = 96;
const I: usize = 40;
const T: usize = 40;

/// One projection's bf16 weights `[n, k]`.
struct Proj {
    n: usize,
    k: usize,
    w: Vec<bf16>,
}

impl Proj {
    fn random(rng: &mut SplitMix64, n: usize, k: usize) -> Self {
        let w = (0..n * k)
            .map(|_| bf16::from_f32(rng.uniform(-0.2, 0.2)))
            .collect();
        Self { n, k, w }
    }

    fn bytes(&self) -> Vec<u8> {
        self.w
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect()
    }

    fn matvec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.n)
            .map(|r| {
                (0..self.k)
                    .map(|c| x[c] * f64::from(self.w[r * self.k + c].to_f32()))
                    .sum()
            })
            .collect()
    }
}

/// Writes the bf16 checkpoint into `dir` and returns the experts' `[gate, up, down]`.
fn write_bf16_model(dir: &Path, rng: &mut SplitMix64) -> Vec<[Proj; 3]> {
    let config = qwen3_moe_config(H, E, TOP_K, I);
    write_json(&dir.join("config.json"), &config);
    let mut tensors = BTreeMap::new();
    let gate = Proj::random(rng, E, H);
    tensors.insert(
        "model.layers.0.mlp.gate.weight".to_string(),
        (Dtype::BF16, vec![E, H], gate.bytes()),
    );
    let mut experts = Vec::new();
    for e in 0..E {
        let ps = [
            Proj::random(rng, I, H),
            Proj::random(rng, I, H),
            Proj::random(rng, H, I),
        ];
        for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            tensors.insert(
                format!("model.layers.0.mlp.experts.{e}.{name}.weight"),
                (Dtype::BF16, vec![p.n, p.k], p.bytes()),
            );
        }
        experts.push(ps);
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    experts
}

#[test]
fn bf16_checkpoint_through_inspect_and_run_on_both_roads() {
    let tmp = ScratchDir::new("bf16");
    let dir = tmp.path();
    let mut rng = SplitMix64::new(0xbf);
    let experts = write_bf16_model(dir, &mut rng);

    let v = moe_json(&[
        "inspect",
        "--json",
        "--model",
        path_arg(dir),
        "--layer",
        "0",
    ]);
    let kernel = v["backend"]["kernel"].as_str().expect("a backend");
    assert!(kernel.starts_with("cpu-unquantized/"), "{v}");
    assert_eq!(v["layer"]["experts"], E, "{v}");

    // The routing is given: every token takes two distinct experts with its own weights.
    let x = rng.vec_uniform(T * H, -2.0, 2.0);
    let ids: Vec<i32> = (0..T * TOP_K)
        .map(|j| ((j / TOP_K + 3 * (j % TOP_K)) % E) as i32)
        .collect();
    let weights: Vec<f32> = (0..T * TOP_K).map(|j| 0.25 + 0.01 * j as f32).collect();
    let input_file = dir.join("input.safetensors");
    write_routed_input(&input_file, H, TOP_K, &x, &ids, &weights);
    let out_file = dir.join("out.safetensors");
    let mut args = moe_run_args(dir, &input_file, &out_file);
    args.extend(["--topk-ids-tensor", "ids", "--topk-weights-tensor", "w"]);
    let want = silu_moe_forward(H, TOP_K, &x, &ids, &weights, |e, p, v| {
        experts[e][p].matvec(v)
    });
    for (road, env, bound) in [
        ("f32", &[("MOE_KERNELS_BF16_DOT", "0")][..], 1e-5),
        ("default", &[][..], 1e-2),
    ] {
        let v = moe_with_env(&args, env).assert_success().json();
        assert!(
            v["kernel"].as_str().unwrap().starts_with("cpu-unquantized"),
            "{v}"
        );
        let got = SafetensorsFile::read(&out_file).f32s("output");
        let rel = rel_l2(&got[..T * H], &want);
        eprintln!("{road} road: relative L2 {rel:.2e}");
        assert!(
            rel < bound,
            "{road} road: moe run vs f64 reference: rel L2 {rel}"
        );
    }
}
