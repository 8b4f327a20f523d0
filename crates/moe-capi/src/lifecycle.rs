//! Creating, loading, processing and freeing layers over the C ABI: the two ways to get a
//! handle (`moe_layer_open_checkpoint` for a model directory, `moe_layer_create` for an
//! explicit [`MoeLayerDesc`] followed by `moe_layer_load_tensor` calls and
//! `moe_layer_process`), the thread setting, and `moe_layer_free`.

use std::ffi::{c_char, c_void};
use std::num::NonZeroUsize;

use half::{bf16, f16};
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_layer::{
    ExpertShard, LayerQuant, LoadOptions, MoeLayer, MoeLayerConfig, Par, TensorData, TensorKind,
    TensorView,
};
use moe_quant::{DType, WeightGroups};
use moe_router::{ExpertMap, ExpertPlacement};

use crate::args::{slice, utf8, write_out};
use crate::boundary::guard;
use crate::options::MoeLayerOptions;
use crate::registry::{self, MoeLayerHandle, locked};
use crate::status::{CapiError, MoeDtype, MoeStatus};

/// Pass as `layer` to `moe_layer_open_checkpoint` to pick the model's first MoE layer.
pub const MOE_FIRST_MOE_LAYER: usize = !0;

/// The description of a layer built tensor by tensor (`moe_layer_create`): one rank holding
/// every expert, SiLU experts, vLLM's CPU softmax router.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeLayerDesc {
    /// Experts of the model (`E`).
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Intermediate size `I` of one expert.
    pub intermediate: usize,
    /// The weight scheme, a `MoeQuant` value.
    pub quant: u32,
    /// W4A8 only: input columns per scale group, or 0 for one scale per output channel.
    pub group_size: usize,
    /// Non-zero: the top-k routing weights are renormalized to sum to 1 per token.
    pub renormalize: u32,
    /// The model's activation dtype (a `MoeDtype` value: f32, bf16 or f16), used to select
    /// the backend.
    pub dtype: u32,
    /// Largest token count of one kernel call; longer `moe_layer_apply` calls are cut into
    /// pieces of this size.
    pub max_tokens: usize,
}

impl MoeLayerDesc {
    fn to_config(self) -> Result<MoeLayerConfig, CapiError> {
        let quant = match self.quant {
            0 => LayerQuant::W4A8 {
                group_size: NonZeroUsize::new(self.group_size)
                    .map_or(WeightGroups::Channelwise, WeightGroups::Groups),
            },
            1 => LayerQuant::Int8Online,
            2 => LayerQuant::Unquantized,
            3 => LayerQuant::W8A8,
            other => {
                return Err(CapiError::invalid(format!(
                    "desc.quant: {other} is not a MoeQuant (0 = W4A8, 1 = int8 online, \
                     2 = unquantized, 3 = W8A8); MXFP4 and FP8 layers have no \
                     tensor-by-tensor road: open their checkpoints with \
                     moe_layer_open_checkpoint"
                )));
            }
        };
        let in_dtype = match MoeDtype::from_raw(self.dtype, "desc.dtype")? {
            MoeDtype::F32 => DType::F32,
            MoeDtype::Bf16 => DType::BF16,
            MoeDtype::F16 => DType::F16,
            MoeDtype::I8 => {
                return Err(CapiError::invalid(
                    "desc.dtype: the model dtype must be f32, bf16 or f16",
                ));
            }
        };
        let router = moe_layer::layer::vllm_cpu_softmax_router(
            self.num_experts,
            self.top_k,
            self.renormalize != 0,
        );
        Ok(MoeLayerConfig::new(
            self.num_experts,
            self.top_k,
            self.hidden,
            self.intermediate,
            quant,
        )
        .with_router(router)
        .with_in_dtype(in_dtype)
        .with_max_tokens(self.max_tokens))
    }
}

/// Sets `*out` to NULL when `out` is usable, so that a failed create leaves no stale handle.
///
/// # Safety
/// - `out` is NULL or valid for one pointer write.
unsafe fn clear_out(out: *mut *mut MoeLayerHandle) {
    if !out.is_null() && out.is_aligned() {
        // SAFETY: non-NULL and aligned (checked), writable per this function's contract.
        unsafe { out.write(std::ptr::null_mut()) };
    }
}

/// The decoder layer `layer` names: itself, or the model's first MoE layer for
/// `MOE_FIRST_MOE_LAYER`.
fn resolve_layer(ckpt: &Checkpoint, dir: &str, layer: usize) -> Result<usize, CapiError> {
    if layer != MOE_FIRST_MOE_LAYER {
        return Ok(layer);
    }
    ckpt.spec()
        .moe_layers
        .first()
        .copied()
        .ok_or_else(|| CapiError::new(MoeStatus::Unsupported, format!("{dir}: no MoE layer")))
}

/// Stores `moe` in the registry and its handle in `*out`, removing it again if that fails.
///
/// # Safety
/// - `out` is non-NULL and valid for one write.
unsafe fn publish(moe: MoeLayer, out: *mut *mut MoeLayerHandle) -> Result<(), CapiError> {
    let handle = registry::insert(moe);
    // SAFETY: non-NULL and writable per this function's contract.
    unsafe { write_out(out, handle, "out") }.inspect_err(|_| {
        let _ = registry::remove(handle);
    })
}

/// Opens the Hugging Face model directory `model_dir` (`config.json` plus safetensors shards),
/// builds decoder layer `layer`'s MoE block (or the first MoE layer for
/// `MOE_FIRST_MOE_LAYER`) for calls of up to `max_tokens` tokens, loads and processes it, and
/// stores the new handle in `*out` (NULL on failure). The checkpoint files are only read during
/// this call; experts are packed on rayon's global pool.
///
/// # Safety
/// - `model_dir` is NULL or a NUL-terminated string; `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_open_checkpoint(
    model_dir: *const c_char,
    layer: usize,
    max_tokens: usize,
    out: *mut *mut MoeLayerHandle,
) -> MoeStatus {
    // SAFETY: the contracts of `model_dir` and `out` are this function's; NULL ranks and
    // options are valid.
    unsafe {
        moe_layer_open_checkpoint_with(
            model_dir,
            layer,
            max_tokens,
            std::ptr::null(),
            std::ptr::null(),
            out,
        )
    }
}

/// One rank's place in a parallel group (`moe_layer_open_checkpoint_ranked`): tensor
/// parallelism slices every expert's intermediate dimension over `tp_size` ranks, expert
/// parallelism spreads the experts over `ep_size` ranks (contiguous ranges, the first
/// `E % ep_size` ranks one more: vLLM's linear placement). The host sums the outputs of all
/// ranks; terms every rank could add (shared experts, the down-projection bias) are added once.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeRanks {
    /// This rank's tensor-parallel index, `0..tp_size`.
    pub tp_rank: usize,
    /// Tensor-parallel ranks (1: none).
    pub tp_size: usize,
    /// This rank's expert-parallel index, `0..ep_size`.
    pub ep_rank: usize,
    /// Expert-parallel ranks (1: every expert on this rank).
    pub ep_size: usize,
}

/// [`moe_layer_open_checkpoint`] for one rank of a parallel group (`*ranks`).
///
/// # Safety
/// - `model_dir` is NULL or a NUL-terminated string; `ranks` is NULL or points to a
///   `MoeRanks`; `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_open_checkpoint_ranked(
    model_dir: *const c_char,
    layer: usize,
    max_tokens: usize,
    ranks: *const MoeRanks,
    out: *mut *mut MoeLayerHandle,
) -> MoeStatus {
    if ranks.is_null() {
        // SAFETY: nothing is read through `out` before it is checked.
        unsafe { clear_out(out) };
        return guard(|| Err(CapiError::null("ranks")));
    }
    // SAFETY: the contracts of every pointer are this function's; NULL options are valid.
    unsafe {
        moe_layer_open_checkpoint_with(model_dir, layer, max_tokens, ranks, std::ptr::null(), out)
    }
}

/// [`moe_layer_open_checkpoint`] for one rank of a parallel group (`*ranks`; NULL: a single
/// rank holding every expert) with `*options` (NULL: the defaults). The checkpoint's
/// `config.json` decides the activation and the routing, so only
/// `options->wna16_activations` and `options->w4a8_prefill` are read.
///
/// # Safety
/// - `model_dir` is NULL or a NUL-terminated string; `ranks` is NULL or points to a
///   `MoeRanks`; `options` is NULL or points to a `MoeLayerOptions` of at least
///   `options->struct_size` bytes; `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_open_checkpoint_with(
    model_dir: *const c_char,
    layer: usize,
    max_tokens: usize,
    ranks: *const MoeRanks,
    options: *const MoeLayerOptions,
    out: *mut *mut MoeLayerHandle,
) -> MoeStatus {
    // SAFETY: `out` is NULL or writable per this function's contract.
    unsafe { clear_out(out) };
    guard(|| {
        // SAFETY: NULL or NUL-terminated per this function's contract.
        let dir = unsafe { utf8(model_dir, "model_dir")? };
        if out.is_null() {
            return Err(CapiError::null("out"));
        }
        // SAFETY: NULL or one readable `MoeRanks` per this function's contract.
        let ranks = unsafe { slice(ranks, usize::from(!ranks.is_null()), "ranks")? }
            .first()
            .copied();
        // SAFETY: NULL or a readable MoeLayerOptions per this function's contract.
        let options = unsafe { MoeLayerOptions::read(options)? };
        // Experts are packed on rayon's global pool, the pool `apply` uses by default.
        let mut load = LoadOptions::new()
            .with_par(Par::Rayon)
            .with_wna16_activations(options.wna16_activations()?);
        if let Some(prefill) = options.w4a8_prefill()? {
            load = load.with_w4a8_prefill(prefill);
        }
        let ckpt = Checkpoint::open(std::path::Path::new(dir), ShardAccess::Mmap)?;
        let layer = resolve_layer(&ckpt, dir, layer)?;
        let moe = match ranks {
            None => MoeLayer::from_checkpoint_with(&ckpt, layer, max_tokens, &load)?,
            Some(ranks) => {
                let expert_map = match ranks.ep_size {
                    0 => return Err(CapiError::invalid("ranks.ep_size: must be at least 1")),
                    1 if ranks.ep_rank == 0 => None,
                    ep_size => Some(
                        ExpertMap::new(
                            ckpt.spec().num_experts,
                            ep_size,
                            ranks.ep_rank,
                            ExpertPlacement::Linear,
                        )
                        .map_err(|e| CapiError::invalid(format!("ranks: {e}")))?
                        .as_slice()
                        .to_vec(),
                    ),
                };
                // The oracle judges the rank too, as `moe inspect` and `moe run` do.
                let load = load.with_expert_parallel(ranks.ep_rank, ranks.ep_size);
                MoeLayer::from_checkpoint_ranked_with(
                    &ckpt,
                    layer,
                    max_tokens,
                    (ranks.tp_rank, ranks.tp_size),
                    expert_map,
                    &load,
                )?
            }
        };
        // SAFETY: `out` is non-NULL (checked) and writable per this function's contract.
        unsafe { publish(moe, out) }
    })
}

/// Creates an empty layer from `*desc`; load its tensors with `moe_layer_load_tensor`, then
/// call `moe_layer_process`. Stores the new handle in `*out` (NULL on failure).
///
/// # Safety
/// - `desc` is NULL or points to a `MoeLayerDesc`; `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_create(
    desc: *const MoeLayerDesc,
    out: *mut *mut MoeLayerHandle,
) -> MoeStatus {
    // SAFETY: the contracts of `desc` and `out` are this function's; NULL options are valid.
    unsafe { moe_layer_create_with(desc, std::ptr::null(), out) }
}

/// [`moe_layer_create`] with the settings of `*options` (activation, routing, WNA16
/// activations); NULL means the defaults of `moe_layer_options_default`. With
/// `options->correction_bias` set, load `gate.e_score_correction_bias` before processing.
///
/// # Safety
/// - `desc` is NULL or points to a `MoeLayerDesc`; `options` is NULL or points to a
///   `MoeLayerOptions` of at least `options->struct_size` bytes; `out` is NULL or valid for
///   one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_create_with(
    desc: *const MoeLayerDesc,
    options: *const MoeLayerOptions,
    out: *mut *mut MoeLayerHandle,
) -> MoeStatus {
    // SAFETY: `out` is NULL or writable per this function's contract.
    unsafe { clear_out(out) };
    guard(|| {
        // SAFETY: NULL or one readable MoeLayerDesc per this function's contract.
        let desc = unsafe { slice(desc, 1, "desc")? };
        let desc = desc.first().ok_or_else(|| CapiError::null("desc"))?;
        // SAFETY: NULL or a readable MoeLayerOptions per this function's contract.
        let options = unsafe { MoeLayerOptions::read(options)? };
        if out.is_null() {
            return Err(CapiError::null("out"));
        }
        let cfg = options.configure(desc.to_config()?, desc.renormalize != 0)?;
        let moe = MoeLayer::create(cfg)?;
        // SAFETY: `out` is non-NULL (checked) and writable per this function's contract.
        unsafe { publish(moe, out) }
    })
}

/// Where a tensor named by the caller goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Expert {
        expert: usize,
        shard: ExpertShard,
        kind: TensorKind,
    },
    Router,
    CorrectionBias,
}

/// Parses checkpoint-style names: `[...]experts.<e>.<proj>.<weight|weight_scale|bias>` with
/// `<proj>` one of `gate_proj`/`w1`, `up_proj`/`w3`, `down_proj`/`w2`, and `[...]gate.weight`
/// for the router, `[...]gate.e_score_correction_bias` for its selection bias.
fn parse_name(name: &str) -> Result<Target, CapiError> {
    let bad = || {
        CapiError::invalid(format!(
            "tensor name {name:?}: expected [prefix.]experts.<e>.<gate_proj|up_proj|down_proj|w1|w3|w2>.\
             <weight|weight_scale|bias>, [prefix.]gate.weight or \
             [prefix.]gate.e_score_correction_bias"
        ))
    };
    if let Some(pos) = name.rfind("experts.") {
        let mut parts = name[pos + "experts.".len()..].splitn(3, '.');
        let expert = parts
            .next()
            .and_then(|e| e.parse::<usize>().ok())
            .ok_or_else(bad)?;
        let shard = match parts.next() {
            Some("gate_proj" | "w1") => ExpertShard::W1,
            Some("up_proj" | "w3") => ExpertShard::W3,
            Some("down_proj" | "w2") => ExpertShard::W2,
            _ => return Err(bad()),
        };
        let kind = match parts.next() {
            Some("weight") => TensorKind::Weight,
            Some("weight_scale") => TensorKind::Scale,
            Some("bias") => TensorKind::Bias,
            _ => return Err(bad()),
        };
        return Ok(Target::Expert {
            expert,
            shard,
            kind,
        });
    }
    if name == "gate.weight" || name.ends_with(".gate.weight") {
        return Ok(Target::Router);
    }
    if name == "gate.e_score_correction_bias" || name.ends_with(".gate.e_score_correction_bias") {
        return Ok(Target::CorrectionBias);
    }
    Err(bad())
}

/// Loads one checkpoint tensor: `len` elements of `dtype` at `data`, row-major with shape
/// `shape[0..ndim]`, named like the checkpoint names it (see `moe_layer_create`): expert
/// weights (`experts.<e>.gate_proj.weight`, int4 codes as i8 for W4A8, floats for int8
/// online), their scales (`...weight_scale`, f32/bf16/f16) and the router gate (`gate.weight`
/// `[E, H]`, float). The data is copied; the buffer may be reused when the call returns. A
/// failure leaves the layer unusable (free it).
///
/// # Safety
/// - `name` is NULL or a NUL-terminated string; `shape` is NULL or points to `ndim` values;
///   `data` is NULL or points to `len` readable elements of `dtype`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_load_tensor(
    layer: *mut MoeLayerHandle,
    name: *const c_char,
    dtype: u32,
    shape: *const usize,
    ndim: usize,
    data: *const c_void,
    len: usize,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        // SAFETY: NULL or NUL-terminated per this function's contract.
        let name = unsafe { utf8(name, "name")? };
        // SAFETY: NULL or `ndim` readable values per this function's contract.
        let shape = unsafe { slice(shape, ndim, "shape")? };
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| CapiError::invalid(format!("{name}: shape {shape:?} overflows")))?;
        if elements != len {
            return Err(CapiError::invalid(format!(
                "{name}: shape {shape:?} has {elements} elements but len is {len}"
            )));
        }
        let dtype = MoeDtype::from_raw(dtype, "dtype")?;
        let data = match dtype {
            // Every bit pattern is valid for these four types.
            // SAFETY: `len` readable elements of `dtype` per this function's contract.
            MoeDtype::F32 => TensorData::F32(unsafe { slice(data.cast::<f32>(), len, "data")? }),
            // SAFETY: as above.
            MoeDtype::Bf16 => TensorData::Bf16(unsafe { slice(data.cast::<bf16>(), len, "data")? }),
            // SAFETY: as above.
            MoeDtype::F16 => TensorData::F16(unsafe { slice(data.cast::<f16>(), len, "data")? }),
            // SAFETY: as above.
            MoeDtype::I8 => TensorData::I8(unsafe { slice(data.cast::<i8>(), len, "data")? }),
        };
        let mut moe = locked(entry.layer.write())?;
        match parse_name(name)? {
            Target::Expert {
                expert,
                shard,
                kind,
            } => {
                let view = TensorView { name, shape, data };
                moe.load_expert_tensor(expert, shard, kind, &view)?;
            }
            Target::Router => {
                let want = [moe.config().num_experts, moe.config().hidden];
                let weight = router_floats(name, data, shape, &want)?;
                moe.load_router_weight(&weight)?;
            }
            Target::CorrectionBias => {
                let want = [moe.config().num_experts];
                let bias = router_floats(name, data, shape, &want)?;
                moe.load_router_correction_bias(&bias)?;
            }
        }
        Ok(())
    })
}

/// A router tensor (gate weight or correction bias) as f32, checked to be `want`-shaped.
fn router_floats(
    name: &str,
    data: TensorData<'_>,
    shape: &[usize],
    want: &[usize],
) -> Result<Vec<f32>, CapiError> {
    let values: Vec<f32> = match data {
        TensorData::F32(v) => v.to_vec(),
        TensorData::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        _ => {
            return Err(CapiError::invalid(format!(
                "{name}: router tensors must be f32, bf16 or f16"
            )));
        }
    };
    if shape != want {
        return Err(CapiError::invalid(format!(
            "{name}: shape {shape:?}, expected {want:?}"
        )));
    }
    Ok(values)
}

/// Checks that every tensor was loaded, packs the experts and selects the backend. Calling
/// it again on a processed layer does nothing.
///
/// Any pointer value is accepted: handles are looked up, never dereferenced.
#[unsafe(no_mangle)]
pub extern "C" fn moe_layer_process(layer: *mut MoeLayerHandle) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let mut moe = locked(entry.layer.write())?;
        moe.process()?;
        Ok(())
    })
}

/// How many threads `moe_layer_apply` uses: 0 = split over the current rayon pool (the
/// global one unless the call runs inside a Rust host's `ThreadPool::install`; the default),
/// 1 = only the calling thread, n ≥ 2 = a private pool of n threads owned by this layer.
///
/// Any pointer value is accepted: handles are looked up, never dereferenced.
#[unsafe(no_mangle)]
pub extern "C" fn moe_layer_set_num_threads(
    layer: *mut MoeLayerHandle,
    threads: usize,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let pool = match threads {
            0 | 1 => None,
            n => Some(std::sync::Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("moe-capi-{i}"))
                    .build()
                    .map_err(|e| CapiError::invalid(format!("threads = {n}: {e}")))?,
            )),
        };
        let mut moe = locked(entry.layer.write())?;
        moe.set_parallelism(if threads == 1 { Par::Seq } else { Par::Rayon });
        *locked(entry.pool.write())? = pool;
        Ok(())
    })
}

/// Frees the layer. The handle is invalid afterwards: using or freeing it again returns
/// `MOE_STATUS_INVALID_HANDLE`. Calls still running on other threads finish first (the
/// memory goes when the last one returns). NULL is an error, as any other invalid handle.
///
/// Any pointer value is accepted: handles are looked up, never dereferenced.
#[unsafe(no_mangle)]
pub extern "C" fn moe_layer_free(layer: *mut MoeLayerHandle) -> MoeStatus {
    guard(|| registry::remove(layer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_checkpoints_spell_them() {
        assert_eq!(
            parse_name("model.layers.0.mlp.experts.3.gate_proj.weight_scale").unwrap(),
            Target::Expert {
                expert: 3,
                shard: ExpertShard::W1,
                kind: TensorKind::Scale
            }
        );
        assert_eq!(
            parse_name("experts.0.w2.weight").unwrap(),
            Target::Expert {
                expert: 0,
                shard: ExpertShard::W2,
                kind: TensorKind::Weight
            }
        );
        assert_eq!(
            parse_name("model.layers.0.mlp.gate.weight").unwrap(),
            Target::Router
        );
        for bad in [
            "",
            "experts.x.w1.weight",
            "experts.0.w4.weight",
            "experts.0.w1",
            "gate",
        ] {
            assert!(parse_name(bad).is_err(), "{bad:?}");
        }
    }
}
