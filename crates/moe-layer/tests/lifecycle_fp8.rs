//! FP8 block-quantized checkpoints written by the test (`quant_method: fp8`, `[128, 128]`
//! blocks, e4m3 weights with subnormals and signed zeros, H and I not multiples of 128) load
//! onto the native WNA16 kernels and compute the MoE block of their exactly dequantized weights:
//! the layer's f32 output is compared with an f64 evaluation of the same routing, gated SiLU
//! MLPs, shared expert and weighted sum (relative L2 below 1e-5; 1e-2 where the CPU's bf16
//! path takes the GEMMs with many rows per expert, which round activations and scaled weights
//! to bf16). Tensor- and expert-parallel
//! ranks sum to the whole layer; the config's block size, activation scheme and format are
//! checked, and the name-based road refuses FP8 layers.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Fp8Proj, fp8_block, temp_dir};
use moe_layer::checkpoint::{Checkpoint, QuantScheme, ShardAccess};
use moe_layer::{
    ExpertShard, LayerError, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind,
    TensorView,
};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use serde_json::json;

/// `x · Wᵀ` in f64 for dequantized weights `w` `[n, k]`.
fn matvec(w: &[f64], n: usize, k: usize, x: &[f64]) -> Vec<f64> {
    (0..n)
        .map(|c| (0..k).map(|j| x[j] * w[c * k + j]).sum())
        .collect()
}

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

/// The MoE block in f64 on the layer's own routing; `experts[E]`, when present, is the shared
/// MLP, added to every token.
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
            let y = mlp(&experts[ids[tok * top_k + j] as usize], &xt);
            let w = f64::from(weights[tok * top_k + j]);
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

fn rel_l2(got: &[f32], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        num += (f64::from(*g) - w).powi(2);
        den += w.powi(2);
    }
    (num / den).sqrt()
}

/// Writes, loads and runs one checkpoint at 1, 5 and 16 tokens against the f64 reference.
fn check(model_type: &str, dims: [usize; 4], seed: u64) {
    let [e, top_k, h, _] = dims;
    let (ck, experts) = fp8_block(model_type, dims, seed);
    // The written codes hold subnormals and both zeros, which the decoders must get right.
    let codes = &experts[0][0].codes;
    assert!(codes.iter().any(|&b| b & 0x78 == 0 && b & 7 != 0));
    assert!(codes.contains(&0x80) && codes.contains(&0));
    let dir = temp_dir(&format!("fp8-{model_type}"));
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
    assert!(
        matches!(ckpt.spec().quant, QuantScheme::Fp8Block { ref ignored } if ignored == &["lm_head"])
    );
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    assert_eq!(layer.config().quant, LayerQuant::Fp8Block);
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
            "{model_type} t={t}: rel L2 {rel} (tolerance {tol:e})"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen3-shaped: H = 160 (a whole block and a short one), I = 72 (one short block).
#[test]
fn qwen3_fp8_blocks_match_the_dequantized_reference() {
    check("qwen3_moe", [4, 2, 160, 72], 31);
}

/// DeepSeek-V3-shaped, with its shared expert and grouped, biased routing.
#[test]
fn deepseek_v3_fp8_blocks_with_a_shared_expert_match_the_reference() {
    check("deepseek_v3", [4, 2, 136, 200], 37);
}

/// Tensor-parallel ranks (I split on a block boundary) and expert-parallel ranks each compute
/// their part; the parts sum to the single-rank layer.
#[test]
fn parallel_ranks_sum_to_the_whole_layer() {
    let (e, h) = (4, 136);
    let (ck, _) = fp8_block("qwen3_moe", [e, 2, h, 256], 41);
    let dir = temp_dir("fp8-ranks");
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
        assert!(rel < 1e-5, "{what}: rel L2 {rel}");
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

/// The fp8 `quantization_config` is read as vLLM and Hugging Face write it, and anything but
/// dynamic e4m3 activations with `[128, 128]` blocks is refused with the reason.
#[test]
fn fp8_configs_are_checked() {
    let (ck, _) = fp8_block("qwen3_moe", [2, 1, 16, 8], 53);
    let parse = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut config = ck.config.clone();
        edit(&mut config["quantization_config"]);
        moe_layer::checkpoint::MoeModelSpec::from_json_str(
            std::path::Path::new("config.json"),
            &config.to_string(),
        )
    };
    let spec = parse(&|qc| qc["ignored_layers"] = json!(["model.layers.0.self_attn"])).unwrap();
    assert_eq!(
        spec.quant,
        QuantScheme::Fp8Block {
            ignored: vec!["model.layers.0.self_attn".into(), "lm_head".into()]
        }
    );
    for (edit, needle) in [
        (
            (|qc: &mut serde_json::Value| qc["weight_block_size"] = json!([64, 64]))
                as fn(&mut serde_json::Value),
            "[64,64]",
        ),
        (
            |qc| {
                qc.as_object_mut().unwrap().remove("weight_block_size");
            },
            "weight_block_size",
        ),
        (|qc| qc["activation_scheme"] = json!("static"), "static"),
        (|qc| qc["fmt"] = json!("e5m2"), "e5m2"),
    ] {
        match parse(&edit) {
            Err(LayerError::UnsupportedScheme { reason, .. }) => {
                assert!(reason.contains(needle), "{reason}");
            }
            other => panic!("{needle}: {other:?}"),
        }
    }
    assert!(matches!(
        parse(&|qc| qc["ignored_layers"] = json!([1])),
        Err(LayerError::ConfigField {
            field: "ignored_layers",
            ..
        })
    ));
}

/// A layer created from the checkpoint's config and readied around experts the caller packed
/// (`load_packed_fp8_experts`) computes the checkpoint layer's outputs bit for bit; a wrong
/// expert count, shape or code kind, or a layer of another scheme, is a typed error naming the
/// matrix, and the layer is unusable afterwards.
#[test]
fn packed_fp8_experts_equal_the_checkpoint_layer_bit_for_bit() {
    use moe_kernels::{Fp8BlockDesc, Fp8BlockRows, Mxfp4Desc, PackedWna16};
    let (e, top_k, h, i) = (4, 2, 160, 72);
    let (ck, experts) = fp8_block("qwen3_moe", [e, top_k, h, i], 53);
    let dir = temp_dir("fp8-packed");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let whole = MoeLayer::from_checkpoint(&ckpt, 0, 32).unwrap();
    let cfg = whole.config().clone();
    let pack = |ps: &[&Fp8Proj]| {
        let rows: Vec<Fp8BlockRows<'_>> = ps
            .iter()
            .map(|p| Fp8BlockRows {
                channels: p.n,
                codes: &p.codes,
                scales: &p.scales,
            })
            .collect();
        PackedWna16::pack_fp8_block(Fp8BlockDesc {
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
