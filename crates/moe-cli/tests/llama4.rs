//! A Llama 4 checkpoint written by the test as Meta ships the multimodal model (config under
//! `text_config`, tensors under `language_model.`, each layer's bf16 experts fused and stored
//! with K leading, a shared expert) through `moe inspect` and `moe run` with the checkpoint's
//! own router: the top logit's sigmoid scales the token before its expert, and the shared
//! expert's output is added. Run's f32 output matches an f64 evaluation of that block (relative
//! L2 below 1e-5 on the f32 road, 1e-2 on the CPU's default road, whose GEMMs may round
//! activations to bf16), and its `topk_ids`/`topk_weights` are the top logit and its sigmoid.

mod support;

use std::collections::BTreeMap;

use moe_testutil::SplitMix64;
use safetensors::Dtype;
use serde_json::json;
use support::{
    SafetensorsFile, ScratchDir, bf16_bytes, moe_json, moe_run_args, moe_with_env, path_arg,
    random_bf16, rel_l2, write_hidden_input, write_json, write_safetensors,
};

const E: usize = 4;
const H: usize = 64;
const I: usize = 24;
const T: usize = 40;

/// `x · W` for `w` `[k, n]` (K leading, as Llama 4 stores its experts), in f64.
fn times(x: &[f64], w: &[f32], k: usize, n: usize) -> Vec<f64> {
    (0..n)
        .map(|c| (0..k).map(|r| x[r] * f64::from(w[r * n + c])).sum())
        .collect()
}

/// The gated SiLU MLP of `gate_up` `[H, 2I]` and `down` `[I, H]`, in f64.
fn mlp(x: &[f64], gate_up: &[f32], down: &[f32]) -> Vec<f64> {
    let gu = times(x, gate_up, H, 2 * I);
    let a: Vec<f64> = (0..I)
        .map(|j| gu[j] / (1.0 + (-gu[j]).exp()) * gu[I + j])
        .collect();
    times(&a, down, I, H)
}

#[test]
fn multimodal_llama4_checkpoint_through_inspect_and_run() {
    let tmp = ScratchDir::new("llama4");
    let dir = tmp.path();
    let mut rng = SplitMix64::new(0x114);
    write_json(
        &dir.join("config.json"),
        &json!({
            "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
            "torch_dtype": "bfloat16",
            "text_config": {
                "model_type": "llama4_text", "hidden_size": H, "num_hidden_layers": 2,
                "num_local_experts": E, "num_experts_per_tok": 1, "intermediate_size": I,
                "intermediate_size_mlp": 2 * I, "interleave_moe_layer_step": 2,
                "hidden_act": "silu",
            },
            "vision_config": {"hidden_size": 32},
        }),
    );
    let prefix = "language_model.model.layers.1.feed_forward";
    let router = random_bf16(&mut rng, E * H, 0.5);
    let gate_up = random_bf16(&mut rng, E * H * 2 * I, 0.2);
    let down = random_bf16(&mut rng, E * I * H, 0.2);
    let shared: Vec<Vec<f32>> = [(I, H), (I, H), (H, I)]
        .iter()
        .map(|&(n, k)| random_bf16(&mut rng, n * k, 0.2))
        .collect();
    let mut tensors = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, v: &[f32]| {
        tensors.insert(name, (Dtype::BF16, shape, bf16_bytes(v)));
    };
    put(format!("{prefix}.router.weight"), vec![E, H], &router);
    put(
        format!("{prefix}.experts.gate_up_proj"),
        vec![E, H, 2 * I],
        &gate_up,
    );
    put(format!("{prefix}.experts.down_proj"), vec![E, I, H], &down);
    for (p, name) in shared.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
        let shape = if name == "down_proj" {
            vec![H, I]
        } else {
            vec![I, H]
        };
        put(format!("{prefix}.shared_expert.{name}.weight"), shape, p);
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);

    let v = moe_json(&[
        "inspect",
        "--json",
        "--model",
        path_arg(dir),
        "--layer",
        "1",
    ]);
    assert_eq!(v["family"], "Llama4", "{v}");
    assert_eq!(v["model_type"], "llama4", "{v}");
    let routing = v["routing"].as_str().unwrap();
    assert!(
        routing.starts_with("Llama4:") && routing.contains("before its expert"),
        "{v}"
    );
    assert_eq!(v["shared_experts"], "one MLP of intermediate 24", "{v}");
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
    let mut args = moe_run_args(dir, &input_file, &out_file);
    args.extend(["--layer", "1"]);

    // The block in f64: the shared MLP's `[n, k]` weights read as `[k, n]` by transposing.
    let transpose = |w: &[f32], n: usize, k: usize| -> Vec<f32> {
        (0..k * n).map(|s| w[(s % n) * k + s / n]).collect()
    };
    let mut shared_gate_up = Vec::with_capacity(H * 2 * I);
    let (sg, su) = (transpose(&shared[0], I, H), transpose(&shared[1], I, H));
    for k in 0..H {
        shared_gate_up.extend(&sg[k * I..][..I]);
        shared_gate_up.extend(&su[k * I..][..I]);
    }
    let shared_down = transpose(&shared[2], H, I);
    let mut want = Vec::with_capacity(T * H);
    let mut want_ids = Vec::with_capacity(T);
    for t in 0..T {
        let xt: Vec<f64> = x[t * H..][..H].iter().map(|&v| f64::from(v)).collect();
        let logits: Vec<f64> = (0..E)
            .map(|e| (0..H).map(|k| xt[k] * f64::from(router[e * H + k])).sum())
            .collect();
        let e = (0..E)
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap();
        let w = 1.0 / (1.0 + (-logits[e]).exp());
        want_ids.push(e as i32);
        let xw: Vec<f64> = xt.iter().map(|v| v * w).collect();
        let routed = mlp(
            &xw,
            &gate_up[e * H * 2 * I..][..H * 2 * I],
            &down[e * I * H..][..I * H],
        );
        let common = mlp(&xt, &shared_gate_up, &shared_down);
        want.extend(routed.iter().zip(&common).map(|(r, s)| r + s));
    }
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
        assert_eq!(out.i32s("topk_ids"), want_ids, "{road} road");
        let got = out.f32s("output");
        let rel = rel_l2(&got[..T * H], &want);
        eprintln!("{road} road: relative L2 {rel:.2e}");
        assert!(
            rel < bound,
            "{road} road: moe run vs f64 block: rel L2 {rel}"
        );
    }
}
