//! Unit tests of the fused pipeline: ragged routings against a naive per-token reference built
//! from the scalar reference GEMMs (bit for bit in f32), typed errors, NaN rows, thread-count
//! independence, and the no-allocation promise of `apply`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use half::bf16;
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};
use moe_testutil::SplitMix64;

use super::numerics::MoeFloat;
use super::*;
use crate::scalar::w4a8::{W4A8RefArgs, w4a8_reference};
use crate::scalar::w8a8::{W8A8RefArgs, w8a8_reference};
use crate::{
    KernelError, KernelSet, PackedDense, PackedW4A8, PackedW8A8, PackedWna16, Par, W4A8Scales,
    Wna16Desc, Wna16Scales, available_isas,
};

// ---------------------------------------------------------------------------------------------
// Test layers with their unpacked twins.

/// One expert matrix `[n, k]` kept unpacked for the reference.
#[derive(Clone)]
struct RefMat {
    n: usize,
    k: usize,
    w: Vec<i8>,
    /// f32 scales `[n, k / block_len]`.
    scales: Vec<f32>,
    block_len: usize,
    /// Float weights `[n, k]` of a dense matrix (empty for the quantized ones).
    dense: Vec<f32>,
}

impl RefMat {
    fn w4a8(rng: &mut SplitMix64, n: usize, k: usize, group: Option<usize>) -> (Self, PackedW4A8) {
        let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-8, 7) as i8).collect();
        match group {
            Some(g) => {
                let s: Vec<bf16> = (0..n * k / g)
                    .map(|_| bf16::from_f32(rng.uniform(0.002, 0.02)))
                    .collect();
                let scales = W4A8Scales::Grouped {
                    group_size: g,
                    scales: &s,
                };
                let packed = PackedW4A8::pack(n, k, &w, scales, None).unwrap();
                let scales = s.iter().map(|v| v.to_f32()).collect();
                let block_len = g;
                (
                    Self {
                        n,
                        k,
                        w,
                        scales,
                        block_len,
                        dense: Vec::new(),
                    },
                    packed,
                )
            }
            None => {
                let s = rng.vec_uniform(n, 0.002, 0.02);
                let packed = PackedW4A8::pack(n, k, &w, W4A8Scales::Channelwise(&s), None).unwrap();
                let (scales, block_len) = (s, k);
                (
                    Self {
                        n,
                        k,
                        w,
                        scales,
                        block_len,
                        dense: Vec::new(),
                    },
                    packed,
                )
            }
        }
    }

    fn w8a8(rng: &mut SplitMix64, n: usize, k: usize) -> (Self, PackedW8A8) {
        let w: Vec<i8> = (0..n * k).map(|_| rng.range_i64(-127, 127) as i8).collect();
        let scales = rng.vec_uniform(n, 0.0005, 0.004);
        let packed = PackedW8A8::pack(n, k, &w, &scales).unwrap();
        let block_len = k;
        (
            Self {
                n,
                k,
                w,
                scales,
                block_len,
                dense: Vec::new(),
            },
            packed,
        )
    }

    /// A dense matrix with bf16-representable weights, packed in bf16.
    fn dense(rng: &mut SplitMix64, n: usize, k: usize) -> (Self, PackedDense) {
        let wb: Vec<bf16> = (0..n * k)
            .map(|_| bf16::from_f32(rng.uniform(-0.2, 0.2)))
            .collect();
        let packed = PackedDense::pack_bf16(n, k, &wb).unwrap();
        let dense = wb.iter().map(|v| v.to_f32()).collect();
        let me = Self {
            n,
            k,
            w: Vec::new(),
            scales: Vec::new(),
            block_len: k,
            dense,
        };
        (me, packed)
    }

    /// A WNA16 matrix with bf16 group scales, optionally asymmetric and act-ordered (a
    /// random K permutation); `dense` holds its exactly dequantized weights.
    fn wna16(
        rng: &mut SplitMix64,
        (n, k): (usize, usize),
        bits: u32,
        group: Option<usize>,
        [asym, act_order]: [bool; 2],
    ) -> (Self, PackedWna16) {
        let ng = group.map_or(1, |g| k.div_ceil(g));
        let levels = 1usize << bits;
        let codes: Vec<u8> = (0..n * k).map(|_| rng.below(levels) as u8).collect();
        let zeros: Vec<u8> = (0..n * ng).map(|_| rng.below(levels) as u8).collect();
        let scales: Vec<bf16> = (0..n * ng)
            .map(|_| bf16::from_f32(rng.uniform(0.005, 0.05)))
            .collect();
        let mut perm: Vec<u32> = (0..k as u32).collect();
        for i in (1..k).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let packed = PackedWna16::pack(Wna16Desc {
            n,
            k,
            bits,
            codes: &codes,
            group_size: moe_quant::WeightGroups::from_group_size(group).unwrap(),
            scales: Wna16Scales::Bf16(&scales),
            zeros: asym.then_some(&zeros[..]),
            bias: None,
            perm: act_order.then_some(&perm[..]),
        })
        .unwrap();
        // (c − z)·s with a bf16 scale (at most 9 + 8 significant bits) is exact in f32.
        let dense = packed.dequantize_f64().iter().map(|&v| v as f32).collect();
        let me = Self {
            n,
            k,
            w: Vec::new(),
            scales: Vec::new(),
            block_len: k,
            dense,
        };
        (me, packed)
    }

    /// The scalar reference GEMM of one row, quantising it like the driver.
    fn gemm_row(&self, format: WeightFormat, x: &[f32]) -> Vec<f32> {
        let mut q = vec![0i8; self.k];
        match format {
            WeightFormat::W4A8 => {
                let r = quantize_row_asym_i8(x, &mut q);
                w4a8_reference(&W4A8RefArgs {
                    m: 1,
                    n: self.n,
                    k: self.k,
                    q: &q,
                    zero_point: &[r.zero_point],
                    recip: &[r.recip],
                    w: &self.w,
                    block_len: self.block_len,
                    scales: &self.scales,
                    bias: None,
                })
            }
            WeightFormat::W8A8 => {
                let s = quantize_row_sym_i8(x, &mut q);
                w8a8_reference(&W8A8RefArgs {
                    m: 1,
                    n: self.n,
                    k: self.k,
                    q: &q,
                    row_scale: &[s],
                    w: &self.w,
                    scales: &self.scales,
                })
            }
            WeightFormat::Dense | WeightFormat::Wna16 => {
                crate::dense::dense_reference(1, self.n, self.k, x, &self.dense)
            }
        }
    }
}

/// A layer: packed experts for the pipeline, unpacked ones for the reference.
struct TestLayer<W> {
    format: WeightFormat,
    w13: Vec<RefMat>,
    w2: Vec<RefMat>,
    weights: PackedExperts<W>,
    config: FusedMoeConfig,
}

fn base_config(h: usize, i: usize, e: usize) -> FusedMoeConfig {
    FusedMoeConfig {
        hidden_size: h,
        intermediate_size: i,
        activation: Activation::SILU,
        gate_up_layout: GateUpLayout::Concatenated,
        apply_router_weight_on_input: false,
        global_num_experts: e,
        expert_map: None,
    }
}

fn w4a8_layer(
    seed: u64,
    (e, h, i): (usize, usize, usize),
    group: Option<usize>,
    bias: bool,
) -> TestLayer<PackedW4A8> {
    let mut rng = SplitMix64::new(seed);
    let (w13, p13): (Vec<_>, Vec<_>) = (0..e)
        .map(|_| RefMat::w4a8(&mut rng, 2 * i, h, group))
        .unzip();
    let (w2, p2): (Vec<_>, Vec<_>) = (0..e).map(|_| RefMat::w4a8(&mut rng, h, i, group)).unzip();
    let weights = PackedExperts {
        w13: p13,
        w2: p2,
        w13_bias: bias.then(|| rng.vec_uniform(e * 2 * i, -0.5, 0.5)),
        w2_bias: bias.then(|| rng.vec_uniform(e * h, -0.5, 0.5)),
    };
    TestLayer {
        format: WeightFormat::W4A8,
        w13,
        w2,
        weights,
        config: base_config(h, i, e),
    }
}

fn dense_layer(seed: u64, (e, h, i): (usize, usize, usize), bias: bool) -> TestLayer<PackedDense> {
    let mut rng = SplitMix64::new(seed);
    let (w13, p13): (Vec<_>, Vec<_>) = (0..e).map(|_| RefMat::dense(&mut rng, 2 * i, h)).unzip();
    let (w2, p2): (Vec<_>, Vec<_>) = (0..e).map(|_| RefMat::dense(&mut rng, h, i)).unzip();
    let weights = PackedExperts {
        w13: p13,
        w2: p2,
        w13_bias: bias.then(|| rng.vec_uniform(e * 2 * i, -0.5, 0.5)),
        w2_bias: bias.then(|| rng.vec_uniform(e * h, -0.5, 0.5)),
    };
    TestLayer {
        format: WeightFormat::Dense,
        w13,
        w2,
        weights,
        config: base_config(h, i, e),
    }
}

fn wna16_layer(
    seed: u64,
    (e, h, i): (usize, usize, usize),
    bits: u32,
    group: Option<usize>,
    flags: [bool; 2],
) -> TestLayer<PackedWna16> {
    let mut rng = SplitMix64::new(seed);
    let (w13, p13): (Vec<_>, Vec<_>) = (0..e)
        .map(|_| RefMat::wna16(&mut rng, (2 * i, h), bits, group, flags))
        .unzip();
    let (w2, p2): (Vec<_>, Vec<_>) = (0..e)
        .map(|_| RefMat::wna16(&mut rng, (h, i), bits, group, flags))
        .unzip();
    let weights = PackedExperts {
        w13: p13,
        w2: p2,
        w13_bias: None,
        w2_bias: None,
    };
    TestLayer {
        format: WeightFormat::Wna16,
        w13,
        w2,
        weights,
        config: base_config(h, i, e),
    }
}

fn w8a8_layer(seed: u64, (e, h, i): (usize, usize, usize)) -> TestLayer<PackedW8A8> {
    let mut rng = SplitMix64::new(seed);
    let (w13, p13): (Vec<_>, Vec<_>) = (0..e).map(|_| RefMat::w8a8(&mut rng, 2 * i, h)).unzip();
    let (w2, p2): (Vec<_>, Vec<_>) = (0..e).map(|_| RefMat::w8a8(&mut rng, h, i)).unzip();
    let weights = PackedExperts {
        w13: p13,
        w2: p2,
        w13_bias: None,
        w2_bias: None,
    };
    TestLayer {
        format: WeightFormat::W8A8,
        w13,
        w2,
        weights,
        config: base_config(h, i, e),
    }
}

/// A routing of `t` tokens: ids `[t, k]` and weights.
struct Routed {
    t: usize,
    k: usize,
    ids: Vec<i64>,
    gates: Vec<f32>,
}

fn routed(
    rng: &mut SplitMix64,
    t: usize,
    k: usize,
    pick: impl Fn(&mut SplitMix64) -> i64,
) -> Routed {
    Routed {
        t,
        k,
        ids: (0..t * k).map(|_| pick(rng)).collect(),
        gates: rng.vec_uniform(t * k, 0.05, 1.0),
    }
}

impl<W: ExpertMatrix> TestLayer<W> {
    fn moe(&self, ks: KernelSet) -> FusedMoe<W>
    where
        W: Clone,
    {
        FusedMoe::new(self.weights.clone(), self.config.clone(), ks).unwrap()
    }

    /// The naive reference: token by token, its local slots in ascending (expert, slot) order,
    /// each expert MLP through the scalar reference GEMMs, in f32 with the rounding of `X`
    /// for the W8A8 rules (W4A8 tests use f32 only).
    fn reference<X: MoeFloat>(&self, x: &[X], r: &Routed) -> Vec<f32> {
        let cfg = &self.config;
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let out_round = super::numerics::Round::of::<X>();
        // Dense layers compute in f32 and round once at the end.
        let round = match self.format {
            WeightFormat::Dense | WeightFormat::Wna16 => super::numerics::Round::F32,
            _ => out_round,
        };
        let mut out = vec![0f32; r.t * h];
        for tok in 0..r.t {
            let mut slots: Vec<(usize, usize)> = (0..r.k)
                .filter_map(|j| {
                    let g = r.ids[tok * r.k + j] as usize;
                    let l = match &cfg.expert_map {
                        None => g as i64,
                        Some(map) => i64::from(map[g]),
                    };
                    (l >= 0).then_some((l as usize, j))
                })
                .collect();
            slots.sort();
            let mut acc = vec![0f32; h];
            for (l, j) in slots {
                let g = r.gates[tok * r.k + j];
                let mut row: Vec<f32> = x[tok * h..][..h].iter().map(|v| v.to_f32()).collect();
                if cfg.apply_router_weight_on_input {
                    row.iter_mut().for_each(|v| *v = round.apply(*v * g));
                }
                let mut hv = self.w13[l].gemm_row(self.format, &row);
                if let Some(b) = &self.weights.w13_bias {
                    hv.iter_mut()
                        .zip(&b[l * 2 * i..])
                        .for_each(|(v, bv)| *v += bv);
                }
                let mut a = vec![0f32; i];
                cfg.activation
                    .apply_row(cfg.gate_up_layout, &hv, &mut a, round);
                let mut y = self.w2[l].gemm_row(self.format, &a);
                if let Some(b) = &self.weights.w2_bias {
                    y.iter_mut().zip(&b[l * h..]).for_each(|(v, bv)| *v += bv);
                }
                for (s, v) in acc.iter_mut().zip(&y) {
                    let v = if cfg.apply_router_weight_on_input {
                        round.apply(*v)
                    } else {
                        round.apply(v * g)
                    };
                    *s = match self.format {
                        WeightFormat::W4A8 => round.apply(*s + v),
                        WeightFormat::W8A8 | WeightFormat::Dense | WeightFormat::Wna16 => *s + v,
                    };
                }
            }
            for (o, s) in out[tok * h..][..h].iter_mut().zip(&acc) {
                *o = out_round.apply(*s);
            }
        }
        out
    }
}

/// Runs the pipeline once with a fresh scratch.
fn run<W: ExpertMatrix, X: MoeFloat>(
    moe: &FusedMoe<W>,
    x: &[X],
    r: &Routed,
    lanes: usize,
    par: Par,
) -> Result<Vec<f32>, KernelError> {
    let h = moe.config().hidden_size;
    let mut scratch = moe.scratch(r.t.max(1), r.k.max(1), lanes)?;
    let mut out = vec![X::from_f32(-7.5); r.t * h];
    let input = MoeInput {
        tokens: r.t,
        top_k: r.k,
        x,
        topk_ids: &r.ids,
        topk_weights: &r.gates,
    };
    moe.apply(input, &mut out, &mut scratch, par)?;
    Ok(out.iter().map(|v| v.to_f32()).collect())
}

fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (idx, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what}: out[{idx}] = {g:e}, want {w:e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Ragged routings against the reference.

#[test]
fn ragged_routings_match_the_reference_bit_for_bit() {
    let mut rng = SplitMix64::new(11);
    struct Case {
        name: &'static str,
        shape: (usize, usize, usize),
        group: Option<usize>,
        t: usize,
        k: usize,
        pick: fn(&mut SplitMix64, usize) -> i64,
        on_input: bool,
        bias: bool,
    }
    let any = |rng: &mut SplitMix64, e: usize| rng.below(e) as i64;
    let cases = [
        Case {
            name: "T=1",
            shape: (4, 64, 32),
            group: Some(32),
            t: 1,
            k: 2,
            pick: any,
            on_input: false,
            bias: false,
        },
        Case {
            name: "single expert",
            shape: (1, 64, 64),
            group: None,
            t: 5,
            k: 1,
            pick: any,
            on_input: false,
            bias: true,
        },
        Case {
            name: "all tokens on one expert",
            shape: (6, 96, 64),
            group: Some(32),
            t: 9,
            k: 1,
            pick: |_, _| 2,
            on_input: false,
            bias: false,
        },
        Case {
            name: "experts without tokens",
            shape: (8, 64, 32),
            group: Some(32),
            t: 7,
            k: 2,
            pick: |rng, _| [1, 5][rng.below(2)],
            on_input: false,
            bias: false,
        },
        Case {
            name: "duplicate ids in a row",
            shape: (4, 64, 32),
            group: Some(32),
            t: 6,
            k: 3,
            pick: |rng, _| [0, 3][rng.below(2)],
            on_input: false,
            bias: true,
        },
        Case {
            name: "router weight on input",
            shape: (5, 128, 64),
            group: Some(64),
            t: 11,
            k: 2,
            pick: any,
            on_input: true,
            bias: false,
        },
        Case {
            name: "ragged T, k=4",
            shape: (8, 128, 96),
            group: Some(32),
            t: 17,
            k: 4,
            pick: any,
            on_input: false,
            bias: true,
        },
    ];
    for (n, c) in cases.iter().enumerate() {
        let mut layer = w4a8_layer(100 + n as u64, c.shape, c.group, c.bias);
        layer.config.apply_router_weight_on_input = c.on_input;
        let e = c.shape.0;
        let r = routed(&mut rng, c.t, c.k, |rng| (c.pick)(rng, e));
        let x = rng.vec_uniform(c.t * c.shape.1, -2.0, 2.0);
        let want = layer.reference(&x, &r);
        for isa in available_isas() {
            let moe = layer.moe(KernelSet::for_isa(isa).unwrap());
            for (lanes, par) in [(1, Par::Seq), (3, Par::Rayon)] {
                let got = run(&moe, &x, &r, lanes, par).unwrap();
                assert_bits_eq(&got, &want, &format!("{} on {isa} {par:?}", c.name));
            }
        }
    }
}

#[test]
fn no_tokens_gives_an_empty_output() {
    let layer = w4a8_layer(1, (4, 64, 32), Some(32), false);
    let moe = layer.moe(KernelSet::scalar());
    let r = Routed {
        t: 0,
        k: 2,
        ids: vec![],
        gates: vec![],
    };
    assert!(
        run::<_, f32>(&moe, &[], &r, 1, Par::Rayon)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn expert_map_skips_experts_of_other_ranks() {
    let mut rng = SplitMix64::new(5);
    // 8 global experts, this rank holds the even ones (round robin over 2 ranks, rank 0).
    let mut layer = w4a8_layer(6, (4, 64, 32), Some(32), false);
    layer.config.global_num_experts = 8;
    layer.config.expert_map = Some(vec![0, -1, 1, -1, 2, -1, 3, -1]);
    let r = routed(&mut rng, 9, 3, |rng| rng.below(8) as i64);
    let x = rng.vec_uniform(9 * 64, -1.0, 1.0);
    let want = layer.reference(&x, &r);
    let moe = layer.moe(*crate::kernels());
    let got = run(&moe, &x, &r, 2, Par::Rayon).unwrap();
    assert_bits_eq(&got, &want, "expert map");
    // A token routed only to other ranks' experts gets zeros.
    let only_odd = Routed {
        t: 1,
        k: 2,
        ids: vec![1, 7],
        gates: vec![0.5, 0.5],
    };
    let got = run(&moe, &x[..64], &only_odd, 1, Par::Seq).unwrap();
    assert!(got.iter().all(|&v| v == 0.0));
}

#[test]
fn interleaved_swiglu_oai_equals_concatenated_on_permuted_rows() {
    let mut rng = SplitMix64::new(9);
    let (e, h, i) = (3, 64, 32);
    let layer = w4a8_layer(10, (e, h, i), Some(32), true);
    // Interleave the gate/up rows of w13 (and its bias) expert by expert.
    let perm: Vec<usize> = (0..2 * i)
        .map(|r| if r % 2 == 0 { r / 2 } else { i + r / 2 })
        .collect();
    let mut w13 = Vec::new();
    let mut b13 = vec![0f32; e * 2 * i];
    let old_b = layer.weights.w13_bias.as_ref().unwrap();
    for (ex, m) in layer.w13.iter().enumerate() {
        let nb = m.k / m.block_len;
        let w: Vec<i8> = perm
            .iter()
            .flat_map(|&r| m.w[r * h..][..h].to_vec())
            .collect();
        let s: Vec<bf16> = perm
            .iter()
            .flat_map(|&r| m.scales[r * nb..][..nb].iter().map(|&v| bf16::from_f32(v)))
            .collect();
        let scales = W4A8Scales::Grouped {
            group_size: 32,
            scales: &s,
        };
        w13.push(PackedW4A8::pack(2 * i, h, &w, scales, None).unwrap());
        for (r, &src) in perm.iter().enumerate() {
            b13[ex * 2 * i + r] = old_b[ex * 2 * i + src];
        }
    }
    let mut cat = layer.config.clone();
    cat.activation = Activation::SWIGLU_OAI;
    let mut inter = cat.clone();
    inter.gate_up_layout = GateUpLayout::Interleaved;
    let ks = KernelSet::scalar();
    let moe_cat = FusedMoe::new(layer.weights.clone(), cat, ks).unwrap();
    let weights = PackedExperts {
        w13,
        w2: layer.weights.w2.clone(),
        w13_bias: Some(b13),
        w2_bias: layer.weights.w2_bias.clone(),
    };
    let moe_int = FusedMoe::new(weights, inter, ks).unwrap();
    let r = routed(&mut rng, 5, 2, |rng| rng.below(e) as i64);
    let x: Vec<f32> = (0..5 * h).map(|_| rng.normal() * 4.0).collect();
    let a = run(&moe_cat, &x, &r, 1, Par::Seq).unwrap();
    let b = run(&moe_int, &x, &r, 1, Par::Seq).unwrap();
    assert_bits_eq(&b, &a, "interleaved vs concatenated");
}

#[test]
fn w8a8_matches_the_reference_in_f32_and_bf16() {
    let mut rng = SplitMix64::new(21);
    let layer = w8a8_layer(22, (5, 64, 32));
    let r = routed(&mut rng, 7, 2, |rng| rng.below(5) as i64);
    let x = rng.vec_uniform(7 * 64, -1.5, 1.5);
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    for isa in available_isas() {
        let moe = layer.moe(KernelSet::for_isa(isa).unwrap());
        let got = run(&moe, &x, &r, 2, Par::Rayon).unwrap();
        assert_bits_eq(&got, &layer.reference(&x, &r), &format!("w8a8 f32 {isa}"));
        let got = run(&moe, &xb, &r, 2, Par::Rayon).unwrap();
        assert_bits_eq(&got, &layer.reference(&xb, &r), &format!("w8a8 bf16 {isa}"));
    }
}

#[test]
fn dense_matches_the_reference_in_f32_and_bf16() {
    let mut rng = SplitMix64::new(23);
    for (seed, shape, bias, t, k) in [
        (24, (5, 64, 32), true, 7, 2),
        (25, (1, 40, 24), false, 3, 1),
    ] {
        let layer = dense_layer(seed, shape, bias);
        let e = shape.0;
        let r = routed(&mut rng, t, k, |rng| rng.below(e) as i64);
        let x = rng.vec_uniform(t * shape.1, -1.5, 1.5);
        let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let mut sets = vec![KernelSet::scalar()];
        sets.extend(available_isas().into_iter().filter_map(KernelSet::for_isa));
        for ks in sets {
            let isa = ks.isa();
            let moe = layer.moe(ks);
            for (lanes, par) in [(1, Par::Seq), (3, Par::Rayon)] {
                let got = run(&moe, &x, &r, lanes, par).unwrap();
                assert_bits_eq(&got, &layer.reference(&x, &r), &format!("dense f32 {isa}"));
                let got = run(&moe, &xb, &r, lanes, par).unwrap();
                assert_bits_eq(
                    &got,
                    &layer.reference(&xb, &r),
                    &format!("dense bf16 {isa}"),
                );
            }
        }
    }
}

/// WNA16 experts on every rung: ragged shapes, one expert, all tokens on one expert, T = 0
/// and 1, symmetric and asymmetric, act-order; one lane on one thread equals three lanes on the
/// pool bit for bit, and both match the f32 product of the dequantized weights closely (the
/// GEMMs sum per group, then scale; the reference sums dequantized weights).
#[test]
fn wna16_matches_the_dequantized_reference() {
    let mut rng = SplitMix64::new(81);
    /// (seed, (E, H, I), bits, group, [asymmetric, act-order], tokens, top-k, all on expert 0)
    type Wna16Case = (
        u64,
        (usize, usize, usize),
        u32,
        Option<usize>,
        [bool; 2],
        usize,
        usize,
        bool,
    );
    let cases: [Wna16Case; 8] = [
        (82, (5, 64, 32), 4, Some(32), [false, false], 7, 2, false),
        (83, (4, 72, 40), 4, Some(8), [true, false], 5, 2, false),
        (84, (1, 40, 24), 4, None, [false, false], 3, 1, false),
        (85, (3, 96, 48), 4, Some(32), [false, true], 9, 2, false),
        (86, (4, 33, 17), 4, Some(16), [true, true], 6, 3, true),
        (87, (2, 64, 32), 4, Some(64), [false, false], 1, 1, false),
        (88, (3, 64, 40), 8, Some(32), [false, false], 6, 2, false),
        (89, (2, 35, 19), 8, Some(8), [true, true], 5, 2, true),
    ];
    for (seed, shape, bits, group, flags, t, k, one_expert) in cases {
        let layer = wna16_layer(seed, shape, bits, group, flags);
        let e = shape.0;
        for t in [t, 1, 0] {
            let r = routed(&mut rng, t, k, |rng| {
                if one_expert { 0 } else { rng.below(e) as i64 }
            });
            let x = rng.vec_uniform(t * shape.1, -1.5, 1.5);
            let want = layer.reference(&x, &r);
            let scale = want.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
            // The f32 bodies; the bf16 paths have their own tests and tolerance.
            let mut sets = vec![KernelSet::scalar()];
            sets.extend(
                available_isas()
                    .into_iter()
                    .filter_map(KernelSet::for_isa)
                    .map(KernelSet::without_bf16_path),
            );
            for ks in sets {
                let isa = ks.wna16_isa();
                let moe = layer.moe(ks);
                let seq = run(&moe, &x, &r, 1, Par::Seq).unwrap();
                let par = run(&moe, &x, &r, 3, Par::Rayon).unwrap();
                assert_bits_eq(&par, &seq, &format!("wna16 {isa} Seq vs Rayon"));
                for (idx, (g, w)) in seq.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 * scale,
                        "wna16 {isa} seed {seed} t {t} [{idx}]: {g} vs {w}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NaN rows (spec §4.6).

#[test]
fn a_nan_row_poisons_only_its_token() {
    let mut rng = SplitMix64::new(31);
    let layer = w4a8_layer(32, (4, 64, 32), Some(32), false);
    let w8 = w8a8_layer(33, (4, 64, 32));
    let r = routed(&mut rng, 5, 2, |rng| rng.below(4) as i64);
    let clean = rng.vec_uniform(5 * 64, -1.0, 1.0);
    let mut dirty = clean.clone();
    dirty[2 * 64 + 17] = f32::NAN;
    let check = |clean_out: Vec<f32>, dirty_out: Vec<f32>, what: &str| {
        for tok in 0..5 {
            let (c, d) = (&clean_out[tok * 64..][..64], &dirty_out[tok * 64..][..64]);
            if tok == 2 {
                assert!(d.iter().all(|v| v.is_nan()), "{what}: token 2 not NaN");
            } else {
                assert_bits_eq(d, c, &format!("{what}: token {tok}"));
            }
        }
    };
    let moe = layer.moe(*crate::kernels());
    check(
        run(&moe, &clean, &r, 2, Par::Rayon).unwrap(),
        run(&moe, &dirty, &r, 2, Par::Rayon).unwrap(),
        "w4a8",
    );
    let moe = w8.moe(*crate::kernels());
    check(
        run(&moe, &clean, &r, 2, Par::Rayon).unwrap(),
        run(&moe, &dirty, &r, 2, Par::Rayon).unwrap(),
        "w8a8",
    );
}

/// Non-finite activations follow one rule on every rung (spec §4.6): a NaN row gives a NaN
/// output row, a row with an infinity is quantised as an all-zero row. Every available rung
/// must give the scalar rung's output bit for bit (NaN payloads included), so what a caller sees
/// never depends on the CPU.
#[test]
fn non_finite_rows_give_the_same_bits_on_every_rung() {
    let mut rng = SplitMix64::new(37);
    let layer = w4a8_layer(38, (4, 64, 32), Some(32), false);
    let w8 = w8a8_layer(39, (4, 64, 32));
    let tokens = 6;
    let r = routed(&mut rng, tokens, 2, |rng| rng.below(4) as i64);
    let mut x = rng.vec_uniform(tokens * 64, -1.0, 1.0);
    x[64 + 3] = f32::NAN;
    x[2 * 64 + 5] = f32::INFINITY;
    x[3 * 64 + 63] = f32::NEG_INFINITY;
    x[4 * 64] = f32::MAX;
    x[4 * 64 + 1] = -f32::MAX;
    x[5 * 64 + 7] = f32::NAN;
    x[5 * 64 + 8] = f32::INFINITY;
    let bits = |v: Vec<f32>| -> Vec<u32> { v.into_iter().map(f32::to_bits).collect() };
    let want4 = bits(run(&layer.moe(KernelSet::scalar()), &x, &r, 2, Par::Seq).unwrap());
    let want8 = bits(run(&w8.moe(KernelSet::scalar()), &x, &r, 2, Par::Seq).unwrap());
    assert!(want4[64..128].iter().all(|&b| f32::from_bits(b).is_nan()));
    assert!(want4[5 * 64..].iter().all(|&b| f32::from_bits(b).is_nan()));
    assert!(want4[..64].iter().all(|&b| f32::from_bits(b).is_finite()));
    for isa in available_isas() {
        let ks = KernelSet::for_isa(isa).unwrap();
        let got4 = bits(run(&layer.moe(ks), &x, &r, 2, Par::Rayon).unwrap());
        assert_eq!(got4, want4, "w4a8 on {isa}");
        let got8 = bits(run(&w8.moe(ks), &x, &r, 2, Par::Rayon).unwrap());
        assert_eq!(got8, want8, "w8a8 on {isa}");
    }
}

// ---------------------------------------------------------------------------------------------
// Thread-count independence.

#[cfg(feature = "rayon")]
#[test]
fn results_do_not_depend_on_threads_or_lanes() {
    let mut rng = SplitMix64::new(41);
    // Big enough that every GEMM splits its panels (above the driver's 2^18 MACs) and that
    // the tokens are quantised in two halves (above 2^15 values).
    let layer = w4a8_layer(42, (8, 256, 128), Some(64), true);
    let r = routed(&mut rng, 137, 4, |rng| rng.below(8) as i64);
    let x = rng.vec_uniform(137 * 256, -1.0, 1.0);
    let moe = layer.moe(*crate::kernels());
    let want = run(&moe, &x, &r, 1, Par::Seq).unwrap();
    assert_bits_eq(&want, &layer.reference(&x, &r), "Seq vs reference");
    assert_same_bits_on_every_pool(&moe, (&x, &r), &want, "dispatched");
}

/// Runs `moe` on 1-3 threads with 1, 2 and 8 lanes and checks each result against `want`.
#[cfg(feature = "rayon")]
fn assert_same_bits_on_every_pool<W: ExpertMatrix>(
    moe: &FusedMoe<W>,
    (x, r): (&[f32], &Routed),
    want: &[f32],
    name: &str,
) {
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for lanes in [1, 2, 8] {
            let got = pool.install(|| run(moe, x, r, lanes, Par::Rayon)).unwrap();
            assert_bits_eq(
                &got,
                want,
                &format!("{name}: {threads} threads, {lanes} lanes"),
            );
        }
    }
}

/// W4A8 prefill on weights requantised per channel: the same bits on any thread and lane count,
/// and close to the exact path (the tiles' own tests compare them with their scalar twin).
#[test]
fn requantised_prefill_does_not_depend_on_threads_or_lanes() {
    let mut rng = SplitMix64::new(43);
    let layer = w4a8_layer(44, (8, 256, 128), Some(64), true);
    let r = routed(&mut rng, 137, 4, |rng| rng.below(8) as i64);
    let x = rng.vec_uniform(137 * 256, -1.0, 1.0);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut sets = vec![("dispatched", *crate::kernels())];
    #[cfg(target_arch = "x86_64")]
    sets.extend(crate::x86::test_only_kernel_sets());
    for (name, ks) in sets {
        let ks = ks.with_w4a8_prefill(crate::W4A8Prefill::ChannelInt8);
        if ks.w4a8_prefill() != crate::W4A8Prefill::ChannelInt8 {
            continue;
        }
        let moe = layer.moe(ks);
        let want = run(&moe, &x, &r, 1, Par::Seq).unwrap();
        let exact = layer.reference(&x, &r);
        let (mut d, mut n) = (0f64, 0f64);
        for (g, e) in want.iter().zip(&exact) {
            d += f64::from(g - e).powi(2);
            n += f64::from(*e).powi(2);
        }
        assert!(
            (d / n).sqrt() < 2e-2,
            "{name}: {:e} from the exact path",
            (d / n).sqrt()
        );
        assert_ne!(want, exact, "{name}: the requantised kernel did not run");
        for lanes in [2, 8] {
            let got = run(&moe, &x, &r, lanes, Par::Seq).unwrap();
            assert_bits_eq(&got, &want, &format!("{name}: {lanes} lanes"));
        }
        #[cfg(feature = "rayon")]
        assert_same_bits_on_every_pool(&moe, (&x, &r), &want, name);
    }
}

// ---------------------------------------------------------------------------------------------
// Typed errors.

#[test]
fn bad_inputs_are_typed_errors_and_leave_out_untouched() {
    let layer = w4a8_layer(51, (4, 64, 32), Some(32), false);
    let moe = layer.moe(KernelSet::scalar());
    let x = vec![0.5f32; 2 * 64];
    let mut scratch = moe.scratch(2, 2, 1).unwrap();
    let mut out = vec![9.0f32; 2 * 64];
    let mut call = |x: &[f32], ids: &[i64], w: &[f32], out: &mut [f32]| {
        let input = MoeInput {
            tokens: 2,
            top_k: 2,
            x,
            topk_ids: ids,
            topk_weights: w,
        };
        moe.apply(input, out, &mut scratch, Par::Seq)
    };
    let ok_w = [0.5f32; 4];
    let err = call(&x, &[0, 1, 2, 4], &ok_w, &mut out).unwrap_err();
    assert_eq!(
        err,
        KernelError::ExpertIdOutOfRange {
            tensor: "topk_ids",
            index: 3,
            id: 4,
            num_experts: 4
        }
    );
    assert!(err.to_string().starts_with("expert id out of range"));
    assert!(matches!(
        call(&x, &[0, -1, 2, 3], &ok_w, &mut out),
        Err(KernelError::ExpertIdOutOfRange { id: -1, .. })
    ));
    assert!(matches!(
        call(&x[..100], &[0, 1, 2, 3], &ok_w, &mut out),
        Err(KernelError::LengthMismatch { tensor: "x", .. })
    ));
    assert!(matches!(
        call(&x, &[0, 1, 2], &ok_w, &mut out),
        Err(KernelError::LengthMismatch {
            tensor: "topk_ids",
            ..
        })
    ));
    assert!(matches!(
        call(&x, &[0, 1, 2, 3], &ok_w[..3], &mut out),
        Err(KernelError::LengthMismatch {
            tensor: "topk_weights",
            ..
        })
    ));
    assert!(matches!(
        call(&x, &[0, 1, 2, 3], &ok_w, &mut out[..64]),
        Err(KernelError::LengthMismatch { tensor: "out", .. })
    ));
    assert!(out.iter().all(|&v| v == 9.0), "out written on error");

    // Scratch too small or for another layer.
    let mut small = moe.scratch(1, 2, 1).unwrap();
    let input = MoeInput {
        tokens: 2,
        top_k: 2,
        x: &x,
        topk_ids: &[0i32, 1, 2, 3],
        topk_weights: &ok_w,
    };
    assert!(matches!(
        moe.apply(input, &mut out, &mut small, Par::Seq),
        Err(KernelError::ScratchTooSmall { what: "tokens", .. })
    ));
    let other = w4a8_layer(52, (5, 64, 32), Some(32), false).moe(KernelSet::scalar());
    let mut foreign = other.scratch(2, 2, 1).unwrap();
    assert!(matches!(
        moe.apply(input, &mut out, &mut foreign, Par::Seq),
        Err(KernelError::ScratchMismatch { dim: "E", .. })
    ));
    assert!(matches!(
        moe.scratch(2, 2, 0),
        Err(KernelError::UnsupportedDim { dim: "lanes", .. })
    ));
}

#[test]
fn bad_layers_are_typed_errors() {
    let layer = w4a8_layer(61, (4, 64, 32), Some(32), false);
    let ks = KernelSet::scalar();
    let new = |w: PackedExperts<PackedW4A8>, c: FusedMoeConfig| FusedMoe::new(w, c, ks);
    // Expert map of the wrong length and with a bad local id.
    let mut c = layer.config.clone();
    c.global_num_experts = 8;
    c.expert_map = Some(vec![0, 1, 2, 3]);
    assert!(matches!(
        new(layer.weights.clone(), c.clone()),
        Err(KernelError::LengthMismatch {
            tensor: "expert_map",
            expected: 8,
            got: 4
        })
    ));
    c.expert_map = Some(vec![0, 1, 2, 3, 4, -1, -1, -1]);
    assert!(matches!(
        new(layer.weights.clone(), c.clone()),
        Err(KernelError::ValueOutOfRange {
            tensor: "expert_map",
            index: 4,
            ..
        })
    ));
    c.expert_map = None;
    assert!(matches!(
        new(layer.weights.clone(), c),
        Err(KernelError::ShapeMismatch {
            tensor: "global_num_experts",
            ..
        })
    ));
    // Wrong sizes.
    let mut c = layer.config.clone();
    c.intermediate_size = 16;
    assert!(matches!(
        new(layer.weights.clone(), c),
        Err(KernelError::ExpertShapeMismatch {
            tensor: "w13",
            expert: 0,
            dim: "N",
            ..
        })
    ));
    let mut w = layer.weights.clone();
    w.w2.pop();
    assert!(matches!(
        new(w, layer.config.clone()),
        Err(KernelError::ShapeMismatch { tensor: "w2", .. })
    ));
    let mut w = layer.weights.clone();
    w.w2_bias = Some(vec![0.0; 3]);
    assert!(matches!(
        new(w, layer.config.clone()),
        Err(KernelError::LengthMismatch {
            tensor: "w2_bias",
            ..
        })
    ));
    // Compatibility activation: concatenated W4A8 only.
    let mut c = layer.config.clone();
    c.activation = Activation::VllmCpuInt4Compat(Int4ActivationKind::SwigluOai);
    c.gate_up_layout = GateUpLayout::Interleaved;
    assert!(matches!(
        new(layer.weights.clone(), c.clone()),
        Err(KernelError::Unsupported { .. })
    ));
    let w8 = w8a8_layer(62, (4, 64, 32));
    c.gate_up_layout = GateUpLayout::Concatenated;
    assert!(matches!(
        FusedMoe::new(w8.weights, c, ks),
        Err(KernelError::Unsupported { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// No allocation in `apply`.

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// Counts allocations per thread, otherwise the system allocator.
struct CountingAlloc;

// SAFETY: every method forwards to `System` with the caller's arguments, so `System`'s
// guarantees carry over; the counter is a const-initialised thread-local without destructor,
// which itself never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` (through `alloc`) with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn apply_does_not_allocate() {
    let mut rng = SplitMix64::new(71);
    let layer = w4a8_layer(72, (8, 128, 64), Some(32), true);
    let moe = layer.moe(*crate::kernels());
    let mut scratch = moe.scratch(16, 4, 2).unwrap();
    let mut out = vec![bf16::ZERO; 16 * 128];
    for t in [16, 3, 1, 0] {
        let r = routed(&mut rng, t, 4, |rng| rng.below(8) as i64);
        let mut x: Vec<bf16> = (0..t * 128)
            .map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0)))
            .collect();
        if t > 1 {
            x[128] = bf16::NAN;
        }
        let input = MoeInput {
            tokens: t,
            top_k: 4,
            x: &x,
            topk_ids: &r.ids,
            topk_weights: &r.gates,
        };
        let before = ALLOCATIONS.with(Cell::get);
        moe.apply(input, &mut out[..t * 128], &mut scratch, Par::Seq)
            .unwrap();
        let after = ALLOCATIONS.with(Cell::get);
        assert_eq!(after - before, 0, "apply allocated with T = {t}");
    }
}

/// Act-order WNA16 experts gather their activation rows into scratch sized up front.
#[test]
fn wna16_act_order_apply_does_not_allocate() {
    let layer = wna16_layer(92, (4, 64, 32), 4, Some(32), [true, true]);
    let route = |rng: &mut SplitMix64, t: usize| {
        let r = routed(rng, t, 2, |rng| rng.below(4) as i64);
        (r.ids, r.gates)
    };
    let moe = layer.moe(*crate::kernels());
    assert_apply_allocates_nothing("act-order", &moe, (8, 2), &[8, 3, 1, 0], route);
}

/// Applies `moe` at each token count of `tokens` (experts and gates from `route`, inputs
/// random) on scratch sized up front for `max_tokens` tokens of `top_k` experts, and asserts
/// that no call allocates. The same calls on another scratch first grow the per-thread buffers
/// some bodies keep between calls (the decoded panel pairs of the tile bodies), which are not
/// the scratch's to size: each row count may take another body.
fn assert_apply_allocates_nothing<W: ExpertMatrix>(
    case: &str,
    moe: &FusedMoe<W>,
    (max_tokens, top_k): (usize, usize),
    tokens: &[usize],
    route: impl Fn(&mut SplitMix64, usize) -> (Vec<i64>, Vec<f32>),
) {
    let h = moe.config().hidden_size;
    let mut out = vec![0f32; max_tokens * h];
    let mut calls = |scratch: &mut MoeScratch| -> Vec<(usize, usize)> {
        let mut rng = SplitMix64::new(97);
        let mut allocated = Vec::with_capacity(tokens.len());
        for &t in tokens {
            let (ids, gates) = route(&mut rng, t);
            let x = rng.vec_uniform(t * h, -1.0, 1.0);
            let input = MoeInput {
                tokens: t,
                top_k,
                x: &x,
                topk_ids: &ids,
                topk_weights: &gates,
            };
            let before = ALLOCATIONS.with(Cell::get);
            moe.apply(input, &mut out[..t * h], scratch, Par::Seq)
                .unwrap();
            allocated.push((t, ALLOCATIONS.with(Cell::get) - before));
        }
        allocated
    };
    calls(&mut moe.scratch(max_tokens, top_k, 2).unwrap());
    for (t, allocated) in calls(&mut moe.scratch(max_tokens, top_k, 2).unwrap()) {
        assert_eq!(allocated, 0, "{case}: apply allocated with T = {t}");
    }
}

/// Every token on expert 1, at a random gate.
fn all_on_expert_1(rng: &mut SplitMix64, t: usize) -> (Vec<i64>, Vec<f32>) {
    (vec![1; t], rng.vec_uniform(t, 0.05, 1.0))
}

/// [`assert_apply_allocates_nothing`] with every token on expert 1 (the most rows one GEMM
/// gets) at 40, 33, 16, 9, 6 and 1 tokens, scratch sized for 40: past every large-row kernel's
/// switch-over.
fn assert_one_expert_apply_allocates_nothing<W: ExpertMatrix>(case: &str, moe: &FusedMoe<W>) {
    let tokens = [40, 33, 16, 9, 6, 1];
    assert_apply_allocates_nothing(case, moe, (40, 1), &tokens, all_on_expert_1);
}

/// WNA16 experts with every token on one expert stay within scratch sized up front, whichever
/// body the rung runs: int4 and int8 codes, groups and channelwise, with and without zero
/// points, K of whole steps whose bf16 pair rows are padded (H = 128: 4 cache lines) and K past
/// a step, a chunk and a group (H = 100).
#[test]
fn wna16_apply_with_every_token_on_one_expert_does_not_allocate() {
    for bits in [4u32, 8] {
        for (shape, group, asym) in [
            ((3, 128, 64), Some(32), false),
            ((3, 128, 64), None, true),
            ((2, 100, 36), Some(32), true),
        ] {
            let layer = wna16_layer(96, shape, bits, group, [asym, false]);
            let case = format!("int{bits} {shape:?} group {group:?} asym={asym}");
            assert_one_expert_apply_allocates_nothing(&case, &layer.moe(*crate::kernels()));
        }
    }
}

/// WNA16 experts whose calls stay within a few rows (scratch sized for 8) and whose K is one
/// short scale group: the rows' largest layout there is the integer rows with their int8
/// tiles after them (on the AMX rung), not the bf16 tiles the reservation for more rows
/// covers it with.
#[test]
fn wna16_apply_of_few_rows_on_one_expert_does_not_allocate() {
    let layer = wna16_layer(96, (2, 32, 32), 4, None, [false, false]);
    let moe = layer.moe(*crate::kernels());
    assert_apply_allocates_nothing("few rows", &moe, (8, 1), &[8, 6, 5, 1], all_on_expert_1);
}

/// The same for the other formats: W4A8 with groups of 32 and channelwise (and its prefill on
/// the bf16 tiles or requantised per channel, where the rung has them), W8A8 and unquantized
/// experts.
#[test]
fn every_format_applies_with_every_token_on_one_expert_without_allocating() {
    for (shape, group) in [((3, 128, 64), Some(32)), ((2, 100, 36), None)] {
        let layer = w4a8_layer(98, shape, group, true);
        let case = format!("w4a8 {shape:?} group {group:?}");
        assert_one_expert_apply_allocates_nothing(&case, &layer.moe(*crate::kernels()));
    }
    // W4A8 prefill with other numerics, where the rung has them.
    for prefill in [
        crate::W4A8Prefill::Bf16Tiles,
        crate::W4A8Prefill::ChannelInt8,
    ] {
        let layer = w4a8_layer(98, (3, 128, 64), Some(32), true);
        let ks = crate::kernels().with_w4a8_prefill(prefill);
        let case = format!("w4a8 prefill {:?}", ks.w4a8_prefill());
        assert_one_expert_apply_allocates_nothing(&case, &layer.moe(ks));
    }
    let layer = w8a8_layer(99, (3, 128, 64));
    assert_one_expert_apply_allocates_nothing("w8a8", &layer.moe(*crate::kernels()));
    let layer = dense_layer(100, (3, 128, 64), true);
    assert_one_expert_apply_allocates_nothing("dense", &layer.moe(*crate::kernels()));
}

/// Recording stage times changes no bit of the output, counts the calls, and sees time in
/// the GEMM stages, on one lane and on several.
#[test]
fn stage_times_are_recorded_without_changing_results() {
    let mut rng = SplitMix64::new(93);
    let layer = w4a8_layer(94, (8, 128, 64), Some(32), false);
    let moe = layer.moe(*crate::kernels());
    let r = routed(&mut rng, 12, 2, |rng| rng.below(8) as i64);
    let x = rng.vec_uniform(12 * 128, -1.0, 1.0);
    for par in [Par::Seq, Par::Rayon] {
        let mut scratch = moe.scratch(12, 2, 3).unwrap();
        let run = |scratch: &mut MoeScratch| {
            let mut out = vec![0f32; 12 * 128];
            let input = MoeInput {
                tokens: 12,
                top_k: 2,
                x: &x,
                topk_ids: &r.ids,
                topk_weights: &r.gates,
            };
            moe.apply(input, &mut out, scratch, par).unwrap();
            out
        };
        let plain = run(&mut scratch);
        assert_eq!(scratch.stage_times(), crate::StageTimes::default());
        scratch.record_stage_times(true);
        let timed = run(&mut scratch);
        let _ = run(&mut scratch);
        assert_bits_eq(&timed, &plain, &format!("{par:?}: recording"));
        let t = scratch.stage_times();
        assert_eq!(t.calls, 2, "{par:?}");
        assert!(!t.gate_up.is_zero() && !t.down.is_zero(), "{par:?}: {t:?}");
        scratch.record_stage_times(false);
        assert_eq!(scratch.stage_times().calls, 0);
    }
}
