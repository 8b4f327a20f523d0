//! Marlin: vLLM's GPU weight layout for WNA16 MoE experts, produced and consumed on the CPU
//! (spec `marlin.md`).
//!
//! - [`layout`]: the four tile layouts as one closed form (which code each bit field holds).
//! - [`repack`](mod@repack): GPTQ words → Marlin words, bit-exact with vLLM's CUDA op, batched over experts,
//!   parallel over tile bands; and the inverse for tests.
//! - [`perm`]: the scale, bias and zero-point column permutations.
//! - [`preprocess`]: the FP8-activation code remap and ×512, the INT8-activation i16 scales and
//!   global scale, and act-order's stable argsort with its checks.
//! - [`postprocess`]: vLLM's whole WNA16 post-processing step, in its order, refusing what
//!   the kernels cannot run.
//! - [`exec`]: a CPU executor over Marlin-format weights (W4A16 / W8A16, f32 accumulation).
//!
//! Pure safe Rust with no architecture-specific code: it builds and runs the same on every target.

pub mod error;
pub mod exec;
pub mod layout;
pub mod perm;
pub mod postprocess;
pub mod preprocess;
pub mod repack;

pub use error::MarlinError;
pub use exec::{MarlinAct, MarlinWeights, MarlinWeightsDesc, ScaleValues};
pub use layout::{MarlinLayout, TILE_CODES, WeightBits, check_tile_shape};
pub use perm::{ScaleLayout, marlin_zero_points, permute_bias, permute_scales};
pub use postprocess::{
    ActDtype, MarlinMoeWeights, MarlinScales, MarlinTensor, ScaleRule, Wna16Config, Wna16Tensor,
    check_act_support, groups_for, process_wna16_moe,
};
pub use preprocess::{
    Scale16, check_g_idx, check_perm_sorts, fp8_remap_int4, fp8_scale_x512, fp8_unmap_code,
    int8_act_scales, stable_argsort,
};
pub use repack::{RepackSpec, pack_gptq, repack, repack_experts, unpack, unpack_codes};
