//! `process` for WNA16 layers on the native kernels: the loaded signed codes and scales are
//! packed per expert into [`PackedWna16`] (4-bit codes offset by 8, the `uint4b8` zero, 8-bit
//! ones by 128, `uint8b128`; scales in the dtype the checkpoint stored them in).
//!
//! Asymmetric checkpoints (GPTQ `sym: false`, AWQ) load their codes the same way, signed as
//! `q − 2^(bits−1)`, so the offset restores the stored unsigned `q`; their zero points go to
//! the packed matrix as they are, and the kernels compute `(q − z)·s`.
//!
//! Checkpoints that store their codes in int32 words (compressed-tensors `pack-quantized` and
//! GPTQ, int4 or int8, act-order or not; AWQ) are packed on the streamed load by
//! `pack_expert_words` straight from those words: int4 words along K in activation order are
//! already the packed layout's step words and are copied, the others go through a
//! cache-sized tile per panel of 16 channels; the result is the same packed matrix.
//!
//! Act-order checkpoints give every input row a group (`g_idx`) in any order. Packing sorts the
//! input rows by group once (stable, so rows of a group keep their order), which makes every
//! group a contiguous run of K values again; the packed matrix keeps the permutation and the
//! GEMM gathers each activation row into that order. The sorted groups must each hold exactly
//! `group_size` rows (the last one the remainder), as GPTQ's act-order produces.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use moe_kernels::{Mxfp4Desc, PackedWna16, Par, Wna16Desc, Wna16Scales};
use moe_quant::{DType, WeightGroups};

use super::params::Params;
use crate::LayerError;
use moe_kernels::par;

/// One projection's tensors, as the packer reads them.
struct Projection<'a> {
    name: &'static str,
    codes: &'a [i8],
    scales: &'a [f32],
    zeros: Option<&'a [u8]>,
    g_idx: &'a [i32],
    n: usize,
    k: usize,
}

/// What the packer needs to know about a layer besides its parameters.
pub(crate) struct LayerShape {
    pub(crate) bits: u32,
    pub(crate) group_size: WeightGroups,
    pub(crate) act_order: bool,
    pub(crate) zero_points: bool,
    pub(crate) h: usize,
    pub(crate) i: usize,
}

/// Packs both projections of every local expert, experts spread over threads as `par` allows
/// (each expert is packed the same either way, and the first failing expert is reported).
pub(crate) fn pack_layer(
    params: &Params,
    shape: &LayerShape,
    par: Par,
) -> Result<(Vec<PackedWna16>, Vec<PackedWna16>), LayerError> {
    let &LayerShape {
        bits,
        group_size,
        act_order,
        zero_points,
        h,
        i,
    } = shape;
    let dtype = params.scale_dtype.unwrap_or(DType::BF16);
    if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
        return Err(LayerError::ParamDtype {
            tensor: "weight_scale".into(),
            expected: "f16, bf16 or f32".into(),
            actual: format!("{dtype:?}"),
        });
    }
    let e = params.w2.len() / (h * i);
    let act_order = act_order && !group_size.is_channelwise();
    if zero_points {
        // Zero points come with a checkpoint load only; without them the weights are not known.
        for (name, zeros, scales) in [
            ("w13_qzeros", &params.w13_zeros, &params.w13_scale),
            ("w2_qzeros", &params.w2_zeros, &params.w2_scale),
        ] {
            if zeros.len() != scales.len() {
                return Err(LayerError::ParamShape {
                    tensor: name.into(),
                    expected: vec![scales.len()],
                    actual: vec![zeros.len()],
                });
            }
        }
    }
    let w13 = Projection {
        name: "w13_weight",
        codes: &params.w13,
        scales: &params.w13_scale,
        zeros: zero_points.then_some(params.w13_zeros.as_slice()),
        g_idx: &params.w13_g_idx,
        n: 2 * i,
        k: h,
    };
    let w2 = Projection {
        name: "w2_weight",
        codes: &params.w2,
        scales: &params.w2_scale,
        zeros: zero_points.then_some(params.w2_zeros.as_slice()),
        g_idx: &params.w2_g_idx,
        n: h,
        k: i,
    };
    let experts = par::map_indexed(e, par, |x| {
        let a = pack_expert(&w13, x, bits, group_size, act_order, dtype)?;
        let b = pack_expert(&w2, x, bits, group_size, act_order, dtype)?;
        Ok((a, b))
    });
    // The whole-layer order of errors: every w13 before any w2.
    if experts.iter().any(Result::is_err) {
        for (x, r) in experts.iter().enumerate() {
            if r.is_err() {
                pack_expert(&w13, x, bits, group_size, act_order, dtype)?;
            }
        }
    }
    experts
        .into_iter()
        .collect::<Result<Vec<_>, LayerError>>()
        .map(|v| v.into_iter().unzip())
}

/// Packs expert `x` of one projection.
fn pack_expert(
    p: &Projection<'_>,
    x: usize,
    bits: u32,
    group_size: WeightGroups,
    act_order: bool,
    dtype: DType,
) -> Result<PackedWna16, LayerError> {
    let (n, k) = (p.n, p.k);
    let groups = group_size.group_size().map_or(1, |g| k.div_ceil(g));
    let codes = &p.codes[x * n * k..][..n * k];
    let scales = &p.scales[x * n * groups..][..n * groups];
    let zeros = p.zeros.map(|z| &z[x * n * groups..][..n * groups]);
    let perm = match group_size.group_size() {
        Some(gs) if act_order => Some(sort_by_group(p, x, gs, groups)?),
        _ => None,
    };
    let offset: i16 = if bits == 4 { 8 } else { 128 };
    let max = 2 * offset - 1;
    let mut unsigned = vec![0u8; n * k];
    // Without a permutation every code moves to the same place: a branch-free pass (which
    // vectorises) does the common all-valid case; a bad code is found and named by the loop
    // below.
    let all_valid = perm.is_none() && {
        let mut ok = true;
        for (d, &c) in unsigned.iter_mut().zip(codes) {
            let code = i16::from(c) + offset;
            ok &= (0..=max).contains(&code);
            *d = code as u8;
        }
        ok
    };
    for row in (0..n).filter(|_| !all_valid) {
        let src = &codes[row * k..][..k];
        let dst = &mut unsigned[row * k..][..k];
        for (j, d) in dst.iter_mut().enumerate() {
            let col = perm.as_ref().map_or(j, |perm| perm[j] as usize);
            let code = i16::from(src[col]) + offset;
            if !(0..=max).contains(&code) {
                return Err(LayerError::ParamValue {
                    tensor: p.name.into(),
                    index: (x * n + row) * k + col,
                    value: f64::from(src[col]),
                    reason: "codes must lie in [-2^(bits-1), 2^(bits-1))",
                });
            }
            *d = code as u8;
        }
    }
    // The scales were loaded from `dtype`, so narrowing them back is exact.
    let (s16, sb16);
    let scales = match dtype {
        DType::F16 => {
            s16 = narrowed::<f16>(&[scales]);
            Wna16Scales::F16(&s16)
        }
        DType::BF16 => {
            sb16 = narrowed::<bf16>(&[scales]);
            Wna16Scales::Bf16(&sb16)
        }
        _ => Wna16Scales::F32(scales),
    };
    Ok(PackedWna16::pack(Wna16Desc {
        n,
        k,
        bits,
        codes: &unsigned,
        group_size,
        scales,
        zeros,
        bias: None,
        perm: perm.as_deref(),
    })?)
}

/// Packs one expert read as words (compressed-tensors `pack-quantized`, GPTQ, AWQ; int4 or
/// int8; act-order or not): the matrices [`pack_expert`] builds from the same expert's codes,
/// after the same scale and `g_idx` checks, but gathered from the checkpoint's words instead
/// of through one byte per code.
#[cfg(feature = "checkpoint")]
pub(crate) fn pack_expert_words(
    ex: &crate::checkpoint::ExpertWords<'_>,
    quant: super::config::LayerQuant,
) -> Result<(PackedWna16, PackedWna16), LayerError> {
    let super::config::LayerQuant::Wna16 {
        bits,
        group_size,
        act_order,
        ..
    } = quant
    else {
        return Err(LayerError::InvalidArgument {
            field: "quant",
            reason: "only WNA16 experts are packed from words".into(),
        });
    };
    let [w1, w3] = &ex.w13;
    // Scales read from f16 or bf16 are finite and non-negative (the reader checked) and stay
    // finite in bf16, so `check_scales` can only refuse f32 ones.
    if ex.scale_dtype == DType::F32 {
        for (name, parts) in [
            ("w13_weight_scale", &[w1, w3][..]),
            ("w2_weight_scale", &[&ex.w2][..]),
        ] {
            let mut first = 0;
            for part in parts {
                super::params::check_scales(name, first, &part.scales.values, quant)?;
                first += part.scales.values.len();
            }
        }
    }
    // Act-order: one permutation per matrix (gate and up share theirs, the reader checked),
    // as the whole-layer road sorts them; channelwise scales need none.
    let perm = |name: &str, p: &crate::checkpoint::WordProj<'_>| match (
        group_size.group_size(),
        act_order,
    ) {
        (Some(gs), true) => {
            let g_idx = p.g_idx.as_deref().ok_or(LayerError::MissingParams {
                missing: vec![format!("{name}_g_idx")],
            })?;
            group_order(name, g_idx, 0, gs, p.k.div_ceil(gs)).map(Some)
        }
        _ => Ok(None),
    };
    let (perm13, perm2) = (perm("w13_weight", w1)?, perm("w2_weight", &ex.w2)?);
    let w13 = pack_words(
        &[w1, w3],
        bits,
        ex.scale_dtype,
        group_size,
        perm13.as_deref(),
    )?;
    let w2 = pack_words(
        &[&ex.w2],
        bits,
        ex.scale_dtype,
        group_size,
        perm2.as_deref(),
    )?;
    Ok((w13, w2))
}

/// Packs the projections `parts`, stacked along N, as one matrix.
#[cfg(feature = "checkpoint")]
fn pack_words(
    parts: &[&crate::checkpoint::WordProj<'_>],
    bits: u32,
    dtype: DType,
    group_size: WeightGroups,
    perm: Option<&[u32]>,
) -> Result<PackedWna16, LayerError> {
    use moe_kernels::{Wna16WordsDesc, WordRows};
    let (Some(first), n) = (parts.first(), parts.iter().map(|p| p.n).sum()) else {
        return Err(LayerError::InvalidArgument {
            field: "parts",
            reason: "no projection to pack".into(),
        });
    };
    if let Some(p) = parts
        .iter()
        .find(|p| p.bits != bits || p.order != first.order)
    {
        return Err(LayerError::InvalidArgument {
            field: "bits",
            reason: format!(
                "{}: {}-bit {:?} words, expected {bits}-bit {:?}",
                p.scale_tensor.name, p.bits, p.order, first.order
            ),
        });
    }
    let rows: Vec<WordRows<'_>> = parts
        .iter()
        .map(|p| WordRows {
            channels: p.n,
            bytes: p.bytes,
        })
        .collect();
    let values: Vec<&[f32]> = parts.iter().map(|p| &p.scales.values[..]).collect();
    // The scales were read from `dtype`, so narrowing them back is exact.
    let (s16, sb16, s32);
    let scales = match dtype {
        DType::F16 => {
            s16 = narrowed::<f16>(&values);
            Wna16Scales::F16(&s16)
        }
        DType::BF16 => {
            sb16 = narrowed::<bf16>(&values);
            Wna16Scales::Bf16(&sb16)
        }
        DType::F32 => {
            s32 = values.concat();
            Wna16Scales::F32(&s32)
        }
        other => {
            return Err(LayerError::ParamDtype {
                tensor: "weight_scale".into(),
                expected: "f16, bf16 or f32".into(),
                actual: format!("{other:?}"),
            });
        }
    };
    let zeros = parts
        .iter()
        .map(|p| p.zeros.as_deref())
        .collect::<Option<Vec<_>>>()
        .map(|z| z.concat());
    Ok(PackedWna16::pack_words(Wna16WordsDesc {
        n,
        k: first.k,
        bits,
        order: first.order,
        rows: &rows,
        group_size,
        scales,
        zeros: zeros.as_deref(),
        bias: None,
        perm,
    })?)
}

/// The input rows of expert `x` sorted by group (stable); refuses a `g_idx` whose groups are
/// not `group_size` rows each.
fn sort_by_group(
    p: &Projection<'_>,
    x: usize,
    gs: usize,
    groups: usize,
) -> Result<Vec<u32>, LayerError> {
    let k = p.k;
    let g_idx = p
        .g_idx
        .get(x * k..(x + 1) * k)
        .ok_or(LayerError::ParamShape {
            tensor: format!("{}_g_idx", p.name),
            expected: vec![k],
            actual: vec![p.g_idx.len().saturating_sub(x * k)],
        })?;
    group_order(p.name, g_idx, x * k, gs, groups)
}

/// The K values of one matrix sorted by their group `g_idx[k]` (stable, so rows of a group
/// keep their order); refuses a group index outside `0..groups` and groups that are not
/// `gs` rows each (the last one the remainder). `at` is the flat index of `g_idx[0]` in the
/// parameter `{name}_g_idx`, for errors.
fn group_order(
    name: &str,
    g_idx: &[i32],
    at: usize,
    gs: usize,
    groups: usize,
) -> Result<Vec<u32>, LayerError> {
    let k = g_idx.len();
    let mut counts = vec![0usize; groups];
    for (index, &g) in g_idx.iter().enumerate() {
        match usize::try_from(g).ok().filter(|&g| g < groups) {
            Some(g) => counts[g] += 1,
            None => {
                return Err(LayerError::ParamValue {
                    tensor: format!("{name}_g_idx"),
                    index: at + index,
                    value: f64::from(g),
                    reason: "group index outside 0..K/group_size",
                });
            }
        }
    }
    if let Some(g) = (0..groups).find(|&g| counts[g] != gs.min(k.saturating_sub(g * gs))) {
        return Err(LayerError::ParamValue {
            tensor: format!("{name}_g_idx"),
            index: at,
            value: g as f64,
            reason: "act-order groups must each hold group_size input rows",
        });
    }
    // A counting sort: each group's rows start where the groups before it end.
    let mut next: Vec<usize> = (0..groups).map(|g| g * gs).collect();
    let mut perm = vec![0u32; k];
    for (row, &g) in g_idx.iter().enumerate() {
        let slot = &mut next[g as usize];
        perm[*slot] = row as u32;
        *slot += 1;
    }
    Ok(perm)
}

/// Packs both projections of every local expert of an MXFP4 layer from the checkpoint's bytes
/// (`PackedWna16::pack_mxfp4`: blocks gathered as int4 steps, e8m0 scales kept as bytes), experts
/// spread over threads as `par` allows. `w13` keeps the checkpoint's interleaved gate/up rows.
/// The reader has checked every length and refused e8m0 255, so an error here is one the
/// kernels' packer found in bytes a caller put together otherwise.
pub(crate) fn pack_mxfp4_layer(
    params: &Params,
    h: usize,
    i: usize,
    par: Par,
) -> Result<(Vec<PackedWna16>, Vec<PackedWna16>), LayerError> {
    let mx = &params.mx;
    let (hb, ib) = (
        h.div_ceil(moe_kernels::packed::wna16::MXFP4_BLOCK),
        i.div_ceil(moe_kernels::packed::wna16::MXFP4_BLOCK),
    );
    let e = mx.w2_scales.len() / (h * ib).max(1);
    let experts = par::map_indexed(e, par, |x| {
        let w13 = PackedWna16::pack_mxfp4(Mxfp4Desc {
            n: 2 * i,
            k: h,
            blocks: &mx.w13_blocks[x * 2 * i * hb * 16..][..2 * i * hb * 16],
            scales: &mx.w13_scales[x * 2 * i * hb..][..2 * i * hb],
            bias: None,
        })?;
        let w2 = PackedWna16::pack_mxfp4(Mxfp4Desc {
            n: h,
            k: i,
            blocks: &mx.w2_blocks[x * h * ib * 16..][..h * ib * 16],
            scales: &mx.w2_scales[x * h * ib..][..h * ib],
            bias: None,
        })?;
        Ok::<_, LayerError>((w13, w2))
    });
    experts
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map(|v| v.into_iter().unzip())
}

/// The f32 values of `runs`, one after the other, narrowed to `H` eight at a time where the CPU
/// converts halves in vectors (round to nearest even, exact for values read from `H`).
fn narrowed<H: Copy + Default>(runs: &[&[f32]]) -> Vec<H>
where
    [H]: HalfFloatSliceExt,
{
    let mut out = vec![H::default(); runs.iter().map(|r| r.len()).sum()];
    let mut rest = &mut out[..];
    for run in runs {
        let (head, tail) = rest.split_at_mut(run.len());
        head.convert_from_f32_slice(run);
        rest = tail;
    }
    out
}
