//! The WNA16 body for int4 codes on AVX-512 BF16 (`vdpbf16ps`), the codes decoded to bf16 in
//! registers: activations rounded to bf16 once per GEMM, code values exact, f32 sums per
//! group scaled in f32. It serves every row count, from decode to prefill.
//!
//! One 64-byte int4 step holds 8 K values of the panel's 16 channels, one channel per 32-bit
//! lane, nibble `j` = K value `8s + j`; the lane's low 16 bits hold K values `0..4` of the step
//! and its high 16 bits K values `4..8`. One `vpsrlw` by `4j` therefore puts K value `j` in the
//! low four bits of the low half and K value `j + 4` in those of the high half, and one
//! `vpermw` through a 32-entry table (the 16 code values twice, so the bit above the code is
//! ignored) turns both halves into their bf16 values: `c − 8` for symmetric integer codes, `c`
//! for asymmetric ones, the e2m1 value for MXFP4, all exact in bf16. That lane is one
//! `vdpbf16ps` operand for the K pair `(j, j + 4)`, so the activations are laid out once per
//! GEMM as bf16 pairs in that order ([`fill`]): two instructions decode 32 weights, where the
//! f32 body needs four for 16, and one `vdpbf16ps` does the work of two `vfmadd`.
//!
//! Each group's pair products go into per-row partial sums (four chains per row for tiles of one
//! or two rows, two for larger ones, so one `vdpbf16ps` latency chain does not bound them, and
//! the body prefetches the weights 4 KiB ahead into L1 and 8 KiB ahead into L2); at the end of
//! the group the chains are added, an asymmetric group subtracts `z · Σx` (the sum of the row's
//! bf16 activations over the group, made by [`fill`]), and the sum is scaled into the row's
//! accumulator with one `vfmadd`, as the f32 body does. Rows run in blocks of [`ROW_BLOCK`], each
//! over all of the call's panels, so a block's activations stay in L2 while the panels stream.
//!
//! Numerics against the f32 reference: the activations are rounded to bf16 (nearest, ties to
//! even); products are exact; `vdpbf16ps` adds a lane's two products to its sum in one step
//! and treats bf16 denormals as zero, so results are compared with an f64 model within a
//! tolerance, not bit for bit.

// Register arrays are indexed by row in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use crate::aligned::AlignedVec;
use half::bf16;

use super::wna16::{
    LUT_RAW, LUT_SYM, group_scales, load_step, load_zeros, prefetch_ahead_into_l2, store_panel_rows,
};
use crate::dispatch::Int4Dot;
use crate::packed::wna16::{E2M1_VALUES, Int4Values, K_STEP};
use crate::packed::{PANEL, PackedWna16};
use crate::wna16::{Int4DotJob, Int4DotLayout, Int4DotTileFn, row_stride, run_row_blocks};

/// Rows per tile: 8 rows × 2 chains of partial sums and 8 accumulators leave room for the
/// table, the step and the decoded pair. Tiles of up to 16 rows on one chain each, which
/// decode each step for twice the rows, ran no faster on one core with the codes in cache
/// (about 100 G MAC/s at 8 to 64 rows either way, one `vdpbf16ps` per cycle): from 4 rows the
/// tile waits on the products, not on the decoding.
const MR: usize = 8;

/// Rows that run over all of a call's panels before the next rows start: 64 rows of
/// activation pairs are 128 KiB at K = 1024.
const ROW_BLOCK: usize = 64;

/// Bytes of one step of a row's activation pairs: four pairs of bf16.
const STEP_BYTES: usize = 16;

/// Where the 16 bf16 of two steps go within their 32 bytes: per step, K values `j` and
/// `j + 4` side by side.
#[target_feature(enable = "avx512f")]
#[inline]
fn pair_order() -> __m256i {
    _mm256_set_epi16(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0)
}

/// Lays out `m` rows of `x` (K values of `w` each) as bf16 pairs in the order the tiles read
/// (see the module docs), K past its end as zeros, one row after another. For weights with zero
/// points, also writes each row's sums of its bf16 activations per scale group into `sums`, in
/// row-major `[m, n_groups]` order.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VL/BF16; `x` holds `m·K` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn fill(
    x: &[f32],
    m: usize,
    w: &PackedWna16,
    sums: &mut Vec<f32>,
    dst: &mut AlignedVec<u8>,
) -> Int4DotLayout {
    let k = w.k();
    let sums = w.zeros().map(|_| (w.group_size(), sums));
    let ks = k.div_ceil(K_STEP);
    let row_bytes = row_stride(ks * STEP_BYTES);
    dst.grow_to(m * row_bytes);
    for (row, out) in x
        .chunks_exact(k)
        .zip(dst.chunks_exact_mut(row_bytes))
        .take(m)
    {
        // Two steps (16 values, 32 bytes) at a time; the last may be one step. The padding
        // past the row's steps is never read.
        for (c, chunk) in out[..ks * STEP_BYTES]
            .chunks_mut(2 * STEP_BYTES)
            .enumerate()
        {
            let paired = pairs16(row, 16 * c);
            chunk.copy_from_slice(&paired[..chunk.len()]);
        }
    }
    if let Some((group, sums)) = sums {
        sums.clear();
        bf16_group_sums(x, m, k, group, sums);
    }
    Int4DotLayout {
        len: m * row_bytes,
        row_bytes,
    }
}

/// Values `lo..lo + 16` of `row` (zeros past its end) rounded to bf16 and laid out as the two
/// steps' pairs: 32 bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) fn pairs16(row: &[f32], lo: usize) -> [u8; 32] {
    let n = row.len().saturating_sub(lo).min(16);
    let keep: __mmask16 = if n == 16 { !0 } else { (1 << n) - 1 };
    // SAFETY: the masked load reads only the `n` values `row[lo..lo + n]`.
    let v = unsafe { _mm512_maskz_loadu_ps(keep, row.as_ptr().wrapping_add(lo)) };
    let h = _mm512_cvtneps_pbh(v);
    // SAFETY: a bf16 vector reinterpreted as its 16-bit patterns.
    let h = unsafe { std::mem::transmute::<__m256bh, __m256i>(h) };
    let paired = _mm256_permutexvar_epi16(pair_order(), h);
    let mut bytes = [0u8; 32];
    // SAFETY: `bytes` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), paired) };
    bytes
}

/// Appends the sums of the `m` rows of `x` (`k` values each), rounded to bf16, per group of
/// `group` K values, in row-major `[m, ceil(k / group)]` order: what a body subtracts times the
/// zero point. The sums are made from the f32 rows, not from a body's layout, so every body
/// that rounds its activations to bf16 shares them.
///
/// The order of the additions is fixed (tests model it): lane `i` of 16 f32 lanes adds the
/// group's values `i`, `i + 16`, … in ascending order, starting from zero, and the lanes are
/// then folded by halves (lane `i` plus lane `i + 8` for `i < 8`, then `i + 4`, `i + 2`,
/// `i + 1`). A single chain over the group, one add after the other, made this a tenth of a
/// layer's time on asymmetric checkpoints at a few hundred tokens.
///
/// # Panics
/// If `x` holds fewer than `m·k` values or `group` is zero.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) fn bf16_group_sums(x: &[f32], m: usize, k: usize, group: usize, sums: &mut Vec<f32>) {
    assert!(group > 0, "a scale group holds at least one K value");
    for row in x[..m * k].chunks_exact(k) {
        for values in row.chunks(group) {
            let mut lanes = _mm512_setzero_ps();
            for part in values.chunks(16) {
                let keep: __mmask16 = if part.len() == 16 {
                    !0
                } else {
                    (1 << part.len()) - 1
                };
                // SAFETY: the masked load reads only the `part.len()` values of `part`.
                let v = unsafe { _mm512_maskz_loadu_ps(keep, part.as_ptr()) };
                let rounded = _mm512_cvtneps_pbh(v);
                // SAFETY: a bf16 vector reinterpreted as its 16-bit patterns.
                let bits = unsafe { std::mem::transmute::<__m256bh, __m256i>(rounded) };
                let widened = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits));
                lanes = _mm512_mask_add_ps(lanes, keep, lanes, _mm512_castsi512_ps(widened));
            }
            let mut lane = [0f32; 16];
            // SAFETY: 16 writable f32; unaligned store.
            unsafe { _mm512_storeu_ps(lane.as_mut_ptr(), lanes) };
            sums.push(fold_lanes_by_halves(lane));
        }
    }
}

/// The lane fold of [`bf16_group_sums`]: lane `i` plus lane `i + 8`, then `i + 4`, `i + 2`
/// and `i + 1`.
fn fold_lanes_by_halves(mut lane: [f32; 16]) -> f32 {
    for half in [8, 4, 2, 1] {
        for i in 0..half {
            lane[i] += lane[i + half];
        }
    }
    lane[0]
}

/// A `vpermw` table: the 16 code values twice, as bf16 bits (all exact in bf16).
const fn table_of(values: [f32; 16]) -> [u16; 32] {
    let mut table = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        table[i] = bf16::from_f32_const(values[i % 16]).to_bits();
        i += 1;
    }
    table
}

/// Symmetric integer codes: `c − 8`.
const TABLE_SYM: [u16; 32] = table_of(LUT_SYM);
/// Integer codes with zero points: `c` (the zero point is taken off per group).
const TABLE_RAW: [u16; 32] = table_of(LUT_RAW);
/// MXFP4 codes: the e2m1 values.
const TABLE_E2M1: [u16; 32] = table_of(E2M1_VALUES);

/// The table of a matrix's code values.
pub(crate) fn table(w: &PackedWna16) -> &'static [u16; 32] {
    match (w.values(), w.zeros()) {
        (Int4Values::E2m1, _) => &TABLE_E2M1,
        (Int4Values::Integer, Some(_)) => &TABLE_RAW,
        (Int4Values::Integer, None) => &TABLE_SYM,
    }
}

/// Broadcasts activation pair `j` of a step to all 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast_pair(step: &[u8; STEP_BYTES], j: usize) -> __m512bh {
    let bits = i32::from_le_bytes([
        step[4 * j],
        step[4 * j + 1],
        step[4 * j + 2],
        step[4 * j + 3],
    ]);
    let v = _mm512_set1_epi32(bits);
    // SAFETY: a plain 512-bit vector reinterpreted as 32 bf16 bit patterns.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Rows `m0..m0 + R` of panel `p` (see the module docs), `C` partial-sum chains per row.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/BF16; the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s
///   contract for panel `p`, and `m0 + R ≤ job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile<const R: usize, const C: usize, const ASYM: bool>(
    job: &Int4DotJob<'_>,
    p: usize,
    m0: usize,
) {
    let w = job.w;
    let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
    let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
    let rows: [&[[u8; STEP_BYTES]]; R] = std::array::from_fn(|r| {
        job.pairs[(m0 + r) * job.row_bytes..][..job.row_bytes]
            .as_chunks()
            .0
    });
    let lut_bits = table(w);
    // SAFETY: 64 readable bytes; unaligned load.
    let lut = unsafe { _mm512_loadu_si512(lut_bits.as_ptr().cast()) };
    let zeros = w
        .zeros()
        .map(|z| z[p * ng * PANEL..][..ng * PANEL].as_chunks::<PANEL>().0);
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..ng {
        // Group sizes are multiples of K_STEP, so a group starts a step; the last one may end
        // inside one, whose activations past K are zeros.
        let (s0, s1) = (g * gs / K_STEP, k.min((g + 1) * gs).div_ceil(K_STEP));
        let mut part = [[_mm512_setzero_ps(); R]; C];
        for s in s0..s1 {
            prefetch_ahead_into_l2(&steps[s]);
            let v = load_step(&steps[s]);
            let xs: [&[u8; STEP_BYTES]; R] = std::array::from_fn(|r| &rows[r][s]);
            macro_rules! pair {
                ($j:literal) => {{
                    let idx = if $j == 0 {
                        v
                    } else {
                        _mm512_srli_epi16::<{ 4 * $j }>(v)
                    };
                    let wj = _mm512_permutexvar_epi16(idx, lut);
                    // SAFETY: 32 bf16 bit patterns reinterpreted as such.
                    let wj = unsafe { std::mem::transmute::<__m512i, __m512bh>(wj) };
                    for r in 0..R {
                        let x = broadcast_pair(xs[r], $j);
                        part[$j % C][r] = _mm512_dpbf16_ps(part[$j % C][r], wj, x);
                    }
                }};
            }
            pair!(0);
            pair!(1);
            pair!(2);
            pair!(3);
        }
        let scale = group_scales(w.scales(), (p * ng + g) * PANEL);
        let zero = match zeros {
            Some(z) if ASYM => load_zeros(&z[g]),
            _ => _mm512_setzero_ps(),
        };
        for r in 0..R {
            let mut sum = part[0][r];
            for chain in &part[1..] {
                sum = _mm512_add_ps(sum, chain[r]);
            }
            if ASYM {
                let xsum = _mm512_set1_ps(job.group_sums[(m0 + r) * ng + g]);
                sum = _mm512_fnmadd_ps(zero, xsum, sum);
            }
            acc[r] = _mm512_fmadd_ps(sum, scale, acc[r]);
        }
    }
    // SAFETY: rows `m0..m0 + R` of panel `p` are ours to write (our contract).
    unsafe { store_panel_rows(w, job.out, p, m0, acc) };
}

/// This body as a kernel set's int4 dot-product body, from `min_m` rows, for every int4 GEMM.
pub(crate) fn body(min_m: usize) -> Int4Dot {
    Int4Dot {
        unit: "avx512-bf16 dot products on codes decoded in registers",
        activations: "bf16 activations",
        codes: "",
        min_m,
        max_m: usize::MAX,
        int8: false,
        e4m3: false,
        serves: |_, _| true,
        fill,
        entry,
    }
}

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]).
fn tile_fn<const ASYM: bool>(rows: usize) -> Int4DotTileFn {
    match rows {
        1 => tile::<1, 4, ASYM>,
        2 => tile::<2, 4, ASYM>,
        3 => tile::<3, 2, ASYM>,
        4 => tile::<4, 2, ASYM>,
        5 => tile::<5, 2, ASYM>,
        6 => tile::<6, 2, ASYM>,
        7 => tile::<7, 2, ASYM>,
        _ => tile::<MR, 2, ASYM>,
    }
}

/// The entry (see [`crate::wna16::Int4DotPanelsFn`]): rows in blocks of [`ROW_BLOCK`], each
/// block over `panels`, each panel in row tiles of up to [`MR`].
///
/// # Safety
/// - As [`crate::wna16::Int4DotPanelsFn`], on a CPU with AVX-512 F/BW/BF16.
pub(crate) unsafe fn entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    let tiles = [tile_fn::<false>, tile_fn::<true>];
    // SAFETY: every instance is a tile of this module, which needs the features the caller
    // vouches for, on rows and panels of the caller's.
    unsafe { run_row_blocks(job, panels, ROW_BLOCK, MR, tiles) };
}

#[cfg(test)]
pub(crate) mod tests {
    use half::bf16;
    use moe_testutil::SplitMix64;

    use super::{K_STEP, STEP_BYTES};
    use crate::{GemmScratch, Mxfp4Desc, PackedWna16, Par, Wna16Desc, Wna16Scales};

    /// The AVX-512 set with this body from one row, where the CPU has AVX-512 BF16.
    fn dot_set() -> Option<crate::KernelSet> {
        let ks = crate::x86::bf16_dot_kernel_set();
        if ks.is_none() {
            eprintln!("note: skipping the int4 bf16 dot-product body: no AVX-512 BF16");
        }
        ks
    }

    /// Every body with these numerics this CPU can run, from one row: this one and the AMX
    /// body on the exactly decoded codes (on the emulated unit, and on the hardware where
    /// present).
    fn dot_sets() -> Vec<(&'static str, crate::KernelSet)> {
        let mut sets: Vec<_> = dot_set()
            .map(|ks| ("avx512-bf16", ks))
            .into_iter()
            .collect();
        if let Some(ks) = crate::x86::amx::emulated::int4_kernel_set() {
            sets.push(("amx-bf16 on emulated tiles", ks));
        }
        if let Some(ks) = crate::x86::amx::hardware_int4_kernel_set() {
            sets.push(("amx-bf16 tiles", ks));
        }
        sets
    }

    /// Asserts that `got` (`m` rows of `w`'s outputs for activations `x`) lies within
    /// `1e-5·Σ|x·w|` of the f64 model of the bf16 bodies: `Σ bf16(x)·w` over the exactly
    /// dequantized weights `dq`, plus the bias (f32 sums in another order, and `vdpbf16ps` or
    /// the tile unit adding two products at once).
    pub(crate) fn assert_near_the_bf16_model(
        case: &str,
        (w, dq): (&PackedWna16, &[f64]),
        m: usize,
        x: &[f32],
        got: &[f32],
    ) {
        let (n, k) = (w.n(), w.k());
        for r in 0..m {
            for c in 0..n {
                let b = w.bias().map_or(0.0, |b| f64::from(b[c]));
                let (mut want, mut mag) = (b, b.abs());
                for col in 0..k {
                    let xv = f64::from(bf16::from_f32(x[r * k + col]).to_f32());
                    let t = xv * dq[c * k + col];
                    want += t;
                    mag += t.abs();
                }
                let got = f64::from(got[r * n + c]);
                assert!(
                    (got - want).abs() <= 1e-5 * mag + 1e-6,
                    "{case} m={m} n={n}: out[{r},{c}] = {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn fill_lays_out_bf16_pairs_and_group_sums() {
        if dot_set().is_none() {
            return;
        }
        let mut rng = SplitMix64::new(0xd07);
        for (m, k, group) in [
            (1usize, 8usize, 8usize),
            (0, 37, 37),
            (3, 37, 37),
            (2, 72, 16),
            (4, 45, 40),
            (2, 300, 128),
        ] {
            // Magnitudes over a wide range, so the sums round and their order shows.
            let x: Vec<f32> = (0..m * k)
                .map(|_| rng.uniform(-3.0, 3.0) * 2f32.powi(rng.range_i64(-12, 12) as i32))
                .collect();
            let (mut dst, mut sums) = (crate::aligned::AlignedVec::from(vec![0xAA; 3]), Vec::new());
            let w = crate::PackedWna16::int4_for_layout(k, group, true);
            // SAFETY: the set exists, so the CPU has AVX-512 F/BW/VL/BF16; `x` holds `m·k`.
            let layout = unsafe { super::fill(&x, m, &w, &mut sums, &mut dst) };
            let row_bytes = layout.row_bytes;
            assert_eq!(
                row_bytes,
                crate::wna16::row_stride(k.div_ceil(K_STEP) * STEP_BYTES)
            );
            assert_eq!(layout.len, m * row_bytes);
            for r in 0..m {
                for kk in 0..k.next_multiple_of(K_STEP) {
                    let (s, j) = (kk / K_STEP, kk % K_STEP);
                    let at = r * row_bytes + s * STEP_BYTES + 4 * (j % 4) + 2 * (j / 4);
                    let got = u16::from_le_bytes([dst[at], dst[at + 1]]);
                    let want = if kk < k {
                        bf16::from_f32(x[r * k + kk]).to_bits()
                    } else {
                        0
                    };
                    assert_eq!(got, want, "m={m} k={k} row {r} K value {kk}");
                }
                for (g, got) in sums[r * k.div_ceil(group)..][..k.div_ceil(group)]
                    .iter()
                    .enumerate()
                {
                    let want = bf16_group_sum_model(&x[r * k..][g * group..k.min((g + 1) * group)]);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "m={m} k={k} row {r} group {g}"
                    );
                }
            }
        }
    }

    /// The sum [`super::bf16_group_sums`] makes of one group's values, one addition at a time:
    /// 16 lanes over the values in turn, then folded by halves.
    fn bf16_group_sum_model(values: &[f32]) -> f32 {
        let mut lane = [0f32; 16];
        for (i, &v) in values.iter().enumerate() {
            lane[i % 16] += bf16::from_f32(v).to_f32();
        }
        super::fold_lanes_by_halves(lane)
    }

    /// Every int4 kind (symmetric, with zero points, MXFP4) on ragged shapes against the f64
    /// model of the body: `Σ bf16(x)·w` over the exactly dequantized weights, within
    /// `1e-5·Σ|x·w|` (f32 sums in another order, and `vdpbf16ps` adding two products at once).
    #[test]
    fn int4_dot_body_matches_the_f64_model_on_ragged_shapes() {
        let sets = dot_sets();
        let mut rng = SplitMix64::new(0xd08);
        // (K, group size or channelwise, zero points, MXFP4); the AMX body walks K = 300 in
        // groups of 32 as three spans of groups, the last one partial.
        let cases: [(usize, Option<usize>, bool, bool); 8] = [
            (8, None, false, false),
            (37, None, true, false),
            (64, Some(32), false, true),
            (72, Some(32), false, false),
            (100, Some(32), false, true),
            (256, Some(128), true, false),
            (200, Some(64), true, false),
            (300, Some(32), true, false),
        ];
        for &(k, g, asym, mx) in &cases {
            for &n in &[1usize, 17, 33] {
                let groups = g.map_or(1, |g| k.div_ceil(g));
                let codes: Vec<u8> = (0..n * k).map(|_| rng.below(16) as u8).collect();
                let scales: Vec<bf16> = (0..n * groups)
                    .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                    .collect();
                let zeros: Vec<u8> = (0..n * groups).map(|_| rng.below(16) as u8).collect();
                let bias = rng.vec_uniform(n, -1.0, 1.0);
                let nb = k.div_ceil(32);
                let blocks: Vec<u8> = (0..n * nb * 16).map(|_| rng.below(256) as u8).collect();
                let e8m0: Vec<u8> = (0..n * nb).map(|_| 118 + rng.below(12) as u8).collect();
                let w = if mx {
                    PackedWna16::pack_mxfp4(Mxfp4Desc {
                        n,
                        k,
                        blocks: &blocks,
                        scales: &e8m0,
                        bias: None,
                    })
                } else {
                    PackedWna16::pack(Wna16Desc {
                        n,
                        k,
                        bits: 4,
                        codes: &codes,
                        group_size: moe_quant::WeightGroups::from_group_size(g).unwrap(),
                        scales: Wna16Scales::Bf16(&scales),
                        zeros: asym.then_some(&zeros[..]),
                        bias: Some(&bias),
                        perm: None,
                    })
                }
                .unwrap();
                let dq = w.dequantize_f64();
                for &m in &[0usize, 1, 2, 3, 5, 8, 9, 16, 64, 65, 130] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                    for ((unit, ks), par) in
                        sets.iter().flat_map(|s| [(s, Par::Seq), (s, Par::Rayon)])
                    {
                        if ks.wna16_int4_dot_for(&w, m).is_none() && m > 0 {
                            continue;
                        }
                        let mut got = vec![f32::NAN; m * n];
                        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), par)
                            .unwrap();
                        let case = format!("{unit}: k={k} g={g:?} asym={asym} mxfp4={mx} {par:?}");
                        assert_near_the_bf16_model(&case, (&w, &dq), m, &x, &got);
                    }
                }
            }
        }
    }

    /// The AMX body walked over K in blocks of scale groups (each pair's row sums kept between
    /// blocks) gives the bits of one walk over all of K: symmetric codes, zero points, MXFP4, a
    /// partial last group, row groups of one and two tiles.
    #[test]
    fn int4_tiles_walked_in_k_blocks_give_the_bits_of_one_walk() {
        use crate::x86::amx::budget_changing_bits;
        let mut rng = SplitMix64::new(0xd0b);
        // (K, group size, zero points, MXFP4)
        for (k, g, asym, mx) in [
            (544usize, 32usize, false, false),
            (640, 64, true, false),
            (300, 32, true, false),
            (320, 32, false, true),
        ] {
            let n = 33;
            let groups = k.div_ceil(g);
            let codes: Vec<u8> = (0..n * k).map(|_| rng.below(16) as u8).collect();
            let scales: Vec<bf16> = (0..n * groups)
                .map(|_| bf16::from_f32(rng.uniform(0.01, 0.1)))
                .collect();
            let zeros: Vec<u8> = (0..n * groups).map(|_| rng.below(16) as u8).collect();
            let blocks: Vec<u8> = (0..n * groups * 16).map(|_| rng.below(256) as u8).collect();
            let e8m0: Vec<u8> = (0..n * groups).map(|_| 118 + rng.below(12) as u8).collect();
            let bias = rng.vec_uniform(n, -1.0, 1.0);
            let w = if mx {
                PackedWna16::pack_mxfp4(Mxfp4Desc {
                    n,
                    k,
                    blocks: &blocks,
                    scales: &e8m0,
                    bias: Some(&bias),
                })
            } else {
                PackedWna16::pack(Wna16Desc {
                    n,
                    k,
                    bits: 4,
                    codes: &codes,
                    group_size: moe_quant::WeightGroups::from_group_size(Some(g)).unwrap(),
                    scales: Wna16Scales::Bf16(&scales),
                    zeros: asym.then_some(&zeros[..]),
                    bias: Some(&bias),
                    perm: None,
                })
            }
            .unwrap();
            for m in [0usize, 1, 9, 17, 32] {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
                let per_group = m.next_multiple_of(16) * 64 * (g / 32);
                for (unit, ks) in dot_sets().iter().filter(|(u, _)| u.starts_with("amx")) {
                    if ks.wna16_int4_dot_for(&w, m).is_none() {
                        continue;
                    }
                    let run = |out: &mut [f32]| {
                        crate::wna16_gemm(ks, m, &x, &w, out, &mut GemmScratch::new(), Par::Seq)
                            .unwrap()
                    };
                    let budgets = [1, 2, 3].map(|groups| groups * per_group);
                    let changed = budget_changing_bits(m * n, budgets, run);
                    assert_eq!(
                        changed, None,
                        "{unit}: k={k} g={g} asym={asym} mxfp4={mx} m={m}: the budget that \
                         changed bits"
                    );
                }
            }
        }
    }

    /// A row holding a NaN gives NaN outputs, and the other rows are untouched by it.
    #[test]
    fn int4_dot_body_keeps_nan_rows_nan() {
        for (unit, ks) in dot_sets() {
            nan_rows_stay_nan(unit, &ks);
        }
    }

    fn nan_rows_stay_nan(unit: &str, ks: &crate::KernelSet) {
        let mut rng = SplitMix64::new(0xd09);
        let (n, k, m) = (20usize, 96usize, 5usize);
        let codes: Vec<u8> = (0..n * k).map(|_| rng.below(16) as u8).collect();
        let scales: Vec<bf16> = (0..n * 3).map(|_| bf16::from_f32(0.05)).collect();
        let w = PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits: 4,
            codes: &codes,
            group_size: moe_quant::WeightGroups::from_group_size(Some(32)).unwrap(),
            scales: Wna16Scales::Bf16(&scales),
            zeros: None,
            bias: None,
            perm: None,
        })
        .unwrap();
        assert!(ks.wna16_int4_dot_for(&w, m).is_some(), "{unit}");
        let mut x = rng.vec_uniform(m * k, -1.0, 1.0);
        x[2 * k + 50] = f32::NAN;
        let mut got = vec![0f32; m * n];
        crate::wna16_gemm(ks, m, &x, &w, &mut got, &mut GemmScratch::new(), Par::Seq).unwrap();
        for (r, row) in got.chunks_exact(n).enumerate() {
            assert_eq!(
                row.iter().all(|v| v.is_nan()),
                r == 2,
                "{unit}: row {r}: {row:?}"
            );
            assert!(
                r == 2 || row.iter().all(|v| v.is_finite()),
                "{unit}: row {r}"
            );
        }
    }
}
