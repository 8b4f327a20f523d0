//! Where the pipeline rounds to 16-bit floats: the element types it accepts, the rounding
//! helper, and the per-format rules (which dtype computes, which values are rounded, how the
//! per-token sum rounds).
//!
//! W4A8 follows the op sequence of vLLM's `dynamic_4bit_int_moe` (goldens README, w4a8/moe_*):
//! bf16 `x` with channelwise weights computes in bf16 (PyTorch's bf16 GEMM truncates its output,
//! every elementwise op rounds), every other input computes in f32 (16-bit `x` up-cast); gates
//! are cast to the compute dtype; outputs are cast back to `x`'s dtype and added into zeros in
//! bucket order, each add rounding in that dtype (`index_add`).
//! W8A8 follows spec §5.3: GEMM outputs stay f32, the activation output and each gated expert
//! output are stored in the activation dtype, and the per-token sum accumulates in f32 and
//! rounds once.
//! Dense (float) weights compute everything in f32 and round once at the end.

use half::{bf16, f16};
use moe_quant::{DType, ModelFloat};

/// Rounds an f32 to a float dtype and widens it back (RNE): the value an op computed in that
/// dtype produces. `F32` is the identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    /// No rounding.
    F32,
    /// Round to bf16.
    Bf16,
    /// Round to f16.
    F16,
    /// Truncate to bf16 (toward zero): what PyTorch's bf16 `_dyn_quant_matmul_4bit` reference
    /// kernel does to its f32 results (all 144 outputs of the bf16 GEMM golden match this,
    /// 79 of them differ from round-to-nearest).
    Bf16Trunc,
}

impl Round {
    /// The rounding of an element type.
    pub(crate) fn of<X: MoeFloat>() -> Self {
        match X::DTYPE {
            DType::BF16 => Round::Bf16,
            DType::F16 => Round::F16,
            _ => Round::F32,
        }
    }

    /// Sets every `v` of `xs` to `outer(inner(f(v)))`, choosing the two roundings once per
    /// slice rather than once per element (the per-element `match` kept these loops scalar,
    /// about 7 % of a Qwen3 M=1024 profile).
    #[inline(always)]
    pub(crate) fn map_twice(xs: &mut [f32], inner: Round, outer: Round, f: impl Fn(f32) -> f32) {
        #[inline(always)]
        fn with_outer<const I: u8>(xs: &mut [f32], outer: Round, f: impl Fn(f32) -> f32) {
            match outer {
                Round::F32 => run::<I, 0>(xs, f),
                Round::Bf16 => run::<I, 1>(xs, f),
                Round::F16 => run::<I, 2>(xs, f),
                Round::Bf16Trunc => run::<I, 3>(xs, f),
            }
        }
        #[inline(always)]
        fn run<const I: u8, const O: u8>(xs: &mut [f32], f: impl Fn(f32) -> f32) {
            let (inner, outer) = (Round::from_code(I), Round::from_code(O));
            for v in xs {
                *v = outer.apply(inner.apply(f(*v)));
            }
        }
        match inner {
            Round::F32 => with_outer::<0>(xs, outer, f),
            Round::Bf16 => with_outer::<1>(xs, outer, f),
            Round::F16 => with_outer::<2>(xs, outer, f),
            Round::Bf16Trunc => with_outer::<3>(xs, outer, f),
        }
    }

    /// The rounding numbered `code` by [`Round::map_twice`]'s dispatch (a constant there).
    #[inline(always)]
    pub(crate) const fn from_code(code: u8) -> Self {
        match code {
            0 => Round::F32,
            1 => Round::Bf16,
            2 => Round::F16,
            _ => Round::Bf16Trunc,
        }
    }

    /// Rounds `v`.
    #[inline(always)]
    pub(crate) fn apply(self, v: f32) -> f32 {
        match self {
            Round::F32 => v,
            Round::Bf16 => bf16::from_f32(v).to_f32(),
            Round::F16 => f16::from_f32(v).to_f32(),
            Round::Bf16Trunc if v.is_nan() => v,
            Round::Bf16Trunc => f32::from_bits(v.to_bits() & 0xFFFF_0000),
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// The element types of hidden states and outputs: f32, bf16 and f16.
pub trait MoeFloat: ModelFloat + sealed::Sealed {}
impl MoeFloat for f32 {}
impl MoeFloat for bf16 {}
impl MoeFloat for f16 {}

/// The element types of `topk_ids`: i32 (our router) and i64 (vLLM's kernel signature).
pub trait ExpertId: Copy + Send + Sync + sealed::Sealed {
    /// The id, widened.
    fn to_i64(self) -> i64;
}
impl ExpertId for i32 {
    #[inline]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}
impl ExpertId for i64 {
    #[inline]
    fn to_i64(self) -> i64 {
        self
    }
}

/// How the per-token sum of expert outputs rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SumMode {
    /// `out = round(out + y)` per contribution, in the output dtype (`index_add`, W4A8).
    RoundEachAdd,
    /// f32 accumulation, one rounding at the end (W8A8, spec §5.3 stage 3).
    F32ThenRound,
}

/// The rounding rules of one call, fixed by the weight format, the input dtype and the
/// activation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Numerics {
    /// Rounding of the compute dtype (gathered inputs, activation outputs, gated outputs).
    pub compute: Round,
    /// Rounding of each gated expert output before the per-token sum (the output dtype for
    /// the quantized formats, none for float weights).
    pub expert_out: Round,
    /// Rounding of GEMM outputs (W4A8 bf16 compute: PyTorch's bf16 kernel truncates).
    pub gemm_out: Round,
    /// Whether the router weight is first cast to the compute dtype (W4A8 newest kernel).
    pub round_gate: bool,
    /// How the per-token sum rounds.
    pub sum: SumMode,
}

impl Numerics {
    /// W4A8: bf16 compute only for bf16 inputs with channelwise weights, else f32.
    pub(crate) fn w4a8<X: MoeFloat>(weights_channelwise: bool) -> Self {
        let out = Round::of::<X>();
        let compute = if out == Round::Bf16 && weights_channelwise {
            Round::Bf16
        } else {
            Round::F32
        };
        Self {
            compute,
            expert_out: out,
            gemm_out: if compute == Round::Bf16 {
                Round::Bf16Trunc
            } else {
                Round::F32
            },
            round_gate: true,
            sum: SumMode::RoundEachAdd,
        }
    }

    /// W8A8: everything stored in the activation dtype, GEMM outputs and gates in f32.
    pub(crate) fn w8a8<X: MoeFloat>() -> Self {
        let r = Round::of::<X>();
        Self {
            compute: r,
            expert_out: r,
            gemm_out: Round::F32,
            round_gate: false,
            sum: SumMode::F32ThenRound,
        }
    }

    /// Float weights: everything in f32 (16-bit inputs widened), gates in f32, the per-token
    /// sum in f32 rounded once to the output dtype. Not a vLLM kernel's op sequence (vLLM's
    /// CPU float path is outside the spec); the most accurate order, documented as ours.
    pub(crate) fn float() -> Self {
        Self {
            compute: Round::F32,
            expert_out: Round::F32,
            gemm_out: Round::F32,
            round_gate: false,
            sum: SumMode::F32ThenRound,
        }
    }

    /// The router weight as the pipeline multiplies it.
    #[inline]
    pub(crate) fn gate(&self, w: f32) -> f32 {
        if self.round_gate {
            self.compute.apply(w)
        } else {
            w
        }
    }
}
