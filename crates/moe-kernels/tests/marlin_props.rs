//! Properties of the Marlin module over random shapes: the repack round trip, the executor
//! against a dequantised f64 reference, and typed errors (never panics) on bad input.
//!
//! Case counts come from `moe_testutil::proptest_cases` (`MOE_PROPTEST_CASES` raises them).

use half::{bf16, f16};
use moe_kernels::marlin::{
    ActDtype, MarlinError, MarlinWeights, MarlinWeightsDesc, RepackSpec, ScaleLayout, ScaleRule,
    ScaleValues, Wna16Config, Wna16Tensor, pack_gptq, permute_scales, process_wna16_moe,
    repack_experts, stable_argsort, unpack,
};
use moe_kernels::{GemmScratch, Par};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(moe_testutil::proptest_cases(64))
}

/// A random permutation of `0..k` from a seed (Fisher–Yates on SplitMix64).
fn permutation(k: usize, seed: u64) -> Vec<u32> {
    let mut rng = moe_testutil::SplitMix64::new(seed);
    let mut p: Vec<u32> = (0..k as u32).collect();
    for i in (1..k).rev() {
        p.swap(i, rng.below(i + 1));
    }
    p
}

/// Random GPTQ words for `e` experts of `[k, n]` codes.
fn random_words(e: usize, k: usize, n: usize, bits: u32, seed: u64) -> Vec<u32> {
    let mut rng = moe_testutil::SplitMix64::new(seed);
    (0..e * k * n * bits as usize / 32)
        .map(|_| rng.next_u64() as u32)
        .collect()
}

proptest! {
    #![proptest_config(config())]

    /// unpack(repack(w, perm), perm) == w for every layout, with and without act-order.
    #[test]
    fn repack_round_trip(
        bits in prop_oneof![Just(4u32), Just(8u32)],
        a8 in any::<bool>(),
        k_tiles in 1usize..6,
        n_tiles in 1usize..5,
        experts in 1usize..4,
        with_perm in any::<bool>(),
        seed in any::<u64>(),
        rayon in any::<bool>(),
    ) {
        let (k, n) = (k_tiles * if a8 { 32 } else { 16 }, n_tiles * 64);
        let pf = 32 / bits as usize;
        let q = random_words(experts, k, n, bits, seed);
        let perm: Vec<u32> = if with_perm && !a8 {
            (0..experts).flat_map(|e| permutation(k, seed ^ e as u64)).collect()
        } else {
            Vec::new()
        };
        let spec = RepackSpec { size_k: k, size_n: n, num_bits: bits, is_a_8bit: a8 };
        let mut marlin = vec![0u32; q.len()];
        let par = if rayon { Par::Rayon } else { Par::Seq };
        repack_experts(&q, [experts, k / pf, n], &perm, spec, &mut marlin, par).unwrap();
        let per = k * n / pf;
        for e in 0..experts {
            let p = if perm.is_empty() { &[][..] } else { &perm[e * k..(e + 1) * k] };
            let back = unpack(&marlin[e * per..(e + 1) * per], spec, p).unwrap();
            prop_assert_eq!(&back[..], &q[e * per..(e + 1) * per]);
        }
    }

    /// The executor on repacked weights equals the dequantised f64 reference GEMM (f32
    /// accumulation tolerance), for grouped and channelwise, with and without act-order, with f32
    /// and bf16 activations, sequential and parallel, and bit for bit the same in a reused
    /// scratch.
    #[test]
    fn executor_matches_dequantised_reference(
        bits in prop_oneof![Just(4u32), Just(8u32)],
        gs in prop_oneof![Just(None), Just(Some(32usize)), Just(Some(64)), Just(Some(128))],
        k_blocks in 1usize..4,
        n_tiles in 1usize..4,
        m in 0usize..6,
        act_order in any::<bool>(),
        bf16_x in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let k = 128 * k_blocks;
        let n = 64 * n_tiles;
        let pf = 32 / bits as usize;
        let mut rng = moe_testutil::SplitMix64::new(seed);
        let q = random_words(1, k, n, bits, seed);
        let groups = gs.map_or(1, |g| k / g);
        let scales: Vec<bf16> = (0..groups * n).map(|_| bf16::from_f32(rng.uniform(0.001, 0.02))).collect();
        // Act-order: a random assignment of rows to groups, each of exactly gs members.
        let g_idx: Vec<u32> = match gs {
            Some(g) if act_order => {
                let p = permutation(k, seed);
                p.iter().map(|&r| r / g as u32).collect()
            }
            _ => Vec::new(),
        };
        let (perm, sorted) = if g_idx.is_empty() { (Vec::new(), Vec::new()) } else { stable_argsort(&g_idx) };
        let spec = RepackSpec { size_k: k, size_n: n, num_bits: bits, is_a_8bit: false };
        let mut marlin = vec![0u32; q.len()];
        repack_experts(&q, [1, k / pf, n], &perm, spec, &mut marlin, Par::Seq).unwrap();
        let layout = ScaleLayout::for_kernel(groups, false);
        let permuted = permute_scales(&scales, n, layout).unwrap();
        let w = MarlinWeights::new(MarlinWeightsDesc {
            size_k: k, size_n: n, num_bits: bits, is_a_8bit: false, group_size: gs,
            qweight: &marlin, scales: ScaleValues::Bf16(&permuted), scale_layout: layout,
            sort_indices: &perm, g_idx_sorted: &sorted, fp8_preprocessed: false,
        }).unwrap();
        // Reference from the checkpoint side: codes, scales by g_idx (or k / gs).
        let bias = 1i32 << (bits - 1);
        let wref: Vec<f64> = (0..k * n).map(|i| {
            let (kk, nn) = (i / n, i % n);
            let code = (q[(kk / pf) * n + nn] >> (bits as usize * (kk % pf))) & ((1 << bits) - 1);
            let g = if g_idx.is_empty() { gs.map_or(0, |g| kk / g) } else { g_idx[kk] as usize };
            let v = (code as i32 - bias) as f32 * scales[g * n + nn].to_f32();
            if gs.is_some() { f64::from(bf16::from_f32(v).to_f32()) } else { f64::from(v) }
        }).collect();
        let x: Vec<f32> = (0..m * k).map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)).to_f32()).collect();
        let mut out = vec![f32::NAN; m * n];
        if bf16_x {
            let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            w.gemm(&xb, m, &mut out, Par::Rayon).unwrap();
        } else {
            w.gemm(&x, m, &mut out, Par::Seq).unwrap();
        }
        // A scratch that already served a larger call on other values gives the same bits,
        // on one thread or on the pool.
        let mut scratch = GemmScratch::new();
        let mut larger = vec![0f32; (m + 1) * n];
        let xl = rng.vec_uniform((m + 1) * k, -1.0, 1.0);
        w.gemm_with_scratch(&xl, m + 1, &mut larger, &mut scratch, Par::Seq).unwrap();
        let mut again = vec![f32::NAN; m * n];
        let par = if bf16_x { Par::Seq } else { Par::Rayon };
        w.gemm_with_scratch(&x, m, &mut again, &mut scratch, par).unwrap();
        prop_assert!(out.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()));
        for r in 0..m {
            for c in 0..n {
                let terms = (0..k).map(|kk| f64::from(x[r * k + kk]) * wref[kk * n + c]);
                let want: f64 = terms.clone().sum();
                let mag: f64 = terms.map(f64::abs).sum();
                let got = f64::from(out[r * n + c]);
                prop_assert!((got - want).abs() <= 1e-5 * mag + 1e-12, "[{r}][{c}] {got} vs {want}");
            }
        }
    }
}

fn spec(k: usize, n: usize, bits: u32, a8: bool) -> RepackSpec {
    RepackSpec {
        size_k: k,
        size_n: n,
        num_bits: bits,
        is_a_8bit: a8,
    }
}

fn repack_err(rows: usize, cols: usize, perm: &[u32], s: RepackSpec) -> MarlinError {
    let q = vec![0u32; rows * cols];
    let mut out = vec![0u32; q.len()];
    repack_experts(&q, [1, rows, cols], perm, s, &mut out, Par::Seq).unwrap_err()
}

#[test]
fn repack_refuses_bad_shapes_with_typed_errors() {
    assert_eq!(
        repack_err(5, 64, &[], spec(40, 64, 4, false)),
        MarlinError::SizeKNotMultiple {
            size_k: 40,
            tile: 16
        }
    );
    assert_eq!(
        repack_err(2, 96, &[], spec(16, 96, 4, false)),
        MarlinError::SizeNNotMultiple {
            size_n: 96,
            tile: 64
        }
    );
    assert_eq!(
        repack_err(2, 64, &[], spec(32, 64, 2, false)),
        MarlinError::UnsupportedBits { num_bits: 2 }
    );
    assert_eq!(
        repack_err(6, 64, &[], spec(48, 64, 4, true)),
        MarlinError::A8SizeKNotMultipleOf32 { size_k: 48 }
    );
    let dup: Vec<u32> = (0..32).map(|i| i.min(30)).collect();
    assert!(matches!(
        repack_err(4, 64, &dup, spec(32, 64, 4, false)),
        MarlinError::NotAPermutation {
            index: 31,
            value: 30,
            ..
        }
    ));
    let out_of_range: Vec<u32> = (0..32).map(|i| if i == 3 { 99 } else { i }).collect();
    assert!(matches!(
        repack_err(4, 64, &out_of_range, spec(32, 64, 4, false)),
        MarlinError::NotAPermutation {
            index: 3,
            value: 99,
            ..
        }
    ));
    // Wrong buffer lengths and an overflowing shape are errors, not panics.
    let mut out = vec![0u32; 3];
    let err = repack_experts(
        &[0; 128],
        [1, 2, 64],
        &[],
        spec(16, 64, 4, false),
        &mut out,
        Par::Seq,
    )
    .unwrap_err();
    assert_eq!(
        err,
        MarlinError::LengthMismatch {
            tensor: "out",
            expected: 128,
            got: 3
        }
    );
    let huge = usize::MAX / 8 * 8 - 63 * 8;
    let huge_k = huge / 16 * 16;
    let err = repack_experts(
        &[],
        [usize::MAX, huge_k / 8, 64],
        &[],
        spec(huge_k, 64, 4, false),
        &mut [],
        Par::Seq,
    )
    .unwrap_err();
    assert!(matches!(err, MarlinError::ShapeOverflow { .. }), "{err:?}");
}

/// A small valid layer (E = 1, H = 128, I = 64) in GPTQ layout with bf16 scales.
struct Layer {
    w13: Vec<u32>,
    w2: Vec<u32>,
    s13: Vec<bf16>,
    s2: Vec<bf16>,
}

fn layer(bits: u32, gs: Option<usize>) -> Layer {
    let (h, i) = (128, 64);
    let g = |k: usize| gs.map_or(1, |g| k / g);
    Layer {
        w13: random_words(1, h, 2 * i, bits, 1),
        w2: random_words(1, i, h, bits, 2),
        s13: vec![bf16::from_f32(0.01); g(h) * 2 * i],
        s2: vec![bf16::from_f32(0.01); g(i) * h],
    }
}

fn moe_config(bits: u32, gs: Option<usize>, input: ActDtype) -> Wna16Config {
    Wna16Config {
        num_experts: 1,
        hidden_size: 128,
        intermediate_size: 64,
        num_bits: bits,
        group_size: gs,
        act_order: false,
        input_dtype: input,
        scale_rule: ScaleRule::Kernel,
    }
}

fn tensor<'a>(q: &'a [u32], s: &'a [bf16], g_idx: &'a [u32]) -> Wna16Tensor<'a, bf16> {
    Wna16Tensor {
        qweight: q,
        scales: s,
        g_idx,
        sort_indices: None,
        bias: None,
    }
}

#[test]
fn post_processing_refuses_what_the_kernels_cannot_run() {
    let l = layer(8, Some(32));
    let run = |c: Wna16Config, l: &Layer, g13: &[u32]| {
        process_wna16_moe(
            &c,
            tensor(&l.w13, &l.s13, g13),
            tensor(&l.w2, &l.s2, &[]),
            Par::Seq,
        )
        .unwrap_err()
    };
    assert_eq!(
        run(moe_config(8, Some(32), ActDtype::Fp8), &l, &[]),
        MarlinError::Fp8NeedsInt4 { num_bits: 8 }
    );
    assert_eq!(
        run(moe_config(8, Some(32), ActDtype::Int8), &l, &[]),
        MarlinError::W8A8Unsupported { num_bits: 8 }
    );
    // Group size that does not divide K (I = 64 with g = 128), and one Marlin has no kernel for.
    let l4 = layer(4, Some(32));
    assert!(matches!(
        run(moe_config(4, Some(128), ActDtype::Bits16), &l4, &[]),
        MarlinError::InvalidGroupSize {
            tensor: "w2",
            group_size: 128,
            size_k: 64,
            ..
        }
    ));
    assert!(matches!(
        run(moe_config(4, Some(48), ActDtype::Bits16), &l4, &[]),
        MarlinError::InvalidGroupSize { group_size: 48, .. }
    ));
    // N not a multiple of 64 (I = 48 gives w13 N = 96).
    let c = Wna16Config {
        intermediate_size: 48,
        ..moe_config(4, None, ActDtype::Bits16)
    };
    assert!(matches!(
        run(c, &l4, &[]),
        MarlinError::SizeNNotMultiple { size_n: 96, .. } | MarlinError::SizeKNotMultiple { .. }
    ));
    // Act-order g_idx that is not a permutation of groups: group 0 gets 33 members.
    let mut g_idx: Vec<u32> = (0..128).map(|k| k / 32).collect();
    g_idx[40] = 0;
    let c = Wna16Config {
        act_order: true,
        ..moe_config(4, Some(32), ActDtype::Bits16)
    };
    assert_eq!(
        run(c, &l4, &g_idx),
        MarlinError::GIdxNotGroupPermutation {
            tensor: "w13_g_idx",
            expert: 0,
            group: 0,
            count: 33,
            expected: 32
        }
    );
    g_idx[40] = 7;
    assert!(matches!(
        run(c, &l4, &g_idx),
        MarlinError::GIdxNotGroupPermutation {
            group: 7,
            count: 0,
            ..
        }
    ));
    // Negative scales with INT8 activations.
    let mut neg = layer(4, Some(32));
    neg.s13[5] = bf16::from_f32(-0.01);
    let err = process_wna16_moe(
        &moe_config(4, Some(32), ActDtype::Int8),
        tensor(&neg.w13, &neg.s13, &[]),
        tensor(&neg.w2, &neg.s2, &[]),
        Par::Seq,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            MarlinError::NegativeScale {
                tensor: "w13_scales",
                ..
            }
        ),
        "{err:?}"
    );
    // A scale the FP8 ×512 would overflow in fp16.
    let f16_layer = layer(4, None);
    let mut s13: Vec<f16> = f16_layer
        .s13
        .iter()
        .map(|s| f16::from_f32(s.to_f32()))
        .collect();
    let s2: Vec<f16> = f16_layer
        .s2
        .iter()
        .map(|s| f16::from_f32(s.to_f32()))
        .collect();
    s13[0] = f16::from_f32(200.0);
    let err = process_wna16_moe(
        &moe_config(4, None, ActDtype::Fp8),
        Wna16Tensor {
            qweight: &f16_layer.w13,
            scales: &s13,
            g_idx: &[],
            sort_indices: None,
            bias: None,
        },
        Wna16Tensor {
            qweight: &f16_layer.w2,
            scales: &s2,
            g_idx: &[],
            sort_indices: None,
            bias: None,
        },
        Par::Seq,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            MarlinError::BadScale {
                tensor: "w13_scales",
                index: 0,
                ..
            }
        ),
        "{err:?}"
    );
    // Empty shapes are refused, not panicked on.
    let c = Wna16Config {
        intermediate_size: 0,
        act_order: true,
        ..moe_config(4, Some(32), ActDtype::Bits16)
    };
    assert!(matches!(run(c, &l4, &[]), MarlinError::Unsupported { .. }));
    // A correct layer goes through.
    process_wna16_moe(
        &moe_config(4, Some(32), ActDtype::Int8),
        tensor(&l4.w13, &l4.s13, &[]),
        tensor(&l4.w2, &l4.s2, &[]),
        Par::Seq,
    )
    .unwrap();
}

#[test]
fn executor_refuses_mismatched_shapes() {
    let q = pack_gptq(&vec![8u8; 128 * 64], 128, 64, 4).unwrap();
    let mut marlin = vec![0u32; q.len()];
    repack_experts(
        &q,
        [1, 16, 64],
        &[],
        spec(128, 64, 4, false),
        &mut marlin,
        Par::Seq,
    )
    .unwrap();
    let scales = vec![bf16::ONE; 4 * 64];
    let desc = MarlinWeightsDesc {
        size_k: 128,
        size_n: 64,
        num_bits: 4,
        is_a_8bit: false,
        group_size: Some(32),
        qweight: &marlin,
        scales: ScaleValues::Bf16(&scales),
        scale_layout: ScaleLayout::Grouped,
        sort_indices: &[],
        g_idx_sorted: &[],
        fp8_preprocessed: false,
    };
    let w = MarlinWeights::new(desc).unwrap();
    let mut out = vec![0f32; 2 * 64];
    assert_eq!(
        w.gemm(&[0f32; 100], 2, &mut out, Par::Seq).unwrap_err(),
        MarlinError::LengthMismatch {
            tensor: "x",
            expected: 256,
            got: 100
        }
    );
    assert_eq!(
        w.gemm(&[0f32; 256], 2, &mut out[..10], Par::Seq)
            .unwrap_err(),
        MarlinError::LengthMismatch {
            tensor: "out",
            expected: 128,
            got: 10
        }
    );
    assert!(matches!(
        w.gemm(&[0f32; 0], usize::MAX, &mut [], Par::Seq)
            .unwrap_err(),
        MarlinError::ShapeOverflow { .. }
    ));
    // Code 8 is zero: the product is exactly zero.
    w.gemm(&[1f32; 256], 2, &mut out, Par::Seq).unwrap();
    assert!(out.iter().all(|&v| v == 0.0));
    let bad = |d: MarlinWeightsDesc| MarlinWeights::new(d).unwrap_err();
    assert!(matches!(
        bad(MarlinWeightsDesc {
            group_size: Some(96),
            ..desc
        }),
        MarlinError::InvalidGroupSize { .. }
    ));
    assert!(matches!(
        bad(MarlinWeightsDesc {
            qweight: &marlin[1..],
            ..desc
        }),
        MarlinError::LengthMismatch {
            tensor: "qweight",
            ..
        }
    ));
    assert!(matches!(
        bad(MarlinWeightsDesc {
            num_bits: 8,
            fp8_preprocessed: true,
            ..desc
        }),
        MarlinError::LengthMismatch { .. } | MarlinError::Fp8NeedsInt4 { .. }
    ));
    assert!(matches!(
        bad(MarlinWeightsDesc {
            sort_indices: &[0; 128],
            ..desc
        }),
        MarlinError::NotAPermutation { .. }
    ));
    assert!(matches!(
        bad(MarlinWeightsDesc {
            g_idx_sorted: &[9; 128],
            ..desc
        }),
        MarlinError::GIdxNotGroupPermutation { .. }
    ));
}
