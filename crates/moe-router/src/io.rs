//! The caller's buffers: logits in one of three dtypes, expert ids in one of two integer types.

use half::{bf16, f16};

use crate::precision::LogitsDtype;

/// Router logits of shape `[num_tokens, num_experts]`, row-major, in their own dtype.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Logits<'a> {
    /// f32 logits.
    F32(&'a [f32]),
    /// bf16 logits.
    Bf16(&'a [bf16]),
    /// f16 logits.
    F16(&'a [f16]),
}

impl Logits<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::Bf16(x) => x.len(),
            Self::F16(x) => x.len(),
        }
    }

    /// Whether there are no values (zero tokens).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element dtype.
    pub fn dtype(&self) -> LogitsDtype {
        match self {
            Self::F32(_) => LogitsDtype::F32,
            Self::Bf16(_) => LogitsDtype::Bf16,
            Self::F16(_) => LogitsDtype::F16,
        }
    }

    /// Row `row` of width `width` as f32: borrowed for f32 logits, widened (exactly) into `buf`
    /// otherwise.
    pub(crate) fn row_f32<'s>(&'s self, row: usize, width: usize, buf: &'s mut [f32]) -> &'s [f32] {
        let range = row * width..(row + 1) * width;
        match self {
            Self::F32(x) => &x[range],
            Self::Bf16(x) => {
                for (o, v) in buf.iter_mut().zip(&x[range]) {
                    *o = v.to_f32();
                }
                &buf[..width]
            }
            Self::F16(x) => {
                for (o, v) in buf.iter_mut().zip(&x[range]) {
                    *o = v.to_f32();
                }
                &buf[..width]
            }
        }
    }
}

/// Where expert ids go: `[num_tokens, top_k]`, row-major.
///
/// vLLM returns i32 ids; its CPU W4A8 kernel wants i64.
#[derive(Debug)]
#[non_exhaustive]
pub enum IdsOut<'a> {
    /// i32 ids.
    I32(&'a mut [i32]),
    /// i64 ids.
    I64(&'a mut [i64]),
}

impl IdsOut<'_> {
    /// Number of slots.
    pub fn len(&self) -> usize {
        match self {
            Self::I32(x) => x.len(),
            Self::I64(x) => x.len(),
        }
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes `ids` from slot `start` on.
    pub(crate) fn write(&mut self, start: usize, ids: impl Iterator<Item = i32>) {
        match self {
            Self::I32(out) => {
                for (o, id) in out[start..].iter_mut().zip(ids) {
                    *o = id;
                }
            }
            Self::I64(out) => {
                for (o, id) in out[start..].iter_mut().zip(ids) {
                    *o = i64::from(id);
                }
            }
        }
    }
}
