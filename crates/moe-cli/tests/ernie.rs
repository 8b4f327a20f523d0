//! An ERNIE-4.5 MoE checkpoint written by the test as Baidu ships it (its own config field
//! names, a dense first layer, the router's correction bias `[1, E]` under `moe_statics`, two
//! shared experts fused in one MLP) through `moe inspect` and `moe run`: inspect names the
//! routing vLLM leaves `Unspecified` (softmax scores, the bias steering selection only) and a
//! kernel that serves it; run's output through the checkpoint's own router matches an f64
//! evaluation of the block (relative L2 below 1e-5 on the f32 road, 1e-2 on the CPU's default
//! road), and its `topk_ids` are the experts the biased scores pick.

mod support;

use std::collections::BTreeMap;

use moe_testutil::SplitMix64;
use safetensors::Dtype;
use serde_json::json;
use support::{
    SafetensorsFile, ScratchDir, bf16_bytes, moe_json, moe_run_args, moe_with_env, path_arg,
    random_bf16, rel_l2, write_hidden_input, write_json, write_safetensors,
};

const E: usize = 8;
const TOP_K: usize = 2;
const H: usize = 64;
const I: usize = 16;
const SHARED: usize = 2;
const T: usize = 24;

/// `w · x` for `w` `[n, k]`, in f64.
fn matvec(w: &[f32], n: usize, k: usize, x: &[f64]) -> Vec<f64> {
    (0..n)
        .map(|r| (0..k).map(|c| f64::from(w[r * k + c]) * x[c]).sum())
        .collect()
}

/// The gated SiLU MLP of `gate`, `up` `[n, H]` and `down` `[H, n]`, in f64.
fn mlp(x: &[f64], [gate, up, down]: &[Vec<f32>; 3], n: usize) -> Vec<f64> {
    let g = matvec(gate, n, H, x);
    let u = matvec(up, n, H, x);
    let a: Vec<f64> = (0..n)
        .map(|j| g[j] / (1.0 + (-g[j]).exp()) * u[j])
        .collect();
    matvec(down, H, n, &a)
}

#[test]
fn ernie_checkpoint_through_inspect_and_run() {
    let tmp = ScratchDir::new("ernie");
    let dir = tmp.path();
    let mut rng = SplitMix64::new(0xE45);
    write_json(
        &dir.join("config.json"),
        &json!({
            "model_type": "ernie4_5_moe", "architectures": ["Ernie4_5_MoeForCausalLM"],
            "torch_dtype": "bfloat16", "hidden_act": "silu", "hidden_size": H,
            "intermediate_size": 4 * H, "num_hidden_layers": 2, "moe_num_experts": E,
            "moe_k": TOP_K, "moe_intermediate_size": I, "moe_num_shared_experts": SHARED,
            "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
        }),
    );
    let prefix = "model.layers.1.mlp";
    let router = random_bf16(&mut rng, E * H, 0.5);
    // Against softmax scores near 1/E, a bias this large decides most selections.
    let bias = random_bf16(&mut rng, E, 0.3);
    let expert = |rng: &mut SplitMix64, n: usize| -> [Vec<f32>; 3] {
        [
            random_bf16(rng, n * H, 0.2),
            random_bf16(rng, n * H, 0.2),
            random_bf16(rng, H * n, 0.2),
        ]
    };
    let experts: Vec<[Vec<f32>; 3]> = (0..E).map(|_| expert(&mut rng, I)).collect();
    let shared = expert(&mut rng, SHARED * I);
    let mut tensors = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, v: &[f32]| {
        tensors.insert(name, (Dtype::BF16, shape, bf16_bytes(v)));
    };
    put(format!("{prefix}.gate.weight"), vec![E, H], &router);
    put(
        format!("{prefix}.moe_statics.e_score_correction_bias"),
        vec![1, E],
        &bias,
    );
    let names = ["gate_proj", "up_proj", "down_proj"];
    for (e, ws) in experts.iter().enumerate() {
        for (w, name) in ws.iter().zip(names) {
            let shape = if name == "down_proj" {
                vec![H, I]
            } else {
                vec![I, H]
            };
            put(format!("{prefix}.experts.{e}.{name}.weight"), shape, w);
        }
    }
    for (w, name) in shared.iter().zip(names) {
        let n = SHARED * I;
        let shape = if name == "down_proj" {
            vec![H, n]
        } else {
            vec![n, H]
        };
        put(format!("{prefix}.shared_experts.{name}.weight"), shape, w);
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);

    let v = moe_json(&["inspect", "--json", "--model", path_arg(dir)]);
    assert_eq!(v["family"], "Ernie45Moe", "{v}");
    assert_eq!(v["moe_layers"], json!([1]), "{v}");
    let routing = v["routing"].as_str().unwrap();
    assert!(
        routing.starts_with("Unspecified: softmax scores, a correction bias for selection"),
        "{v}"
    );
    assert_eq!(v["shared_experts"], "one MLP of intermediate 32", "{v}");
    assert!(
        v["backend"]["kernel"]
            .as_str()
            .expect("a backend")
            .starts_with("cpu-unquantized/"),
        "{v}"
    );

    let x = rng.vec_uniform(T * H, -1.0, 1.0);
    let input_file = write_hidden_input(dir, &x, T, H);
    let out_file = dir.join("out.safetensors");
    let args = moe_run_args(dir, &input_file, &out_file);

    let mut want = Vec::with_capacity(T * H);
    let mut want_ids = Vec::with_capacity(T * TOP_K);
    let mut unbiased_differs = false;
    for t in 0..T {
        let xt: Vec<f64> = x[t * H..][..H].iter().map(|&v| f64::from(v)).collect();
        let logits = matvec(&router, E, H, &xt);
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        let p: Vec<f64> = exp.iter().map(|v| v / sum).collect();
        let pick = |select: &dyn Fn(usize) -> f64| {
            let mut order: Vec<usize> = (0..E).collect();
            order.sort_by(|&a, &b| select(b).total_cmp(&select(a)).then(a.cmp(&b)));
            order.truncate(TOP_K);
            order
        };
        let chosen = pick(&|e| p[e] + f64::from(bias[e]));
        unbiased_differs |= pick(&|e| p[e]) != chosen;
        let norm: f64 = chosen.iter().map(|&e| p[e]).sum();
        let mut o = mlp(&xt, &shared, SHARED * I);
        for &e in &chosen {
            want_ids.push(e as i32);
            for (o, y) in o.iter_mut().zip(mlp(&xt, &experts[e], I)) {
                *o += p[e] / norm * y;
            }
        }
        want.extend(o);
    }
    assert!(
        unbiased_differs,
        "the bias changes no selection: a weak test"
    );
    for (road, env, bound) in [
        ("f32", &[("MOE_KERNELS_BF16_DOT", "0")][..], 1e-5),
        ("default", &[][..], 1e-2),
    ] {
        let v = moe_with_env(&args, env).assert_success().json();
        assert!(
            v["kernel"].as_str().unwrap().starts_with("cpu-unquantized"),
            "{v}"
        );
        let out = SafetensorsFile::read(&out_file);
        let mut ids = out.i32s("topk_ids");
        // Compare the chosen sets: the order within a token is the router's.
        for (got, want) in ids.chunks_mut(TOP_K).zip(want_ids.chunks(TOP_K)) {
            got.sort_unstable();
            let mut want = want.to_vec();
            want.sort_unstable();
            assert_eq!(got, &want[..], "{road} road");
        }
        let got = out.f32s("output");
        let rel = rel_l2(&got[..T * H], &want);
        eprintln!("{road} road: relative L2 {rel:.2e}");
        assert!(
            rel < bound,
            "{road} road: moe run vs f64 block: rel L2 {rel}"
        );
    }
}
