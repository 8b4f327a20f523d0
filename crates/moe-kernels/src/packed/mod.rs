//! Our packed weight formats, built once at load time and read by every rung's microkernels.
//!
//! The quantized formats cut the `[N, K]` weight matrix into panels of [`PANEL`] output channels; inside a
//! panel, K runs in steps whose bytes form exactly one 64-byte vector: 16 channels × 4
//! consecutive K values, the operand layout of `vpdpbusd` (one i32 lane per channel) and also one
//! row of an AMX B tile. The int8 formats can instead pair their steps for `smmla`
//! ([`PanelOrder::Pairs`]), chosen when they are packed. The dense (float) format uses the same
//! panels with one f32 or bf16 per channel and K value. See `docs/kernels.md` for the tables.

pub mod dense;
pub mod w4a8;
pub mod w8a8;
pub mod wna16;

pub use dense::PackedDense;
pub use w4a8::{PackedW4A8, W4A8Scales};
pub use w8a8::PackedW8A8;
pub use wna16::{
    AWQ_FIELD_OF_CHANNEL, E2M1_VALUES, FP8_BLOCK, Fp8Desc, Fp8Rows, Fp8Scales, Int4Values,
    Int8Values, Mxfp4Desc, PackedWna16, Wna16Desc, Wna16Scales, Wna16WordsDesc, WordOrder,
    WordRows, e4m3_value,
};

/// The order of the bytes inside a panel of the int8 formats ([`PackedW4A8`], [`PackedW8A8`]),
/// chosen when the weights are packed; the values, panels, steps and sizes are the same in
/// every order, and every kernel reads every order (a kernel without a body for one hands the
/// call to the portable body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum PanelOrder {
    /// Each 64-byte step is 16 channels × 4 consecutive K values (4 bytes per channel, one
    /// 32-bit lane): the operand of `vpdpbusd`, of `sdot` by element and one row of an AMX B
    /// tile. W4A8 keeps K values `8s..8s+4` in the low nibbles and `8s+4..8s+8` in the high ones.
    #[default]
    Lanes,
    /// Two consecutive steps form 128 bytes of 8 slices of 16 bytes, slice `u` being channels
    /// `2u` and `2u + 1` × 8 consecutive K values (8 bytes each): the weight operand of
    /// `smmla`. W8A8 puts the pair's 8 K values in the bytes; W4A8 the first 8 of its 16 K
    /// values in the low nibbles and the next 8 in the high ones. An odd last step keeps the
    /// [`PanelOrder::Lanes`] order.
    Pairs,
}

impl PanelOrder {
    /// Whether step `s` of a panel of `steps` steps lies in a pair (the others, an odd last
    /// step, are in the lane order).
    pub(crate) fn paired(self, s: usize, steps: usize) -> bool {
        self == Self::Pairs && s < steps & !1
    }
}

/// Output channels per panel: one 16-lane i32 vector, or two 8-lane ones.
pub const PANEL: usize = 16;

/// Bytes of one K step of a panel: 16 channels × 4 bytes.
pub const STEP_BYTES: usize = 64;

// One step is one 512-bit vector and one AMX B-tile row: 16 i32 lanes of 4 bytes.
const _: () = assert!(STEP_BYTES == PANEL * 4 && STEP_BYTES == 512 / 8);

/// Rounds `x` up to a multiple of `to`.
pub(crate) const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Whether `ok` holds for every value: a branch-free pass over blocks (which vectorises), so
/// that checking input that is valid, the common case, does not pay for finding the first bad
/// index; callers look for it only when this says no.
pub(crate) fn all_branch_free<T: Copy>(v: &[T], ok: impl Fn(T) -> bool) -> bool {
    v.chunks(4096)
        .all(|b| b.iter().fold(true, |all, &x| all & ok(x)))
}

/// Checks `got == expected` for the slice named `tensor`.
pub(crate) fn check_len(
    tensor: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), crate::KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(crate::KernelError::LengthMismatch {
            tensor,
            expected,
            got,
        })
    }
}
