//! Golden test: the asymmetric per-row activation quantization against the `actquant_*` cases of
//! the w4a8 area (PyTorch's reference `_dyn_quant_matmul_4bit` quantizer); codes, zero points,
//! `q − zp` and the dequantization factor must match exactly.

use moe_quant::act::quantize_row_asym_i8;
use moe_testutil::{GoldenCase, for_each_golden_case};

fn check_actquant(case: &GoldenCase) -> Result<(), String> {
    let shape = case.shape("x");
    let [m, k] = shape[..] else {
        return Err(format!("x has shape {shape:?}, expected [M, K]"));
    };
    let x = case.f32s("x");
    let want_q = case.i64s("a_q");
    let want_zp = case.i64s("a_zero_point");
    let want_qmz = case.i64s("a_q_minus_zp");
    let want_recip = case.f32s("a_recip");
    let mut q = vec![0i8; k];
    for r in 0..m {
        let p = quantize_row_asym_i8(&x[r * k..(r + 1) * k], &mut q);
        if i64::from(p.zero_point) != want_zp[r] {
            return Err(format!(
                "row {r}: zero point {} != {}",
                p.zero_point, want_zp[r]
            ));
        }
        if p.recip.to_bits() != want_recip[r].to_bits() {
            return Err(format!("row {r}: recip {} != {}", p.recip, want_recip[r]));
        }
        for (c, &code) in q.iter().enumerate() {
            let i = r * k + c;
            let qmz = i64::from(code) - i64::from(p.zero_point);
            if i64::from(code) != want_q[i] || qmz != want_qmz[i] {
                return Err(format!(
                    "row {r} col {c} (x = {}): q {code} (q-zp {qmz}) != {} (q-zp {})",
                    x[i], want_q[i], want_qmz[i]
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn asym_activation_quant_matches_actquant_goldens() {
    let mut seen = 0;
    for_each_golden_case("w4a8", |case| {
        // The area also holds gemm_ and moe_ cases, tested in moe-kernels and moe-layer.
        if !case.name.starts_with("actquant_") {
            return Ok(());
        }
        seen += 1;
        check_actquant(case)
    });
    assert!(seen > 0, "no actquant_ case in the w4a8 golden area");
}
