//! Builders of small synthetic checkpoints for the checkpoint tests: a `config.json` plus
//! safetensors written with the safetensors crate, in any family and storage format, so each
//! test can break one thing and check the error that names it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::bf16;
use moe_testutil::SplitMix64;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::{Value, json};

/// One stored tensor.
#[derive(Clone)]
pub struct Stored {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
        .collect()
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i8_bytes(v: &[i8]) -> Vec<u8> {
    v.iter().map(|&x| x as u8).collect()
}

/// A synthetic checkpoint: config plus tensors, editable before writing.
#[derive(Clone)]
pub struct Ckpt {
    pub config: Value,
    pub tensors: BTreeMap<String, Stored>,
}

/// Sizes of the synthetic models.
pub const E: usize = 4;
pub const H: usize = 16;
pub const I: usize = 8;
pub const G: usize = 8;

/// The logical content of one projection: codes `[n, k]` and scales `[n, k/G]` (f32 values
/// exactly representable in bf16), so every format can be checked against the same numbers.
pub struct Proj {
    pub n: usize,
    pub k: usize,
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
}

pub fn proj(rng: &mut SplitMix64, n: usize, k: usize) -> Proj {
    let codes = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
    let scales = (0..n * k / G)
        .map(|_| bf16::from_f32(rng.uniform(0.001, 0.05)).to_f32())
        .collect();
    Proj {
        n,
        k,
        codes,
        scales,
    }
}

/// The relative L2 distance of `got` from `want`.
pub fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// `W·x` in f64 for row-major weights `w` `[n, k]`.
pub fn matvec(w: &[f64], n: usize, k: usize, x: &[f64]) -> Vec<f64> {
    (0..n)
        .map(|r| (0..k).map(|c| w[r * k + c] * x[c]).sum())
        .collect()
}

/// The bf16 weights the float checkpoint of [`Ckpt::build`] stores for a projection, widened.
pub fn bf16_weights(p: &Proj) -> Vec<f64> {
    (0..p.n * p.k)
        .map(|i| f64::from(bf16::from_f32(f32::from(p.codes[i]) * p.scales[i / G]).to_f32()))
        .collect()
}

/// Storage formats the builder writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fmt {
    Float,
    IntQuantized,
    PackQuantized,
    Gptq,
}

impl Ckpt {
    /// A one-layer model of `family` (`qwen3_moe`, `qwen2_moe`, `mixtral`, `deepseek_v3`,
    /// `glm4_moe`, `qwen3_next`, `minimax_m2`, `llama4_text`: top-1, experts one by one as
    /// quantized Llama 4 checkpoints store them) with every routed expert written in `fmt`;
    /// returns it with the logical projections `[expert][w1, w3, w2]`. DeepSeek-V3 and GLM
    /// get a shared expert and a correction bias (DeepSeek two groups, one kept; GLM no
    /// groups and a routed scaling factor of 2.5), Qwen3-Next a gated shared expert,
    /// MiniMax-M2 a correction bias on the block, ERNIE-4.5 (`ernie4_5_moe`, its own field
    /// names) a correction bias `[1, E]` under `moe_statics` and one shared expert, PhiMoE
    /// (`phimoe`) a sparse mixer jitter of 0.3.
    pub fn build(model_type: &str, fmt: Fmt, seed: u64) -> (Self, Vec<[Proj; 3]>) {
        let mut rng = SplitMix64::new(seed);
        let mut config = json!({
            "model_type": model_type,
            "architectures": [],
            "torch_dtype": "bfloat16",
            "hidden_act": "silu",
            "hidden_size": H,
            "num_hidden_layers": 1,
            "num_experts_per_tok": 2,
        });
        let c = config.as_object_mut().unwrap();
        let (block, names): (&str, [&str; 3]) = match model_type {
            "mixtral" => {
                c.insert("num_local_experts".into(), json!(E));
                c.insert("intermediate_size".into(), json!(I));
                ("block_sparse_moe", ["w1", "w3", "w2"])
            }
            "deepseek_v3" => {
                c.insert("n_routed_experts".into(), json!(E));
                c.insert("moe_intermediate_size".into(), json!(I));
                c.insert("n_group".into(), json!(2));
                c.insert("topk_group".into(), json!(1));
                c.insert("n_shared_experts".into(), json!(1));
                c.insert("first_k_dense_replace".into(), json!(0));
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            "glm4_moe" => {
                c.insert("n_routed_experts".into(), json!(E));
                c.insert("moe_intermediate_size".into(), json!(I));
                c.insert("n_shared_experts".into(), json!(1));
                c.insert("first_k_dense_replace".into(), json!(0));
                c.insert("routed_scaling_factor".into(), json!(2.5));
                c.insert("norm_topk_prob".into(), json!(true));
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            "qwen3_next" => {
                c.insert("num_experts".into(), json!(E));
                c.insert("moe_intermediate_size".into(), json!(I));
                c.insert("shared_expert_intermediate_size".into(), json!(I));
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            "minimax_m2" => {
                c.insert("num_local_experts".into(), json!(E));
                c.insert("intermediate_size".into(), json!(I));
                c.insert("scoring_func".into(), json!("sigmoid"));
                c.insert("use_routing_bias".into(), json!(true));
                ("block_sparse_moe", ["w1", "w3", "w2"])
            }
            "ernie4_5_moe" => {
                c.remove("num_experts_per_tok");
                c.insert("moe_k".into(), json!(2));
                c.insert("moe_num_experts".into(), json!(E));
                c.insert("moe_intermediate_size".into(), json!(I));
                c.insert("moe_num_shared_experts".into(), json!(1));
                c.insert("moe_layer_start_index".into(), json!(0));
                c.insert("moe_layer_end_index".into(), json!(-1));
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
            "phimoe" => {
                c.insert("num_local_experts".into(), json!(E));
                c.insert("intermediate_size".into(), json!(I));
                // Wide enough that other logits often fall inside the mixer's band.
                c.insert("router_jitter_noise".into(), json!(0.3));
                ("block_sparse_moe", ["w1", "w3", "w2"])
            }
            "llama4_text" => {
                c.insert("num_local_experts".into(), json!(E));
                c.insert("intermediate_size".into(), json!(I));
                c.insert("num_experts_per_tok".into(), json!(1));
                c.insert("interleave_moe_layer_step".into(), json!(1));
                ("feed_forward", ["gate_proj", "up_proj", "down_proj"])
            }
            _ => {
                c.insert("num_experts".into(), json!(E));
                c.insert("moe_intermediate_size".into(), json!(I));
                c.insert("norm_topk_prob".into(), json!(true));
                ("mlp", ["gate_proj", "up_proj", "down_proj"])
            }
        };
        match fmt {
            Fmt::Float => {}
            Fmt::IntQuantized => {
                c.insert(
                    "quantization_config".into(),
                    ct_config("int-quantized", true),
                );
            }
            Fmt::PackQuantized => {
                c.insert(
                    "quantization_config".into(),
                    ct_config("pack-quantized", false),
                );
            }
            Fmt::Gptq => {
                c.insert(
                    "quantization_config".into(),
                    json!({"quant_method": "gptq", "bits": 4, "group_size": G,
                           "desc_act": false, "sym": true, "checkpoint_format": "gptq"}),
                );
            }
        }
        let mut ck = Ckpt {
            config,
            tensors: BTreeMap::new(),
        };
        let gate: Vec<f32> = rng.vec_uniform(E * H, -0.1, 0.1);
        let router = if model_type == "llama4_text" {
            "router"
        } else {
            "gate"
        };
        ck.put(
            &format!("model.layers.0.{block}.{router}.weight"),
            Dtype::BF16,
            &[E, H],
            bf16_bytes(&gate),
        );
        let bias_name = match model_type {
            "deepseek_v3" | "glm4_moe" => Some("model.layers.0.mlp.gate.e_score_correction_bias"),
            "minimax_m2" => Some("model.layers.0.block_sparse_moe.e_score_correction_bias"),
            _ => None,
        };
        if let Some(name) = bias_name {
            let bias: Vec<f32> = rng.vec_uniform(E, -0.1, 0.1);
            ck.put(name, Dtype::F32, &[E], f32_bytes(&bias));
        }
        if model_type == "ernie4_5_moe" {
            let bias: Vec<f32> = rng.vec_uniform(E, -0.1, 0.1);
            let name = "model.layers.0.mlp.moe_statics.e_score_correction_bias";
            ck.put(name, Dtype::F32, &[1, E], f32_bytes(&bias));
        }
        let mut experts = Vec::new();
        for e in 0..E {
            let ps = [
                proj(&mut rng, I, H),
                proj(&mut rng, I, H),
                proj(&mut rng, H, I),
            ];
            for (p, name) in ps.iter().zip(names) {
                ck.put_proj(
                    &format!("model.layers.0.{block}.experts.{e}.{name}"),
                    p,
                    fmt,
                );
            }
            experts.push(ps);
        }
        let shared_module = match model_type {
            "deepseek_v3" | "glm4_moe" | "ernie4_5_moe" => Some("mlp.shared_experts"),
            "qwen3_next" => Some("mlp.shared_expert"),
            "llama4_text" => Some("feed_forward.shared_expert"),
            _ => None,
        };
        if let Some(module) = shared_module {
            let ps = [
                proj(&mut rng, I, H),
                proj(&mut rng, I, H),
                proj(&mut rng, H, I),
            ];
            for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
                ck.put_proj(&format!("model.layers.0.{module}.{name}"), p, fmt);
            }
        }
        if model_type == "qwen3_next" {
            let gate: Vec<f32> = rng.vec_uniform(H, -0.5, 0.5);
            ck.put(
                "model.layers.0.mlp.shared_expert_gate.weight",
                Dtype::BF16,
                &[1, H],
                bf16_bytes(&gate),
            );
        }
        (ck, experts)
    }

    pub fn put(&mut self, name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) {
        self.tensors.insert(
            name.to_string(),
            Stored {
                dtype,
                shape: shape.to_vec(),
                bytes,
            },
        );
    }

    /// Writes one projection at `prefix` in `fmt`.
    pub fn put_proj(&mut self, prefix: &str, p: &Proj, fmt: Fmt) {
        let (n, k) = (p.n, p.k);
        match fmt {
            Fmt::Float => {
                let w: Vec<f32> = (0..n * k)
                    .map(|i| f32::from(p.codes[i]) * p.scales[i / G])
                    .collect();
                self.put(
                    &format!("{prefix}.weight"),
                    Dtype::BF16,
                    &[n, k],
                    bf16_bytes(&w),
                );
            }
            Fmt::IntQuantized => {
                self.put(
                    &format!("{prefix}.weight"),
                    Dtype::I8,
                    &[n, k],
                    i8_bytes(&p.codes),
                );
                self.put(
                    &format!("{prefix}.weight_scale"),
                    Dtype::BF16,
                    &[n, k / G],
                    bf16_bytes(&p.scales),
                );
            }
            Fmt::PackQuantized => {
                let words = moe_quant::pack_to_int32(&p.codes, n, k, 4).unwrap();
                self.put(
                    &format!("{prefix}.weight_packed"),
                    Dtype::I32,
                    &[n, k / 8],
                    i32_bytes(&words),
                );
                self.put(
                    &format!("{prefix}.weight_scale"),
                    Dtype::BF16,
                    &[n, k / G],
                    bf16_bytes(&p.scales),
                );
                let shape: Vec<u8> = [n as i64, k as i64]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                self.put(&format!("{prefix}.weight_shape"), Dtype::I64, &[2], shape);
            }
            Fmt::Gptq => {
                // qweight [k/8, n]: field t of word [r][c] = code of row r·8 + t, column c, +8.
                let mut q = vec![0i32; k / 8 * n];
                for c in 0..n {
                    for kk in 0..k {
                        let code = (i32::from(p.codes[c * k + kk]) + 8) as u32;
                        let w = &mut q[(kk / 8) * n + c];
                        *w = (*w as u32 | (code << (4 * (kk % 8)))) as i32;
                    }
                }
                self.put(
                    &format!("{prefix}.qweight"),
                    Dtype::I32,
                    &[k / 8, n],
                    i32_bytes(&q),
                );
                // scales [G, n] (transposed), fp16.
                let groups = k / G;
                let mut s = vec![0f32; groups * n];
                for c in 0..n {
                    for g in 0..groups {
                        s[g * n + c] = p.scales[c * groups + g];
                    }
                }
                let f16: Vec<u8> = s
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect();
                self.put(&format!("{prefix}.scales"), Dtype::F16, &[groups, n], f16);
                self.put(
                    &format!("{prefix}.qzeros"),
                    Dtype::I32,
                    &[groups, n / 8],
                    i32_bytes(&vec![0x7777_7777; groups * n / 8]),
                );
                let g_idx: Vec<i32> = (0..k).map(|kk| (kk / G) as i32).collect();
                self.put(
                    &format!("{prefix}.g_idx"),
                    Dtype::I32,
                    &[k],
                    i32_bytes(&g_idx),
                );
            }
        }
    }

    /// The serialized bytes of a set of tensors.
    pub fn serialize(tensors: &BTreeMap<String, Stored>) -> Vec<u8> {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, s)| {
                (
                    n.clone(),
                    TensorView::new(s.dtype, s.shape.clone(), &s.bytes).unwrap(),
                )
            })
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    /// Llama 4's bf16 layout of a `llama4_text` checkpoint from [`Self::build`]; see
    /// [`Self::fused_experts`].
    pub fn fused_llama4_experts(&self) -> Ckpt {
        self.fused_experts("model.layers.0.feed_forward.experts")
    }

    /// `self` (a `llama4_text` checkpoint) as the multimodal checkpoint ships it: the config
    /// under `text_config` inside a `llama4` wrapper, every tensor under `language_model.`.
    pub fn llama4_multimodal(&self) -> Ckpt {
        let mut wrapped = self.clone();
        let mut text = self.config.clone();
        let dtype = text.as_object_mut().unwrap().remove("torch_dtype").unwrap();
        wrapped.config = json!({
            "model_type": "llama4",
            "architectures": ["Llama4ForConditionalGeneration"],
            "torch_dtype": dtype,
            "text_config": text,
            "vision_config": {"hidden_size": 88},
        });
        wrapped.tensors = self
            .tensors
            .iter()
            .map(|(name, t)| (format!("language_model.{name}"), t.clone()))
            .collect();
        wrapped
    }

    /// The bf16 layout of Llama 4 and Qwen3-VL-MoE for a float checkpoint from
    /// [`Self::build`]: every expert under `block` (`….experts`) fused into
    /// `{block}.gate_up_proj` `[E, H, 2I]` (gate columns, then up) and `{block}.down_proj`
    /// `[E, I, H]`, transposed as the checkpoints store them.
    pub fn fused_experts(&self, block: &str) -> Ckpt {
        let mut fused = self.clone();
        let weight = |e: usize, p: &str| {
            let t = &self.tensors[&format!("{block}.{e}.{p}.weight")];
            assert_eq!(t.dtype, Dtype::BF16);
            t.bytes
                .chunks_exact(2)
                .map(|b| [b[0], b[1]])
                .collect::<Vec<[u8; 2]>>()
        };
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..E {
            let (g, u, d) = (
                weight(e, "gate_proj"),
                weight(e, "up_proj"),
                weight(e, "down_proj"),
            );
            for k in 0..H {
                for c in 0..2 * I {
                    let src = if c < I { &g } else { &u };
                    gate_up.extend(src[(c % I) * H + k]);
                }
            }
            for k in 0..I {
                for n in 0..H {
                    down.extend(d[n * I + k]);
                }
            }
        }
        fused
            .tensors
            .retain(|name, _| !name.starts_with(&format!("{block}.")));
        fused.put(
            &format!("{block}.gate_up_proj"),
            Dtype::BF16,
            &[E, H, 2 * I],
            gate_up,
        );
        fused.put(&format!("{block}.down_proj"), Dtype::BF16, &[E, I, H], down);
        fused
    }

    /// The bf16 checkpoint of gpt-oss model `m` ([`moe_testutil::gpt_oss::GptOss::bf16_tensors`]).
    pub fn gpt_oss_bf16(m: &moe_testutil::gpt_oss::GptOss) -> Ckpt {
        let tensors = m
            .bf16_tensors()
            .into_iter()
            .map(|(name, (dtype, shape, bytes))| {
                let stored = Stored {
                    dtype,
                    shape,
                    bytes,
                };
                (name, stored)
            })
            .collect();
        Ckpt {
            config: m.bf16_config(),
            tensors,
        }
    }

    /// Writes `config.json` and `model.safetensors` into `dir`.
    pub fn write(&self, dir: &Path) {
        std::fs::write(dir.join("config.json"), self.config.to_string()).unwrap();
        std::fs::write(
            dir.join("model.safetensors"),
            Self::serialize(&self.tensors),
        )
        .unwrap();
    }

    /// Writes `config.json`, `shards` shard files and the index (tensors dealt round-robin).
    pub fn write_sharded(&self, dir: &Path, shards: usize) {
        std::fs::write(dir.join("config.json"), self.config.to_string()).unwrap();
        let mut parts = vec![BTreeMap::new(); shards];
        let mut weight_map = serde_json::Map::new();
        for (i, (n, s)) in self.tensors.iter().enumerate() {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", i % shards + 1);
            parts[i % shards].insert(n.clone(), s.clone());
            weight_map.insert(n.clone(), json!(file));
        }
        for (i, part) in parts.iter().enumerate() {
            let file = format!("model-{:05}-of-{shards:05}.safetensors", i + 1);
            std::fs::write(dir.join(file), Self::serialize(part)).unwrap();
        }
        let index = json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
}

/// A one-layer Qwen3-MoE compressed-tensors W4A8 checkpoint the layer can run (group size a
/// multiple of 32): `e` experts, hidden `h`, intermediate `i`, group `g`, top-2, random codes
/// and bf16 scales from `seed`.
pub fn runnable_w4a8(e: usize, h: usize, i: usize, g: usize, seed: u64) -> Ckpt {
    runnable(Fmt::IntQuantized, [e, 2, h, i], g, seed)
}

/// The same kind of checkpoint in `fmt` (`IntQuantized`: W4A8 `int-quantized`;
/// `PackQuantized`: WNA16 `pack-quantized`, int4 packed eight per int32), shaped
/// `[experts, top_k, hidden, intermediate]`.
pub fn runnable(fmt: Fmt, [e, top_k, h, i]: [usize; 4], g: usize, seed: u64) -> Ckpt {
    let mut rng = SplitMix64::new(seed);
    let (format, activations) = match fmt {
        Fmt::IntQuantized => ("int-quantized", true),
        Fmt::PackQuantized => ("pack-quantized", false),
        _ => panic!("runnable writes compressed-tensors int-quantized or pack-quantized"),
    };
    let mut qc = ct_config(format, activations);
    qc["config_groups"]["group_0"]["weights"]["group_size"] = json!(g);
    let config = json!({
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": h,
        "num_hidden_layers": 1,
        "num_experts": e,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": i,
        "norm_topk_prob": true,
        "quantization_config": qc,
    });
    let mut ck = Ckpt {
        config,
        tensors: BTreeMap::new(),
    };
    ck.put(
        "model.layers.0.mlp.gate.weight",
        Dtype::BF16,
        &[e, h],
        bf16_bytes(&rng.vec_uniform(e * h, -0.5, 0.5)),
    );
    for x in 0..e {
        for (name, (n, k)) in
            ["gate_proj", "up_proj", "down_proj"]
                .iter()
                .zip([(i, h), (i, h), (h, i)])
        {
            let codes: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
            let scales = rng.vec_uniform(n * k / g, 0.002, 0.02);
            let prefix = format!("model.layers.0.mlp.experts.{x}.{name}");
            match fmt {
                Fmt::IntQuantized => ck.put(
                    &format!("{prefix}.weight"),
                    Dtype::I8,
                    &[n, k],
                    i8_bytes(&codes),
                ),
                _ => {
                    let words = moe_quant::pack_to_int32(&codes, n, k, 4).unwrap();
                    ck.put(
                        &format!("{prefix}.weight_packed"),
                        Dtype::I32,
                        &[n, k / 8],
                        i32_bytes(&words),
                    );
                    let shape: Vec<u8> = [n as i64, k as i64]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    ck.put(&format!("{prefix}.weight_shape"), Dtype::I64, &[2], shape);
                }
            }
            ck.put(
                &format!("{prefix}.weight_scale"),
                Dtype::BF16,
                &[n, k / g],
                bf16_bytes(&scales),
            );
        }
    }
    ck
}

fn ct_config(format: &str, with_activations: bool) -> Value {
    let weights = json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                         "group_size": G, "dynamic": false, "actorder": null});
    let mut group = json!({"targets": ["Linear"], "weights": weights, "format": format});
    if with_activations {
        group["input_activations"] = json!({"num_bits": 8, "type": "int", "symmetric": true,
                                            "strategy": "token", "dynamic": true});
    }
    json!({"quant_method": "compressed-tensors", "format": format,
           "quantization_status": "compressed", "config_groups": {"group_0": group},
           "ignore": ["lm_head", "re:.*mlp.gate$"]})
}

/// A fresh, empty directory for one test under cargo's per-target temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    // Unit tests that include this module have no target temporary directory.
    let root = option_env!("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = root
        .join("moe-layer-checkpoint")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One FP8 projection as written: e4m3fn bytes `[n, k]` and its scales as `scaling` lays
/// them out (`[ceil(n/128), ceil(k/128)]` blocks, `[n]` channels, or one value).
pub struct Fp8Proj {
    pub n: usize,
    pub k: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub scaling: Fp8Scaling,
}

impl Fp8Proj {
    /// The value of an e4m3fn byte from the format's definition (sign, four exponent bits with
    /// bias 7, three mantissa bits; exponent 0 is subnormal), in f64.
    pub fn e4m3(b: u8) -> f64 {
        let (e, m) = (i32::from((b >> 3) & 0xF), f64::from(b & 7));
        let mag = if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        };
        if b & 0x80 != 0 { -mag } else { mag }
    }

    /// The scale of the weight at `[r, c]`.
    pub fn scale_at(&self, r: usize, c: usize) -> f32 {
        match self.scaling {
            Fp8Scaling::Blocks => self.scales[(r / 128) * self.k.div_ceil(128) + c / 128],
            Fp8Scaling::Channels => self.scales[r],
            Fp8Scaling::Tensor => self.scales[0],
        }
    }

    /// The dequantized weights `[n, k]` in f64: `e4m3(code)·scale` of the code's block,
    /// channel or tensor.
    pub fn dequantized(&self) -> Vec<f64> {
        (0..self.n * self.k)
            .map(|i| {
                let (r, c) = (i / self.k, i % self.k);
                Self::e4m3(self.codes[i]) * f64::from(self.scale_at(r, c))
            })
            .collect()
    }
}

/// A random FP8 projection: any non-NaN byte, with subnormals and both zeros common, and
/// `scaling`'s scales (exact in bf16, as some checkpoints store them).
pub fn fp8_proj(rng: &mut SplitMix64, n: usize, k: usize, scaling: Fp8Scaling) -> Fp8Proj {
    let codes = (0..n * k)
        .map(|_| {
            let b = rng.below(256) as u8;
            let b = if rng.below(8) == 0 { b & 0x87 } else { b };
            if b & 0x7F == 0x7F { b ^ 0x08 } else { b }
        })
        .collect();
    let count = match scaling {
        Fp8Scaling::Blocks => n.div_ceil(128) * k.div_ceil(128),
        Fp8Scaling::Channels => n,
        Fp8Scaling::Tensor => 1,
    };
    let scales = rng
        .vec_uniform(count, 2e-5, 4e-4)
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect();
    Fp8Proj {
        n,
        k,
        codes,
        scales,
        scaling,
    }
}

/// How FP8 scales are laid out (the layer's `Fp8Scaling`, which the crate's own unit tests,
/// which include this module, cannot name as `moe_layer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Scaling {
    /// One scale per `128 × 128` block.
    Blocks,
    /// One scale per output channel.
    Channels,
    /// One scale per projection.
    Tensor,
}

/// How an FP8 checkpoint written by [`fp8`] declares and stores its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Store {
    /// `quant_method: fp8` with `[128, 128]` blocks (DeepSeek-V3, Qwen3 `-FP8`): f32
    /// `weight_scale_inv`, dynamic activations.
    Blocks,
    /// `quant_method: fp8` without blocks (AutoFP8): f32 `weight_scale` of shape `[]` per
    /// projection, static activations with an `input_scale` each.
    TensorStatic,
    /// compressed-tensors `float-quantized`, strategy channel (`FP8_DYNAMIC`): bf16
    /// `weight_scale` `[n, 1]`, dynamic per-token activations.
    CtChannels,
    /// compressed-tensors, strategy tensor (`FP8`): f32 `weight_scale` `[1]`, static
    /// per-tensor activations with an `input_scale` `[1]` each.
    CtTensor,
    /// compressed-tensors, strategy block (`FP8_BLOCK`): f32 `weight_scale` blocks, dynamic
    /// activations in groups of 128.
    CtBlocks,
}

impl Fp8Store {
    /// The scaling of the weights.
    pub fn scaling(self) -> Fp8Scaling {
        match self {
            Self::Blocks | Self::CtBlocks => Fp8Scaling::Blocks,
            Self::CtChannels => Fp8Scaling::Channels,
            Self::TensorStatic | Self::CtTensor => Fp8Scaling::Tensor,
        }
    }

    /// The `quantization_config`.
    fn config(self) -> Value {
        let ct = |weights: Value, activations: Value| {
            json!({"quant_method": "compressed-tensors", "format": "float-quantized",
                   "quantization_status": "compressed",
                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                     "input_activations": activations,
                                     "format": "float-quantized"}},
                   "ignore": ["lm_head", "re:.*mlp.gate$"]})
        };
        let weights = |strategy: &str| {
            json!({"num_bits": 8, "type": "float", "symmetric": true, "strategy": strategy,
                   "dynamic": false})
        };
        match self {
            Self::Blocks => json!({
                "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"],
            }),
            Self::TensorStatic => json!({
                "quant_method": "fp8", "activation_scheme": "static",
                "ignored_layers": ["lm_head"],
            }),
            Self::CtChannels => ct(
                weights("channel"),
                json!({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token",
                       "dynamic": true}),
            ),
            Self::CtTensor => ct(
                weights("tensor"),
                json!({"num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor",
                       "dynamic": false}),
            ),
            Self::CtBlocks => {
                let mut w = weights("block");
                w["block_structure"] = json!([128, 128]);
                ct(
                    w,
                    json!({"num_bits": 8, "type": "float", "symmetric": true,
                           "strategy": "group", "group_size": 128, "dynamic": true}),
                )
            }
        }
    }
}

/// A one-layer FP8 block-quantized checkpoint (`quant_method: fp8`, `[128, 128]` blocks,
/// dynamic activations); see [`fp8`].
pub fn fp8_block(model_type: &str, dims: [usize; 4], seed: u64) -> (Ckpt, Vec<[Fp8Proj; 3]>) {
    fp8(model_type, dims, seed, Fp8Store::Blocks)
}

/// A one-layer FP8 checkpoint stored as `store` says, of `model_type` (`qwen3_moe`,
/// `mixtral`, `minimax_m2` with a correction bias, `deepseek_v3` and `glm4_moe` with one
/// shared expert and a correction bias, or `llama4_text` with its shared expert), shaped
/// `[experts, top_k, hidden, intermediate]`; returns it with the projections
/// `[expert][gate, up, down]` (then the shared MLP's, if any).
pub fn fp8(
    model_type: &str,
    [e, top_k, h, i]: [usize; 4],
    seed: u64,
    store: Fp8Store,
) -> (Ckpt, Vec<[Fp8Proj; 3]>) {
    let mut rng = SplitMix64::new(seed);
    let mut config = json!({
        "model_type": model_type,
        "architectures": [],
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": h,
        "num_hidden_layers": 1,
        "num_experts_per_tok": top_k,
        "quantization_config": store.config(),
    });
    let c = config.as_object_mut().unwrap();
    // DeepSeek-V3 and GLM-4 MoE: a shared expert and a correction bias under the gate;
    // Mixtral and MiniMax-M2: `block_sparse_moe` with `w1`/`w3`/`w2` (MiniMax-M2 with a
    // correction bias on the block); Llama 4: `feed_forward` with a `router` and a shared
    // expert, experts one by one as its FP8 checkpoints store them.
    let shared = match model_type {
        "deepseek_v3" | "glm4_moe" => Some("model.layers.0.mlp.shared_experts"),
        "llama4_text" => Some("model.layers.0.feed_forward.shared_expert"),
        _ => None,
    };
    let block_sparse = matches!(model_type, "mixtral" | "minimax_m2");
    match model_type {
        "llama4_text" => {
            c.insert("num_local_experts".into(), json!(e));
            c.insert("intermediate_size".into(), json!(i));
        }
        "deepseek_v3" | "glm4_moe" => {
            c.insert("n_routed_experts".into(), json!(e));
            c.insert("n_shared_experts".into(), json!(1));
            c.insert("first_k_dense_replace".into(), json!(0));
            c.insert("moe_intermediate_size".into(), json!(i));
            if model_type == "deepseek_v3" {
                c.insert("n_group".into(), json!(2));
                c.insert("topk_group".into(), json!(1));
            } else {
                c.insert("routed_scaling_factor".into(), json!(2.5));
            }
        }
        "mixtral" | "minimax_m2" => {
            c.insert("num_local_experts".into(), json!(e));
            c.insert("intermediate_size".into(), json!(i));
            if model_type == "minimax_m2" {
                c.insert("scoring_func".into(), json!("sigmoid"));
                c.insert("use_routing_bias".into(), json!(true));
            }
        }
        _ => {
            c.insert("num_experts".into(), json!(e));
            c.insert("norm_topk_prob".into(), json!(true));
            c.insert("moe_intermediate_size".into(), json!(i));
        }
    }
    let mut ck = Ckpt {
        config,
        tensors: BTreeMap::new(),
    };
    let (block, router) = match model_type {
        _ if block_sparse => ("block_sparse_moe", "gate"),
        "llama4_text" => ("feed_forward", "router"),
        _ => ("mlp", "gate"),
    };
    ck.put(
        &format!("model.layers.0.{block}.{router}.weight"),
        Dtype::BF16,
        &[e, h],
        bf16_bytes(&rng.vec_uniform(e * h, -0.5, 0.5)),
    );
    let bias_name = match model_type {
        "deepseek_v3" | "glm4_moe" => Some("model.layers.0.mlp.gate.e_score_correction_bias"),
        "minimax_m2" => Some("model.layers.0.block_sparse_moe.e_score_correction_bias"),
        _ => None,
    };
    if let Some(name) = bias_name {
        let bias = rng.vec_uniform(e, -0.1, 0.1);
        ck.put(name, Dtype::F32, &[e], f32_bytes(&bias));
    }
    let mut prefixes: Vec<String> = (0..e)
        .map(|x| format!("model.layers.0.{block}.experts.{x}"))
        .collect();
    prefixes.extend(shared.map(String::from));
    let names = if block_sparse {
        ["w1", "w3", "w2"]
    } else {
        ["gate_proj", "up_proj", "down_proj"]
    };
    let scaling = store.scaling();
    let mut experts = Vec::new();
    for prefix in prefixes {
        let ps = [
            fp8_proj(&mut rng, i, h, scaling),
            fp8_proj(&mut rng, i, h, scaling),
            fp8_proj(&mut rng, h, i, scaling),
        ];
        for (p, name) in ps.iter().zip(names) {
            let input_scale = rng.vec_uniform(1, 1e-3, 1e-2);
            ck.put_fp8(&format!("{prefix}.{name}"), p, store, &input_scale);
        }
        experts.push(ps);
    }
    (ck, experts)
}

impl Ckpt {
    /// Writes one FP8 projection as `store` says: `weight` (F8_E4M3), its scale tensor and,
    /// for static activations, `input_scale`.
    pub fn put_fp8(&mut self, prefix: &str, p: &Fp8Proj, store: Fp8Store, input_scale: &[f32]) {
        self.put(
            &format!("{prefix}.weight"),
            Dtype::F8_E4M3,
            &[p.n, p.k],
            p.codes.clone(),
        );
        let blocks = [p.n.div_ceil(128), p.k.div_ceil(128)];
        let (name, dtype, shape, bytes) = match store {
            Fp8Store::Blocks => (
                "weight_scale_inv",
                Dtype::F32,
                &blocks[..],
                f32_bytes(&p.scales),
            ),
            Fp8Store::CtBlocks => (
                "weight_scale",
                Dtype::F32,
                &blocks[..],
                f32_bytes(&p.scales),
            ),
            Fp8Store::CtChannels => (
                "weight_scale",
                Dtype::BF16,
                &[p.n, 1][..],
                bf16_bytes(&p.scales),
            ),
            Fp8Store::TensorStatic => ("weight_scale", Dtype::F32, &[][..], f32_bytes(&p.scales)),
            Fp8Store::CtTensor => ("weight_scale", Dtype::F32, &[1][..], f32_bytes(&p.scales)),
        };
        self.put(&format!("{prefix}.{name}"), dtype, shape, bytes);
        match store {
            Fp8Store::TensorStatic => self.put(
                &format!("{prefix}.input_scale"),
                Dtype::F32,
                &[],
                f32_bytes(input_scale),
            ),
            Fp8Store::CtTensor => self.put(
                &format!("{prefix}.input_scale"),
                Dtype::F32,
                &[1],
                f32_bytes(input_scale),
            ),
            _ => {}
        }
    }
}

/// One expert projection as a checkpoint stores it: codes `[n, k]` and scales `[n]`.
pub struct Int8Proj {
    pub n: usize,
    pub k: usize,
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
}

/// A one-layer Qwen3-MoE compressed-tensors W8A8 checkpoint: codes spanning `−128..=127`,
/// bf16 scales `[n, 1]`; returns it with the router weight (exact in bf16) and the
/// projections `[expert][gate, up, down]`.
pub fn w8a8_int([e, top_k, h, i]: [usize; 4], seed: u64) -> (Ckpt, Vec<f32>, Vec<[Int8Proj; 3]>) {
    let mut rng = SplitMix64::new(seed);
    let config = json!({
        "model_type": "qwen3_moe", "architectures": [], "torch_dtype": "bfloat16",
        "hidden_act": "silu", "hidden_size": h, "num_hidden_layers": 1,
        "num_experts_per_tok": top_k, "num_experts": e, "norm_topk_prob": true,
        "moe_intermediate_size": i,
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "int-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": true,
                            "strategy": "channel", "dynamic": false},
                "input_activations": {"num_bits": 8, "type": "int", "symmetric": true,
                                      "strategy": "token", "dynamic": true},
                "format": "int-quantized"}},
            "ignore": ["lm_head", "re:.*mlp.gate$"]},
    });
    let mut ck = Ckpt {
        config,
        tensors: BTreeMap::new(),
    };
    let router: Vec<f32> = rng
        .vec_uniform(e * h, -0.5, 0.5)
        .into_iter()
        .map(|v| bf16::from_f32(v).to_f32())
        .collect();
    ck.put(
        "model.layers.0.mlp.gate.weight",
        Dtype::BF16,
        &[e, h],
        bf16_bytes(&router),
    );
    let mut experts = Vec::new();
    for x in 0..e {
        let ps = [(i, h), (i, h), (h, i)].map(|(n, k)| Int8Proj {
            n,
            k,
            codes: (0..n * k).map(|_| rng.below(256) as u8 as i8).collect(),
            scales: rng
                .vec_uniform(n, 1e-3, 1e-2)
                .into_iter()
                .map(|v| bf16::from_f32(v).to_f32())
                .collect(),
        });
        for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            let prefix = format!("model.layers.0.mlp.experts.{x}.{name}");
            ck.put(
                &format!("{prefix}.weight"),
                Dtype::I8,
                &[p.n, p.k],
                i8_bytes(&p.codes),
            );
            ck.put(
                &format!("{prefix}.weight_scale"),
                Dtype::BF16,
                &[p.n, 1],
                bf16_bytes(&p.scales),
            );
        }
        experts.push(ps);
    }
    (ck, router, experts)
}

/// How [`wna16`] stores a checkpoint's codes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Wna16Store {
    /// compressed-tensors `pack-quantized`: `weight_packed` `[n, ceil(k·b/32)]`.
    PackQuantized,
    /// GPTQ: `qweight` `[k·b/32, n]` (v1 zero points, stored minus one).
    Gptq,
    /// AWQ `gemm`: `qweight` `[k, n/8]`, int4 with zero points only.
    Awq,
}

/// A WNA16 checkpoint to write with [`wna16`].
#[derive(Clone, Copy, Debug)]
pub struct Wna16Spec {
    pub store: Wna16Store,
    /// 4 or 8.
    pub bits: u32,
    /// `None` = channelwise.
    pub group: Option<usize>,
    /// Act-order: random `g_idx` (each group `group` rows of K in a random order).
    pub act_order: bool,
    /// Zero points (always for AWQ).
    pub asym: bool,
    /// `[experts, top_k, hidden, intermediate]`.
    pub shape: [usize; 4],
}

/// A one-layer Qwen3-MoE WNA16 checkpoint as `spec` describes, with random unsigned codes,
/// zero points and scales (exact in bf16 and f16) from `seed`.
pub fn wna16(spec: &Wna16Spec, seed: u64) -> Ckpt {
    let mut rng = SplitMix64::new(seed);
    let [e, top_k, h, i] = spec.shape;
    let bits = spec.bits;
    let asym = spec.asym || spec.store == Wna16Store::Awq;
    let g_json = spec.group.map_or(-1, |g| g as i64);
    let qc = match spec.store {
        Wna16Store::PackQuantized => {
            let mut qc = ct_config("pack-quantized", false);
            let w = &mut qc["config_groups"]["group_0"]["weights"];
            w["num_bits"] = json!(bits);
            w["symmetric"] = json!(!asym);
            match spec.group {
                Some(g) => w["group_size"] = json!(g),
                None => {
                    w["strategy"] = json!("channel");
                    w["group_size"] = Value::Null;
                }
            }
            if spec.act_order {
                w["actorder"] = json!("group");
            }
            qc
        }
        Wna16Store::Gptq => json!({"quant_method": "gptq", "bits": bits, "group_size": g_json,
            "desc_act": spec.act_order, "sym": !asym, "checkpoint_format": "gptq"}),
        Wna16Store::Awq => json!({"quant_method": "awq", "bits": 4, "group_size": g_json,
            "zero_point": true, "version": "gemm"}),
    };
    let config = json!({
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": h,
        "num_hidden_layers": 1,
        "num_experts": e,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": i,
        "norm_topk_prob": true,
        "quantization_config": qc,
    });
    let mut ck = Ckpt {
        config,
        tensors: BTreeMap::new(),
    };
    ck.put(
        "model.layers.0.mlp.gate.weight",
        Dtype::BF16,
        &[e, h],
        bf16_bytes(&rng.vec_uniform(e * h, -0.5, 0.5)),
    );
    let max = (1u64 << bits) - 1;
    let pf = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    for x in 0..e {
        // Gate and up share one g_idx (the reader requires it).
        let mut g_idx13: Option<Vec<i32>> = None;
        for (name, (n, k)) in
            ["gate_proj", "up_proj", "down_proj"]
                .iter()
                .zip([(i, h), (i, h), (h, i)])
        {
            let gs = spec.group.unwrap_or(k);
            let groups = k.div_ceil(gs);
            let q: Vec<u32> = (0..n * k)
                .map(|_| (rng.next_u64() % (max + 1)) as u32)
                .collect();
            let z: Vec<u32> = (0..n * groups)
                .map(|_| (rng.next_u64() % (max + 1)) as u32)
                .collect();
            let scales: Vec<f32> = (0..n * groups)
                .map(|_| half::f16::from_f32(rng.uniform(0.002, 0.02)).to_f32())
                .map(|s| bf16::from_f32(s).to_f32())
                .collect();
            let g_idx: Vec<i32> = if spec.act_order {
                let mut fresh = || {
                    let mut perm: Vec<usize> = (0..k).collect();
                    for j in (1..k).rev() {
                        perm.swap(j, rng.below(j + 1));
                    }
                    let mut g = vec![0i32; k];
                    for (slot, &col) in perm.iter().enumerate() {
                        g[col] = (slot / gs) as i32;
                    }
                    g
                };
                match (*name, &g_idx13) {
                    ("up_proj", Some(g)) => g.clone(),
                    ("gate_proj", _) => {
                        let g = fresh();
                        g_idx13 = Some(g.clone());
                        g
                    }
                    _ => fresh(),
                }
            } else {
                (0..k).map(|kk| (kk / gs) as i32).collect()
            };
            let prefix = format!("model.layers.0.mlp.experts.{x}.{name}");
            // Scales transposed `[G, n]` in f16 (GPTQ, AWQ) or `[n, G]` in bf16.
            let scales_gn = || -> Vec<u8> {
                (0..groups * n)
                    .flat_map(|at| {
                        let (g, c) = (at / n, at % n);
                        half::f16::from_f32(scales[c * groups + g]).to_le_bytes()
                    })
                    .collect()
            };
            match spec.store {
                Wna16Store::PackQuantized => {
                    let offset = 1i32 << (bits - 1);
                    let signed: Vec<i8> = q.iter().map(|&v| (v as i32 - offset) as i8).collect();
                    let words = moe_quant::pack_to_int32(&signed, n, k, bits).unwrap();
                    let cols = moe_quant::pack::packed_int32_cols(k, bits);
                    ck.put(
                        &format!("{prefix}.weight_packed"),
                        Dtype::I32,
                        &[n, cols],
                        i32_bytes(&words),
                    );
                    let shape: Vec<u8> = [n as i64, k as i64]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    ck.put(&format!("{prefix}.weight_shape"), Dtype::I64, &[2], shape);
                    ck.put(
                        &format!("{prefix}.weight_scale"),
                        Dtype::BF16,
                        &[n, groups],
                        bf16_bytes(&scales),
                    );
                    if asym {
                        // Packed along N: field t of word [r][g] is row r·pf + t.
                        let rows = n.div_ceil(pf);
                        let mut zw = vec![0u32; rows * groups];
                        for c in 0..n {
                            for g in 0..groups {
                                zw[(c / pf) * groups + g] |=
                                    z[c * groups + g] << (bits as usize * (c % pf));
                            }
                        }
                        let zw: Vec<i32> = zw.into_iter().map(|w| w as i32).collect();
                        ck.put(
                            &format!("{prefix}.weight_zero_point"),
                            Dtype::I32,
                            &[rows, groups],
                            i32_bytes(&zw),
                        );
                    }
                    if spec.act_order {
                        ck.put(
                            &format!("{prefix}.weight_g_idx"),
                            Dtype::I32,
                            &[k],
                            i32_bytes(&g_idx),
                        );
                    }
                }
                Wna16Store::Gptq => {
                    let mut qw = vec![0u32; k / pf * n];
                    for c in 0..n {
                        for kk in 0..k {
                            qw[(kk / pf) * n + c] |= q[c * k + kk] << (bits as usize * (kk % pf));
                        }
                    }
                    let qw: Vec<i32> = qw.into_iter().map(|w| w as i32).collect();
                    ck.put(
                        &format!("{prefix}.qweight"),
                        Dtype::I32,
                        &[k / pf, n],
                        i32_bytes(&qw),
                    );
                    ck.put(
                        &format!("{prefix}.scales"),
                        Dtype::F16,
                        &[groups, n],
                        scales_gn(),
                    );
                    // v1 zero points store z − 1; symmetric ones the implied zero − 1.
                    let mut zw = vec![0u32; groups * n / pf];
                    for c in 0..n {
                        for g in 0..groups {
                            let zv = if asym {
                                z[c * groups + g]
                            } else {
                                1 << (bits - 1)
                            };
                            zw[g * (n / pf) + c / pf] |=
                                (zv.wrapping_sub(1) & mask) << (bits as usize * (c % pf));
                        }
                    }
                    let zw: Vec<i32> = zw.into_iter().map(|w| w as i32).collect();
                    ck.put(
                        &format!("{prefix}.qzeros"),
                        Dtype::I32,
                        &[groups, n / pf],
                        i32_bytes(&zw),
                    );
                    ck.put(
                        &format!("{prefix}.g_idx"),
                        Dtype::I32,
                        &[k],
                        i32_bytes(&g_idx),
                    );
                }
                Wna16Store::Awq => {
                    const FIELD: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                    let awq = |rows: usize, value: &dyn Fn(usize, usize) -> u32| -> Vec<u8> {
                        let mut w = vec![0u32; rows * n / 8];
                        for r in 0..rows {
                            for c in 0..n {
                                w[r * (n / 8) + c / 8] |= value(r, c) << (4 * FIELD[c % 8]);
                            }
                        }
                        w.iter().flat_map(|v| v.to_le_bytes()).collect()
                    };
                    ck.put(
                        &format!("{prefix}.qweight"),
                        Dtype::I32,
                        &[k, n / 8],
                        awq(k, &|r, c| q[c * k + r]),
                    );
                    ck.put(
                        &format!("{prefix}.qzeros"),
                        Dtype::I32,
                        &[groups, n / 8],
                        awq(groups, &|g, c| z[c * groups + g]),
                    );
                    ck.put(
                        &format!("{prefix}.scales"),
                        Dtype::F16,
                        &[groups, n],
                        scales_gn(),
                    );
                }
            }
        }
    }
    ck
}

/// The relative L2 error a WNA16 layer may show against the f32 reference, by the numerics its
/// kernel report (`BackendInfo::ops`) names: int4 GEMMs may take the CPU's bf16 path
/// (activations and dequantized weights rounded to bf16: at most 2^-8 per factor) or its
/// integer body (each activation rounded to a 15-bit grid of its row's largest: at most 2^-15
/// of that); else they compute in f32.
pub fn wna16_tolerance(ops: &[String]) -> f64 {
    let wna16_has = |what: &str| {
        ops.iter()
            .any(|op| op.starts_with("wna16_gemm") && op.contains(what))
    };
    if wna16_has("bf16 activations") {
        5e-3
    } else if wna16_has("15-bit integer activations") {
        1e-3
    } else {
        1e-5
    }
}
