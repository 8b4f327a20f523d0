//! The float weight format of unquantized experts: `[N, K]` weights kept in their checkpoint
//! precision (f32 or bf16) and cut into 16-channel panels, K-major inside a panel, so the GEMM
//! reads one contiguous run of 16 weights per K value.
//!
//! Layout (`P = ceil(N/16)` panels): `values[(p·K + k)·16 + c]` = `w[16p + c][k]`; channels past
//! `N` are zero. bf16 stays bf16 (half the bytes to stream; widening to f32 is exact).

use half::bf16;

use super::{PANEL, check_len};
use crate::KernelError;
use crate::aligned::AlignedVec;

/// Largest K the dense format accepts (keeps `K·N` products far from overflow).
pub const MAX_K: usize = 1 << 24;

/// Weights in their stored precision.
#[derive(Debug, Clone)]
pub(crate) enum DenseValues {
    /// f32 weights.
    F32(AlignedVec<f32>),
    /// bf16 weights.
    Bf16(AlignedVec<bf16>),
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
        let mut values = AlignedVec::zeroed(len);
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
        let mut values = AlignedVec::zeroed(len);
        Self::scatter(n, k, &mut values, |row, col| w[row * k + col]);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::Bf16(values),
        })
    }

    /// Packs f32 weights given K-major, `w_kn[col·N + row] = w[row][col]` (the layout of
    /// checkpoints that store the matrix `x` is multiplied by, Llama 4's fused experts): each
    /// panel takes its 16 channels of a K value as one contiguous run.
    pub fn pack_f32_k_major(n: usize, k: usize, w_kn: &[f32]) -> Result<Self, KernelError> {
        let (n_panels, len) = Self::check_k_major(n, k, w_kn, |v| v.is_finite(), |v| v)?;
        let mut values = AlignedVec::zeroed(len);
        Self::scatter_k_major(n, k, &mut values, w_kn);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::F32(values),
        })
    }

    /// Packs bf16 weights given K-major (see [`Self::pack_f32_k_major`]) as the little-endian
    /// bytes a checkpoint stores, keeping them in bf16, without an intermediate copy of the
    /// matrix.
    pub fn pack_bf16_k_major_le(n: usize, k: usize, bytes: &[u8]) -> Result<Self, KernelError> {
        let (w_kn, rest) = bytes.as_chunks::<2>();
        if !rest.is_empty() {
            return Err(KernelError::LengthMismatch {
                tensor: "w_dense",
                expected: n.saturating_mul(k).saturating_mul(2),
                got: bytes.len(),
            });
        }
        let value = |b: [u8; 2]| bf16::from_le_bytes(b);
        let (n_panels, len) =
            Self::check_k_major(n, k, w_kn, |b| value(b).is_finite(), |b| value(b).to_f32())?;
        // Written in order rather than into a zeroed buffer: the packed layer is as large as
        // the checkpoint's, and zeroing it first would cost a pass over all of it.
        let mut values = AlignedVec::with_capacity(len);
        for p in 0..n_panels {
            let rows = p * PANEL..n.min((p + 1) * PANEL);
            for col in 0..k {
                let run = &w_kn[col * n..][rows.clone()];
                if let Ok(full) = <&[[u8; 2]; PANEL]>::try_from(run) {
                    // A whole panel: a fixed-size move rather than a call per run.
                    values.extend_from_slice(&full.map(value));
                } else {
                    let mut step = [bf16::ZERO; PANEL];
                    for (v, &b) in step.iter_mut().zip(run) {
                        *v = value(b);
                    }
                    values.extend_from_slice(&step);
                }
            }
        }
        debug_assert_eq!(values.len(), len);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::Bf16(values),
        })
    }

    /// [`Self::check`] for K-major weights: a non-finite weight is named by its row-major
    /// index `row·K + col`, as the row-major packers name it.
    fn check_k_major<T: Copy>(
        n: usize,
        k: usize,
        w_kn: &[T],
        finite: impl Fn(T) -> bool,
        value: impl Fn(T) -> f32,
    ) -> Result<(usize, usize), KernelError> {
        let checked = Self::check(n, k, w_kn.len(), |_| true, |_| 0.0)?;
        if let Some(at) = w_kn.iter().position(|&v| !finite(v)) {
            return Err(KernelError::NonFiniteWeight {
                tensor: "w_dense",
                index: (at % n) * k + at / n,
                value: value(w_kn[at]).to_string(),
            });
        }
        Ok(checked)
    }

    /// Copies K-major weights into the panel layout, one run of up to 16 channels per K value.
    fn scatter_k_major<T: Copy>(n: usize, k: usize, dst: &mut [T], w_kn: &[T]) {
        for (p, panel) in dst.chunks_exact_mut(PANEL * k).enumerate() {
            let rows = p * PANEL..n.min((p + 1) * PANEL);
            for (col, step) in panel.chunks_exact_mut(PANEL).enumerate() {
                let src = &w_kn[col * n..][rows.clone()];
                step[..src.len()].copy_from_slice(src);
            }
        }
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

    /// K-major weights pack into the panels their row-major transpose packs into, ragged N
    /// included, and a non-finite weight is named by the same row-major index.
    #[test]
    fn k_major_packing_equals_packing_the_transpose() {
        for (n, k) in [(19, 5), (16, 3), (1, 7), (40, 1)] {
            let w: Vec<f32> = (0..n * k).map(|i| i as f32 * 0.375 - 7.0).collect();
            let w_kn: Vec<f32> = (0..n * k).map(|i| w[(i % n) * k + i / n]).collect();
            let a = PackedDense::pack_f32(n, k, &w).unwrap();
            let b = PackedDense::pack_f32_k_major(n, k, &w_kn).unwrap();
            assert_eq!(b.unpack_f32(), w, "{n}x{k}");
            assert_eq!(a.packed_bytes(), b.packed_bytes());
            let bytes: Vec<u8> = w_kn
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect();
            let c = PackedDense::pack_bf16_k_major_le(n, k, &bytes).unwrap();
            assert!(c.is_bf16());
            assert_eq!(c.unpack_f32(), w, "{n}x{k} bf16");
        }
        let (n, k) = (3, 2);
        let mut w_kn = vec![1f32; n * k];
        w_kn[4] = f32::INFINITY; // K value 1, channel 1: row-major index 1·2 + 1
        assert!(matches!(
            PackedDense::pack_f32_k_major(n, k, &w_kn),
            Err(KernelError::NonFiniteWeight { index: 3, .. })
        ));
        assert!(matches!(
            PackedDense::pack_bf16_k_major_le(n, k, &[0; 10]),
            Err(KernelError::LengthMismatch {
                expected: 6,
                got: 5,
                ..
            })
        ));
        let mut bytes = vec![0u8; 12];
        bytes[9] = 0x7F; // K value 1, channel 1 (value 4): the bits 0x7F80, an infinity
        bytes[8] = 0x80;
        assert!(matches!(
            PackedDense::pack_bf16_k_major_le(n, k, &bytes),
            Err(KernelError::NonFiniteWeight { index: 3, .. })
        ));
        assert!(matches!(
            PackedDense::pack_bf16_k_major_le(n, k, &bytes[..11]),
            Err(KernelError::LengthMismatch { .. })
        ));
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
