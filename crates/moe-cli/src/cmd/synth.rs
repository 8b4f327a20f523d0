//! Seeded synthetic MoE layers: random expert weights quantized to int4 in groups and packed
//! into a [`FusedMoe<PackedW4A8>`] (or in the other formats `moe bench` times), with a
//! progress bar per expert.
//!
//! [`normal_layer`] draws f32 weights (normal · 0.02, like a freshly initialised model),
//! quantizes them the way compressed-tensors does and keeps the bf16 scales for the f32
//! reference; [`random_codes_layer`] draws int4 codes and scales directly, which is all a
//! benchmark needs and much faster for gigabytes of weights; [`random_int8_layer`],
//! [`random_wna16_layer`] and [`random_dense_layer`] do the same for int8 codes with
//! per-channel scales, weight-only int4/int8 codes (with or without zero points) and float
//! weights. [`fill_codes`] and [`fill_small`] are the draws the layer benchmark also loads.

use half::bf16;
use indicatif::ProgressBar;
use moe_kernels::moe::ExpertMatrix;
use moe_kernels::{
    Activation, FP8_BLOCK, Fp8Desc, Fp8Rows, Fp8Scales, FusedMoe, FusedMoeConfig, GateUpLayout,
    Mxfp4Desc, PackedDense, PackedExperts, PackedW4A8, PackedW8A8, PackedWna16, W4A8Scales,
    Wna16Desc, Wna16Scales, kernels,
};
use moe_quant::{WeightGroups, quantize_int4_grouped};
use rayon::prelude::*;

use super::CliError;

/// A small, fast, seedable generator (SplitMix64); statistical quality is ample for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`, decorrelated from neighbouring seeds by one mixing round.
    pub fn new(seed: u64) -> Self {
        let mut r = Self(seed ^ 0x5851_F42D_4C95_7F2D);
        r.next_u64();
        r
    }

    /// The generator of stream `index` of `seed` (one per expert, so experts can be built in
    /// parallel and still reproduce).
    pub fn stream(seed: u64, index: u64) -> Self {
        Self::new(seed.wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`.
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 1.0) / (1u64 << 24) as f32
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Fills `out` with standard normal values times `scale` (Box–Muller, two per draw).
    pub fn fill_normal(&mut self, out: &mut [f32], scale: f32) {
        for pair in out.chunks_mut(2) {
            let r = (-2.0 * self.unit().ln()).sqrt() * scale;
            let (s, c) = (std::f32::consts::TAU * self.unit()).sin_cos();
            pair[0] = r * c;
            if let Some(second) = pair.get_mut(1) {
                *second = r * s;
            }
        }
    }
}

/// The sizes of a synthetic layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerShape {
    /// Experts E.
    pub experts: usize,
    /// Hidden size H.
    pub hidden: usize,
    /// Intermediate size I.
    pub intermediate: usize,
    /// Int4 group size (a multiple of 32 dividing H and I).
    pub group_size: usize,
}

impl LayerShape {
    /// Rejects sizes the packer would refuse, with a message naming the option.
    pub fn validate(&self) -> Result<(), CliError> {
        let LayerShape {
            experts,
            hidden,
            intermediate,
            group_size,
        } = *self;
        if experts == 0 || hidden == 0 || intermediate == 0 {
            return Err(CliError(
                "--experts, --hidden and --intermediate must be positive".into(),
            ));
        }
        if group_size == 0 || group_size % 32 != 0 {
            return Err(CliError(format!(
                "--group-size {group_size} must be a positive multiple of 32"
            )));
        }
        for (name, v) in [("--hidden", hidden), ("--intermediate", intermediate)] {
            if v % group_size != 0 {
                return Err(CliError(format!(
                    "{name} {v} is not a multiple of --group-size {group_size}"
                )));
            }
        }
        Ok(())
    }
}

/// One expert's int4 codes and scales as the packed weights hold them (scales rounded to bf16,
/// widened back to f32), handed to the caller of [`normal_layer`] while they exist.
#[derive(Debug)]
pub struct ExpertQuant<'a> {
    /// Expert index.
    pub expert: usize,
    /// `[2I, H]` gate/up codes.
    pub w13_codes: &'a [i8],
    /// `[2I, H/g]` scales.
    pub w13_scales: &'a [f32],
    /// `[H, I]` down codes.
    pub w2_codes: &'a [i8],
    /// `[H, I/g]` scales.
    pub w2_scales: &'a [f32],
}

/// A packed synthetic layer (W4A8 unless said otherwise).
#[derive(Debug)]
pub struct SynthLayer<W = PackedW4A8> {
    /// The layer, ready to apply.
    pub moe: FusedMoe<W>,
    /// Packed bytes of one expert (gate/up plus down): the memory a call reads per expert.
    pub expert_bytes: usize,
}

/// Packs an `[n, k]` int4 matrix with bf16 group scales, in the dispatched kernels' panel
/// order.
fn pack(
    n: usize,
    k: usize,
    codes: &[i8],
    scales: &[bf16],
    g: usize,
) -> Result<PackedW4A8, CliError> {
    PackedW4A8::pack(
        n,
        k,
        codes,
        W4A8Scales::Grouped {
            group_size: g,
            scales,
        },
        None,
    )
    .map(|w| w.with_order(kernels().panel_order()))
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// Quantizes an `[n, k]` f32 matrix to int4 in groups of `g`: its codes and its scales rounded
/// to bf16 (the format the kernels and a checkpoint hold them in).
fn quantize(w: &[f32], n: usize, k: usize, g: usize) -> Result<(Vec<i8>, Vec<bf16>), CliError> {
    let q = quantize_int4_grouped(w, n, k, Some(g))
        .map_err(|e| CliError::context("quantizing expert weights", e))?;
    let scales: Vec<bf16> = q.scales.iter().map(|&s| bf16::from_f32(s)).collect();
    Ok((q.codes, scales))
}

/// One expert of [`normal_layer`], quantized: int4 codes and bf16 group scales of its fused
/// gate/up `[2I, H]` (gate rows first) and down `[H, I]` projections.
#[derive(Debug, Clone)]
pub struct NormalExpert {
    /// `[2I, H]` codes in `[-8, 7]`.
    pub w13_codes: Vec<i8>,
    /// `[2I, H/g]` scales.
    pub w13_scales: Vec<bf16>,
    /// `[H, I]` codes.
    pub w2_codes: Vec<i8>,
    /// `[H, I/g]` scales.
    pub w2_scales: Vec<bf16>,
}

impl NormalExpert {
    /// Draws expert `e` of a [`normal_layer`] of `shape` (normal(0, 0.02) f32 weights from the
    /// expert's own stream of `seed`) and quantizes it to int4 with bf16 group scales.
    pub fn draw(shape: LayerShape, seed: u64, e: usize) -> Result<Self, CliError> {
        let (h, i, g) = (shape.hidden, shape.intermediate, shape.group_size);
        let mut rng = Rng::stream(seed, e as u64);
        let mut w13 = vec![0.0f32; 2 * i * h];
        rng.fill_normal(&mut w13, 0.02);
        let (w13_codes, w13_scales) = quantize(&w13, 2 * i, h, g)?;
        drop(w13);
        let mut w2 = vec![0.0f32; h * i];
        rng.fill_normal(&mut w2, 0.02);
        let (w2_codes, w2_scales) = quantize(&w2, h, i, g)?;
        Ok(Self {
            w13_codes,
            w13_scales,
            w2_codes,
            w2_scales,
        })
    }

    /// Its codes and scales as the reference reads them (scales widened to f32), for `visit`.
    pub fn visit<T>(&self, expert: usize, visit: impl Fn(ExpertQuant<'_>) -> T) -> T {
        let widen = |s: &[bf16]| -> Vec<f32> { s.iter().map(|v| v.to_f32()).collect() };
        visit(ExpertQuant {
            expert,
            w13_codes: &self.w13_codes,
            w13_scales: &widen(&self.w13_scales),
            w2_codes: &self.w2_codes,
            w2_scales: &widen(&self.w2_scales),
        })
    }
}

/// The fused-pipeline configuration of a synthetic layer: SiLU, concatenated gate/up.
fn config(shape: LayerShape) -> FusedMoeConfig {
    FusedMoeConfig {
        hidden_size: shape.hidden,
        intermediate_size: shape.intermediate,
        activation: Activation::SILU,
        gate_up_layout: GateUpLayout::Concatenated,
        apply_router_weight_on_input: false,
        global_num_experts: shape.experts,
        expert_map: None,
    }
}

/// Builds the layer from per-expert `(w13, w2)` pairs; `bytes` measures one packed matrix.
fn assemble<W: ExpertMatrix>(
    shape: LayerShape,
    experts: Vec<(W, W)>,
    bytes: impl Fn(&W) -> usize,
) -> Result<SynthLayer<W>, CliError> {
    assemble_with(config(shape), experts, bytes)
}

/// [`assemble`] with a configuration of the caller's.
fn assemble_with<W: ExpertMatrix>(
    cfg: FusedMoeConfig,
    experts: Vec<(W, W)>,
    bytes: impl Fn(&W) -> usize,
) -> Result<SynthLayer<W>, CliError> {
    let expert_bytes = experts.first().map_or(0, |(a, b)| bytes(a) + bytes(b));
    let (w13, w2): (Vec<_>, Vec<_>) = experts.into_iter().unzip();
    let weights = PackedExperts {
        w13,
        w2,
        w13_bias: None,
        w2_bias: None,
    };
    let moe = FusedMoe::new(weights, cfg, *kernels())
        .map_err(|e| CliError::context("building the fused layer", e))?;
    Ok(SynthLayer { moe, expert_bytes })
}

/// A layer of normal(0, 0.02) f32 weights quantized to int4 with bf16 group scales; experts
/// are built in parallel on the current rayon pool, ticking `bar` once per expert. `visit`
/// sees every expert's codes and scales before they are dropped (the demo's reference uses
/// it), and its results are returned in expert order.
pub fn normal_layer<T: Send>(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
    visit: impl Fn(ExpertQuant<'_>) -> T + Sync,
) -> Result<(SynthLayer, Vec<T>), CliError> {
    shape.validate()?;
    let (h, i, g) = (shape.hidden, shape.intermediate, shape.group_size);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let q = NormalExpert::draw(shape, seed, e)?;
            let seen = q.visit(e, &visit);
            let p13 = pack(2 * i, h, &q.w13_codes, &q.w13_scales, g)?;
            let p2 = pack(h, i, &q.w2_codes, &q.w2_scales, g)?;
            bar.inc(1);
            Ok(((p13, p2), seen))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let (packed, seen): (Vec<_>, Vec<_>) = experts.into_iter().unzip();
    Ok((assemble(shape, packed, PackedW4A8::packed_bytes)?, seen))
}

/// Random int4 codes and bf16 scales for an `[n, k]` matrix, packed.
fn random_packed(rng: &mut Rng, n: usize, k: usize, g: usize) -> Result<PackedW4A8, CliError> {
    let mut codes = vec![0i8; n * k];
    for chunk in codes.chunks_mut(16) {
        let bits = rng.next_u64();
        for (j, c) in chunk.iter_mut().enumerate() {
            *c = ((bits >> (4 * j)) & 0xF) as i8 - 8;
        }
    }
    let scales: Vec<bf16> = (0..n * (k / g))
        .map(|_| bf16::from_f32(0.001 + (rng.next_u64() % 1000) as f32 * 2e-6))
        .collect();
    pack(n, k, &codes, &scales, g)
}

/// A layer of uniformly random int4 codes and scales; experts are
/// built in parallel on the current rayon pool, ticking `bar` once per expert.
pub fn random_codes_layer(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer, CliError> {
    shape.validate()?;
    let (h, i, g) = (shape.hidden, shape.intermediate, shape.group_size);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_packed(&mut rng, 2 * i, h, g)?;
            let p2 = random_packed(&mut rng, h, i, g)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedW4A8::packed_bytes)
}

/// The weight-only (WNA16) codes of a synthetic layer: bits per code and whether every scale
/// group carries a zero point (asymmetric, as GPTQ `sym: false` and AWQ checkpoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wna16Codes {
    /// Bits per code, 4 or 8.
    pub bits: u32,
    /// Asymmetric codes with a zero point per scale group.
    pub zero_points: bool,
}

/// Fills `out` with uniformly random `bits`-bit unsigned codes (4 or 8), several per draw.
pub fn fill_codes(rng: &mut Rng, bits: u32, out: &mut [u8]) {
    let per_draw = (64 / bits) as usize;
    let mask = (1u64 << bits) - 1;
    for chunk in out.chunks_mut(per_draw) {
        let draw = rng.next_u64();
        for (j, c) in chunk.iter_mut().enumerate() {
            *c = ((draw >> (bits as usize * j)) & mask) as u8;
        }
    }
}

/// Fills `out` with small uniformly random floats in `[-0.02, 0.02)`, four per draw (the
/// values change no work; they only have to be finite and of a weight's size).
pub fn fill_small(rng: &mut Rng, out: &mut [f32]) {
    for chunk in out.chunks_mut(4) {
        let draw = rng.next_u64();
        for (j, v) in chunk.iter_mut().enumerate() {
            let bits = (draw >> (16 * j)) & 0xFFFF;
            *v = (bits as f32 / 65536.0 - 0.5) * 0.04;
        }
    }
}

/// Random `bits`-bit unsigned codes, bf16 group scales and, when asked, zero points for an
/// `[n, k]` weight-only matrix, packed.
fn random_wna16_packed(
    rng: &mut Rng,
    n: usize,
    k: usize,
    g: usize,
    codes_of: Wna16Codes,
) -> Result<PackedWna16, CliError> {
    let mut codes = vec![0u8; n * k];
    fill_codes(rng, codes_of.bits, &mut codes);
    let scales: Vec<bf16> = (0..n * (k / g))
        .map(|_| bf16::from_f32(0.001 + (rng.next_u64() % 1000) as f32 * 2e-6))
        .collect();
    let zeros = codes_of.zero_points.then(|| {
        let mut z = vec![0u8; n * (k / g)];
        fill_codes(rng, codes_of.bits, &mut z);
        z
    });
    PackedWna16::pack(Wna16Desc {
        n,
        k,
        bits: codes_of.bits,
        codes: &codes,
        group_size: WeightGroups::groups(g).map_err(|e| CliError::context("--group-size", e))?,
        scales: Wna16Scales::Bf16(&scales),
        zeros: zeros.as_deref(),
        bias: None,
        perm: None,
    })
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// A weight-only (WNA16) layer of uniformly random int4 or int8 codes, bf16 group scales and
/// optional zero points, run with float activations on the native WNA16 kernels; experts are
/// built in parallel on the current rayon pool, ticking `bar` once per expert.
pub fn random_wna16_layer(
    shape: LayerShape,
    codes_of: Wna16Codes,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedWna16>, CliError> {
    shape.validate()?;
    let (h, i, g) = (shape.hidden, shape.intermediate, shape.group_size);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_wna16_packed(&mut rng, 2 * i, h, g, codes_of)?;
            let p2 = random_wna16_packed(&mut rng, h, i, g, codes_of)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedWna16::packed_bytes)
}

/// An unquantized layer of small random weights, kept in bf16 or in f32, run on the dense
/// f32-compute GEMM; `shape.group_size` is not used. Experts are built in parallel on the
/// current rayon pool, ticking `bar` once per expert.
pub fn random_dense_layer(
    shape: LayerShape,
    bf16_weights: bool,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedDense>, CliError> {
    let (h, i) = (shape.hidden, shape.intermediate);
    if shape.experts == 0 || h == 0 || i == 0 {
        return Err(CliError(
            "--experts, --hidden and --intermediate must be positive".into(),
        ));
    }
    let pack = |rng: &mut Rng, n: usize, k: usize| {
        let mut w = vec![0f32; n * k];
        fill_small(rng, &mut w);
        if bf16_weights {
            let w: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            PackedDense::pack_bf16(n, k, &w)
        } else {
            PackedDense::pack_f32(n, k, &w)
        }
        .map_err(|e| CliError::context("packing expert weights", e))
    };
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = pack(&mut rng, 2 * i, h)?;
            let p2 = pack(&mut rng, h, i)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedDense::packed_bytes)
}

/// Random e2m1 codes and e8m0 scales (`2^-9..2^-6`) for an `[n, k]` MXFP4 matrix, packed
/// from the checkpoint's byte layout as a load does.
fn random_mxfp4_packed(rng: &mut Rng, n: usize, k: usize) -> Result<PackedWna16, CliError> {
    let (blocks, scales) = random_mxfp4_bytes(rng, n, k);
    PackedWna16::pack_mxfp4(Mxfp4Desc {
        n,
        k,
        blocks: &blocks,
        scales: &scales,
        bias: None,
    })
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// Random MXFP4 bytes of an `[n, k]` matrix as a checkpoint stores them: blocks
/// `[n, ceil(k/32), 16]` of uniformly random e2m1 codes and e8m0 scales `[n, ceil(k/32)]`
/// (`2^-9..2^-6`).
pub fn random_mxfp4_bytes(rng: &mut Rng, n: usize, k: usize) -> (Vec<u8>, Vec<u8>) {
    let blocks_per_row = k.div_ceil(moe_kernels::packed::wna16::MXFP4_BLOCK);
    let mut blocks = vec![0u8; n * blocks_per_row * 16];
    for chunk in blocks.chunks_mut(8) {
        let bits = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&bits[..chunk.len()]);
    }
    let scales: Vec<u8> = (0..n * blocks_per_row)
        .map(|_| 118 + (rng.next_u64() % 4) as u8)
        .collect();
    (blocks, scales)
}

/// An MXFP4 layer of uniformly random e2m1 codes and e8m0 scales, as gpt-oss runs it
/// (SwiGLU-OAI on interleaved gate/up rows, clamp 7), on the native WNA16 kernels; experts
/// are built in parallel on the current rayon pool, ticking `bar` once per expert.
pub fn random_mxfp4_layer(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedWna16>, CliError> {
    shape.validate()?;
    let (h, i) = (shape.hidden, shape.intermediate);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_mxfp4_packed(&mut rng, 2 * i, h)?;
            let p2 = random_mxfp4_packed(&mut rng, h, i)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    let cfg = FusedMoeConfig {
        activation: Activation::SWIGLU_OAI,
        gate_up_layout: GateUpLayout::Interleaved,
        ..config(shape)
    };
    assemble_with(cfg, experts, PackedWna16::packed_bytes)
}

/// Random e4m3 codes (any byte but the two NaNs) with f32 scales per `128 × 128` block for an
/// `[n, k]` matrix, packed as FP8 block-quantized weights.
pub fn random_fp8_packed(rng: &mut Rng, n: usize, k: usize) -> Result<PackedWna16, CliError> {
    let mut codes = vec![0u8; n * k];
    for chunk in codes.chunks_mut(8) {
        let bits = rng.next_u64().to_le_bytes();
        for (c, b) in chunk.iter_mut().zip(bits) {
            *c = if b & 0x7F == 0x7F { b & 0xF0 } else { b };
        }
    }
    let blocks = n.div_ceil(FP8_BLOCK) * k.div_ceil(FP8_BLOCK);
    let scales: Vec<f32> = (0..blocks)
        .map(|_| 1e-4 + (rng.next_u64() % 1000) as f32 * 1e-7)
        .collect();
    PackedWna16::pack_fp8(Fp8Desc {
        n,
        k,
        rows: &[Fp8Rows {
            channels: n,
            codes: &codes,
            scales: Fp8Scales::Blocks(&scales),
        }],
        bias: None,
    })
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// An FP8 block-quantized layer of random e4m3 codes, run with float activations on the native
/// WNA16 kernels (any H and I; the group size of `shape` is not used); experts are built in
/// parallel on the current rayon pool, ticking `bar` once per expert.
pub fn random_fp8_layer(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedWna16>, CliError> {
    if shape.experts == 0 || shape.hidden == 0 || shape.intermediate == 0 {
        return Err(CliError(
            "--experts, --hidden and --intermediate must be positive".into(),
        ));
    }
    let (h, i) = (shape.hidden, shape.intermediate);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_fp8_packed(&mut rng, 2 * i, h)?;
            let p2 = random_fp8_packed(&mut rng, h, i)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedWna16::packed_bytes)
}

/// An `[n, k]` matrix of uniformly random int8 codes in `[-127, 127]` (spec §5.1's range) with
/// per-channel scales in `[0.5, 1.5) / 127`.
fn random_int8_packed(rng: &mut Rng, n: usize, k: usize) -> Result<PackedW8A8, CliError> {
    let codes: Vec<i8> = (0..n * k)
        .map(|_| (rng.below(255) as i32 - 127) as i8)
        .collect();
    let scales: Vec<f32> = (0..n).map(|_| (0.5 + rng.unit()) / 127.0).collect();
    PackedW8A8::pack(n, k, &codes, &scales)
        .map(|w| w.with_order(kernels().panel_order()))
        .map_err(|e| CliError::context("packing expert weights", e))
}

/// A W8A8 layer of uniformly random int8 codes with per-channel scales (the online int8
/// scheme, spec §5); `shape.group_size` is not used. Experts are built in parallel on the
/// current rayon pool, ticking `bar` once per expert.
pub fn random_int8_layer(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedW8A8>, CliError> {
    let (h, i) = (shape.hidden, shape.intermediate);
    if shape.experts == 0 || h == 0 || i == 0 {
        return Err(CliError(
            "--experts, --hidden and --intermediate must be positive".into(),
        ));
    }
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_int8_packed(&mut rng, 2 * i, h)?;
            let p2 = random_int8_packed(&mut rng, h, i)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedW8A8::packed_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_values_have_the_requested_spread() {
        let mut v = vec![0.0f32; 100_001];
        Rng::new(7).fill_normal(&mut v, 0.02);
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 1e-3, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 1e-3, "std {}", var.sqrt());
    }

    #[test]
    fn shapes_the_packer_refuses_are_rejected_with_the_option_name() {
        let bad = LayerShape {
            experts: 2,
            hidden: 100,
            intermediate: 64,
            group_size: 32,
        };
        assert!(bad.validate().unwrap_err().0.contains("--hidden"));
    }
}
