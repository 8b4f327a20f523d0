//! The f32 reference the demo checks the quantized pipeline against: the same MoE (SiLU
//! experts, concatenated gate/up, router-weighted sum) on the dequantized int4 weights, with
//! unquantized activations and f64 dot products, for a few tokens.
//!
//! The difference to the pipeline is therefore the activation quantization (int8 per token)
//! and summation order: about 1–2 % relative L2 error is expected for W4A8.

use moe_quant::dequantize_int4_grouped;

use super::CliError;
use super::synth::ExpertQuant;

/// The tokens the reference covers and their routing.
#[derive(Debug, Clone, Copy)]
pub struct RefTokens<'a> {
    /// Hidden states `[R, H]`.
    pub x: &'a [f32],
    /// Expert ids `[R, k]`.
    pub ids: &'a [i32],
    /// Experts per token k.
    pub top_k: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    /// Int4 group size.
    pub group_size: usize,
}

/// One expert's outputs `y[H]` for the (token, slot) pairs routed to it, as `(t·k + j, y)`.
pub type Contributions = Vec<(usize, Vec<f32>)>;

/// The outputs of expert `q.expert` for every reference pair routed to it (nothing, and no
/// dequantization, when none is).
pub fn expert_contributions(
    tokens: &RefTokens<'_>,
    q: &ExpertQuant<'_>,
) -> Result<Contributions, CliError> {
    let pairs: Vec<usize> = tokens
        .ids
        .iter()
        .enumerate()
        .filter(|&(_, &id)| usize::try_from(id).is_ok_and(|id| id == q.expert))
        .map(|(p, _)| p)
        .collect();
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let (h, i, g) = (tokens.hidden, tokens.intermediate, Some(tokens.group_size));
    let dequant = |what, codes, scales, rows, cols| {
        dequantize_int4_grouped(codes, scales, rows, cols, g)
            .map_err(|e| CliError::context(format!("dequantizing {what}"), e))
    };
    let w13 = dequant("w13", q.w13_codes, q.w13_scales, 2 * i, h)?;
    let w2 = dequant("w2", q.w2_codes, q.w2_scales, h, i)?;
    Ok(pairs
        .into_iter()
        .map(|p| {
            let t = p / tokens.top_k;
            let x = &tokens.x[t * h..(t + 1) * h];
            let gate_up: Vec<f64> = w13.chunks_exact(h).map(|row| dot(row, x)).collect();
            let (gate, up) = gate_up.split_at(i);
            let a: Vec<f32> = gate
                .iter()
                .zip(up)
                .map(|(&g, &u)| (g / (1.0 + (-g).exp()) * u) as f32)
                .collect();
            let y = w2.chunks_exact(i).map(|row| dot(row, &a) as f32).collect();
            (p, y)
        })
        .collect())
}

/// `Σ a·b` in f64.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum()
}

/// The layer output `[R, H]`: per token, the router-weighted sum of its experts' outputs.
pub fn combine(
    tokens: usize,
    top_k: usize,
    hidden: usize,
    weights: &[f32],
    contributions: Vec<Contributions>,
) -> Vec<f32> {
    let mut acc = vec![0.0f64; tokens * hidden];
    for (p, y) in contributions.into_iter().flatten() {
        let t = p / top_k;
        let w = f64::from(weights[p]);
        for (o, &v) in acc[t * hidden..(t + 1) * hidden].iter_mut().zip(&y) {
            *o += w * f64::from(v);
        }
    }
    acc.into_iter().map(|v| v as f32).collect()
}

/// How far `got` is from `want`: relative L2 error `‖got − want‖ / ‖want‖` and the largest
/// absolute difference.
pub fn compare(got: &[f32], want: &[f32]) -> (f64, f64) {
    let (mut diff2, mut norm2, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    for (&a, &b) in got.iter().zip(want) {
        let d = f64::from(a) - f64::from(b);
        diff2 += d * d;
        norm2 += f64::from(b) * f64::from(b);
        max_abs = max_abs.max(d.abs());
    }
    let rel = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    (rel, max_abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reports_relative_and_absolute_error() {
        let (rel, max) = compare(&[1.0, 2.0, 2.0], &[1.0, 2.0, 3.0]);
        assert!((rel - 1.0 / 14f64.sqrt()).abs() < 1e-12);
        assert_eq!(max, 1.0);
    }

    #[test]
    fn combine_weights_each_slot() {
        let out = combine(
            1,
            2,
            2,
            &[0.25, 0.75],
            vec![vec![(0, vec![4.0, 0.0])], vec![(1, vec![0.0, 4.0])]],
        );
        assert_eq!(out, vec![1.0, 3.0]);
    }
}
