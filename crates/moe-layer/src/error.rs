//! The crate's single error type, [`LayerError`]: every way moe-layer refuses its input, with
//! structured fields naming the file, the tensor or argument, what was expected and what was
//! found.
//!
//! Checkpoint errors always name the file they are about (`config.json`, the shard or the
//! shard index), and tensor errors also name the tensor, so a user can find the offending entry
//! without a debugger. Dtypes appear as strings (`"bf16"`, `"i32"`) so the type does not depend
//! on the optional safetensors dependency.

use std::path::PathBuf;

use thiserror::Error;

/// Why a moe-layer function refused its input.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LayerError {
    /// A file could not be opened or read.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The model directory has neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{}: no model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights {
        /// The model directory.
        dir: PathBuf,
    },

    /// A JSON file (`config.json`, the shard index, `quantize_config.json`) does not parse or
    /// does not have the expected schema.
    #[error("{}: does not parse: {message}", file.display())]
    JsonParse {
        /// The JSON file.
        file: PathBuf,
        /// The parser's description of the problem.
        message: String,
    },

    /// A `config.json` field is missing or holds a value that makes no sense.
    #[error("{}: field {field}: {reason}", file.display())]
    ConfigField {
        /// The config file.
        file: PathBuf,
        /// The field, as spelt in the file.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The model family (`model_type` / `architectures`) has no MoE name mapping here.
    #[error(
        "{}: unsupported model family (model_type {model_type:?}, architectures {architectures:?}); \
         supported: qwen2_moe, qwen3_moe, mixtral, deepseek_v2, deepseek_v3",
        file.display()
    )]
    UnsupportedModel {
        /// The config file.
        file: PathBuf,
        /// `model_type` as written (empty when absent).
        model_type: String,
        /// `architectures` as written.
        architectures: Vec<String>,
    },

    /// The checkpoint's quantization scheme cannot be loaded.
    #[error("{}: unsupported quantization scheme {scheme}: {reason}", file.display())]
    UnsupportedScheme {
        /// The file describing the scheme (`config.json` or `quantize_config.json`).
        file: PathBuf,
        /// The scheme, e.g. `compressed-tensors/int-quantized` or `gptq`.
        scheme: String,
        /// Why it is refused.
        reason: String,
    },

    /// A `quantization_config` rejected by moe-quant's checks.
    #[error("{}: quantization_config: {source}", file.display())]
    QuantConfig {
        /// The config file.
        file: PathBuf,
        /// moe-quant's error.
        source: moe_quant::QuantError,
    },

    /// A safetensors file whose header or layout is invalid (truncated file, offsets past the
    /// end, malformed JSON header, sizes that do not match the dtype and shape).
    #[error("{}: invalid safetensors file: {reason}", file.display())]
    InvalidSafetensors {
        /// The shard.
        file: PathBuf,
        /// The safetensors crate's description.
        reason: String,
    },

    /// A tensor the layer needs is not in the checkpoint.
    #[error("{}: missing tensor {tensor}", file.display())]
    MissingTensor {
        /// The tensor name.
        tensor: String,
        /// Where it was looked for: the shard the index names, the index itself when it does
        /// not list the tensor, or `model.safetensors`.
        file: PathBuf,
    },

    /// A tensor has a dtype the format does not allow.
    #[error("{}: tensor {tensor}: expected dtype {expected}, got {actual}", file.display())]
    WrongDtype {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// The allowed dtype(s).
        expected: String,
        /// The dtype found.
        actual: String,
    },

    /// A tensor's shape differs from the one its format and neighbours imply.
    #[error("{}: tensor {tensor}: expected shape {expected:?}, got {actual:?}", file.display())]
    WrongShape {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// The expected shape.
        expected: Vec<usize>,
        /// The shape found.
        actual: Vec<usize>,
    },

    /// `config.json` and a tensor disagree about a size.
    #[error(
        "{}: tensor {tensor} has {tensor_value} where {} says {field} = {config_value}",
        file.display(), config.display()
    )]
    ConfigMismatch {
        /// The config file.
        config: PathBuf,
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// The config field the size comes from.
        field: &'static str,
        /// The size the config implies.
        config_value: usize,
        /// The size the tensor has.
        tensor_value: usize,
    },

    /// The checkpoint holds an expert index at or beyond `num_experts`.
    #[error("{}: tensor {tensor} belongs to expert {expert}, but num_experts = {num_experts}", file.display())]
    ExtraExpert {
        /// The tensor name.
        tensor: String,
        /// The shard holding it (or the index listing it).
        file: PathBuf,
        /// The expert index in the name.
        expert: usize,
        /// `num_experts` from the config.
        num_experts: usize,
    },

    /// A scale that is NaN, infinite or negative.
    #[error("{}: tensor {tensor}: scale {value} at index {index} is not finite and non-negative", file.display())]
    BadScale {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// Flat index of the element in the tensor as stored.
        index: usize,
        /// The value, widened to f32.
        value: f32,
    },

    /// A NaN or infinite value in a tensor that must be finite (router weights, correction
    /// bias).
    #[error("{}: tensor {tensor}: non-finite value {value} at index {index}", file.display())]
    NonFinite {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// Flat index of the element in the tensor as stored.
        index: usize,
        /// The value, widened to f32.
        value: f32,
    },

    /// A quantized code outside the range of its bit width.
    #[error("{}: tensor {tensor}: code {value} at index {index} is outside [{min}, {max}]", file.display())]
    CodeOutOfRange {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// Flat index of the element in the tensor as stored.
        index: usize,
        /// The code found.
        value: i64,
        /// Smallest allowed code.
        min: i64,
        /// Largest allowed code.
        max: i64,
    },

    /// An act-order `g_idx` entry that is out of range, or gate and up projections whose
    /// `g_idx` differ.
    #[error("{}: tensor {tensor}: {reason}", file.display())]
    BadGroupIndex {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },

    /// The group size does not divide the reduction dimension (vLLM would silently drop the
    /// tail group; spec section 6.3).
    #[error("{tensor}: group size {group_size} does not divide the reduction dimension {k}")]
    GroupSizeNotDividing {
        /// The tensor (or tensor family) being grouped.
        tensor: String,
        /// The group size.
        group_size: usize,
        /// The reduction dimension.
        k: usize,
    },

    /// A tensor-parallel request that cannot be honoured: a rank outside `0..tp_size`, or an
    /// intermediate size that does not split into whole scale groups per rank.
    #[error("tensor parallelism: {reason} (tp_rank {tp_rank}, tp_size {tp_size})")]
    TensorParallel {
        /// The rank asked for.
        tp_rank: usize,
        /// The number of ranks.
        tp_size: usize,
        /// What is wrong.
        reason: String,
    },

    /// An expert map that is not a valid global-to-local map for this checkpoint.
    #[error("expert_map: {reason}")]
    ExpertMap {
        /// What is wrong.
        reason: String,
    },

    /// Expert parallelism whose expert map disagrees with the rank: rank `ep_rank` of
    /// `ep_size` holds `expected` of the `num_experts` experts (`E / ep_size`, one more on the
    /// first `E % ep_size` ranks, whatever the placement), the map `actual` (`None`: no map,
    /// so every expert).
    #[error(
        "expert_map: rank {ep_rank} of {ep_size} expert-parallel ranks holds {expected} of \
         {num_experts} experts, {}",
        held(.actual)
    )]
    ExpertParallelMap {
        /// This rank's expert-parallel index.
        ep_rank: usize,
        /// Expert-parallel ranks.
        ep_size: usize,
        /// Global experts.
        num_experts: usize,
        /// Local experts the rank holds under the split.
        expected: usize,
        /// Local experts of the map, or `None` without a map.
        actual: Option<usize>,
    },

    /// The layer asked for is not a MoE layer of this model.
    #[error("layer {layer} is not a MoE layer (MoE layers: {moe_layers:?})")]
    NotMoeLayer {
        /// The layer asked for.
        layer: usize,
        /// The model's MoE layers.
        moe_layers: Vec<usize>,
    },

    /// A moe-quant function refused data read from a tensor.
    #[error("{}: tensor {tensor}: {source}", file.display())]
    Quant {
        /// The tensor name.
        tensor: String,
        /// The shard holding it.
        file: PathBuf,
        /// moe-quant's error.
        source: moe_quant::QuantError,
    },

    /// A layer parameter given to [`MoeLayer`](crate::MoeLayer) has the wrong shape.
    #[error("layer parameter {tensor}: expected shape {expected:?}, got {actual:?}")]
    ParamShape {
        /// The tensor, as the caller named it.
        tensor: String,
        /// The expected shape.
        expected: Vec<usize>,
        /// The shape given.
        actual: Vec<usize>,
    },

    /// A layer parameter given to [`MoeLayer`](crate::MoeLayer) has a dtype the scheme does
    /// not allow.
    #[error("layer parameter {tensor}: expected dtype {expected}, got {actual}")]
    ParamDtype {
        /// The tensor, as the caller named it.
        tensor: String,
        /// The allowed dtype(s).
        expected: String,
        /// The dtype given.
        actual: String,
    },

    /// A layer parameter holds a value its scheme does not allow (an int4 code outside
    /// `[-8, 7]`, a negative or non-finite scale, a group scale that overflows bf16).
    #[error("layer parameter {tensor}: value {value} at index {index}: {reason}")]
    ParamValue {
        /// The tensor, as the caller named it.
        tensor: String,
        /// Flat index in the tensor as given.
        index: usize,
        /// The value, widened to f64.
        value: f64,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A layer configuration or call argument that makes no sense.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field or argument.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },

    /// A NaN or infinite value in a call argument that must be finite (`hidden_states`,
    /// `topk_weights`). The layer refuses the whole call rather than return rows computed from
    /// it (see `docs/reliability.md`).
    #[error("{field}: non-finite value {value} at row {row}, column {column}")]
    NonFiniteInput {
        /// The argument.
        field: &'static str,
        /// The token (row) holding the value.
        row: usize,
        /// The column within the row.
        column: usize,
        /// The value, widened to f32.
        value: f32,
    },

    /// `process` found parameters that were never loaded.
    #[error("layer parameters never loaded: {}", missing.join(", "))]
    MissingParams {
        /// The missing parameters, e.g. `experts.3.w2.weight_scale`.
        missing: Vec<String>,
    },

    /// `apply` called before `process` succeeded.
    #[error("the layer is not processed yet: call process() after loading")]
    NotProcessed,

    /// A load or process step failed earlier; the layer holds no usable weights.
    #[error("the layer is unusable after an earlier failure: {reason}")]
    Unusable {
        /// The earlier failure.
        reason: String,
    },

    /// A load step after `process` (weights are packed and the originals freed).
    #[error("the layer is already processed; tensors can no longer be loaded")]
    AlreadyProcessed,

    /// The kernels refused the weights or a call.
    #[error("kernels: {0}")]
    Kernel(#[from] moe_kernels::KernelError),

    /// The Marlin repack or executor refused the WNA16 weights.
    #[error("marlin: {0}")]
    Marlin(#[from] moe_kernels::marlin::MarlinError),

    /// The router refused its configuration or a call.
    #[error("router: {0}")]
    Router(#[from] moe_router::RouterError),

    /// No backend supports the layer configuration.
    #[error("backend selection: {0}")]
    Oracle(#[from] moe_oracle::OracleError),
}

/// What an expert map holds, for [`LayerError::ExpertParallelMap`].
fn held(actual: &Option<usize>) -> String {
    match *actual {
        Some(n) => format!("the map holds {n}"),
        None => "but no expert_map was given (every expert would be local)".into(),
    }
}
