//! Llama4 routing (`Llama4MoE.custom_routing_function`, spec §2.6): top-k on the raw logits,
//! weight = sigmoid of the chosen logit in f32. Llama4 uses `k = 1` and multiplies the weight into
//! the token before the expert MLP (`apply_router_weight_on_input`).

use crate::precision::sigmoid;
use crate::topk;

/// Routes one token.
pub(crate) fn route(logits: &[f32], values: &mut [f32], ids: &mut [u32], weights: &mut [f32]) {
    topk::select(logits, values, ids);
    for (w, &v) in weights.iter_mut().zip(values.iter()) {
        *w = sigmoid(v);
    }
}
