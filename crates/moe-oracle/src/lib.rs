//! Backend selection for MoE layers: which kernel serves a configuration, and if none, why not.
//!
//! This crate reproduces vLLM's fused-MoE oracles (spec sections 7.6 and 7.7; seeds 000, 002,
//! 003): per quantization [`Family`] a priority list of [`Backend`]s, each backed by kernel
//! candidates ([`KernelId`]) whose support hooks return `Result<(), Unsupported>` with vLLM's
//! reason text. [`select_backend`] walks the list and returns a [`Selection`] (backend plus the
//! kernel and the ISA rung it will run on) or an [`OracleError`] that carries every candidate's
//! refusal.
//!
//! Two rule sets ([`Strictness`]):
//! - [`Strictness::VllmCompat`]: the candidates are vLLM's classes (`CPUExpertsInt4`,
//!   `CPUExpertsInt8`, `ArmCPUExpertsInt8`, `MarlinExperts`, ...) with vLLM's exact acceptance
//!   sets and messages, so tests can pin upstream behaviour.
//! - [`Strictness::Native`]: the candidates are moe-rs kernels. Where vLLM refuses a
//!   configuration only because its kernel is Arm-only, lacks expert parallelism or knows
//!   fewer activations and routing methods, ours accept it when our kernel supports it
//!   (the list is in [`kernels`]). Differences in the user-facing mapping: `moe_backend="cpu"`
//!   is accepted for int8 (vLLM's int8 mapping lacks it) and for WNA16 (vLLM's WNA16 oracle
//!   ignores `moe_backend`); GPU-only backends (TRITON, HUMMING, BATCHED_MARLIN) have no
//!   moe-rs kernel and are refused with that reason.
//!
//! The crate calls no kernel and detects nothing: the caller passes a [`Platform`] built from
//! the rungs moe-kernels reports, and a [`DisabledKernels`] deny-list (read from
//! `MOE_DISABLED_KERNELS` by [`DisabledKernels::from_env`] when the caller wants it).
//!
//! Modules, bottom-up, each referring only to modules before it in this list (by `use`, by
//! path, by doc link, or by calling a method that a module adds to a type of a lower one; the
//! `oracle_layers` test of xtask checks the list): [`unsupported`] (one kernel's refusal),
//! [`routing`], [`kernel_id`] (kernel names), [`backend`] (families and backends), [`error`],
//! [`activation`], [`platform`], [`quant_config`] (keys and `make_*_quant_config` helpers),
//! [`config`] (parallel and layer configuration), [`priority`] (priority lists and user backend
//! names), [`query`] (what a check reads), [`kernels`] (the hooks), [`support`] (the check
//! order), [`disabled`], [`select`].
#![forbid(unsafe_code)]

pub mod activation;
pub mod backend;
pub mod config;
pub mod disabled;
pub mod error;
pub mod kernel_id;
pub mod kernels;
pub mod platform;
pub mod priority;
pub mod quant_config;
pub mod query;
pub mod routing;
pub mod select;
pub mod support;
pub mod unsupported;

pub use activation::MoEActivation;
pub use backend::{Backend, Family, Strictness};
pub use config::{
    ExpertPlacement, MoeConfig, MoeShape, ParallelConfig, ParallelRequest, determine_expert_map,
};
pub use disabled::DisabledKernels;
pub use error::{OracleError, Refusal};
pub use kernel_id::{Kernel, KernelId};
pub use platform::{CpuArch, Gpu, Isa, Platform};
pub use priority::{map_backend, priority_backends};
pub use quant_config::{
    DescDtype, Int8ActScales, MoeQuantConfig, QuantDesc, ScalarQuantKey, WeightKey,
    make_int8_moe_quant_config, make_unquantized_moe_quant_config, make_w4a8_int8_moe_quant_config,
    make_wna16_moe_quant_config, mxfp4_weight_key, w4a8_weight_key, wna16_weight_key,
};
pub use query::{ActivationFormat, SupportQuery};
pub use routing::{MOE_ROUTER_METHODS, RoutingMethodType, ScoringFunc, VLLM_CPU_METHODS};
pub use select::{
    SelectOptions, Selection, check_w4a8_experts_monolithic, select_backend,
    select_fp8_moe_backend, select_int8_moe_backend, select_unquantized_moe_backend,
    select_w4a8_int8_moe_backend, select_wna16_moe_backend,
};
pub use support::is_supported_config;
pub use unsupported::Unsupported;
