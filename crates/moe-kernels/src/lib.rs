//! Int4×int8 (W4A8) and int8×int8 (W8A8) expert GEMMs with runtime ISA dispatch.
//!
//! How it fits together:
//!
//! - [`packed`]: our weight formats, built once at load time ([`PackedW4A8`], [`PackedW8A8`]);
//!   every shape and value is validated there, with typed [`KernelError`]s.
//! - [`Isa`] names the rungs of the ladder; the CPU tokens (module `x86` or `aarch64`, the
//!   build's architecture) prove a rung is usable; [`kernels`] picks the best rung once
//!   (capped by `MOE_KERNELS_MAX_ISA`) and returns a `&'static` [`KernelSet`] of function
//!   pointers.
//! - The GEMM driver ([`w4a8_gemm`], [`w8a8_gemm`] and their `_quantized` forms) quantises the
//!   activation rows, encodes them for the chosen kernel and splits the output channels over
//!   threads ([`Par`], from [`par`], which owns every split over the rayon pool); results do
//!   not depend on the thread count.
//! - [`moe`]: the fused expert pipeline ([`FusedMoe`]) on top of the GEMMs: bucketing by
//!   expert, gate/up GEMM, activation, down GEMM, gating and the ordered per-token sum.
//! - [`scalar`] is always compiled: the literal reference of spec §4.5 (the oracle) and the
//!   portable fallback kernels. Every SIMD rung reproduces it bit for bit.
//! - [`marlin`]: vLLM's Marlin weight layout on the CPU: the bit-exact repack and its inverse,
//!   the WNA16 post-processing with its checks, and an executor over Marlin-format weights.
//!
//! `unsafe` is confined to the kernels, the token constructors and the calls they justify.
//!
//! # Example
//!
//! One W4A8 GEMM on the best kernels of this CPU: int4 weights `[N, K]` with a bf16 scale per
//! group of 32 inputs, f32 activations `[M, K]`, f32 output `[M, N]`.
//!
//! ```
//! use half::bf16;
//! use moe_kernels::{GemmScratch, Par, PackedW4A8, W4A8Scales, kernels, w4a8_gemm};
//!
//! let (m, n, k, g) = (2, 8, 64, 32);
//! let codes: Vec<i8> = (0..n * k).map(|i| (i % 16) as i8 - 8).collect();
//! let scales = vec![bf16::from_f32(0.01); n * k / g];
//! let w = PackedW4A8::pack(
//!     n,
//!     k,
//!     &codes,
//!     W4A8Scales::Grouped { group_size: g, scales: &scales },
//!     None,
//! )
//! .unwrap();
//! let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
//! let mut out = vec![0f32; m * n];
//! let mut scratch = GemmScratch::new();
//! w4a8_gemm(kernels(), m, &x, &w, &mut out, &mut scratch, Par::Seq).unwrap();
//! assert!(out.iter().all(|v| v.is_finite()));
//! ```

#![deny(clippy::multiple_unsafe_ops_per_block)]

mod aligned;
mod dense;
mod dispatch;
mod error;
mod gemm;
mod isa;
pub mod marlin;
pub mod moe;
pub mod packed;
pub mod par;
pub mod probe;
pub mod scalar;
mod ukernel;
mod wna16;
mod wna16_i15;
mod wna16_tile;

#[cfg(target_arch = "aarch64")]
pub mod aarch64;
#[cfg(target_arch = "x86_64")]
pub mod x86;

#[cfg(target_arch = "aarch64")]
use aarch64 as arch;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod other_arch;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
use other_arch as arch;
#[cfg(target_arch = "x86_64")]
use x86 as arch;

pub use dense::{dense_gemm, dense_isa};
pub use dispatch::{
    KernelSet, W4A8_PREFILL_ENV, W4A8Prefill, available_isas, isa_cap, kernels, selected_isa,
    w4a8_prefill_requested,
};
pub use error::KernelError;
pub use gemm::{
    AsymQuantRows, GemmScratch, SymQuantRows, w4a8_gemm, w4a8_gemm_quantized, w8a8_gemm,
    w8a8_gemm_quantized,
};
pub use isa::{ALL_ISAS, Isa, IsaArch, IsaCap, MAX_ISA_ENV, UnknownIsa};
pub use marlin::MarlinError;
pub use moe::{
    Activation, FusedMoe, FusedMoeConfig, GateUpLayout, Int4ActivationKind, MoeInput, MoeScratch,
    MoeScratchDims, PackedExperts, StageTimes,
};
pub use packed::{
    AWQ_FIELD_OF_CHANNEL, E2M1_VALUES, FP8_BLOCK, Fp8Desc, Fp8Rows, Fp8Scales, Int4Values,
    Int8Values, Mxfp4Desc, PackedDense, PackedW4A8, PackedW8A8, PackedWna16, PanelOrder,
    W4A8Scales, Wna16Desc, Wna16Scales, Wna16WordsDesc, WordOrder, WordRows, e4m3_value,
};
pub use par::Par;
pub use wna16::{wna16_gemm, wna16_isa, wna16_reference};
pub use wna16_i15::wna16_i15_reference;

/// The CPU features this binary's architecture cares about, as `(name, detected)` pairs.
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    arch::feature_report()
}

#[cfg(test)]
mod tests;
