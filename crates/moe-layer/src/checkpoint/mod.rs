//! Loading MoE expert weights from a Hugging Face model directory (`config.json` plus
//! safetensors shards), in the fused `w13` / `w2` layout the kernels take (spec sections 1, 6).
//!
//! The path from files to tensors, one module per step:
//!
//! 1. [`config`]: `config.json` → [`MoeModelSpec`] (family, layers, experts, sizes, routing,
//!    activation, [`QuantScheme`]). Unsupported families and schemes are refused here.
//! 2. [`shards`]: `model.safetensors` or `model.safetensors.index.json` → [`TensorSource`],
//!    which finds a tensor by name across shards with validated headers.
//! 3. [`names`]: the tensor names of each family and their mapping to (expert, shard, kind).
//! 4. `formats` (private): one projection decoded from its storage format (float,
//!    compressed-tensors `int-quantized` / `pack-quantized`, GPTQ) into a logical `[n, k]` form.
//!    FP8 block-quantized projections are read by `fp8` (private) into e4m3 codes and block
//!    scales, which the layer packs without a detour through the fused logical layout.
//! 5. [`read`]: [`Checkpoint::read_layer`] fuses the projections into [`MoeLayerTensors`],
//!    sliced for tensor parallelism and filtered by an expert map.
//!
//! Every failure is a [`LayerError`](crate::LayerError) naming the file and, for tensors, the
//! tensor; nothing half-loaded is returned.
//!
//! # Unsafe code
//!
//! moe-layer is `#![deny(unsafe_code)]` rather than `forbid`, for exactly one function:
//! `shards::map_file`, which memory-maps a shard with `memmap2::Mmap::map` under
//! `#[allow(unsafe_code)]`. Mapping is only used when the caller picks [`ShardAccess::Mmap`];
//! the default, [`ShardAccess::Read`], reads shards with `std::fs::read`. A mapped file must not
//! be truncated or rewritten while the [`TensorSource`] lives (the pages would change under
//! validated headers, or fault); checkpoints are immutable inputs, so that hazard is accepted
//! for the memory it saves on multi-gigabyte shards.

pub mod config;
mod decode;
mod formats;
mod fp8;
pub mod names;
pub mod read;
pub mod shards;

pub use config::{
    Fp8Source, ModelFamily, MoeModelSpec, QuantScheme, RoutingSpec, SharedExpertSpec,
};
pub use decode::FloatData;
pub use fp8::Fp8LayerInfo;
pub use names::{ExpertParam, MoeNames, ParamKind, ShardId};
pub use read::{
    ActOrder, Checkpoint, ExpertTensors, IntExperts, MoeLayerTensors, Mxfp4Experts, ReadOptions,
    RouterTensors, SharedExpertTensors, StoredExperts, ZeroPoints,
};
pub use shards::{Dtype, ShardAccess, TensorRef, TensorSource};

pub(crate) use formats::WordProj;
pub(crate) use fp8::{Fp8Expert, Fp8Group};
pub(crate) use read::{ExpertWords, Mxfp4Proj};
