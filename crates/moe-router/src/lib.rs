//! MoE routing with vLLM parity: for each token, the `top_k` experts and f32 weights vLLM would
//! pick, written into caller buffers without allocating.
//!
//! # Algorithms (spec §2)
//!
//! | constructor | vLLM | selection | weights |
//! |---|---|---|---|
//! | [`RouterConfig::cpu_softmax`] | `cpu_router._softmax_topk` (CPU path) | raw logits | softmax over the chosen logits (renormalised) or `exp(v − logsumexp)` |
//! | [`RouterConfig::scored_topk`] | `fused_topk`, `fused_topk_bias`, `biased_topk_cpu` | scores (+ correction bias) | unbiased scores, optionally renormalised |
//! | [`RouterConfig::grouped_topk`] | `grouped_topk` / `cpu_router._grouped_topk` | best `topk_group` groups, then top-k inside | unbiased scores, optionally renormalised |
//! | [`RouterConfig::llama4`] | `Llama4MoE.custom_routing_function` | raw logits | sigmoid of the logit |
//! | [`RouterConfig::sparse_mixer`] | `phimoe_routing_function` (PhiMoE) | the largest logit, then the largest other | softmax at it over the logits within a relative `2ε` of it |
//! | [`RouterConfig::custom`] | `custom_routing_function` | the hook's | the hook's |
//!
//! Scores are softmax (max-subtracted, in f32), sigmoid or sqrt-softplus. The correction bias
//! only steers selection. The routed scaling factor multiplies the final weights or is left to
//! the caller ([`ScalingPlacement`]). [`RoutingMethodType`] is vLLM's label for a configuration.
//!
//! # Precision
//!
//! Logits are f32, bf16 or f16 ([`Logits`]); 16-bit logits are widened exactly and, by default,
//! everything is computed in f32 ([`RoundingProfile::F32`]). PyTorch computes an op on a 16-bit
//! tensor by widening to f32, computing in f32 and rounding the result; vLLM's CPU softmax path
//! runs every op on the logits dtype, so its weights carry bf16 precision.
//! [`RoundingProfile::TorchEager`] reproduces those roundings bit for bit and
//! [`RoundingProfile::TorchCompiled`] those of the compiled generic grouped top-k.
//!
//! # Ties, NaN, determinism
//!
//! Experts (and groups) are selected by larger value first and, among equal values, lower index
//! first; each row's ids come out in that order. vLLM's CPU `torch.topk` leaves both open.
//! NaN or infinite logits are rejected with [`RouterError::NonFiniteLogit`] naming the row and
//! expert (PyTorch would rank NaN above every number); routing never panics and never writes an
//! id outside `0..num_experts` (or, with an [`ExpertMap`], outside the local range or `-1`).
//!
//! # Expert parallelism
//!
//! With an [`ExpertMap`] (linear or round-robin placement) ids are written as this rank's local
//! ids and experts of other ranks as [`ExpertMap::NOT_LOCAL`] (`-1`), which the kernels skip.
//!
//! # Example
//!
//! ```
//! use moe_router::{IdsOut, Logits, Router, RouterConfig};
//!
//! // Two tokens, four experts, top-2 (vLLM's CPU softmax path), weights renormalized.
//! let router = Router::new(RouterConfig::cpu_softmax(4, 2).with_renormalize(true)).unwrap();
//! let logits = [0.1f32, 2.0, -1.0, 1.0, /* token 1 */ 3.0, 0.0, 0.0, 0.5];
//! let (mut weights, mut ids) = ([0f32; 4], [0i32; 4]);
//! let mut scratch = router.new_scratch();
//! let tokens = router
//!     .route_into(Logits::F32(&logits), &mut weights, IdsOut::I32(&mut ids), &mut scratch)
//!     .unwrap();
//! assert_eq!(tokens, 2);
//! assert_eq!(ids, [1, 3, 0, 3]);
//! assert!((weights[0] + weights[1] - 1.0).abs() < 1e-6);
//! ```

#![forbid(unsafe_code)]

mod config;
mod cpu_softmax;
mod custom;
mod error;
mod expert_map;
mod grouped;
mod io;
mod llama4;
mod method;
mod precision;
mod router;
mod scored;
mod scoring;
mod scratch;
mod sparse_mixer;
mod topk;

pub use config::{Algorithm, Grouping, RoutedScaling, RouterConfig, ScalingPlacement};
pub use custom::CustomRouting;
pub use error::RouterError;
pub use expert_map::{ExpertMap, ExpertPlacement};
pub use io::{IdsOut, Logits};
pub use method::{RoutingMethodType, ScoringFunc};
pub use precision::{LogitsDtype, RoundingProfile};
pub use router::Router;
pub use scratch::RouterScratch;
