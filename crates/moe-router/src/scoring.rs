//! Scores for every expert of one token (softmax, sigmoid or sqrt-softplus of the logits), the
//! selection values built from them, and the renormalisation of the chosen weights: the pieces
//! shared by the scored and grouped top-k paths.

use crate::method::ScoringFunc;
use crate::precision::{Rounding, sigmoid, softmax_into, sqrt_softplus};

/// Writes the f32 score of every expert of `logits` into `scores`.
pub(crate) fn score_into(logits: &[f32], scoring: ScoringFunc, scores: &mut [f32]) {
    match scoring {
        ScoringFunc::Softmax => softmax_into(logits, scores),
        ScoringFunc::Sigmoid => {
            for (s, &x) in scores.iter_mut().zip(logits) {
                *s = sigmoid(x);
            }
        }
        ScoringFunc::SqrtSoftplus => {
            for (s, &x) in scores.iter_mut().zip(logits) {
                *s = sqrt_softplus(x);
            }
        }
    }
}

/// Writes the selection value of every expert: the score (rounded when the profile says so)
/// plus the correction bias when there is one. The bias never reaches the weights.
pub(crate) fn selection_into(
    scores: &[f32],
    bias: Option<&[f32]>,
    rounding: Rounding,
    selection: &mut [f32],
) {
    let point = rounding.scores_for_selection;
    match bias {
        Some(bias) => {
            for ((sel, &s), &b) in selection.iter_mut().zip(scores).zip(bias) {
                *sel = rounding.at(point, s) + b;
            }
        }
        None => {
            for (sel, &s) in selection.iter_mut().zip(scores) {
                *sel = rounding.at(point, s);
            }
        }
    }
}

/// Gathers the (unbiased) scores of the chosen experts as weights.
pub(crate) fn gather_weights(scores: &[f32], ids: &[u32], rounding: Rounding, weights: &mut [f32]) {
    for (w, &id) in weights.iter_mut().zip(ids) {
        *w = rounding.at(rounding.scores_for_weights, scores[id as usize]);
    }
}

/// Divides the weights by their sum.
///
/// A zero sum (every chosen sigmoid score underflowed) leaves the weights as they are, like the
/// CUDA kernel's `sum > 0 ? sum : 1` guard, instead of vLLM's CPU grouped path, which would
/// produce NaN.
pub(crate) fn renormalize(weights: &mut [f32], rounding: Rounding) {
    let sum = rounding.at(rounding.renorm_sum, weights.iter().sum::<f32>());
    if sum > 0.0 {
        for w in weights.iter_mut() {
            *w = rounding.at(rounding.weight_ops, *w / sum);
        }
    }
}
