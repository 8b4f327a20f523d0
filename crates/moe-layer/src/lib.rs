//! The MoE layer of moe-rs: everything between a model checkpoint and the kernels.
//!
//! Today this crate holds the checkpoint reader ([`checkpoint`], behind the default
//! `checkpoint` feature): `config.json` and safetensors shards of a Hugging Face model
//! directory become per-layer expert weights in the fused `w13` / `w2` layout, with router
//! weights, tensor-parallel slicing and expert-parallel filtering. [`layer`] holds the layer
//! lifecycle (create → load → process → apply, spec section 7.8): [`MoeLayer`].
//!
//! Errors: [`LayerError`], the crate's one error type.
//!
//! # Example
//!
//! A W4A8 layer of 4 experts built from tensors in memory (a runtime that already holds its
//! weights), then applied to 3 tokens. With a model directory on disk,
//! `MoeLayer::from_checkpoint` does the create, load and process steps in one call.
//!
//! ```
//! use half::bf16;
//! use moe_layer::{
//!     ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind, TensorView,
//!     WeightGroups,
//! };
//! use moe_router::Logits;
//!
//! let (e, k, h, i, g) = (4, 2, 64, 32, 32);
//! let group_size = WeightGroups::groups(g).expect("a positive group size");
//! let quant = LayerQuant::W4A8 { group_size };
//! let cfg = MoeLayerConfig::new(e, k, h, i, quant);
//! let mut layer = MoeLayer::create(cfg)?;
//! for expert in 0..e {
//!     for (shard, rows, cols) in [(ExpertShard::W1, i, h), (ExpertShard::W3, i, h), (ExpertShard::W2, h, i)] {
//!         let codes: Vec<i8> = (0..rows * cols).map(|j| ((j + expert) % 16) as i8 - 8).collect();
//!         let scales = vec![bf16::from_f32(0.02); rows * cols / g];
//!         let weight = TensorView { name: "w", shape: &[rows, cols], data: TensorData::I8(&codes) };
//!         layer.load_expert_tensor(expert, shard, TensorKind::Weight, &weight)?;
//!         let scale = TensorView { name: "s", shape: &[rows, cols / g], data: TensorData::Bf16(&scales) };
//!         layer.load_expert_tensor(expert, shard, TensorKind::Scale, &scale)?;
//!     }
//! }
//! layer.process()?;
//!
//! let t = 3;
//! let x: Vec<f32> = (0..t * h).map(|j| (j as f32 * 0.1).cos()).collect();
//! let logits: Vec<f32> = (0..t * e).map(|j| (j % 5) as f32).collect();
//! let mut out = vec![0f32; t * h];
//! layer.apply(&x, Logits::F32(&logits), &mut out)?;
//! assert!(out.iter().any(|v| *v != 0.0));
//! # Ok::<(), moe_layer::LayerError>(())
//! ```
//!
//! The crate denies `unsafe` code; the single exception, memory-mapping a shard, is explained
//! in [`checkpoint`]'s module docs.
#![deny(unsafe_code)]

#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod error;
pub mod layer;

pub use error::LayerError;
pub use layer::{
    BackendInfo, ExpertShard, Fp8Scaling, LayerQuant, MoeLayer, MoeLayerConfig, SharedExperts,
    TensorData, TensorKind, TensorView, Wna16Activations,
};
#[cfg(feature = "checkpoint")]
pub use layer::{LoadOptions, LoadProgress};
/// How `apply` spreads work over threads (re-exported from moe-kernels); see
/// [`MoeLayer::set_parallelism`].
pub use moe_kernels::Par;
/// The numerics of W4A8 calls with many rows per expert (re-exported from moe-kernels); see
/// [`MoeLayerConfig::w4a8_prefill`].
pub use moe_kernels::W4A8Prefill;
pub use moe_oracle::DisabledKernels;
/// The scale grouping [`LayerQuant`]'s integer schemes carry (re-exported from moe-quant).
pub use moe_quant::WeightGroups;
