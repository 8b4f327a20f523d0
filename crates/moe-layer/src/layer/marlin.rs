//! `process` for WNA16 layers: the loaded signed codes and scales are written as GPTQ tensors
//! (codes offset by 8 or 128 and packed along K, scales `[G, N]` in their 16-bit dtype), put
//! through vLLM's Marlin post-processing (moe-kernels' `marlin` module: repack, scale
//! permutation, act-order sort) and wrapped per expert as [`MarlinWeights`], which the CPU
//! Marlin executor multiplies. Going through the real layout, rather than multiplying the
//! codes directly, is the point: the layer proves the repacked bytes in use.

use half::{bf16, f16};
use moe_kernels::Par;
use moe_kernels::marlin::{
    ActDtype, MarlinMoeWeights, MarlinScales, MarlinTensor, MarlinWeights, MarlinWeightsDesc,
    Scale16, ScaleLayout, ScaleRule, ScaleValues, Wna16Config, Wna16Tensor, pack_gptq,
    process_wna16_moe,
};
use moe_quant::{DType, WeightGroups};

use super::params::Params;
use crate::LayerError;

/// One projection's GPTQ inputs for all local experts.
struct GptqProjection<S> {
    qweight: Vec<u32>,
    scales: Vec<S>,
    g_idx: Vec<u32>,
}

/// Repacks both projections of every local expert and wraps them for the executor.
pub(crate) fn repack_layer(
    params: &Params,
    bits: u32,
    groups: WeightGroups,
    act_order: bool,
    h: usize,
    i: usize,
) -> Result<(Vec<MarlinWeights>, Vec<MarlinWeights>), LayerError> {
    // Marlin's config spells the grouping as vLLM's optional group size.
    let group_size = groups.group_size();
    match params.scale_dtype {
        Some(DType::F16) => run::<f16>(params, bits, group_size, act_order, h, i, |s| {
            ScaleValues::F16(s)
        }),
        Some(DType::BF16) | None => run::<bf16>(params, bits, group_size, act_order, h, i, |s| {
            ScaleValues::Bf16(s)
        }),
        Some(other) => Err(LayerError::ParamDtype {
            tensor: "weight_scale".into(),
            expected: "bf16 or f16 (Marlin keeps 16-bit scales)".into(),
            actual: format!("{other:?}"),
        }),
    }
}

fn run<S: Scale16 + FromF32>(
    params: &Params,
    bits: u32,
    group_size: Option<usize>,
    act_order: bool,
    h: usize,
    i: usize,
    values: impl Fn(&[S]) -> ScaleValues<'_>,
) -> Result<(Vec<MarlinWeights>, Vec<MarlinWeights>), LayerError> {
    let e = params.w2.len() / (h * i);
    let act_order = act_order && group_size.is_some();
    let config = Wna16Config {
        num_experts: e,
        hidden_size: h,
        intermediate_size: i,
        num_bits: bits,
        group_size,
        act_order,
        input_dtype: ActDtype::Bits16,
        scale_rule: ScaleRule::Kernel,
    };
    let g13 = gptq_projection::<S>(params, Proj::W13, e, 2 * i, h, bits, act_order)?;
    let g2 = gptq_projection::<S>(params, Proj::W2, e, h, i, bits, act_order)?;
    let MarlinMoeWeights { w13, w2 } =
        process_wna16_moe(&config, g13.tensor(), g2.tensor(), Par::Rayon)?;
    let wrap = |t: &MarlinTensor<S>| -> Result<Vec<MarlinWeights>, LayerError> {
        let MarlinScales::Plain(scales) = &t.scales else {
            return Err(LayerError::InvalidArgument {
                field: "quant",
                reason: "16-bit activations keep plain scales".into(),
            });
        };
        let (k, n, g) = (t.size_k, t.size_n, t.num_groups);
        let words = t.qweight.len() / e;
        (0..e)
            .map(|x| {
                Ok(MarlinWeights::new(MarlinWeightsDesc {
                    size_k: k,
                    size_n: n,
                    num_bits: bits,
                    is_a_8bit: false,
                    group_size,
                    qweight: &t.qweight[x * words..][..words],
                    scales: values(&scales[x * g * n..][..g * n]),
                    scale_layout: ScaleLayout::for_kernel(g, false),
                    sort_indices: expert_rows(&t.sort_indices, x, k),
                    g_idx_sorted: expert_rows(&t.g_idx_sorted, x, k),
                    fp8_preprocessed: false,
                })?)
            })
            .collect()
    };
    Ok((wrap(&w13)?, wrap(&w2)?))
}

impl<S> GptqProjection<S> {
    fn tensor(&self) -> Wna16Tensor<'_, S> {
        Wna16Tensor {
            qweight: &self.qweight,
            scales: &self.scales,
            g_idx: &self.g_idx,
            sort_indices: None,
            bias: None,
        }
    }
}

/// Expert `x`'s `k` values of a per-expert array, or nothing when the array is empty.
fn expert_rows(v: &[u32], x: usize, k: usize) -> &[u32] {
    if v.is_empty() { &[] } else { &v[x * k..][..k] }
}

/// Which projection.
#[derive(Clone, Copy)]
enum Proj {
    W13,
    W2,
}

/// GPTQ tensors of one projection (`n × k` per expert in the parameters, codes signed):
/// `qweight [E, K/pf, N]` of codes offset to unsigned, scales `[E, G, N]`, `g_idx [E, K]`.
fn gptq_projection<S: FromF32>(
    params: &Params,
    proj: Proj,
    e: usize,
    n: usize,
    k: usize,
    bits: u32,
    act_order: bool,
) -> Result<GptqProjection<S>, LayerError> {
    let (codes, scales, g_idx) = match proj {
        Proj::W13 => (&params.w13, &params.w13_scale, &params.w13_g_idx),
        Proj::W2 => (&params.w2, &params.w2_scale, &params.w2_g_idx),
    };
    let offset: i16 = if bits == 4 { 8 } else { 128 };
    let groups = scales.len() / (e * n);
    let mut qweight = Vec::new();
    let mut kn = vec![0u8; k * n];
    for x in 0..e {
        let c = &codes[x * n * k..][..n * k];
        for row in 0..n {
            for col in 0..k {
                kn[col * n + row] = (i16::from(c[row * k + col]) + offset) as u8;
            }
        }
        qweight.extend(pack_gptq(&kn, k, n, bits)?);
    }
    let mut gn = Vec::with_capacity(e * groups * n);
    for x in 0..e {
        let s = &scales[x * n * groups..][..n * groups];
        for gi in 0..groups {
            gn.extend((0..n).map(|row| S::from_f32_exact(s[row * groups + gi])));
        }
    }
    let g_idx = if act_order {
        g_idx
            .iter()
            .map(|&g| u32::try_from(g).unwrap_or(u32::MAX))
            .collect()
    } else {
        Vec::new()
    };
    Ok(GptqProjection {
        qweight,
        scales: gn,
        g_idx,
    })
}

/// Narrowing of scales that were loaded from this dtype (so the conversion is exact).
trait FromF32: Copy {
    fn from_f32_exact(v: f32) -> Self;
}

impl FromF32 for bf16 {
    fn from_f32_exact(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl FromF32 for f16 {
    fn from_f32_exact(v: f32) -> Self {
        f16::from_f32(v)
    }
}
