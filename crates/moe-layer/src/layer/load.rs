//! Loading: the `load_*` methods that write checkpoint tensors and router parameters into a
//! layer that is still loading, with their argument checks. Every load first checks the
//! layer's state: a processed or unusable layer refuses it and stays as it was. Any other
//! failed load leaves the layer unusable.

use moe_kernels::PackedDense;
use moe_router::Router;

use super::fp8;
use super::params::Params;
use super::{ExpertShard, LayerQuant, MoeLayer, MoeLayerConfig, State, TensorKind, TensorView};
use crate::LayerError;

impl MoeLayer {
    /// Runs a load step on a layer that is still loading. A processed or unusable layer
    /// refuses it ([`LayerError::AlreadyProcessed`], [`LayerError::Unusable`]) and stays as it
    /// was; any failure of `step` leaves the layer unusable.
    fn load_step<T>(
        &mut self,
        step: impl FnOnce(&mut Self) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        self.params_ref()?;
        let result = step(self);
        self.unusable_on_err(result)
    }

    /// Runs a load step on the parameters; as [`Self::load_step`].
    pub(super) fn guarded<T>(
        &mut self,
        step: impl FnOnce(&MoeLayerConfig, &mut Params) -> Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        self.load_step(|layer| {
            let cfg = layer.cfg.clone();
            step(&cfg, layer.params_mut()?)
        })
    }

    /// Passes `result` through; an error leaves the layer unusable (a half-loaded layer must
    /// never compute).
    pub(super) fn unusable_on_err<T>(
        &mut self,
        result: Result<T, LayerError>,
    ) -> Result<T, LayerError> {
        if let Err(e) = &result {
            self.state = State::Unusable(e.to_string());
        }
        result
    }

    /// Loads one whole checkpoint tensor of global expert `expert` (vLLM's `weight_loader`,
    /// spec 6.3): experts of other ranks are skipped; `w1`/`w3` keep rows
    /// `[r·I, (r+1)·I)` and land in rows `0..I` / `I..2I` of `w13`; `w2` keeps columns
    /// `[r·I, (r+1)·I)` (group scales `[r·I/g, (r+1)·I/g)`, channelwise scales whole).
    /// Weights are i8 codes (int4 values for W4A8); scales f32, bf16 or f16. A wrong shape,
    /// dtype or value is a typed error naming the tensor, and leaves the layer unusable.
    pub fn load_expert_tensor(
        &mut self,
        expert: usize,
        shard: ExpertShard,
        kind: TensorKind,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        self.guarded(|cfg, p| {
            if matches!(cfg.quant, LayerQuant::Fp8 { .. }) {
                return Err(fp8::not_by_name(view.name));
            }
            p.load_expert_tensor(cfg, expert, shard, kind, view)
        })
    }

    /// Loads one whole checkpoint tensor of the shared experts (the fused shared MLP as one
    /// expert: `w1`/`w3` `[I_shared, H]`, `w2` `[H, I_shared]`, sliced for tensor parallelism
    /// like the routed experts). A processed or unusable layer refuses it and stays as it
    /// was; a layer without shared experts, or a bad tensor, is left unusable.
    pub fn load_shared_expert_tensor(
        &mut self,
        shard: ExpertShard,
        kind: TensorKind,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        self.load_step(|layer| match layer.shared.as_mut() {
            Some(shared) => shared.load_expert_tensor(0, shard, kind, view),
            None => Err(LayerError::InvalidArgument {
                field: "shared_experts",
                reason: format!("{}: the layer has no shared experts", view.name),
            }),
        })
    }

    /// Sets the sigmoid gate of gated shared experts (Qwen2-MoE `shared_expert_gate` `[1, H]`).
    /// A processed or unusable layer refuses it and stays as it was; a layer without gated
    /// shared experts, a wrong size or a non-finite value leaves the layer unusable.
    pub fn load_shared_expert_gate(&mut self, weight: &[f32]) -> Result<(), LayerError> {
        self.load_step(|layer| {
            layer.check_shared_gate(weight)?;
            layer.shared_gate = Some(weight.to_vec());
            Ok(())
        })
    }

    fn check_shared_gate(&self, weight: &[f32]) -> Result<(), LayerError> {
        if !self.cfg.shared_experts.is_some_and(|s| s.gated) {
            return Err(LayerError::InvalidArgument {
                field: "shared_expert_gate",
                reason: "the layer has no gated shared experts".into(),
            });
        }
        check_values(
            "shared_expert_gate.weight",
            weight,
            &[1, self.cfg.hidden],
            "gate weights must be finite",
        )
    }

    /// Sets the router's gate weight `[E, H]` (used by [`Self::route_hidden`]). A processed or
    /// unusable layer refuses it, as it refuses every load, and stays as it was; a wrong size
    /// or a non-finite value leaves the layer unusable, like any failed load.
    pub fn load_router_weight(&mut self, weight: &[f32]) -> Result<(), LayerError> {
        self.load_step(|layer| {
            layer.check_router_weight(weight)?;
            let (e, h) = (layer.cfg.num_experts, layer.cfg.hidden);
            layer.router_weight = Some(PackedDense::pack_f32(e, h, weight)?);
            Ok(())
        })
    }

    /// Sets the router linear's bias `[E]` (gpt-oss), added to the logits
    /// [`Self::route_hidden`] computes. A processed or unusable layer refuses it and stays as
    /// it was; a wrong size, a non-finite value or a layer whose config says its router has no
    /// bias leaves the layer unusable.
    pub fn load_router_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        self.load_step(|layer| {
            layer.check_router_bias(bias)?;
            layer.router_bias = Some(bias.to_vec());
            Ok(())
        })
    }

    fn check_router_bias(&self, bias: &[f32]) -> Result<(), LayerError> {
        if !self.cfg.router_has_bias {
            return Err(LayerError::InvalidArgument {
                field: "router.bias",
                reason: "the layer's router has no bias (router_has_bias is false)".into(),
            });
        }
        check_values(
            "router.bias",
            bias,
            &[self.cfg.num_experts],
            "router biases must be finite",
        )
    }

    /// Sets the router's `e_score_correction_bias` `[E]` (DeepSeek-V3 style grouped routing;
    /// it steers selection only). A processed or unusable layer refuses it and stays as it
    /// was; a wrong size or a non-finite value leaves the layer unusable.
    pub fn load_router_correction_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        self.load_step(|layer| layer.install_correction_bias(bias))
    }

    fn install_correction_bias(&mut self, bias: &[f32]) -> Result<(), LayerError> {
        check_values(
            "router.e_score_correction_bias",
            bias,
            &[self.cfg.num_experts],
            "the correction bias must be finite",
        )?;
        let router_cfg = self.cfg.router.clone().with_correction_bias(bias.to_vec());
        self.router = Router::new(router_cfg.clone())?;
        self.cfg.router = router_cfg;
        self.cfg.router_bias_pending = false;
        Ok(())
    }

    fn check_router_weight(&self, weight: &[f32]) -> Result<(), LayerError> {
        check_values(
            "router.weight",
            weight,
            &[self.cfg.num_experts, self.cfg.hidden],
            "router weights must be finite",
        )
    }
}

/// Checks a router-side parameter (gate weight, biases, shared-expert gate): `shape`'s element
/// count, then that every value is finite; errors name `tensor`.
fn check_values(
    tensor: &str,
    values: &[f32],
    shape: &[usize],
    reason: &'static str,
) -> Result<(), LayerError> {
    if values.len() != shape.iter().product::<usize>() {
        return Err(LayerError::ParamShape {
            tensor: tensor.into(),
            expected: shape.to_vec(),
            actual: vec![values.len()],
        });
    }
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(LayerError::ParamValue {
            tensor: tensor.into(),
            index,
            value: f64::from(values[index]),
            reason,
        });
    }
    Ok(())
}
