//! [`GroupShape`]: the extent of the block of elements that share one quantization scale, as
//! vLLM's `GroupShape(row, col)` (spec section 7.1), where `−1` means the full extent of that
//! dimension.
//!
//! For activations the geometry is literal (`[tokens, hidden]`). For *weights* vLLM uses the
//! shapes as tags: `(−1, 1)` means "one scale per output channel" and `(1, g)` means "groups of
//! `g` along the input dimension of each output row". Do not derive weight scale tensor shapes
//! from a `GroupShape` generically.

use std::fmt;

use crate::error::QuantError;

/// The block of elements sharing one scale: `row × col`, with `−1` meaning the full extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupShape {
    /// Rows per block, or `−1` for all rows.
    pub row: i64,
    /// Columns per block, or `−1` for all columns.
    pub col: i64,
}

impl GroupShape {
    /// One scale for the whole tensor: `(−1, −1)`.
    pub const PER_TENSOR: GroupShape = GroupShape::new(-1, -1);
    /// One scale per row (token) of an activation: `(1, −1)`.
    pub const PER_TOKEN: GroupShape = GroupShape::new(1, -1);
    /// One scale per output channel of a weight: `(−1, 1)`.
    pub const PER_CHANNEL: GroupShape = GroupShape::new(-1, 1);

    /// A shape with the given extents, unchecked (any value is representable, as in vLLM).
    pub const fn new(row: i64, col: i64) -> Self {
        Self { row, col }
    }

    /// Groups of `g` consecutive columns within one row: `(1, g)`, e.g. per-token-group
    /// activations or W4A8 group weights. Rejects `g == 0`.
    pub fn group(g: usize) -> Result<Self, QuantError> {
        if g == 0 {
            return Err(QuantError::ZeroGroupSize {
                what: "GroupShape::group",
                group_size: g,
            });
        }
        let col = i64::try_from(g).map_err(|_| QuantError::InvalidQuantArgs {
            field: "group_size",
            reason: format!("{g} does not fit in i64"),
        })?;
        Ok(Self::new(1, col))
    }

    /// Whether one scale covers the whole tensor.
    pub fn is_per_tensor(&self) -> bool {
        self.row == -1 && self.col == -1
    }

    /// Whether there is one scale per row (token).
    pub fn is_per_token(&self) -> bool {
        self.row == 1 && self.col == -1
    }

    /// Whether there is one scale per output channel.
    pub fn is_per_channel(&self) -> bool {
        self.row == -1 && self.col == 1
    }

    /// Whether scales cover groups of columns within single rows (`row == 1 && col ≥ 1`).
    pub fn is_per_group(&self) -> bool {
        self.row == 1 && self.col >= 1
    }
}

impl fmt::Display for GroupShape {
    /// Python's repr of the named tuple: `GroupShape(row=1, col=128)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GroupShape(row={}, col={})", self.row, self.col)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predicates() {
        assert!(GroupShape::PER_TENSOR.is_per_tensor());
        assert!(GroupShape::PER_TOKEN.is_per_token());
        assert!(GroupShape::PER_CHANNEL.is_per_channel());
        let g = GroupShape::group(128).unwrap();
        assert!(g.is_per_group() && !g.is_per_token() && !g.is_per_channel());
        assert!(!GroupShape::PER_TOKEN.is_per_group());
        assert!(!GroupShape::new(128, 128).is_per_group());
        assert_eq!(g.to_string(), "GroupShape(row=1, col=128)");
        assert!(matches!(
            GroupShape::group(0),
            Err(QuantError::ZeroGroupSize { group_size: 0, .. })
        ));
    }
}
