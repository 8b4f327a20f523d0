//! The C-visible vocabulary: [`MoeStatus`] (what every function returns), [`MoeDtype`] and
//! [`MoeQuant`] (integer codes the caller passes), and [`CapiError`], the internal error that
//! becomes a status plus the thread's last error message.
//!
//! Codes that come *from* C are taken as plain `u32` and converted with a checked match,
//! because a C caller can pass any integer and an out-of-range value in a Rust enum would be
//! undefined behaviour. Statuses only go *to* C, so they are a real enum.

use moe_layer::LayerError;

/// The outcome of a call. `MOE_STATUS_OK` is zero; every other value comes with a message
/// from `moe_last_error_message` on the same thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeStatus {
    /// The call succeeded.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullPointer = 1,
    /// The layer handle is not one this library handed out, or it was already freed.
    InvalidHandle = 2,
    /// An argument has the wrong size, dtype, alignment or value.
    InvalidArgument = 3,
    /// A string argument is not valid UTF-8.
    InvalidUtf8 = 4,
    /// A file could not be read.
    Io = 5,
    /// A checkpoint file is malformed or disagrees with its `config.json`.
    Checkpoint = 6,
    /// The model, scheme or configuration is valid but not supported by this library.
    Unsupported = 7,
    /// The call does not fit the layer's state: loading after `process`, applying before it,
    /// or using a layer left unusable by an earlier failed load.
    BadState = 8,
    /// An internal error (a bug) was caught at the boundary; the layer involved should be
    /// freed.
    Internal = 9,
}

/// Element types of the buffers a caller passes (`dtype` arguments).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeDtype {
    /// IEEE binary32.
    F32 = 0,
    /// bfloat16, as `uint16_t` bit patterns.
    Bf16 = 1,
    /// IEEE binary16, as `uint16_t` bit patterns.
    F16 = 2,
    /// Signed 8-bit integers (int4 codes of W4A8 weights).
    I8 = 3,
}

impl MoeDtype {
    /// The dtype of code `raw`, or an error naming `field`.
    pub(crate) fn from_raw(raw: u32, field: &str) -> Result<Self, CapiError> {
        Ok(match raw {
            0 => Self::F32,
            1 => Self::Bf16,
            2 => Self::F16,
            3 => Self::I8,
            _ => {
                return Err(CapiError::invalid(format!(
                    "{field}: {raw} is not a MoeDtype (0 = f32, 1 = bf16, 2 = f16, 3 = i8)"
                )));
            }
        })
    }
}

/// Expert weight schemes a layer can be created with (`MoeLayerDesc::quant`). MXFP4 (gpt-oss)
/// and FP8 experts have no value here: their weights are not tensors the name-based loader
/// describes (e2m1 blocks with e8m0 scales, e4m3 codes with block, channel or tensor scales), so such layers are opened from their checkpoints with `moe_layer_open_checkpoint`
/// (and its `_ranked`/`_with` forms), and `moe_layer_create` refuses any other value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeQuant {
    /// compressed-tensors W4A8: int4 codes stored as int8 with f32/bf16/f16 scales (grouped
    /// or channelwise), dynamic per-token int8 activations.
    W4a8 = 0,
    /// vLLM's online int8: float weights quantized per row when the layer is processed.
    Int8Online = 1,
    /// Unquantized experts: f32/bf16/f16 weights kept in their precision (f16 widened to
    /// f32) and run in f32, bf16 experts on the CPU's bf16 path from its row threshold on.
    Unquantized = 2,
    /// compressed-tensors W8A8 int8: int8 codes with f32/bf16/f16 per-output-channel scales
    /// (`[n, 1]`), dynamic per-token int8 activations, on the online int8 method's kernels.
    W8a8 = 3,
}

/// An error on its way to C: the status to return and the message to keep.
#[derive(Debug)]
pub(crate) struct CapiError {
    pub(crate) status: MoeStatus,
    pub(crate) message: String,
}

impl CapiError {
    pub(crate) fn new(status: MoeStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(MoeStatus::InvalidArgument, message)
    }

    pub(crate) fn null(argument: &str) -> Self {
        Self::new(
            MoeStatus::NullPointer,
            format!("{argument}: NULL pointer where a value is required"),
        )
    }
}

impl From<LayerError> for CapiError {
    fn from(e: LayerError) -> Self {
        let status = match &e {
            LayerError::Io { .. } | LayerError::NoWeights { .. } => MoeStatus::Io,
            LayerError::UnsupportedModel { .. }
            | LayerError::UnsupportedScheme { .. }
            | LayerError::Oracle(_) => MoeStatus::Unsupported,
            LayerError::NotProcessed
            | LayerError::AlreadyProcessed
            | LayerError::Unusable { .. }
            | LayerError::MissingParams { .. } => MoeStatus::BadState,
            LayerError::InvalidArgument { .. }
            | LayerError::ParamShape { .. }
            | LayerError::ParamDtype { .. }
            | LayerError::ParamValue { .. }
            | LayerError::GroupSizeNotDividing { .. }
            | LayerError::TensorParallel { .. }
            | LayerError::ExpertMap { .. }
            | LayerError::ExpertParallelMap { .. }
            | LayerError::Router(_)
            | LayerError::Kernel(_) => MoeStatus::InvalidArgument,
            _ => MoeStatus::Checkpoint,
        };
        Self::new(status, e.to_string())
    }
}

/// The symbolic name of `status` (`"MOE_STATUS_OK"`, ...), for logs.
pub(crate) fn status_name(status: MoeStatus) -> &'static std::ffi::CStr {
    match status {
        MoeStatus::Ok => c"MOE_STATUS_OK",
        MoeStatus::NullPointer => c"MOE_STATUS_NULL_POINTER",
        MoeStatus::InvalidHandle => c"MOE_STATUS_INVALID_HANDLE",
        MoeStatus::InvalidArgument => c"MOE_STATUS_INVALID_ARGUMENT",
        MoeStatus::InvalidUtf8 => c"MOE_STATUS_INVALID_UTF8",
        MoeStatus::Io => c"MOE_STATUS_IO",
        MoeStatus::Checkpoint => c"MOE_STATUS_CHECKPOINT",
        MoeStatus::Unsupported => c"MOE_STATUS_UNSUPPORTED",
        MoeStatus::BadState => c"MOE_STATUS_BAD_STATE",
        MoeStatus::Internal => c"MOE_STATUS_INTERNAL",
    }
}
