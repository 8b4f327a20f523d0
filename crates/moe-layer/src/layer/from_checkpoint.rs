//! Building and loading a [`MoeLayer`] from a [`Checkpoint`]: the layer configuration derived
//! from the model's [`MoeModelSpec`], and the copy of the reader's [`MoeLayerTensors`] (already
//! fused, sliced for tensor parallelism and filtered by the expert map) into the parameters.

use moe_kernels::Activation;
use moe_quant::DType;

use super::MoeLayer;
use super::config::{LayerQuant, MoeLayerConfig, SharedExperts, router_from_spec};
use super::params::{Params, check_scale};
use crate::LayerError;
use crate::checkpoint::{
    Checkpoint, ExpertTensors, ExpertWeights, FloatData, MoeLayerTensors, MoeModelSpec,
    QuantScheme, ReadOptions,
};

impl MoeLayerConfig {
    /// The layer configuration of a model for one rank: sizes and routing from the spec,
    /// the router its routing calls for ([`router_from_spec`]), SiLU experts, unquantized or
    /// W4A8 / WNA16 weights, shared experts when the model has them. Refuses schemes and
    /// activations not supported here, rather than computing something else.
    pub fn from_spec(
        spec: &MoeModelSpec,
        tp_rank: usize,
        tp_size: usize,
        expert_map: Option<Vec<i32>>,
        max_tokens: usize,
    ) -> Result<Self, LayerError> {
        let quant = match &spec.quant {
            QuantScheme::CompressedTensorsW4A8 { group_size, .. } => LayerQuant::W4A8 {
                group_size: *group_size,
            },
            QuantScheme::Unquantized(_) => LayerQuant::Unquantized,
            QuantScheme::CompressedTensorsWna16 {
                bits,
                group_size,
                symmetric,
                ..
            } => LayerQuant::Wna16 {
                bits: *bits,
                group_size: *group_size,
                act_order: spec.quant.has_act_order(),
                zero_points: !*symmetric,
            },
            QuantScheme::Gptq {
                bits,
                group_size,
                desc_act,
                sym,
                ..
            } => LayerQuant::Wna16 {
                bits: *bits,
                group_size: *group_size,
                act_order: *desc_act,
                zero_points: !*sym,
            },
            QuantScheme::Awq { group_size } => LayerQuant::Wna16 {
                bits: 4,
                group_size: *group_size,
                act_order: false,
                zero_points: true,
            },
        };
        let activation = match spec.activation.as_str() {
            "silu" | "swiglu" => Activation::SILU,
            other => {
                return Err(LayerError::ConfigField {
                    file: spec.config_path.clone(),
                    field: "hidden_act",
                    reason: format!("activation {other:?} is not supported by the layer yet"),
                });
            }
        };
        let r = &spec.routing;
        let router = router_from_spec(r, spec.num_experts, spec.top_k).map_err(|reason| {
            LayerError::ConfigField {
                file: spec.config_path.clone(),
                field: "n_group / topk_group",
                reason,
            }
        })?;
        Ok(Self {
            num_experts: spec.num_experts,
            top_k: spec.top_k,
            hidden: spec.hidden,
            intermediate: spec.intermediate,
            tp_rank,
            tp_size,
            expert_map,
            activation,
            router,
            router_bias_pending: r.has_correction_bias,
            shared_experts: spec.shared_experts.map(|s| SharedExperts {
                intermediate: s.intermediate,
                gated: s.gated,
            }),
            quant,
            in_dtype: spec.dtype.unwrap_or(DType::BF16),
            max_tokens,
        })
    }
}

impl MoeLayer {
    /// Creates, loads and processes layer `layer` of `ckpt` on a single rank holding every
    /// expert, for calls of up to `max_tokens` tokens.
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        layer: usize,
        max_tokens: usize,
    ) -> Result<Self, LayerError> {
        let cfg = MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, max_tokens)?;
        // Read (and so validate against the files) before `create` allocates parameters sized
        // by `config.json`: a config declaring huge sizes must fail on the tensors, not abort
        // on an allocation.
        let opts = ReadOptions {
            shared_experts: cfg.shared_experts.is_some(),
            ..ReadOptions::single_rank()
        };
        let tensors = ckpt.read_layer(layer, &opts)?;
        let mut moe = Self::create(cfg)?;
        moe.load_layer_tensors(&tensors)?;
        moe.process()?;
        Ok(moe)
    }

    /// Loads every expert tensor and the router weight of `layer` from `ckpt`, through the
    /// checkpoint reader (which fuses, slices this rank's shard and skips other ranks'
    /// experts). A failure leaves the layer unusable.
    pub fn load_from_checkpoint(
        &mut self,
        ckpt: &Checkpoint,
        layer: usize,
    ) -> Result<(), LayerError> {
        let cfg = self.cfg.clone();
        let opts = ReadOptions {
            tp_rank: cfg.tp_rank,
            tp_size: cfg.tp_size,
            expert_map: cfg.expert_map.as_deref(),
            shared_experts: cfg.shared_experts.is_some(),
        };
        let tensors = match ckpt.read_layer(layer, &opts) {
            Ok(t) => t,
            Err(e) => {
                self.state = super::State::Unusable(e.to_string());
                return Err(e);
            }
        };
        self.load_layer_tensors(&tensors)
    }

    /// Loads a whole layer as the checkpoint reader returns it (see
    /// [`Self::load_from_checkpoint`]). A failure leaves the layer unusable.
    pub fn load_layer_tensors(&mut self, t: &MoeLayerTensors) -> Result<(), LayerError> {
        let router = t.router.weight.to_f32_vec();
        if let Err(e) = self.load_router_weight(&router) {
            self.state = super::State::Unusable(e.to_string());
            return Err(e);
        }
        if let Some(bias) = &t.router.correction_bias {
            self.load_router_correction_bias(bias)?;
        }
        if let (Some(sh), Some(layer)) = (&t.shared, self.shared.as_mut()) {
            let loaded = layer.guarded(|cfg, p| copy_experts(cfg, p, &sh.mlp, t.layer, &[0]));
            if let Err(e) = loaded {
                self.state = super::State::Unusable(e.to_string());
                return Err(e);
            }
            if let Some(gate) = &sh.gate {
                self.load_shared_expert_gate(&gate.to_f32_vec())?;
            }
        }
        self.guarded(|cfg, p| copy_experts(cfg, p, &t.experts, t.layer, &t.local_experts))
    }
}

/// Checks the reader's tensors of one expert group (the routed experts, or the shared MLP as
/// one expert) against the layer's shapes and copies them in.
fn copy_experts(
    cfg: &MoeLayerConfig,
    p: &mut Params,
    ex: &ExpertTensors,
    layer: usize,
    local_experts: &[usize],
) -> Result<(), LayerError> {
    let mismatch = |field: &'static str, expected: String, actual: String| {
        Err(LayerError::InvalidArgument {
            field,
            reason: format!("layer {layer}: expected {expected}, checkpoint has {actual}"),
        })
    };
    let local = cfg.local_experts();
    if local_experts != local {
        return mismatch(
            "local_experts",
            format!("{local:?}"),
            format!("{local_experts:?}"),
        );
    }
    let (h, i) = (cfg.hidden, cfg.intermediate_per_rank());
    if (ex.num_experts, ex.hidden, ex.intermediate) != (local.len(), h, i) {
        return mismatch(
            "experts",
            format!("[E {}, H {h}, I {i}]", local.len()),
            format!(
                "[E {}, H {}, I {}]",
                ex.num_experts, ex.hidden, ex.intermediate
            ),
        );
    }
    if ex.w13_bias.is_some() || ex.w2_bias.is_some() {
        return mismatch("bias", "no expert biases".into(), "biases".into());
    }
    if let ExpertWeights::Float { w13, w2 } = &ex.weights
        && cfg.quant.loads_float_weights()
    {
        if cfg.quant == LayerQuant::Int8Online && cfg.tp_size > 1 {
            // The w2 row scales need the amax of the whole row, which a sliced read lacks.
            return mismatch(
                "tp_size",
                "1 for online int8 from a checkpoint".into(),
                format!("{}", cfg.tp_size),
            );
        }
        return copy_float_experts(p, w13, w2);
    }
    let ExpertWeights::Int(q) = &ex.weights else {
        return mismatch(
            "weights",
            format!("weights for a {} layer", cfg.quant.name()),
            "float weights".into(),
        );
    };
    let (bits, group_size, act_order, zero_points) = match cfg.quant {
        LayerQuant::W4A8 { group_size } => (4, group_size, false, false),
        LayerQuant::Wna16 {
            bits,
            group_size,
            act_order,
            zero_points,
        } => (
            bits,
            group_size,
            act_order && group_size.is_some(),
            zero_points,
        ),
        _ => {
            return mismatch(
                "weights",
                format!("weights for a {} layer", cfg.quant.name()),
                "integer codes".into(),
            );
        }
    };
    if q.bits != bits
        || q.group_size != group_size
        || q.act_order.is_some() != act_order
        || q.zeros.is_some() != zero_points
    {
        return mismatch(
            "weights",
            format!(
                "int{bits}, group size {group_size:?}, act-order {act_order}, zero points \
                 {zero_points}"
            ),
            format!(
                "int{}, group size {:?}, act-order {}, zero points {}",
                q.bits,
                q.group_size,
                q.act_order.is_some(),
                q.zeros.is_some()
            ),
        );
    }
    if let Some(z) = &q.zeros {
        for (name, zeros, scales) in [
            ("w13_qzeros", &z.w13, p.w13_scale.len()),
            ("w2_qzeros", &z.w2, p.w2_scale.len()),
        ] {
            if zeros.len() != scales {
                return Err(LayerError::ParamShape {
                    tensor: name.into(),
                    expected: vec![scales],
                    actual: vec![zeros.len()],
                });
            }
            if let Some(index) = zeros.iter().position(|&v| u32::from(v) >> bits != 0) {
                return Err(LayerError::ParamValue {
                    tensor: name.into(),
                    index,
                    value: f64::from(zeros[index]),
                    reason: "zero points must lie in [0, 2^bits)",
                });
            }
        }
        p.w13_zeros = z.w13.clone();
        p.w2_zeros = z.w2.clone();
    }
    if let Some(ao) = &q.act_order {
        let e = local.len();
        if ao.w13_g_idx.len() != e * h || ao.w2_g_idx.len() != e * i {
            return Err(LayerError::ParamShape {
                tensor: "g_idx".into(),
                expected: vec![e * h, e * i],
                actual: vec![ao.w13_g_idx.len(), ao.w2_g_idx.len()],
            });
        }
        p.w13_g_idx = ao.w13_g_idx.clone();
        p.w2_g_idx = ao.w2_g_idx.clone();
    }
    p.scale_dtype = Some(q.scale_dtype);
    for (name, got, want) in [
        ("w13", q.w13.len(), p.w13.len()),
        ("w2", q.w2.len(), p.w2.len()),
        ("w13_weight_scale", q.w13_scales.len(), p.w13_scale.len()),
        ("w2_weight_scale", q.w2_scales.len(), p.w2_scale.len()),
    ] {
        if got != want {
            return Err(LayerError::ParamShape {
                tensor: name.into(),
                expected: vec![want],
                actual: vec![got],
            });
        }
    }
    for (name, s) in [
        ("w13_weight_scale", &q.w13_scales),
        ("w2_weight_scale", &q.w2_scales),
    ] {
        for (index, &v) in s.iter().enumerate() {
            check_scale(name, index, v, cfg.quant)?;
        }
    }
    p.w13.copy_from_slice(&q.w13);
    p.w2.copy_from_slice(&q.w2);
    p.w13_scale.copy_from_slice(&q.w13_scales);
    p.w2_scale.copy_from_slice(&q.w2_scales);
    p.mark_all_loaded();
    Ok(())
}

/// Copies float expert weights (already fused and sliced by the reader) into the parameters,
/// widened to f32, refusing non-finite values.
fn copy_float_experts(p: &mut Params, w13: &FloatData, w2: &FloatData) -> Result<(), LayerError> {
    if w13.dtype() != w2.dtype() {
        return Err(LayerError::ParamDtype {
            tensor: "w2".into(),
            expected: format!("{:?} (the dtype of w13)", w13.dtype()),
            actual: format!("{:?}", w2.dtype()),
        });
    }
    for (name, src, dst) in [("w13", w13, &mut p.w13_f), ("w2", w2, &mut p.w2_f)] {
        if src.len() != dst.len() {
            return Err(LayerError::ParamShape {
                tensor: name.into(),
                expected: vec![dst.len()],
                actual: vec![src.len()],
            });
        }
        for (index, (d, v)) in dst.iter_mut().zip(src.to_f32_vec()).enumerate() {
            if !v.is_finite() {
                return Err(LayerError::ParamValue {
                    tensor: name.into(),
                    index,
                    value: f64::from(v),
                    reason: "weights must be finite",
                });
            }
            *d = v;
        }
    }
    // The whole-row amax of w2 (only online int8 reads it; the read is unsharded here).
    let i = p.w2_f.len() / p.w2_amax.len().max(1);
    if i > 0 {
        for (amax, row) in p.w2_amax.iter_mut().zip(p.w2_f.chunks_exact(i)) {
            *amax = moe_quant::int8::row_amax(row);
        }
    }
    p.float_dtype = Some(w13.dtype());
    p.mark_all_loaded();
    Ok(())
}
