//! Bit packing of low-bit integer codes in the two layouts moe-rs meets, each with its inverse.
//!
//! **compressed-tensors `pack_to_int32`** (spec section 6.2; checkpoint tensor `weight_packed`):
//! each row is a little-endian bit stream of `num_bits`-wide unsigned codes `v + 2^(num_bits−1)`,
//! cut into int32 words; element `i` occupies bits `[i·b, i·b + b)` of the stream, so codes may
//! straddle words when `b` does not divide 32. A row of `cols` codes takes `ceil(cols·b / 32)`
//! words (compressed-tensors pads rows to 32 elements internally, then keeps only those words,
//! which gives the same result); the tail of the last word is padding with code 0, which
//! unpacks to the most negative value, so unpacking needs the original `cols` (`weight_shape`). For int4 word `j` holds elements `8j..8j+7`, element `8j+i` in bits
//! `4i..4i+3`; for int8 a word holds 4 elements, element `4j+i` in bits `8i..8i+7`.
//!
//! **Kernel byte pairs** (spec section 4.3; vLLM `pack_int4_weights_for_kleidi`, the input of
//! `_dyn_quant_pack_4bit_weight`): `u = w + 8`, `byte[n, k/2] = (u[n, k+1] << 4) | u[n, k]`, even
//! `k` in the low nibble. Requires an even number of columns.
//!
//! Worked example, the row `[−8, 7, 0, 3, −1, −2, 5, −4]`: unsigned `[0, 15, 8, 11, 7, 6, 13, 4]`;
//! compressed-tensors packs it into the single word `0x4D67B8F0`; the byte-pair order gives the
//! bytes `F0 B8 67 4D`, which are that word's little-endian bytes. So an int4 `pack-quantized`
//! row read as little-endian bytes is already in kernel order (when `cols` is a multiple of 8).

use crate::error::QuantError;
use crate::int4::check_int4_range;
use crate::int8::{check_len, check_matrix};

/// Number of int32 words `pack_to_int32` uses for a row of `cols` codes of `num_bits` bits
/// (`num_bits` at most 32).
///
/// Computed as `32q·b/32 + ceil(r·b/32)` with `cols = 32q + r`, which equals
/// `ceil(cols·b/32)` without forming `cols·b`, so a hostile `cols` (from a checkpoint's
/// `weight_shape`) cannot overflow.
pub fn packed_int32_cols(cols: usize, num_bits: u32) -> usize {
    let b = num_bits as usize;
    (cols / 32) * b + ((cols % 32) * b).div_ceil(32)
}

fn check_num_bits(num_bits: u32) -> Result<(), QuantError> {
    if (1..=8).contains(&num_bits) {
        Ok(())
    } else {
        Err(QuantError::UnsupportedNumBits {
            what: "pack_to_int32",
            num_bits,
            min: 1,
            max: 8,
        })
    }
}

/// Packs `[rows, cols]` signed codes of `num_bits` bits (1..=8) into `[rows, ceil(cols·b/32)]`
/// int32 words in compressed-tensors order (see the module docs).
///
/// Errors: empty shapes, a length mismatch, an unsupported `num_bits`, and a code outside
/// `[−2^(b−1), 2^(b−1) − 1]` (reported with its flat index).
pub fn pack_to_int32(
    values: &[i8],
    rows: usize,
    cols: usize,
    num_bits: u32,
) -> Result<Vec<i32>, QuantError> {
    check_num_bits(num_bits)?;
    check_matrix("values", values.len(), rows, cols)?;
    let offset = 1i32 << (num_bits - 1);
    if let Some(index) = values
        .iter()
        .position(|&v| !(-offset..offset).contains(&i32::from(v)))
    {
        return Err(QuantError::ValueOutOfRange {
            what: "values",
            index,
            value: i32::from(values[index]),
            min: -offset,
            max: offset - 1,
        });
    }
    let words = packed_int32_cols(cols, num_bits);
    let mut out = Vec::with_capacity(rows * words);
    for row in values.chunks_exact(cols) {
        let mut acc = 0u64;
        let mut filled = 0u32;
        for &v in row {
            // In range by the check above, so the biased code fits in num_bits bits.
            acc |= ((i32::from(v) + offset) as u64) << filled;
            filled += num_bits;
            if filled >= 32 {
                out.push(acc as u32 as i32);
                acc >>= 32;
                filled -= 32;
            }
        }
        if filled > 0 {
            out.push(acc as u32 as i32);
        }
    }
    debug_assert_eq!(out.len(), rows * words);
    Ok(out)
}

/// [`unpack_from_int32`] for a width dividing 32: every word holds `PER = 32 / BITS` whole
/// codes, so each word of a row fills a fixed run of the output (the last one of a row possibly
/// shorter).
fn unpack_whole_words<const BITS: u32, const PER: usize>(
    packed: &[i32],
    rows: usize,
    cols: usize,
    words: usize,
) -> Vec<i8> {
    const { assert!(PER as u32 * BITS == 32) };
    let mask = (1u32 << BITS) - 1;
    let offset = 1i32 << (BITS - 1);
    let code = |w: u32, t: usize| (((w >> (BITS as usize * t)) & mask) as i32 - offset) as i8;
    let mut out = vec![0i8; rows * cols];
    for (dst, src) in out.chunks_exact_mut(cols).zip(packed.chunks_exact(words)) {
        let (runs, tail) = dst.as_chunks_mut::<PER>();
        for (d, &w) in runs.iter_mut().zip(src) {
            for (t, v) in d.iter_mut().enumerate() {
                *v = code(w as u32, t);
            }
        }
        if let Some(&w) = src.get(cols / PER) {
            for (t, v) in tail.iter_mut().enumerate() {
                *v = code(w as u32, t);
            }
        }
    }
    out
}

/// Inverse of [`pack_to_int32`]: unpacks `[rows, ceil(cols·b/32)]` words into `[rows, cols]`
/// signed codes, dropping the padding.
pub fn unpack_from_int32(
    packed: &[i32],
    rows: usize,
    cols: usize,
    num_bits: u32,
) -> Result<Vec<i8>, QuantError> {
    check_num_bits(num_bits)?;
    if rows == 0 || cols == 0 {
        return Err(QuantError::EmptyTensor {
            what: "packed",
            rows,
            cols,
        });
    }
    let words = packed_int32_cols(cols, num_bits);
    let expected = rows.checked_mul(words).ok_or(QuantError::LengthMismatch {
        what: "packed",
        expected: usize::MAX,
        got: packed.len(),
    })?;
    check_len("packed", expected, packed.len())?;
    let offset = 1i32 << (num_bits - 1);
    let mask = (1u64 << num_bits) - 1;
    match num_bits {
        // No code straddles two words: decode word by word (the common cases).
        4 => return Ok(unpack_whole_words::<4, 8>(packed, rows, cols, words)),
        8 => return Ok(unpack_whole_words::<8, 4>(packed, rows, cols, words)),
        _ => {}
    }
    let mut out = Vec::with_capacity(rows * cols);
    for row in packed.chunks_exact(words) {
        let mut acc = 0u64;
        let mut avail = 0u32;
        let mut next = row.iter();
        for _ in 0..cols {
            if avail < num_bits {
                let w = next.next().copied().unwrap_or(0);
                acc |= u64::from(w as u32) << avail;
                avail += 32;
            }
            out.push(((acc & mask) as i32 - offset) as i8);
            acc >>= num_bits;
            avail -= num_bits;
        }
    }
    Ok(out)
}

/// Packs `[rows, cols]` int4 codes into `[rows, cols/2]` bytes in kernel order:
/// `byte = ((w[k+1] + 8) << 4) | (w[k] + 8)` (see the module docs).
///
/// Errors: empty shapes, a length mismatch, an odd `cols`, and codes outside `[−8, 7]`.
pub fn pack_int4_pairs(values: &[i8], rows: usize, cols: usize) -> Result<Vec<u8>, QuantError> {
    check_matrix("values", values.len(), rows, cols)?;
    if !cols.is_multiple_of(2) {
        return Err(QuantError::OddDimension {
            what: "values columns",
            len: cols,
        });
    }
    check_int4_range("values", values)?;
    Ok(values
        .chunks_exact(2)
        .map(|p| (nibble(p[1]) << 4) | nibble(p[0]))
        .collect())
}

/// The biased nibble `w + 8` of an int4 code already checked to lie in `[−8, 7]`.
fn nibble(w: i8) -> u8 {
    (w + 8) as u8
}

/// Inverse of [`pack_int4_pairs`]: `[rows, cols/2]` bytes back to `[rows, cols]` codes.
pub fn unpack_int4_pairs(bytes: &[u8], rows: usize, cols: usize) -> Result<Vec<i8>, QuantError> {
    if rows == 0 || cols == 0 {
        return Err(QuantError::EmptyTensor {
            what: "bytes",
            rows,
            cols,
        });
    }
    if !cols.is_multiple_of(2) {
        return Err(QuantError::OddDimension {
            what: "columns",
            len: cols,
        });
    }
    let expected = rows
        .checked_mul(cols / 2)
        .ok_or(QuantError::LengthMismatch {
            what: "bytes",
            expected: usize::MAX,
            got: bytes.len(),
        })?;
    check_len("bytes", expected, bytes.len())?;
    Ok(bytes
        .iter()
        .flat_map(|&b| [(b & 0x0F) as i8 - 8, (b >> 4) as i8 - 8])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: [i8; 8] = [-8, 7, 0, 3, -1, -2, 5, -4];

    #[test]
    fn spec_worked_example_both_orders() {
        let words = pack_to_int32(&ROW, 1, 8, 4).unwrap();
        assert_eq!(words, [0x4D67_B8F0u32 as i32]);
        let bytes = pack_int4_pairs(&ROW, 1, 8).unwrap();
        assert_eq!(bytes, [0xF0, 0xB8, 0x67, 0x4D]);
        assert_eq!(bytes, words[0].to_le_bytes());
        assert_eq!(unpack_from_int32(&words, 1, 8, 4).unwrap(), ROW);
        assert_eq!(unpack_int4_pairs(&bytes, 1, 8).unwrap(), ROW);
    }

    #[test]
    fn padding_and_eight_bit_words() {
        // 3 int4 codes take one word; the padding nibbles are code 0.
        let w = pack_to_int32(&[-8, 7, 1], 1, 3, 4).unwrap();
        assert_eq!(w, [0x0000_09F0]);
        assert_eq!(unpack_from_int32(&w, 1, 3, 4).unwrap(), [-8, 7, 1]);
        // int8: 4 codes per word, offset 128.
        let w = pack_to_int32(&[-128, 127, 0, 1, 5], 1, 5, 8).unwrap();
        assert_eq!(w, [0x81_80_FF_00u32 as i32, 0x85]);
        assert_eq!(
            unpack_from_int32(&w, 1, 5, 8).unwrap(),
            [-128, 127, 0, 1, 5]
        );
        // 3-bit codes straddle words: 11 codes = 33 bits = 2 words.
        assert_eq!(packed_int32_cols(11, 3), 2);
        let v: Vec<i8> = (0..11).map(|i| (i % 8) as i8 - 4).collect();
        let w = pack_to_int32(&v, 1, 11, 3).unwrap();
        assert_eq!(unpack_from_int32(&w, 1, 11, 3).unwrap(), v);
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert!(matches!(
            pack_to_int32(&ROW, 1, 8, 0),
            Err(QuantError::UnsupportedNumBits { num_bits: 0, .. })
        ));
        assert!(matches!(
            pack_to_int32(&ROW, 1, 8, 9),
            Err(QuantError::UnsupportedNumBits { num_bits: 9, .. })
        ));
        assert!(matches!(
            pack_to_int32(&[8], 1, 1, 4),
            Err(QuantError::ValueOutOfRange {
                index: 0,
                value: 8,
                min: -8,
                max: 7,
                ..
            })
        ));
        assert!(matches!(
            pack_to_int32(&ROW, 2, 8, 4),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            unpack_from_int32(&[0; 3], 2, 8, 4),
            Err(QuantError::LengthMismatch {
                expected: 2,
                got: 3,
                ..
            })
        ));
        assert!(matches!(
            pack_int4_pairs(&ROW[..7], 1, 7),
            Err(QuantError::OddDimension { len: 7, .. })
        ));
        assert!(matches!(
            pack_int4_pairs(&[0, -9], 1, 2),
            Err(QuantError::ValueOutOfRange { index: 1, .. })
        ));
        assert!(matches!(
            unpack_int4_pairs(&[0; 3], 1, 8),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            unpack_int4_pairs(&[], 0, 8),
            Err(QuantError::EmptyTensor { .. })
        ));
    }

    #[test]
    fn hostile_sizes_are_errors_not_overflows() {
        // `cols · bits` would overflow usize; the word count must still be exact.
        assert_eq!(packed_int32_cols(usize::MAX, 8), usize::MAX / 4 + 1);
        assert_eq!(packed_int32_cols(usize::MAX, 4), usize::MAX / 8 + 1);
        for cols in 0..200 {
            for bits in 1..=8 {
                assert_eq!(
                    packed_int32_cols(cols, bits),
                    (cols * bits as usize).div_ceil(32)
                );
            }
        }
        assert!(matches!(
            unpack_from_int32(&[0; 4], usize::MAX / 2, usize::MAX / 2, 8),
            Err(QuantError::LengthMismatch { .. })
        ));
        assert!(matches!(
            unpack_int4_pairs(&[0; 4], usize::MAX / 2, 8),
            Err(QuantError::LengthMismatch { .. })
        ));
    }
}
