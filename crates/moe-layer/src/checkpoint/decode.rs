//! Decoding of raw little-endian tensor bytes into typed values, and [`FloatData`], the
//! container for floating-point tensors kept in their stored dtype.
//!
//! Bytes borrowed from a shard (or a memory map) carry no alignment guarantee, so values are
//! assembled with `from_le_bytes` rather than reinterpreted in place.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use moe_quant::DType;

use super::shards::{Dtype, TensorRef};
use crate::error::LayerError;

/// The floating-point dtypes weights may be stored in.
pub const FLOAT_DTYPES: &[Dtype] = &[Dtype::BF16, Dtype::F16, Dtype::F32];

/// A floating-point tensor in its stored dtype (row-major; the shape is carried by the owner).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FloatData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// bfloat16 values.
    BF16(Vec<bf16>),
    /// IEEE half values.
    F16(Vec<f16>),
}

impl FloatData {
    /// Decodes little-endian bytes of a float dtype (`None` for any other dtype).
    pub fn from_le_bytes(dtype: Dtype, bytes: &[u8]) -> Option<Self> {
        Some(match dtype {
            Dtype::F32 => Self::F32(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::BF16 => Self::BF16(
                bytes
                    .chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            Dtype::F16 => Self::F16(
                bytes
                    .chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            _ => return None,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Self::F32(_) => DType::F32,
            Self::BF16(_) => DType::BF16,
            Self::F16(_) => DType::F16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::BF16(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values widened to f32 (exact for every variant), eight at a time where the CPU
    /// converts halves in vectors.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            Self::F32(v) => v.clone(),
            Self::BF16(v) => HalfFloatSliceExt::to_f32_vec(&v[..]),
            Self::F16(v) => HalfFloatSliceExt::to_f32_vec(&v[..]),
        }
    }
}

/// The moe-quant dtype of a safetensors float dtype.
pub fn float_dtype(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        _ => None,
    }
}

/// The safetensors dtype of a moe-quant float dtype.
pub fn safetensors_float(d: DType) -> Option<Dtype> {
    match d {
        DType::F32 => Some(Dtype::F32),
        DType::BF16 => Some(Dtype::BF16),
        DType::F16 => Some(Dtype::F16),
        _ => None,
    }
}

/// A float tensor widened to f32, after checking its dtype.
pub fn f32_values(t: &TensorRef<'_>) -> Result<Vec<f32>, LayerError> {
    t.expect_dtype(FLOAT_DTYPES)?;
    Ok(FloatData::from_le_bytes(t.dtype, t.bytes)
        .map(|d| d.to_f32_vec())
        .unwrap_or_default())
}

/// An integer tensor (i8, i16, i32 or i64) widened to i64, after checking its dtype is one
/// of `allowed`.
pub fn int_values(t: &TensorRef<'_>, allowed: &[Dtype]) -> Result<Vec<i64>, LayerError> {
    t.expect_dtype(allowed)?;
    let b = t.bytes;
    Ok(match t.dtype {
        Dtype::I8 => b.iter().map(|&x| i64::from(x as i8)).collect(),
        Dtype::I16 => b
            .chunks_exact(2)
            .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::I32 => b
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        Dtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => Vec::new(),
    })
}

/// An i32 tensor's words.
pub fn i32_words(t: &TensorRef<'_>) -> Result<Vec<i32>, LayerError> {
    t.expect_dtype(&[Dtype::I32])?;
    Ok(t.bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Rejects the first scale that is NaN, infinite or negative, naming the tensor and its flat
/// index.
pub fn check_scales(t: &TensorRef<'_>, scales: &[f32]) -> Result<(), LayerError> {
    match scales.iter().position(|s| !s.is_finite() || *s < 0.0) {
        None => Ok(()),
        Some(index) => Err(LayerError::BadScale {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            index,
            value: scales[index],
        }),
    }
}

/// Whether `ok` holds for every value: a branch-free pass over blocks (which vectorises), so
/// that checking valid tensors, the common case, does not pay for finding the first bad index;
/// callers look for it only when this says no.
pub(crate) fn all_branch_free<T: Copy>(v: &[T], ok: impl Fn(T) -> bool) -> bool {
    v.chunks(4096)
        .all(|block| block.iter().fold(true, |all, &x| all & ok(x)))
}

/// Rejects the first value that is NaN or infinite, naming the tensor and its flat index.
pub fn check_finite(t: &TensorRef<'_>, values: &[f32]) -> Result<(), LayerError> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(LayerError::NonFinite {
            tensor: t.name.clone(),
            file: t.file.to_path_buf(),
            index,
            value: values[index],
        }),
    }
}

/// Copies the block `rows × cols` of a row-major matrix with `row_len` elements per row,
/// appending it to `out`.
pub fn append_block<T: Copy>(
    src: &[T],
    row_len: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: &mut Vec<T>,
) {
    for r in rows {
        out.extend_from_slice(&src[r * row_len + cols.start..r * row_len + cols.end]);
    }
}
