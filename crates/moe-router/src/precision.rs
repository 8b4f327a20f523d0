//! Where routing rounds: the logits dtypes, the rounding profiles that reproduce PyTorch's
//! evaluation of 16-bit logits, and the scalar maths (exp, softmax, sigmoid) every path shares.
//!
//! All arithmetic here is f32. PyTorch evaluates an element-wise op on a bf16/f16 tensor by
//! widening the operands to f32, computing in f32 and rounding the result to the tensor dtype
//! (round to nearest even); `softmax` on a 16-bit tensor is one such op (max, `exp(x - max)`,
//! sum and division in f32, one rounding at the end), and a sum of a 16-bit tensor accumulates in
//! f32 and rounds once. The profiles below say which of those roundings are reproduced.

use half::{bf16, f16};

/// Element type of the router logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LogitsDtype {
    /// IEEE single precision.
    F32,
    /// bfloat16 (8-bit mantissa).
    Bf16,
    /// IEEE half precision.
    F16,
}

impl LogitsDtype {
    /// Rounds an f32 to this dtype (round to nearest even) and widens it back.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Self::F32 => x,
            Self::Bf16 => bf16::from_f32(x).to_f32(),
            Self::F16 => f16::from_f32(x).to_f32(),
        }
    }
}

/// How faithfully routing reproduces the rounding of a PyTorch reference on 16-bit logits.
///
/// With f32 logits every profile computes the same thing up to the order of operations. The
/// profile matters only for bf16/f16 logits, whose values are always widened exactly to f32 first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RoundingProfile {
    /// Compute everything in f32 after widening the logits (vLLM's CPU grouped top-k, the SGLang
    /// biased top-k kernel, the CUDA kernels). The most accurate choice, and the default.
    #[default]
    F32,
    /// Eager PyTorch on the logits dtype: every op rounds its result to the logits dtype, as
    /// vLLM's CPU softmax top-k (`cpu_router._softmax_topk`, spec §2.2) does. With bf16 logits
    /// its weights carry bf16 precision; this profile reproduces them bit for bit.
    #[doc(alias = "VllmCpu")]
    TorchEager,
    /// `torch.compile`d PyTorch on the logits dtype, as vLLM's generic `grouped_topk` runs off-CPU:
    /// tensors materialised between ops round (the scores, a reduction's result), fused
    /// element-wise chains stay in f32. Observed on vLLM 0.32 / PyTorch 2.13: with a correction
    /// bias the selection uses the unrounded f32 sigmoid plus bias; the weights gather the scores
    /// rounded to the logits dtype; their sum rounds; division and scaling do not.
    /// The CPU softmax path is never compiled upstream and uses the eager roundings here.
    TorchCompiled,
}

/// The rounding points of one routing call, resolved from the profile and the logits dtype.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rounding {
    /// The dtype results round to; `F32` makes every rounding below a no-op.
    pub dtype: LogitsDtype,
    /// Round each score (softmax/sigmoid output) used to weight the experts.
    pub scores_for_weights: bool,
    /// Round each score used for selection (before the correction bias is added).
    pub scores_for_selection: bool,
    /// Round the sum used to renormalise.
    pub renorm_sum: bool,
    /// Round each renormalised weight and each scaled weight.
    pub weight_ops: bool,
}

impl Rounding {
    /// Resolves the rounding points for `profile`, logits of `dtype`, with or without a bias.
    pub fn new(profile: RoundingProfile, dtype: LogitsDtype, has_bias: bool) -> Self {
        let off = Self {
            dtype: LogitsDtype::F32,
            scores_for_weights: false,
            scores_for_selection: false,
            renorm_sum: false,
            weight_ops: false,
        };
        if dtype == LogitsDtype::F32 {
            return off;
        }
        match profile {
            RoundingProfile::F32 => off,
            RoundingProfile::TorchEager => Self {
                dtype,
                scores_for_weights: true,
                scores_for_selection: true,
                renorm_sum: true,
                weight_ops: true,
            },
            RoundingProfile::TorchCompiled => Self {
                dtype,
                scores_for_weights: true,
                scores_for_selection: !has_bias,
                renorm_sum: true,
                weight_ops: false,
            },
        }
    }

    /// Whether any rounding happens at all (the CPU softmax path then runs the eager op chain).
    pub fn is_active(self) -> bool {
        self.dtype != LogitsDtype::F32
    }

    /// Rounds `x` to the logits dtype when `point` is set.
    #[inline]
    pub fn at(self, point: bool, x: f32) -> f32 {
        if point { self.dtype.round(x) } else { x }
    }
}

/// The logistic sigmoid in f32, `1 / (1 + exp(-x))`; 0 for very negative `x`, 1 for large `x`.
#[inline]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `sqrt(softplus(x))` in f32, with softplus written as `max(x, 0) + ln(1 + exp(-|x|))` so it
/// neither overflows for large `x` nor loses the tail for very negative `x`.
#[inline]
pub(crate) fn sqrt_softplus(x: f32) -> f32 {
    (x.max(0.0) + (-x.abs()).exp().ln_1p()).sqrt()
}

/// Softmax of `x` into `out` in f32: subtract the maximum, exponentiate, divide by the sum
/// (a true division, as PyTorch's CPU softmax kernel does, not a multiplication by the inverse).
///
/// Subtracting the maximum keeps `exp` in range (the largest term is `exp(0) = 1`, so the sum is
/// at least 1 and never zero). The sum runs in index order.
pub(crate) fn softmax_into(x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(x.len(), out.len());
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        let e = (v - max).exp();
        *o = e;
        sum += e;
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even gives 1.
        assert_eq!(LogitsDtype::Bf16.round(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(
            LogitsDtype::Bf16.round(1.0 + 3.0 / 256.0),
            1.0 + 4.0 / 256.0
        );
        assert_eq!(LogitsDtype::F32.round(1.0 + 1.0 / 256.0), 1.0 + 1.0 / 256.0);
    }

    #[test]
    fn scalar_functions_stay_finite() {
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert!((sqrt_softplus(0.0) - std::f32::consts::LN_2.sqrt()).abs() < 1e-7);
        assert!((sqrt_softplus(100.0) - 10.0).abs() < 1e-5);
        assert!(sqrt_softplus(-100.0) >= 0.0);
        let mut out = [0.0; 3];
        softmax_into(&[1000.0, 1000.0, -1000.0], &mut out);
        assert_eq!(out, [0.5, 0.5, 0.0]);
    }
}
