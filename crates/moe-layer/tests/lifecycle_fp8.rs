//! FP8 checkpoints written by the test load onto the native WNA16 kernels and compute the MoE
//! block of their exactly dequantized weights: `quant_method: fp8` with `[128, 128]` blocks
//! (DeepSeek-V3, Qwen3 `-FP8`) or per-tensor scales and static activations (AutoFP8's Mixtral),
//! and compressed-tensors `float-quantized` with channel (bf16 `[n, 1]`), tensor and block
//! scales; e4m3 weights with subnormals and signed zeros, H and I not multiples of 128. The
//! layer's f32 output is compared with an f64 evaluation of the same routing, gated SiLU MLPs,
//! shared expert and weighted sum (relative L2 below 1e-5; 1e-2 where the CPU's bf16 path takes
//! the GEMMs with many rows per expert, which round activations and scaled weights to bf16).
//! Tensor- and expert-parallel ranks sum to the whole layer; the configs' block size,
//! activation scheme, strategy and format are checked, and the name-based road refuses FP8
//! layers.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Fp8Proj, Fp8Store, fp8, fp8_block, matvec, rel_l2, temp_dir};
use moe_layer::checkpoint::{Checkpoint, Fp8Source, QuantScheme, ShardAccess};
use moe_layer::{
    ExpertShard, Fp8Scaling, LayerError, LayerQuant, MoeLayer, MoeLayerConfig, TensorData,
    TensorKind, TensorView,
};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use serde_json::json;

/// One gated SiLU MLP in f64.
fn mlp(p: &[Fp8Proj; 3], x: &[f64]) -> Vec<f64> {
    let [gate, up, down] = p;
    let g = matvec(&gate.dequantized(), gate.n, gate.k, x);
    let u = matvec(&up.dequantized(), up.n, up.k, x);
    let a: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect();
    matvec(&down.dequantized(), down.n, down.k, &a)
}

/// The MoE block in f64 on the layer's own routing (the weight scaling the token before its
/// expert when the router says so, as Llama 4's does); `experts[E]`, when present, is the
/// shared MLP, added to every token.
fn reference(
    layer: &MoeLayer,
    experts: &[[Fp8Proj; 3]],
    (e, top_k, h): (usize, usize, usize),
    x: &[f32],
    logits: &[f32],
) -> Vec<f64> {
    let t = x.len() / h;
    let mut ids = vec![0i32; t * top_k];
    let mut weights = vec![0f32; t * top_k];
    layer
        .route(Logits::F32(logits), &mut ids, &mut weights)
        .unwrap();
    let mut out = vec![0f64; t * h];
    for tok in 0..t {
        let xt: Vec<f64> = x[tok * h..][..h].iter().map(|&v| f64::from(v)).collect();
        let o = &mut out[tok * h..][..h];
        for j in 0..top_k {
            let w = weights[tok * top_k + j];
            let expert = &experts[ids[tok * top_k + j] as usize];
            let on_input = layer.config().router.routing_method_type()
                == moe_router::RoutingMethodType::Llama4;
            let (y, w) = if on_input {
                let xw: Vec<f64> = x[tok * h..][..h]
                    .iter()
                    .map(|&v| f64::from(v * w))
                    .collect();
                (mlp(expert, &xw), 1.0)
            } else {
                (mlp(expert, &xt), f64::from(w))
            };
            for (o, v) in o.iter_mut().zip(&y) {
                *o += w * v;
            }
        }
        if let Some(shared) = experts.get(e) {
            for (o, v) in o.iter_mut().zip(mlp(shared, &xt)) {
                *o += v;
            }
        }
    }
    out
}

/// Writes, loads and runs one checkpoint at 1, 5, 16 and 64 tokens against the f64 reference.
fn check(model_type: &str, dims: [usize; 4], seed: u64, store: Fp8Store) {
    let [e, top_k, h, _] = dims;
    let (ck, experts) = fp8(model_type, dims, seed, store);
    // The written codes hold subnormals and both zeros, which the decoders must get right.
    let codes = &experts[0][0].codes;
    assert!(codes.iter().any(|&b| b & 0x78 == 0 && b & 7 != 0));
    assert!(codes.contains(&0x80) && codes.contains(&0));
    let dir = temp_dir(&format!("fp8-{model_type}-{store:?}"));
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
    let scaling = match store.scaling() {
        checkpoint_support::Fp8Scaling::Blocks => Fp8Scaling::Blocks,
        checkpoint_support::Fp8Scaling::Channels => Fp8Scaling::Channels,
        checkpoint_support::Fp8Scaling::Tensor => Fp8Scaling::Tensor,
    };
    let QuantScheme::Fp8 {
        scaling: read,
        source,
        static_activations,
        ref ignored,
    } = ckpt.spec().quant
    else {
        panic!("{store:?}: {:?}", ckpt.spec().quant);
    };
    assert_eq!(read, scaling);
    let ct = matches!(
        store,
        Fp8Store::CtBlocks | Fp8Store::CtChannels | Fp8Store::CtTensor
    );
    assert_eq!(source == Fp8Source::CompressedTensors, ct, "{store:?}");
    assert_eq!(
        static_activations,
        matches!(store, Fp8Store::TensorStatic | Fp8Store::CtTensor)
    );
    assert_eq!(ignored[0], "lm_head");
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 64).unwrap();
    assert_eq!(layer.config().quant, LayerQuant::Fp8 { scaling });
    let info = layer.backend().unwrap();
    assert!(info.kernel.starts_with("cpu-wna16/"), "{info:?}");
    // From the bf16 path's row threshold on (where the CPU has one), an expert's GEMMs round
    // the activations and the scaled e4m3 weights to bf16 (relative 2^-8 at most each, in both
    // GEMMs); below it they compute in f32. Random e4m3 codes span 2^-9..448, so a few large
    // terms dominate each sum and their roundings average out less than with int4 codes:
    // 1.0e-3 to 4.4e-3 measured at 16 and 64 tokens, hence a bound of 1e-2 rather than the
    // 5e-3 of the int4 layers. 64 tokens give every expert enough rows.
    let bf16_path = info
        .ops
        .iter()
        .any(|op| op.starts_with("wna16_gemm") && op.contains("fp8"));
    let mut rng = SplitMix64::new(seed + 1);
    for t in [1, 5, 16, 64] {
        let x = rng.vec_uniform(t * h, -2.0, 2.0);
        let logits = rng.vec_uniform(t * e, -1.0, 1.0);
        let mut out = vec![0f32; t * h];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        let want = reference(&layer, &experts, (e, top_k, h), &x, &logits);
        let rel = rel_l2(&out, &want);
        let tol = if bf16_path { 1e-2 } else { 1e-5 };
        assert!(
            rel < tol,
            "{model_type} {store:?} t={t}: rel L2 {rel} (tolerance {tol:e})"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen3-shaped: H = 160 (a whole block and a short one), I = 72 (one short block).
#[test]
fn qwen3_fp8_blocks_match_the_dequantized_reference() {
    check("qwen3_moe", [4, 2, 160, 72], 31, Fp8Store::Blocks);
}

/// DeepSeek-V3-shaped, with its shared expert and grouped, biased routing.
#[test]
fn deepseek_v3_fp8_blocks_with_a_shared_expert_match_the_reference() {
    check("deepseek_v3", [4, 2, 136, 200], 37, Fp8Store::Blocks);
}

/// GLM-4.5-Air-FP8 and MiniMax-M2 ship block-scaled FP8 experts: GLM with its shared expert
/// and a correction bias under the gate, MiniMax-M2 with `w1`/`w3`/`w2` experts and its bias
/// on the block.
#[test]
fn glm4_moe_and_minimax_m2_fp8_blocks_match_the_reference() {
    check("glm4_moe", [4, 2, 136, 200], 79, Fp8Store::Blocks);
    check("minimax_m2", [4, 2, 160, 72], 83, Fp8Store::Blocks);
}

/// Llama 4's FP8 checkpoints (compressed-tensors channel scales, experts one by one, the
/// shared expert quantized too) route top-1 with the sigmoid weight on the token.
#[test]
fn llama4_fp8_channel_scales_match_the_reference() {
    check("llama4_text", [4, 1, 160, 72], 89, Fp8Store::CtChannels);
}

/// AutoFP8's Mixtral: one scale per projection (gate and up keep their own), static
/// activation scales that are not applied.
#[test]
fn mixtral_fp8_tensor_scales_with_static_activations_match_the_reference() {
    check("mixtral", [4, 2, 136, 72], 61, Fp8Store::TensorStatic);
}

/// compressed-tensors `float-quantized`: bf16 channel scales `[n, 1]` (`FP8_DYNAMIC`), tensor
/// scales `[1]` with static activations (`FP8`), and blocks (`FP8_BLOCK`, with DeepSeek-V3's
/// shared expert).
#[test]
fn compressed_tensors_fp8_channel_tensor_and_block_scales_match_the_reference() {
    check("qwen3_moe", [4, 2, 160, 72], 67, Fp8Store::CtChannels);
    check("qwen3_moe", [4, 2, 136, 200], 71, Fp8Store::CtTensor);
    check("deepseek_v3", [4, 2, 136, 200], 73, Fp8Store::CtBlocks);
}

/// Tensor-parallel ranks (I split on a block boundary for block scales, anywhere for channel
/// and tensor scales) and expert-parallel ranks each compute their part; the parts sum to the
/// single-rank layer.
#[test]
fn parallel_ranks_sum_to_the_whole_layer() {
    for (store, i) in [
        (Fp8Store::Blocks, 256),
        (Fp8Store::CtChannels, 72),
        (Fp8Store::TensorStatic, 72),
    ] {
        ranks_sum_to_the_whole(store, i);
    }
}

fn ranks_sum_to_the_whole(store: Fp8Store, i: usize) {
    let (e, h) = (4, 136);
    let (ck, _) = fp8("qwen3_moe", [e, 2, h, i], 41, store);
    let dir = temp_dir(&format!("fp8-ranks-{store:?}"));
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let whole = MoeLayer::from_checkpoint(&ckpt, 0, 8).unwrap();
    let mut rng = SplitMix64::new(43);
    let t = 6;
    let x = rng.vec_uniform(t * h, -2.0, 2.0);
    let logits = rng.vec_uniform(t * e, -1.0, 1.0);
    let run = |layer: &MoeLayer| {
        let mut out = vec![0f32; t * h];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        out
    };
    let want: Vec<f64> = run(&whole).iter().map(|&v| f64::from(v)).collect();
    let maps = [vec![0, -1, 1, -1], vec![-1, 0, -1, 1]];
    for (what, ranks) in [
        (
            "tp",
            (0..2)
                .map(|r| MoeLayer::from_checkpoint_ranked(&ckpt, 0, 8, (r, 2), None).unwrap())
                .collect::<Vec<_>>(),
        ),
        (
            "ep",
            maps.iter()
                .map(|m| MoeLayer::from_checkpoint_ranked(&ckpt, 0, 8, (0, 1), Some(m.clone())))
                .collect::<Result<Vec<_>, _>>()
                .unwrap(),
        ),
    ] {
        let mut sum = vec![0f32; t * h];
        for layer in &ranks {
            for (s, v) in sum.iter_mut().zip(run(layer)) {
                *s += v;
            }
        }
        let rel = rel_l2(&sum, &want);
        assert!(rel < 1e-5, "{store:?} {what}: rel L2 {rel}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tensor-parallel slice of I that would split scale blocks is refused by name; so is every
/// name-based road into an FP8 layer.
#[test]
fn unaligned_slices_and_name_based_loads_are_refused() {
    let (ck, _) = fp8_block("qwen3_moe", [4, 2, 136, 72], 47);
    let dir = temp_dir("fp8-refusals");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let e = MoeLayer::from_checkpoint_ranked(&ckpt, 0, 8, (1, 2), None).unwrap_err();
    assert!(
        matches!(e, LayerError::TensorParallel { ref reason, .. } if reason.contains("block")),
        "{e}"
    );
    let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 8).unwrap();
    let mut layer = MoeLayer::create(cfg.clone()).unwrap();
    let codes = vec![0i8; 72 * 136];
    let view = TensorView {
        name: "experts.0.w1.weight",
        shape: &[72, 136],
        data: TensorData::I8(&codes),
    };
    let e = layer
        .load_expert_tensor(0, ExpertShard::W1, TensorKind::Weight, &view)
        .unwrap_err();
    assert!(
        matches!(e, LayerError::InvalidArgument { field: "quant", .. }),
        "{e}"
    );
    let mut layer = MoeLayer::create(cfg).unwrap();
    let e = layer.process().unwrap_err();
    assert!(
        matches!(e, LayerError::InvalidArgument { field: "quant", .. }),
        "{e}"
    );
    // FP8 weights run with float activations: int8 ones are refused, naming the setting.
    let int8 = moe_layer::LoadOptions::new()
        .with_wna16_activations(moe_layer::Wna16Activations::DynamicInt8);
    let e = MoeLayer::from_checkpoint_with(&ckpt, 0, 8, &int8).unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::InvalidArgument {
                field: "wna16_activations",
                ..
            }
        ),
        "{e}"
    );
    // A created layer can still be loaded from the checkpoint, which leaves it processed.
    let mut layer =
        MoeLayer::create(MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 8).unwrap()).unwrap();
    layer.load_from_checkpoint(&ckpt, 0).unwrap();
    layer.process().unwrap();
    assert!(layer.is_processed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Parses `store`'s config after `edit` changes its `quantization_config`.
fn parse_edited(
    store: Fp8Store,
    edit: &dyn Fn(&mut serde_json::Value),
) -> Result<moe_layer::checkpoint::MoeModelSpec, LayerError> {
    let (ck, _) = fp8("qwen3_moe", [2, 1, 16, 8], 53, store);
    let mut config = ck.config.clone();
    edit(&mut config["quantization_config"]);
    moe_layer::checkpoint::MoeModelSpec::from_json_str(
        std::path::Path::new("config.json"),
        &config.to_string(),
    )
}

/// An edit of a `quantization_config`.
type ConfigEdit = fn(&mut serde_json::Value);

/// Asserts that `store`'s config edited by each `edit` is refused as an unsupported scheme
/// whose reason contains the paired text.
fn assert_refused(store: Fp8Store, cases: &[(ConfigEdit, &str)]) {
    for (edit, needle) in cases {
        match parse_edited(store, edit) {
            Err(LayerError::UnsupportedScheme { reason, .. }) => {
                assert!(reason.contains(needle), "{store:?} {needle}: {reason}");
            }
            other => panic!("{store:?} {needle}: {other:?}"),
        }
    }
}

/// The fp8 `quantization_config` is read as vLLM and Hugging Face write it: `[128, 128]` blocks
/// with dynamic activations, or no blocks (per-tensor scales) with dynamic or static ones;
/// other blocks, static activations with blocks, and other formats are refused with the
/// reason.
#[test]
fn fp8_configs_are_checked() {
    let spec = parse_edited(Fp8Store::Blocks, &|qc| {
        qc["ignored_layers"] = json!(["model.layers.0.self_attn"]);
    })
    .unwrap();
    assert_eq!(
        spec.quant,
        QuantScheme::Fp8 {
            scaling: Fp8Scaling::Blocks,
            source: Fp8Source::QuantMethodFp8,
            static_activations: false,
            ignored: vec!["model.layers.0.self_attn".into(), "lm_head".into()]
        }
    );
    assert_eq!(spec.quant.name(), "fp8");
    let tensor = |qc: &mut serde_json::Value| {
        qc.as_object_mut().unwrap().remove("weight_block_size");
    };
    for (scheme, static_activations) in [("dynamic", false), ("static", true)] {
        let spec = parse_edited(Fp8Store::Blocks, &|qc| {
            tensor(qc);
            qc["activation_scheme"] = json!(scheme);
        })
        .unwrap();
        assert!(
            matches!(
                spec.quant,
                QuantScheme::Fp8 { scaling: Fp8Scaling::Tensor, static_activations: s, .. }
                    if s == static_activations
            ),
            "{:?}",
            spec.quant
        );
    }
    assert_refused(
        Fp8Store::Blocks,
        &[
            (|qc| qc["weight_block_size"] = json!([64, 64]), "[64,64]"),
            (|qc| qc["activation_scheme"] = json!("static"), "static"),
            (
                |qc| {
                    qc.as_object_mut().unwrap().remove("activation_scheme");
                },
                "absent",
            ),
            (|qc| qc["fmt"] = json!("e5m2"), "e5m2"),
        ],
    );
    assert!(matches!(
        parse_edited(Fp8Store::Blocks, &|qc| qc["ignored_layers"] = json!([1])),
        Err(LayerError::ConfigField {
            field: "ignored_layers",
            ..
        })
    ));
}

/// compressed-tensors `float-quantized` groups (and `naive-quantized` ones of float weights)
/// are read per strategy (tensor, channel, `[128, 128]` block) with float activations absent,
/// dynamic or static; other bit widths, block
/// shapes and strategies, asymmetric or dynamic weight scales, and integer activations are
/// refused with the reason.
#[test]
fn compressed_tensors_fp8_configs_are_checked() {
    for (store, scaling) in [
        (Fp8Store::CtChannels, Fp8Scaling::Channels),
        (Fp8Store::CtTensor, Fp8Scaling::Tensor),
        (Fp8Store::CtBlocks, Fp8Scaling::Blocks),
    ] {
        let spec = parse_edited(store, &|_| {}).unwrap();
        assert!(
            matches!(spec.quant, QuantScheme::Fp8 { scaling: s, .. } if s == scaling),
            "{store:?}: {:?}",
            spec.quant
        );
        assert_eq!(spec.quant.name(), "compressed-tensors/float-quantized");
    }
    // `naive-quantized` stores the same tensors; the weight type makes it fp8.
    let spec = parse_edited(Fp8Store::CtChannels, &|qc| {
        qc["format"] = json!("naive-quantized");
        qc["config_groups"]["group_0"]["format"] = json!("naive-quantized");
    })
    .unwrap();
    assert!(matches!(
        spec.quant,
        QuantScheme::Fp8 {
            scaling: Fp8Scaling::Channels,
            source: Fp8Source::CompressedTensors,
            ..
        }
    ));
    // Weight-only fp8: no input activations.
    let spec = parse_edited(Fp8Store::CtChannels, &|qc| {
        qc["config_groups"]["group_0"]
            .as_object_mut()
            .unwrap()
            .remove("input_activations");
    })
    .unwrap();
    assert!(matches!(
        spec.quant,
        QuantScheme::Fp8 {
            scaling: Fp8Scaling::Channels,
            static_activations: false,
            ..
        }
    ));
    assert_refused(
        Fp8Store::CtChannels,
        &[
            (
                |qc| qc["config_groups"]["group_0"]["weights"]["num_bits"] = json!(4),
                "4-bit",
            ),
            (
                |qc| qc["config_groups"]["group_0"]["weights"]["symmetric"] = json!(false),
                "asymmetric",
            ),
            (
                |qc| {
                    let w = &mut qc["config_groups"]["group_0"]["weights"];
                    w["strategy"] = json!("group");
                    w["group_size"] = json!(128);
                },
                "Group",
            ),
            (
                |qc| {
                    let a = &mut qc["config_groups"]["group_0"]["input_activations"];
                    a["type"] = json!("int");
                },
                "Int",
            ),
        ],
    );
    assert_refused(
        Fp8Store::CtBlocks,
        &[(
            |qc| {
                qc["config_groups"]["group_0"]["weights"]["block_structure"] = json!([64, 128]);
            },
            "[64, 128]",
        )],
    );
}

/// A layer created from the checkpoint's config and readied around experts the caller packed
/// (`load_packed_fp8_experts`) computes the checkpoint layer's outputs bit for bit; a wrong
/// expert count, shape, code kind or scale grouping, or a layer of another scheme, is a typed
/// error naming the matrix, and the layer is unusable afterwards.
#[test]
fn packed_fp8_experts_equal_the_checkpoint_layer_bit_for_bit() {
    use moe_kernels::{Fp8Desc, Fp8Rows, Fp8Scales, Mxfp4Desc, PackedWna16};
    let (e, top_k, h, i) = (4, 2, 160, 72);
    let (ck, experts) = fp8_block("qwen3_moe", [e, top_k, h, i], 53);
    let dir = temp_dir("fp8-packed");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let whole = MoeLayer::from_checkpoint(&ckpt, 0, 32).unwrap();
    let cfg = whole.config().clone();
    let pack = |ps: &[&Fp8Proj]| {
        let rows: Vec<Fp8Rows<'_>> = ps
            .iter()
            .map(|p| Fp8Rows {
                channels: p.n,
                codes: &p.codes,
                scales: Fp8Scales::Blocks(&p.scales),
            })
            .collect();
        PackedWna16::pack_fp8(Fp8Desc {
            n: ps.iter().map(|p| p.n).sum(),
            k: ps[0].k,
            rows: &rows,
            bias: None,
        })
        .unwrap()
    };
    let w13 = || -> Vec<PackedWna16> { experts.iter().map(|x| pack(&[&x[0], &x[1]])).collect() };
    let w2 = || -> Vec<PackedWna16> { experts.iter().map(|x| pack(&[&x[2]])).collect() };
    let mut layer = MoeLayer::create(cfg.clone()).unwrap();
    layer.load_packed_fp8_experts(w13(), w2()).unwrap();
    assert!(layer.is_processed());
    let mut rng = SplitMix64::new(59);
    for t in [1, 3, 32] {
        let x = rng.vec_uniform(t * h, -2.0, 2.0);
        let logits = rng.vec_uniform(t * e, -1.0, 1.0);
        let (mut ids, mut weights) = (vec![0i32; t * top_k], vec![0f32; t * top_k]);
        whole
            .route(Logits::F32(&logits), &mut ids, &mut weights)
            .unwrap();
        let run = |l: &MoeLayer| {
            let mut out = vec![0f32; t * h];
            l.apply_with_topk(&x, &ids, &weights, &mut out).unwrap();
            out
        };
        let (want, got) = (run(&whole), run(&layer));
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "t={t}"
        );
    }
    // A second load, and loads that must fail, each on a fresh layer.
    assert!(matches!(
        layer.load_packed_fp8_experts(w13(), w2()),
        Err(LayerError::AlreadyProcessed)
    ));
    let fresh = || MoeLayer::create(cfg.clone()).unwrap();
    let mut short = w13();
    short.pop();
    let mut l = fresh();
    let err = l.load_packed_fp8_experts(short, w2()).unwrap_err();
    assert!(
        matches!(&err, LayerError::ParamShape { tensor, expected, actual }
            if tensor.starts_with("w13") && expected == &[e] && actual == &[e - 1]),
        "{err}"
    );
    assert!(matches!(
        l.load_packed_fp8_experts(w13(), w2()),
        Err(LayerError::Unusable { .. })
    ));
    let err = fresh().load_packed_fp8_experts(w13(), w13()).unwrap_err();
    assert!(
        matches!(&err, LayerError::ParamShape { tensor, expected, actual }
            if tensor == "w2[0]" && expected == &[h, i] && actual == &[2 * i, h]),
        "{err}"
    );
    let kb = h.div_ceil(32);
    let mx = || {
        PackedWna16::pack_mxfp4(Mxfp4Desc {
            n: 2 * i,
            k: h,
            blocks: &vec![0x21; 2 * i * kb * 16],
            scales: &vec![127; 2 * i * kb],
            bias: None,
        })
        .unwrap()
    };
    let err = fresh()
        .load_packed_fp8_experts((0..e).map(|_| mx()).collect(), w2())
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::ParamDtype { tensor, .. } if tensor == "w13[0]"),
        "{err}"
    );
    // Channel-scaled experts are channelwise, which a block-scaled layer does not take.
    let channelwise = || -> Vec<PackedWna16> {
        experts
            .iter()
            .map(|x| {
                let ones = vec![1f32; x[0].n];
                let rows = [&x[0], &x[1]].map(|p| Fp8Rows {
                    channels: p.n,
                    codes: &p.codes,
                    scales: Fp8Scales::Channels(&ones),
                });
                PackedWna16::pack_fp8(Fp8Desc {
                    n: 2 * i,
                    k: h,
                    rows: &rows,
                    bias: None,
                })
                .unwrap()
            })
            .collect()
    };
    let err = fresh()
        .load_packed_fp8_experts(channelwise(), w2())
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::ParamDtype { tensor, actual, .. }
            if tensor == "w13[0]" && actual.contains("channel")),
        "{err}"
    );
    let mut other = cfg.clone();
    other.quant = LayerQuant::Unquantized;
    let err = MoeLayer::create(other)
        .unwrap()
        .load_packed_fp8_experts(w13(), w2())
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::InvalidArgument { field: "quant", .. }),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
