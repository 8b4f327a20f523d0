//! Seeded synthetic MoE layers: random expert weights quantized to int4 in groups and packed
//! into a [`FusedMoe<PackedW4A8>`] (or int8 per channel, for the W8A8 benchmark), with a
//! progress bar per expert.
//!
//! Three generators: [`normal_layer`] draws f32 weights (normal · 0.02, like a freshly
//! initialised model), quantizes them the way compressed-tensors does and keeps the bf16
//! scales for the f32 reference; [`random_codes_layer`] draws int4 codes and scales directly,
//! which is all a benchmark needs and much faster for gigabytes of weights;
//! [`random_int8_layer`] does the same for int8 codes with per-channel scales, and
//! [`random_fp8_layer`] for e4m3 codes with `128 × 128` block scales.

use half::bf16;
use indicatif::ProgressBar;
use moe_kernels::moe::ExpertMatrix;
use moe_kernels::{
    Activation, ExpertWeights, FP8_BLOCK, Fp8BlockDesc, Fp8BlockRows, FusedMoe, FusedMoeConfig,
    GateUpLayout, PackedW4A8, PackedW8A8, PackedWna16, W4A8Scales, Wna16Desc, Wna16Scales, kernels,
};
use moe_quant::quantize_int4_grouped;
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

/// Packs an `[n, k]` int4 matrix with bf16 group scales.
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
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// Quantizes an `[n, k]` f32 matrix to int4 in groups of `g`, returning the packed matrix, its
/// codes and its scales as the kernel sees them (rounded to bf16, widened back to f32).
fn quantize_and_pack(
    w: &[f32],
    n: usize,
    k: usize,
    g: usize,
) -> Result<(PackedW4A8, Vec<i8>, Vec<f32>), CliError> {
    let q = quantize_int4_grouped(w, n, k, Some(g))
        .map_err(|e| CliError::context("quantizing expert weights", e))?;
    let scales: Vec<bf16> = q.scales.iter().map(|&s| bf16::from_f32(s)).collect();
    let packed = pack(n, k, &q.codes, &scales, g)?;
    Ok((packed, q.codes, scales.iter().map(|s| s.to_f32()).collect()))
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
    let expert_bytes = experts.first().map_or(0, |(a, b)| bytes(a) + bytes(b));
    let (w13, w2): (Vec<_>, Vec<_>) = experts.into_iter().unzip();
    let weights = ExpertWeights {
        w13,
        w2,
        w13_bias: None,
        w2_bias: None,
    };
    let moe = FusedMoe::new(weights, config(shape), *kernels())
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
            let mut rng = Rng::stream(seed, e as u64);
            let mut w13 = vec![0.0f32; 2 * i * h];
            rng.fill_normal(&mut w13, 0.02);
            let (p13, c13, s13) = quantize_and_pack(&w13, 2 * i, h, g)?;
            drop(w13);
            let mut w2 = vec![0.0f32; h * i];
            rng.fill_normal(&mut w2, 0.02);
            let (p2, c2, s2) = quantize_and_pack(&w2, h, i, g)?;
            let seen = visit(ExpertQuant {
                expert: e,
                w13_codes: &c13,
                w13_scales: &s13,
                w2_codes: &c2,
                w2_scales: &s2,
            });
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

/// Random unsigned int4 codes and bf16 group scales for an `[n, k]` weight-only matrix, packed.
fn random_wna16_packed(
    rng: &mut Rng,
    n: usize,
    k: usize,
    g: usize,
) -> Result<PackedWna16, CliError> {
    let mut codes = vec![0u8; n * k];
    for chunk in codes.chunks_mut(16) {
        let bits = rng.next_u64();
        for (j, c) in chunk.iter_mut().enumerate() {
            *c = ((bits >> (4 * j)) & 0xF) as u8;
        }
    }
    let scales: Vec<bf16> = (0..n * (k / g))
        .map(|_| bf16::from_f32(0.001 + (rng.next_u64() % 1000) as f32 * 2e-6))
        .collect();
    PackedWna16::pack(Wna16Desc {
        n,
        k,
        bits: 4,
        codes: &codes,
        group_size: Some(g),
        scales: Wna16Scales::Bf16(&scales),
        zeros: None,
        bias: None,
        perm: None,
    })
    .map_err(|e| CliError::context("packing expert weights", e))
}

/// A weight-only (W4A16) layer of uniformly random int4 codes and bf16 group scales, run with
/// float activations on the native WNA16 kernels; experts are built in parallel on the
/// current rayon pool, ticking `bar` once per expert.
pub fn random_wna16_layer(
    shape: LayerShape,
    seed: u64,
    bar: &ProgressBar,
) -> Result<SynthLayer<PackedWna16>, CliError> {
    shape.validate()?;
    let (h, i, g) = (shape.hidden, shape.intermediate, shape.group_size);
    let experts = (0..shape.experts)
        .into_par_iter()
        .map(|e| {
            let mut rng = Rng::stream(seed, e as u64);
            let p13 = random_wna16_packed(&mut rng, 2 * i, h, g)?;
            let p2 = random_wna16_packed(&mut rng, h, i, g)?;
            bar.inc(1);
            Ok((p13, p2))
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    assemble(shape, experts, PackedWna16::packed_bytes)
}

/// Random e4m3 codes (any byte but the two NaNs) with f32 scales per `128 × 128` block for an
/// `[n, k]` matrix, packed as FP8 block-quantized weights.
fn random_fp8_packed(rng: &mut Rng, n: usize, k: usize) -> Result<PackedWna16, CliError> {
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
    PackedWna16::pack_fp8_block(Fp8BlockDesc {
        n,
        k,
        rows: &[Fp8BlockRows {
            channels: n,
            codes: &codes,
            scales: &scales,
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
