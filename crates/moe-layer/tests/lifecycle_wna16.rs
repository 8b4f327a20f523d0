//! WNA16 checkpoints written by the test (4-bit GPTQ, GPTQ with act-order, compressed-tensors
//! pack-quantized, and 8-bit GPTQ) load onto the native WNA16 kernels and compute the MoE block of their
//! exactly dequantized weights: the layer's f32 output is compared with an f64 evaluation of
//! the same routing, gated SiLU MLPs and weighted sum. Symmetric int4 ones also run with int8
//! activations on the W4A8 kernels when asked, and the rest refuse that.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Ckpt, E, Fmt, G, H, I, Proj, temp_dir, wna16_tolerance};
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{
    DisabledKernels, ExpertShard, LayerError, LayerQuant, LoadOptions, MoeLayer, MoeLayerConfig,
    TensorData, TensorKind, TensorView, Wna16Activations,
};
use moe_quant::WeightGroups;
use moe_router::Logits;
use moe_testutil::SplitMix64;
use serde_json::json;

const TOP_K: usize = 2;

/// `x · Wᵀ` in f64 for one projection whose column `k` uses group `group(k)`.
fn matvec(p: &Proj, x: &[f64], group: &dyn Fn(usize) -> usize) -> Vec<f64> {
    let groups = p.k / G;
    (0..p.n)
        .map(|c| {
            (0..p.k)
                .map(|k| {
                    let s = f64::from(p.scales[c * groups + group(k)]);
                    x[k] * f64::from(p.codes[c * p.k + k]) * s
                })
                .sum()
        })
        .collect()
}

/// The MoE block in f64, on the layer's own routing.
fn reference(
    layer: &MoeLayer,
    experts: &[[Proj; 3]],
    x: &[f32],
    logits: &[f32],
    t: usize,
    gate_up_group: &dyn Fn(usize) -> usize,
) -> Vec<f64> {
    let mut ids = vec![0i32; t * TOP_K];
    let mut weights = vec![0f32; t * TOP_K];
    layer
        .route(Logits::F32(logits), &mut ids, &mut weights)
        .unwrap();
    let mut out = vec![0f64; t * H];
    for tok in 0..t {
        let xt: Vec<f64> = x[tok * H..][..H].iter().map(|&v| f64::from(v)).collect();
        for j in 0..TOP_K {
            let [gate, up, down] = &experts[ids[tok * TOP_K + j] as usize];
            let g = matvec(gate, &xt, gate_up_group);
            let u = matvec(up, &xt, gate_up_group);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let y = matvec(down, &a, &|k| k / G);
            let w = f64::from(weights[tok * TOP_K + j]);
            for (o, v) in out[tok * H..][..H].iter_mut().zip(&y) {
                *o += w * v;
            }
        }
    }
    out
}

/// Loads `ck`, checks the kernel label and compares a few token counts with the reference.
fn check(ck: &Ckpt, experts: &[[Proj; 3]], tag: &str, gate_up_group: &dyn Fn(usize) -> usize) {
    let dir = temp_dir(tag);
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    check_layer(&layer, experts, tag, gate_up_group);
}

/// Checks the kernel label of `layer` and compares a few token counts with the reference.
fn check_layer(
    layer: &MoeLayer,
    experts: &[[Proj; 3]],
    tag: &str,
    gate_up_group: &dyn Fn(usize) -> usize,
) {
    let info = layer.backend().unwrap();
    assert!(info.kernel.starts_with("cpu-wna16/"), "{tag}: {info:?}");
    let tol = wna16_tolerance(&info.ops);
    let mut rng = SplitMix64::new(7);
    for t in [1, 5, 16] {
        let x = rng.vec_uniform(t * H, -2.0, 2.0);
        let logits = rng.vec_uniform(t * E, -1.0, 1.0);
        let mut out = vec![0f32; t * H];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        let want = reference(layer, experts, &x, &logits, t, gate_up_group);
        let (mut num, mut den) = (0f64, 0f64);
        for (g, w) in out.iter().zip(&want) {
            num += (f64::from(*g) - w).powi(2);
            den += w.powi(2);
        }
        let rel = (num / den).sqrt();
        assert!(rel < tol, "{tag} t={t}: rel L2 {rel} (tolerance {tol:e})");
    }
}

#[test]
fn gptq_and_pack_quantized_run_on_the_native_kernels() {
    for (fmt, tag) in [
        (Fmt::Gptq, "wna16-gptq"),
        (Fmt::PackQuantized, "wna16-pack"),
    ] {
        let (ck, experts) = Ckpt::build("qwen3_moe", fmt, 21);
        check(&ck, &experts, tag, &|k| k / G);
    }
}

/// Every stored scale tensor of `ck` (`scales`, `weight_scale`) rewritten as f32 values times
/// `factor`, and the same product (rounded the same way, in f32) in `experts`.
fn scales_to_f32(ck: &mut Ckpt, experts: &mut [[Proj; 3]], factor: f32) {
    for (name, t) in ck.tensors.iter_mut() {
        if !(name.ends_with(".scales") || name.ends_with(".weight_scale")) {
            continue;
        }
        let values: Vec<f32> = t
            .bytes
            .chunks_exact(2)
            .map(|b| match t.dtype {
                safetensors::Dtype::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                safetensors::Dtype::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                other => panic!("{name}: scales stored as {other:?}"),
            })
            .collect();
        let scaled: Vec<f32> = values.iter().map(|&v| v * factor).collect();
        t.dtype = safetensors::Dtype::F32;
        t.bytes = checkpoint_support::f32_bytes(&scaled);
    }
    for p in experts.iter_mut().flatten() {
        for s in &mut p.scales {
            *s *= factor;
        }
    }
}

/// f32 scales that neither bf16 nor f16 holds exactly load on both roads (expert by expert
/// from the stored words, and the whole layer at once) and are used as stored: each lies a
/// quarter to a half of a bf16 step above a bf16 value, so rounding them to bf16 would shrink
/// all of them (by about 2^-9) and move the outputs by about 6e-3 relative, beyond every
/// tolerance of `check_layer`. The
/// Marlin fallback, which keeps 16-bit scales, refuses them by name.
#[test]
fn f32_scales_are_used_as_stored() {
    let factor = 1.0 + 31.0 * 2f32.powi(-14);
    for (fmt, seed, tag) in [
        (Fmt::Gptq, 24, "wna16-gptq-f32-scales"),
        (Fmt::PackQuantized, 25, "wna16-pack-f32-scales"),
    ] {
        let (mut ck, mut experts) = Ckpt::build("qwen3_moe", fmt, seed);
        scales_to_f32(&mut ck, &mut experts, factor);
        let inexact = experts.iter().flatten().flat_map(|p| &p.scales).any(|&s| {
            half::bf16::from_f32(s).to_f32() != s && half::f16::from_f32(s).to_f32() != s
        });
        assert!(
            inexact,
            "{tag}: the scales must not all be exact in 16 bits"
        );
        let dir = temp_dir(tag);
        ck.write(&dir);
        let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
        let streamed = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
        check_layer(&streamed, &experts, tag, &|k| k / G);
        let whole =
            MoeLayer::from_checkpoint_ranked_with(&ckpt, 0, 16, (0, 1), None, &LoadOptions::new())
                .unwrap();
        check_layer(&whole, &experts, &format!("{tag} (whole layer)"), &|k| {
            k / G
        });
        // The Marlin fallback keeps 16-bit scales: it refuses these, naming them.
        let disabled = DisabledKernels::parse("cpu-wna16");
        let opts = LoadOptions::new().with_disabled_kernels(&disabled);
        match MoeLayer::from_checkpoint_with(&ckpt, 0, 16, &opts) {
            Err(LayerError::ParamDtype { tensor, actual, .. }) => {
                assert_eq!((tensor.as_str(), actual.as_str()), ("weight_scale", "F32"));
            }
            other => panic!("{tag} on Marlin: {:?}", other.map(|l| l.backend())),
        }
    }
}

/// Scales loaded tensor by tensor in several dtypes (gate and up in bf16, down in f32 values
/// that 16 bits cannot hold, the bf16 ones last) are all kept exactly: none is narrowed to the
/// dtype of the last one loaded. The layer computes what the reference does, and bit for bit
/// what the same layer with every scale given in f32 computes.
#[test]
fn per_tensor_scales_in_several_dtypes_are_kept_exactly() {
    let (_, mut experts) = Ckpt::build("qwen3_moe", Fmt::Gptq, 26);
    let factor = 1.0 + 31.0 * 2f32.powi(-14);
    for [_, _, down] in &mut experts {
        for s in &mut down.scales {
            *s *= factor;
        }
    }
    let quant = LayerQuant::Wna16 {
        bits: 4,
        group_size: WeightGroups::groups(G).unwrap(),
        act_order: false,
        zero_points: false,
    };
    let load = |mixed: bool| {
        let mut moe = MoeLayer::create(MoeLayerConfig::new(E, TOP_K, H, I, quant)).unwrap();
        for (e, projs) in experts.iter().enumerate() {
            // Down first, so the bf16 scales of gate and up come last.
            for (p, shard) in [
                (2, ExpertShard::W2),
                (0, ExpertShard::W1),
                (1, ExpertShard::W3),
            ] {
                let proj = &projs[p];
                let shape = [proj.n, proj.k];
                let codes = TensorView {
                    name: "weight",
                    shape: &shape,
                    data: TensorData::I8(&proj.codes),
                };
                moe.load_expert_tensor(e, shard, TensorKind::Weight, &codes)
                    .unwrap();
                let scale_shape = [proj.n, proj.k / G];
                let bf16s: Vec<half::bf16> = proj
                    .scales
                    .iter()
                    .map(|&v| half::bf16::from_f32(v))
                    .collect();
                let data = match shard {
                    ExpertShard::W1 | ExpertShard::W3 if mixed => TensorData::Bf16(&bf16s),
                    _ => TensorData::F32(&proj.scales),
                };
                let scales = TensorView {
                    name: "weight_scale",
                    shape: &scale_shape,
                    data,
                };
                moe.load_expert_tensor(e, shard, TensorKind::Scale, &scales)
                    .unwrap();
            }
        }
        moe.load_router_weight(&vec![0.01; E * H]).unwrap();
        moe.process().unwrap();
        moe
    };
    let (mixed, f32_only) = (load(true), load(false));
    check_layer(&mixed, &experts, "wna16-per-tensor-mixed-scales", &|k| {
        k / G
    });
    let mut rng = SplitMix64::new(8);
    for t in [1, 5, 16] {
        let x = rng.vec_uniform(t * H, -2.0, 2.0);
        let logits = rng.vec_uniform(t * E, -1.0, 1.0);
        let run = |layer: &MoeLayer| {
            let mut out = vec![0f32; t * H];
            layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
            out
        };
        assert_eq!(run(&mixed), run(&f32_only), "t={t}");
    }
}

#[test]
fn eight_bit_gptq_runs_on_the_native_kernels() {
    let (mut ck, experts) = Ckpt::build("qwen3_moe", Fmt::Gptq, 23);
    ck.config["quantization_config"]["bits"] = json!(8);
    // qweight [k/4, n]: byte t of word [r][c] = code of row 4r + t, column c, plus 128.
    for (e, projs) in experts.iter().enumerate() {
        for (p, name) in projs.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            let (n, k) = (p.n, p.k);
            let mut q = vec![0u32; k / 4 * n];
            for c in 0..n {
                for kk in 0..k {
                    let code = (i32::from(p.codes[c * k + kk]) + 128) as u32;
                    q[(kk / 4) * n + c] |= code << (8 * (kk % 4));
                }
            }
            let words: Vec<i32> = q.iter().map(|&w| w as i32).collect();
            let prefix = format!("model.layers.0.mlp.experts.{e}.{name}");
            ck.put(
                &format!("{prefix}.qweight"),
                safetensors::Dtype::I32,
                &[k / 4, n],
                checkpoint_support::i32_bytes(&words),
            );
            let groups = k / G;
            ck.put(
                &format!("{prefix}.qzeros"),
                safetensors::Dtype::I32,
                &[groups, n / 4],
                checkpoint_support::i32_bytes(&vec![0x7F7F_7F7F; groups * n / 4]),
            );
        }
    }
    check(&ck, &experts, "wna16-gptq-8bit", &|k| k / G);
}

#[test]
fn gptq_act_order_is_sorted_by_group_at_load() {
    let (mut ck, experts) = Ckpt::build("qwen3_moe", Fmt::Gptq, 22);
    ck.config["quantization_config"]["desc_act"] = json!(true);
    // The two groups of H interleaved: input row k belongs to group k mod 2.
    let groups = H / G;
    let g_idx: Vec<i32> = (0..H).map(|k| (k % groups) as i32).collect();
    for e in 0..E {
        for p in ["gate_proj", "up_proj"] {
            ck.put(
                &format!("model.layers.0.mlp.experts.{e}.{p}.g_idx"),
                safetensors::Dtype::I32,
                &[H],
                checkpoint_support::i32_bytes(&g_idx),
            );
        }
    }
    assert_eq!(I, G, "down_proj has one group, so its g_idx is trivial");
    check(&ck, &experts, "wna16-gptq-actorder", &move |k| k % groups);
}

/// A pack-quantized WNA16 checkpoint loaded with int8 activations, on both loading roads
/// (expert by expert, and the whole layer at once through the ranked loader), runs on the
/// W4A8 kernels and computes exactly what the int-quantized W4A8 checkpoint of the same codes
/// and bf16 scales computes (the W4A8 layer is itself checked against vLLM's vectors).
#[test]
fn int8_activations_run_symmetric_int4_on_the_w4a8_kernels() {
    for g in [32, 64] {
        let shape = [4, 2, 128, 64];
        let (wna16_dir, w4a8_dir) = (
            temp_dir(&format!("wna16-int8act-g{g}")),
            temp_dir(&format!("w4a8-same-codes-g{g}")),
        );
        checkpoint_support::runnable(Fmt::PackQuantized, shape, g, 41).write(&wna16_dir);
        checkpoint_support::runnable(Fmt::IntQuantized, shape, g, 41).write(&w4a8_dir);
        let wna16 = Checkpoint::open(&wna16_dir, ShardAccess::Read).unwrap();
        let w4a8 = Checkpoint::open(&w4a8_dir, ShardAccess::Read).unwrap();
        let opts = LoadOptions::new().with_wna16_activations(Wna16Activations::DynamicInt8);
        let streamed = MoeLayer::from_checkpoint_with(&wna16, 0, 16, &opts).unwrap();
        let whole =
            MoeLayer::from_checkpoint_ranked_with(&wna16, 0, 16, (0, 1), None, &opts).unwrap();
        let float = MoeLayer::from_checkpoint(&wna16, 0, 16).unwrap();
        let reference = MoeLayer::from_checkpoint(&w4a8, 0, 16).unwrap();
        for layer in [&streamed, &whole] {
            let info = layer.backend().unwrap();
            assert!(info.kernel.starts_with("cpu-int4-w4a8/"), "g{g}: {info:?}");
        }
        assert!(float.backend().unwrap().kernel.starts_with("cpu-wna16/"));
        let mut rng = SplitMix64::new(9);
        for t in [1, 5, 16] {
            let x = rng.vec_uniform(t * 128, -2.0, 2.0);
            let logits = rng.vec_uniform(t * 4, -1.0, 1.0);
            let run = |layer: &MoeLayer| {
                let mut out = vec![0f32; t * 128];
                layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
                out
            };
            let want = run(&reference);
            assert_eq!(run(&streamed), want, "g{g} t={t}: streamed road");
            assert_eq!(run(&whole), want, "g{g} t={t}: whole-layer road");
            assert_ne!(run(&float), want, "g{g} t={t}: float activations");
        }
    }
}

/// Int8 activations are refused, naming the setting, for weights the W4A8 kernels cannot
/// hold: 8-bit codes, zero points, act-order. Other schemes ignore the setting.
#[test]
fn int8_activations_refuse_weights_the_w4a8_kernels_cannot_hold() {
    let wna16 = |bits, act_order, zero_points| LayerQuant::Wna16 {
        bits,
        group_size: WeightGroups::groups(G).unwrap(),
        act_order,
        zero_points,
    };
    for quant in [
        wna16(8, false, false),
        wna16(4, true, false),
        wna16(4, false, true),
    ] {
        let cfg = MoeLayerConfig::new(E, TOP_K, H, I, quant)
            .with_wna16_activations(Wna16Activations::DynamicInt8);
        match cfg.select_backend() {
            Err(LayerError::InvalidArgument { field, reason }) => {
                assert_eq!(field, "wna16_activations", "{quant:?}: {reason}");
            }
            other => panic!("{quant:?}: {other:?}"),
        }
        assert!(matches!(
            MoeLayer::create(cfg),
            Err(LayerError::InvalidArgument {
                field: "wna16_activations",
                ..
            })
        ));
    }
    // The same weights with float activations are accepted, and so is the setting on a
    // scheme it does not concern.
    let cfg = MoeLayerConfig::new(E, TOP_K, H, I, wna16(4, false, true));
    assert!(cfg.select_backend().is_ok());
    let cfg = MoeLayerConfig::new(
        E,
        TOP_K,
        64,
        64,
        LayerQuant::W4A8 {
            group_size: WeightGroups::groups(32).unwrap(),
        },
    )
    .with_wna16_activations(Wna16Activations::DynamicInt8);
    assert!(cfg.select_backend().is_ok());
}
