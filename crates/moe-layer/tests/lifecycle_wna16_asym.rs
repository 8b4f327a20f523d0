//! Asymmetric WNA16 checkpoints written by the test (AWQ `gemm`, GPTQ `sym: false` in the v1
//! and v2 zero-point conventions, 4 and 8 bits, compressed-tensors `pack-quantized` with
//! `symmetric: false`) load onto the native WNA16 kernels with their
//! zero points and compute the MoE block of their exactly dequantized weights `(q − z)·s`: the
//! layer's f32 output is compared with an f64 evaluation of the same routing, gated SiLU MLPs
//! and weighted sum, within 1e-5 relative L2 where int4 GEMMs compute in f32 and 5e-3 where
//! the CPU has a bf16 path that some calls may take.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Ckpt, E, Fmt, G, H, I, i32_bytes, temp_dir, wna16_tolerance};
use moe_layer::checkpoint::{Checkpoint, ReadOptions, ShardAccess, StoredExperts};
use moe_layer::{LayerError, MoeLayer};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use safetensors::Dtype;
use serde_json::json;

const TOP_K: usize = 2;

/// One projection's logical content: unsigned codes `q` `[n, k]`, zero points `z` and scales
/// `s` `[n, k/G]` (scales exact in f16 and bf16).
struct AsymProj {
    n: usize,
    k: usize,
    q: Vec<u8>,
    z: Vec<u8>,
    s: Vec<f32>,
    /// The scale group of every input column (`k / G` unless act-order says otherwise).
    g_idx: Vec<usize>,
}

impl AsymProj {
    fn random(rng: &mut SplitMix64, n: usize, k: usize, bits: u32) -> Self {
        let max = (1i64 << bits) - 1;
        let groups = k / G;
        Self {
            n,
            k,
            q: (0..n * k).map(|_| rng.range_i64(0, max) as u8).collect(),
            z: (0..n * groups)
                .map(|_| rng.range_i64(0, max) as u8)
                .collect(),
            // Powers of two times small integers: exact in f16 and bf16 alike.
            s: (0..n * groups)
                .map(|_| rng.range_i64(1, 15) as f32 / 512.0)
                .collect(),
            g_idx: (0..k).map(|kk| kk / G).collect(),
        }
    }

    fn weight(&self, c: usize, k: usize) -> f64 {
        let g = c * (self.k / G) + self.g_idx[k];
        (f64::from(self.q[c * self.k + k]) - f64::from(self.z[g])) * f64::from(self.s[g])
    }

    /// Scales `[G, n]` as f16 bytes (GPTQ and AWQ store them K-major).
    fn scales_kn_f16(&self) -> Vec<u8> {
        let groups = self.k / G;
        let mut out = Vec::with_capacity(groups * self.n * 2);
        for g in 0..groups {
            for c in 0..self.n {
                out.extend(half::f16::from_f32(self.s[c * groups + g]).to_le_bytes());
            }
        }
        out
    }
}

/// AWQ's `gemm` packing of `[rows, n]` 4-bit values (row-major, `value(r, c)`) into
/// `[rows, n/8]` words: column `8j + c` goes to field `[0, 4, 1, 5, 2, 6, 3, 7][c]`.
fn pack_awq(rows: usize, n: usize, value: impl Fn(usize, usize) -> u8) -> Vec<i32> {
    const FIELD: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
    let mut words = vec![0u32; rows * n / 8];
    for r in 0..rows {
        for c in 0..n {
            words[r * n / 8 + c / 8] |= u32::from(value(r, c)) << (4 * FIELD[c % 8]);
        }
    }
    words.into_iter().map(|w| w as i32).collect()
}

/// GPTQ's packing of `bits`-bit values along the first dimension: `[rows, cols]` values
/// `value(r, c)` into `[rows/pf, cols]` words (field `t` of word `[r][c]` = row `r·pf + t`).
fn pack_gptq_rows(
    rows: usize,
    cols: usize,
    bits: u32,
    value: impl Fn(usize, usize) -> u32,
) -> Vec<i32> {
    let pf = (32 / bits) as usize;
    let mut words = vec![0u32; rows / pf * cols];
    for r in 0..rows {
        for c in 0..cols {
            words[(r / pf) * cols + c] |= value(r, c) << (bits as usize * (r % pf));
        }
    }
    words.into_iter().map(|w| w as i32).collect()
}

/// GPTQ's packing along the second dimension (`qzeros`): `[rows, cols]` into
/// `[rows, cols/pf]` words (field `t` of word `[r][j]` = column `j·pf + t`).
fn pack_gptq_cols(
    rows: usize,
    cols: usize,
    bits: u32,
    value: impl Fn(usize, usize) -> u32,
) -> Vec<i32> {
    let pf = (32 / bits) as usize;
    let mut words = vec![0u32; rows * cols / pf];
    for r in 0..rows {
        for c in 0..cols {
            words[r * cols / pf + c / pf] |= value(r, c) << (bits as usize * (c % pf));
        }
    }
    words.into_iter().map(|w| w as i32).collect()
}

/// Which asymmetric format to write.
#[derive(Clone, Copy, Debug)]
enum Asym {
    Awq,
    /// GPTQ with `checkpoint_format` `gptq` (stores `z − 1`) or `gptq_v2` (stores `z`).
    Gptq {
        bits: u32,
        v2: bool,
    },
    /// compressed-tensors `pack-quantized`, `symmetric: false`.
    PackQuantized {
        bits: u32,
    },
}

impl Asym {
    fn bits(self) -> u32 {
        match self {
            Self::Awq => 4,
            Self::Gptq { bits, .. } | Self::PackQuantized { bits } => bits,
        }
    }
}

/// Writes one projection at `prefix`.
fn put_asym(ck: &mut Ckpt, prefix: &str, p: &AsymProj, fmt: Asym) {
    let (n, k, groups) = (p.n, p.k, p.k / G);
    for suffix in ["qweight", "qzeros", "scales", "g_idx"] {
        ck.tensors.remove(&format!("{prefix}.{suffix}"));
    }
    if let Asym::PackQuantized { bits } = fmt {
        put_pack_quantized(ck, prefix, p, bits);
        return;
    }
    ck.put(
        &format!("{prefix}.scales"),
        Dtype::F16,
        &[groups, n],
        p.scales_kn_f16(),
    );
    match fmt {
        Asym::Awq => {
            let qweight = pack_awq(k, n, |r, c| p.q[c * k + r]);
            let qzeros = pack_awq(groups, n, |g, c| p.z[c * groups + g]);
            ck.put(
                &format!("{prefix}.qweight"),
                Dtype::I32,
                &[k, n / 8],
                i32_bytes(&qweight),
            );
            ck.put(
                &format!("{prefix}.qzeros"),
                Dtype::I32,
                &[groups, n / 8],
                i32_bytes(&qzeros),
            );
        }
        Asym::PackQuantized { .. } => unreachable!("written above"),
        Asym::Gptq { bits, v2 } => {
            let pf = (32 / bits) as usize;
            let mask = (1u32 << bits) - 1;
            let qweight = pack_gptq_rows(k, n, bits, |r, c| u32::from(p.q[c * k + r]));
            // v1 stores z − 1 (a zero of 0 wraps to the all-ones field).
            let stored = |z: u8| {
                if v2 {
                    u32::from(z)
                } else {
                    u32::from(z).wrapping_sub(1) & mask
                }
            };
            let qzeros = pack_gptq_cols(groups, n, bits, |g, c| stored(p.z[c * groups + g]));
            ck.put(
                &format!("{prefix}.qweight"),
                Dtype::I32,
                &[k / pf, n],
                i32_bytes(&qweight),
            );
            ck.put(
                &format!("{prefix}.qzeros"),
                Dtype::I32,
                &[groups, n / pf],
                i32_bytes(&qzeros),
            );
            let g_idx: Vec<i32> = (0..k).map(|kk| (kk / G) as i32).collect();
            ck.put(
                &format!("{prefix}.g_idx"),
                Dtype::I32,
                &[k],
                i32_bytes(&g_idx),
            );
        }
    }
}

/// compressed-tensors: codes packed along K as signed values plus `2^(bits−1)` (moe-quant's
/// `pack_to_int32`, which mirrors the library's), zero points `[n, G]` packed along N the same
/// way (`[ceil(n/pf), G]`, field `t` of word `[r][g]` = row `r·pf + t`), bf16 scales `[n, G]`.
fn put_pack_quantized(ck: &mut Ckpt, prefix: &str, p: &AsymProj, bits: u32) {
    let (n, k, groups) = (p.n, p.k, p.k / G);
    let offset = 1i16 << (bits - 1);
    let signed: Vec<i8> = p.q.iter().map(|&q| (i16::from(q) - offset) as i8).collect();
    let words = moe_quant::pack_to_int32(&signed, n, k, bits).unwrap();
    let pf = (32 / bits) as usize;
    ck.put(
        &format!("{prefix}.weight_packed"),
        Dtype::I32,
        &[n, k / pf],
        i32_bytes(&words),
    );
    // The stored zero field is the signed zero point plus the offset: the unsigned z itself.
    let zp = pack_gptq_rows(n, groups, bits, |r, g| u32::from(p.z[r * groups + g]));
    ck.put(
        &format!("{prefix}.weight_zero_point"),
        Dtype::I32,
        &[n.div_ceil(pf), groups],
        i32_bytes(&zp),
    );
    ck.put(
        &format!("{prefix}.weight_scale"),
        Dtype::BF16,
        &[n, groups],
        checkpoint_support::bf16_bytes(&p.s),
    );
    let shape: Vec<u8> = [n as i64, k as i64]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    ck.put(&format!("{prefix}.weight_shape"), Dtype::I64, &[2], shape);
}

/// A one-layer model of `model_type` in `fmt` with random asymmetric experts; returns it with
/// the logical projections `[expert][gate, up, down]`.
fn build(model_type: &str, fmt: Asym, seed: u64) -> (Ckpt, Vec<[AsymProj; 3]>) {
    let (mut ck, _) = Ckpt::build(model_type, Fmt::Gptq, seed);
    ck.config["quantization_config"] = match fmt {
        Asym::Awq => json!({"quant_method": "awq", "bits": 4, "group_size": G,
                            "zero_point": true, "version": "gemm",
                            "modules_to_not_convert": ["gate"]}),
        Asym::Gptq { bits, v2 } => json!({
            "quant_method": "gptq", "bits": bits, "group_size": G, "desc_act": false,
            "sym": false, "checkpoint_format": if v2 { "gptq_v2" } else { "gptq" }}),
        Asym::PackQuantized { bits } => json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                "weights": {"num_bits": bits, "type": "int", "symmetric": false,
                            "strategy": "group", "group_size": G, "dynamic": false,
                            "actorder": null}}},
            "ignore": ["lm_head", "re:.*mlp.gate$"]}),
    };
    let (block, names) = match model_type {
        "mixtral" => ("block_sparse_moe", ["w1", "w3", "w2"]),
        _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
    };
    let mut rng = SplitMix64::new(seed ^ 0xA5);
    let bits = fmt.bits();
    let mut experts = Vec::new();
    for e in 0..E {
        let ps = [
            AsymProj::random(&mut rng, I, H, bits),
            AsymProj::random(&mut rng, I, H, bits),
            AsymProj::random(&mut rng, H, I, bits),
        ];
        for (p, name) in ps.iter().zip(names) {
            put_asym(
                &mut ck,
                &format!("model.layers.0.{block}.experts.{e}.{name}"),
                p,
                fmt,
            );
        }
        experts.push(ps);
    }
    (ck, experts)
}

/// `x · Wᵀ` in f64.
fn matvec(p: &AsymProj, x: &[f64]) -> Vec<f64> {
    (0..p.n)
        .map(|c| (0..p.k).map(|k| x[k] * p.weight(c, k)).sum())
        .collect()
}

/// The MoE block in f64, on the layer's own routing.
fn reference(
    layer: &MoeLayer,
    experts: &[[AsymProj; 3]],
    x: &[f32],
    logits: &[f32],
    t: usize,
) -> Vec<f64> {
    let mut ids = vec![0i32; t * TOP_K];
    let mut weights = vec![0f32; t * TOP_K];
    layer
        .route(Logits::F32(logits), &mut ids, &mut weights)
        .unwrap();
    let mut out = vec![0f64; t * H];
    for tok in 0..t {
        let xt: Vec<f64> = x[tok * H..][..H].iter().map(|&v| f64::from(v)).collect();
        for j in 0..TOP_K {
            let [gate, up, down] = &experts[ids[tok * TOP_K + j] as usize];
            let g = matvec(gate, &xt);
            let u = matvec(up, &xt);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let y = matvec(down, &a);
            let w = f64::from(weights[tok * TOP_K + j]);
            for (o, v) in out[tok * H..][..H].iter_mut().zip(&y) {
                *o += w * v;
            }
        }
    }
    out
}

/// Loads `ck`, checks the kernel label and compares a few token counts with the reference.
fn check(ck: &Ckpt, experts: &[[AsymProj; 3]], tag: &str) {
    let dir = temp_dir(tag);
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    let info = layer.backend().unwrap();
    assert!(info.kernel.starts_with("cpu-wna16/"), "{tag}: {info:?}");
    let tol = wna16_tolerance(&info.ops);
    let mut rng = SplitMix64::new(7);
    for t in [1, 5, 16] {
        let x = rng.vec_uniform(t * H, -2.0, 2.0);
        let logits = rng.vec_uniform(t * E, -1.0, 1.0);
        let mut out = vec![0f32; t * H];
        layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
        let want = reference(&layer, experts, &x, &logits, t);
        let (mut num, mut den) = (0f64, 0f64);
        for (g, w) in out.iter().zip(&want) {
            num += (f64::from(*g) - w).powi(2);
            den += w.powi(2);
        }
        let rel = (num / den).sqrt();
        assert!(rel < tol, "{tag} t={t}: rel L2 {rel} (tolerance {tol:e})");
    }
}

#[test]
fn awq_runs_with_its_zero_points() {
    let (ck, experts) = build("qwen3_moe", Asym::Awq, 31);
    check(&ck, &experts, "asym-awq");
}

#[test]
fn awq_reads_mixtral_names() {
    let (ck, experts) = build("mixtral", Asym::Awq, 32);
    check(&ck, &experts, "asym-awq-mixtral");
}

#[test]
fn asymmetric_gptq_runs_in_both_zero_conventions() {
    for (v2, tag) in [(false, "asym-gptq-v1"), (true, "asym-gptq-v2")] {
        let (ck, experts) = build("qwen3_moe", Asym::Gptq { bits: 4, v2 }, 33);
        check(&ck, &experts, tag);
    }
}

#[test]
fn asymmetric_pack_quantized_runs_with_its_zero_points() {
    for (bits, tag) in [(4, "asym-pack-4"), (8, "asym-pack-8")] {
        let (ck, experts) = build("qwen3_moe", Asym::PackQuantized { bits }, 42);
        check(&ck, &experts, tag);
    }
}

/// Act-order (`desc_act`) with zero points: columns of a group are scattered over K, and both
/// the scale and the zero point of a weight are those of its column's group.
#[test]
fn asymmetric_gptq_with_act_order_runs() {
    let (mut ck, mut experts) = build("qwen3_moe", Asym::Gptq { bits: 4, v2: false }, 44);
    ck.config["quantization_config"]["desc_act"] = json!(true);
    let groups = H / G;
    let g_idx: Vec<usize> = (0..H).map(|k| k % groups).collect();
    let stored: Vec<i32> = g_idx.iter().map(|&g| g as i32).collect();
    for (e, projs) in experts.iter_mut().enumerate() {
        for (p, name) in projs.iter_mut().zip(["gate_proj", "up_proj"]) {
            p.g_idx = g_idx.clone();
            ck.put(
                &format!("model.layers.0.mlp.experts.{e}.{name}.g_idx"),
                Dtype::I32,
                &[H],
                i32_bytes(&stored),
            );
        }
    }
    assert_eq!(I, G, "down_proj has one group, so its g_idx is trivial");
    check(&ck, &experts, "asym-gptq-actorder");
}

#[test]
fn eight_bit_asymmetric_gptq_runs() {
    let (ck, experts) = build("qwen3_moe", Asym::Gptq { bits: 8, v2: false }, 34);
    check(&ck, &experts, "asym-gptq-8bit");
}

/// Zero points are read `[n, G]` and sliced for tensor parallelism exactly like the scales.
#[test]
fn zero_points_follow_the_scales_under_tensor_parallelism() {
    let (ck, experts) = build("qwen3_moe", Asym::Awq, 35);
    let dir = temp_dir("asym-awq-tp");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let t = ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
    let StoredExperts::Int(q) = &t.experts.weights else {
        panic!("integer weights expected");
    };
    let z = q.zeros.as_ref().expect("zero points");
    let (g13, g2) = (H / G, I / G);
    assert_eq!(z.w13.len(), E * 2 * I * g13);
    assert_eq!(z.w2.len(), E * H * g2);
    for (e, [gate, up, down]) in experts.iter().enumerate() {
        assert_eq!(&z.w13[e * 2 * I * g13..][..I * g13], gate.z.as_slice());
        assert_eq!(&z.w13[(e * 2 + 1) * I * g13..][..I * g13], up.z.as_slice());
        assert_eq!(&z.w2[e * H * g2..][..H * g2], down.z.as_slice());
        // Codes are signed q − 8.
        let codes: Vec<i8> = gate.q.iter().map(|&q| q as i8 - 8).collect();
        assert_eq!(&q.w13[e * 2 * I * H..][..I * H], codes.as_slice());
    }
    // Two ranks, groups of 4 so that each rank's I/2 = 4 columns of w2 are one whole group:
    // gate/up keep their rows' zero points, w2 its columns' groups.
    let (ck2, experts2) = build_with_group("qwen3_moe", 36, 4);
    let dir = temp_dir("asym-awq-tp2");
    ck2.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    for rank in 0..2 {
        let opts = ReadOptions::single_rank().with_tensor_parallel(rank, 2);
        let t = ckpt.read_layer(0, &opts).unwrap();
        let StoredExperts::Int(q) = &t.experts.weights else {
            panic!("integer weights expected");
        };
        let z = q.zeros.as_ref().unwrap();
        let (il, g13, g2l, g2) = (I / 2, H / 4, I / 2 / 4, I / 4);
        for (e, [gate, up, down]) in experts2.iter().enumerate() {
            let rows = rank * il * g13..(rank + 1) * il * g13;
            assert_eq!(
                &z.w13[e * 2 * il * g13..][..il * g13],
                &gate.z[rows.clone()]
            );
            assert_eq!(&z.w13[(e * 2 + 1) * il * g13..][..il * g13], &up.z[rows]);
            for c in 0..H {
                let want = &down.z[c * g2 + rank * g2l..][..g2l];
                assert_eq!(&z.w2[(e * H + c) * g2l..][..g2l], want);
            }
        }
    }
}

/// [`build`] with a group size other than the shared `G` (AWQ only).
fn build_with_group(model_type: &str, seed: u64, group: usize) -> (Ckpt, Vec<[AsymProj; 3]>) {
    let (mut ck, _) = Ckpt::build(model_type, Fmt::Gptq, seed);
    ck.config["quantization_config"] = json!({"quant_method": "awq", "bits": 4,
        "group_size": group, "zero_point": true, "version": "gemm"});
    let mut rng = SplitMix64::new(seed);
    let mut experts = Vec::new();
    for e in 0..E {
        let mk = |rng: &mut SplitMix64, n: usize, k: usize| {
            let groups = k / group;
            AsymProj {
                n,
                k,
                q: (0..n * k).map(|_| rng.range_i64(0, 15) as u8).collect(),
                z: (0..n * groups)
                    .map(|_| rng.range_i64(0, 15) as u8)
                    .collect(),
                s: (0..n * groups).map(|_| 1.0 / 64.0).collect(),
                g_idx: (0..k).map(|kk| kk / group).collect(),
            }
        };
        let ps = [mk(&mut rng, I, H), mk(&mut rng, I, H), mk(&mut rng, H, I)];
        for (p, name) in ps.iter().zip(["gate_proj", "up_proj", "down_proj"]) {
            let prefix = format!("model.layers.0.mlp.experts.{e}.{name}");
            for suffix in ["qweight", "qzeros", "scales", "g_idx"] {
                ck.tensors.remove(&format!("{prefix}.{suffix}"));
            }
            let (n, k, groups) = (p.n, p.k, p.k / group);
            let qweight = pack_awq(k, n, |r, c| p.q[c * k + r]);
            let qzeros = pack_awq(groups, n, |g, c| p.z[c * groups + g]);
            let scales: Vec<u8> = (0..groups * n)
                .flat_map(|_| half::f16::from_f32(1.0 / 64.0).to_le_bytes())
                .collect();
            ck.put(
                &format!("{prefix}.qweight"),
                Dtype::I32,
                &[k, n / 8],
                i32_bytes(&qweight),
            );
            ck.put(
                &format!("{prefix}.qzeros"),
                Dtype::I32,
                &[groups, n / 8],
                i32_bytes(&qzeros),
            );
            ck.put(
                &format!("{prefix}.scales"),
                Dtype::F16,
                &[groups, n],
                scales,
            );
        }
        experts.push(ps);
    }
    (ck, experts)
}

#[test]
fn a_wrong_qzeros_shape_is_named() {
    for (fmt, tag) in [
        (Asym::Awq, "asym-bad-qzeros-awq"),
        (Asym::Gptq { bits: 4, v2: false }, "asym-bad-qzeros-gptq"),
    ] {
        let (mut ck, _) = build("qwen3_moe", fmt, 37);
        let name = "model.layers.0.mlp.experts.2.down_proj.qzeros";
        // down_proj: n = H, k = I = one group; store two group rows instead of one.
        let words = H / 8;
        ck.put(
            name,
            Dtype::I32,
            &[2, words],
            i32_bytes(&vec![0; 2 * words]),
        );
        let dir = temp_dir(tag);
        ck.write(&dir);
        let err = Checkpoint::open(&dir, ShardAccess::Read)
            .and_then(|c| MoeLayer::from_checkpoint(&c, 0, 16))
            .unwrap_err();
        match &err {
            LayerError::WrongShape {
                tensor,
                expected,
                actual,
                ..
            } => {
                assert_eq!(tensor, name, "{tag}");
                assert_eq!(expected, &vec![1, words], "{tag}");
                assert_eq!(actual, &vec![2, words], "{tag}");
            }
            other => panic!("{tag}: {other:?}"),
        }
    }
}

#[test]
fn a_wrong_weight_zero_point_shape_is_named() {
    let (mut ck, _) = build("qwen3_moe", Asym::PackQuantized { bits: 4 }, 43);
    let name = "model.layers.0.mlp.experts.1.down_proj.weight_zero_point";
    // down_proj: n = H rows packed 8 per word, one group; stored unpacked instead.
    ck.put(name, Dtype::I32, &[H, 1], i32_bytes(&[0; H]));
    let dir = temp_dir("asym-pack-bad-zp");
    ck.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .and_then(|c| MoeLayer::from_checkpoint(&c, 0, 16))
        .unwrap_err();
    match &err {
        LayerError::WrongShape {
            tensor,
            expected,
            actual,
            ..
        } => {
            assert_eq!(tensor, name);
            assert_eq!(expected, &vec![H / 8, 1]);
            assert_eq!(actual, &vec![H, 1]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_awq_tensors_are_refused_by_name() {
    // qzeros stored as f16 instead of int32.
    let (mut ck, _) = build("qwen3_moe", Asym::Awq, 38);
    let name = "model.layers.0.mlp.experts.0.gate_proj.qzeros";
    ck.put(
        name,
        Dtype::F16,
        &[H / G, I / 8],
        vec![0; 2 * (H / G) * (I / 8)],
    );
    let dir = temp_dir("asym-awq-qzeros-dtype");
    ck.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .and_then(|c| c.read_layer(0, &ReadOptions::single_rank()))
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::WrongDtype { tensor, .. } if tensor == name),
        "{err:?}"
    );

    // qweight packed along K (GPTQ's layout) instead of along N.
    let (mut ck, _) = build("qwen3_moe", Asym::Awq, 39);
    let name = "model.layers.0.mlp.experts.1.up_proj.qweight";
    ck.put(name, Dtype::I32, &[H / 8, I], i32_bytes(&[0; H / 8 * I]));
    let dir = temp_dir("asym-awq-qweight-shape");
    ck.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .and_then(|c| c.read_layer(0, &ReadOptions::single_rank()))
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::ConfigMismatch { tensor, .. } if tensor == name),
        "{err:?}"
    );

    // A missing qzeros tensor.
    let (mut ck, _) = build("qwen3_moe", Asym::Gptq { bits: 4, v2: true }, 40);
    let name = "model.layers.0.mlp.experts.3.down_proj.qzeros";
    ck.tensors.remove(name);
    let dir = temp_dir("asym-gptq-no-qzeros");
    ck.write(&dir);
    let err = Checkpoint::open(&dir, ShardAccess::Read)
        .and_then(|c| c.read_layer(0, &ReadOptions::single_rank()))
        .unwrap_err();
    assert!(
        matches!(&err, LayerError::MissingTensor { tensor, .. } if tensor == name),
        "{err:?}"
    );
}

#[test]
fn awq_configs_outside_the_gemm_packing_are_refused() {
    for (patch, what) in [
        (json!({"version": "gemv"}), "gemv"),
        (json!({"zero_point": false}), "zero_point"),
        (json!({"bits": 8}), "bits"),
    ] {
        let (mut ck, _) = build("qwen3_moe", Asym::Awq, 41);
        for (k, v) in patch.as_object().unwrap() {
            ck.config["quantization_config"][k] = v.clone();
        }
        let dir = temp_dir(&format!("asym-awq-cfg-{what}"));
        ck.write(&dir);
        let err = Checkpoint::open(&dir, ShardAccess::Read).unwrap_err();
        match &err {
            LayerError::UnsupportedScheme { scheme, reason, .. } => {
                assert_eq!(scheme, "awq");
                assert!(reason.contains(what), "{what}: {reason}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}
