//! In-crate tests that need the private kernel hooks: every available rung against the scalar
//! reference, exactly at the integer block-accumulator level and bit for bit on the f32
//! outputs (all rungs use the reference epilogue order), over ragged shapes.

use half::bf16;
use moe_testutil::{SplitMix64, proptest_cases};

use crate::gemm::w4a8_block_acc;
use crate::scalar::w4a8::{W4A8RefArgs, w4a8_reference, w4a8_reference_block_acc};
use crate::scalar::w8a8::{W8A8RefArgs, w8a8_reference};
use crate::{
    AsymQuantRows, GemmScratch, Isa, KernelSet, PackedW4A8, PackedW8A8, PanelOrder, Par,
    SymQuantRows, W4A8Scales, available_isas, packed::PANEL,
};
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};

/// (K, group size) pairs: K a multiple of the group but not of every register block, K long
/// enough that the tile bodies walk it in several spans, plus channelwise K that are not
/// multiples of 8.
const W4A8_KG: &[(usize, Option<usize>)] = &[
    (32, Some(32)),
    (96, Some(32)),
    (160, Some(32)),
    (192, Some(64)),
    (384, Some(128)),
    (544, Some(32)),
    (640, Some(64)),
    (128, Some(128)),
    (2, None),
    (64, None),
    (70, None),
    (254, None),
];
/// Row counts: none, one and a few, around the 4-, 8- and 16-row tiles, and calls of several
/// tiles with ragged last ones.
const MS: &[usize] = &[0, 1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33, 70];
const NS: &[usize] = &[1, 2, 15, 16, 17, 31, 33, 47, 65, 100];

/// Every rung this machine can run, each through its own token, with a note for the others.
/// Also runs test-only twins of rungs this CPU lacks (see `x86/avxvnni.rs`).
fn rungs() -> Vec<(String, KernelSet)> {
    let available = available_isas();
    for isa in Isa::native_ladder() {
        if !available.contains(&isa) {
            eprintln!("note: skipping rung {isa}: not supported by this CPU");
        }
    }
    let mut rungs: Vec<(String, KernelSet)> = available
        .into_iter()
        .map(|isa| {
            (
                isa.to_string(),
                KernelSet::for_isa(isa).expect("listed as available"),
            )
        })
        .collect();
    for (name, ks) in crate::arch::test_only_kernel_sets() {
        rungs.push((name.to_string(), ks));
    }
    rungs
}

struct W4A8Case {
    m: usize,
    n: usize,
    k: usize,
    block_len: usize,
    q: Vec<i8>,
    zp: Vec<i32>,
    recip: Vec<f32>,
    w: Vec<i8>,
    scales_f32: Vec<f32>,
    bias: Option<Vec<f32>>,
    packed: PackedW4A8,
}

fn w4a8_case(rng: &mut SplitMix64, m: usize, n: usize, k: usize, g: Option<usize>) -> W4A8Case {
    let x: Vec<f32> = (0..m * k)
        .map(|_| rng.normal() * 3.0 + rng.uniform(-0.5, 0.5))
        .collect();
    w4a8_case_of(rng, &x, n, k, g)
}

/// A case whose activation rows are `x` (`m·k` values); weights, scales and bias from `rng`.
fn w4a8_case_of(rng: &mut SplitMix64, x: &[f32], n: usize, k: usize, g: Option<usize>) -> W4A8Case {
    let m = x.len() / k;
    let mut q = vec![0i8; m * k];
    let (mut zp, mut recip) = (Vec::new(), Vec::new());
    for (row, q_row) in x.chunks_exact(k).zip(q.chunks_exact_mut(k)) {
        let r = quantize_row_asym_i8(row, q_row);
        zp.push(r.zero_point);
        recip.push(r.recip);
    }
    let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
    let bias = (rng.below(2) == 0).then(|| rng.vec_uniform(n, -2.0, 2.0));
    let (packed, block_len, scales_f32) = match g {
        None => {
            let s = rng.vec_uniform(n, 0.001, 0.1);
            let p = PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&s), bias.as_deref());
            (p.unwrap(), k, s)
        }
        Some(g) => {
            let s: Vec<bf16> = (0..n * k / g)
                .map(|_| bf16::from_f32(rng.uniform(0.001, 0.1)))
                .collect();
            let scales = W4A8Scales::Grouped {
                group_size: g,
                scales: &s,
            };
            let p = PackedW4A8::pack(n, k, &w, scales, bias.as_deref()).unwrap();
            (p, g, s.iter().map(|v| v.to_f32()).collect())
        }
    };
    W4A8Case {
        m,
        n,
        k,
        block_len,
        q,
        zp,
        recip,
        w,
        scales_f32,
        bias,
        packed,
    }
}

impl W4A8Case {
    fn reference_args(&self) -> W4A8RefArgs<'_> {
        W4A8RefArgs {
            m: self.m,
            n: self.n,
            k: self.k,
            q: &self.q,
            zero_point: &self.zp,
            recip: &self.recip,
            w: &self.w,
            block_len: self.block_len,
            scales: &self.scales_f32,
            bias: self.bias.as_deref(),
        }
    }

    fn rows(&self) -> AsymQuantRows<'_> {
        AsymQuantRows {
            q: &self.q,
            zero_point: &self.zp,
            recip: &self.recip,
        }
    }
}

/// The panel orders a rung is checked on: the lane order everywhere, and the pair order too
/// where the rung asks for it or reads every order (the portable body); the other rungs hand
/// pair-order panels to the portable body (`pairs_order_on_every_rung`).
fn orders(ks: &KernelSet) -> Vec<PanelOrder> {
    if ks.panel_order() == PanelOrder::Pairs || ks.isa() == Isa::Scalar {
        vec![PanelOrder::Lanes, PanelOrder::Pairs]
    } else {
        vec![PanelOrder::Lanes]
    }
}

fn check_w4a8(isa: &str, ks: &KernelSet, c: &W4A8Case, par: Par) -> Result<(), String> {
    for order in orders(ks) {
        let packed = c.packed.clone().with_order(order);
        check_w4a8_packed(&format!("{isa} {order:?}"), ks, c, &packed, par)?;
    }
    Ok(())
}

/// [`check_w4a8`] on the case's weights packed as `packed`.
fn check_w4a8_packed(
    isa: &str,
    ks: &KernelSet,
    c: &W4A8Case,
    packed: &PackedW4A8,
    par: Par,
) -> Result<(), String> {
    let what = format!("{isa} m={} n={} k={} bl={}", c.m, c.n, c.k, c.block_len);
    // (a) Integer block accumulators, exactly.
    let want_acc = w4a8_reference_block_acc(&c.reference_args());
    let got_acc = w4a8_block_acc(ks, c.m, c.rows(), packed).map_err(|e| e.to_string())?;
    let nb = c.k / c.block_len;
    let n_pad = packed.n_panels() * PANEL;
    for m in 0..c.m {
        for n in 0..c.n {
            for b in 0..nb {
                let want = want_acc[(m * c.n + n) * nb + b];
                let got = got_acc[(m * nb + b) * n_pad + n];
                if want != got {
                    return Err(format!("{what}: acc[{m},{n},{b}] = {got}, want {want}"));
                }
            }
        }
    }
    // (b) f32 outputs, bit for bit (same epilogue order).
    let want = w4a8_reference(&c.reference_args());
    let mut got = vec![f32::NAN; c.m * c.n];
    let mut scratch = GemmScratch::new();
    crate::w4a8_gemm_quantized(ks, c.m, c.rows(), packed, &mut got, &mut scratch, par)
        .map_err(|e| e.to_string())?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.to_bits() != w.to_bits() {
            return Err(format!("{what}: out[{i}] = {g:e}, want {w:e}"));
        }
    }
    Ok(())
}

#[test]
fn w4a8_every_rung_matches_reference_on_ragged_shapes() {
    let mut rng = SplitMix64::new(0x4a8);
    let rungs = rungs();
    let mut failures = Vec::new();
    for &(k, g) in W4A8_KG {
        for &m in MS {
            for &n in NS {
                let case = w4a8_case(&mut rng, m, n, k, g);
                for (isa, ks) in &rungs {
                    if let Err(e) = check_w4a8(isa, ks, &case, Par::Seq) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// Rows whose codes sit at the far ends of the zero point (`|q − zp| = 255` on every value:
/// all-positive rows get `zp = −128` and codes near 127, all-negative rows the mirror) put
/// the block corrections at their largest, the edge of the narrow forms some kernels pack
/// them in (see the AVX-512 VNNI tile); blocks of 32 (whose correction the AMX tiles carry in
/// one unsigned byte per row), blocks of 128 and channelwise blocks on both sides of the 16-bit
/// limits.
#[test]
fn w4a8_block_corrections_at_their_extremes() {
    let mut rng = SplitMix64::new(0xe47);
    let rungs = rungs();
    for &(k, g) in &[
        (96, Some(32)),
        (32, None),
        (128, Some(128)),
        (256, Some(128)),
        (128, None),
        (136, None),
        (2304, None),
        (4096, Some(32)),
        (4096, None),
    ] {
        for m in [1usize, 4, 9] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| {
                    let v = 50.0 + rng.uniform(0.0, 1e-3);
                    if (i / k) % 2 == 0 { v } else { -v }
                })
                .collect();
            let case = w4a8_case_of(&mut rng, &x, 33, k, g);
            let extreme = case
                .q
                .chunks_exact(k)
                .zip(&case.zp)
                .all(|(row, &zp)| row.iter().all(|&q| (i32::from(q) - zp).abs() >= 254));
            assert!(
                extreme,
                "the rows do not reach the extremes: zp {:?}",
                case.zp
            );
            for (isa, ks) in &rungs {
                check_w4a8(isa, ks, &case, Par::Seq).unwrap();
            }
        }
    }
}

/// Calls of a few rows on long K, which some rungs run as one row tile over pairs of panels
/// (see the AVX-512 VNNI tile): every block correction (groups of 32 and 128, of 1024, and
/// channelwise), one to three panels with a lone last one, ragged N.
#[test]
fn w4a8_few_rows_on_long_k_match_reference() {
    let mut rng = SplitMix64::new(0x4a82);
    let rungs = rungs();
    for (k, g) in [
        (4096, Some(32)),
        (4224, Some(128)),
        (4096, Some(1024)),
        (4096, None),
    ] {
        for m in 1..=5 {
            for n in [1, 17, 33, 47] {
                let case = w4a8_case(&mut rng, m, n, k, g);
                for (isa, ks) in &rungs {
                    check_w4a8(isa, ks, &case, Par::Seq).unwrap();
                }
            }
        }
    }
}

#[test]
fn w4a8_random_shapes_any_thread_count() {
    let mut rng = SplitMix64::new(0xfeed);
    let rungs = rungs();
    for _ in 0..proptest_cases(24) {
        let g = [None, Some(32), Some(64), Some(128)][rng.below(4)];
        let k = match g {
            None => 2 * (1 + rng.below(300)),
            Some(g) => g * (1 + rng.below(6)),
        };
        let (m, n) = (rng.below(40), 1 + rng.below(100));
        let case = w4a8_case(&mut rng, m, n, k, g);
        for (isa, ks) in &rungs {
            check_w4a8(isa, ks, &case, Par::Rayon).unwrap();
        }
    }
}

/// Pair-order panels on every rung, those without a body for them included (they hand the
/// call to the portable body): the same outputs as the reference.
#[test]
fn pairs_order_on_every_rung() {
    let mut rng = SplitMix64::new(0x9a1);
    let rungs = rungs();
    // Every tile height, odd and even (an odd one counts its code sums on its padding row, an
    // even one on a row pair of its own), on blocks of 32 and 64 and on channelwise blocks with
    // an odd last step (K = 70 pads to 9 steps).
    for &(n, k, g) in &[(17, 64, Some(32)), (33, 70, None), (16, 128, Some(64))] {
        for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 33] {
            let case = w4a8_case(&mut rng, m, n, k, g);
            let pairs = case.packed.clone().with_order(PanelOrder::Pairs);
            for (isa, ks) in &rungs {
                check_w4a8_packed(isa, ks, &case, &pairs, Par::Seq).unwrap();
            }
        }
    }
    for &(m, n, k) in &[(1, 17, 36), (6, 33, 64), (16, 16, 100)] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
        let mut q = vec![0i8; m * k];
        let scale: Vec<f32> = x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(k))
            .map(|(row, q_row)| quantize_row_sym_i8(row, q_row))
            .collect();
        let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-128, 127) as i8).collect();
        let ws = rng.vec_uniform(n, 0.001, 0.02);
        let packed = PackedW8A8::pack(n, k, &w, &ws)
            .unwrap()
            .with_order(PanelOrder::Pairs);
        let args = W8A8RefArgs {
            m,
            n,
            k,
            q: &q,
            row_scale: &scale,
            w: &w,
            scales: &ws,
        };
        let want = w8a8_reference(&args);
        for (isa, ks) in &rungs {
            let mut got = vec![f32::NAN; m * n];
            let rows = SymQuantRows {
                q: &q,
                scale: &scale,
            };
            let mut scratch = GemmScratch::new();
            crate::w8a8_gemm_quantized(ks, m, rows, &packed, &mut got, &mut scratch, Par::Seq)
                .unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{isa} w8a8 pairs m={m} n={n} k={k}");
        }
    }
}

#[test]
fn w8a8_every_rung_matches_reference() {
    let mut rng = SplitMix64::new(0x8a8);
    let rungs = rungs();
    for &k in &[1usize, 3, 4, 32, 33, 100, 256] {
        for &m in MS {
            for &n in NS {
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
                let mut q = vec![0i8; m * k];
                let scale: Vec<f32> = x
                    .chunks_exact(k)
                    .zip(q.chunks_exact_mut(k))
                    .map(|(row, q_row)| quantize_row_sym_i8(row, q_row))
                    .collect();
                let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-128, 127) as i8).collect();
                let ws = rng.vec_uniform(n, 0.001, 0.02);
                let packed = PackedW8A8::pack(n, k, &w, &ws).unwrap();
                let args = W8A8RefArgs {
                    m,
                    n,
                    k,
                    q: &q,
                    row_scale: &scale,
                    w: &w,
                    scales: &ws,
                };
                let want = w8a8_reference(&args);
                for (isa, ks) in &rungs {
                    for order in orders(ks) {
                        let packed = packed.clone().with_order(order);
                        let mut got = vec![f32::NAN; m * n];
                        let rows = SymQuantRows {
                            q: &q,
                            scale: &scale,
                        };
                        crate::w8a8_gemm_quantized(
                            ks,
                            m,
                            rows,
                            &packed,
                            &mut got,
                            &mut GemmScratch::new(),
                            Par::Rayon,
                        )
                        .unwrap();
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{isa} {order:?} m={m} n={n} k={k} out[{i}] = {g:e}, want {w:e}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Every product at its largest magnitude, with both signs: where narrow intermediate sums
/// (the NEON rung's i16 stages, `vpmaddubsw` on x86) would overflow first.
#[test]
fn extreme_codes_every_rung() {
    let (m, n) = (5, 17);
    let rungs = rungs();
    for (k, wv, qv) in [
        (64, -128i8, -127i8),
        (64, -128, 127),
        (68, 127, 127),
        (68, 127, -127),
    ] {
        let (q, w) = (vec![qv; m * k], vec![wv; n * k]);
        let (scale, ws) = (vec![0.01f32; m], vec![0.02f32; n]);
        let packed = PackedW8A8::pack(n, k, &w, &ws).unwrap();
        let args = W8A8RefArgs {
            m,
            n,
            k,
            q: &q,
            row_scale: &scale,
            w: &w,
            scales: &ws,
        };
        let want = w8a8_reference(&args);
        for (isa, ks) in &rungs {
            for order in orders(ks) {
                let packed = packed.clone().with_order(order);
                let mut got = vec![f32::NAN; m * n];
                let rows = SymQuantRows {
                    q: &q,
                    scale: &scale,
                };
                let mut scratch = GemmScratch::new();
                crate::w8a8_gemm_quantized(ks, m, rows, &packed, &mut got, &mut scratch, Par::Seq)
                    .unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{isa} {order:?} w8a8 w={wv} q={qv}: {got:?} != {want:?}"
                );
            }
        }
    }
    for (k, wv, qv, zp) in [
        (64, -8i8, -128i8, 127),
        (64, -8, 127, -128),
        (70, 7, -128, 0),
        // Channelwise blocks long enough that a channel's code sum no longer fits an i16
        // (15·K ≥ 2^15: the AVX-512 tile's 32-bit correction path).
        (2192, -8, -128, 127),
        (4096, 7, 127, -128),
        // Longer than the AMX tile's f32-exact block: its integer correction path.
        (8200, -8, -128, 127),
    ] {
        let w = vec![wv; n * k];
        let s = vec![0.05f32; n];
        let case = W4A8Case {
            m,
            n,
            k,
            block_len: k,
            q: vec![qv; m * k],
            zp: vec![zp; m],
            recip: vec![0.25; m],
            packed: PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&s), None).unwrap(),
            w,
            scales_f32: s,
            bias: None,
        };
        for (isa, ks) in &rungs {
            check_w4a8(isa, ks, &case, Par::Seq).unwrap();
        }
    }
}

#[test]
fn w4a8_edge_rows_all_zero_nan_and_inf() {
    let (n, k) = (17, 64);
    let mut rng = SplitMix64::new(9);
    let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
    let s: Vec<bf16> = (0..n * 2).map(|_| bf16::from_f32(0.05)).collect();
    let bias = rng.vec_uniform(n, -1.0, 1.0);
    let scales = W4A8Scales::Grouped {
        group_size: 32,
        scales: &s,
    };
    let packed = PackedW4A8::pack(n, k, &w, scales, Some(&bias)).unwrap();
    let mut x = rng.vec_uniform(4 * k, -1.0, 1.0);
    x[k..2 * k].fill(0.0); // row 1: all zero -> exactly the bias
    x[2 * k + 5] = f32::NAN; // row 2: NaN -> all-NaN row
    x[3 * k + 7] = f32::INFINITY; // row 3: infinite range -> treated as all zero
    for (isa, ks) in rungs() {
        let mut out = vec![0f32; 4 * n];
        crate::w4a8_gemm(
            &ks,
            4,
            &x,
            &packed,
            &mut out,
            &mut GemmScratch::new(),
            Par::Seq,
        )
        .unwrap();
        assert!(out[..n].iter().all(|v| v.is_finite()), "{isa}");
        assert_eq!(
            out[n..2 * n],
            bias[..],
            "{isa}: all-zero row must give the bias"
        );
        assert!(
            out[2 * n..3 * n].iter().all(|v| v.is_nan()),
            "{isa}: NaN row"
        );
        assert_eq!(
            out[3 * n..],
            bias[..],
            "{isa}: infinite row is treated as all zero"
        );
    }
}

#[test]
fn bad_gemm_arguments_are_typed_errors() {
    use crate::KernelError;
    let (n, k) = (3, 64);
    let packed = PackedW4A8::pack(
        n,
        k,
        &vec![0; n * k],
        W4A8Scales::Channelwise(&[1.0; 3]),
        None,
    )
    .unwrap();
    let ks = KernelSet::scalar();
    let mut scratch = GemmScratch::new();
    let mut out = vec![0f32; 2 * n];
    let err = crate::w4a8_gemm(
        &ks,
        2,
        &[0.0; 64],
        &packed,
        &mut out,
        &mut scratch,
        Par::Seq,
    );
    assert!(matches!(
        err,
        Err(KernelError::LengthMismatch { tensor: "x", .. })
    ));
    let err = crate::w4a8_gemm(
        &ks,
        2,
        &[0.0; 128],
        &packed,
        &mut out[..5],
        &mut scratch,
        Par::Seq,
    );
    assert!(matches!(
        err,
        Err(KernelError::LengthMismatch { tensor: "out", .. })
    ));
    let rows = AsymQuantRows {
        q: &[0; 128],
        zero_point: &[0, 200],
        recip: &[1.0; 2],
    };
    let err = crate::w4a8_gemm_quantized(&ks, 2, rows, &packed, &mut out, &mut scratch, Par::Seq);
    assert!(matches!(
        err,
        Err(KernelError::ValueOutOfRange {
            tensor: "zero_point",
            index: 1,
            ..
        })
    ));
    let rows = AsymQuantRows {
        q: &[0; 128],
        zero_point: &[0],
        recip: &[1.0; 2],
    };
    let err = crate::w4a8_gemm_quantized(&ks, 2, rows, &packed, &mut out, &mut scratch, Par::Seq);
    assert!(matches!(
        err,
        Err(KernelError::LengthMismatch {
            tensor: "zero_point",
            ..
        })
    ));
    let p8 = PackedW8A8::pack(n, k, &vec![1; n * k], &[1.0; 3]).unwrap();
    let mut q = vec![0i8; 128];
    q[70] = -128;
    let rows = SymQuantRows {
        q: &q,
        scale: &[1.0; 2],
    };
    let err = crate::w8a8_gemm_quantized(&ks, 2, rows, &p8, &mut out, &mut scratch, Par::Seq);
    assert!(matches!(
        err,
        Err(KernelError::ValueOutOfRange {
            tensor: "q",
            index: 70,
            ..
        })
    ));
    // M = 0 is valid and writes nothing.
    crate::w4a8_gemm(&ks, 0, &[], &packed, &mut [], &mut scratch, Par::Rayon).unwrap();
}

#[test]
fn w4a8_gemm_from_f32_equals_scalar_on_every_rung() {
    // Covers the fused SIMD quantise-and-encode path (row lengths with vector tails).
    let mut rng = SplitMix64::new(0xf32);
    let scalar = KernelSet::scalar();
    for &(k, g) in &[
        (2usize, None),
        (38, None),
        (64, Some(32)),
        (200, None),
        (320, Some(64)),
    ] {
        for &m in &[1usize, 3, 9] {
            let n = 1 + rng.below(40);
            let case = w4a8_case(&mut rng, m, n, k, g);
            let x: Vec<f32> = (0..m * k).map(|_| rng.normal() * 2.0).collect();
            let mut want = vec![0f32; m * n];
            crate::w4a8_gemm(
                &scalar,
                m,
                &x,
                &case.packed,
                &mut want,
                &mut GemmScratch::new(),
                Par::Seq,
            )
            .unwrap();
            for (isa, ks) in rungs() {
                let mut got = vec![f32::NAN; m * n];
                crate::w4a8_gemm(
                    &ks,
                    m,
                    &x,
                    &case.packed,
                    &mut got,
                    &mut GemmScratch::new(),
                    Par::Rayon,
                )
                .unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa} m={m} n={n} k={k}");
            }
        }
    }
}

#[test]
fn a_scratch_reused_after_a_larger_call_gives_the_same_bits() {
    // Kernels that lay the activations out in their own buffer reuse it without clearing it:
    // what a larger earlier call left there must not reach a smaller call's outputs.
    for (isa, ks) in &rungs() {
        let mut scratch = GemmScratch::new();
        let mut rng = SplitMix64::new(0x5c7a);
        for &(m, n, k, g) in &[
            (70, 33, 192, Some(64)),
            (17, 16, 96, Some(32)),
            (3, 5, 40, None),
        ] {
            let case = w4a8_case(&mut rng, m, n, k, g);
            let want = w4a8_reference(&case.reference_args());
            let mut got = vec![f32::NAN; m * n];
            crate::w4a8_gemm_quantized(
                ks,
                m,
                case.rows(),
                &case.packed,
                &mut got,
                &mut scratch,
                Par::Seq,
            )
            .unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa} m={m} n={n} k={k} g={g:?}");
        }
    }
}
