//! FP8 layers ([`crate::LayerQuant::Fp8`]): each expert is read from the checkpoint and packed
//! straight into [`moe_kernels::PackedWna16`] with e4m3 codes
//! ([`moe_kernels::PackedWna16::pack_fp8`]), so the unpacked layer never exists; the experts
//! then run on the native WNA16 kernels like any other weight-only layer.
//!
//! Such a layer has no tensor-by-tensor road: its weights are e4m3 bytes with block, channel or
//! tensor scales,
//! which the name-based loader (i8 codes, per-group scales) does not describe, so
//! [`crate::MoeLayer::load_expert_tensor`] and [`crate::MoeLayer::process`] refuse it with
//! [`not_by_name`]. A caller holding the experts in memory packs them itself and hands them
//! over with [`crate::MoeLayer::load_packed_fp8_experts`].

use crate::LayerError;

#[cfg(feature = "checkpoint")]
use super::MoeLayerConfig;
use super::config::{Fp8Scaling, LayerQuant};
#[cfg(feature = "checkpoint")]
use super::from_checkpoint::{LoadOptions, LoadProgress};
use super::{Experts, MoeLayer, State};
#[cfg(feature = "checkpoint")]
use crate::checkpoint::{Checkpoint, Fp8Expert, Fp8Group, ReadOptions};
#[cfg(feature = "checkpoint")]
use moe_kernels::{Fp8Desc, Fp8Rows, Par};
use moe_kernels::{Int8Values, PackedWna16};

/// The refusal of every road but the checkpoint's for FP8 weights (`what` names the tensor).
pub(super) fn not_by_name(what: &str) -> LayerError {
    LayerError::InvalidArgument {
        field: "quant",
        reason: format!(
            "{what}: FP8 experts are loaded from a checkpoint \
             (MoeLayer::from_checkpoint and its variants, or load_from_checkpoint) or packed by \
             the caller (load_packed_fp8_experts), not tensor by tensor"
        ),
    }
}

/// Packs one expert's `w13` (gate rows, then up rows, each with its own scales) and `w2`.
#[cfg(feature = "checkpoint")]
fn pack_expert(ex: &Fp8Expert<'_>) -> Result<(PackedWna16, PackedWna16), LayerError> {
    let [gate, up] = &ex.w13;
    let rows = [gate, up].map(|p| Fp8Rows {
        channels: p.n,
        codes: &p.codes,
        scales: p.kernel_scales(),
    });
    let w13 = PackedWna16::pack_fp8(Fp8Desc {
        n: gate.n + up.n,
        k: gate.k,
        rows: &rows,
        bias: None,
    })?;
    let w2 = PackedWna16::pack_fp8(Fp8Desc {
        n: ex.w2.n,
        k: ex.w2.k,
        rows: &[Fp8Rows {
            channels: ex.w2.n,
            codes: &ex.w2.codes,
            scales: ex.w2.kernel_scales(),
        }],
        bias: None,
    })?;
    Ok((w13, w2))
}

#[cfg(feature = "checkpoint")]
impl MoeLayer {
    /// Builds, loads and readies an FP8 layer from `ckpt` for the rank and
    /// experts `cfg` names: router (and correction bias), every local expert packed as it is
    /// read (over `opts.par`), the shared experts as a layer of their own.
    pub(super) fn fp8_from_checkpoint(
        ckpt: &Checkpoint,
        layer: usize,
        cfg: MoeLayerConfig,
        opts: &LoadOptions<'_>,
    ) -> Result<Self, LayerError> {
        debug_assert!(matches!(cfg.quant, LayerQuant::Fp8 { .. }));
        cfg.validate()?;
        let tp = (cfg.tp_rank, cfg.tp_size);
        let read = ReadOptions::single_rank()
            .with_tensor_parallel(cfg.tp_rank, cfg.tp_size)
            .with_expert_map(cfg.expert_map.as_deref())
            .with_shared_experts(cfg.shared_experts.is_some());
        let (router, local) = ckpt.read_layer_head(layer, &read)?;
        // `create` allocates nothing for the experts of an FP8 layer, but the first expert is
        // read before it anyway, so that a config declaring huge sizes fails on the tensors.
        if let Some(&first) = local.first() {
            ckpt.read_fp8_expert(layer, first, Fp8Group::Routed, tp)?;
        }
        let mut moe = Self::create(cfg)?;
        moe.load_router_weight(&router.weight.to_f32_vec())?;
        if let Some(bias) = &router.correction_bias {
            moe.load_router_correction_bias(bias)?;
        }
        if local != moe.cfg.local_experts() {
            return Err(LayerError::InvalidArgument {
                field: "local_experts",
                reason: format!(
                    "layer {layer}: expected {:?}, checkpoint has {local:?}",
                    moe.cfg.local_experts()
                ),
            });
        }
        let done = std::sync::atomic::AtomicUsize::new(0);
        let total = local.len();
        let packed = moe_kernels::par::map_indexed(total, opts.par, |x| {
            let ex = ckpt.read_fp8_expert(layer, local[x], Fp8Group::Routed, tp)?;
            let pair = pack_expert(&ex)?;
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if let Some(report) = opts.progress {
                report(LoadProgress { done: n, total });
            }
            Ok(pair)
        });
        let (w13, w2): (Vec<_>, Vec<_>) = packed
            .into_iter()
            .collect::<Result<Vec<_>, LayerError>>()?
            .into_iter()
            .unzip();
        if let Some(shared) = moe.shared.as_mut() {
            let ex = ckpt.read_fp8_expert(layer, 0, Fp8Group::Shared, tp)?;
            let (a, b) = pack_expert(&ex)?;
            shared.ready_fp8(vec![a], vec![b])?;
            if moe.cfg.shared_experts.is_some_and(|s| s.gated) {
                let name = ckpt.names().shared_expert_gate(layer).unwrap_or_default();
                let t = ckpt.source().get(&name)?;
                let h = moe.cfg.hidden;
                t.expect_shape(&[1, h])?;
                let gate = crate::checkpoint::FloatData::from_le_bytes(t.dtype, t.bytes)
                    .ok_or_else(|| LayerError::WrongDtype {
                        tensor: t.name.clone(),
                        file: t.file.to_path_buf(),
                        expected: "f32 or bf16 or f16".into(),
                        actual: crate::checkpoint::shards::dtype_name(t.dtype),
                    })?;
                moe.load_shared_expert_gate(&gate.to_f32_vec())?;
            }
        }
        moe.ready_fp8(w13, w2)?;
        moe.set_parallelism(Par::Rayon);
        Ok(moe)
    }
}

impl MoeLayer {
    /// Readies a created FP8 layer ([`crate::LayerQuant::Fp8`]) around experts the caller
    /// packed with [`PackedWna16::pack_fp8`]: `w13[x]` `[2I, H]` (gate rows, then up rows) and
    /// `w2[x]` `[H, I]` for the x-th local expert, `I` this rank's share, with block scales
    /// for [`crate::Fp8Scaling::Blocks`] layers and channel or tensor scales for the others.
    /// This is the road for runtimes and benchmarks that hold FP8 experts in memory rather
    /// than in a checkpoint (the name-based loader does not describe e4m3 bytes with their
    /// scales). The router weight (and correction bias, if the routing has one) must be loaded
    /// first; layers with shared experts load from a checkpoint only. The layer comes back
    /// processed. A wrong count, shape, code kind or scale grouping is a typed error naming
    /// the matrix, and leaves the layer unusable.
    pub fn load_packed_fp8_experts(
        &mut self,
        w13: Vec<PackedWna16>,
        w2: Vec<PackedWna16>,
    ) -> Result<(), LayerError> {
        self.params_mut()?;
        let checked = self.check_packed_fp8(&w13, &w2);
        let result = checked.and_then(|()| self.ready_fp8(w13, w2));
        self.unusable_on_err(result)
    }

    /// The checks of [`Self::load_packed_fp8_experts`].
    fn check_packed_fp8(&self, w13: &[PackedWna16], w2: &[PackedWna16]) -> Result<(), LayerError> {
        let LayerQuant::Fp8 { scaling } = self.cfg.quant else {
            return Err(LayerError::InvalidArgument {
                field: "quant",
                reason: format!(
                    "packed FP8 experts need an fp8 layer, this one is {}",
                    self.cfg.quant.name()
                ),
            });
        };
        let blocks = scaling == Fp8Scaling::Blocks;
        if self.shared.is_some() {
            return Err(LayerError::InvalidArgument {
                field: "shared_experts",
                reason: "FP8 layers with shared experts are loaded from a checkpoint".into(),
            });
        }
        let local = self.cfg.local_experts().len();
        let (h, i) = (self.cfg.hidden, self.cfg.intermediate_per_rank());
        for (name, stack, (n, k)) in [("w13", w13, (2 * i, h)), ("w2", w2, (h, i))] {
            if stack.len() != local {
                return Err(LayerError::ParamShape {
                    tensor: format!("{name} (local experts)"),
                    expected: vec![local],
                    actual: vec![stack.len()],
                });
            }
            for (x, w) in stack.iter().enumerate() {
                if (w.n(), w.k()) != (n, k) {
                    return Err(LayerError::ParamShape {
                        tensor: format!("{name}[{x}]"),
                        expected: vec![n, k],
                        actual: vec![w.n(), w.k()],
                    });
                }
                if w.bits() != 8 || w.int8_values() != Int8Values::E4m3 {
                    return Err(LayerError::ParamDtype {
                        tensor: format!("{name}[{x}]"),
                        expected: "e4m3 codes (PackedWna16::pack_fp8)".into(),
                        actual: format!("{}-bit codes", w.bits()),
                    });
                }
                if w.is_channelwise() == blocks {
                    let grouping = |channelwise| {
                        if channelwise {
                            "channel or tensor scales".to_string()
                        } else {
                            format!("block scales (groups of {})", moe_kernels::FP8_BLOCK)
                        }
                    };
                    return Err(LayerError::ParamDtype {
                        tensor: format!("{name}[{x}]"),
                        expected: format!(
                            "{} for an {} layer",
                            grouping(!blocks),
                            self.cfg.quant.name()
                        ),
                        actual: grouping(w.is_channelwise()),
                    });
                }
            }
        }
        Ok(())
    }

    /// Selects the backend and readies the layer around its packed FP8 experts.
    fn ready_fp8(&mut self, w13: Vec<PackedWna16>, w2: Vec<PackedWna16>) -> Result<(), LayerError> {
        if self.cfg.router_bias_pending {
            return Err(LayerError::MissingParams {
                missing: vec!["router.e_score_correction_bias".into()],
            });
        }
        let (selection, kernels) = super::backend::select(&self.cfg, &self.router)?;
        if selection.kernel.id != moe_oracle::KernelId::CpuWna16 {
            return Err(LayerError::InvalidArgument {
                field: "quant",
                reason: format!(
                    "FP8 experts run on the cpu-wna16 kernel only, and {} was \
                     selected",
                    selection.kernel.id.name()
                ),
            });
        }
        let fused =
            super::process::fused_pipeline((w13, w2), (None, None), &self.fused_config(), kernels)?;
        let ready = self.ready_with(Experts::Wna16Native(fused), selection)?;
        self.state = State::Ready(Box::new(ready));
        Ok(())
    }
}
