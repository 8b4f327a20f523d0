//! Grouped top-k, DeepSeek-V2/V3 style (spec §2.4): score every expert, rate each contiguous group
//! (its best selection value, or with a correction bias the sum of its two best), keep the best
//! `topk_group` groups, and select the top-k experts inside them.
//!
//! Experts of dropped groups are simply not offered to the selection, which is what vLLM's `−inf`
//! mask achieves; validation guarantees the kept groups hold at least `top_k` experts, so a
//! masked expert can never be chosen (the silent wrong result of spec §2.4 cannot happen).
//! Groups tie like experts do: the lower group index wins.

use crate::config::Grouping;
use crate::scored::{ScoreBuffers, ScoreParams};
use crate::scoring::{gather_weights, renormalize, score_into, selection_into};
use crate::topk::{self, TopK};

/// The per-token buffers for the groups.
pub(crate) struct GroupBuffers<'a> {
    /// Score of every group (`G`).
    pub scores: &'a mut [f32],
    /// Whether each group is kept (`G`).
    pub kept: &'a mut [bool],
    /// Scores of the kept groups (`Gk`).
    pub top_values: &'a mut [f32],
    /// Indices of the kept groups (`Gk`).
    pub top_ids: &'a mut [u32],
}

/// The sum of the two largest values of a group (the group score with a correction bias).
fn top2_sum(values: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in values {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    first + second
}

/// Routes one token.
pub(crate) fn route(
    logits: &[f32],
    p: ScoreParams<'_>,
    grouping: Grouping,
    buf: ScoreBuffers<'_>,
    groups: GroupBuffers<'_>,
) {
    score_into(logits, p.scoring, buf.scores);
    selection_into(buf.scores, p.bias, p.rounding, buf.selection);

    let group_size = logits.len() / grouping.num_groups;
    for (score, members) in groups
        .scores
        .iter_mut()
        .zip(buf.selection.chunks_exact(group_size))
    {
        *score = if p.bias.is_some() {
            top2_sum(members)
        } else {
            members.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        };
    }
    topk::select(groups.scores, groups.top_values, groups.top_ids);
    groups.kept.fill(false);
    for &g in groups.top_ids.iter() {
        groups.kept[g as usize] = true;
    }

    let top_k = buf.ids.len();
    let mut sel = TopK::new(buf.values, buf.ids);
    for (g, members) in buf.selection.chunks_exact(group_size).enumerate() {
        if groups.kept[g] {
            let first = g * group_size;
            for (j, &v) in members.iter().enumerate() {
                sel.offer(v, (first + j) as u32);
            }
        }
    }
    debug_assert_eq!(sel.len(), top_k);

    gather_weights(buf.scores, buf.ids, p.rounding, buf.weights);
    if p.renormalize {
        renormalize(buf.weights, p.rounding);
    }
}
