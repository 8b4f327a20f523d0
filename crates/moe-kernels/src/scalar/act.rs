//! Scalar per-row activation quantisers, used by the GEMM driver until `moe_quant::act` (the
//! canonical home of this maths) lands; they implement the same spec formulas and signatures.
//!
//! Asymmetric rows follow spec §4.2(a) (codes round half away from zero, the zero point half to
//! even); symmetric rows follow §5.3 stage 0 (`amax/127`, half away from zero).

/// The dequantisation parameters of one asymmetric row: `x ≈ (q − zero_point)·recip`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AsymRowQuant {
    /// Dequantisation factor `1/s`.
    pub recip: f32,
    /// Integer zero point in `[-128, 127]`.
    pub zero_point: i32,
}

/// Quantises one row asymmetrically per spec §4.2(a); `q.len() == x.len()`.
pub(crate) fn quantize_row_asym_i8(x: &[f32], q: &mut [i8]) -> AsymRowQuant {
    debug_assert_eq!(x.len(), q.len());
    let (mut rmin, mut rmax) = (0.0f32, 0.0f32);
    for &v in x {
        rmin = rmin.min(v);
        rmax = rmax.max(v);
    }
    let mut s = if rmin == rmax {
        1.0
    } else {
        255.0 / (rmax - rmin)
    };
    if !s.is_finite() {
        // Spec §4.6: a range so tiny that 255/range overflows is treated as an all-zero row.
        s = 1.0;
        rmin = 0.0;
        rmax = 0.0;
    }
    let recip = 1.0 / s;
    let dmin = rmin * s;
    let dmax = rmax * s;
    let zp_f = if (-128.0 + dmin) + (127.0 + dmax) > 0.0 {
        -128.0 - dmin
    } else {
        127.0 - dmax
    };
    let zero_point = zp_f.clamp(-128.0, 127.0).round_ties_even() as i32;
    for (qk, &v) in q.iter_mut().zip(x) {
        *qk = ((v * s).round() as i32 + zero_point).clamp(-128, 127) as i8;
    }
    AsymRowQuant { recip, zero_point }
}

/// Quantises one row symmetrically per spec §5.3 stage 0 and returns its scale `amax/127`.
pub(crate) fn quantize_row_sym_i8(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-7);
    let inv = 127.0 / amax;
    for (qk, &v) in q.iter_mut().zip(x) {
        *qk = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    amax / 127.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_example() {
        let mut q = [0i8; 4];
        let r = quantize_row_asym_i8(&[0.5, -1.0, 2.0, 0.25], &mut q);
        assert_eq!(q, [0, -128, 127, -22]);
        assert_eq!(r.zero_point, -43);
        assert_eq!(r.recip, 1.0 / 85.0);
    }

    #[test]
    fn all_zero_row() {
        let mut q = [0i8; 3];
        let r = quantize_row_asym_i8(&[0.0; 3], &mut q);
        assert_eq!((q, r.zero_point, r.recip), ([127; 3], 127, 1.0));
    }

    #[test]
    fn actquant_goldens() {
        let mut seen = 0;
        moe_testutil::for_each_golden_case("w4a8", |case| {
            if !case.name.starts_with("actquant_") {
                return Ok(());
            }
            seen += 1;
            let x = case.f32s("x");
            let shape = case.shape("x");
            let (m, k) = (shape[0], shape[1]);
            let want_q = case.i8s("a_q");
            let want_zp = case.i64s("a_zero_point");
            let want_recip = case.f32s("a_recip");
            let mut q = vec![0i8; k];
            for row in 0..m {
                let r = quantize_row_asym_i8(&x[row * k..][..k], &mut q);
                if q[..] != want_q[row * k..][..k]
                    || i64::from(r.zero_point) != want_zp[row]
                    || r.recip.to_bits() != want_recip[row].to_bits()
                {
                    return Err(format!("row {row} differs"));
                }
            }
            Ok(())
        });
        assert!(seen > 0, "no actquant_ case seen");
    }
}
