//! Score-then-select top-k without groups (spec §2.2's generic `fused_topk` and §2.3's biased
//! top-k): score every expert, select on the scores plus the optional correction bias, weight by
//! the unbiased scores, optionally renormalise.
//!
//! This is also what SGLang's `biased_topk_cpu` kernel computes (sigmoid in f32, bias for
//! selection, ids in descending biased score).

use crate::method::ScoringFunc;
use crate::precision::Rounding;
use crate::scoring::{gather_weights, renormalize, score_into, selection_into};
use crate::topk;

/// The options of the scored paths, fixed for a routing call.
#[derive(Clone, Copy)]
pub(crate) struct ScoreParams<'a> {
    /// How logits become scores.
    pub scoring: ScoringFunc,
    /// The correction bias (selection only).
    pub bias: Option<&'a [f32]>,
    /// Whether the weights are renormalised.
    pub renormalize: bool,
    /// Where results round.
    pub rounding: Rounding,
}

/// The per-token buffers of the scored paths.
pub(crate) struct ScoreBuffers<'a> {
    /// Scores of every expert (`E`).
    pub scores: &'a mut [f32],
    /// Selection values of every expert (`E`).
    pub selection: &'a mut [f32],
    /// Selection values of the chosen experts (`k`).
    pub values: &'a mut [f32],
    /// The chosen experts (`k`).
    pub ids: &'a mut [u32],
    /// Their weights (`k`).
    pub weights: &'a mut [f32],
}

/// Routes one token.
pub(crate) fn route(logits: &[f32], p: ScoreParams<'_>, buf: ScoreBuffers<'_>) {
    score_into(logits, p.scoring, buf.scores);
    selection_into(buf.scores, p.bias, p.rounding, buf.selection);
    topk::select(buf.selection, buf.values, buf.ids);
    gather_weights(buf.scores, buf.ids, p.rounding, buf.weights);
    if p.renormalize {
        renormalize(buf.weights, p.rounding);
    }
}
