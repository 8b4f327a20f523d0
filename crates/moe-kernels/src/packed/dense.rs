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
        let values = panels_from_rows(n, k, len, |row| &w[row * k..][..k], |v| v, 0.0);
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
        let values = panels_from_rows(n, k, len, |row| &w[row * k..][..k], |v| v, bf16::ZERO);
        Ok(Self {
            n,
            k,
            n_panels,
            values: DenseValues::Bf16(values),
        })
    }

    /// Packs bf16 weights `[N, K]` given row-major as the little-endian bytes a checkpoint
    /// stores, in blocks of whole rows whose concatenation is the matrix (a gate and an up
    /// projection stored apart are two), keeping them in bf16 without an intermediate copy.
    pub fn pack_bf16_rows_le(n: usize, k: usize, blocks: &[&[u8]]) -> Result<Self, KernelError> {
        let got: usize = blocks.iter().map(|b| b.len()).sum();
        let row_bytes = k.saturating_mul(2);
        if k > 0
            && (got != n.saturating_mul(row_bytes)
                || blocks.iter().any(|b| b.len() % row_bytes != 0))
        {
            return Err(KernelError::LengthMismatch {
                tensor: "w_dense",
                expected: n.saturating_mul(row_bytes),
                got,
            });
        }
        let (n_panels, len) = Self::check(n, k, n.saturating_mul(k), |_| true, |_| 0.0)?;
        let rows: Vec<&[[u8; 2]]> = blocks
            .iter()
            .flat_map(|b| b.as_chunks::<2>().0.chunks_exact(k))
            .collect();
        let value = |b: [u8; 2]| bf16::from_le_bytes(b);
        for (row, values) in rows.iter().enumerate() {
            // A fold without an early exit, so the check of a row vectorises: a bf16 is not
            // finite when its exponent bits are all ones.
            let not_finite = |b: [u8; 2]| u16::from_le_bytes(b) & 0x7F80 == 0x7F80;
            if values.iter().fold(false, |bad, &b| bad | not_finite(b)) {
                let col = values.iter().position(|&b| !value(b).is_finite());
                let col = col.expect("a non-finite value was seen");
                return Err(KernelError::NonFiniteWeight {
                    tensor: "w_dense",
                    index: row * k + col,
                    value: value(values[col]).to_f32().to_string(),
                });
            }
        }
        let values = bf16_panels_from_rows(n, k, len, &rows);
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

/// Values of a panel that one pass over its rows moves: the rows' runs are read whole, so each
/// row is read in order and each step written once.
const COLS_PER_PASS: usize = 8;

/// The panel layout of `[N, K]` weights whose row `r` is `row(r)` (K values of `T`), each
/// converted by `value`, channels past `N` as `zero`: written in order into a buffer of `len`
/// values, so it is not zeroed first (the packed layer is as large as the checkpoint's).
fn panels_from_rows<'a, T: Copy + 'a, U: crate::aligned::Plain>(
    n: usize,
    k: usize,
    len: usize,
    row: impl Fn(usize) -> &'a [T],
    value: impl Fn(T) -> U,
    zero: U,
) -> AlignedVec<U> {
    let mut values = AlignedVec::with_capacity(len);
    let mut steps = [[zero; PANEL]; COLS_PER_PASS];
    for p in 0..n.div_ceil(PANEL) {
        let rows: [Option<&[T]>; PANEL] = std::array::from_fn(|c| {
            let r = p * PANEL + c;
            (r < n).then(|| row(r))
        });
        for col in (0..k).step_by(COLS_PER_PASS) {
            let width = COLS_PER_PASS.min(k - col);
            for (c, run) in rows.iter().enumerate() {
                match run {
                    Some(run) => {
                        for (step, &v) in steps.iter_mut().zip(&run[col..col + width]) {
                            step[c] = value(v);
                        }
                    }
                    None => steps.iter_mut().for_each(|step| step[c] = zero),
                }
            }
            for step in &steps[..width] {
                values.extend_from_slice(step);
            }
        }
    }
    debug_assert_eq!(values.len(), len);
    values
}

/// [`panels_from_rows`] for rows of little-endian bf16 (`rows[r]` is row `r`). On x86_64 each
/// whole block of 16 channels × [`COLS_PER_PASS`] values moves as two 8 × 8 transposes of
/// 16-bit values in 128-bit registers (SSE2, part of every x86_64 CPU) rather than a value at
/// a time; the last panel's missing channels and K's last values go the generic way.
fn bf16_panels_from_rows(n: usize, k: usize, len: usize, rows: &[&[[u8; 2]]]) -> AlignedVec<bf16> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut values = AlignedVec::with_capacity(len);
        for p in 0..n.div_ceil(PANEL) {
            let panel = &rows[p * PANEL..rows.len().min((p + 1) * PANEL)];
            for col in (0..k).step_by(COLS_PER_PASS) {
                let width = COLS_PER_PASS.min(k - col);
                let mut steps = [[bf16::ZERO; PANEL]; COLS_PER_PASS];
                if panel.len() == PANEL && width == COLS_PER_PASS {
                    // SAFETY: SSE2, all the function needs, is part of every x86_64 CPU.
                    unsafe { transpose_bf16_block(panel, col, &mut steps) };
                } else {
                    // Channels past N stay zero.
                    for (c, run) in panel.iter().enumerate() {
                        for (step, &v) in steps.iter_mut().zip(&run[col..col + width]) {
                            step[c] = bf16::from_le_bytes(v);
                        }
                    }
                }
                for step in &steps[..width] {
                    values.extend_from_slice(step);
                }
            }
        }
        debug_assert_eq!(values.len(), len);
        values
    }
    #[cfg(not(target_arch = "x86_64"))]
    panels_from_rows(n, k, len, |r| rows[r], bf16::from_le_bytes, bf16::ZERO)
}

/// Values `col..col + 8` of the 16 rows of a full panel as its 8 steps of 16 channels: each
/// half panel's 8 × 8 block of 16-bit values is transposed by unpacking pairs of 16-, 32- and
/// 64-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn transpose_bf16_block(
    rows: &[&[[u8; 2]]],
    col: usize,
    steps: &mut [[bf16; PANEL]; COLS_PER_PASS],
) {
    use std::arch::x86_64::*;
    for half in 0..PANEL / 8 {
        let a: [__m128i; 8] = std::array::from_fn(|i| {
            let run: &[[u8; 2]; 8] = rows[half * 8 + i][col..][..8].try_into().unwrap();
            // SAFETY: the reference covers 16 readable bytes; the load is unaligned.
            unsafe { _mm_loadu_si128(run.as_ptr().cast()) }
        });
        let t = [
            _mm_unpacklo_epi16(a[0], a[1]),
            _mm_unpackhi_epi16(a[0], a[1]),
            _mm_unpacklo_epi16(a[2], a[3]),
            _mm_unpackhi_epi16(a[2], a[3]),
            _mm_unpacklo_epi16(a[4], a[5]),
            _mm_unpackhi_epi16(a[4], a[5]),
            _mm_unpacklo_epi16(a[6], a[7]),
            _mm_unpackhi_epi16(a[6], a[7]),
        ];
        let u = [
            _mm_unpacklo_epi32(t[0], t[2]),
            _mm_unpackhi_epi32(t[0], t[2]),
            _mm_unpacklo_epi32(t[1], t[3]),
            _mm_unpackhi_epi32(t[1], t[3]),
            _mm_unpacklo_epi32(t[4], t[6]),
            _mm_unpackhi_epi32(t[4], t[6]),
            _mm_unpacklo_epi32(t[5], t[7]),
            _mm_unpackhi_epi32(t[5], t[7]),
        ];
        let columns = [
            _mm_unpacklo_epi64(u[0], u[4]),
            _mm_unpackhi_epi64(u[0], u[4]),
            _mm_unpacklo_epi64(u[1], u[5]),
            _mm_unpackhi_epi64(u[1], u[5]),
            _mm_unpacklo_epi64(u[2], u[6]),
            _mm_unpackhi_epi64(u[2], u[6]),
            _mm_unpacklo_epi64(u[3], u[7]),
            _mm_unpackhi_epi64(u[3], u[7]),
        ];
        for (step, column) in steps.iter_mut().zip(columns) {
            let dst: &mut [half::bf16; 8] = (&mut step[half * 8..][..8]).try_into().unwrap();
            // SAFETY: the reference covers 16 writable bytes; the store is unaligned.
            unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), column) };
        }
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

    /// Row-major bf16 bytes in blocks of whole rows pack into the panels of the same matrix
    /// packed whole, for ragged N, K not a multiple of a pass, and any split into blocks; a
    /// non-finite weight is named by its index in the whole matrix.
    #[test]
    fn bf16_row_blocks_pack_as_the_whole_matrix() {
        for (n, k) in [
            (19, 5),
            (16, 3),
            (37, 13),
            (1, 7),
            (40, 1),
            (33, 17),
            (32, 16),
        ] {
            let w: Vec<bf16> = (0..n * k)
                .map(|i| bf16::from_f32(i as f32 * 0.375 - 7.0))
                .collect();
            let whole = PackedDense::pack_bf16(n, k, &w).unwrap();
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            for split in [0, 1, n / 2, n] {
                let (a, b) = bytes.split_at(split * k * 2);
                let p = PackedDense::pack_bf16_rows_le(n, k, &[a, b]).unwrap();
                assert!(p.is_bf16());
                assert_eq!(
                    p.bf16_values(),
                    whole.bf16_values(),
                    "{n}x{k} split {split}"
                );
                let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                assert_eq!(p.unpack_f32(), wf);
                // Channels past N are zero.
                let last = &p.bf16_values().unwrap()[(p.n_panels() - 1) * k * PANEL..];
                let live = n - (p.n_panels() - 1) * PANEL;
                let pad_is_zero = |step: &[bf16]| step[live..].iter().all(|v| *v == bf16::ZERO);
                assert!(last.chunks(PANEL).all(pad_is_zero));
            }
        }
        let (n, k) = (3, 2);
        let mut bytes = [0u8; 12];
        bytes[8] = 0xC0; // row 2, column 0 (index 4): the bits 0x7FC0, a NaN
        bytes[9] = 0x7F;
        let (a, b) = bytes.split_at(4);
        assert!(matches!(
            PackedDense::pack_bf16_rows_le(n, k, &[a, b]),
            Err(KernelError::NonFiniteWeight { index: 4, .. })
        ));
        // Blocks must hold whole rows, and all of them.
        let zeros = [0u8; 12];
        for blocks in [
            &[&zeros[..6], &zeros[6..]][..],
            &[&zeros[..11]],
            &[&zeros[..4]],
        ] {
            assert!(matches!(
                PackedDense::pack_bf16_rows_le(n, k, blocks),
                Err(KernelError::LengthMismatch { .. })
            ));
        }
        assert!(matches!(
            PackedDense::pack_bf16_rows_le(2, 0, &[]),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
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
