//! The Marlin module's error type: every input the repack, the permutations, the WNA16
//! post-processing or the CPU executor refuses, with the offending tensor and values named.
//!
//! Where vLLM's repack host function rejects the same input, the message carries the same facts
//! in the same words (spec `marlin.md` §3.1), so a log line can be matched against upstream's.
//! The other variants are the project's stricter rules (spec §12): inputs upstream accepts but
//! turns into wrong weights.

use thiserror::Error;

/// Why a Marlin repack, permutation, post-processing step or executor call was refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Error)]
pub enum MarlinError {
    /// The reduction size is not a multiple of the tile height (16; upstream check).
    #[error("size_k = {size_k} is not divisible by tile_k_size = {tile}")]
    SizeKNotMultiple {
        /// Reduction dimension K supplied.
        size_k: usize,
        /// Required multiple.
        tile: usize,
    },
    /// The output size is not a multiple of the tile width (64; upstream check).
    #[error("size_n = {size_n} is not divisible by tile_n_size = {tile}")]
    SizeNNotMultiple {
        /// Output dimension N supplied.
        size_n: usize,
        /// Required multiple.
        tile: usize,
    },
    /// Only 4- and 8-bit weights have a Marlin layout (upstream check).
    #[error("num_bits must be 4 or 8. Got = {num_bits}")]
    UnsupportedBits {
        /// Bit width supplied.
        num_bits: u32,
    },
    /// The packed GPTQ tensor does not have `K / pack_factor` rows (upstream check).
    #[error(
        "Shape mismatch: b_q_weight.size(0) = {rows}, size_k = {size_k}, pack_factor = {pack_factor}"
    )]
    QweightRowsMismatch {
        /// Rows of the packed tensor.
        rows: usize,
        /// Reduction dimension K.
        size_k: usize,
        /// Codes per 32-bit word.
        pack_factor: usize,
    },
    /// The packed GPTQ tensor does not have `N` columns (upstream check).
    #[error("b_q_weight.size(1) = {cols} is not size_n = {size_n}")]
    QweightColsMismatch {
        /// Columns of the packed tensor.
        cols: usize,
        /// Output dimension N.
        size_n: usize,
    },
    /// The act-order permutation cannot be combined with the 8-bit-activation layout (upstream
    /// check).
    #[error("Unsupported repack config: num_bits = {num_bits}, has_perm = 1, is_a_8bit = 1")]
    PermWithA8 {
        /// Bit width supplied.
        num_bits: u32,
    },
    /// With 8-bit activations the tiles are 32 rows high; upstream only checks 16 and leaves the
    /// last rows of the output uninitialised (project rule, spec §3.1).
    #[error("size_k = {size_k} is not divisible by 32, which the 8-bit-activation layout needs")]
    A8SizeKNotMultipleOf32 {
        /// Reduction dimension K supplied.
        size_k: usize,
    },
    /// A permutation has the wrong length (project rule): K per expert, or `E·K` for a
    /// batched call (then `expert` is 0).
    #[error(
        "{tensor} (from expert {expert}) has {got} entries, expected {expected} (size_k per expert)"
    )]
    PermLength {
        /// Which tensor (`"perm"`, `"w13_sort_indices"`, ...).
        tensor: &'static str,
        /// Expert index (0 for a single matrix).
        expert: usize,
        /// Required length K.
        expected: usize,
        /// Length supplied.
        got: usize,
    },
    /// A permutation repeats or skips an index (project rule; upstream reads whatever it
    /// points at).
    #[error("{tensor}[{expert}] is not a permutation of 0..{size_k}: entry {index} is {value}")]
    NotAPermutation {
        /// Which tensor.
        tensor: &'static str,
        /// Expert index.
        expert: usize,
        /// Length of the permutation.
        size_k: usize,
        /// Position of the first out-of-range or repeated entry.
        index: usize,
        /// The offending value.
        value: u64,
    },
    /// A sort permutation does not sort the group indices it was given for.
    #[error(
        "{tensor}[{expert}] does not sort g_idx: position {index} goes from group {prev} to {next}"
    )]
    PermDoesNotSortGIdx {
        /// Which tensor.
        tensor: &'static str,
        /// Expert index.
        expert: usize,
        /// First position where the gathered g_idx decreases.
        index: usize,
        /// Group before that position.
        prev: u64,
        /// Group at that position.
        next: u64,
    },
    /// A slice does not hold the number of elements its shape implies.
    #[error("{tensor}: expected {expected} elements, got {got}")]
    LengthMismatch {
        /// Which tensor or argument.
        tensor: &'static str,
        /// Element count implied by the other arguments.
        expected: usize,
        /// Element count supplied.
        got: usize,
    },
    /// A shape product does not fit in `usize`.
    #[error("{what}: the shape product overflows usize")]
    ShapeOverflow {
        /// Which size was being computed.
        what: &'static str,
    },
    /// The group size is not one Marlin runs, or does not divide K.
    #[error("{tensor}: group_size = {group_size} is invalid for size_k = {size_k}: {reason}")]
    InvalidGroupSize {
        /// Which weight (`"w13"`, `"w2"`, ...).
        tensor: &'static str,
        /// Group size supplied.
        group_size: usize,
        /// Reduction dimension K.
        size_k: usize,
        /// Why it is refused.
        reason: &'static str,
    },
    /// An act-order `g_idx` is not a valid group assignment: a value out of range, or a group
    /// without exactly `group_size` members.
    #[error("{tensor}[{expert}]: group {group} has {count} members, expected {expected}")]
    GIdxNotGroupPermutation {
        /// Which tensor.
        tensor: &'static str,
        /// Expert index.
        expert: usize,
        /// The offending group id (the first out-of-range value when `count` is 0 and `group`
        /// is not below the group count).
        group: u64,
        /// Members found.
        count: usize,
        /// Members required (the group size).
        expected: usize,
    },
    /// FP8 activations need 4-bit weights: the FP8 weight remap exists only for 4-bit codes
    /// (project rule, spec §7.1, §12.7).
    #[error("FP8 activations need 4-bit weights; got num_bits = {num_bits}")]
    Fp8NeedsInt4 {
        /// Bit width supplied.
        num_bits: u32,
    },
    /// INT8 activations with 8-bit weights (W8A8) have no Marlin kernel (project rule, spec
    /// §12.5).
    #[error(
        "W8A8-INT8 is not supported by the Marlin kernels: INT8 activations need 4-bit weights, got num_bits = {num_bits}"
    )]
    W8A8Unsupported {
        /// Bit width supplied.
        num_bits: u32,
    },
    /// A scale is negative where the INT8-activation kernel would read it as unsigned (vLLM
    /// reads it as unsigned: vllm-project/vllm#48905; project rule, spec §7.2, §12.9).
    #[error(
        "{tensor}: scale {value} at index {index} is negative; INT8 activations need non-negative scales"
    )]
    NegativeScale {
        /// Which tensor.
        tensor: &'static str,
        /// Flat index of the first negative scale.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A scale is NaN or infinite, or a scale transformation would make it so (the FP8 ×512
    /// overflowing fp16, an all-zero INT8 scale tensor).
    #[error("{tensor}: scale {value} at index {index} is not usable: {reason}")]
    BadScale {
        /// Which tensor.
        tensor: &'static str,
        /// Flat index of the offending scale.
        index: usize,
        /// Its value (before the transformation).
        value: f32,
        /// What goes wrong.
        reason: &'static str,
    },
    /// An unpacked code does not fit the weight bit width.
    #[error("{tensor}: code {value} at index {index} exceeds {max}")]
    CodeOutOfRange {
        /// Which tensor.
        tensor: &'static str,
        /// Flat index of the first offending code.
        index: usize,
        /// The offending code.
        value: u8,
        /// Largest code of the bit width.
        max: u32,
    },
    /// A combination of options the Marlin path does not support.
    #[error("unsupported Marlin configuration: {reason}")]
    Unsupported {
        /// What is refused and why.
        reason: &'static str,
    },
}

/// Checks `got == expected` for the slice named `tensor`.
pub(crate) fn check_len(
    tensor: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), MarlinError> {
    if expected == got {
        Ok(())
    } else {
        Err(MarlinError::LengthMismatch {
            tensor,
            expected,
            got,
        })
    }
}

/// Multiplies shape factors, naming the size on overflow.
pub(crate) fn checked_product(what: &'static str, factors: &[usize]) -> Result<usize, MarlinError> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or(MarlinError::ShapeOverflow { what })
}
