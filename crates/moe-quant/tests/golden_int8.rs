//! Golden test: per-row int8 weight quantization against vLLM's `Int8OnlineMoEMethod` outputs in
//! the int8 area. Codes and scales must match to the last bit.

use half::{bf16, f16};
use moe_quant::int8::quantize_int8_per_row;
use moe_quant::{Int8PerRow, ModelFloat};
use moe_testutil::{GoldenCase, for_each_golden_case};
use safetensors::Dtype;

fn quantize_as<H: ModelFloat>(
    bits: &[u16],
    from_bits: fn(u16) -> H,
    rows: usize,
    cols: usize,
) -> Result<Int8PerRow, String> {
    let w: Vec<H> = bits.iter().map(|&b| from_bits(b)).collect();
    quantize_int8_per_row(&w, rows, cols).map_err(|e| e.to_string())
}

fn check_matrix(case: &GoldenCase, weight: &str, codes: &str, scales: &str) -> Result<(), String> {
    let shape = case.shape(weight);
    let [e, rows, cols] = shape[..] else {
        return Err(format!(
            "{weight} has shape {shape:?}, expected [E, rows, cols]"
        ));
    };
    let bits = case.u16_bits(weight);
    let got = match case.dtype(weight) {
        Dtype::BF16 => quantize_as(&bits, bf16::from_bits, e * rows, cols)?,
        Dtype::F16 => quantize_as(&bits, f16::from_bits, e * rows, cols)?,
        other => return Err(format!("{weight} is {other:?}")),
    };
    let want_codes = case.i8s(codes);
    let want_scales = case.f32s(scales);
    if let Some(i) = (0..want_codes.len()).find(|&i| got.codes[i] != want_codes[i]) {
        return Err(format!(
            "{codes}: row {} col {}: {} != {}",
            i / cols,
            i % cols,
            got.codes[i],
            want_codes[i]
        ));
    }
    if let Some(r) =
        (0..want_scales.len()).find(|&r| got.scales[r].to_bits() != want_scales[r].to_bits())
    {
        return Err(format!(
            "{scales}: row {r}: {:e} != {:e}",
            got.scales[r], want_scales[r]
        ));
    }
    if got.codes.len() != want_codes.len() || got.scales.len() != want_scales.len() {
        return Err("output sizes differ".into());
    }
    Ok(())
}

#[test]
fn int8_weight_quant_matches_vllm_bit_for_bit() {
    for_each_golden_case("int8", |case| {
        check_matrix(case, "w13_weight", "w13_int8", "w13_scale")?;
        check_matrix(case, "w2_weight", "w2_int8", "w2_scale")
    });
}
