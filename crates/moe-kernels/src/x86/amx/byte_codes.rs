//! 8-bit codes (integer int8 and e4m3) decoded exactly into bf16 B rows for the tile walk of
//! `int4.rs`, and the activations those rows pair with.
//!
//! Every 8-bit code value is exact in bf16: integers `−128..=255` have at most eight
//! significant bits, e4m3 values four, and the e4m3 range (subnormals down to `2^-9`, at most
//! 448) lies inside bf16's normal one. So a code's bf16 bits come from a table, split into two
//! byte tables (low and high byte of the bf16 value) of 256 entries each. `vpermi2b` looks up
//! 128 entries by a byte's low seven bits, so each byte plane takes two lookups, one per half
//! of the table, and a blend on the code's top bit: six lookups and blends turn one 64-byte
//! packed step (16 channels × 4 K values) into the low and high bytes of its 64 weights. An
//! e4m3 code's top bit is its sign, so there one lookup per plane on the low seven bits and one
//! bitwise operation that copies the sign into the high byte do. Two `vpermt2b` then
//! interleave the planes into the step's two B rows: row `j` holds the pair of K values
//! `4s + 2j`, `4s + 2j + 1` of each channel, the order of a tile row of activations taken
//! straight from K ([`bf16x16`], for `int4::fill`). That is nine vector instructions (five for e4m3) and two stores
//! per 64 weights, where dequantizing with the scale folded in costs about four per 16.

#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::bf16;

use crate::packed::{Int8Values, PackedWna16};

/// B rows one packed 8-bit step decodes into: its four K values in two pairs.
pub(crate) const ROWS_PER_STEP: usize = 2;

/// The low and high bytes of the bf16 value of each of the 256 codes of one kind, as the four
/// 64-entry quarters `vpermi2b` reads (`lo[q]` holds codes `64q..64q + 64`), and the two
/// `vpermt2b` indices that interleave a step's low and high bytes into its B rows.
#[repr(C, align(64))]
pub(crate) struct ByteTables {
    lo: [[u8; 64]; 4],
    hi: [[u8; 64]; 4],
    rows: [[u8; 64]; 2],
    /// e4m3 codes: the top bit is the sign, so the low half of the tables (codes below 128)
    /// gives both bytes and the sign goes into the high byte with one bitwise operation.
    signed: bool,
}

impl ByteTables {
    /// The tables of `value`, which must be exact in bf16 for every code; `signed` when the
    /// top bit of a code is the sign of its value.
    fn of(value: impl Fn(u8) -> f32, signed: bool) -> Self {
        let mut t = Self {
            lo: [[0; 64]; 4],
            hi: [[0; 64]; 4],
            rows: [[0; 64]; 2],
            signed,
        };
        for c in 0..=255u8 {
            let bits = bf16::from_f32(value(c)).to_bits();
            let (q, i) = (usize::from(c) / 64, usize::from(c) % 64);
            t.lo[q][i] = bits as u8;
            t.hi[q][i] = (bits >> 8) as u8;
        }
        // Byte `4c + 2h + b` of row `j` is byte `b` (0: low, 1: high) of channel `c`'s value at
        // the step's K value `2j + h`: in a plane, at `16(2j + h) + c`; the high plane is the
        // second source (`+ 64`). Kept in memory built at run time: with the constant in view,
        // the compiler lowered each permute into a dozen unpacks, extracts and inserts.
        for (j, row) in t.rows.iter_mut().enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                let (c, h, b) = (i / 4, i / 2 % 2, i % 2);
                *v = (16 * (2 * j + h) + c + 64 * b) as u8;
            }
        }
        t
    }
}

/// The tables of `w`'s 8-bit codes: the value less the symmetric zero point (128) for integer
/// codes without zero points, the raw code with them (each group's zero point comes off in the
/// epilogue), the e4m3 value for FP8. Built once per kind.
pub(crate) fn tables(w: &PackedWna16) -> &'static ByteTables {
    static SYMMETRIC: OnceLock<ByteTables> = OnceLock::new();
    static RAW: OnceLock<ByteTables> = OnceLock::new();
    static E4M3: OnceLock<ByteTables> = OnceLock::new();
    match (w.int8_values(), w.zeros()) {
        (Int8Values::E4m3, _) => {
            E4M3.get_or_init(|| ByteTables::of(crate::packed::wna16::e4m3_value, true))
        }
        (_, Some(_)) => RAW.get_or_init(|| ByteTables::of(f32::from, false)),
        (_, None) => SYMMETRIC.get_or_init(|| ByteTables::of(|c| f32::from(c) - 128.0, false)),
    }
}

/// [`ByteTables`] in registers.
#[derive(Clone, Copy)]
pub(crate) struct ByteDecoder {
    lo: [__m512i; 4],
    hi: [__m512i; 4],
    rows: [__m512i; 2],
    signed: bool,
}

impl ByteDecoder {
    /// Loads `t`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn new(t: &ByteTables) -> Self {
        // SAFETY: each table is 64 readable, 64-byte aligned bytes.
        let load = |q: &[u8; 64]| unsafe { _mm512_load_si512(q.as_ptr().cast()) };
        Self {
            lo: t.lo.each_ref().map(load),
            hi: t.hi.each_ref().map(load),
            rows: t.rows.each_ref().map(load),
            signed: t.signed,
        }
    }

    /// The two B rows of one packed step `v`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    pub(crate) fn rows(&self, v: __m512i) -> [__m512i; 2] {
        let (lo, hi) = if self.signed {
            let lo = _mm512_permutex2var_epi8(self.lo[0], v, self.lo[1]);
            let magnitude = _mm512_permutex2var_epi8(self.hi[0], v, self.hi[1]);
            // `magnitude | (v & 0x80)`: the code's sign bit is the value's.
            let sign = _mm512_set1_epi8(0x80u8 as i8);
            (lo, _mm512_ternarylogic_epi32::<0xF8>(magnitude, v, sign))
        } else {
            let top = _mm512_movepi8_mask(v);
            let plane = |t: &[__m512i; 4]| {
                let low_half = _mm512_permutex2var_epi8(t[0], v, t[1]);
                let high_half = _mm512_permutex2var_epi8(t[2], v, t[3]);
                _mm512_mask_blend_epi8(top, low_half, high_half)
            };
            (plane(&self.lo), plane(&self.hi))
        };
        [
            _mm512_permutex2var_epi8(lo, self.rows[0], hi),
            _mm512_permutex2var_epi8(lo, self.rows[1], hi),
        ]
    }
}

/// Values `lo..lo + 16` of `row` (zeros past its end) rounded to bf16, in order: 32 bytes
/// of a tile row of activations for the B rows above.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) fn bf16x16(row: &[f32], lo: usize) -> [u8; 32] {
    let n = row.len().saturating_sub(lo).min(16);
    let keep: __mmask16 = if n == 16 { !0 } else { (1 << n) - 1 };
    // SAFETY: the masked load reads only the `n` values `row[lo..lo + n]`.
    let v = unsafe { _mm512_maskz_loadu_ps(keep, row.as_ptr().wrapping_add(lo)) };
    let h = _mm512_cvtneps_pbh(v);
    // SAFETY: a bf16 vector reinterpreted as its 16-bit patterns.
    let h = unsafe { std::mem::transmute::<__m256bh, __m256i>(h) };
    let mut bytes = [0u8; 32];
    // SAFETY: `bytes` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), h) };
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packed::wna16::e4m3_value;
    use crate::x86::wna16dot::tests::assert_near_the_bf16_model;

    /// Whether the CPU can run the decode (the table lookups need AVX-512 VBMI).
    fn can_decode() -> bool {
        let ok = std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512bw");
        if !ok {
            eprintln!("note: skipping the 8-bit decode: no AVX-512 VBMI");
        }
        ok
    }

    /// Every code of every kind, in every lane of a step, decodes to the bf16 bits of its value
    /// (less 128 for symmetric integers), in the pair order of the B rows.
    #[test]
    fn every_code_decodes_to_its_exact_bf16_value() {
        if !can_decode() {
            return;
        }
        type Kind = (&'static str, &'static ByteTables, fn(u8) -> f32);
        let kinds: [Kind; 3] = {
            static S: OnceLock<ByteTables> = OnceLock::new();
            static R: OnceLock<ByteTables> = OnceLock::new();
            static E: OnceLock<ByteTables> = OnceLock::new();
            [
                (
                    "symmetric",
                    S.get_or_init(|| ByteTables::of(|c| f32::from(c) - 128.0, false)),
                    |c| f32::from(c) - 128.0,
                ),
                (
                    "raw",
                    R.get_or_init(|| ByteTables::of(f32::from, false)),
                    f32::from,
                ),
                (
                    "e4m3",
                    E.get_or_init(|| ByteTables::of(e4m3_value, true)),
                    e4m3_value,
                ),
            ]
        };
        for (kind, t, value) in kinds {
            // SAFETY: AVX-512 BW and VBMI were checked (F comes with BW).
            let dec = unsafe { ByteDecoder::new(t) };
            for quarter in 0..4usize {
                // Byte `16j + c` is channel `c`'s code at K value `j` of the step; the four
                // quarters put each of the 256 codes in some lane once.
                let step: [u8; 64] = std::array::from_fn(|i| (64 * quarter + i * 37 % 64) as u8);
                // SAFETY: 64 readable bytes; unaligned load.
                let v = unsafe { _mm512_loadu_si512(step.as_ptr().cast()) };
                // SAFETY: AVX-512 F/BW/VBMI were checked.
                let rows = unsafe { dec.rows(v) };
                for (j, row) in rows.iter().enumerate() {
                    let mut got = [0u8; 64];
                    // SAFETY: 64 writable bytes; unaligned store.
                    unsafe { _mm512_storeu_si512(got.as_mut_ptr().cast(), *row) };
                    for c in 0..16 {
                        for h in 0..2 {
                            let code = step[16 * (2 * j + h) + c];
                            if kind == "e4m3" && code & 0x7F == 0x7F {
                                continue;
                            }
                            let at = 4 * c + 2 * h;
                            let bits = u16::from_le_bytes([got[at], got[at + 1]]);
                            let want = value(code);
                            assert_eq!(bf16::from_f32(want).to_f32(), want, "{kind} {code}");
                            assert_eq!(
                                bits,
                                bf16::from_f32(want).to_bits(),
                                "{kind}: code {code:#04x} (row {j}, channel {c}, pair {h})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AMX body's sets this CPU can run from one row: on the emulated unit, and on the
    /// hardware where present.
    fn tile_sets() -> Vec<(&'static str, crate::KernelSet)> {
        let mut sets = Vec::new();
        if let Some(ks) = crate::x86::amx::emulated::int4_kernel_set() {
            sets.push(("amx-bf16 on emulated tiles", ks));
        }
        if let Some(ks) = crate::x86::amx::hardware_int4_kernel_set() {
            sets.push(("amx-bf16 tiles", ks));
        }
        sets
    }

    /// An 8-bit matrix of `kind` (`"int8"`, `"int8 zero points"` or `"fp8"`): random codes
    /// (e4m3 ones without NaN), scales per group of `group` (FP8: 128 × 128 blocks), a bias.
    fn matrix(
        rng: &mut moe_testutil::SplitMix64,
        kind: &str,
        (n, k): (usize, usize),
        group: Option<usize>,
    ) -> crate::PackedWna16 {
        use crate::{Fp8Desc, Fp8Rows, Fp8Scales, Wna16Desc, Wna16Scales};
        let codes: Vec<u8> = (0..n * k)
            .map(|_| match rng.below(256) as u8 {
                c if kind == "fp8" && c & 0x7F == 0x7F => c & 0xF0,
                c => c,
            })
            .collect();
        let bias = rng.vec_uniform(n, -1.0, 1.0);
        if kind == "fp8" {
            let blocks = rng.vec_uniform(n.div_ceil(128) * k.div_ceil(128), 1e-3, 1e-1);
            let rows = [Fp8Rows {
                channels: n,
                codes: &codes,
                scales: Fp8Scales::Blocks(&blocks),
            }];
            return crate::PackedWna16::pack_fp8(Fp8Desc {
                n,
                k,
                rows: &rows,
                bias: Some(&bias),
            })
            .unwrap();
        }
        let groups = group.map_or(1, |g| k.div_ceil(g));
        let scales: Vec<bf16> = (0..n * groups)
            .map(|_| bf16::from_f32(rng.uniform(1e-3, 1e-2)))
            .collect();
        let zeros: Vec<u8> = (0..n * groups).map(|_| rng.below(256) as u8).collect();
        crate::PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits: 8,
            codes: &codes,
            group_size: moe_quant::WeightGroups::from_group_size(group).unwrap(),
            scales: Wna16Scales::Bf16(&scales),
            zeros: (kind == "int8 zero points").then_some(&zeros[..]),
            bias: Some(&bias),
            perm: None,
        })
        .unwrap()
    }

    /// Symmetric int8, int8 with zero points and FP8 on ragged shapes (K past the last chunk,
    /// partial last groups, N not a multiple of 16, one group, row groups of one and two tiles)
    /// against the f64 model of the bf16 bodies.
    #[test]
    fn byte_codes_on_the_tiles_match_the_f64_model_on_ragged_shapes() {
        if !can_decode() {
            return;
        }
        let sets = tile_sets();
        let mut rng = moe_testutil::SplitMix64::new(0xb7e);
        // (kind, K, group size or channelwise); groups of whole 32-value chunks.
        let cases: [(&str, usize, Option<usize>); 8] = [
            ("int8", 256, Some(128)),
            ("int8", 300, Some(32)),
            ("int8", 72, None),
            ("int8 zero points", 200, Some(64)),
            ("int8 zero points", 37, None),
            ("fp8", 256, None),
            ("fp8", 300, None),
            ("fp8", 100, None),
        ];
        let mut taken = 0;
        for &(kind, k, group) in &cases {
            for &n in &[1usize, 17, 130] {
                let w = matrix(&mut rng, kind, (n, k), group);
                let dq = w.dequantize_f64();
                for &m in &[0usize, 1, 8, 9, 17, 33, 64, 65, 130] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                    for (unit, ks) in &sets {
                        if ks.wna16_int4_dot_for(&w, m).is_none() {
                            continue;
                        }
                        taken += 1;
                        let mut got = vec![f32::NAN; m * n];
                        let par = crate::Par::Seq;
                        let mut scratch = crate::GemmScratch::new();
                        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut scratch, par).unwrap();
                        let case = format!("{unit}: {kind} k={k} group={group:?}");
                        assert_near_the_bf16_model(&case, (&w, &dq), m, &x, &got);
                    }
                }
            }
        }
        assert!(sets.is_empty() || taken > 0, "the tile body took no case");
    }

    /// Walked over K in blocks of scale groups, the 8-bit codes give the bits of one walk.
    #[test]
    fn byte_codes_walked_in_k_blocks_give_the_bits_of_one_walk() {
        if !can_decode() {
            return;
        }
        let mut rng = moe_testutil::SplitMix64::new(0xb7f);
        for (kind, k, group) in [
            ("int8", 544usize, 32usize),
            ("int8 zero points", 640, 64),
            ("fp8", 640, 128),
        ] {
            let n = 33;
            let w = matrix(&mut rng, kind, (n, k), Some(group));
            for m in [1usize, 17, 32] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                let per_group = m.next_multiple_of(16) * 64 * (group / 32);
                for (unit, ks) in &tile_sets() {
                    assert!(ks.wna16_int4_dot_for(&w, m).is_some(), "{unit}: {kind}");
                    let run = |out: &mut [f32]| {
                        let mut scratch = crate::GemmScratch::new();
                        crate::wna16_gemm(ks, m, &x, &w, out, &mut scratch, crate::Par::Seq)
                            .unwrap()
                    };
                    let budgets = [1, 2, 3].map(|groups| groups * per_group);
                    let changed = crate::x86::amx::budget_changing_bits(m * n, budgets, run);
                    assert_eq!(changed, None, "{unit}: {kind} k={k} m={m}");
                }
            }
        }
    }
}
