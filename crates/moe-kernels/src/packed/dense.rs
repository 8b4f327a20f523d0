//! The float weight format of unquantized experts: `[N, K]` weights kept in their checkpoint
//! precision (f32 or bf16) and cut into 16-channel panels, K-major inside a panel, so the GEMM
//! reads one contiguous run of 16 weights per K value.
//!
//! Layout (`P = ceil(N/16)` panels): `values[(p·K + k)·16 + c]` = `w[16p + c][k]`; channels past
//! `N` are zero. bf16 stays bf16 (half the bytes to stream; widening to f32 is exact).

use half::bf16;

use super::{PANEL, check_len};
use crate::KernelError;

/// Largest K the dense format accepts (keeps `K·N` products far from overflow).
pub const MAX_K: usize = 1 << 24;

/// Weights in their stored precision.
#[derive(Debug, Clone)]
pub(crate) enum DenseValues {
    /// f32 weights.
    F32(Vec<f32>),
    /// bf16 weights.
    Bf16(Vec<bf16>),
}

/// A float weight matrix `[N, K]` packed for the dense GEMM; immutable once built.
#[derive(Debug, Clone)]
pub struct PackedDense {
    n: usize,
    k: usize,
    n_panels: usize,
    values: DenseValues,
}

impl PackedDense {
    /// Packs f32 weights `[N, K]` (row-major). Non-finite weights are refused: a NaN weight
    /// would silently poison every token routed to the expert.
    pub fn pack_f32(n: usize, k: usize, w: &[f32]) -> Result<Self, KernelError> {
        let (n_panels, len) = Self::check(n, k, w.len(), |i| w[i].is_finite(), |i| w[i])?;
        let mut values = vec![0f32; len];
        Self::scatter(n, k, &mut values, |row, col| w[row * k + col]);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::F32(values),
        })
    }

    /// Packs bf16 weights `[N, K]` (row-major), keeping them in bf16.
    pub fn pack_bf16(n: usize, k: usize, w: &[bf16]) -> Result<Self, KernelError> {
        let finite = |i: usize| w[i].is_finite();
        let (n_panels, len) = Self::check(n, k, w.len(), finite, |i| w[i].to_f32())?;
        let mut values = vec![bf16::ZERO; len];
        Self::scatter(n, k, &mut values, |row, col| w[row * k + col]);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::Bf16(values),
        })
    }

    /// Validates the shape and values; returns `(panels, packed length)`.
    fn check(
        n: usize,
        k: usize,
        len: usize,
        finite: impl Fn(usize) -> bool,
        value: impl Fn(usize) -> f32,
    ) -> Result<(usize, usize), KernelError> {
        if k == 0 || k > MAX_K {
            return Err(KernelError::UnsupportedDim {
                dim: "K",
                got: k,
                reason: "K must be in 1..=2^24",
            });
        }
        let expected = n.checked_mul(k).ok_or(KernelError::UnsupportedDim {
            dim: "N",
            got: n,
            reason: "N·K overflows usize",
        })?;
        check_len("w_dense", expected, len)?;
        if let Some(index) = (0..len).find(|&i| !finite(i)) {
            return Err(KernelError::NonFiniteWeight {
                tensor: "w_dense",
                index,
                value: value(index).to_string(),
            });
        }
        let n_panels = n.div_ceil(PANEL);
        Ok((n_panels, n_panels * PANEL * k))
    }

    /// Writes `w(row, col)` into the panel layout.
    fn scatter<T: Copy>(n: usize, k: usize, dst: &mut [T], w: impl Fn(usize, usize) -> T) {
        for (p, panel) in dst.chunks_exact_mut(PANEL * k).enumerate() {
            for (col, step) in panel.chunks_exact_mut(PANEL).enumerate() {
                for (c, v) in step.iter_mut().enumerate() {
                    let row = p * PANEL + c;
                    if row < n {
                        *v = w(row, col);
                    }
                }
            }
        }
    }

    /// The panels' bf16 values, when the weights are stored in bf16.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the bf16 B rows read it
    pub(crate) fn bf16_values(&self) -> Option<&[bf16]> {
        match &self.values {
            DenseValues::Bf16(v) => Some(v),
            DenseValues::F32(_) => None,
        }
    }

    /// Output channels N.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Reduction dimension K.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether the weights are stored as bf16.
    pub fn is_bf16(&self) -> bool {
        matches!(self.values, DenseValues::Bf16(_))
    }

    /// Bytes of packed weights.
    pub fn packed_bytes(&self) -> usize {
        match &self.values {
            DenseValues::F32(v) => v.len() * 4,
            DenseValues::Bf16(v) => v.len() * 2,
        }
    }

    /// The weights back as f32 `[N, K]` (exact), for tests and reports.
    pub fn unpack_f32(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.n * self.k];
        for row in 0..self.n {
            for col in 0..self.k {
                let at = ((row / PANEL) * self.k + col) * PANEL + row % PANEL;
                w[row * self.k + col] = match &self.values {
                    DenseValues::F32(v) => v[at],
                    DenseValues::Bf16(v) => v[at].to_f32(),
                };
            }
        }
        w
    }

    /// Number of 16-channel panels.
    pub(crate) fn n_panels(&self) -> usize {
        self.n_panels
    }

    /// The stored values.
    pub(crate) fn values(&self) -> &DenseValues {
        &self.values
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpack_inverts_pack_for_both_precisions() {
        let (n, k) = (19, 5);
        let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.25 - 3.0).collect();
        let p = PackedDense::pack_f32(n, k, &w).unwrap();
        assert_eq!(p.unpack_f32(), w);
        assert_eq!(p.n_panels(), 2);
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let p = PackedDense::pack_bf16(n, k, &wb).unwrap();
        assert!(p.is_bf16());
        assert_eq!(p.unpack_f32(), w);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(
            PackedDense::pack_f32(2, 0, &[]),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        assert!(matches!(
            PackedDense::pack_f32(2, 3, &[0.0; 5]),
            Err(KernelError::LengthMismatch {
                tensor: "w_dense",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            PackedDense::pack_f32(1, 2, &[0.0, f32::NAN]),
            Err(KernelError::NonFiniteWeight { index: 1, .. })
        ));
        assert!(matches!(
            PackedDense::pack_f32(usize::MAX, 2, &[]),
            Err(KernelError::UnsupportedDim { dim: "N", .. })
        ));
    }
}
