//! The fused W4A8 pipeline against every `moe_*` case of the w4a8 goldens (vLLM's
//! `dynamic_4bit_int_moe` op sequence on PyTorch's reference GEMM), on every rung this CPU can
//! run and with both `Par` modes, using the `VllmCpuInt4Compat` activation the goldens were
//! made with.
//!
//! Tolerances (goldens README): `1e-5·max|out|` for f32 outputs, `1e-2·max|out|` for 16-bit
//! outputs of f32 compute, `2e-2·max|out|` for bf16 compute (bf16 `x` with channelwise weights
//! runs PyTorch's bf16 kernel: every op rounds to bf16, which we reproduce op by op; the
//! tolerance covers our own `exp`).

use half::{bf16, f16};
use moe_kernels::moe::{ExpertId, MoeFloat};
use moe_kernels::{
    Activation, FusedMoe, FusedMoeConfig, GateUpLayout, Int4ActivationKind, KernelSet, MoeInput,
    PackedExperts, PackedW4A8, Par, W4A8Scales, available_isas,
};
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

/// Packs expert `e` of a stacked `[E, N, K]` int4 tensor with its scales.
fn pack_expert(case: &GoldenCase, w: &str, s: &str, e: usize) -> Result<PackedW4A8, String> {
    let shape = case.shape(w);
    let (n, k) = (shape[1], shape[2]);
    let codes = &case.i8s(w)[e * n * k..][..n * k];
    let per_row = case.shape(s)[2];
    let packed = match case.dtype(s) {
        Dtype::BF16 => {
            let bits = &case.u16_bits(s)[e * n * per_row..][..n * per_row];
            let scales: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
            let scales = W4A8Scales::Grouped {
                group_size: k / per_row,
                scales: &scales,
            };
            PackedW4A8::pack(n, k, codes, scales, None)
        }
        Dtype::F32 => {
            let scales = &case.f32s(s)[e * n..][..n];
            PackedW4A8::pack(n, k, codes, W4A8Scales::Channelwise(scales), None)
        }
        other => return Err(format!("{s}: unexpected dtype {other:?}")),
    };
    packed.map_err(|err| format!("{w}[{e}]: {err}"))
}

/// Runs one case with `x` as `X`; returns the output widened to f32.
fn run<X: MoeFloat, Id: ExpertId>(
    moe: &FusedMoe<PackedW4A8>,
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

#[test]
fn w4a8_moe_goldens() {
    let mut seen = 0;
    let mut summary = Vec::new();
    for_each_golden_case("w4a8", |case| {
        if !case.name.starts_with("moe_") {
            return Ok(());
        }
        seen += 1;
        let (m, h) = (case.shape("x")[0], case.shape("x")[1]);
        let (e, two_i) = (case.shape("w13_int4")[0], case.shape("w13_int4")[1]);
        let k = case.shape("topk_ids")[1];
        let kind = Int4ActivationKind::from_kind(case.meta_i64("activation_kind"))
            .map_err(|err| err.to_string())?;
        let weights = PackedExperts {
            w13: (0..e)
                .map(|ex| pack_expert(case, "w13_int4", "w13_scales", ex))
                .collect::<Result<_, _>>()?,
            w2: (0..e)
                .map(|ex| pack_expert(case, "w2_int4", "w2_scales", ex))
                .collect::<Result<_, _>>()?,
            w13_bias: None,
            w2_bias: None,
        };
        let config = FusedMoeConfig {
            hidden_size: h,
            intermediate_size: two_i / 2,
            activation: Activation::VllmCpuInt4Compat(kind),
            gate_up_layout: GateUpLayout::Concatenated,
            apply_router_weight_on_input: case.meta_bool("apply_router_weight_on_input"),
            global_num_experts: e,
            expert_map: None,
        };
        let ids = case.i64s("topk_ids");
        let topk_weights = case.f32s("topk_weights");
        let want = case.f32s("out");
        let x_dtype = case.dtype("x");
        let bf16_compute = x_dtype == Dtype::BF16 && case.meta_i64("group_size") == -1;
        let tol = match (x_dtype, bf16_compute) {
            (Dtype::F32, _) => 1e-5,
            (_, false) => 1e-2,
            (_, true) => 2e-2,
        };
        let max_abs = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let mut worst = 0f32;
        let mut reference: Option<Vec<f32>> = None;
        for isa in available_isas() {
            let ks = KernelSet::for_isa(isa).unwrap();
            let moe = FusedMoe::new(weights.clone(), config.clone(), ks)
                .map_err(|err| err.to_string())?;
            for par in [Par::Seq, Par::Rayon] {
                let dims = (m, k, h);
                let got = match x_dtype {
                    Dtype::F32 => run(&moe, &case.f32s("x"), &ids, &topk_weights, dims, par),
                    Dtype::BF16 => {
                        let x: Vec<bf16> = case
                            .u16_bits("x")
                            .into_iter()
                            .map(bf16::from_bits)
                            .collect();
                        run(&moe, &x, &ids, &topk_weights, dims, par)
                    }
                    Dtype::F16 => {
                        let x: Vec<f16> =
                            case.u16_bits("x").into_iter().map(f16::from_bits).collect();
                        run(&moe, &x, &ids, &topk_weights, dims, par)
                    }
                    other => return Err(format!("x: unexpected dtype {other:?}")),
                }?;
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let d = (g - w).abs();
                    if d.is_nan() || d > tol * max_abs {
                        return Err(format!(
                            "{isa} {par:?}: out[{i}] = {g:e}, want {w:e} (tol {tol}·{max_abs:e})"
                        ));
                    }
                    worst = worst.max(d / max_abs);
                }
                // Every rung and thread mode must agree bit for bit.
                match &reference {
                    None => reference = Some(got),
                    Some(r) if r.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()) => {}
                    Some(_) => return Err(format!("{isa} {par:?} differs from the first run")),
                }
            }
        }
        summary.push(format!("{}: max rel diff {worst:.3e}", case.name));
        Ok(())
    });
    assert!(seen > 0, "no moe_ case in the w4a8 goldens");
    for line in &summary {
        eprintln!("{line}");
    }
}
