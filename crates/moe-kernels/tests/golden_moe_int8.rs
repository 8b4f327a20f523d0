//! The fused W8A8 pipeline against every case of the int8 goldens: the 16-bit weights are
//! quantised with `moe_quant`'s per-row int8 (checked exactly against vLLM's codes and scales),
//! packed, and run with the file's routing; the output must lie within `1e-2·max|out|` of
//! vLLM's AMX kernel (goldens README, int8/).

use half::{bf16, f16};
use moe_kernels::moe::{ExpertId, MoeFloat};
use moe_kernels::{
    Activation, FusedMoe, FusedMoeConfig, GateUpLayout, KernelSet, MoeInput, PackedExperts,
    PackedW8A8, Par, available_isas,
};
use moe_quant::ModelFloat;
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

/// Quantises a stacked `[E, N, K]` weight per row, checks codes and scales against the golden's
/// and packs each expert.
fn quantize_stack<W: ModelFloat>(
    case: &GoldenCase,
    name: &str,
    want_codes: &str,
    want_scales: &str,
    from_bits: fn(u16) -> W,
) -> Result<Vec<PackedW8A8>, String> {
    let shape = case.shape(name);
    let (e, n, k) = (shape[0], shape[1], shape[2]);
    let w: Vec<W> = case.u16_bits(name).into_iter().map(from_bits).collect();
    let q = moe_quant::quantize_int8_per_row(&w, e * n, k).map_err(|err| err.to_string())?;
    if q.codes != case.i8s(want_codes) {
        return Err(format!("{name}: int8 codes differ from {want_codes}"));
    }
    let scales = case.f32s(want_scales);
    if q.scales
        .iter()
        .zip(&scales)
        .any(|(a, b)| a.to_bits() != b.to_bits())
    {
        return Err(format!("{name}: scales differ from {want_scales}"));
    }
    (0..e)
        .map(|ex| {
            PackedW8A8::pack(
                n,
                k,
                &q.codes[ex * n * k..][..n * k],
                &q.scales[ex * n..][..n],
            )
            .map_err(|err| format!("{name}[{ex}]: {err}"))
        })
        .collect()
}

fn run<X: MoeFloat, Id: ExpertId>(
    moe: &FusedMoe<PackedW8A8>,
    x: &[X],
    ids: &[Id],
    weights: &[f32],
    (m, k, h): (usize, usize, usize),
    par: Par,
) -> Result<Vec<f32>, String> {
    let mut scratch = moe.scratch(m, k, 2).map_err(|e| e.to_string())?;
    let mut out = vec![X::from_f32(f32::NAN); m * h];
    let input = MoeInput {
        tokens: m,
        top_k: k,
        x,
        topk_ids: ids,
        topk_weights: weights,
    };
    moe.apply(input, &mut out, &mut scratch, par)
        .map_err(|e| e.to_string())?;
    Ok(out.iter().map(|v| v.to_f32()).collect())
}

fn check_case<W: MoeFloat>(case: &GoldenCase, from_bits: fn(u16) -> W) -> Result<f32, String> {
    let (m, h) = (case.shape("x")[0], case.shape("x")[1]);
    let (e, two_i) = (case.shape("w13_weight")[0], case.shape("w13_weight")[1]);
    let k = case.shape("topk_ids")[1];
    let weights = PackedExperts {
        w13: quantize_stack(case, "w13_weight", "w13_int8", "w13_scale", from_bits)?,
        w2: quantize_stack(case, "w2_weight", "w2_int8", "w2_scale", from_bits)?,
        w13_bias: None,
        w2_bias: None,
    };
    let config = FusedMoeConfig {
        hidden_size: h,
        intermediate_size: two_i / 2,
        activation: Activation::SILU,
        gate_up_layout: GateUpLayout::Concatenated,
        apply_router_weight_on_input: false,
        global_num_experts: e,
        expert_map: None,
    };
    let x: Vec<W> = case.u16_bits("x").into_iter().map(from_bits).collect();
    let ids: Vec<i32> = case
        .i64s("topk_ids")
        .into_iter()
        .map(|v| v as i32)
        .collect();
    let topk_weights = case.f32s("topk_weights");
    let want = case.f32s("out");
    let max_abs = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let mut worst = 0f32;
    let mut first: Option<Vec<f32>> = None;
    for isa in available_isas() {
        let ks = KernelSet::for_isa(isa).unwrap();
        let moe =
            FusedMoe::new(weights.clone(), config.clone(), ks).map_err(|err| err.to_string())?;
        for par in [Par::Seq, Par::Rayon] {
            let got = run(&moe, &x, &ids, &topk_weights, (m, k, h), par)?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let d = (g - w).abs();
                if d.is_nan() || d > 1e-2 * max_abs {
                    return Err(format!(
                        "{isa} {par:?}: out[{i}] = {g:e}, want {w:e} (max|out| {max_abs:e})"
                    ));
                }
                worst = worst.max(d / max_abs);
            }
            match &first {
                None => first = Some(got),
                Some(f) if f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()) => {}
                Some(_) => return Err(format!("{isa} {par:?} differs from the first run")),
            }
        }
    }
    Ok(worst)
}

#[test]
fn w8a8_moe_goldens() {
    let mut summary = Vec::new();
    for_each_golden_case("int8", |case| {
        let worst = match case.dtype("w13_weight") {
            Dtype::BF16 => check_case(case, bf16::from_bits),
            Dtype::F16 => check_case(case, f16::from_bits),
            other => Err(format!("w13_weight: unexpected dtype {other:?}")),
        }?;
        summary.push(format!("{}: max rel diff {worst:.3e}", case.name));
        Ok(())
    });
    assert!(!summary.is_empty(), "no int8 case seen");
    for line in &summary {
        eprintln!("{line}");
    }
}
