//! The oracle's view of this machine (a [`Platform`] built from the rungs moe-kernels can run
//! under the `MOE_KERNELS_MAX_ISA` cap, minus the kernels `MOE_DISABLED_KERNELS` names) and its
//! answer for a W4A8 layer shape.

use moe_oracle::{
    DisabledKernels, MoEActivation, MoeConfig, MoeShape, ParallelConfig, Platform,
    RoutingMethodType, SelectOptions, Selection, select_w4a8_int8_moe_backend, w4a8_weight_key,
};
use moe_quant::{DType, WeightGroups};

use super::CliError;

/// This machine as the oracle sees it: the available rungs the cap allows.
pub fn platform() -> Platform {
    Platform::detect()
}

/// Native moe-rs kernels, minus those `MOE_DISABLED_KERNELS` names.
pub fn select_options() -> SelectOptions {
    SelectOptions::native().with_disabled(DisabledKernels::from_env())
}

/// The oracle's choice (native mode) for a W4A8 layer with SiLU experts and renormalized
/// softmax routing, for weights of the given scale grouping.
pub fn select_w4a8(shape: MoeShape, groups: WeightGroups) -> Result<Selection, CliError> {
    let config = MoeConfig::new(
        shape,
        MoEActivation::Silu,
        RoutingMethodType::Renormalize,
        DType::BF16,
        ParallelConfig::no_parallel(),
    )
    .map_err(|e| CliError::context("layer configuration", e))?;
    let key = w4a8_weight_key(groups);
    select_w4a8_int8_moe_backend(&config, Some(&key), None, &platform(), &select_options())
        .map_err(|e| CliError(format!("no backend serves this layer: {}", e.detailed())))
}
