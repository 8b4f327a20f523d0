//! The gated activations of the expert MLP (spec §3): which half of `h = x·w13ᵀ` is the gate,
//! the formulas, and vLLM's CPU int4 kernel's deviations as a separate compatibility mode.
//!
//! An activation maps one row `h[2I]` to `a[I]`. The gate/up split is never inferred: the
//! weights carry a [`GateUpLayout`].

use super::exp::exp;
use super::numerics::Round;
use crate::KernelError;

/// How gate and up rows are arranged in `w13` (and therefore in `h`), spec §1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateUpLayout {
    /// Rows `0..I` are the gate, rows `I..2I` the up projection (vLLM's `w13` convention).
    Concatenated,
    /// Gate and up alternate: `[g0, u0, g1, u1, …]` (gpt-oss `gate_up_proj`).
    Interleaved,
}

/// What vLLM's CPU int4 MoE kernel is told (`CPUExpertsInt4._activation_kind`, spec §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Int4ActivationKind {
    /// Kind 0, requested for `SWIGLUSTEP`; the kernel computes plain `silu(g)·u`.
    SwigluStep,
    /// Kind 1, requested for `SWIGLUOAI`; the kernel computes SwiGLU-OAI (α 1.702, limit 7)
    /// on the concatenated halves.
    SwigluOai,
    /// Kind 2, requested for `SILU`; the kernel computes `silu(g)·u`.
    Silu,
}

impl Int4ActivationKind {
    /// The kind from the integer vLLM passes (metadata `activation_kind` of the goldens).
    pub fn from_kind(kind: i64) -> Result<Self, KernelError> {
        match kind {
            0 => Ok(Self::SwigluStep),
            1 => Ok(Self::SwigluOai),
            2 => Ok(Self::Silu),
            _ => Err(KernelError::ValueOutOfRange {
                tensor: "activation_kind",
                index: 0,
                value: kind,
                min: 0,
                max: 2,
            }),
        }
    }

    /// The integer vLLM passes for this kind.
    pub fn kind(self) -> i64 {
        match self {
            Self::SwigluStep => 0,
            Self::SwigluOai => 1,
            Self::Silu => 2,
        }
    }
}

/// A gated activation `a = φ(g) ⊙ u` (spec §3.2), computed in f32.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Activation {
    /// `silu(g)·u`; with a clamp limit `L`: `silu(min(g, L))·clamp(u, −L, L)`.
    Silu {
        /// The optional clamp limit (vLLM's `swiglu_limit`).
        limit: Option<f32>,
    },
    /// SwiGLU-OAI: `g' = min(g, L)`, `u' = clamp(u, −L, L)`, `a = g'·σ(α·g')·(u' + 1)`.
    /// Works on either [`GateUpLayout`]; vLLM's `SWIGLUOAI` means the interleaved one.
    SwigluOai {
        /// Sigmoid slope α (1.702 for gpt-oss).
        alpha: f32,
        /// Clamp limit L (7.0 for gpt-oss).
        limit: f32,
    },
    /// SwiGLU-step: `min(silu(g), 7)·clamp(u, −7, 7)` (clamps the silu output, not the gate).
    SwigluStep,
    /// `gelu_erf(g)·u`, `gelu_erf(v) = 0.5·v·(1 + erf(v/√2))`.
    Gelu,
    /// `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))·u`.
    GeluTanh,
    /// What vLLM's CPU int4 kernel computes for the kind it is given (spec §3.3): kinds 0 and 2
    /// are plain `silu(g)·u`, kind 1 is SwiGLU-OAI (α 1.702, limit 7) on the concatenated
    /// halves. Evaluated op by op as the PyTorch port does (with 16-bit compute, each op
    /// rounds). Only for W4A8 weights with [`GateUpLayout::Concatenated`]; for parity tests.
    VllmCpuInt4Compat(Int4ActivationKind),
}

/// gpt-oss's SwiGLU constants.
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;
/// SwiGLU-step's fixed clamp.
const STEP_LIMIT: f32 = 7.0;

impl Activation {
    /// Plain SiLU-and-mul.
    pub const SILU: Self = Self::Silu { limit: None };
    /// SwiGLU-OAI with gpt-oss's α = 1.702 and limit 7.
    pub const SWIGLU_OAI: Self = Self::SwigluOai {
        alpha: OAI_ALPHA,
        limit: OAI_LIMIT,
    };

    /// Rejects parameters that make no sense (NaN limits or slopes) and combinations with the
    /// layout that the activation cannot honour.
    pub(crate) fn validate(self, layout: GateUpLayout) -> Result<(), KernelError> {
        match self {
            Self::Silu { limit: Some(l) } if l.is_nan() => Err(KernelError::Unsupported {
                reason: "SiLU clamp limit is NaN",
            }),
            Self::SwigluOai { alpha, limit } if alpha.is_nan() || limit.is_nan() => {
                Err(KernelError::Unsupported {
                    reason: "SwiGLU-OAI alpha or limit is NaN",
                })
            }
            Self::VllmCpuInt4Compat(_) if layout != GateUpLayout::Concatenated => {
                Err(KernelError::Unsupported {
                    reason: "the vLLM CPU int4 compatibility activation reads concatenated \
                             gate/up halves; the weights are interleaved",
                })
            }
            _ => Ok(()),
        }
    }

    /// `a[i] = φ(g_i, u_i)` for one row, `h.len() == 2·a.len()`. Results are rounded with
    /// `round`: once per element, or after every op for the compatibility mode.
    ///
    /// The formulas vectorise; on x86-64 the loop is compiled a second time for AVX-512 and
    /// chosen at run time. Both copies execute the same IEEE operations in the same order (Rust
    /// never contracts to FMA), so the bits do not depend on the copy (a NaN result may differ
    /// in its sign bit only).
    pub(crate) fn apply_row(self, layout: GateUpLayout, h: &[f32], a: &mut [f32], round: Round) {
        debug_assert_eq!(h.len(), 2 * a.len());
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512 F, checked just above.
            unsafe { self.apply_row_avx512(layout, h, a, round) };
            return;
        }
        self.apply_row_portable(layout, h, a, round);
    }

    /// [`Activation::apply_row`] compiled with AVX-512 F.
    ///
    /// # Safety
    /// - The CPU supports AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn apply_row_avx512(self, layout: GateUpLayout, h: &[f32], a: &mut [f32], round: Round) {
        self.apply_row_portable(layout, h, a, round);
    }

    /// The formulas of [`Activation::apply_row`], inlined into each compiled copy, with the
    /// rounding chosen once per row (a `match` per element keeps the loop scalar).
    #[inline(always)]
    fn apply_row_portable(self, layout: GateUpLayout, h: &[f32], a: &mut [f32], round: Round) {
        match round {
            Round::F32 => self.apply_row_rounded::<0>(layout, h, a),
            Round::Bf16 => self.apply_row_rounded::<1>(layout, h, a),
            Round::F16 => self.apply_row_rounded::<2>(layout, h, a),
            Round::Bf16Trunc => self.apply_row_rounded::<3>(layout, h, a),
        }
    }

    /// The formulas with the rounding numbered `R` by [`Round::from_code`].
    #[inline(always)]
    fn apply_row_rounded<const R: u8>(self, layout: GateUpLayout, h: &[f32], a: &mut [f32]) {
        // One arm and one loop per kind, each with its formula written inline (a closure
        // would be compiled once, outside the feature-enabled copy, and called per element).
        let r = round::<R>;
        match self {
            Self::Silu { limit: None } => map_pairs!(layout, h, a, |g, u| r(silu(g) * u)),
            Self::Silu { limit: Some(l) } => {
                map_pairs!(
                    layout,
                    h,
                    a,
                    |g, u| r(silu(min_nan(g, l)) * clamp_nan(u, l))
                )
            }
            Self::SwigluOai { alpha, limit } => {
                map_pairs!(layout, h, a, |g, u| r(swiglu_oai(g, u, alpha, limit)))
            }
            Self::SwigluStep => map_pairs!(layout, h, a, |g, u| r(
                min_nan(silu(g), STEP_LIMIT) * clamp_nan(u, STEP_LIMIT)
            )),
            Self::Gelu => map_pairs!(layout, h, a, |g, u| r(0.5
                * g
                * (1.0 + libm::erff(g * std::f32::consts::FRAC_1_SQRT_2))
                * u)),
            Self::GeluTanh => map_pairs!(layout, h, a, |g, u| r(gelu_tanh(g) * u)),
            Self::VllmCpuInt4Compat(Int4ActivationKind::Silu | Int4ActivationKind::SwigluStep) => {
                map_pairs!(layout, h, a, |g, u| r(r(silu(g)) * u))
            }
            Self::VllmCpuInt4Compat(Int4ActivationKind::SwigluOai) => {
                // The port's op sequence: (clamp(u, −7, 7) + 1) * (g' * sigmoid(1.702 * g')).
                map_pairs!(layout, h, a, |g, u| r(r(clamp_nan(u, OAI_LIMIT) + 1.0)
                    * r(
                        min_nan(g, OAI_LIMIT) * r(sigmoid(r(OAI_ALPHA * min_nan(g, OAI_LIMIT))))
                    )))
            }
        }
    }
}

/// Sets `a[i] = body` over one row in `layout`, with `g` and `u` bound to the pair `i`; a macro
/// so that the body is inlined into the loop of each compiled copy.
macro_rules! map_pairs {
    ($layout:expr, $h:expr, $a:expr, |$g:ident, $u:ident| $body:expr) => {{
        let (h, a): (&[f32], &mut [f32]) = ($h, $a);
        match $layout {
            GateUpLayout::Concatenated => {
                let (gs, us) = h.split_at(a.len());
                for ((ai, &$g), &$u) in a.iter_mut().zip(gs).zip(us) {
                    *ai = $body;
                }
            }
            GateUpLayout::Interleaved => {
                for (ai, gu) in a.iter_mut().zip(h.chunks_exact(2)) {
                    let ($g, $u) = (gu[0], gu[1]);
                    *ai = $body;
                }
            }
        }
    }};
}
use map_pairs;

/// Rounds `v` with the rounding numbered `R` by [`Round::from_code`].
#[inline(always)]
fn round<const R: u8>(v: f32) -> f32 {
    Round::from_code(R).apply(v)
}

/// `0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³)))`.
#[inline(always)]
fn gelu_tanh(v: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * (v + 0.044_715 * v * v * v);
    0.5 * v * (1.0 + inner.tanh())
}

/// `σ(v) = 1/(1 + e^{−v})`.
#[inline(always)]
fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + exp(-v))
}

/// `silu(v) = v·σ(v)`, written as `v / (1 + e^{−v})`.
#[inline(always)]
fn silu(v: f32) -> f32 {
    v / (1.0 + exp(-v))
}

/// SwiGLU-OAI in f32: `g'·σ(α·g')·(u' + 1)`.
#[inline(always)]
fn swiglu_oai(g: f32, u: f32, alpha: f32, limit: f32) -> f32 {
    let gp = min_nan(g, limit);
    gp * sigmoid(alpha * gp) * (clamp_nan(u, limit) + 1.0)
}

/// `min(v, l)` that keeps a NaN `v` (like `torch.clamp`); `f32::min` would return `l`.
#[inline(always)]
fn min_nan(v: f32, l: f32) -> f32 {
    if v > l { l } else { v }
}

/// `clamp(v, −l, l)` that keeps a NaN `v`.
#[inline(always)]
fn clamp_nan(v: f32, l: f32) -> f32 {
    if v > l {
        l
    } else if v < -l {
        -l
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(act: Activation, g: f32, u: f32) -> f32 {
        let mut a = [0f32];
        act.apply_row(GateUpLayout::Concatenated, &[g, u], &mut a, Round::F32);
        a[0]
    }

    #[test]
    fn formulas() {
        let s = |v: f32| v / (1.0 + exp(-v));
        assert_eq!(one(Activation::SILU, 2.0, 3.0), s(2.0) * 3.0);
        let lim = Activation::Silu { limit: Some(1.0) };
        assert_eq!(one(lim, 2.0, -3.0), -s(1.0));
        // SwiGLU-OAI clamps both halves at 7 and adds 1 to the up half.
        let oai = one(Activation::SWIGLU_OAI, 9.0, 8.0);
        let want = 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * 8.0;
        assert!((oai - want).abs() <= 1e-5 * want, "{oai} vs {want}");
        // SwiGLU-step clamps the silu output.
        assert_eq!(one(Activation::SwigluStep, 20.0, 10.0), 7.0 * 7.0);
        assert_eq!(one(Activation::SwigluStep, 1.0, -10.0), s(1.0) * -7.0);
        // GELU forms.
        assert!((one(Activation::Gelu, 1.0, 2.0) - 2.0 * 0.841_344_7).abs() < 1e-6);
        assert!((one(Activation::GeluTanh, 1.0, 2.0) - 2.0 * 0.841_192).abs() < 1e-5);
        // Compatibility mode: kinds 0 and 2 are plain silu (no step clamps).
        let c0 = Activation::VllmCpuInt4Compat(Int4ActivationKind::SwigluStep);
        assert_eq!(one(c0, 20.0, 10.0), s(20.0) * 10.0);
        let c1 = Activation::VllmCpuInt4Compat(Int4ActivationKind::SwigluOai);
        assert!((one(c1, 9.0, 8.0) - want).abs() <= 1e-5 * want);
    }

    /// The dispatched loop (AVX-512 where present) gives the portable loop's bits for every
    /// activation, layout and rounding (NaN as NaN, whatever its sign bit), on row lengths
    /// that leave vector tails.
    #[test]
    fn dispatched_rows_equal_the_portable_loop() {
        let acts = [
            Activation::SILU,
            Activation::Silu { limit: Some(3.0) },
            Activation::SWIGLU_OAI,
            Activation::SwigluStep,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::VllmCpuInt4Compat(Int4ActivationKind::Silu),
            Activation::VllmCpuInt4Compat(Int4ActivationKind::SwigluOai),
        ];
        let mut seed = 0x5eed_u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        };
        for len in [0usize, 1, 7, 16, 17, 33, 100] {
            let mut h: Vec<f32> = (0..2 * len).map(|_| next()).collect();
            if len > 3 {
                h[3] = f32::NAN;
                h[1] = 95.0;
                h[2] = -95.0;
            }
            for act in acts {
                for layout in [GateUpLayout::Concatenated, GateUpLayout::Interleaved] {
                    for round in [Round::F32, Round::Bf16, Round::F16, Round::Bf16Trunc] {
                        let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
                        act.apply_row(layout, &h, &mut a, round);
                        act.apply_row_portable(layout, &h, &mut b, round);
                        // Any NaN is one value: vector and scalar code may give it another
                        // sign bit.
                        let bits = |v: &[f32]| {
                            v.iter()
                                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                                .collect::<Vec<_>>()
                        };
                        assert_eq!(bits(&a), bits(&b), "{act:?} {layout:?} {round:?} len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn layouts_pick_the_same_pairs() {
        let h_cat = [1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0];
        let h_int = [1.0f32, 0.5, -2.0, 4.0, 3.0, -1.0];
        let (mut a, mut b) = ([0f32; 3], [0f32; 3]);
        let act = Activation::SWIGLU_OAI;
        act.apply_row(GateUpLayout::Concatenated, &h_cat, &mut a, Round::F32);
        act.apply_row(GateUpLayout::Interleaved, &h_int, &mut b, Round::F32);
        assert_eq!(a, b);
    }

    #[test]
    fn nan_propagates_through_clamps() {
        for act in [
            Activation::SWIGLU_OAI,
            Activation::SwigluStep,
            Activation::Silu { limit: Some(7.0) },
            Activation::VllmCpuInt4Compat(Int4ActivationKind::SwigluOai),
        ] {
            assert!(one(act, f32::NAN, 1.0).is_nan(), "{act:?} gate");
            assert!(one(act, 1.0, f32::NAN).is_nan(), "{act:?} up");
        }
    }

    #[test]
    fn kinds_round_trip_and_bad_kind_is_an_error() {
        for k in 0..3 {
            assert_eq!(Int4ActivationKind::from_kind(k).unwrap().kind(), k);
        }
        assert!(matches!(
            Int4ActivationKind::from_kind(3),
            Err(KernelError::ValueOutOfRange { value: 3, .. })
        ));
        assert!(
            Activation::VllmCpuInt4Compat(Int4ActivationKind::Silu)
                .validate(GateUpLayout::Interleaved)
                .is_err()
        );
    }
}
