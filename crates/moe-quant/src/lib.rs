//! The moe-rs quantization vocabulary and scalar quantization math.
//!
//! This crate is the bottom layer of moe-rs: it knows what a quantization scheme *is* and how
//! a single value or row is quantized, and nothing about kernels, routing or layers.
//!
//! - [`act`]: dynamic per-row int8 quantization of activations, asymmetric (W4A8, spec 4.2(a))
//!   and symmetric per token (W8A8, spec 5.3).
//! - [`half_conv`]: f32 ↔ bf16/f16 conversion with round-to-nearest-even.
//! - [`dtype`]: tensor element types and their PyTorch spellings.
//! - [`error`]: [`QuantError`], the crate's one error type.
#![forbid(unsafe_code)]

pub mod act;
pub mod dtype;
pub mod error;
pub mod half_conv;

pub use act::{AsymRowQuant, quantize_row_asym_i8, quantize_row_sym_i8};
pub use dtype::DType;
pub use error::QuantError;
pub use half_conv::ModelFloat;
