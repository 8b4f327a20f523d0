//! The hook for model-supplied routing functions (vLLM's `custom_routing_function`,
//! `RoutingMethodType::Custom`): the router widens the logits, calls the hook per token, and
//! checks what it returns before writing it out.

use std::fmt;

/// A routing function supplied by a model, called once per token.
///
/// The router checks every id the hook returns (in range, no duplicate within a token), applies
/// the configured routed scaling and expert map, and writes the caller's output buffers, so a
/// faulty hook yields a [`crate::RouterError`] rather than an out-of-range id.
pub trait CustomRouting: Send + Sync + fmt::Debug {
    /// Routes one token.
    ///
    /// `logits` holds the token's `num_experts` logits widened to f32. Write `top_k` weights into
    /// `weights` and the matching global expert ids into `ids` (both of length `top_k`).
    /// Return `Err(reason)` to abort routing with [`crate::RouterError::CustomRouting`].
    fn route_token(
        &self,
        logits: &[f32],
        weights: &mut [f32],
        ids: &mut [u32],
    ) -> Result<(), String>;
}
