//! The GPTQ → Marlin repack on the CPU (spec `marlin.md` §3.1–§3.4), bit-exact with vLLM's
//! `gptq_marlin_repack` / `gptq_marlin_moe_repack` CUDA ops, and its inverse.
//!
//! The output is cut into bands of one tile height (16 rows of K, or 32 with 8-bit
//! activations); a band's words are contiguous in the output, so bands are independent jobs for
//! rayon and each writes straight into the caller's preallocated buffer. Each of the four
//! layouts has a path that moves whole bytes with shifts and masks (act-order first gathers the
//! band's rows); the reference path gathers the band's codes into bytes and packs them through
//! the tile table of [`MarlinLayout::field_coords`]. Tests check every fast path against it.

use super::error::{MarlinError, check_len, checked_product};
use super::layout::{MarlinLayout, WeightBits, check_tile_shape};
use crate::Par;
use crate::par::for_each_chunk;

/// The arguments of one repack call, named as upstream names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepackSpec {
    /// Reduction dimension K (rows of codes).
    pub size_k: usize,
    /// Output dimension N (columns).
    pub size_n: usize,
    /// Weight bits, 4 or 8.
    pub num_bits: u32,
    /// Use the 32×32-tile layout for 8-bit activations.
    pub is_a_8bit: bool,
}

impl RepackSpec {
    /// Words of one packed matrix, in either layout (`K·N / pack_factor`), after the shape
    /// checks.
    pub fn words(&self) -> Result<usize, MarlinError> {
        let layout = check_tile_shape(self.size_k, self.size_n, self.num_bits, self.is_a_8bit)?;
        Ok(checked_product("K·N", &[self.size_k, self.size_n])? / layout.bits.pack_factor())
    }
}

/// Validates one expert's act-order permutation: empty, or a permutation of `0..K`.
pub(crate) fn check_perm(
    tensor: &'static str,
    expert: usize,
    perm: &[u32],
    size_k: usize,
) -> Result<(), MarlinError> {
    if perm.len() != size_k {
        return Err(MarlinError::PermLength {
            tensor,
            expert,
            expected: size_k,
            got: perm.len(),
        });
    }
    let mut seen = vec![false; size_k];
    for (index, &p) in perm.iter().enumerate() {
        let slot = seen.get_mut(p as usize).filter(|s| !**s);
        match slot {
            Some(s) => *s = true,
            None => {
                return Err(MarlinError::NotAPermutation {
                    tensor,
                    expert,
                    size_k,
                    index,
                    value: u64::from(p),
                });
            }
        }
    }
    Ok(())
}

/// All checks of a (batched) repack, in upstream's order, then the project's rules.
fn validate(
    qweight: &[u32],
    shape: [usize; 3],
    perm: &[u32],
    spec: RepackSpec,
    out_len: usize,
) -> Result<MarlinLayout, MarlinError> {
    let [experts, rows, cols] = shape;
    let RepackSpec {
        size_k,
        size_n,
        num_bits,
        is_a_8bit,
    } = spec;
    if size_k % 16 != 0 {
        return Err(MarlinError::SizeKNotMultiple { size_k, tile: 16 });
    }
    if size_n % 64 != 0 {
        return Err(MarlinError::SizeNNotMultiple { size_n, tile: 64 });
    }
    let bits = WeightBits::new(num_bits)?;
    let pack_factor = bits.pack_factor();
    if rows != size_k / pack_factor {
        return Err(MarlinError::QweightRowsMismatch {
            rows,
            size_k,
            pack_factor,
        });
    }
    if cols != size_n {
        return Err(MarlinError::QweightColsMismatch { cols, size_n });
    }
    if !perm.is_empty() && is_a_8bit {
        return Err(MarlinError::PermWithA8 { num_bits });
    }
    let layout = check_tile_shape(size_k, size_n, num_bits, is_a_8bit)?;
    let words = checked_product("E·K·N", &[experts, size_k, size_n])? / pack_factor;
    check_len("qweight", words, qweight.len())?;
    check_len("out", words, out_len)?;
    if !perm.is_empty() {
        let expected = checked_product("E·K", &[experts, size_k])?;
        if perm.len() != expected {
            return Err(MarlinError::PermLength {
                tensor: "perm",
                expert: 0,
                expected,
                got: perm.len(),
            });
        }
        for (e, p) in perm.chunks_exact(size_k.max(1)).enumerate() {
            check_perm("perm", e, p, size_k)?;
        }
    }
    Ok(layout)
}

/// Repacks one GPTQ-layout matrix `qweight` (`shape = [K/pack_factor, N]`, field `t` of row
/// `r` = code of row `r·pf + t`) into Marlin's layout, writing `K·N/pf` words into `out`.
///
/// `perm` is empty, or the act-order permutation of length K: row `k` of the repacked matrix
/// is checkpoint row `perm[k]`. Upstream's name for this is `gptq_marlin_repack`.
pub fn repack(
    qweight: &[u32],
    shape: [usize; 2],
    perm: &[u32],
    spec: RepackSpec,
    out: &mut [u32],
    par: Par,
) -> Result<MarlinLayout, MarlinError> {
    repack_experts(qweight, [1, shape[0], shape[1]], perm, spec, out, par)
}

/// The expert-batched repack (`gptq_marlin_moe_repack`): `qweight` is `[E, K/pf, N]`, `perm` is
/// empty or `[E, K]`, `out` is the preallocated `[E, K/16, N·bits/2]` buffer.
pub fn repack_experts(
    qweight: &[u32],
    shape: [usize; 3],
    perm: &[u32],
    spec: RepackSpec,
    out: &mut [u32],
    par: Par,
) -> Result<MarlinLayout, MarlinError> {
    let layout = validate(qweight, shape, perm, spec, out.len())?;
    let (k, n) = (spec.size_k, spec.size_n);
    let pf = layout.bits.pack_factor();
    let expert_words = k * n / pf;
    let band_words = layout.tile_k() * n / pf;
    if band_words == 0 {
        return Ok(layout);
    }
    let bands = k / layout.tile_k();
    let table = BandTable::new(layout, n);
    let scratch = || (Vec::<u8>::new(), Vec::<u32>::new());
    for_each_chunk(out, band_words, par, scratch, |scratch, band, dst| {
        let (e, kt) = (band / bands, band % bands);
        let src = &qweight[e * expert_words..(e + 1) * expert_words];
        let perm = if perm.is_empty() {
            None
        } else {
            Some(&perm[e * k..(e + 1) * k])
        };
        match (layout.bits, layout.a8, perm) {
            (WeightBits::B4, false, None) => band_b4(src, n, kt, dst),
            (WeightBits::B8, false, None) => band_b8(src, n, kt, dst),
            (WeightBits::B4, true, None) => band_b4_a8(src, n, kt, dst),
            (WeightBits::B8, true, None) => band_b8_a8(src, n, kt, dst),
            // Act-order: gather the band's rows into GPTQ words, then the byte-moving path.
            (bits, false, Some(p)) => {
                let rows = &mut scratch.1;
                gather_band_words(src, n, bits, kt, p, rows);
                match bits {
                    WeightBits::B4 => band_b4(rows, n, 0, dst),
                    WeightBits::B8 => band_b8(rows, n, 0, dst),
                }
            }
            _ => {
                let codes = &mut scratch.0;
                gather_band_codes(src, n, layout, kt, perm, codes);
                table.pack(codes, dst);
            }
        }
    });
    Ok(layout)
}

/// The tile table with band-relative offsets: entry `w·pf + t` is the index into a band's
/// `[tile_k, N]` code buffer (relative to the tile's first column) of field `t` of word `w`.
struct BandTable {
    layout: MarlinLayout,
    tiles_n: usize,
    offsets: Vec<u32>,
}

impl BandTable {
    fn new(layout: MarlinLayout, n: usize) -> Self {
        let pf = layout.bits.pack_factor();
        let offsets = (0..layout.words_per_tile())
            .flat_map(|w| {
                (0..pf).map(move |t| {
                    let (kl, nl) = layout.field_coords(w, t);
                    (kl * n + nl) as u32
                })
            })
            .collect();
        Self {
            layout,
            tiles_n: n / layout.tile_n(),
            offsets,
        }
    }

    /// Packs a band's codes (`[tile_k, N]`, row-major) into its Marlin words.
    fn pack(&self, codes: &[u8], dst: &mut [u32]) {
        let pf = self.layout.bits.pack_factor();
        let bits = self.layout.bits.bits();
        let wpt = self.layout.words_per_tile();
        let tn = self.layout.tile_n();
        for nt in 0..self.tiles_n {
            let base = &codes[nt * tn..];
            for (word, offs) in dst[nt * wpt..(nt + 1) * wpt]
                .iter_mut()
                .zip(self.offsets.chunks_exact(pf))
            {
                *word = offs.iter().enumerate().fold(0u32, |acc, (t, &o)| {
                    acc | (u32::from(base[o as usize]) << (bits * t as u32))
                });
            }
        }
    }

    /// Unpacks a band's Marlin words into its codes (`[tile_k, N]`, row-major).
    fn unpack(&self, src: &[u32], codes: &mut [u8]) {
        let pf = self.layout.bits.pack_factor();
        let bits = self.layout.bits.bits();
        let mask = self.layout.bits.mask();
        let wpt = self.layout.words_per_tile();
        let tn = self.layout.tile_n();
        for nt in 0..self.tiles_n {
            let base = &mut codes[nt * tn..];
            for (&word, offs) in src[nt * wpt..(nt + 1) * wpt]
                .iter()
                .zip(self.offsets.chunks_exact(pf))
            {
                for (t, &o) in offs.iter().enumerate() {
                    base[o as usize] = ((word >> (bits * t as u32)) & mask) as u8;
                }
            }
        }
    }
}

/// Fills `codes` with band `kt`'s codes `[tile_k, N]`, rows taken through `perm` when given.
fn gather_band_codes(
    src: &[u32],
    n: usize,
    layout: MarlinLayout,
    kt: usize,
    perm: Option<&[u32]>,
    codes: &mut Vec<u8>,
) {
    let tk = layout.tile_k();
    let pf = layout.bits.pack_factor();
    let bits = layout.bits.bits();
    let mask = layout.bits.mask();
    codes.clear();
    codes.resize(tk * n, 0);
    for (kl, row) in codes.chunks_exact_mut(n).enumerate() {
        let k = kt * tk + kl;
        let k_src = perm.map_or(k, |p| p[k] as usize);
        let shift = bits * (k_src % pf) as u32;
        let packed = &src[(k_src / pf) * n..(k_src / pf + 1) * n];
        for (c, &w) in row.iter_mut().zip(packed) {
            *c = ((w >> shift) & mask) as u8;
        }
    }
}

/// Fills `rows` with the GPTQ words (`16 / pf` rows of N) of band `kt` of the permuted matrix:
/// row `k` of the band is checkpoint row `perm[16·kt + k]`.
fn gather_band_words(
    src: &[u32],
    n: usize,
    bits: WeightBits,
    kt: usize,
    perm: &[u32],
    rows: &mut Vec<u32>,
) {
    let pf = bits.pack_factor();
    let (b, mask) = (bits.bits(), bits.mask());
    rows.clear();
    rows.resize(16 / pf * n, 0);
    // Row by row: each pass is a plain shift-mask-or over N words, which vectorises.
    for kl in 0..16 {
        let k_src = perm[16 * kt + kl] as usize;
        let shift_in = b * (k_src % pf) as u32;
        let shift_out = b * (kl % pf) as u32;
        let packed = &src[(k_src / pf) * n..(k_src / pf + 1) * n];
        let dst = &mut rows[(kl / pf) * n..(kl / pf + 1) * n];
        for (d, &w) in dst.iter_mut().zip(packed) {
            *d |= ((w >> shift_in) & mask) << shift_out;
        }
    }
}

/// Byte `p` of `w`.
#[inline(always)]
fn byte(w: u32, p: usize) -> u32 {
    (w >> (8 * p)) & 0xff
}

/// 4-bit, 16-bit activations, no permutation: band `kt` from GPTQ rows `2kt` and `2kt + 1`.
///
/// Word `w = 4i + j` of a tile holds, for `p = i mod 4`, the nibbles `2p` and `2p + 1` (one
/// byte) of four GPTQ words: rows `2kt` and `2kt + 1` at columns `n0 = 16j + i div 4` and
/// `n0 + 8`, interleaved as `[a0, b0, c0, d0, a1, b1, c1, d1]` (spec §3.3).
fn band_b4(src: &[u32], n: usize, kt: usize, dst: &mut [u32]) {
    const LO: u32 = 0x0f0f_0f0f;
    let r0 = &src[2 * kt * n..(2 * kt + 1) * n];
    let r1 = &src[(2 * kt + 1) * n..(2 * kt + 2) * n];
    for (nt, tile) in dst.chunks_exact_mut(128).enumerate() {
        for j in 0..4 {
            for i4 in 0..8 {
                let n0 = 64 * nt + 16 * j + i4;
                let (a, b, c, d) = (r0[n0], r1[n0], r0[n0 + 8], r1[n0 + 8]);
                let l1 = (a & LO) | ((b & LO) << 4);
                let l2 = (c & LO) | ((d & LO) << 4);
                let h1 = ((a >> 4) & LO) | (b & !LO);
                let h2 = ((c >> 4) & LO) | (d & !LO);
                for p in 0..4 {
                    tile[4 * (4 * i4 + p) + j] = byte(l1, p)
                        | (byte(l2, p) << 8)
                        | (byte(h1, p) << 16)
                        | (byte(h2, p) << 24);
                }
            }
        }
    }
}

/// 8-bit, 16-bit activations, no permutation: band `kt` from GPTQ rows `4kt .. 4kt + 4`.
///
/// Word `w = 8i + 2j + c` holds, for `p = i mod 4`, half-word `p mod 2` of the GPTQ words at
/// rows `4kt + p div 2` and `+ 2`, column `16j + i div 4 + 8c`, as `[a0, b0, a1, b1]`.
fn band_b8(src: &[u32], n: usize, kt: usize, dst: &mut [u32]) {
    let rows: [&[u32]; 4] = std::array::from_fn(|q| &src[(4 * kt + q) * n..(4 * kt + q + 1) * n]);
    for (nt, tile) in dst.chunks_exact_mut(256).enumerate() {
        for j in 0..4 {
            for i4 in 0..8 {
                for c in 0..2 {
                    let col = 64 * nt + 16 * j + i4 + 8 * c;
                    for p in 0..4 {
                        let (a, b) = (rows[p / 2][col], rows[p / 2 + 2][col]);
                        let h = 2 * (p % 2);
                        tile[8 * (4 * i4 + p) + 2 * j + c] = byte(a, h)
                            | (byte(b, h) << 8)
                            | (byte(a, h + 1) << 16)
                            | (byte(b, h + 1) << 24);
                    }
                }
            }
        }
    }
}

/// Spreads the four nibbles of a half-word into the low nibbles of the four bytes of a word.
#[inline(always)]
fn spread_nibbles(half: u32) -> u32 {
    let x = (half | (half << 8)) & 0x00ff_00ff;
    (x | (x << 4)) & 0x0f0f_0f0f
}

/// 4-bit, 8-bit activations (32×32 tiles): band `kt` from GPTQ rows `4kt .. 4kt + 4`.
///
/// Word `w = 4i + 2j + c` holds, for `p = i mod 4`, half-word `p mod 2` (four codes) of the GPTQ
/// words at rows `4kt + p div 2` and `+ 2`, column `16j + i div 4 + 8c`, nibbles interleaved
/// `[a0, b0, a1, b1, a2, b2, a3, b3]`.
fn band_b4_a8(src: &[u32], n: usize, kt: usize, dst: &mut [u32]) {
    let rows: [&[u32]; 4] = std::array::from_fn(|q| &src[(4 * kt + q) * n..(4 * kt + q + 1) * n]);
    for (nt, tile) in dst.chunks_exact_mut(128).enumerate() {
        for i4 in 0..8 {
            for j in 0..2 {
                for c in 0..2 {
                    let col = 32 * nt + 16 * j + i4 + 8 * c;
                    for p in 0..4 {
                        let h = 16 * (p % 2);
                        let a = (rows[p / 2][col] >> h) & 0xffff;
                        let b = (rows[p / 2 + 2][col] >> h) & 0xffff;
                        tile[4 * (4 * i4 + p) + 2 * j + c] =
                            spread_nibbles(a) | (spread_nibbles(b) << 4);
                    }
                }
            }
        }
    }
}

/// 8-bit, 8-bit activations (32×32 tiles): band `kt` from GPTQ rows `8kt .. 8kt + 8`. Word
/// `w = 8i + 4j + 2c + h` is the GPTQ word at row `8kt + (i mod 4) + 4h`, column
/// `16j + i div 4 + 8c`, unchanged.
fn band_b8_a8(src: &[u32], n: usize, kt: usize, dst: &mut [u32]) {
    let rows: [&[u32]; 8] = std::array::from_fn(|q| &src[(8 * kt + q) * n..(8 * kt + q + 1) * n]);
    for (nt, tile) in dst.chunks_exact_mut(256).enumerate() {
        for i4 in 0..8 {
            for j in 0..2 {
                for c in 0..2 {
                    let col = 32 * nt + 16 * j + i4 + 8 * c;
                    for p in 0..4 {
                        for h in 0..2 {
                            tile[8 * (4 * i4 + p) + 4 * j + 2 * c + h] = rows[p + 4 * h][col];
                        }
                    }
                }
            }
        }
    }
}

/// Unpacks one Marlin matrix into its codes `[K, N]` (row `k` = repacked row `k`, i.e. checkpoint
/// row `perm[k]` when the repack had a permutation). The inverse of [`repack`] up to `perm`.
pub fn unpack_codes(words: &[u32], spec: RepackSpec) -> Result<Vec<u8>, MarlinError> {
    let layout = check_tile_shape(spec.size_k, spec.size_n, spec.num_bits, spec.is_a_8bit)?;
    let (k, n) = (spec.size_k, spec.size_n);
    let codes_len = checked_product("K·N", &[k, n])?;
    check_len(
        "marlin_qweight",
        codes_len / layout.bits.pack_factor(),
        words.len(),
    )?;
    let mut codes = vec![0u8; codes_len];
    let band_words = layout.tile_k() * n / layout.bits.pack_factor();
    if band_words == 0 {
        return Ok(codes);
    }
    let table = BandTable::new(layout, n);
    for (band, dst) in words
        .chunks_exact(band_words)
        .zip(codes.chunks_exact_mut(layout.tile_k() * n))
    {
        table.unpack(band, dst);
    }
    Ok(codes)
}

/// Unpacks one Marlin matrix back into the GPTQ words it was repacked from: the exact inverse
/// of [`repack`] with the same `perm` (empty for none). Used by tests and by the round trip.
pub fn unpack(words: &[u32], spec: RepackSpec, perm: &[u32]) -> Result<Vec<u32>, MarlinError> {
    let codes = unpack_codes(words, spec)?;
    let (k, n) = (spec.size_k, spec.size_n);
    if !perm.is_empty() {
        check_perm("perm", 0, perm, k)?;
    }
    let bits = WeightBits::new(spec.num_bits)?;
    let pf = bits.pack_factor();
    let mut out = vec![0u32; k * n / pf];
    for (kk, row) in codes.chunks_exact(n.max(1)).enumerate().take(k) {
        let k_src = if perm.is_empty() {
            kk
        } else {
            perm[kk] as usize
        };
        let shift = bits.bits() * (k_src % pf) as u32;
        let dst = &mut out[(k_src / pf) * n..(k_src / pf + 1) * n];
        for (w, &c) in dst.iter_mut().zip(row) {
            *w |= u32::from(c) << shift;
        }
    }
    Ok(out)
}

/// Packs codes `[K, N]` into GPTQ words `[K/pf, N]` (field `t` of row `r` = code of row
/// `r·pf + t`). Codes above the bit width are refused.
pub fn pack_gptq(
    codes: &[u8],
    size_k: usize,
    size_n: usize,
    num_bits: u32,
) -> Result<Vec<u32>, MarlinError> {
    let bits = WeightBits::new(num_bits)?;
    let pf = bits.pack_factor();
    check_len(
        "codes",
        checked_product("K·N", &[size_k, size_n])?,
        codes.len(),
    )?;
    if !size_k.is_multiple_of(pf) {
        return Err(MarlinError::SizeKNotMultiple { size_k, tile: pf });
    }
    if let Some(index) = codes.iter().position(|&c| u32::from(c) > bits.mask()) {
        return Err(MarlinError::CodeOutOfRange {
            tensor: "codes",
            index,
            value: codes[index],
            max: bits.mask(),
        });
    }
    let mut out = vec![0u32; size_k * size_n / pf];
    for (k, row) in codes.chunks_exact(size_n.max(1)).enumerate().take(size_k) {
        let shift = bits.bits() * (k % pf) as u32;
        for (w, &c) in out[(k / pf) * size_n..(k / pf + 1) * size_n]
            .iter_mut()
            .zip(row)
        {
            *w |= u32::from(c) << shift;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's pinned self-check code pattern.
    fn pinned_codes(k: usize, n: usize, bits: u32) -> Vec<u8> {
        (0..k)
            .flat_map(|kk| {
                (0..n).map(move |nn| (((37 * kk + 11 * nn + kk * nn) % 251) % (1 << bits)) as u8)
            })
            .collect()
    }

    #[test]
    fn pinned_self_check_vectors() {
        let cases: [(u32, bool, usize, [u32; 6], u32, u32); 4] = [
            (
                4,
                false,
                16,
                [
                    0x252558d0, 0xca75ad20, 0x1fca4d75, 0x6f6f92ca, 0x1fcf427a, 0x646497cf,
                ],
                0xa0e2c8d7,
                0xec057cf5,
            ),
            (
                8,
                false,
                16,
                [
                    0x52252d00, 0xf285c558, 0x97e562b0, 0x3c4afa0d, 0xdcaa9765, 0x810f34bd,
                ],
                0x5472f15f,
                0xc4e2d493,
            ),
            (
                4,
                true,
                32,
                [
                    0x9f4af5a0, 0xef124578, 0x34ef9540, 0x84b7eacd, 0x28de89e4, 0x78abdeb1,
                ],
                0x7f1169cf,
                0xf1ae47a9,
            ),
            (
                8,
                true,
                32,
                [
                    0x6f4a2500, 0xc9a47f5a, 0xdfb28558, 0xbe916437, 0x541fe5b0, 0xb37e4914,
                ],
                0xb8f0cf33,
                0x2c7dae0d,
            ),
        ];
        for (bits, a8, k, first, xor, sum) in cases {
            let n = 64;
            let q = pack_gptq(&pinned_codes(k, n, bits), k, n, bits).unwrap();
            let spec = RepackSpec {
                size_k: k,
                size_n: n,
                num_bits: bits,
                is_a_8bit: a8,
            };
            let mut out = vec![0; spec.words().unwrap()];
            repack(
                &q,
                [k * bits as usize / 32, n],
                &[],
                spec,
                &mut out,
                Par::Seq,
            )
            .unwrap();
            assert_eq!(out[..6], first, "b{bits} a8={a8}");
            assert_eq!(out.iter().fold(0, |a, w| a ^ w), xor);
            assert_eq!(out.iter().fold(0u32, |a, w| a.wrapping_add(*w)), sum);
        }
    }

    #[test]
    fn fast_paths_equal_the_table_path() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for bits in [WeightBits::B4, WeightBits::B8] {
            let (k, n) = (64, 192);
            let pf = bits.pack_factor();
            let words: Vec<u32> = (0..k * n / pf)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (state >> 32) as u32
                })
                .collect();
            let layout = MarlinLayout { bits, a8: false };
            let table = BandTable::new(layout, n);
            // The 8-bit-activation paths (no permutation) against the table path.
            let a8 = MarlinLayout { bits, a8: true };
            let a8_table = BandTable::new(a8, n);
            let a8_band = 32 * n / pf;
            for kt in 0..k / 32 {
                let (mut fast, mut slow) = (vec![0; a8_band], vec![0; a8_band]);
                match bits {
                    WeightBits::B4 => band_b4_a8(&words, n, kt, &mut fast),
                    WeightBits::B8 => band_b8_a8(&words, n, kt, &mut fast),
                }
                let mut codes = Vec::new();
                gather_band_codes(&words, n, a8, kt, None, &mut codes);
                a8_table.pack(&codes, &mut slow);
                assert_eq!(fast, slow, "{bits:?} a8 band {kt}");
            }
            let reversed: Vec<u32> = (0..k as u32).rev().collect();
            let band = 16 * n / pf;
            for perm in [None, Some(&reversed[..])] {
                for kt in 0..k / 16 {
                    let (mut fast, mut slow) = (vec![0; band], vec![0; band]);
                    let mut rows = Vec::new();
                    match perm {
                        None => rows.extend_from_slice(&words[kt * band..(kt + 1) * band]),
                        Some(p) => gather_band_words(&words, n, bits, kt, p, &mut rows),
                    }
                    match bits {
                        WeightBits::B4 => band_b4(&rows, n, 0, &mut fast),
                        WeightBits::B8 => band_b8(&rows, n, 0, &mut fast),
                    }
                    let mut codes = Vec::new();
                    gather_band_codes(&words, n, layout, kt, perm, &mut codes);
                    table.pack(&codes, &mut slow);
                    assert_eq!(fast, slow, "{bits:?} band {kt} perm {}", perm.is_some());
                }
            }
        }
    }
}
