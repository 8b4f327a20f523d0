//! `e^v` in f32 built from adds, multiplies, one division-free polynomial and bit operations,
//! so that a loop over it vectorises (libm's `expf` is a call per element, the largest part of
//! the activation's cost) and gives the same bits on every rung, thread count and target: no
//! fused multiply-add, no table, no data-dependent branch.
//!
//! Method: `v = n·ln 2 + r` with `n = round(v·log₂e)` and `|r| ≤ ln 2 / 2`, taken off in two
//! steps (`C_HI` has 9 significant bits, so `n·C_HI` is exact); `e^r` is the degree-7 Taylor
//! polynomial in Horner form (truncation below 6·10⁻⁹ relative); `2^n` is written straight into
//! the exponent field. The result is within 2 ULP of the correctly rounded `e^v` wherever that
//! is a normal f32 (tested against f64 over a dense sweep).
//!
//! Out of range: below [`EXP_MIN_ARG`] the result is `+0` (the true value is under `2^-125`,
//! nearly subnormal), above [`EXP_MAX_ARG`] it is `+∞`; NaN stays NaN.

/// Arguments below this give `+0`.
pub(crate) const EXP_MIN_ARG: f32 = -86.9;
/// Arguments above this give `+∞` (`ln f32::MAX ≈ 88.7228`).
pub(crate) const EXP_MAX_ARG: f32 = 88.72;

/// `ln 2` split so that `n·C_HI` is exact for `|n| < 2^15`: `C_HI = 355/512`.
const C_HI: f32 = 0.693_359_4;
/// `ln 2 − C_HI`.
const C_LO: f32 = -2.121_944_4e-4;
/// `1.5·2^23`: adding it rounds a value of magnitude below `2^22` to an integer (ties to even)
/// and leaves that integer in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;

/// `e^v`; see the module documentation for accuracy and range.
#[inline(always)]
pub(crate) fn exp(v: f32) -> f32 {
    let x = v.clamp(EXP_MIN_ARG, EXP_MAX_ARG);
    let t = x * std::f32::consts::LOG2_E + ROUNDER;
    let n = t - ROUNDER;
    let r = (x - n * C_HI) - n * C_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // `n − 1` as an integer from `t`'s low bits, then as the exponent of `2^(n−1)`; scaling by
    // `2^(n−1)·2` keeps `n = 128` (arguments near `ln f32::MAX`) finite, and the lower clamp
    // keeps `n − 1 ≥ −126` (a normal power of two).
    let n_minus_1 = t.to_bits().wrapping_sub(ROUNDER.to_bits()).wrapping_sub(1);
    let scale = f32::from_bits(n_minus_1.wrapping_add(127) << 23);
    let e = p * scale * 2.0;
    if v < EXP_MIN_ARG {
        0.0
    } else if v > EXP_MAX_ARG {
        f32::INFINITY
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two positive finite f32.
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn within_two_ulp_of_the_correctly_rounded_value() {
        let mut worst = (0u32, 0f32);
        let mut v = EXP_MIN_ARG;
        while v <= EXP_MAX_ARG {
            let want = (f64::from(v)).exp() as f32;
            let got = exp(v);
            let d = ulps(got, want);
            if d > worst.0 {
                worst = (d, v);
            }
            // About 3.5 million points, denser than one per ULP near 0.
            v += 5e-5_f32.max(v.abs() * 1e-6);
        }
        assert!(worst.0 <= 2, "{} ULP at {}", worst.0, worst.1);
    }

    #[test]
    fn exact_points_and_edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(EXP_MIN_ARG - 1.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(EXP_MAX_ARG + 0.1), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(EXP_MAX_ARG).is_finite() && exp(EXP_MAX_ARG) > 3.3e38);
        let low = exp(EXP_MIN_ARG);
        assert!(low.is_normal(), "{low:e}");
        // Integer arguments land on powers of e within 2 ULP.
        for i in -80..=80 {
            let want = (f64::from(i)).exp() as f32;
            assert!(ulps(exp(i as f32), want) <= 2, "e^{i}");
        }
    }
}
