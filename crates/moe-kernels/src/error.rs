//! The crate's one error type: everything a caller can get wrong when packing weights or calling
//! a GEMM, with the offending tensor or argument named.
//!
//! Kernels themselves never return errors: every shape, length and range is checked here, at
//! packing time or at the entry of the GEMM driver, and the kernels only `debug_assert!`.

use thiserror::Error;

/// Why a packing or GEMM call was refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A slice does not hold the number of elements its shape implies.
    #[error("{tensor}: expected {expected} elements, got {got}")]
    LengthMismatch {
        /// Which tensor or argument (`"x"`, `"w_int4"`, `"scales"`, `"bias"`, `"out"`, ...).
        tensor: &'static str,
        /// Element count implied by the other arguments.
        expected: usize,
        /// Element count supplied.
        got: usize,
    },
    /// Two operands disagree on a shared dimension.
    #[error("{tensor}: dimension {dim} is {got}, but the {other} has {expected}")]
    ShapeMismatch {
        /// The operand whose dimension is wrong.
        tensor: &'static str,
        /// The dimension's name (`"K"`, `"N"`, ...).
        dim: &'static str,
        /// The operand the value must agree with.
        other: &'static str,
        /// The value of that operand.
        expected: usize,
        /// The value supplied.
        got: usize,
    },
    /// The weight group size does not fit the reduction dimension.
    #[error(
        "group size {group_size} is invalid for K = {k}: it must be a multiple of 32 that divides K"
    )]
    InvalidGroupSize {
        /// Group size supplied.
        group_size: usize,
        /// Reduction dimension of the weights.
        k: usize,
    },
    /// A dimension is outside what the kernels support.
    #[error("{dim} = {got} is not supported: {reason}")]
    UnsupportedDim {
        /// The dimension's name.
        dim: &'static str,
        /// The value supplied.
        got: usize,
        /// Why the value is refused.
        reason: &'static str,
    },
    /// An integer code lies outside the range of its format.
    #[error("{tensor}: value {value} at index {index} is outside [{min}, {max}]")]
    ValueOutOfRange {
        /// Which tensor.
        tensor: &'static str,
        /// Flat index of the first offending element.
        index: usize,
        /// The offending value.
        value: i64,
        /// Smallest allowed value.
        min: i64,
        /// Largest allowed value.
        max: i64,
    },
    /// A routed expert id lies outside the experts the layer knows (vLLM: "expert id out of
    /// range").
    #[error("expert id out of range: {tensor}[{index}] = {id}, expected 0..{num_experts}")]
    ExpertIdOutOfRange {
        /// Which tensor (`"topk_ids"`).
        tensor: &'static str,
        /// Flat index of the first offending id.
        index: usize,
        /// The offending id.
        id: i64,
        /// Number of (global) experts; valid ids are `0..num_experts`.
        num_experts: usize,
    },
    /// One expert's weight matrix has the wrong shape.
    #[error("{tensor}[{expert}]: dimension {dim} is {got}, expected {expected}")]
    ExpertShapeMismatch {
        /// Which stacked tensor (`"w13"`, `"w2"`).
        tensor: &'static str,
        /// The expert (local index).
        expert: usize,
        /// The dimension's name (`"N"`, `"K"`).
        dim: &'static str,
        /// Value implied by the layer's hidden and intermediate sizes.
        expected: usize,
        /// Value of the matrix.
        got: usize,
    },
    /// A call needs more working memory than its scratch was sized for; the scratch never
    /// grows on the hot path, so the caller must size a larger one (or split the call).
    #[error("scratch was sized for {what} = {capacity}, but this call needs {needed}")]
    ScratchTooSmall {
        /// The sized quantity (`"tokens"`, `"token-expert pairs"`).
        what: &'static str,
        /// What the scratch holds.
        capacity: usize,
        /// What the call needs.
        needed: usize,
    },
    /// A scratch was sized for a layer of another shape.
    #[error("scratch was sized for {dim} = {scratch}, but the layer has {layer}")]
    ScratchMismatch {
        /// The dimension's name (`"H"`, `"I"`, `"E"`).
        dim: &'static str,
        /// The value the scratch was sized for.
        scratch: usize,
        /// The layer's value.
        layer: usize,
    },
    /// A combination of options the pipeline does not support.
    #[error("unsupported configuration: {reason}")]
    Unsupported {
        /// What is refused and why.
        reason: &'static str,
    },
    /// A float weight is NaN or infinite.
    #[error("{tensor}: element {index} is {value}, but weights must be finite")]
    NonFiniteWeight {
        /// Which tensor.
        tensor: &'static str,
        /// Flat index of the first offending element.
        index: usize,
        /// The value, printed (`NaN`, `inf`, `-inf`).
        value: String,
    },
    /// A Marlin-format expert refused a call (see [`crate::marlin::MarlinError`]).
    #[error("Marlin weights: {reason}")]
    Marlin {
        /// The Marlin error, printed.
        reason: String,
    },
}
