//! Using a processed layer over the C ABI: `moe_layer_apply` (route and run the experts, on
//! caller-owned buffers), `moe_layer_info` (sizes and state) and `moe_layer_backend` (what
//! the oracle chose, as strings owned by the layer).

use std::ffi::{CString, c_char, c_void};

use moe_kernels::moe::MoeFloat;
use moe_layer::MoeLayer;
use moe_router::Logits;

use crate::args::{
    FloatSlice, FloatSliceMut, float_slice, float_slice_mut, slice, slice_mut, write_out,
};
use crate::boundary::guard;
use crate::registry::{self, BackendNames, Entry, MoeLayerHandle, locked};
use crate::status::{CapiError, MoeDtype, MoeStatus};

/// Sizes and state of a layer (`moe_layer_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeLayerInfo {
    /// Experts of the model (`E`); router logits have `E` values per token.
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Hidden size `H`; hidden states and outputs have `H` values per token.
    pub hidden: usize,
    /// Intermediate size of one expert on this rank.
    pub intermediate: usize,
    /// Largest token count of one kernel call.
    pub max_tokens: usize,
    /// Whether `moe_layer_process` has succeeded (`moe_layer_apply` needs it).
    pub processed: bool,
}

/// The backend a processed layer runs on (`moe_layer_backend`). The strings belong to the
/// layer and stay valid until `moe_layer_free`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeBackendInfo {
    /// The oracle's backend, e.g. `"cpu"`.
    pub backend: *const c_char,
    /// The kernel and its ISA rung, e.g. `"cpu-int4-w4a8/avx512-vnni"`.
    pub kernel: *const c_char,
    /// The ISA rung of the kernels, e.g. `"avx512-vnni"`.
    pub isa: *const c_char,
}

/// Whether two byte ranges overlap.
fn overlaps(a: *const c_void, a_bytes: usize, b: *const c_void, b_bytes: usize) -> bool {
    let (a, b) = (a.addr(), b.addr());
    a_bytes > 0 && b_bytes > 0 && a < b.saturating_add(b_bytes) && b < a.saturating_add(a_bytes)
}

/// Runs the MoE block on `hidden_len` values (`[T, H]`, row-major) of `hidden_states` and
/// writes `out_len` (= `hidden_len`) values to `out`; all buffers have dtype `dtype` (f32,
/// bf16 or f16; the compute follows it as vLLM's does). `router_logits` holds `[T, E]` values
/// (`logits_len` of them) in the same dtype; when it is NULL (and `logits_len` 0) the layer
/// computes them with the router gate loaded from the checkpoint. Safe to call from many
/// threads at once on one layer; results do not depend on threads. `out` must not overlap
/// the inputs.
///
/// # Safety
/// - `hidden_states` and `router_logits` are NULL or point to `hidden_len` / `logits_len`
///   readable elements of `dtype`, unchanged during the call; `out` is NULL or points to
///   `out_len` writable elements of `dtype` that nothing else touches during the call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // The C signature: a pointer and a length per buffer.
pub unsafe extern "C" fn moe_layer_apply(
    layer: *mut MoeLayerHandle,
    dtype: u32,
    hidden_states: *const c_void,
    hidden_len: usize,
    router_logits: *const c_void,
    logits_len: usize,
    out: *mut c_void,
    out_len: usize,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let dtype = MoeDtype::from_raw(dtype, "dtype")?;
        let width = if dtype == MoeDtype::F32 { 4 } else { 2 };
        // SAFETY: the buffers are as this function's contract says; `router_logits` is the
        // one other input `out` must not overlap.
        let (x, y) = unsafe {
            io_slices(
                dtype,
                (hidden_states, hidden_len),
                (out, out_len),
                &[(router_logits, logits_len * width)],
            )?
        };
        // SAFETY: NULL or `logits_len` readable elements of `dtype` per the contract.
        let logits = unsafe { float_slice(dtype, router_logits, logits_len, "router_logits")? };
        let logits = (!router_logits.is_null()).then_some(logits);
        on_pool(&entry, |moe| match (x, y) {
            (FloatSlice::F32(x), FloatSliceMut::F32(y)) => apply_typed(moe, x, logits, y),
            (FloatSlice::Bf16(x), FloatSliceMut::Bf16(y)) => apply_typed(moe, x, logits, y),
            (FloatSlice::F16(x), FloatSliceMut::F16(y)) => apply_typed(moe, x, logits, y),
            _ => Err(CapiError::invalid("hidden_states and out differ in dtype")),
        })
    })
}

/// Checks that `out` overlaps neither the hidden states nor any of `others` (pointer and byte
/// length) and that neither is NULL, and views the hidden states and the output.
///
/// # Safety
/// - `x` and `out` are as `moe_layer_apply`'s contract says of `hidden_states` and `out`.
unsafe fn io_slices<'a>(
    dtype: MoeDtype,
    (x, x_len): (*const c_void, usize),
    (out, out_len): (*mut c_void, usize),
    others: &[(*const c_void, usize)],
) -> Result<(FloatSlice<'a>, FloatSliceMut<'a>), CapiError> {
    let width = if dtype == MoeDtype::F32 { 4 } else { 2 };
    let out_bytes = out_len * width;
    if overlaps(out, out_bytes, x, x_len * width)
        || others
            .iter()
            .any(|&(p, bytes)| overlaps(out, out_bytes, p, bytes))
    {
        return Err(CapiError::invalid("out overlaps an input buffer"));
    }
    if x.is_null() {
        return Err(CapiError::null("hidden_states"));
    }
    if out.is_null() {
        return Err(CapiError::null("out"));
    }
    // SAFETY: readable `x_len` elements of `dtype` per this function's contract.
    let x = unsafe { float_slice(dtype, x, x_len, "hidden_states")? };
    // SAFETY: `out_len` writable elements of `dtype`, not aliased (overlap checked above).
    let y = unsafe { float_slice_mut(dtype, out, out_len, "out")? };
    Ok((x, y))
}

/// Runs `f` on the layer, on its private pool when the host gave it one.
fn on_pool(
    entry: &Entry,
    f: impl FnOnce(&MoeLayer) -> Result<(), CapiError> + Send,
) -> Result<(), CapiError> {
    let pool = locked(entry.pool.read())?.clone();
    let moe = locked(entry.layer.read())?;
    let moe: &MoeLayer = &moe;
    match pool {
        Some(pool) => pool.install(|| f(moe)),
        None => f(moe),
    }
}

/// Routes `logits_len` router logits (`[T, E]`, dtype `dtype`) with the layer's router and
/// writes the chosen global expert ids and their weights (`[T, k]`, `pairs_len` = `T·k` of
/// each) to `topk_ids` and `topk_weights`: the routing `moe_layer_apply` would use, for hosts
/// that route once and run several ranks (`moe_layer_apply_topk`).
///
/// # Safety
/// - `router_logits` is NULL or points to `logits_len` readable elements of `dtype`;
///   `topk_ids` and `topk_weights` are NULL or point to `pairs_len` writable elements each,
///   not overlapping each other or the logits.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // The C signature: a pointer and a length per buffer.
pub unsafe extern "C" fn moe_layer_route(
    layer: *mut MoeLayerHandle,
    dtype: u32,
    router_logits: *const c_void,
    logits_len: usize,
    topk_ids: *mut i32,
    topk_weights: *mut f32,
    pairs_len: usize,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let dtype = MoeDtype::from_raw(dtype, "dtype")?;
        let width = if dtype == MoeDtype::F32 { 4 } else { 2 };
        let (ids_bytes, weights_bytes) = (pairs_len * 4, pairs_len * 4);
        if overlaps(
            topk_ids.cast(),
            ids_bytes,
            router_logits,
            logits_len * width,
        ) || overlaps(
            topk_weights.cast(),
            weights_bytes,
            router_logits,
            logits_len * width,
        ) || overlaps(
            topk_ids.cast(),
            ids_bytes,
            topk_weights.cast(),
            weights_bytes,
        ) {
            return Err(CapiError::invalid("the routing buffers overlap"));
        }
        if router_logits.is_null() {
            return Err(CapiError::null("router_logits"));
        }
        // SAFETY: `logits_len` readable elements of `dtype` per this function's contract.
        let logits = unsafe { float_slice(dtype, router_logits, logits_len, "router_logits")? };
        // SAFETY: `pairs_len` writable i32, not aliased (overlap checked above).
        let ids = unsafe { slice_mut(topk_ids, pairs_len, "topk_ids")? };
        // SAFETY: `pairs_len` writable f32, not aliased (overlap checked above).
        let weights = unsafe { slice_mut(topk_weights, pairs_len, "topk_weights")? };
        let moe = locked(entry.layer.read())?;
        let cfg = moe.config();
        if !logits_len.is_multiple_of(cfg.num_experts.max(1))
            || pairs_len != logits_len / cfg.num_experts.max(1) * cfg.top_k
        {
            return Err(CapiError::invalid(format!(
                "{pairs_len} routing pairs for {logits_len} logits of {} experts, top-{}",
                cfg.num_experts, cfg.top_k
            )));
        }
        let logits = match logits {
            FloatSlice::F32(l) => Logits::F32(l),
            FloatSlice::Bf16(l) => Logits::Bf16(l),
            FloatSlice::F16(l) => Logits::F16(l),
        };
        moe.route(logits, ids, weights)?;
        Ok(())
    })
}

/// Runs the experts on `hidden_len` values (`[T, H]`) of `hidden_states` for precomputed
/// routing: `topk_ids` (global expert ids, `[T, k]`) and `topk_weights` (`[T, k]`), `pairs_len`
/// each, and writes `out_len` (= `hidden_len`) values to `out`, all of dtype `dtype` but the
/// routing. On a rank of a parallel group (`moe_layer_open_checkpoint_ranked`) only this
/// rank's experts and slices run: sum the ranks' outputs. Thread safety and determinism as
/// `moe_layer_apply`.
///
/// # Safety
/// - `hidden_states` is NULL or points to `hidden_len` readable elements of `dtype`;
///   `topk_ids` and `topk_weights` are NULL or point to `pairs_len` readable elements each;
///   `out` is NULL or points to `out_len` writable elements of `dtype` that nothing else
///   touches during the call.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // The C signature: a pointer and a length per buffer.
pub unsafe extern "C" fn moe_layer_apply_topk(
    layer: *mut MoeLayerHandle,
    dtype: u32,
    hidden_states: *const c_void,
    hidden_len: usize,
    topk_ids: *const i32,
    topk_weights: *const f32,
    pairs_len: usize,
    out: *mut c_void,
    out_len: usize,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let dtype = MoeDtype::from_raw(dtype, "dtype")?;
        // SAFETY: the buffers are as this function's contract says; the routing buffers are
        // the other inputs `out` must not overlap.
        let (x, y) = unsafe {
            io_slices(
                dtype,
                (hidden_states, hidden_len),
                (out, out_len),
                &[
                    (topk_ids.cast(), pairs_len * 4),
                    (topk_weights.cast(), pairs_len * 4),
                ],
            )?
        };
        // SAFETY: `pairs_len` readable i32 per this function's contract.
        let ids = unsafe { slice(topk_ids, pairs_len, "topk_ids")? };
        // SAFETY: `pairs_len` readable f32 per this function's contract.
        let weights = unsafe { slice(topk_weights, pairs_len, "topk_weights")? };
        on_pool(&entry, |moe| {
            match (x, y) {
                (FloatSlice::F32(x), FloatSliceMut::F32(y)) => {
                    moe.apply_with_topk(x, ids, weights, y)?
                }
                (FloatSlice::Bf16(x), FloatSliceMut::Bf16(y)) => {
                    moe.apply_with_topk(x, ids, weights, y)?
                }
                (FloatSlice::F16(x), FloatSliceMut::F16(y)) => {
                    moe.apply_with_topk(x, ids, weights, y)?
                }
                _ => return Err(CapiError::invalid("hidden_states and out differ in dtype")),
            }
            Ok(())
        })
    })
}

/// Routes (from `logits`, or from the hidden states through the router gate) and applies.
fn apply_typed<X: MoeFloat>(
    moe: &MoeLayer,
    x: &[X],
    logits: Option<FloatSlice<'_>>,
    out: &mut [X],
) -> Result<(), CapiError> {
    match logits {
        Some(FloatSlice::F32(l)) => moe.apply(x, Logits::F32(l), out)?,
        Some(FloatSlice::Bf16(l)) => moe.apply(x, Logits::Bf16(l), out)?,
        Some(FloatSlice::F16(l)) => moe.apply(x, Logits::F16(l), out)?,
        None => moe.apply_with_gate(x, out)?,
    }
    Ok(())
}

/// Writes the layer's sizes and state to `*out`.
///
/// # Safety
/// - `out` is NULL or valid for one `MoeLayerInfo` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_info(
    layer: *mut MoeLayerHandle,
    out: *mut MoeLayerInfo,
) -> MoeStatus {
    guard(|| {
        let entry = registry::get(layer)?;
        let moe = locked(entry.layer.read())?;
        let cfg = moe.config();
        let info = MoeLayerInfo {
            num_experts: cfg.num_experts,
            top_k: cfg.top_k,
            hidden: cfg.hidden,
            intermediate: cfg.intermediate_per_rank(),
            max_tokens: cfg.max_tokens,
            processed: moe.is_processed(),
        };
        // SAFETY: NULL (refused) or writable per this function's contract.
        unsafe { write_out(out, info, "out") }
    })
}

/// Calls `f` with the C strings of a processed layer's backend report, made on first request
/// and kept with the layer (so pointers into them stay valid until it is freed).
fn with_backend_names<R>(
    layer: *mut MoeLayerHandle,
    f: impl FnOnce(&BackendNames) -> R,
) -> Result<R, CapiError> {
    let entry = registry::get(layer)?;
    if let Some(names) = entry.names.get() {
        return Ok(f(names));
    }
    let info = locked(entry.layer.read())?
        .backend()
        .ok_or_else(|| CapiError::new(MoeStatus::BadState, "the layer is not processed yet"))?;
    let c = |s: String| CString::new(s).unwrap_or_default();
    Ok(f(entry.names.get_or_init(|| BackendNames {
        backend: c(info.backend),
        kernel: c(info.kernel),
        isa: c(info.isa),
        ops: c(info.ops.join("\n")),
    })))
}

/// Writes the chosen backend's names to `*out` (`MOE_STATUS_BAD_STATE` before
/// `moe_layer_process`). The strings stay valid until the layer is freed.
///
/// # Safety
/// - `out` is NULL or valid for one `MoeBackendInfo` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_backend(
    layer: *mut MoeLayerHandle,
    out: *mut MoeBackendInfo,
) -> MoeStatus {
    guard(|| {
        let info = with_backend_names(layer, |names| MoeBackendInfo {
            backend: names.backend.as_ptr(),
            kernel: names.kernel.as_ptr(),
            isa: names.isa.as_ptr(),
        })?;
        // SAFETY: NULL (refused) or writable per this function's contract.
        unsafe { write_out(out, info, "out") }
    })
}

/// Writes to `*out` what a processed layer's kernels run per operation, and with which
/// numerics: one line per operation, joined by `'\n'` (e.g. `wna16_gemm: int4 codes: … (15-bit
/// integer activations) below 8 rows, …`), as `moe cpu` and `moe inspect` print it.
/// `MOE_STATUS_BAD_STATE` before `moe_layer_process`. The string stays valid until the layer is
/// freed.
///
/// # Safety
/// - `out` is NULL or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn moe_layer_backend_ops(
    layer: *mut MoeLayerHandle,
    out: *mut *const c_char,
) -> MoeStatus {
    guard(|| {
        let ops = with_backend_names(layer, |names| names.ops.as_ptr())?;
        // SAFETY: NULL (refused) or writable per this function's contract.
        unsafe { write_out(out, ops, "out") }
    })
}
