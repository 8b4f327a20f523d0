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
//! The crate denies `unsafe` code; the single exception, memory-mapping a shard, is explained
//! in [`checkpoint`]'s module docs.
#![deny(unsafe_code)]

#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod error;
pub mod layer;

pub use error::LayerError;
pub use layer::{
    BackendInfo, ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, SharedExperts, TensorData,
    TensorKind, TensorView,
};
