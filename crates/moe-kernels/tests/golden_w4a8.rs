//! The W4A8 GEMM against PyTorch's `_dyn_quant_matmul_4bit` goldens, on every rung this CPU
//! can run: exact for f32 activations (same epilogue order), `1e-2·max|out|` for the bf16 case.

use half::bf16;
use moe_kernels::{GemmScratch, KernelSet, PackedW4A8, Par, W4A8Scales, available_isas};
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

fn pack(case: &GoldenCase, n: usize, k: usize) -> Result<PackedW4A8, String> {
    let w = case.i8s("w_int4");
    let bias = case.has("bias").then(|| case.f32s("bias"));
    let packed = match case.dtype("scales") {
        Dtype::BF16 => {
            let scales: Vec<bf16> = case
                .u16_bits("scales")
                .into_iter()
                .map(bf16::from_bits)
                .collect();
            let group_size = k / case.shape("scales")[1];
            PackedW4A8::pack(
                n,
                k,
                &w,
                W4A8Scales::Grouped {
                    group_size,
                    scales: &scales,
                },
                bias.as_deref(),
            )
        }
        Dtype::F32 => {
            let scales = case.f32s("scales");
            PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&scales), bias.as_deref())
        }
        other => return Err(format!("unexpected scales dtype {other:?}")),
    };
    packed.map_err(|e| e.to_string())
}

#[test]
fn w4a8_gemm_goldens_on_every_rung() {
    let mut gemm_cases = 0;
    for_each_golden_case("w4a8", |case| {
        if !case.name.starts_with("gemm_") {
            return Ok(());
        }
        gemm_cases += 1;
        let (m, k) = (case.shape("x")[0], case.shape("x")[1]);
        let n = case.shape("w_int4")[0];
        let exact = case.dtype("x") == Dtype::F32;
        let x = case.f32s("x");
        let want = case.f32s("out");
        let packed = pack(case, n, k)?;
        let max_abs = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        for isa in available_isas() {
            let ks = KernelSet::for_isa(isa).unwrap();
            for par in [Par::Seq, Par::Rayon] {
                let mut out = vec![f32::NAN; m * n];
                moe_kernels::w4a8_gemm(&ks, m, &x, &packed, &mut out, &mut GemmScratch::new(), par)
                    .map_err(|e| e.to_string())?;
                for (i, (g, w)) in out.iter().zip(&want).enumerate() {
                    let ok = if exact {
                        g.to_bits() == w.to_bits()
                    } else {
                        (bf16::from_f32(*g).to_f32() - w).abs() <= 1e-2 * max_abs
                    };
                    if !ok {
                        return Err(format!("{isa} {par:?}: out[{i}] = {g:e}, want {w:e}"));
                    }
                }
            }
        }
        Ok(())
    });
    assert!(gemm_cases > 0, "no gemm_ case in the w4a8 goldens");
    eprintln!("{gemm_cases} gemm cases checked on {:?}", available_isas());
}
