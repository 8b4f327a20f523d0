//! Synthetic checkpoints of every supported family and storage format load into the same
//! logical codes and scales they were written from: GPTQ, compressed-tensors int-quantized and
//! pack-quantized, float; Qwen3-MoE, Mixtral (both naming conventions), DeepSeek-V3 (correction
//! bias, shared experts); single file and sharded.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Ckpt, E, Fmt, G, H, I, Proj, temp_dir};
use moe_layer::checkpoint::{
    Checkpoint, FloatData, IntExperts, ModelFamily, MoeLayerTensors, MoeModelSpec, QuantScheme,
    ReadOptions, ShardAccess, StoredExperts,
};
use moe_quant::WeightGroups;
use moe_router::ScoringFunc;
use serde_json::json;

fn read(ck: &Ckpt, tag: &str) -> (MoeModelSpec, MoeLayerTensors) {
    let dir = temp_dir(tag);
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let t = ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
    (ckpt.spec().clone(), t)
}

/// The fused `w13` / `w2` codes and scales the projections should produce.
fn fused(experts: &[[Proj; 3]]) -> (Vec<i8>, Vec<f32>, Vec<i8>, Vec<f32>) {
    let (mut w13, mut s13, mut w2, mut s2) = (vec![], vec![], vec![], vec![]);
    for [gate, up, down] in experts {
        w13.extend(&gate.codes);
        w13.extend(&up.codes);
        s13.extend(&gate.scales);
        s13.extend(&up.scales);
        w2.extend(&down.codes);
        s2.extend(&down.scales);
    }
    (w13, s13, w2, s2)
}

fn int(t: &MoeLayerTensors) -> &IntExperts {
    match &t.experts.weights {
        StoredExperts::Int(q) => q,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_quantized_format_decodes_to_the_written_codes_and_scales() {
    for fmt in [Fmt::IntQuantized, Fmt::PackQuantized, Fmt::Gptq] {
        let (ck, experts) = Ckpt::build("qwen3_moe", fmt, 11);
        let (spec, t) = read(&ck, &format!("fmt-{fmt:?}"));
        assert_eq!(spec.family, ModelFamily::Qwen3Moe);
        let q = int(&t);
        let (w13, s13, w2, s2) = fused(&experts);
        assert_eq!(q.bits, 4);
        assert_eq!(q.group_size.group_size(), Some(G));
        assert_eq!(q.w13, w13, "{fmt:?} w13");
        assert_eq!(q.w2, w2, "{fmt:?} w2");
        assert_eq!(q.w13_scales, s13, "{fmt:?} w13 scales");
        assert_eq!(q.w2_scales, s2, "{fmt:?} w2 scales");
        assert!(q.act_order.is_none());
    }
}

#[test]
fn gptq_act_order_returns_group_indices_and_checks_them() {
    let (mut ck, experts) = Ckpt::build("qwen3_moe", Fmt::Gptq, 12);
    ck.config["quantization_config"]["desc_act"] = json!(true);
    // A permuted (act-order) g_idx for gate and up: the two groups of H interleaved.
    let perm: Vec<i32> = (0..H).map(|k| (k % (H / G)) as i32).collect();
    for e in 0..E {
        for p in ["gate_proj", "up_proj"] {
            ck.put(
                &format!("model.layers.0.mlp.experts.{e}.{p}.g_idx"),
                safetensors::Dtype::I32,
                &[H],
                checkpoint_support::i32_bytes(&perm),
            );
        }
    }
    let (spec, t) = read(&ck, "gptq-actorder");
    assert!(spec.quant.has_act_order());
    let q = int(&t);
    let ao = q.act_order.as_ref().unwrap();
    assert_eq!(ao.w13_g_idx, perm.repeat(E));
    let i_idx: Vec<i32> = (0..I).map(|k| (k / G) as i32).collect();
    assert_eq!(ao.w2_g_idx, i_idx.repeat(E));
    assert_eq!(q.w13, fused(&experts).0);

    // Gate and up must agree; entries must be group indices.
    let mut bad = ck.clone();
    let mut up = perm.clone();
    up.swap(0, 1);
    bad.put(
        "model.layers.0.mlp.experts.2.up_proj.g_idx",
        safetensors::Dtype::I32,
        &[H],
        checkpoint_support::i32_bytes(&up),
    );
    let dir = temp_dir("gptq-actorder-bad");
    bad.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .unwrap()
        .read_layer(0, &ReadOptions::single_rank())
        .unwrap_err();
    assert!(
        matches!(&err, moe_layer::LayerError::BadGroupIndex { tensor, .. }
            if tensor == "model.layers.0.mlp.experts.2.up_proj.g_idx"),
        "{err:?}"
    );
    let mut bad = ck.clone();
    let mut out_of_range = perm.clone();
    out_of_range[3] = (H / G) as i32;
    bad.put(
        "model.layers.0.mlp.experts.0.gate_proj.g_idx",
        safetensors::Dtype::I32,
        &[H],
        checkpoint_support::i32_bytes(&out_of_range),
    );
    let dir = temp_dir("gptq-actorder-range");
    bad.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .unwrap()
        .read_layer(0, &ReadOptions::single_rank())
        .unwrap_err();
    assert!(
        matches!(err, moe_layer::LayerError::BadGroupIndex { .. }),
        "{err:?}"
    );
}

#[test]
fn mixtral_accepts_both_naming_conventions() {
    let (ck, experts) = Ckpt::build("mixtral", Fmt::IntQuantized, 13);
    let (spec, legacy) = read(&ck, "mixtral-w1w3w2");
    assert_eq!(spec.family, ModelFamily::Mixtral);
    assert!(spec.routing.renormalize);
    assert_eq!(int(&legacy).w13, fused(&experts).0);
    // Rename w1/w3/w2 to gate_proj/up_proj/down_proj.
    let mut renamed = ck.clone();
    renamed.tensors = ck
        .tensors
        .iter()
        .map(|(n, s)| {
            let n = n
                .replace(".w1.", ".gate_proj.")
                .replace(".w3.", ".up_proj.")
                .replace(".w2.", ".down_proj.");
            (n, s.clone())
        })
        .collect();
    let (_, current) = read(&renamed, "mixtral-hf");
    assert_eq!(legacy, current);
}

#[test]
fn float_checkpoints_keep_their_dtype_and_fuse_gate_then_up() {
    let (ck, experts) = Ckpt::build("qwen3_moe", Fmt::Float, 14);
    let (spec, t) = read(&ck, "float");
    assert_eq!(
        spec.quant,
        QuantScheme::Unquantized(Some(moe_quant::DType::BF16))
    );
    let StoredExperts::Float { w13, w2 } = &t.experts.weights else {
        panic!("{:?}", t.experts.weights)
    };
    let (FloatData::BF16(w13), FloatData::BF16(w2)) = (w13, w2) else {
        panic!("not bf16")
    };
    let deq = |p: &Proj| -> Vec<f32> {
        (0..p.n * p.k)
            .map(|i| half::bf16::from_f32(f32::from(p.codes[i]) * p.scales[i / G]).to_f32())
            .collect()
    };
    let mut want13 = vec![];
    let mut want2 = vec![];
    for [g, u, d] in &experts {
        want13.extend(deq(g));
        want13.extend(deq(u));
        want2.extend(deq(d));
    }
    assert_eq!(w13.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), want13);
    assert_eq!(w2.iter().map(|x| x.to_f32()).collect::<Vec<_>>(), want2);
}

#[test]
fn deepseek_v3_reads_routing_bias_and_shared_experts() {
    let (ck, experts) = Ckpt::build("deepseek_v3", Fmt::PackQuantized, 15);
    let (spec, t) = read(&ck, "deepseek");
    assert_eq!(spec.family, ModelFamily::DeepseekV3);
    assert_eq!(spec.routing.scoring, ScoringFunc::Sigmoid);
    assert!(spec.routing.renormalize);
    assert!(spec.routing.has_correction_bias);
    assert_eq!(spec.routing.num_expert_group, Some(2));
    assert_eq!(spec.routing.topk_group, Some(1));
    assert_eq!(spec.routing.routed_scaling_factor, 2.5);
    assert_eq!(spec.shared_experts.unwrap().intermediate, I);
    assert_eq!(int(&t).w13, fused(&experts).0);
    assert_eq!(t.router.correction_bias.as_ref().unwrap().len(), E);
    let shared = t.shared.as_ref().unwrap();
    assert_eq!(shared.mlp.num_experts, 1);
    assert!(shared.gate.is_none());
    assert!(matches!(shared.mlp.weights, StoredExperts::Int(_)));

    // Without the bias tensor the layer does not load.
    let mut no_bias = ck.clone();
    no_bias
        .tensors
        .remove("model.layers.0.mlp.gate.e_score_correction_bias");
    let dir = temp_dir("deepseek-nobias");
    no_bias.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .unwrap()
        .read_layer(0, &ReadOptions::single_rank())
        .unwrap_err();
    assert!(
        matches!(err, moe_layer::LayerError::MissingTensor { .. }),
        "{err:?}"
    );
}

#[test]
fn sharded_and_single_file_checkpoints_read_alike() {
    let (ck, _) = Ckpt::build("qwen3_moe", Fmt::PackQuantized, 16);
    let (_, single) = read(&ck, "single");
    let dir = temp_dir("sharded");
    ck.write_sharded(&dir, 3);
    for access in [ShardAccess::Read, ShardAccess::Mmap] {
        let ckpt = Checkpoint::open(&dir, access).unwrap();
        assert_eq!(
            ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap(),
            single
        );
    }
}

#[test]
fn config_normalization_per_family() {
    let path = std::path::Path::new("config.json");
    let qwen2 = json!({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 4,
        "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 128, "decoder_sparse_step": 2, "mlp_only_layers": [3],
        "torch_dtype": "bfloat16"});
    let s = MoeModelSpec::from_json_str(path, &qwen2.to_string()).unwrap();
    assert_eq!(s.moe_layers, [1]);
    assert!(!s.routing.renormalize);
    assert_eq!(s.shared_experts.unwrap().intermediate, 128);
    assert!(s.shared_experts.unwrap().gated);

    let v2 = json!({"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 6,
        "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 32,
        "first_k_dense_replace": 1, "moe_layer_freq": 2, "n_shared_experts": 2,
        "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
        "routed_scaling_factor": 16.0});
    let s = MoeModelSpec::from_json_str(path, &v2.to_string()).unwrap();
    assert_eq!(s.moe_layers, [2, 4]);
    assert_eq!(s.routing.scoring, ScoringFunc::Softmax);
    assert!(!s.routing.has_correction_bias);
    assert_eq!(s.routing.routed_scaling_factor, 16.0);
    assert_eq!(s.shared_experts.unwrap().intermediate, 64);

    let bad_groups = json!({"model_type": "deepseek_v3", "hidden_size": 64,
        "num_hidden_layers": 1, "n_routed_experts": 10, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "n_group": 4});
    assert!(matches!(
        MoeModelSpec::from_json_str(path, &bad_groups.to_string()),
        Err(moe_layer::LayerError::ConfigField {
            field: "n_group",
            ..
        })
    ));

    // A GPTQ model with its settings in quantize_config.json.
    let (mut ck, _) = Ckpt::build("qwen3_moe", Fmt::Gptq, 17);
    let qc = ck
        .config
        .as_object_mut()
        .unwrap()
        .remove("quantization_config")
        .unwrap();
    let dir = temp_dir("quantize-config");
    ck.write(&dir);
    let mut side = qc.clone();
    side.as_object_mut().unwrap().remove("quant_method");
    std::fs::write(dir.join("quantize_config.json"), side.to_string()).unwrap();
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    assert!(matches!(
        ckpt.spec().quant,
        QuantScheme::Gptq {
            bits: 4,
            group_size: WeightGroups::Groups(g),
            ..
        } if g.get() == 8
    ));
    ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
}
