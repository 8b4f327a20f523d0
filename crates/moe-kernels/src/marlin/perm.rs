//! The column permutations Marlin applies to scales, biases and zero points (spec `marlin.md`
//! §4–§6), so the kernel's epilogue finds them in the order its threads own output columns.
//!
//! Both scale permutations are involutions: applying one twice gives back the input, so the
//! executor "unpermutes" by permuting again.

use super::error::{MarlinError, check_len};
use super::layout::WeightBits;

/// Which of the two column permutations a scale tensor gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleLayout {
    /// 8×8 transpose inside every block of 64 columns (`scale_perm`): grouped scales with
    /// 16-bit activations.
    Grouped,
    /// The 32-column shuffle (`scale_perm_single`): channelwise scales, every 8-bit-activation
    /// case, and biases.
    Single,
}

impl ScaleLayout {
    /// The layout the kernel reads: grouped iff there is more than one group and activations are
    /// 16-bit (spec §4, §12.3). The project uses this rule.
    pub const fn for_kernel(num_groups: usize, a8: bool) -> Self {
        if num_groups > 1 && !a8 {
            Self::Grouped
        } else {
            Self::Single
        }
    }

    /// Upstream's rule (`marlin_permute_scales`): grouped iff the group size is not channelwise,
    /// is below `size_k`, and activations are 16-bit. With vLLM's `size_k = I` for w13 it
    /// can disagree with [`Self::for_kernel`] (the quirk of spec §4); kept to reproduce
    /// vLLM's bytes.
    pub const fn upstream_rule(size_k: usize, group_size: Option<usize>, a8: bool) -> Self {
        match group_size {
            Some(gs) if gs < size_k && !a8 => Self::Grouped,
            _ => Self::Single,
        }
    }

    /// Columns per permutation block.
    pub const fn block(self) -> usize {
        match self {
            Self::Grouped => 64,
            Self::Single => 32,
        }
    }

    /// The input column (inside its block) that output column `c` (inside its block) takes.
    #[inline]
    pub const fn source_column(self, c: usize) -> usize {
        let (i, t) = (c / 8, c % 8);
        match self {
            Self::Grouped => i + 8 * t,
            Self::Single => 2 * i + (t % 2) + 8 * (t / 2),
        }
    }
}

/// Permutes the columns of a row-major `[rows, size_n]` tensor block by block.
fn permute_columns<T: Copy>(
    tensor: &'static str,
    values: &[T],
    size_n: usize,
    layout: ScaleLayout,
) -> Result<Vec<T>, MarlinError> {
    let block = layout.block();
    if !size_n.is_multiple_of(block) {
        return Err(MarlinError::SizeNNotMultiple {
            size_n,
            tile: block,
        });
    }
    if size_n == 0 {
        check_len(tensor, 0, values.len())?;
        return Ok(Vec::new());
    }
    if !values.len().is_multiple_of(size_n) {
        let rows = values.len().div_ceil(size_n);
        check_len(tensor, rows * size_n, values.len())?;
    }
    let src: Vec<usize> = (0..block).map(|c| layout.source_column(c)).collect();
    let mut out = Vec::with_capacity(values.len());
    for chunk in values.chunks_exact(block) {
        out.extend(src.iter().map(|&s| chunk[s]));
    }
    Ok(out)
}

/// Permutes a scale tensor `[G, size_n]` (or `[E, G, size_n]`, row by row) for the kernel
/// (`marlin_permute_scales`). The shape and dtype do not change.
pub fn permute_scales<T: Copy>(
    scales: &[T],
    size_n: usize,
    layout: ScaleLayout,
) -> Result<Vec<T>, MarlinError> {
    permute_columns("scales", scales, size_n, layout)
}

/// Permutes a bias `[size_n]` (or `[E, size_n]`) for the kernel's epilogue
/// (`marlin_permute_bias`): the single permutation inside every block of 32.
pub fn permute_bias<T: Copy>(bias: &[T], size_n: usize) -> Result<Vec<T>, MarlinError> {
    permute_columns("bias", bias, size_n, ScaleLayout::Single)
}

/// Packs unpacked integer zero points `[G, size_n]` into Marlin's `[G, size_n / pf]` words
/// (`marlin_zero_points`, spec §6): the grouped 64-column permutation, then (16-bit activations
/// only) the dequant interleave inside each word, then `pf` columns per word.
pub fn marlin_zero_points(
    zp: &[u32],
    size_n: usize,
    num_bits: u32,
    a8: bool,
) -> Result<Vec<u32>, MarlinError> {
    let bits = WeightBits::new(num_bits)?;
    if !size_n.is_multiple_of(64) {
        return Err(MarlinError::SizeNNotMultiple { size_n, tile: 64 });
    }
    if let Some(index) = zp.iter().position(|&z| z > bits.mask()) {
        return Err(MarlinError::CodeOutOfRange {
            tensor: "zp",
            index,
            value: zp[index].min(255) as u8,
            max: bits.mask(),
        });
    }
    let permuted = permute_columns("zp", zp, size_n, ScaleLayout::Grouped)?;
    let pf = bits.pack_factor();
    let interleave: &[usize] = match (bits, a8) {
        (_, true) => &[0, 1, 2, 3, 4, 5, 6, 7],
        (WeightBits::B4, false) => &[0, 2, 4, 6, 1, 3, 5, 7],
        (WeightBits::B8, false) => &[0, 2, 1, 3],
    };
    Ok(permuted
        .chunks_exact(pf)
        .map(|cols| {
            (0..pf).fold(0u32, |acc, t| {
                acc | (cols[interleave[t]] << (bits.bits() * t as u32))
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_table_matches_the_spec() {
        let got: Vec<usize> = (0..32)
            .map(|c| ScaleLayout::Single.source_column(c))
            .collect();
        assert_eq!(
            got,
            [
                0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27, 4, 5, 12, 13, 20, 21, 28,
                29, 6, 7, 14, 15, 22, 23, 30, 31
            ]
        );
    }

    #[test]
    fn both_permutations_are_involutions() {
        let v: Vec<u32> = (0..3 * 128).collect();
        for l in [ScaleLayout::Grouped, ScaleLayout::Single] {
            let twice = permute_scales(&permute_scales(&v, 128, l).unwrap(), 128, l).unwrap();
            assert_eq!(twice, v, "{l:?}");
        }
    }
}
