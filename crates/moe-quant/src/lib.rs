//! The moe-rs quantization vocabulary and scalar quantization math.
//!
//! This crate is the bottom layer of moe-rs: it knows what a quantization scheme *is* and how
//! a single value or row is quantized, and nothing about kernels, routing or layers.
//!
//! Vocabulary (spec sections 6.1, 7.1):
//! - [`dtype`]: tensor element types and their PyTorch spellings.
//! - [`scalar_type`]: logical number formats (`int4`, `uint4b8`, `float8_e4m3fn`, ...).
//! - [`group_shape`], [`quant_key`]: vLLM's `GroupShape`, `ScaleDesc`, `QuantKey` and named keys.
//! - [`weight_groups`]: the scale grouping of a quantized weight (channelwise or groups of `g`),
//!   parsed once from a checkpoint's `group_size` and carried to the oracle and the kernels.
//! - [`ct_args`]: the compressed-tensors `quantization_config` of a checkpoint.
//!
//! Math (spec sections 4.2, 4.3, 5.1, 5.3, 6.2):
//! - [`act`]: dynamic per-row int8 quantization of activations, asymmetric (W4A8) and
//!   symmetric per token (W8A8).
//! - [`int8`]: per-row symmetric int8 weight quantization, bit-exact with vLLM's
//!   `Int8OnlineMoEMethod`.
//! - [`int4`]: symmetric int4 group (or channelwise) weight quantization and dequantization.
//! - [`pack`]: compressed-tensors `pack_to_int32` and the kernels' nibble-pair byte order, with
//!   inverses.
//! - [`half_conv`]: f32 ↔ bf16/f16 conversion with round-to-nearest-even.
//!
//! Errors: [`QuantError`], the crate's one error type.
#![forbid(unsafe_code)]

pub mod act;
pub mod ct_args;
pub mod dtype;
pub mod error;
pub mod group_shape;
pub mod half_conv;
pub mod int4;
pub mod int8;
pub mod pack;
pub mod quant_key;
pub mod scalar_type;
pub mod weight_groups;

pub use act::{AsymRowQuant, quantize_row_asym_i8, quantize_row_sym_i8};
pub use ct_args::{QuantizationArgs, QuantizationConfig, QuantizationScheme};
pub use dtype::DType;
pub use error::QuantError;
pub use group_shape::GroupShape;
pub use half_conv::ModelFloat;
pub use int4::{Int4Grouped, dequantize_int4_grouped, quantize_int4_grouped};
pub use int8::{Int8PerRow, dequantize_int8_per_row, quantize_int8_per_row};
pub use pack::{pack_int4_pairs, pack_to_int32, unpack_from_int32, unpack_int4_pairs};
pub use quant_key::{QuantKey, ScaleDesc};
pub use scalar_type::ScalarType;
pub use weight_groups::WeightGroups;
