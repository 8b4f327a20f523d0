//! Pre-quantized int8 W8A8 experts (compressed-tensors `int-quantized` with 8-bit channelwise
//! weights and dynamic per-token int8 activations, the `INT8_W8A8` preset) run on the W8A8
//! kernels: a layer given the codes and scales vLLM's online int8 method computes from the
//! goldens' weights returns the online layer's outputs bit for bit (so vLLM's within its
//! tolerance), a checkpoint written by the test loads to the layer the tensor-by-tensor road
//! builds, and the configs vLLM's int8 MoE method refuses are refused with the reason.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Int8Proj, temp_dir, w8a8_int};
use half::{bf16, f16};
use moe_kernels::Activation;
use moe_layer::checkpoint::{Checkpoint, MoeModelSpec, QuantScheme, ShardAccess};
use moe_layer::layer::vllm_cpu_softmax_router;
use moe_layer::{
    ExpertShard, LayerError, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind,
    TensorView,
};
use moe_quant::DType;
use moe_quant::int8::quantize_int8_per_row;
use moe_router::Logits;
use moe_testutil::{GoldenCase, SplitMix64, for_each_golden_case};
use safetensors::Dtype;
use serde_json::json;

/// A golden 16-bit tensor as f32 values (exact), with its dtype.
fn golden_f32(case: &GoldenCase, name: &str) -> (Vec<f32>, DType) {
    let bits = case.u16_bits(name);
    match case.dtype(name) {
        Dtype::BF16 => (
            bits.into_iter()
                .map(|b| bf16::from_bits(b).to_f32())
                .collect(),
            DType::BF16,
        ),
        _ => (
            bits.into_iter()
                .map(|b| f16::from_bits(b).to_f32())
                .collect(),
            DType::F16,
        ),
    }
}

/// Weights narrowed back to their (exact) 16-bit dtype, as a loader hands them over.
enum Narrow {
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl Narrow {
    fn new(w: &[f32], dtype: DType) -> Self {
        match dtype {
            DType::BF16 => Self::Bf16(w.iter().map(|&x| bf16::from_f32(x)).collect()),
            _ => Self::F16(w.iter().map(|&x| f16::from_f32(x)).collect()),
        }
    }

    fn data(&self) -> TensorData<'_> {
        match self {
            Self::Bf16(v) => TensorData::Bf16(v),
            Self::F16(v) => TensorData::F16(v),
        }
    }
}

/// Quantizes a `[rows, cols]` block of weights in their dtype as the online method does.
fn quantized(w: &[f32], rows: usize, cols: usize, dtype: DType) -> (Vec<i8>, Vec<f32>) {
    let q = match dtype {
        DType::BF16 => {
            let v: Vec<bf16> = w.iter().map(|&x| bf16::from_f32(x)).collect();
            quantize_int8_per_row(&v, rows, cols)
        }
        _ => {
            let v: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
            quantize_int8_per_row(&v, rows, cols)
        }
    }
    .unwrap();
    (q.codes, q.scales)
}

/// Loads `experts[x] = [gate, up, down]` into `layer` tensor by tensor (codes as I8, scales as
/// f32 `[n, 1]`).
fn load_by_name(layer: &mut MoeLayer, experts: &[[Int8Proj; 3]]) -> Result<(), LayerError> {
    for (x, ps) in experts.iter().enumerate() {
        for (shard, p) in [ExpertShard::W1, ExpertShard::W3, ExpertShard::W2]
            .into_iter()
            .zip(ps)
        {
            let shape = [p.n, p.k];
            let view = TensorView {
                name: shard.name(),
                shape: &shape,
                data: TensorData::I8(&p.codes),
            };
            layer.load_expert_tensor(x, shard, TensorKind::Weight, &view)?;
            let shape = [p.n, 1];
            let view = TensorView {
                name: shard.name(),
                shape: &shape,
                data: TensorData::F32(&p.scales),
            };
            layer.load_expert_tensor(x, shard, TensorKind::Scale, &view)?;
        }
    }
    Ok(())
}

/// The goldens' weights quantized by the online method and loaded as W8A8 codes give the
/// online layer's outputs bit for bit, hence vLLM's `out` within `1e-2 × max|out|`.
#[test]
fn online_int8_codes_as_w8a8_run_bit_for_bit_as_the_online_layer() {
    for_each_golden_case("int8", |case| {
        let s13 = case.shape("w13_weight");
        let (e, two_i, h) = (s13[0], s13[1], s13[2]);
        let i = two_i / 2;
        let k = case.shape("topk_ids")[1];
        let (w13, dtype) = golden_f32(case, "w13_weight");
        let (w2, _) = golden_f32(case, "w2_weight");
        let (x, _) = golden_f32(case, "x");
        let (logits, _) = golden_f32(case, "router_logits");
        let cfg = |quant| {
            MoeLayerConfig::new(e, k, h, i, quant)
                .with_activation(Activation::SILU)
                .with_router(vllm_cpu_softmax_router(e, k, true))
                .with_in_dtype(dtype)
                .with_max_tokens(64)
        };
        let mut online =
            MoeLayer::create(cfg(LayerQuant::Int8Online)).map_err(|e| e.to_string())?;
        let mut w8a8 = MoeLayer::create(cfg(LayerQuant::W8A8)).map_err(|e| e.to_string())?;
        let mut experts = Vec::new();
        for xe in 0..e {
            let gate = &w13[xe * two_i * h..][..i * h];
            let up = &w13[(xe * two_i + i) * h..][..i * h];
            let down = &w2[xe * h * i..][..h * i];
            for (shard, w, n, kk) in [
                (ExpertShard::W1, gate, i, h),
                (ExpertShard::W3, up, i, h),
                (ExpertShard::W2, down, h, i),
            ] {
                let shape = [n, kk];
                let narrow = Narrow::new(w, dtype);
                let view = TensorView {
                    name: shard.name(),
                    shape: &shape,
                    data: narrow.data(),
                };
                online
                    .load_expert_tensor(xe, shard, TensorKind::Weight, &view)
                    .map_err(|e| e.to_string())?;
            }
            experts.push([(gate, i, h), (up, i, h), (down, h, i)].map(|(w, n, kk)| {
                let (codes, scales) = quantized(w, n, kk, dtype);
                Int8Proj {
                    n,
                    k: kk,
                    codes,
                    scales,
                }
            }));
        }
        online.process().map_err(|e| e.to_string())?;
        load_by_name(&mut w8a8, &experts).map_err(|e| e.to_string())?;
        w8a8.process().map_err(|e| e.to_string())?;
        let info = w8a8.backend().ok_or("no backend")?;
        if !info.kernel.starts_with("cpu-int8-w8a8") {
            return Err(format!("backend {info:?}"));
        }
        // In the goldens' dtype, as vLLM ran them (intermediate activations in that dtype).
        let (xs, ls) = (Narrow::new(&x, dtype), Narrow::new(&logits, dtype));
        let run = |layer: &MoeLayer| -> Result<Vec<f32>, String> {
            match (&xs, &ls) {
                (Narrow::Bf16(x), Narrow::Bf16(l)) => {
                    let mut o = vec![bf16::ZERO; x.len()];
                    layer
                        .apply(x, Logits::Bf16(l), &mut o)
                        .map_err(|e| e.to_string())?;
                    Ok(o.iter().map(|v| v.to_f32()).collect())
                }
                (Narrow::F16(x), Narrow::F16(l)) => {
                    let mut o = vec![f16::ZERO; x.len()];
                    layer
                        .apply(x, Logits::F16(l), &mut o)
                        .map_err(|e| e.to_string())?;
                    Ok(o.iter().map(|v| v.to_f32()).collect())
                }
                _ => Err("x and router_logits dtypes differ".into()),
            }
        };
        let (a, b) = (run(&online)?, run(&w8a8)?);
        if a.iter().zip(&b).any(|(p, q)| p.to_bits() != q.to_bits()) {
            return Err("W8A8 and online int8 outputs differ".into());
        }
        let want = case.f32s("out");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        // The online layer's golden tolerance.
        let diff = b
            .iter()
            .zip(&want)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        if diff > 1e-2 * scale {
            return Err(format!("max abs diff {diff} > 1e-2 × {scale}"));
        }
        Ok(())
    });
}

/// A W8A8 checkpoint loads (one rank, and two tensor-parallel ranks) to the layer the
/// tensor-by-tensor road builds from the same codes and scales: outputs bit for bit; the two
/// ranks' outputs sum to the whole within the int8 re-quantization of each rank's share of
/// the intermediate activations.
#[test]
fn w8a8_checkpoint_loads_as_the_tensor_by_tensor_layer() {
    let (e, top_k, h, i) = (4, 2, 96, 64);
    let (ck, router, experts) = w8a8_int([e, top_k, h, i], 0x88);
    assert!(experts[0][0].codes.contains(&i8::MIN) && experts[0][0].codes.contains(&i8::MAX));
    let dir = temp_dir("w8a8");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
    assert!(matches!(
        ckpt.spec().quant,
        QuantScheme::CompressedTensorsW8A8 {
            activations_symmetric: true,
            ..
        }
    ));
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 32).unwrap();
    assert_eq!(layer.config().quant, LayerQuant::W8A8);
    assert!(layer.backend().unwrap().kernel.starts_with("cpu-int8-w8a8"));
    let mut by_name = MoeLayer::create(layer.config().clone()).unwrap();
    by_name.load_router_weight(&router).unwrap();
    load_by_name(&mut by_name, &experts).unwrap();
    by_name.process().unwrap();
    let ranks: Vec<MoeLayer> = (0..2)
        .map(|r| MoeLayer::from_checkpoint_ranked(&ckpt, 0, 32, (r, 2), None).unwrap())
        .collect();
    let mut rng = SplitMix64::new(0x89);
    for t in [1, 7, 32] {
        let x = rng.vec_uniform(t * h, -2.0, 2.0);
        let logits = rng.vec_uniform(t * e, -1.0, 1.0);
        let run = |l: &MoeLayer| {
            let mut out = vec![0f32; t * h];
            l.apply(&x, Logits::F32(&logits), &mut out).unwrap();
            out
        };
        let want = run(&by_name);
        let got = run(&layer);
        assert!(
            want.iter()
                .zip(&got)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "t={t}"
        );
        let mut sum = vec![0f32; t * h];
        for r in &ranks {
            for (s, v) in sum.iter_mut().zip(run(r)) {
                *s += v;
            }
        }
        let (mut num, mut den) = (0f64, 0f64);
        for (s, w) in sum.iter().zip(&want) {
            num += f64::from(s - w).powi(2);
            den += f64::from(*w).powi(2);
        }
        let rel = (num / den).sqrt();
        assert!(rel < 2e-2, "t={t}: ranks vs whole rel L2 {rel}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Only what vLLM's int8 MoE method runs is read as W8A8 (from `int-quantized` or
/// `naive-quantized` groups): channelwise static weights with dynamic per-token int8
/// activations; group scales, static or float or absent activations
/// are refused with the reason.
#[test]
fn w8a8_configs_are_checked() {
    let (ck, _, _) = w8a8_int([2, 1, 16, 8], 1);
    let parse = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut config = ck.config.clone();
        edit(&mut config["quantization_config"]["config_groups"]["group_0"]);
        MoeModelSpec::from_json_str(std::path::Path::new("config.json"), &config.to_string())
    };
    let spec = parse(&|g| g["input_activations"]["symmetric"] = json!(false)).unwrap();
    assert!(matches!(
        spec.quant,
        QuantScheme::CompressedTensorsW8A8 {
            activations_symmetric: false,
            ..
        }
    ));
    assert_eq!(spec.quant.name(), "compressed-tensors/int-quantized");
    // `naive-quantized` stores the same int8 tensors.
    let spec = parse(&|g| g["format"] = json!("naive-quantized")).unwrap();
    assert!(matches!(
        spec.quant,
        QuantScheme::CompressedTensorsW8A8 { .. }
    ));
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 5] = [
        (
            |g| {
                g["weights"]["strategy"] = json!("group");
                g["weights"]["group_size"] = json!(64);
            },
            "channelwise",
        ),
        (
            |g| g["input_activations"]["dynamic"] = json!(false),
            "static",
        ),
        (|g| g["input_activations"]["type"] = json!("float"), "Float"),
        (
            |g| g["input_activations"]["strategy"] = json!("tensor"),
            "Tensor",
        ),
        (
            |g| {
                g.as_object_mut().unwrap().remove("input_activations");
            },
            "pack-quantized",
        ),
    ];
    for (edit, needle) in cases {
        match parse(&edit) {
            Err(LayerError::UnsupportedScheme { reason, .. }) => {
                assert!(reason.contains(needle), "{needle}: {reason}");
            }
            other => panic!("{needle}: {other:?}"),
        }
    }
}
