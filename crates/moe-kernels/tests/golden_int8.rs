//! The W8A8 GEMM inside a minimal emulation of vLLM's CPU INT8_W8A8 MoE (spec §5.3), against the
//! int8 goldens with their documented tolerance `1e-2·max|out|`, on every rung.
//!
//! The pipeline here is only test scaffolding for the GEMM (the real fused MoE lives elsewhere):
//! per (token, slot): gate/up = W8A8(x, w13), `silu(gate)·up` rounded to the activation dtype,
//! y = W8A8(that, w2) · topk_weight rounded to the activation dtype, summed over slots in f32.

use half::{bf16, f16};
use moe_kernels::{GemmScratch, KernelSet, PackedW8A8, Par, available_isas};
use moe_testutil::for_each_golden_case;
use safetensors::Dtype;

fn round_to(dtype: Dtype, v: f32) -> f32 {
    match dtype {
        Dtype::BF16 => bf16::from_f32(v).to_f32(),
        Dtype::F16 => f16::from_f32(v).to_f32(),
        _ => v,
    }
}

#[test]
fn w8a8_moe_goldens_on_every_rung() {
    for_each_golden_case("int8", |case| {
        let [e, two_i, h] = case.shape("w13_int8")[..] else {
            return Err("w13 rank".into());
        };
        let i = two_i / 2;
        let (m, k) = (case.shape("topk_ids")[0], case.shape("topk_ids")[1]);
        let dtype = case.dtype("x");
        let x = case.f32s("x");
        let (w13, w2) = (case.i8s("w13_int8"), case.i8s("w2_int8"));
        let (s13, s2) = (case.f32s("w13_scale"), case.f32s("w2_scale"));
        let ids = case.i64s("topk_ids");
        let gates = case.f32s("topk_weights");
        let want = case.f32s("out");
        let packed: Vec<(PackedW8A8, PackedW8A8)> = (0..e)
            .map(|ex| {
                let a = PackedW8A8::pack(
                    two_i,
                    h,
                    &w13[ex * two_i * h..][..two_i * h],
                    &s13[ex * two_i..][..two_i],
                );
                let b = PackedW8A8::pack(h, i, &w2[ex * h * i..][..h * i], &s2[ex * h..][..h]);
                (a.unwrap(), b.unwrap())
            })
            .collect();
        let max_abs = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for isa in available_isas() {
            let ks = KernelSet::for_isa(isa).unwrap();
            let mut scratch = GemmScratch::new();
            let mut out = vec![0f32; m * h];
            for t in 0..m {
                for j in 0..k {
                    let (w13p, w2p) = &packed[ids[t * k + j] as usize];
                    let mut gu = vec![0f32; two_i];
                    moe_kernels::w8a8_gemm(
                        &ks,
                        1,
                        &x[t * h..][..h],
                        w13p,
                        &mut gu,
                        &mut scratch,
                        Par::Seq,
                    )
                    .map_err(|e| e.to_string())?;
                    let act: Vec<f32> = (0..i)
                        .map(|c| {
                            let g = gu[c];
                            round_to(dtype, g / (1.0 + (-g).exp()) * gu[i + c])
                        })
                        .collect();
                    let mut y = vec![0f32; h];
                    moe_kernels::w8a8_gemm(&ks, 1, &act, w2p, &mut y, &mut scratch, Par::Seq)
                        .map_err(|e| e.to_string())?;
                    for c in 0..h {
                        out[t * h + c] += round_to(dtype, y[c] * gates[t * k + j]);
                    }
                }
            }
            let worst = out
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((round_to(dtype, *g) - w).abs()));
            eprintln!(
                "{} {isa}: max |diff| / max |out| = {:.2e}",
                case.name,
                worst / max_abs
            );
            for (n, (g, w)) in out.iter().zip(&want).enumerate() {
                if (round_to(dtype, *g) - w).abs() > 1e-2 * max_abs {
                    return Err(format!(
                        "{isa}: out[{n}] = {g}, want {w} (max |out| {max_abs})"
                    ));
                }
            }
        }
        Ok(())
    });
}
