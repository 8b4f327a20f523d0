//! The online int8 method (seed 004) through the layer lifecycle, on vLLM's `int8` goldens:
//! unquantized bf16/f16 expert weights are loaded tensor by tensor, `process` quantizes them per
//! row and packs them for the W8A8 kernels, and `apply` (routing from the golden's logits)
//! matches vLLM's `out` within `1e-2 × max|out|` (goldens README, int8/).

#![cfg(feature = "checkpoint")]
use half::{bf16, f16};
use moe_kernels::Activation;
use moe_layer::layer::vllm_cpu_softmax_router;
use moe_layer::{
    ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind, TensorView,
};
use moe_quant::DType;
use moe_router::Logits;
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

/// A golden 16-bit tensor in its own dtype.
enum Half {
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

fn half(case: &GoldenCase, name: &str) -> Half {
    let bits = case.u16_bits(name);
    match case.dtype(name) {
        Dtype::BF16 => Half::Bf16(bits.into_iter().map(bf16::from_bits).collect()),
        _ => Half::F16(bits.into_iter().map(f16::from_bits).collect()),
    }
}

/// Rows `r0..r0+rows` of expert `e` of a `[E, R, C]` stack, as a tensor view's data.
fn rows<'a>(t: &'a Half, e: usize, r: usize, c: usize, r0: usize, n: usize) -> TensorData<'a> {
    let at = (e * r + r0) * c;
    match t {
        Half::Bf16(v) => TensorData::Bf16(&v[at..at + n * c]),
        Half::F16(v) => TensorData::F16(&v[at..at + n * c]),
    }
}

#[test]
fn online_int8_layer_matches_vllm_goldens() {
    for_each_golden_case("int8", |case| {
        let s13 = case.shape("w13_weight");
        let (e, two_i, h) = (s13[0], s13[1], s13[2]);
        let i = two_i / 2;
        let k = case.shape("topk_ids")[1];
        let m = case.shape("x")[0];
        let dtype = match case.dtype("x") {
            Dtype::BF16 => DType::BF16,
            _ => DType::F16,
        };
        let cfg = MoeLayerConfig {
            num_experts: e,
            top_k: k,
            hidden: h,
            intermediate: i,
            tp_rank: 0,
            tp_size: 1,
            expert_map: None,
            activation: Activation::SILU,
            router: vllm_cpu_softmax_router(e, k, true),
            router_bias_pending: false,
            shared_experts: None,
            quant: LayerQuant::Int8Online,
            in_dtype: dtype,
            max_tokens: 16,
        };
        let mut layer = MoeLayer::create(cfg).map_err(|e| e.to_string())?;
        let (w13, w2) = (half(case, "w13_weight"), half(case, "w2_weight"));
        for x in 0..e {
            for (shard, t, r, c, r0, n) in [
                (ExpertShard::W1, &w13, two_i, h, 0, i),
                (ExpertShard::W3, &w13, two_i, h, i, i),
                (ExpertShard::W2, &w2, h, i, 0, h),
            ] {
                let shape = [n, c];
                let view = TensorView {
                    name: shard.name(),
                    shape: &shape,
                    data: rows(t, x, r, c, r0, n),
                };
                layer
                    .load_expert_tensor(x, shard, TensorKind::Weight, &view)
                    .map_err(|e| e.to_string())?;
            }
        }
        layer.process().map_err(|e| e.to_string())?;
        let want = case.f32s("out");
        let out: Vec<f32> = match (half(case, "x"), half(case, "router_logits")) {
            (Half::Bf16(x), Half::Bf16(l)) => {
                let mut o = vec![bf16::ZERO; x.len()];
                layer
                    .apply(&x, Logits::Bf16(&l), &mut o)
                    .map_err(|e| e.to_string())?;
                o.iter().map(|v| v.to_f32()).collect()
            }
            (Half::F16(x), Half::F16(l)) => {
                let mut o = vec![f16::ZERO; x.len()];
                layer
                    .apply(&x, Logits::F16(&l), &mut o)
                    .map_err(|e| e.to_string())?;
                o.iter().map(|v| v.to_f32()).collect()
            }
            _ => return Err("x and router_logits dtypes differ".into()),
        };
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let diff = out
            .iter()
            .zip(&want)
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        println!(
            "{}: M {m}: max abs diff {diff:.3e} = {:.3e} × max|out|, backend {:?}",
            case.name,
            diff / scale,
            layer.backend()
        );
        if diff > 1e-2 * scale {
            return Err(format!("max abs diff {diff} > 1e-2 × {scale}"));
        }
        Ok(())
    });
}
