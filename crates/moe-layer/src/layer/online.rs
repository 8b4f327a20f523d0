//! `process` for the online int8 method (seed 004): per-row int8 quantization of the loaded
//! float weights in their stored dtype (moe-quant, bit-exact with vLLM), packed for the W8A8
//! kernels. `w2` rows use the amax of the whole unsharded row recorded at load time.

use half::{bf16, f16};
use moe_kernels::{PackedW8A8, PanelOrder};
use moe_quant::int8::{quantize_int8_per_row, quantize_row_int8_with_amax};
use moe_quant::{DType, ModelFloat};

use super::params::Params;
use crate::LayerError;

/// The quantized `(w13, w2)` stacks, packed in the panel order `order` (the kernel set's).
pub(crate) fn quantize_and_pack(
    params: &Params,
    h: usize,
    i: usize,
    order: PanelOrder,
) -> Result<(Vec<PackedW8A8>, Vec<PackedW8A8>), LayerError> {
    let (w13, w2) = match params.float_dtype {
        Some(DType::BF16) => run::<bf16>(params, h, i),
        Some(DType::F16) => run::<f16>(params, h, i),
        _ => run::<f32>(params, h, i),
    }?;
    let order_all = |v: Vec<PackedW8A8>| v.into_iter().map(|w| w.with_order(order)).collect();
    Ok((order_all(w13), order_all(w2)))
}

fn quant_err(tensor: &str, source: moe_quant::QuantError) -> LayerError {
    LayerError::InvalidArgument {
        field: "weights",
        reason: format!("{tensor}: {source}"),
    }
}

fn run<W: ModelFloat>(
    params: &Params,
    h: usize,
    i: usize,
) -> Result<(Vec<PackedW8A8>, Vec<PackedW8A8>), LayerError> {
    let e = params.w2_f.len() / (h * i);
    let narrow = |v: &[f32]| -> Vec<W> { v.iter().map(|&x| W::from_f32(x)).collect() };
    let (mut w13, mut w2) = (Vec::with_capacity(e), Vec::with_capacity(e));
    for x in 0..e {
        let a = narrow(&params.w13_f[x * 2 * i * h..][..2 * i * h]);
        let q = quantize_int8_per_row(&a, 2 * i, h).map_err(|s| quant_err("w13", s))?;
        w13.push(PackedW8A8::pack(2 * i, h, &q.codes, &q.scales)?);

        let b = narrow(&params.w2_f[x * h * i..][..h * i]);
        let mut codes = vec![0i8; h * i];
        let mut scales = vec![0f32; h];
        for r in 0..h {
            scales[r] = quantize_row_int8_with_amax(
                &b[r * i..][..i],
                params.w2_amax[x * h + r],
                &mut codes[r * i..][..i],
            )
            .map_err(|s| quant_err("w2", s))?;
        }
        w2.push(PackedW8A8::pack(h, i, &codes, &scales)?);
    }
    Ok((w13, w2))
}
