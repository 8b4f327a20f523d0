//! The crate's single error type, [`QuantError`]: every way bad input to a public function of
//! moe-quant is rejected, with structured fields naming the argument, what was expected and what
//! was found.

use thiserror::Error;

/// Why a moe-quant function refused its input.
///
/// Fields name the offending argument (`what`), the row and column of a bad element, and the
/// expected and actual values, so callers in higher layers can add their own context (expert id,
/// checkpoint tensor name) without parsing messages.
/// Two variants carry vLLM's messages verbatim, because the oracle surfaces them to users.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum QuantError {
    /// A buffer does not have the length the shape implies.
    #[error("{what}: expected {expected} elements, got {got}")]
    LengthMismatch {
        /// The argument whose length is wrong.
        what: &'static str,
        /// The length the other arguments imply.
        expected: usize,
        /// The length that was passed.
        got: usize,
    },
    /// A tensor with a zero-sized dimension, which has no rows to quantize.
    #[error("{what}: zero-size tensor ({rows} rows x {cols} columns)")]
    EmptyTensor {
        /// The empty argument.
        what: &'static str,
        /// Number of rows given.
        rows: usize,
        /// Number of columns given.
        cols: usize,
    },
    /// A group size of zero.
    #[error("{what}: group size must be positive, got {group_size}")]
    ZeroGroupSize {
        /// The argument holding the group size.
        what: &'static str,
        /// The rejected group size.
        group_size: usize,
    },
    /// A checkpoint group size that is neither positive nor `−1` (channelwise).
    #[error("{what}: must be positive or -1 (channelwise), got {group_size}")]
    InvalidGroupSize {
        /// The argument holding the group size.
        what: &'static str,
        /// The rejected group size.
        group_size: i64,
    },
    /// A group size too large for the integer it must travel as.
    #[error("{what}: group size {group_size} does not fit in {target}")]
    GroupSizeOverflow {
        /// The argument holding the group size.
        what: &'static str,
        /// The rejected group size.
        group_size: u64,
        /// The integer type it does not fit.
        target: &'static str,
    },
    /// A [`crate::GroupShape`] that is not a weight grouping tag: neither `(−1, 1)` (per channel)
    /// nor `(1, g)` with `g > 0` (per group).
    #[error("{shape} is neither per-channel (-1, 1) nor a group (1, g) of weight scales")]
    NotAWeightGrouping {
        /// The rejected shape.
        shape: crate::GroupShape,
    },
    /// The reduction dimension is not a multiple of the group size (vLLM would silently drop the
    /// tail group; we refuse, spec section 6.3).
    #[error("{what}: group size {group_size} does not divide the reduction dimension {k}")]
    GroupSizeNotDividing {
        /// The tensor being grouped.
        what: &'static str,
        /// The group size.
        group_size: usize,
        /// The reduction dimension (columns per row).
        k: usize,
    },
    /// A NaN or infinity where only finite values make sense (weights, scales).
    #[error("{what}: non-finite value {value} at row {row}, column {col}")]
    NonFinite {
        /// The tensor holding the value.
        what: &'static str,
        /// Row of the element.
        row: usize,
        /// Column of the element.
        col: usize,
        /// The value itself (widened to f32).
        value: f32,
    },
    /// An integer code outside the range of the format being packed.
    #[error("{what}: value {value} at index {index} is outside [{min}, {max}]")]
    ValueOutOfRange {
        /// The tensor holding the value.
        what: &'static str,
        /// Flat index of the element.
        index: usize,
        /// The value found.
        value: i32,
        /// Smallest allowed value.
        min: i32,
        /// Largest allowed value.
        max: i32,
    },
    /// A bit width the format or numeric type cannot hold.
    #[error("{what}: num_bits {num_bits} is not supported (allowed {min}..={max})")]
    UnsupportedNumBits {
        /// The format or argument that rejects the width.
        what: &'static str,
        /// The requested width.
        num_bits: u32,
        /// Smallest supported width.
        min: u32,
        /// Largest supported width.
        max: u32,
    },
    /// A dimension that must be even (two nibbles per byte) is odd.
    #[error("{what}: dimension {len} must be even to pair nibbles into bytes")]
    OddDimension {
        /// The argument with the odd dimension.
        what: &'static str,
        /// The odd length.
        len: usize,
    },
    /// A compressed-tensors `QuantizationArgs` field that is inconsistent with the others.
    #[error("quantization args: {field}: {reason}")]
    InvalidQuantArgs {
        /// The offending field, as spelt in `config.json`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A dtype name that is not one of [`crate::DType`]'s spellings.
    #[error("unknown dtype {name:?}")]
    UnknownDType {
        /// The name as given.
        name: String,
    },
    /// A `quantization_config` that is not valid JSON for the expected schema.
    #[error("quantization_config does not parse: {message}")]
    ConfigParse {
        /// The parser's description of the problem.
        message: String,
    },
    /// The W4A8-int MoE method was asked for activations that are not dynamic per-token
    /// (vLLM's constructor message, verbatim).
    #[error("W4A8-int MoE needs dynamic per-token activation quantization.")]
    W4A8NeedsDynamicTokenActivations,
    /// The W4A8-int MoE method was asked for weights that are not 4-bit (vLLM's constructor
    /// message, verbatim).
    #[error("This method only supports 4-bit weights (num_bits=4).")]
    W4A8OnlyFourBitWeights {
        /// The weight width found in the config.
        num_bits: u32,
    },
}
