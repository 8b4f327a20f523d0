//! vLLM's CPU softmax top-k (`cpu_router._softmax_topk`, spec §2.2): select on the raw logits,
//! then weight by a softmax over the chosen logits (renormalised) or by `exp(v - logsumexp)`.
//!
//! In f32 (the default profile) both weights use the max-subtracted form: softmax of the k chosen
//! logits, or `exp(v - max) / Σ exp(x - max)` over all experts. Under the eager PyTorch profile
//! with 16-bit logits the op chain PyTorch runs on the logits dtype is reproduced, each result
//! rounded to that dtype: `softmax` is one op (computed in f32, rounded once); `logsumexp` is
//! `max`, `x - max`, `exp`, `sum` (f32 accumulation, rounded once), `log`, `+ max`; and the
//! weight is `exp(v - lse)`. That chain matches vLLM 0.32 on PyTorch 2.13 bit for bit.

use crate::precision::{Rounding, softmax_into};
use crate::topk;

/// Routes one token: `ids` and `values` receive the chosen experts and their logits, `weights`
/// their weights. All three have length `top_k`.
pub(crate) fn route(
    logits: &[f32],
    renormalize: bool,
    rounding: Rounding,
    values: &mut [f32],
    ids: &mut [u32],
    weights: &mut [f32],
) {
    topk::select(logits, values, ids);
    if renormalize {
        softmax_into(values, weights);
        if rounding.is_active() {
            for w in weights.iter_mut() {
                *w = rounding.dtype.round(*w);
            }
        }
        return;
    }
    // The largest logit is the first chosen one.
    let max = values[0];
    if rounding.is_active() {
        let d = rounding.dtype;
        let sum: f32 = logits
            .iter()
            .map(|&x| d.round(d.round(x - max).exp()))
            .sum();
        let lse = d.round(d.round(d.round(sum).ln()) + max);
        for (w, &v) in weights.iter_mut().zip(values.iter()) {
            *w = d.round(d.round(v - lse).exp());
        }
    } else {
        let sum: f32 = logits.iter().map(|&x| (x - max).exp()).sum();
        for (w, &v) in weights.iter_mut().zip(values.iter()) {
            *w = (v - max).exp() / sum;
        }
    }
}
