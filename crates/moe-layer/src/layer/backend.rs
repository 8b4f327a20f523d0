//! Choosing the kernel for a processed layer through moe-oracle (native rules), on the ISA
//! rungs moe-kernels reports for this machine (`Platform::detect`, within
//! `MOE_KERNELS_MAX_ISA`).

use moe_kernels::KernelSet;
use moe_oracle::{
    DisabledKernels, MoEActivation, MoeConfig, MoeShape, ParallelConfig, ParallelRequest, Platform,
    SelectOptions, Selection, mxfp4_weight_key, select_fp8_moe_backend, select_int8_moe_backend,
    select_unquantized_moe_backend, select_w4a8_int8_moe_backend, select_wna16_moe_backend,
    w4a8_weight_key, wna16_weight_key,
};
use moe_router::Router;

use super::config::{LayerQuant, MoeLayerConfig};
use crate::LayerError;

/// Selects the backend for `cfg` and returns it with the kernel set of the chosen rung.
pub(crate) fn select(
    cfg: &MoeLayerConfig,
    router: &Router,
) -> Result<(Selection, KernelSet), LayerError> {
    let shape = MoeShape {
        num_experts: cfg.num_experts,
        experts_per_token: cfg.top_k,
        hidden_dim: cfg.hidden,
        intermediate_size: cfg.intermediate,
    };
    // The layer's own tensor and expert parallelism, both at once (the layer slices the
    // intermediate size and holds the experts of its map), which vLLM's flattening would
    // not produce: the oracle's checks read the sizes and ranks as they are.
    let parallel = ParallelConfig {
        ep_size: cfg.ep_size,
        ep_rank: cfg.ep_rank,
        use_ep: cfg.ep_size > 1,
        ..ParallelConfig::make(&ParallelRequest::tp(cfg.tp_size, cfg.tp_rank))?
    };
    let activation = match cfg.activation {
        moe_kernels::Activation::Silu { .. } => MoEActivation::Silu,
        moe_kernels::Activation::SwigluOai { .. } => MoEActivation::Swigluoai,
        moe_kernels::Activation::SwigluStep => MoEActivation::Swiglustep,
        moe_kernels::Activation::Gelu => MoEActivation::Gelu,
        moe_kernels::Activation::GeluTanh => MoEActivation::GeluTanh,
        _ => MoEActivation::Silu,
    };
    let config = MoeConfig::new(
        shape,
        activation,
        router.routing_method_type(),
        cfg.in_dtype,
        parallel,
    )?
    .with_routing_by_moe_router();
    let platform = Platform::detect();
    // The deny-list applies to every selection, as it does to `moe inspect`'s.
    let disabled = cfg
        .disabled_kernels
        .clone()
        .unwrap_or_else(DisabledKernels::from_env);
    let opts = SelectOptions::native().with_disabled(disabled);
    let selection = match cfg.quant {
        LayerQuant::W4A8 { group_size } => {
            let key = w4a8_weight_key(group_size);
            select_w4a8_int8_moe_backend(&config, Some(&key), None, &platform, &opts)?
        }
        LayerQuant::Int8Online | LayerQuant::W8A8 => {
            select_int8_moe_backend(&config, &platform, &opts)?
        }
        LayerQuant::Unquantized => select_unquantized_moe_backend(&config, &platform, &opts)?,
        // The caller traded the checkpoint's float activations for the int8 kernels: the W4A8
        // method's rules decide, as for a W4A8 checkpoint of the same grouping.
        LayerQuant::Wna16 { group_size, .. } if cfg.wna16_on_w4a8() => {
            let key = w4a8_weight_key(group_size);
            select_w4a8_int8_moe_backend(&config, Some(&key), None, &platform, &opts)?
        }
        LayerQuant::Wna16 { bits, .. } => {
            let key = wna16_weight_key(bits)?;
            select_wna16_moe_backend(&config, &key, &platform, &opts)?
        }
        LayerQuant::Mxfp4 => {
            select_wna16_moe_backend(&config, &mxfp4_weight_key(), &platform, &opts)?
        }
        LayerQuant::Fp8 { scaling } => {
            select_fp8_moe_backend(&scaling.weight_key(), &config, &platform, &opts)?
        }
    };
    let kernels = selection
        .kernel
        .isa
        .and_then(KernelSet::for_isa)
        .map(|ks| {
            let prefill = cfg
                .w4a8_prefill
                .unwrap_or_else(moe_kernels::w4a8_prefill_requested);
            ks.with_w4a8_prefill(prefill)
        })
        .unwrap_or(*moe_kernels::kernels());
    Ok((selection, kernels))
}
