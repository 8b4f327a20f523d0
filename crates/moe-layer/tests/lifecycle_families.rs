//! GLM-4 MoE, Qwen3-Next, MiniMax-M2, Llama 4, Qwen3-VL-MoE, Granite, OLMoE, ERNIE-4.5 and
//! PhiMoE checkpoints through the whole
//! lifecycle: the config is read into the family's routing and shared experts, the tensors
//! are found under the family's names, and the layer's output through its own router equals a
//! float64 MoE block whose routing is recomputed here from each model's definition (or, for
//! Qwen3-VL-MoE, the output of the plain Qwen3-MoE checkpoint of the same weights).
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Ckpt, E, Fmt, H, I, Proj, bf16_weights, matvec, rel_l2, temp_dir};
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{
    Checkpoint, FloatData, ModelFamily, MoeLayerTensors, MoeModelSpec, ReadOptions, ShardAccess,
    StoredExperts,
};
use moe_router::{Logits, ScoringFunc};
use moe_testutil::SplitMix64;

const K: usize = 2;

/// `down(silu(gate(x)) · up(x))` in f64, for weights `w13` `[2n, H]` and `w2` `[H, n]`.
fn mlp(w13: &[f64], w2: &[f64], n: usize, x: &[f64]) -> Vec<f64> {
    let gu = matvec(w13, 2 * n, H, x);
    let a: Vec<f64> = (0..n)
        .map(|j| gu[j] / (1.0 + (-gu[j]).exp()) * gu[n + j])
        .collect();
    matvec(w2, H, n, &a)
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// The experts with the `K` largest `select` values (ties to the lower index).
fn top_k(select: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..select.len()).collect();
    order.sort_by(|&a, &b| select[b].total_cmp(&select[a]).then(a.cmp(&b)));
    order.truncate(K);
    order
}

/// How a family routes one token, from its model definition.
enum Routing<'a> {
    /// Sigmoid scores, the correction bias added for selection only, the chosen unbiased
    /// scores renormalized and multiplied by `scale` (GLM-4 MoE without groups, MiniMax-M2).
    BiasedSigmoid { bias: &'a [f32], scale: f64 },
    /// Softmax scores over all experts, the correction bias added for selection only, the
    /// chosen unbiased probabilities renormalized (ERNIE-4.5).
    BiasedSoftmax { bias: &'a [f32] },
    /// PhiMoE's sparse mixer, as vLLM's `sparsemixer` writes it with masks of `-inf`.
    SparseMixer { eps: f64 },
    /// Softmax over all experts, top-k, renormalized (Qwen3-Next).
    RenormalizedSoftmax,
    /// Softmax over all experts, top-k, the probabilities as they are (OLMoE).
    Softmax,
    /// The largest logit, weighted by its sigmoid, the weight multiplying the token before the
    /// expert (Llama 4).
    SigmoidOnInput,
}

impl Routing<'_> {
    fn route(&self, logits: &[f32]) -> Vec<(usize, f64)> {
        let l: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
        let (scores, select): (Vec<f64>, Vec<f64>) = match self {
            Self::BiasedSigmoid { bias, .. } => {
                let s: Vec<f64> = l.iter().map(|&v| sigmoid(v)).collect();
                let b = s
                    .iter()
                    .zip(*bias)
                    .map(|(s, b)| s + f64::from(*b))
                    .collect();
                (s, b)
            }
            Self::SigmoidOnInput => {
                let e = top_k(&l)[0];
                return vec![(e, sigmoid(l[e]))];
            }
            Self::SparseMixer { eps } => return sparse_mixer(&l, *eps),
            Self::RenormalizedSoftmax | Self::Softmax | Self::BiasedSoftmax { .. } => {
                let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = l.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                let p: Vec<f64> = e.iter().map(|v| v / sum).collect();
                let select = match self {
                    Self::BiasedSoftmax { bias } => p
                        .iter()
                        .zip(*bias)
                        .map(|(p, b)| p + f64::from(*b))
                        .collect(),
                    _ => p.clone(),
                };
                (p, select)
            }
        };
        let chosen = top_k(&select);
        let sum: f64 = match self {
            Self::Softmax => 1.0,
            _ => chosen.iter().map(|&e| scores[e]).sum(),
        };
        let scale = match self {
            Self::BiasedSigmoid { scale, .. } => *scale,
            _ => 1.0,
        };
        chosen
            .into_iter()
            .map(|e| (e, scores[e] / sum * scale))
            .collect()
    }
}

/// vLLM's `sparsemixer`: the largest logit (the first of equals), weighted by the softmax at
/// it of the logits masked to `-inf` where `(max − s) / max(|s|, max) > 2ε`; then again with
/// the first choice masked out.
fn sparse_mixer(scores: &[f64], eps: f64) -> Vec<(usize, f64)> {
    let mut masked = scores.to_vec();
    let mut chosen = Vec::new();
    for _ in 0..2 {
        let best = (0..masked.len()).fold(0, |b, j| if masked[j] > masked[b] { j } else { b });
        let max = masked[best];
        let gates: Vec<f64> = masked
            .iter()
            .zip(scores)
            .map(|(&m, &s)| {
                if (max - s) / s.abs().max(max) > 2.0 * eps {
                    f64::NEG_INFINITY
                } else {
                    m
                }
            })
            .collect();
        let sum: f64 = gates.iter().map(|g| (g - max).exp()).sum();
        chosen.push((best, 1.0 / sum));
        masked[best] = f64::NEG_INFINITY;
    }
    chosen
}

fn float_vec(d: &FloatData) -> Vec<f64> {
    d.to_f32_vec().into_iter().map(f64::from).collect()
}

/// The block's output in f64: routed experts by `routing`, plus the shared expert (behind its
/// sigmoid gate when the checkpoint has one).
fn reference(
    experts: &[[Proj; 3]],
    t: &MoeLayerTensors,
    routing: &Routing<'_>,
    x: &[f32],
    logits: &[f32],
) -> Vec<f64> {
    let tokens = x.len() / H;
    let mut out = vec![0f64; tokens * H];
    for tok in 0..tokens {
        let xt: Vec<f64> = x[tok * H..][..H].iter().map(|&v| f64::from(v)).collect();
        let o = &mut out[tok * H..][..H];
        for (e, w) in routing.route(&logits[tok * E..][..E]) {
            let [gate, up, down] = &experts[e];
            let mut w13 = bf16_weights(gate);
            w13.extend(bf16_weights(up));
            if matches!(routing, Routing::SigmoidOnInput) {
                // The weight scales the token (rounded to the f32 the layer computes in).
                let xw: Vec<f64> = xt.iter().map(|&v| f64::from((v * w) as f32)).collect();
                for (o, v) in o.iter_mut().zip(mlp(&w13, &bf16_weights(down), I, &xw)) {
                    *o += v;
                }
            } else {
                for (o, v) in o.iter_mut().zip(mlp(&w13, &bf16_weights(down), I, &xt)) {
                    *o += w * v;
                }
            }
        }
        if let Some(shared) = &t.shared {
            let StoredExperts::Float { w13, w2 } = &shared.mlp.weights else {
                panic!("float shared expert")
            };
            let y = mlp(
                &float_vec(w13),
                &float_vec(w2),
                shared.mlp.intermediate,
                &xt,
            );
            let g = shared.gate.as_ref().map_or(1.0, |g| {
                sigmoid(float_vec(g).iter().zip(&xt).map(|(g, x)| g * x).sum())
            });
            for (o, v) in o.iter_mut().zip(y) {
                *o += g * v;
            }
        }
    }
    out
}

/// `tokens` random hidden states and router logits.
fn random_tokens(seed: u64, tokens: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    (x, rng.vec_uniform(tokens * E, -3.0, 3.0))
}

/// The layer's output on `x` routed by `logits`.
fn output(layer: &MoeLayer, x: &[f32], logits: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    layer.apply(x, Logits::F32(logits), &mut out).unwrap();
    out
}

fn open(ck: &Ckpt, tag: &str) -> (Checkpoint, MoeLayerTensors) {
    let dir = temp_dir(tag);
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let t = ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
    (ckpt, t)
}

/// Runs layer 0 of `ckpt` through its own router on random tokens and compares it with the
/// f64 block.
fn assert_block_matches(
    ckpt: &Checkpoint,
    t: &MoeLayerTensors,
    experts: &[[Proj; 3]],
    routing: &Routing<'_>,
    seed: u64,
) {
    let layer = MoeLayer::from_checkpoint(ckpt, 0, 16).unwrap();
    let mut rng = SplitMix64::new(seed);
    for tokens in [1, 7] {
        let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
        let logits = rng.vec_uniform(tokens * E, -3.0, 3.0);
        let want = reference(experts, t, routing, &x, &logits);
        let mut out = vec![0f32; tokens * H];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        let err = rel_l2(&out, &want);
        assert!(err < 1e-5, "{tokens} tokens: relative L2 {err:e}");
    }
}

#[test]
fn glm4_moe_routes_like_deepseek_v3_without_groups_and_adds_its_shared_expert() {
    let (ck, experts) = Ckpt::build("glm4_moe", Fmt::Float, 61);
    let (ckpt, t) = open(&ck, "family-glm4");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::Glm4Moe);
    assert_eq!(spec.routing.scoring, ScoringFunc::Sigmoid);
    assert!(spec.routing.renormalize);
    assert!(spec.routing.has_correction_bias);
    assert_eq!(spec.routing.num_expert_group, Some(1));
    assert_eq!(spec.routing.routed_scaling_factor, 2.5);
    assert_eq!(spec.moe_layers, [0]);
    let shared = spec.shared_experts.unwrap();
    assert_eq!((shared.intermediate, shared.gated), (I, false));
    let bias = t.router.correction_bias.clone().unwrap();
    let routing = Routing::BiasedSigmoid {
        bias: &bias,
        scale: 2.5,
    };
    assert_block_matches(&ckpt, &t, &experts, &routing, 62);
}

#[test]
fn qwen3_next_renormalizes_and_gates_its_shared_expert() {
    let (ck, experts) = Ckpt::build("qwen3_next", Fmt::Float, 63);
    let (ckpt, t) = open(&ck, "family-qwen3-next");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::Qwen3Next);
    assert_eq!(spec.routing.scoring, ScoringFunc::Softmax);
    assert!(spec.routing.renormalize, "norm_topk_prob defaults to true");
    assert!(!spec.routing.has_correction_bias);
    let shared = spec.shared_experts.unwrap();
    assert_eq!((shared.intermediate, shared.gated), (I, true));
    assert!(t.shared.as_ref().unwrap().gate.is_some());
    assert_block_matches(&ckpt, &t, &experts, &Routing::RenormalizedSoftmax, 64);
}

#[test]
fn minimax_m2_reads_its_block_bias_and_w1_w3_w2_experts() {
    let (ck, experts) = Ckpt::build("minimax_m2", Fmt::Float, 65);
    let (ckpt, t) = open(&ck, "family-minimax");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::MiniMaxM2);
    assert_eq!(spec.routing.scoring, ScoringFunc::Sigmoid);
    assert!(spec.routing.renormalize);
    assert!(spec.routing.has_correction_bias);
    assert_eq!(spec.routing.num_expert_group, None);
    assert_eq!(spec.routing.routed_scaling_factor, 1.0);
    assert!(spec.shared_experts.is_none());
    let bias = t.router.correction_bias.clone().unwrap();
    let routing = Routing::BiasedSigmoid {
        bias: &bias,
        scale: 1.0,
    };
    assert_block_matches(&ckpt, &t, &experts, &routing, 66);

    // Without `use_routing_bias` the block routes on the plain scores and reads no bias.
    let mut plain = ck.clone();
    plain.config["use_routing_bias"] = serde_json::json!(false);
    plain
        .tensors
        .remove("model.layers.0.block_sparse_moe.e_score_correction_bias");
    let (ckpt, t) = open(&plain, "family-minimax-plain");
    assert!(!ckpt.spec().routing.has_correction_bias);
    assert!(t.router.correction_bias.is_none());
    let zeros = [0f32; E];
    let routing = Routing::BiasedSigmoid {
        bias: &zeros,
        scale: 1.0,
    };
    assert_block_matches(&ckpt, &t, &experts, &routing, 67);
}

/// Kimi-K2 is DeepSeek-V3 with one expert group and a scaling factor of 2.827: the biased
/// router runs as vLLM labels it (DeepSeekV3, one group kept), not as an ungrouped router
/// that no kernel accepts at a factor other than 1.
#[test]
fn kimi_k2_routes_with_one_group_and_its_scaling_factor() {
    let (mut ck, experts) = Ckpt::build("deepseek_v3", Fmt::Float, 68);
    ck.config["model_type"] = serde_json::json!("kimi_k2");
    ck.config["n_group"] = serde_json::json!(1);
    ck.config["topk_group"] = serde_json::json!(1);
    ck.config["routed_scaling_factor"] = serde_json::json!(2.827);
    let (ckpt, t) = open(&ck, "family-kimi");
    assert_eq!(ckpt.spec().family, ModelFamily::DeepseekV3);
    let bias = t.router.correction_bias.clone().unwrap();
    let routing = Routing::BiasedSigmoid {
        bias: &bias,
        scale: f64::from(2.827f32),
    };
    assert_block_matches(&ckpt, &t, &experts, &routing, 69);
}

/// Every family's names hold quantized experts too: GPTQ and pack-quantized codes and scales
/// read back as written, the shared expert included; a missing correction bias is named.
#[test]
fn quantized_experts_and_biases_are_found_under_each_family_s_names() {
    for model_type in [
        "glm4_moe",
        "qwen3_next",
        "minimax_m2",
        "llama4_text",
        "ernie4_5_moe",
    ] {
        for fmt in [Fmt::Gptq, Fmt::PackQuantized] {
            let (ck, experts) = Ckpt::build(model_type, fmt, 70);
            let (_, t) = open(&ck, &format!("family-{model_type}-{fmt:?}"));
            let StoredExperts::Int(q) = &t.experts.weights else {
                panic!("{model_type} {fmt:?}: {:?}", t.experts.weights)
            };
            let w13: Vec<i8> = experts
                .iter()
                .flat_map(|[g, u, _]| g.codes.iter().chain(&u.codes).copied())
                .collect();
            let w2: Vec<i8> = experts
                .iter()
                .flat_map(|[_, _, d]| d.codes.clone())
                .collect();
            assert_eq!(q.w13, w13, "{model_type} {fmt:?}");
            assert_eq!(q.w2, w2, "{model_type} {fmt:?}");
            let want_shared = model_type != "minimax_m2";
            assert_eq!(t.shared.is_some(), want_shared, "{model_type} {fmt:?}");
        }
    }
    for (model_type, bias) in [
        (
            "glm4_moe",
            "model.layers.0.mlp.gate.e_score_correction_bias",
        ),
        (
            "minimax_m2",
            "model.layers.0.block_sparse_moe.e_score_correction_bias",
        ),
        (
            "ernie4_5_moe",
            "model.layers.0.mlp.moe_statics.e_score_correction_bias",
        ),
    ] {
        let (mut ck, _) = Ckpt::build(model_type, Fmt::Float, 71);
        ck.tensors.remove(bias);
        let dir = temp_dir(&format!("family-{model_type}-nobias"));
        ck.write(&dir);
        let err = Checkpoint::open(&dir, ShardAccess::Read)
            .unwrap()
            .read_layer(0, &ReadOptions::single_rank())
            .unwrap_err();
        assert!(
            matches!(&err, moe_layer::LayerError::MissingTensor { tensor, .. } if tensor == bias),
            "{model_type}: {err:?}"
        );
    }
}

/// The configs' defaults and spellings: GLM's dense layers below `first_k_dense_replace` (1
/// when unstated) and its one shared expert when `n_shared_experts` is unstated; Qwen3-Next's
/// `mlp_only_layers`; families found by `architectures` alone.
#[test]
fn new_family_configs_are_normalized() {
    let path = std::path::Path::new("config.json");
    let spec = |v: serde_json::Value| {
        moe_layer::checkpoint::MoeModelSpec::from_json_str(path, &v.to_string()).unwrap()
    };
    let glm = spec(
        serde_json::json!({"model_type": "glm4_moe", "hidden_size": 64,
        "num_hidden_layers": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32}),
    );
    assert_eq!(glm.moe_layers, [1, 2, 3]);
    assert_eq!(glm.shared_experts.unwrap().intermediate, 32);
    assert_eq!(glm.routing.routed_scaling_factor, 1.0);
    assert_eq!(
        (glm.routing.num_expert_group, glm.routing.topk_group),
        (Some(1), Some(1))
    );
    let next = spec(
        serde_json::json!({"architectures": ["Qwen3NextForCausalLM"],
        "hidden_size": 64, "num_hidden_layers": 3, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "mlp_only_layers": [1], "norm_topk_prob": false}),
    );
    assert_eq!(next.family, ModelFamily::Qwen3Next);
    assert_eq!(next.moe_layers, [0, 2]);
    assert!(!next.routing.renormalize);
    assert!(next.shared_experts.is_none());
    let minimax = spec(
        serde_json::json!({"architectures": ["MiniMaxM2ForCausalLM"],
        "hidden_size": 64, "num_hidden_layers": 2, "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 32, "routed_scaling_factor": 3.0}),
    );
    assert_eq!(minimax.family, ModelFamily::MiniMaxM2);
    assert_eq!(minimax.routing.scoring, ScoringFunc::Sigmoid);
    assert!(!minimax.routing.has_correction_bias);
    assert_eq!(minimax.routing.routed_scaling_factor, 1.0);
    let missing = serde_json::json!({"model_type": "minimax_m2", "hidden_size": 64,
        "num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2,
        "intermediate_size": 32});
    assert!(matches!(
        moe_layer::checkpoint::MoeModelSpec::from_json_str(path, &missing.to_string()),
        Err(moe_layer::LayerError::ConfigField {
            field: "num_local_experts",
            ..
        })
    ));
}

/// Llama 4: the top logit's sigmoid scales the token before its expert, the shared expert is
/// added ungated; the per-expert layout of quantized checkpoints, the fused and transposed
/// bf16 layout, and the multimodal wrapper's config and `language_model.` names all load into
/// the same layer, and tensor-parallel ranks of the fused layout sum to it.
#[test]
fn llama4_routes_on_the_token_and_reads_fused_transposed_experts() {
    let (ck, experts) = Ckpt::build("llama4_text", Fmt::Float, 72);
    let (ckpt, t) = open(&ck, "family-llama4");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::Llama4);
    assert!(spec.routing.llama4);
    assert!(!spec.routing.renormalize);
    assert_eq!(spec.top_k, 1);
    let shared = spec.shared_experts.unwrap();
    assert_eq!((shared.intermediate, shared.gated), (I, false));
    assert_block_matches(&ckpt, &t, &experts, &Routing::SigmoidOnInput, 73);

    let fused = ck.fused_llama4_experts();
    let multimodal = fused.llama4_multimodal();
    let (x, logits) = random_tokens(74, 9);
    let run = |layer: &MoeLayer| output(layer, &x, &logits);
    let want = run(&MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap());
    for (tag, variant) in [("fused", &fused), ("multimodal", &multimodal)] {
        let (ckpt_v, t_v) = open(variant, &format!("family-llama4-{tag}"));
        assert_eq!(t_v.experts, t.experts, "{tag}");
        assert_eq!(ckpt_v.spec().moe_layers, [0], "{tag}");
        let layer = MoeLayer::from_checkpoint(&ckpt_v, 0, 16).unwrap();
        assert_eq!(run(&layer), want, "{tag}");
    }
    let (ckpt_m, _) = open(&multimodal, "family-llama4-ranks");
    let mut sum = vec![0f32; x.len()];
    for rank in 0..2 {
        let layer = MoeLayer::from_checkpoint_ranked(&ckpt_m, 0, 16, (rank, 2), None).unwrap();
        for (s, v) in sum.iter_mut().zip(run(&layer)) {
            *s += v;
        }
    }
    let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    let err = rel_l2(&sum, &want64);
    assert!(err < 1e-6, "tensor-parallel ranks: relative L2 {err:e}");

    // A fused tensor that disagrees with the config is named, with the field it contradicts.
    let mut bad = fused.clone();
    let t = bad
        .tensors
        .remove("model.layers.0.feed_forward.experts.down_proj")
        .unwrap();
    bad.put(
        "model.layers.0.feed_forward.experts.down_proj",
        t.dtype,
        &[E, I + 1, H],
        vec![0; E * (I + 1) * H * 2],
    );
    let dir = temp_dir("family-llama4-bad");
    bad.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .unwrap()
        .read_layer(0, &ReadOptions::single_rank())
        .unwrap_err();
    assert!(
        matches!(&err, moe_layer::LayerError::ConfigMismatch { tensor, field, .. }
            if tensor.ends_with("experts.down_proj") && *field == "intermediate_size"),
        "{err:?}"
    );
}

/// Qwen3-VL-MoE's language model is Qwen3-MoE's: the multimodal wrapper's `text_config`, the
/// `model.language_model.` names and the fused bf16 experts load into the layer a plain
/// Qwen3-MoE checkpoint of the same weights loads into, bit for bit.
#[test]
fn qwen3_vl_moe_reads_its_wrapped_config_and_fused_experts() {
    let (ck, _) = Ckpt::build("qwen3_moe", Fmt::Float, 75);
    let mut vl = ck.fused_experts("model.layers.0.mlp.experts");
    let mut text = ck.config.clone();
    text["model_type"] = serde_json::json!("qwen3_vl_moe_text");
    vl.config = serde_json::json!({
        "model_type": "qwen3_vl_moe",
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"depth": 2},
    });
    vl.tensors = vl
        .tensors
        .into_iter()
        .map(|(name, t)| {
            (
                name.replace("model.layers.", "model.language_model.layers."),
                t,
            )
        })
        .collect();
    let (plain, t_plain) = open(&ck, "family-qwen3");
    let (ckpt, t) = open(&vl, "family-qwen3-vl");
    assert_eq!(ckpt.spec().family, ModelFamily::Qwen3VlMoe);
    assert!(ckpt.spec().routing.renormalize);
    assert_eq!(t.experts, t_plain.experts);
    let (x, logits) = random_tokens(76, 6);
    let run = |ckpt: &Checkpoint| {
        output(
            &MoeLayer::from_checkpoint(ckpt, 0, 16).unwrap(),
            &x,
            &logits,
        )
    };
    assert_eq!(run(&ckpt), run(&plain));
}

/// gpt-oss in bf16: the experts fused with K leading and gate/up columns interleaved, with
/// their biases, load onto the unquantized kernel (SwiGLU-OAI on interleaved rows) and compute
/// the MoE block of the same weights as the MXFP4 checkpoint they were dequantized from, on
/// one rank and on two tensor-parallel ranks.
#[test]
fn gpt_oss_bf16_runs_the_block_of_its_mxfp4_weights() {
    let m = moe_testutil::gpt_oss::GptOss::random(0x6b7, [4, 2, 64, 64], 7.0);
    let dir = temp_dir("family-gpt-oss-bf16");
    moe_testutil::gpt_oss::GptOss::write_with(&m.bf16_config(), &m.bf16_tensors(), &dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let mut rng = SplitMix64::new(0x6b8);
    let tokens = 5;
    let x = rng.vec_uniform(tokens * m.h, -1.0, 1.0);
    let (ids, weights) = m.route(&x);
    let want = m.forward(&x, &ids, &weights);
    let run = |layer: &MoeLayer| {
        let logits = layer.router_logits(&x).unwrap();
        let mut out = vec![0f32; x.len()];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        out
    };
    let whole = MoeLayer::from_checkpoint(&ckpt, 0, 8).unwrap();
    let info = whole.backend().unwrap();
    assert!(info.kernel.starts_with("cpu-unquantized"), "{info:?}");
    let out = run(&whole);
    let err = rel_l2(&out, &want);
    assert!(err < 1e-5, "one rank: relative L2 {err:e}");
    let mut sum = vec![0f32; x.len()];
    for rank in 0..2 {
        let layer = MoeLayer::from_checkpoint_ranked(&ckpt, 0, 8, (rank, 2), None).unwrap();
        for (s, v) in sum.iter_mut().zip(run(&layer)) {
            *s += v;
        }
    }
    let err = rel_l2(&sum, &want);
    assert!(err < 1e-5, "two tensor-parallel ranks: relative L2 {err:e}");
}

/// A Qwen3-Next float checkpoint from [`Ckpt::build`] rewritten as Granite MoE stores it: the
/// experts fused per layer (`input_linear` `[E, 2I, H]`, gate rows then up rows;
/// `output_linear` `[E, H, I]`), the router under `router.layer`, and the shared expert as an
/// ungated `shared_mlp` with gate and up fused (dropped when `shared` is false).
fn granite_from(ck: &Ckpt, shared: bool) -> Ckpt {
    let mut g = ck.clone();
    let take = |g: &mut Ckpt, name: &str| g.tensors.remove(name).unwrap().bytes;
    let fuse = |g: &mut Ckpt, prefix: &str| {
        let mut w13 = take(g, &format!("{prefix}.gate_proj.weight"));
        w13.extend(take(g, &format!("{prefix}.up_proj.weight")));
        (w13, take(g, &format!("{prefix}.down_proj.weight")))
    };
    let bf16 = safetensors::Dtype::BF16;
    let (mut input, mut output) = (Vec::new(), Vec::new());
    for e in 0..E {
        let (w13, w2) = fuse(&mut g, &format!("model.layers.0.mlp.experts.{e}"));
        input.extend(w13);
        output.extend(w2);
    }
    let block = "model.layers.0.block_sparse_moe";
    g.put(
        &format!("{block}.input_linear.weight"),
        bf16,
        &[E, 2 * I, H],
        input,
    );
    g.put(
        &format!("{block}.output_linear.weight"),
        bf16,
        &[E, H, I],
        output,
    );
    let router = take(&mut g, "model.layers.0.mlp.gate.weight");
    g.put(
        &format!("{block}.router.layer.weight"),
        bf16,
        &[E, H],
        router,
    );
    let (w13, w2) = fuse(&mut g, "model.layers.0.mlp.shared_expert");
    g.tensors
        .remove("model.layers.0.mlp.shared_expert_gate.weight");
    let mut config = serde_json::json!({
        "model_type": "granitemoe", "architectures": ["GraniteMoeForCausalLM"],
        "torch_dtype": "bfloat16", "hidden_act": "silu", "hidden_size": H,
        "num_hidden_layers": 1, "num_local_experts": E, "num_experts_per_tok": 2,
        "intermediate_size": I,
    });
    if shared {
        config["model_type"] = "granitemoeshared".into();
        config["shared_intermediate_size"] = I.into();
        let mlp = "model.layers.0.shared_mlp";
        g.put(
            &format!("{mlp}.input_linear.weight"),
            bf16,
            &[2 * I, H],
            w13,
        );
        g.put(&format!("{mlp}.output_linear.weight"), bf16, &[H, I], w2);
    }
    g.config = config;
    g
}

/// Granite MoE (and its shared-MLP variants): the fused `input_linear`/`output_linear`
/// experts, the router under `router.layer` and the ungated shared MLP load into the layer
/// and compute the renormalized-softmax MoE block of their weights; without the shared MLP the
/// layer equals Qwen3-MoE's of the same experts bit for bit, and tensor-parallel ranks sum to
/// the whole.
#[test]
fn granite_moe_reads_its_fused_linears_and_shared_mlp() {
    let (ck, experts) = Ckpt::build("qwen3_next", Fmt::Float, 77);
    let (ckpt, t) = open(&granite_from(&ck, true), "family-granite-shared");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::GraniteMoe);
    assert!(spec.routing.renormalize);
    let shared = spec.shared_experts.unwrap();
    assert_eq!((shared.intermediate, shared.gated), (I, false));
    assert!(t.shared.as_ref().unwrap().gate.is_none());
    assert_block_matches(&ckpt, &t, &experts, &Routing::RenormalizedSoftmax, 78);

    let (plain, _) = open(&granite_from(&ck, false), "family-granite");
    assert!(plain.spec().shared_experts.is_none());
    let mut qwen3 = ck.clone();
    qwen3.config["model_type"] = "qwen3_moe".into();
    qwen3.config["norm_topk_prob"] = true.into();
    qwen3
        .config
        .as_object_mut()
        .unwrap()
        .remove("shared_expert_intermediate_size");
    qwen3
        .tensors
        .retain(|name, _| !name.contains("shared_expert"));
    let (qwen3, _) = open(&qwen3, "family-granite-qwen3");
    let (x, logits) = random_tokens(79, 6);
    let run = |layer: &MoeLayer| output(layer, &x, &logits);
    let want = run(&MoeLayer::from_checkpoint(&qwen3, 0, 16).unwrap());
    assert_eq!(
        run(&MoeLayer::from_checkpoint(&plain, 0, 16).unwrap()),
        want
    );
    let mut sum = vec![0f32; x.len()];
    for rank in 0..2 {
        let layer = MoeLayer::from_checkpoint_ranked(&ckpt, 0, 16, (rank, 2), None).unwrap();
        for (s, v) in sum.iter_mut().zip(run(&layer)) {
            *s += v;
        }
    }
    let whole: Vec<f64> = run(&MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap())
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    let err = rel_l2(&sum, &whole);
    assert!(err < 1e-6, "tensor-parallel ranks: relative L2 {err:e}");
}

/// OLMoE reads Qwen3-MoE's names with the expert size in `intermediate_size`, and routes by the
/// softmax probabilities of its top-k experts without renormalizing them, as vLLM's block does
/// even when the config says `norm_topk_prob: true`.
#[test]
fn olmoe_routes_by_unrenormalized_softmax() {
    let (mut ck, experts) = Ckpt::build("qwen3_moe", Fmt::Float, 80);
    let c = ck.config.as_object_mut().unwrap();
    c.insert("model_type".into(), "olmoe".into());
    let i = c.remove("moe_intermediate_size").unwrap();
    c.insert("intermediate_size".into(), i);
    c.insert("norm_topk_prob".into(), true.into());
    let (ckpt, t) = open(&ck, "family-olmoe");
    assert_eq!(ckpt.spec().family, ModelFamily::Olmoe);
    assert!(!ckpt.spec().routing.renormalize);
    assert_block_matches(&ckpt, &t, &experts, &Routing::Softmax, 81);
}

/// ERNIE-4.5: softmax scores, the `moe_statics` bias (stored `[1, E]`) steering selection only,
/// the unbiased probabilities renormalized; a shared expert; its own field names. vLLM labels
/// this routing `Unspecified`, which the layer's own router computes, so a kernel serves it.
#[test]
fn ernie4_5_moe_routes_by_biased_softmax_and_adds_its_shared_experts() {
    let (ck, experts) = Ckpt::build("ernie4_5_moe", Fmt::Float, 91);
    let (ckpt, t) = open(&ck, "family-ernie");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::Ernie45Moe);
    assert_eq!((spec.num_experts, spec.top_k, spec.intermediate), (E, K, I));
    assert_eq!(spec.routing.scoring, ScoringFunc::Softmax);
    assert!(spec.routing.renormalize);
    assert!(spec.routing.has_correction_bias);
    assert_eq!(spec.routing.num_expert_group, None);
    assert_eq!(spec.moe_layers, [0]);
    let shared = spec.shared_experts.unwrap();
    assert_eq!((shared.intermediate, shared.gated), (I, false));
    let bias = t.router.correction_bias.clone().unwrap();
    assert_block_matches(
        &ckpt,
        &t,
        &experts,
        &Routing::BiasedSoftmax { bias: &bias },
        92,
    );

    // The bias decides: with it negated the block routes differently.
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    let (x, logits) = random_tokens(93, 9);
    let flipped: Vec<f32> = bias.iter().map(|b| -b).collect();
    let want = reference(
        &experts,
        &t,
        &Routing::BiasedSoftmax { bias: &flipped },
        &x,
        &logits,
    );
    assert!(rel_l2(&output(&layer, &x, &logits), &want) > 1e-3);

    // A bias of the wrong shape is named with the tensor.
    let mut wrong = ck.clone();
    let name = "model.layers.0.mlp.moe_statics.e_score_correction_bias";
    let mut stored = wrong.tensors.remove(name).unwrap();
    stored.shape = vec![E];
    wrong.tensors.insert(name.into(), stored);
    let dir = temp_dir("family-ernie-bias-shape");
    wrong.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .unwrap()
        .read_layer(0, &ReadOptions::single_rank())
        .unwrap_err()
        .to_string();
    assert!(err.contains(name), "{err}");
}

/// ERNIE-4.5's config fields: MoE layers from `moe_layer_start_index` (transformers' default
/// is 1) to `moe_layer_end_index` (`-1` is the last), every `moe_layer_interval`; two shared
/// experts when unstated; `use_moe: false`; the VL models' per-modality lists refused.
#[test]
fn ernie4_5_moe_configs_are_normalized() {
    let base = serde_json::json!({
        "model_type": "ernie4_5_moe", "architectures": ["Ernie4_5_MoeForCausalLM"],
        "hidden_size": 64, "num_hidden_layers": 8, "moe_num_experts": 16, "moe_k": 4,
        "moe_intermediate_size": 32, "hidden_act": "silu",
    });
    let spec = |patch: serde_json::Value| {
        let mut c = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        MoeModelSpec::from_json_str(std::path::Path::new("config.json"), &c.to_string())
    };
    let s = spec(serde_json::json!({})).unwrap();
    assert_eq!(s.moe_layers, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(s.shared_experts.unwrap().intermediate, 64);
    assert_eq!(s.top_k, 4);
    let s = spec(
        serde_json::json!({"moe_layer_start_index": 2, "moe_layer_end_index": 6,
        "moe_layer_interval": 2, "moe_num_shared_experts": 0}),
    )
    .unwrap();
    assert_eq!(s.moe_layers, [3, 5]);
    assert!(s.shared_experts.is_none());
    assert!(
        spec(serde_json::json!({"use_moe": false}))
            .unwrap()
            .moe_layers
            .is_empty()
    );
    // Only the architecture names the family.
    let mut by_arch = base.clone();
    by_arch.as_object_mut().unwrap().remove("model_type");
    let s = MoeModelSpec::from_json_str(std::path::Path::new("config.json"), &by_arch.to_string());
    assert_eq!(s.unwrap().family, ModelFamily::Ernie45Moe);
    for (patch, field) in [
        (
            serde_json::json!({"moe_num_experts": [64, 64]}),
            "moe_num_experts",
        ),
        (serde_json::json!({"moe_k": 17}), "moe_k"),
        (
            serde_json::json!({"moe_layer_interval": 0}),
            "moe_layer_interval",
        ),
        (
            serde_json::json!({"moe_layer_end_index": -2}),
            "moe_layer_end_index",
        ),
    ] {
        let err = spec(patch.clone()).unwrap_err().to_string();
        assert!(err.contains(field), "{patch}: {err}");
    }
}

/// PhiMoE (Phi-3.5-MoE): Mixtral's names and fields, routed by the sparse mixer with the
/// config's jitter; a config asking for another top-k or a negative jitter is refused by name.
#[test]
fn phimoe_routes_by_the_sparse_mixer() {
    let (ck, experts) = Ckpt::build("phimoe", Fmt::Float, 95);
    let (ckpt, t) = open(&ck, "family-phimoe");
    let spec = ckpt.spec();
    assert_eq!(spec.family, ModelFamily::PhiMoe);
    assert_eq!(spec.routing.sparse_mixer_jitter, Some(0.3));
    assert!(!spec.routing.renormalize);
    assert!(spec.shared_experts.is_none());
    let routing = Routing::SparseMixer {
        eps: f64::from(0.3f32),
    };
    assert_block_matches(&ckpt, &t, &experts, &routing, 96);
    // Some tokens share their weight with logits inside the band: the mask is exercised.
    let (_, logits) = random_tokens(96, 64);
    let shared = logits
        .chunks(E)
        .filter(|l| {
            let l: Vec<f64> = l.iter().map(|&v| f64::from(v)).collect();
            sparse_mixer(&l, 0.3)[0].1 < 0.999
        })
        .count();
    assert!(shared > 4, "{shared} of 64 tokens");

    let path = std::path::Path::new("config.json");
    for (field, value) in [
        ("num_experts_per_tok", serde_json::json!(3)),
        ("router_jitter_noise", serde_json::json!(-0.01)),
    ] {
        let mut config = ck.config.clone();
        config[field] = value;
        let err = MoeModelSpec::from_json_str(path, &config.to_string()).unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
}
