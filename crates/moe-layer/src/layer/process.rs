//! Processing: `process` checks that every parameter was loaded, packs the experts for the
//! kernels of their format, asks moe-oracle for the backend and readies the scratch pool.

use half::bf16;
use moe_kernels::{
    FusedMoe, FusedMoeConfig, PackedDense, PackedExperts, PackedW4A8, PackedW8A8, PanelOrder, Par,
    W4A8Scales, par,
};
use moe_oracle::Selection;
use moe_quant::{DType, WeightGroups};

use super::params::Params;
use super::scratch::{CallScratch, ScratchPool};
use super::{Experts, LayerQuant, MoeLayer, Ready, State};
use super::{backend, fp8, marlin, online, wna16};
use crate::LayerError;

impl MoeLayer {
    /// Checks that every parameter was loaded, packs the experts for the W4A8 kernels (bf16
    /// group scales) or quantizes them per row for the W8A8 kernels (online int8), selects the
    /// backend through moe-oracle, frees the unpacked tensors and readies the scratch pool.
    /// Idempotent; a failure leaves the layer unusable.
    pub fn process(&mut self) -> Result<(), LayerError> {
        let params = match std::mem::replace(
            &mut self.state,
            State::Unusable("process did not finish".into()),
        ) {
            State::Loading(p) => p,
            ready @ State::Ready(_) => {
                self.state = ready;
                return Ok(());
            }
            State::Unusable(reason) => {
                self.state = State::Unusable(reason.clone());
                return Err(LayerError::Unusable { reason });
            }
        };
        let built = self.process_shared().and_then(|()| self.build(&params));
        let ready = self.unusable_on_err(built)?;
        self.state = State::Ready(Box::new(ready));
        Ok(())
    }

    /// Processes the shared experts' layer; their missing tensors are named under
    /// `shared_experts.`.
    pub(super) fn process_shared(&mut self) -> Result<(), LayerError> {
        let Some(shared) = self.shared.as_mut() else {
            return Ok(());
        };
        let mut missing = Vec::new();
        if self.cfg.shared_experts.is_some_and(|s| s.gated) && self.shared_gate.is_none() {
            missing.push("shared_expert_gate.weight".to_string());
        }
        match shared.process() {
            Ok(()) => {}
            Err(LayerError::MissingParams { missing: m }) => {
                missing.extend(m.into_iter().map(|name| format!("shared_experts.{name}")));
            }
            Err(e) => return Err(e),
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(LayerError::MissingParams { missing })
        }
    }

    fn build(&self, params: &Params) -> Result<Ready, LayerError> {
        let mut missing = params.missing();
        if self.cfg.router_bias_pending {
            missing.push("router.e_score_correction_bias".into());
        }
        if self.cfg.router_has_bias && self.router_bias.is_none() {
            missing.push("router.bias".into());
        }
        if !missing.is_empty() {
            return Err(LayerError::MissingParams { missing });
        }
        let cfg = &self.cfg;
        let (h, i) = (cfg.hidden, cfg.intermediate_per_rank());
        let (selection, kernels) = backend::select(cfg, &self.router)?;
        let moe_cfg = self.fused_config();
        let (b13, b2) = params.expert_biases(cfg.tp_rank);
        let moe = match cfg.quant {
            LayerQuant::W4A8 { group_size } => {
                let (w13, w2) =
                    pack_w4a8(params, group_size, h, i, self.par, kernels.panel_order())?;
                Experts::W4A8(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Int8Online => {
                let (w13, w2) = online::quantize_and_pack(params, h, i, kernels.panel_order())?;
                Experts::W8A8(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::W8A8 => {
                let (w13, w2) = pack_w8a8(params, h, i, self.par, kernels.panel_order())?;
                Experts::W8A8(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 { group_size, .. } if cfg.wna16_on_w4a8() => {
                // Symmetric int4 codes are stored signed (`q − 8`), the W4A8 kernels' values.
                let (w13, w2) =
                    pack_w4a8(params, group_size, h, i, self.par, kernels.panel_order())?;
                Experts::W4A8(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 {
                bits,
                group_size,
                act_order,
                zero_points,
            } if selection.kernel.id == moe_oracle::KernelId::CpuWna16 => {
                let shape = wna16::LayerShape {
                    bits,
                    group_size,
                    act_order,
                    zero_points,
                    h,
                    i,
                };
                let (w13, w2) = wna16::pack_layer(params, &shape, self.par)?;
                Experts::Wna16Native(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Wna16 {
                zero_points: true, ..
            } => {
                // Marlin's CPU executor applies the implicit symmetric zero only.
                return Err(LayerError::InvalidArgument {
                    field: "quant",
                    reason: format!(
                        "WNA16 weights with zero points run on the cpu-wna16 kernel only, \
                         and {} was selected",
                        selection.kernel.id.name()
                    ),
                });
            }
            LayerQuant::Wna16 {
                bits,
                group_size,
                act_order,
                ..
            } => {
                let (w13, w2) = marlin::repack_layer(params, bits, group_size, act_order, h, i)?;
                Experts::Wna16(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Mxfp4 if selection.kernel.id == moe_oracle::KernelId::CpuWna16 => {
                let (w13, w2) = wna16::pack_mxfp4_layer(params, h, i, self.par)?;
                Experts::Wna16Native(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
            LayerQuant::Mxfp4 => {
                return Err(LayerError::InvalidArgument {
                    field: "quant",
                    reason: format!(
                        "MXFP4 weights run on the cpu-wna16 kernel only, and {} was selected",
                        selection.kernel.id.name()
                    ),
                });
            }
            LayerQuant::Fp8 { .. } => return Err(fp8::not_by_name("the expert weights")),
            LayerQuant::Unquantized => {
                let (w13, w2) = pack_dense(params, h, i)?;
                Experts::Dense(fused_pipeline((w13, w2), (b13, b2), &moe_cfg, kernels)?)
            }
        };
        self.ready_with(moe, selection)
    }

    /// The fused-MoE configuration of this layer's experts.
    pub(super) fn fused_config(&self) -> FusedMoeConfig {
        let cfg = &self.cfg;
        FusedMoeConfig {
            hidden_size: cfg.hidden,
            intermediate_size: cfg.intermediate_per_rank(),
            activation: cfg.activation,
            gate_up_layout: cfg.gate_up_layout,
            apply_router_weight_on_input: self.router.apply_router_weight_on_input(),
            global_num_experts: cfg.num_experts,
            expert_map: cfg.expert_map.clone(),
        }
    }

    /// The processed state around packed experts: the scratch pool with its first scratch.
    pub(super) fn ready_with(
        &self,
        moe: Experts,
        selection: Selection,
    ) -> Result<Ready, LayerError> {
        let cfg = &self.cfg;
        let lanes = std::thread::available_parallelism().map_or(1, |n| n.get());
        // One scratch up front so that the first call does not allocate it.
        let first = CallScratch::new(
            moe.scratch(cfg.max_tokens, cfg.top_k, lanes)?,
            self.router.new_scratch(),
        );
        Ok(Ready {
            moe,
            selection,
            pool: ScratchPool::with(first),
            lanes,
        })
    }
}

/// The fused pipeline of one format's packed stacks with the layer's expert biases,
/// configuration and kernels: the same for every format.
pub(super) fn fused_pipeline<W: moe_kernels::moe::ExpertMatrix>(
    (w13, w2): Stacks<W>,
    (b13, b2): (Option<Vec<f32>>, Option<Vec<f32>>),
    cfg: &FusedMoeConfig,
    kernels: moe_kernels::KernelSet,
) -> Result<FusedMoe<W>, LayerError> {
    Ok(FusedMoe::new(
        PackedExperts {
            w13,
            w2,
            w13_bias: b13,
            w2_bias: b2,
        },
        cfg.clone(),
        kernels,
    )?)
}

/// The packed `w13` and `w2` stacks of a layer's experts, one entry per local expert.
type Stacks<W> = (Vec<W>, Vec<W>);

/// Packs the int4 experts (bf16 group scales or f32 channel scales) for the W4A8 kernels in
/// the panel order `order` (the kernel set's), experts spread over threads as `par` allows
/// (each expert is packed the same either way).
pub(super) fn pack_w4a8(
    params: &Params,
    group_size: WeightGroups,
    h: usize,
    i: usize,
    par: Par,
    order: PanelOrder,
) -> Result<Stacks<PackedW4A8>, LayerError> {
    let quant = LayerQuant::W4A8 { group_size };
    let pack = |w: &[i8], s: &[f32], n: usize, k: usize| -> Result<PackedW4A8, LayerError> {
        Ok(match group_size {
            WeightGroups::Channelwise => {
                PackedW4A8::pack(n, k, w, W4A8Scales::Channelwise(s), None)?
            }
            WeightGroups::Groups(g) => {
                let scales: Vec<bf16> = s.iter().map(|&v| bf16::from_f32(v)).collect();
                PackedW4A8::pack(
                    n,
                    k,
                    w,
                    W4A8Scales::Grouped {
                        group_size: g.get(),
                        scales: &scales,
                    },
                    None,
                )?
            }
        }
        .with_order(order))
    };
    pack_int8_stacks(
        params,
        (quant.scale_cols(h), quant.scale_cols(i)),
        h,
        i,
        par,
        pack,
    )
}

/// Packs the int8 codes and per-channel scales of a W8A8 layer for the W8A8 kernels, experts
/// over `par`.
pub(super) fn pack_w8a8(
    params: &Params,
    h: usize,
    i: usize,
    par: Par,
    order: PanelOrder,
) -> Result<Stacks<PackedW8A8>, LayerError> {
    let pack = |w: &[i8], s: &[f32], n: usize, k: usize| -> Result<PackedW8A8, LayerError> {
        Ok(PackedW8A8::pack(n, k, w, s)?.with_order(order))
    };
    let quant = LayerQuant::W8A8;
    pack_int8_stacks(
        params,
        (quant.scale_cols(h), quant.scale_cols(i)),
        h,
        i,
        par,
        pack,
    )
}

/// Packs every expert's `w13` `[2I, H]` and `w2` `[H, I]` from the loaded i8 codes and f32
/// scales (`s13` and `s2` scale columns per row) with `pack(codes, scales, n, k)`, experts over
/// `par`.
fn pack_int8_stacks<W: Send>(
    params: &Params,
    (s13, s2): (usize, usize),
    h: usize,
    i: usize,
    par: Par,
    pack: impl Fn(&[i8], &[f32], usize, usize) -> Result<W, LayerError> + Sync,
) -> Result<Stacks<W>, LayerError> {
    let e = params.w2.len() / (h * i);
    let experts = par::map_indexed(e, par, |x| {
        let w13 = pack(
            &params.w13[x * 2 * i * h..][..2 * i * h],
            &params.w13_scale[x * 2 * i * s13..][..2 * i * s13],
            2 * i,
            h,
        )?;
        let w2 = pack(
            &params.w2[x * h * i..][..h * i],
            &params.w2_scale[x * h * s2..][..h * s2],
            h,
            i,
        )?;
        Ok((w13, w2))
    });
    experts
        .into_iter()
        .collect::<Result<Vec<_>, LayerError>>()
        .map(|v| v.into_iter().unzip())
}

/// Packs unquantized experts for the dense GEMM: bf16 weights stay bf16 (exact, half the
/// bytes), f16 and f32 become f32 (exact).
fn pack_dense(params: &Params, h: usize, i: usize) -> Result<Stacks<PackedDense>, LayerError> {
    let e = params.w2_f.len() / (h * i);
    let keep_bf16 = params.float_dtype == Some(DType::BF16);
    let pack = |w: &[f32], n: usize, k: usize| -> Result<PackedDense, LayerError> {
        Ok(if keep_bf16 {
            let narrow: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            PackedDense::pack_bf16(n, k, &narrow)?
        } else {
            PackedDense::pack_f32(n, k, w)?
        })
    };
    let mut w13 = Vec::with_capacity(e);
    let mut w2 = Vec::with_capacity(e);
    for x in 0..e {
        w13.push(pack(&params.w13_f[x * 2 * i * h..][..2 * i * h], 2 * i, h)?);
        w2.push(pack(&params.w2_f[x * h * i..][..h * i], h, i)?);
    }
    Ok((w13, w2))
}
