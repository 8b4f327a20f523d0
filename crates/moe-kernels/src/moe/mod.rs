//! The fused expert pipeline (spec §4.1): routed tokens in, the MoE layer's expert sum out, on
//! packed W4A8 or W8A8 weights.
//!
//! - [`FusedMoe`] owns a layer's packed experts ([`PackedExperts`]) and its
//!   [`FusedMoeConfig`] (sizes, [`Activation`], [`GateUpLayout`], router-weight placement,
//!   expert map); everything is validated once in [`FusedMoe::new`].
//! - [`FusedMoe::apply`] takes `&self` (thread-safe) plus a caller-owned [`MoeScratch`], sized
//!   up front, so the hot path allocates nothing.
//! - Rounding for 16-bit inputs follows the upstream op sequence of each format (`numerics`).

mod activation;
mod bucket;
mod exp;
mod experts;
mod fused;
mod numerics;
mod scratch;

#[cfg(test)]
mod tests;

pub use activation::{Activation, GateUpLayout, Int4ActivationKind};
pub use experts::{ExpertMatrix, WeightFormat};
pub use fused::{FusedMoe, FusedMoeConfig, MoeInput, PackedExperts};
pub use numerics::{ExpertId, MoeFloat};
pub use scratch::{MoeScratch, MoeScratchDims, StageTimes};
