//! The packed format of weight-only int4 and int8 experts (WNA16: integer weights, 16-bit group
//! scales, float activations, f32 compute), built once from unsigned codes.
//!
//! Layout (per matrix; `P = ceil(N/16)` panels, `S = ceil(K/T)` steps of `T` K values, `T = 8`
//! for int4 and 4 for int8, `G` groups per row). A step is one 64-byte vector of 16 `u32`:
//!
//! - int4: `codes[(p·S + s)·16 + c]` is channel `16p + c`'s word; its nibble `j` (bits
//!   `4j..4j+4`) holds the code at K value `8s + j`. With one channel per 32-bit lane, a right
//!   shift by `4j` followed by a 16-entry table lookup on the low four bits (`vpermps`) turns K
//!   value `8s + j` of 16 channels into 16 f32 weights.
//! - int8: byte `16j + c` of step `s` (little-endian bytes of the words) holds the code of
//!   channel `16p + c` at K value `4s + j`, so K value `j` of 16 channels is 16 consecutive
//!   bytes (`vpmovzxbd` then `vcvtdq2ps`).
//! - `scales[(p·G + g)·16 + c]`: the scale of channel `16p + c` in group `g`, kept in the
//!   precision the caller gave (f16 and bf16 widen to f32 exactly).
//! - `zeros[(p·G + g)·16 + c]` when the weights are asymmetric; symmetric weights use zero 8
//!   (int4, the `uint4b8` type) or 128 (int8, `uint8b128`).
//! - `bias[16p + c]` when present.
//! - `perm[j]` when the caller's K order was permuted to make groups contiguous (act-order):
//!   packed K value `j` multiplies activation column `perm[j]`.
//!
//! Channels past `N` and K values past `K` hold code 0 and zero scale; the kernels never read
//! K values past `K` (the last step is processed nibble by nibble).
//!
//! A weight is `(value(code) − zero)·scale`, where `value` is the code's integer for integer
//! weights and the e2m1 table ([`E2M1_VALUES`]) for MXFP4 weights ([`Int4Values::E2m1`]: zero 0,
//! groups of 32, power-of-two scales kept as the checkpoint's e8m0 bytes), and for 8-bit codes
//! the value is the code's integer or, for FP8 block-quantized weights ([`Int8Values::E4m3`]:
//! zero 0, groups of 128, f32 scales), its e4m3 value ([`e4m3_value`]). At group size 128
//! with bf16 scales the int4 format streams 0.5 bytes of codes plus 1/64 byte of scale per
//! weight; MXFP4 streams 0.5 + 1/32, exactly the checkpoint's bytes; FP8 1 + 1/32.

use std::num::NonZeroUsize;

use crate::aligned::AlignedVec;
use half::{bf16, f16};
use moe_quant::WeightGroups;

use super::{PANEL, all_branch_free, check_len};
use crate::KernelError;

/// K values per packed int4 step: eight nibbles in each channel's 32-bit lane.
pub(crate) const K_STEP: usize = 8;

/// K values per packed int8 step: four rows of 16 channel bytes.
pub(crate) const K_STEP8: usize = 4;

/// Largest supported K (keeps every index product far from overflow).
pub const MAX_K: usize = 1 << 24;

/// K values per MXFP4 block: one e8m0 scale per 32 e2m1 codes.
pub const MXFP4_BLOCK: usize = 32;

/// The scale grouping of MXFP4 weights: groups of [`MXFP4_BLOCK`] K values.
pub const MXFP4_GROUPS: WeightGroups = match NonZeroUsize::new(MXFP4_BLOCK) {
    Some(g) => WeightGroups::Groups(g),
    None => panic!("MXFP4 blocks are not empty"),
};

/// The value of each e2m1 code (MXFP4's element type): sign bit 3, then two exponent bits and
/// one mantissa bit, so codes 0..=7 are `{0, 0.5, 1, 1.5, 2, 3, 4, 6}` and 8..=15 their
/// negatives. Every value has at most two significant bits, so a value times a power-of-two
/// scale is exact in f32 and in bf16.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// What the 4-bit codes of a packed matrix stand for. Both kinds decode a code through a
/// 16-entry table, which is what every WNA16 body already does, so MXFP4 runs on the same
/// kernels as integer int4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Int4Values {
    /// Unsigned integers `0..=15` less a zero point (8 when symmetric): GPTQ, AWQ,
    /// compressed-tensors.
    Integer,
    /// e2m1 floats ([`E2M1_VALUES`]) with no zero point: MXFP4.
    E2m1,
}

/// K values (and output channels) per FP8 scale block: one f32 scale per `128 × 128` block of
/// e4m3 codes.
pub const FP8_BLOCK: usize = 128;

/// The scale grouping of FP8 block weights along K: groups of [`FP8_BLOCK`].
const FP8_GROUPS: WeightGroups = match NonZeroUsize::new(FP8_BLOCK) {
    Some(g) => WeightGroups::Groups(g),
    None => panic!("FP8 blocks are not empty"),
};

/// What the 8-bit codes of a packed matrix stand for. Both kinds turn a code byte into an
/// exact f32 with a few vector operations, so FP8 runs on the same kernels as integer int8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Int8Values {
    /// Unsigned integers `0..=255` less a zero point (128 when symmetric): GPTQ,
    /// compressed-tensors.
    Integer,
    /// e4m3fn floats ([`e4m3_value`]) with no zero point: FP8 block-quantized checkpoints.
    E4m3,
}

/// The value of an e4m3fn byte (sign bit 7, four exponent bits with bias 7, three mantissa
/// bits; no infinities, `0x7F` and `0xFF` are NaN). Placing the seven magnitude bits at f32
/// bits 20..27 gives an f32 whose exponent field is the e4m3 exponent, so it is the e4m3 value
/// times `2^-120` for normal and subnormal codes alike; the multiply by `2^120` is exact.
pub fn e4m3_value(c: u8) -> f32 {
    let bits = (u32::from(c & 0x80) << 24) | (u32::from(c & 0x7F) << 20);
    f32::from_bits(bits) * f32::from_bits((127 + 120) << 23)
}

/// Whether an e4m3fn byte is NaN (the format's only non-finite codes).
fn e4m3_is_nan(c: u8) -> bool {
    c & 0x7F == 0x7F
}

/// The value of an e8m0 scale, `2^(e − 127)`: the exponent bits of an f32, exact for every `e`
/// in `0..=254` (`e = 0` is the subnormal `2^-127`, which a shift cannot make); `e = 255` is NaN
/// and refused at pack time.
#[inline(always)]
pub(crate) fn e8m0_to_f32(e: u8) -> f32 {
    if e == 0 {
        f32::from_bits(0x0040_0000)
    } else {
        f32::from_bits(u32::from(e) << 23)
    }
}

/// What a packed matrix's codes stand for, one fact for both code widths (the public
/// [`Int4Values`] and [`Int8Values`] are its views per width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CodeValues {
    /// Unsigned integers less a zero point.
    Integer,
    /// e2m1 values (4-bit codes, MXFP4).
    E2m1,
    /// e4m3 values (8-bit codes, FP8 blocks).
    E4m3,
}

/// Group scales of a WNA16 matrix, row-major `[N, G]`, in the checkpoint's precision.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Wna16Scales<'a> {
    /// f16 scales.
    F16(&'a [f16]),
    /// bf16 scales.
    Bf16(&'a [bf16]),
    /// f32 scales.
    F32(&'a [f32]),
}

impl Wna16Scales<'_> {
    fn len(&self) -> usize {
        match self {
            Self::F16(s) => s.len(),
            Self::Bf16(s) => s.len(),
            Self::F32(s) => s.len(),
        }
    }

    fn get(&self, i: usize) -> f32 {
        match self {
            Self::F16(s) => s[i].to_f32(),
            Self::Bf16(s) => s[i].to_f32(),
            Self::F32(s) => s[i],
        }
    }
}

/// Packed scales, `[P][G][16]`, in their stored precision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Wna16ScaleValues {
    /// f16 scales.
    F16(Vec<f16>),
    /// bf16 scales.
    Bf16(Vec<bf16>),
    /// f32 scales.
    F32(Vec<f32>),
    /// e8m0 scales (MXFP4), the checkpoint's bytes: `2^(e − 127)`.
    E8m0(Vec<u8>),
}

/// The largest magnitude among `scales` (0 for none).
fn largest_scale(scales: &Wna16ScaleValues) -> f32 {
    let top = |v: &mut dyn Iterator<Item = f32>| v.fold(0f32, |m, s| m.max(s.abs()));
    match scales {
        Wna16ScaleValues::F16(v) => top(&mut v.iter().map(|s| s.to_f32())),
        Wna16ScaleValues::Bf16(v) => top(&mut v.iter().map(|s| s.to_f32())),
        Wna16ScaleValues::F32(v) => top(&mut v.iter().copied()),
        Wna16ScaleValues::E8m0(v) => v.iter().max().map_or(0.0, |&e| e8m0_to_f32(e)),
    }
}

/// What [`PackedWna16::pack`] takes: one integer weight matrix `[N, K]` as unsigned codes.
#[derive(Debug, Clone, Copy)]
pub struct Wna16Desc<'a> {
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Unsigned codes `[N, K]` row-major, each in `0..2^bits`.
    pub codes: &'a [u8],
    /// The scale grouping: groups of K values (a multiple of 8), or one scale per channel.
    pub group_size: WeightGroups,
    /// Scales `[N, G]` with `G = ceil(K / group_size)` (1 when channelwise).
    pub scales: Wna16Scales<'a>,
    /// Zero points `[N, G]` in `0..2^bits`; `None` means symmetric with zero `2^(bits−1)`.
    pub zeros: Option<&'a [u8]>,
    /// f32 bias `[N]`, added to every output row.
    pub bias: Option<&'a [f32]>,
    /// Activation column of each K value of `codes` (a permutation of `0..K`), when the codes'
    /// K order differs from the activations' (act-order checkpoints sorted by group).
    pub perm: Option<&'a [u32]>,
}

/// An int4 or int8 weight-only matrix `[N, K]` packed for the WNA16 kernels; immutable once
/// built. Equality compares the packed data, so two builds of the same weights can be checked
/// equal.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedWna16 {
    n: usize,
    k: usize,
    bits: u32,
    values: CodeValues,
    n_panels: usize,
    k_steps: usize,
    group_size: usize,
    channelwise: bool,
    n_groups: usize,
    codes: AlignedVec<u32>,
    scales: Wna16ScaleValues,
    /// The largest scale magnitude ([`largest_scale`]), for the bodies whose sums would
    /// overflow with extreme scales.
    largest_scale: f32,
    zeros: Option<Vec<u8>>,
    bias: Option<Vec<f32>>,
    perm: Option<Vec<u32>>,
}

/// How a checkpoint stores integer codes in 32-bit words. In the two orders every format but
/// AWQ uses, a word holds `32/bits` codes of one output channel along K, field `j` (bits
/// `bits·j..bits·(j+1)`) the code at K value `(32/bits)·s + j` of word `s`: for int4 exactly
/// one packed step word of that channel, so those are copied (and, for
/// [`WordOrder::StepMajor`], transposed) word by word; int8 words are spread over the packed
/// step's byte rows. Codes are stored unsigned (the symmetric offset already in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WordOrder {
    /// `[N, ceil(K·bits/32)]`: the words of a channel are consecutive (compressed-tensors
    /// `weight_packed`).
    ChannelMajor,
    /// `[ceil(K·bits/32), N]`: the words of a step are consecutive (GPTQ `qweight`).
    StepMajor,
    /// `[K, N/8]`, int4 only: a word holds eight channels at one K value, channel `8w + c` in
    /// field [`AWQ_FIELD_OF_CHANNEL`]`[c]` (AWQ `gemm` `qweight`). Every run's channel count
    /// must be a multiple of 8.
    Awq,
}

/// AWQ's `gemm` packing: the 4-bit field of a word that holds its `c`-th channel. AutoAWQ
/// writes channels `0, 2, 4, 6, 1, 3, 5, 7` into fields `0..8`; this is the inverse.
pub const AWQ_FIELD_OF_CHANNEL: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// A run of consecutive output channels of a [`Wna16WordsDesc`]: `channels` channels' int32
/// words as little-endian bytes, in the desc's [`WordOrder`] (so a fused matrix can be packed
/// straight from its projections' separately stored tensors).
#[derive(Debug, Clone, Copy)]
pub struct WordRows<'a> {
    /// Output channels in this run.
    pub channels: usize,
    /// The run's words, 4 bytes each, little-endian, any alignment: `channels ·
    /// ceil(K·bits/32)` of them, or `K · channels/8` in [`WordOrder::Awq`].
    pub bytes: &'a [u8],
}

/// What [`PackedWna16::pack_words`] takes: one int4 or int8 matrix `[N, K]` as the 32-bit
/// words a checkpoint stores, plus the same scales, zero points, bias and K order as
/// [`Wna16Desc`].
#[derive(Debug, Clone, Copy)]
pub struct Wna16WordsDesc<'a> {
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// How the words of each run are ordered.
    pub order: WordOrder,
    /// The channels' words, runs in channel order, `N` channels in all. Fields past K in a
    /// channel's last word are ignored.
    pub rows: &'a [WordRows<'a>],
    /// The scale grouping: groups of K values (a multiple of 8), or one scale per channel.
    pub group_size: WeightGroups,
    /// Scales `[N, G]` with `G = ceil(K / group_size)` (1 when channelwise).
    pub scales: Wna16Scales<'a>,
    /// Zero points `[N, G]` in `0..2^bits`; `None` means symmetric with zero `2^(bits−1)`.
    pub zeros: Option<&'a [u8]>,
    /// f32 bias `[N]`, added to every output row.
    pub bias: Option<&'a [f32]>,
    /// As [`Wna16Desc::perm`]: packed K value `j` takes the stored code at K value `perm[j]`
    /// and multiplies activation column `perm[j]` (act-order checkpoints sorted by group).
    pub perm: Option<&'a [u32]>,
}

/// What [`PackedWna16::pack_mxfp4`] takes: one MXFP4 matrix `[N, K]` as a checkpoint stores it
/// (gpt-oss `*_blocks` / `*_scales`), one expert's slice of bytes each.
#[derive(Debug, Clone, Copy)]
pub struct Mxfp4Desc<'a> {
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// `[N, ceil(K/32), 16]` bytes: byte `j` of a block holds the code of its element `2j` in
    /// the low nibble and `2j + 1` in the high one. Nibbles past K are ignored.
    pub blocks: &'a [u8],
    /// `[N, ceil(K/32)]` e8m0 scales: block scale `2^(e − 127)`; 255 (NaN) is refused.
    pub scales: &'a [u8],
    /// f32 bias `[N]`, added to every output row.
    pub bias: Option<&'a [f32]>,
}

/// How a run of FP8 channels stores its f32 scales. Checkpoints scale e4m3 codes per
/// `128 × 128` block (DeepSeek-V3, Qwen3 `-FP8`), per output channel (compressed-tensors
/// `FP8_DYNAMIC`) or with one scale for the whole tensor (AutoFP8, compressed-tensors `FP8`).
#[derive(Debug, Clone, Copy)]
pub enum Fp8Scales<'a> {
    /// `[ceil(channels/128), ceil(K/128)]` block scales: the weight at `[n, k]` is
    /// `e4m3(code)·scales[n/128][k/128]` (block-quantized checkpoints call them
    /// `weight_scale_inv`).
    Blocks(&'a [f32]),
    /// One scale per channel, `[channels]`: the weight at `[n, k]` is `e4m3(code)·scales[n]`.
    Channels(&'a [f32]),
    /// One scale for every weight of the run.
    Tensor(f32),
}

impl Fp8Scales<'_> {
    /// Whether the scales vary along K (block scales), which makes the packed matrix grouped
    /// rather than channelwise.
    fn is_blocks(&self) -> bool {
        matches!(self, Self::Blocks(_))
    }

    /// The scale values as a slice (one value for a tensor scale).
    fn values(&self) -> &[f32] {
        match self {
            Self::Blocks(s) | Self::Channels(s) => s,
            Self::Tensor(s) => std::slice::from_ref(s),
        }
    }

    /// How many values a run of `channels` channels over `kb` K blocks needs.
    fn expected_len(&self, channels: usize, kb: usize) -> usize {
        match self {
            Self::Blocks(_) => channels.div_ceil(FP8_BLOCK) * kb,
            Self::Channels(_) => channels,
            Self::Tensor(_) => 1,
        }
    }

    /// The scales of local channel `c` of the run: its block row, its own scale or the
    /// tensor's (`kb` values for block scales, one otherwise).
    fn of_channel(&self, c: usize, kb: usize) -> &[f32] {
        match self {
            Self::Blocks(s) => &s[(c / FP8_BLOCK) * kb..][..kb],
            Self::Channels(s) => std::slice::from_ref(&s[c]),
            Self::Tensor(s) => std::slice::from_ref(s),
        }
    }
}

/// A run of consecutive output channels of an [`Fp8Desc`], as one checkpoint tensor (or a
/// slice of one) stores them: its e4m3 codes and its scales.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Rows<'a> {
    /// Output channels in this run.
    pub channels: usize,
    /// e4m3fn codes `[channels, K]` row-major; `0x7F` and `0xFF` (NaN) are refused.
    pub codes: &'a [u8],
    /// The run's scales; block scales start their block rows at the run's first channel.
    pub scales: Fp8Scales<'a>,
}

/// What [`PackedWna16::pack_fp8`] takes: one FP8 matrix `[N, K]` as runs of channels (so a
/// fused matrix can be packed from its projections' separate tensors, each with its own
/// scales).
#[derive(Debug, Clone, Copy)]
pub struct Fp8Desc<'a> {
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// The channels' codes and scales, runs in channel order, `N` channels in all. Either
    /// every run has block scales or none has.
    pub rows: &'a [Fp8Rows<'a>],
    /// f32 bias `[N]`, added to every output row.
    pub bias: Option<&'a [f32]>,
}

/// The checked sizes of a matrix to pack.
struct Dims {
    k_step: usize,
    max_code: u8,
    group_size: usize,
    n_groups: usize,
}

/// Checks K, bits and group size, and that `N·K` fits.
fn check_dims(
    n: usize,
    k: usize,
    bits: u32,
    group_size: WeightGroups,
) -> Result<Dims, KernelError> {
    if k == 0 || k > MAX_K {
        return Err(KernelError::UnsupportedDim {
            dim: "K",
            got: k,
            reason: "K must be in 1..=2^24",
        });
    }
    n.checked_mul(k).ok_or(KernelError::UnsupportedDim {
        dim: "N",
        got: n,
        reason: "N·K overflows usize",
    })?;
    let (k_step, max_code) = match bits {
        4 => (K_STEP, 15),
        8 => (K_STEP8, 255),
        bits => {
            return Err(KernelError::UnsupportedDim {
                dim: "bits",
                got: bits as usize,
                reason: "WNA16 weights have 4 or 8 bits",
            });
        }
    };
    let group_size = match group_size.group_size() {
        None => k,
        Some(g) if g % K_STEP == 0 => g,
        Some(g) => {
            return Err(KernelError::UnsupportedDim {
                dim: "group_size",
                got: g,
                reason: "WNA16 group sizes must be positive multiples of 8",
            });
        }
    };
    Ok(Dims {
        k_step,
        max_code,
        group_size,
        n_groups: k.div_ceil(group_size),
    })
}

/// Checks an optional bias of `n` channels: its length and finiteness.
fn check_bias(n: usize, bias: Option<&[f32]>) -> Result<(), KernelError> {
    if let Some(b) = bias {
        check_len("bias", n, b.len())?;
        check_finite("bias", b.len(), |i| b[i])?;
    }
    Ok(())
}

/// A checked bias padded with zeros to whole panels.
fn padded_bias(b: &[f32], n_panels: usize) -> Vec<f32> {
    let mut v = vec![0f32; n_panels * PANEL];
    v[..b.len()].copy_from_slice(b);
    v
}

/// The per-channel tensors every matrix carries besides its codes.
struct Side<'a> {
    scales: Wna16Scales<'a>,
    zeros: Option<&'a [u8]>,
    bias: Option<&'a [f32]>,
}

impl Side<'_> {
    /// Checks lengths, zero-point range and finiteness.
    fn check(&self, n: usize, dims: &Dims) -> Result<(), KernelError> {
        check_len("scales", n * dims.n_groups, self.scales.len())?;
        if let Some(z) = self.zeros {
            check_len("zeros", n * dims.n_groups, z.len())?;
            check_codes("zeros", z, dims.max_code)?;
        }
        check_bias(n, self.bias)
    }

    /// Checks the scales are finite (after the codes, which keeps the order errors are
    /// reported in): a branch-free pass over the stored values first (which vectorises), the
    /// index only on failure.
    fn check_scales(&self) -> Result<(), KernelError> {
        let finite = match self.scales {
            Wna16Scales::F16(s) => all_branch_free(s, f16::is_finite),
            Wna16Scales::Bf16(s) => all_branch_free(s, bf16::is_finite),
            Wna16Scales::F32(s) => all_branch_free(s, f32::is_finite),
        };
        if finite {
            return Ok(());
        }
        check_finite("scales", self.scales.len(), |i| self.scales.get(i))
    }

    /// The packed scales, zero points and bias of an `n`-channel matrix.
    fn pack(
        &self,
        n: usize,
        n_panels: usize,
        n_groups: usize,
    ) -> (Wna16ScaleValues, Option<Vec<u8>>, Option<Vec<f32>>) {
        let sg = n_panels * n_groups * PANEL;
        let at = |row: usize, g: usize| ((row / PANEL) * n_groups + g) * PANEL + row % PANEL;
        let scales = match self.scales {
            Wna16Scales::F16(s) => Wna16ScaleValues::F16(scatter(n, n_groups, sg, s, at)),
            Wna16Scales::Bf16(s) => Wna16ScaleValues::Bf16(scatter(n, n_groups, sg, s, at)),
            Wna16Scales::F32(s) => Wna16ScaleValues::F32(scatter(n, n_groups, sg, s, at)),
        };
        let zeros = self.zeros.map(|z| scatter(n, n_groups, sg, z, at));
        let bias = self.bias.map(|b| padded_bias(b, n_panels));
        (scales, zeros, bias)
    }
}

/// What an integer matrix is besides its codes and side tensors: the part of the packed
/// matrix [`PackedWna16::pack`] and [`PackedWna16::pack_words`] describe alike.
struct IntegerMatrix<'a> {
    n: usize,
    k: usize,
    bits: u32,
    channelwise: bool,
    perm: Option<&'a [u32]>,
}

impl IntegerMatrix<'_> {
    /// The packed matrix of `codes` (already in the packed layout) with `side`'s scales, zero
    /// points and bias, all checked.
    fn with_codes(self, codes: AlignedVec<u32>, dims: &Dims, side: &Side<'_>) -> PackedWna16 {
        let n_panels = self.n.div_ceil(PANEL);
        let (scales, zeros, bias) = side.pack(self.n, n_panels, dims.n_groups);
        PackedWna16 {
            n: self.n,
            k: self.k,
            bits: self.bits,
            values: CodeValues::Integer,
            n_panels,
            k_steps: self.k.div_ceil(dims.k_step),
            group_size: dims.group_size,
            channelwise: self.channelwise,
            n_groups: dims.n_groups,
            codes,
            largest_scale: largest_scale(&scales),
            scales,
            zeros,
            bias,
            perm: self.perm.map(<[u32]>::to_vec),
        }
    }
}

impl PackedWna16 {
    /// Validates and packs one matrix.
    pub fn pack(d: Wna16Desc<'_>) -> Result<Self, KernelError> {
        let (n, k) = (d.n, d.k);
        let dims = check_dims(n, k, d.bits, d.group_size)?;
        check_len("w_int", n * k, d.codes.len())?;
        let side = Side {
            scales: d.scales,
            zeros: d.zeros,
            bias: d.bias,
        };
        side.check(n, &dims)?;
        check_codes("w_int", d.codes, dims.max_code)?;
        side.check_scales()?;
        if let Some(p) = d.perm {
            check_perm(p, k)?;
        }

        let k_step = dims.k_step;
        let n_panels = n.div_ceil(PANEL);
        let k_steps = k.div_ceil(k_step);
        let mut codes = AlignedVec::zeroed(n_panels * k_steps * PANEL);
        for row in 0..n {
            let (p, c) = (row / PANEL, row % PANEL);
            let src = &d.codes[row * k..][..k];
            if d.bits == 4 {
                // One channel's word per step: eight codes, nibble `j` = K value `8s + j`.
                let panel = &mut codes[p * k_steps * PANEL..][..k_steps * PANEL];
                for (s, step) in src.chunks(K_STEP).enumerate() {
                    panel[s * PANEL + c] = step
                        .iter()
                        .enumerate()
                        .fold(0, |w, (j, &q)| w | (u32::from(q) << (4 * j)));
                }
                continue;
            }
            put_bytes(&mut codes, k_steps, row, src);
        }
        let integer = IntegerMatrix {
            n,
            k,
            bits: d.bits,
            channelwise: d.group_size.is_channelwise(),
            perm: d.perm,
        };
        Ok(integer.with_codes(codes, &dims, &side))
    }

    /// Validates and packs one matrix from a checkpoint's 32-bit words: the same packed matrix
    /// [`Self::pack`] builds from the words' codes (fields past K dropped, K values reordered
    /// by `perm`), without unpacking the matrix to one byte per code. Every stored code is
    /// valid, so only the shapes, scales, zero points, bias and permutation can be refused.
    pub fn pack_words(d: Wna16WordsDesc<'_>) -> Result<Self, KernelError> {
        let (n, k) = (d.n, d.k);
        let dims = check_dims(n, k, d.bits, d.group_size)?;
        let per_word = (32 / d.bits) as usize;
        let channels = d
            .rows
            .iter()
            .try_fold(0usize, |sum, r| sum.checked_add(r.channels))
            .unwrap_or(usize::MAX);
        check_len("w_words channels", n, channels)?;
        if d.order == WordOrder::Awq {
            if d.bits != 4 {
                return Err(KernelError::UnsupportedDim {
                    dim: "bits",
                    got: d.bits as usize,
                    reason: "AWQ words hold int4 codes",
                });
            }
            if let Some(r) = d.rows.iter().find(|r| r.channels % AWQ_PACK != 0) {
                return Err(KernelError::UnsupportedDim {
                    dim: "w_words channels",
                    got: r.channels,
                    reason: "AWQ runs hold a multiple of 8 channels",
                });
            }
        }
        for r in d.rows {
            let words = match d.order {
                WordOrder::Awq => k * (r.channels / AWQ_PACK),
                _ => r.channels * k.div_ceil(per_word),
            };
            check_len("w_words", words * 4, r.bytes.len())?;
        }
        let side = Side {
            scales: d.scales,
            zeros: d.zeros,
            bias: d.bias,
        };
        side.check(n, &dims)?;
        side.check_scales()?;
        if let Some(p) = d.perm {
            check_perm(p, k)?;
        }

        // Where each channel's codes are: its run's words, the index of its first word and
        // the distance between its words (1 when a channel's words are consecutive), and for
        // AWQ the bit offset of its field.
        let mut at: Vec<ChannelWords<'_>> = Vec::with_capacity(n);
        for r in d.rows {
            let words = r.bytes.as_chunks::<4>().0;
            for local in 0..r.channels {
                at.push(match d.order {
                    WordOrder::ChannelMajor => ChannelWords {
                        words,
                        first: local * k.div_ceil(per_word),
                        stride: 1,
                        shift: 0,
                    },
                    WordOrder::StepMajor => ChannelWords {
                        words,
                        first: local,
                        stride: r.channels,
                        shift: 0,
                    },
                    WordOrder::Awq => ChannelWords {
                        words,
                        first: local / AWQ_PACK,
                        stride: r.channels / AWQ_PACK,
                        shift: 4 * AWQ_FIELD_OF_CHANNEL[local % AWQ_PACK] as u32,
                    },
                });
            }
        }
        // AWQ words hold int4 codes only (refused above otherwise).
        let codes = match (d.bits, d.order, d.perm) {
            (8, _, perm) => gather_int8(&at, k, perm),
            (_, WordOrder::Awq, None) => gather_awq(&at, k),
            (_, WordOrder::Awq, Some(perm)) => gather_awq_permuted(&at, k, perm),
            (_, _, None) => gather_words(&at, k),
            (_, _, Some(perm)) => gather_permuted_int4(&at, k, perm),
        };
        let integer = IntegerMatrix {
            n,
            k,
            bits: d.bits,
            channelwise: d.group_size.is_channelwise(),
            perm: d.perm,
        };
        Ok(integer.with_codes(codes, &dims, &side))
    }

    /// Validates and packs one MXFP4 matrix from a checkpoint's blocks and e8m0 scales.
    ///
    /// The 16 bytes of a block, read as four little-endian 32-bit words, are exactly four int4
    /// steps of one channel (nibble `j` of word `i` is element `8i + j`), so the blocks are
    /// gathered word by word like channel-major int4 words. The e8m0 scales stay bytes (the
    /// kernels make `2^(e − 127)` from them exactly), so the kernels see groups of 32 and the
    /// e2m1 table: weights are exactly `e2m1(code)·2^(e − 127)`.
    pub fn pack_mxfp4(d: Mxfp4Desc<'_>) -> Result<Self, KernelError> {
        let (n, k) = (d.n, d.k);
        let dims = check_dims(n, k, 4, MXFP4_GROUPS)?;
        let blocks = dims.n_groups;
        check_len("blocks", n * blocks * 16, d.blocks.len())?;
        check_len("scales", n * blocks, d.scales.len())?;
        if let Some(index) = d.scales.iter().position(|&e| e == u8::MAX) {
            return Err(KernelError::ValueOutOfRange {
                tensor: "scales",
                index,
                value: i64::from(u8::MAX),
                min: 0,
                max: 254,
            });
        }
        check_bias(n, d.bias)?;
        let n_panels = n.div_ceil(PANEL);
        let groups = dims.n_groups;
        let at = |row: usize, g: usize| ((row / PANEL) * groups + g) * PANEL + row % PANEL;
        let scales =
            Wna16ScaleValues::E8m0(scatter(n, groups, n_panels * groups * PANEL, d.scales, at));
        let bias = d.bias.map(|b| padded_bias(b, n_panels));

        let words = d.blocks.as_chunks::<4>().0;
        let row_words = blocks * 4;
        let at: Vec<ChannelWords<'_>> = (0..n)
            .map(|c| ChannelWords {
                words,
                first: c * row_words,
                stride: 1,
                shift: 0,
            })
            .collect();
        let codes = gather_words(&at, k);
        Ok(Self {
            n,
            k,
            bits: 4,
            values: CodeValues::E2m1,
            n_panels,
            k_steps: k.div_ceil(K_STEP),
            group_size: dims.group_size,
            channelwise: false,
            n_groups: dims.n_groups,
            codes,
            largest_scale: largest_scale(&scales),
            scales,
            zeros: None,
            bias,
            perm: None,
        })
    }

    /// Validates and packs one FP8 matrix (e4m3fn codes, f32 scales per `128 × 128` block, per
    /// channel or per tensor).
    ///
    /// A block scale is, for each of the block's channels, the scale of a group of 128 K
    /// values, so block-scaled runs make an int8 WNA16 matrix with groups of 128 (each
    /// channel's row is its block row, repeated for the block's 128 channels); channel and
    /// tensor scales make a channelwise one (a tensor scale repeated for each channel). Either
    /// has f32 scales, no zero point and codes decoded through [`e4m3_value`]: weights are
    /// exactly `e4m3(code)·scale`. Any K and N are accepted (the last block row and column may
    /// be short); runs mixing block and other scales are refused, as the packed matrix has one
    /// grouping; NaN codes are refused as non-finite weights, naming their index in `[N, K]`.
    pub fn pack_fp8(d: Fp8Desc<'_>) -> Result<Self, KernelError> {
        let (n, k) = (d.n, d.k);
        let blocks = d.rows.first().is_some_and(|r| r.scales.is_blocks());
        if d.rows.iter().any(|r| r.scales.is_blocks() != blocks) {
            return Err(KernelError::Unsupported {
                reason: "FP8 runs of one matrix must all have block scales or none may",
            });
        }
        let groups = if blocks {
            FP8_GROUPS
        } else {
            WeightGroups::Channelwise
        };
        let dims = check_dims(n, k, 8, groups)?;
        let kb = dims.n_groups;
        let channels = d
            .rows
            .iter()
            .try_fold(0usize, |sum, r| sum.checked_add(r.channels))
            .unwrap_or(usize::MAX);
        check_len("w_fp8 channels", n, channels)?;
        for r in d.rows {
            check_len("w_fp8", r.channels * k, r.codes.len())?;
            check_len(
                "weight_scale",
                r.scales.expected_len(r.channels, kb),
                r.scales.values().len(),
            )?;
        }
        check_bias(n, d.bias)?;
        let mut first = 0;
        for r in d.rows {
            if !all_branch_free(r.codes, |c| !e4m3_is_nan(c))
                && let Some(at) = r.codes.iter().position(|&c| e4m3_is_nan(c))
            {
                return Err(KernelError::NonFiniteWeight {
                    tensor: "w_fp8",
                    index: first * k + at,
                    value: format!("NaN (e4m3 byte {:#04x})", r.codes[at]),
                });
            }
            let values = r.scales.values();
            check_finite("weight_scale", values.len(), |i| values[i])?;
            first += r.channels;
        }

        let n_panels = n.div_ceil(PANEL);
        let k_steps = k.div_ceil(K_STEP8);
        let codes = if k.is_multiple_of(K_STEP8) {
            // Every channel's K values are whole words of four: the channel-major int8
            // gather's input.
            let at: Vec<ChannelWords<'_>> = d
                .rows
                .iter()
                .flat_map(|r| {
                    let words = r.codes.as_chunks::<4>().0;
                    (0..r.channels).map(move |local| ChannelWords {
                        words,
                        first: local * (k / K_STEP8),
                        stride: 1,
                        shift: 0,
                    })
                })
                .collect();
            gather_int8(&at, k, None)
        } else {
            let mut codes = AlignedVec::zeroed(n_panels * k_steps * PANEL);
            let mut row = 0;
            for r in d.rows {
                for local in 0..r.channels {
                    put_bytes(&mut codes, k_steps, row, &r.codes[local * k..][..k]);
                    row += 1;
                }
            }
            codes
        };
        let mut scales = vec![0f32; n_panels * kb * PANEL];
        let mut row = 0;
        for r in d.rows {
            for local in 0..r.channels {
                let (p, c) = (row / PANEL, row % PANEL);
                for (g, &s) in r.scales.of_channel(local, kb).iter().enumerate() {
                    scales[(p * kb + g) * PANEL + c] = s;
                }
                row += 1;
            }
        }
        let scales = Wna16ScaleValues::F32(scales);
        let bias = d.bias.map(|b| padded_bias(b, n_panels));
        Ok(Self {
            n,
            k,
            bits: 8,
            values: CodeValues::E4m3,
            n_panels,
            k_steps,
            group_size: dims.group_size,
            channelwise: !blocks,
            n_groups: kb,
            codes,
            largest_scale: largest_scale(&scales),
            scales,
            zeros: None,
            bias,
            perm: None,
        })
    }

    /// What the 4-bit codes stand for: integers or e2m1 values.
    pub fn values(&self) -> Int4Values {
        match self.values {
            CodeValues::E2m1 => Int4Values::E2m1,
            _ => Int4Values::Integer,
        }
    }

    /// What the 8-bit codes stand for: integers or e4m3 values.
    pub fn int8_values(&self) -> Int8Values {
        match self.values {
            CodeValues::E4m3 => Int8Values::E4m3,
            _ => Int8Values::Integer,
        }
    }

    /// Whether the codes are e4m3 values (FP8 block-quantized weights).
    pub(crate) fn is_e4m3(&self) -> bool {
        self.values == CodeValues::E4m3
    }

    /// Whether the bf16 path can take these weights: every code width and kind (int4
    /// integers or e2m1 values, int8 integers, e4m3), whose fills dequantize them to
    /// `bf16((value − zero)·scale)`.
    pub(crate) fn has_bf16_fill(&self) -> bool {
        matches!(self.bits, 4 | 8)
    }

    /// The value of code `c` before the zero point is subtracted: `c` for integer codes, the
    /// e2m1 value for MXFP4, the e4m3 value for FP8.
    pub fn code_value(&self, c: u8) -> f32 {
        match self.values {
            CodeValues::Integer => f32::from(c),
            CodeValues::E2m1 => E2M1_VALUES[usize::from(c & 0xF)],
            CodeValues::E4m3 => e4m3_value(c),
        }
    }

    /// The 16-entry table the bodies decode int4 codes through before subtracting the zero
    /// point: the codes themselves for integers, [`E2M1_VALUES`] for MXFP4.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the bf16 fills read it
    pub(crate) fn raw_table(&self) -> &'static [f32; 16] {
        const CODES: [f32; 16] = [
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        ];
        match self.values {
            CodeValues::E2m1 => &E2M1_VALUES,
            CodeValues::Integer | CodeValues::E4m3 => &CODES,
        }
    }

    /// Output channels N.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Reduction dimension K.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bits per code, 4 or 8.
    pub fn bits(&self) -> u32 {
        self.bits
    }

    /// K values per group (K when channelwise).
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Whether there is one scale per channel.
    pub fn is_channelwise(&self) -> bool {
        self.channelwise
    }

    /// Whether the weights carry zero points.
    pub fn is_asymmetric(&self) -> bool {
        self.zeros.is_some()
    }

    /// Bytes a GEMM streams: codes, scales, zero points and bias.
    pub fn packed_bytes(&self) -> usize {
        let scales = match &self.scales {
            Wna16ScaleValues::F16(s) => s.len() * 2,
            Wna16ScaleValues::Bf16(s) => s.len() * 2,
            Wna16ScaleValues::F32(s) => s.len() * 4,
            Wna16ScaleValues::E8m0(s) => s.len(),
        };
        self.codes.len() * 4
            + scales
            + self.zeros.as_ref().map_or(0, Vec::len)
            + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// The weights back as `(codes [N, K], scales [N, G] as f32, zeros [N, G])`, in the
    /// packed K order (tests and reports); a weight is `(code_value(code) − zero)·scale`.
    pub fn unpack(&self) -> (Vec<u8>, Vec<f32>, Vec<u8>) {
        let (n, k, g) = (self.n, self.k, self.n_groups);
        let mut codes = vec![0u8; n * k];
        let mut scales = vec![0f32; n * g];
        let mut zeros = vec![self.symmetric_zero(); n * g];
        let k_step = self.k_step();
        let mask = (1u32 << self.bits) - 1;
        for row in 0..n {
            let (p, c) = (row / PANEL, row % PANEL);
            for col in 0..k {
                let (word, shift) = code_at(self.bits, c, col);
                let word = self.codes[(p * self.k_steps + col / k_step) * PANEL + word];
                codes[row * k + col] = ((word >> shift) & mask) as u8;
            }
            for gi in 0..g {
                let at = (p * g + gi) * PANEL + c;
                scales[row * g + gi] = self.scale_at(at);
                if let Some(z) = &self.zeros {
                    zeros[row * g + gi] = z[at];
                }
            }
        }
        (codes, scales, zeros)
    }

    /// The dequantized weights `[N, K]` in f64, columns in activation order: the exact value
    /// `(value(code) − zero)·scale` of every weight (tests and references).
    pub fn dequantize_f64(&self) -> Vec<f64> {
        let (codes, scales, zeros) = self.unpack();
        let (n, k, g) = (self.n, self.k, self.n_groups);
        let mut w = vec![0f64; n * k];
        for row in 0..n {
            for col in 0..k {
                let gi = row * g + col / self.group_size;
                let v = (f64::from(self.code_value(codes[row * k + col])) - f64::from(zeros[gi]))
                    * f64::from(scales[gi]);
                let dst = self.perm.as_ref().map_or(col, |p| p[col] as usize);
                w[row * k + dst] = v;
            }
        }
        w
    }

    fn scale_at(&self, at: usize) -> f32 {
        match &self.scales {
            Wna16ScaleValues::F16(s) => s[at].to_f32(),
            Wna16ScaleValues::Bf16(s) => s[at].to_f32(),
            Wna16ScaleValues::F32(s) => s[at],
            Wna16ScaleValues::E8m0(s) => e8m0_to_f32(s[at]),
        }
    }

    /// The largest scale magnitude.
    pub(crate) fn largest_scale(&self) -> f32 {
        self.largest_scale
    }

    /// The zero point of symmetric weights: 8 for int4, 128 for int8, 0 for e2m1 and e4m3
    /// values.
    pub(crate) fn symmetric_zero(&self) -> u8 {
        match (self.values, self.bits) {
            (CodeValues::E2m1 | CodeValues::E4m3, _) => 0,
            (CodeValues::Integer, 4) => 8,
            (CodeValues::Integer, _) => 128,
        }
    }

    /// K values per packed step.
    pub(crate) fn k_step(&self) -> usize {
        if self.bits == 4 { K_STEP } else { K_STEP8 }
    }

    pub(crate) fn n_panels(&self) -> usize {
        self.n_panels
    }

    pub(crate) fn k_steps(&self) -> usize {
        self.k_steps
    }

    pub(crate) fn n_groups(&self) -> usize {
        self.n_groups
    }

    pub(crate) fn codes(&self) -> &[u32] {
        &self.codes
    }

    pub(crate) fn scales(&self) -> &Wna16ScaleValues {
        &self.scales
    }

    pub(crate) fn zeros(&self) -> Option<&[u8]> {
        self.zeros.as_deref()
    }

    pub(crate) fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    pub(crate) fn perm(&self) -> Option<&[u32]> {
        self.perm.as_deref()
    }

    /// The f32 scales of group `g` of panel `p` (16 channels; f16 and bf16 widen exactly).
    // The AMX bf16 tiles read them.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn group_scales(&self, p: usize, g: usize) -> [f32; PANEL] {
        let at = (p * self.n_groups + g) * PANEL;
        let mut out = [0f32; PANEL];
        match &self.scales {
            Wna16ScaleValues::F16(v) => {
                for (o, s) in out.iter_mut().zip(&v[at..at + PANEL]) {
                    *o = s.to_f32();
                }
            }
            Wna16ScaleValues::Bf16(v) => {
                for (o, s) in out.iter_mut().zip(&v[at..at + PANEL]) {
                    *o = s.to_f32();
                }
            }
            Wna16ScaleValues::F32(v) => out.copy_from_slice(&v[at..at + PANEL]),
            Wna16ScaleValues::E8m0(v) => {
                for (o, &e) in out.iter_mut().zip(&v[at..at + PANEL]) {
                    *o = e8m0_to_f32(e);
                }
            }
        }
        out
    }

    /// The zero points of group `g` of panel `p` as f32 (the symmetric zero when there are
    /// none).
    // The AMX bf16 tiles and the NEON WNA16 body read them.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) fn group_zeros(&self, p: usize, g: usize) -> [f32; PANEL] {
        match &self.zeros {
            Some(z) => {
                let at = (p * self.n_groups + g) * PANEL;
                let mut out = [0f32; PANEL];
                for (o, &v) in out.iter_mut().zip(&z[at..at + PANEL]) {
                    *o = f32::from(v);
                }
                out
            }
            None => [f32::from(self.symmetric_zero()); PANEL],
        }
    }

    /// The bias of panel `p`: 16 values, if any.
    pub(crate) fn panel_bias(&self, p: usize) -> Option<&[f32]> {
        self.bias.as_deref().map(|b| &b[p * PANEL..][..PANEL])
    }

    /// One channel of int4 zeros with groups of `group` (K itself: channelwise) and, with
    /// `zero_points`, zero points: what the activation layouts' tests need of a matrix.
    #[cfg(test)]
    pub(crate) fn int4_for_layout(k: usize, group: usize, zero_points: bool) -> Self {
        let groups = if group >= k { None } else { Some(group) };
        let n_groups = k.div_ceil(group.min(k));
        Self::pack(Wna16Desc {
            n: 1,
            k,
            bits: 4,
            codes: &vec![0; k],
            group_size: WeightGroups::from_group_size(groups).expect("a group size"),
            scales: Wna16Scales::F32(&vec![1.0; n_groups]),
            zeros: zero_points.then_some(&vec![8; n_groups][..]),
            bias: None,
            perm: None,
        })
        .expect("valid weights")
    }
}

/// The packed int4 steps of the channels whose words `at` locates (AWQ's field shift unused).
/// Nibbles past `k` are cleared.
///
/// Each panel's steps are written in place, in the order its words are stored: where the
/// panel's channels are 16 consecutive words of one run's rows (GPTQ's `[K/8, N]`), each
/// stored row segment already is a packed step, and the steps of [`PANELS_PER_PASS`] panels
/// are copied together, step by step, so each stored row is read a run of 256 channels at a
/// time, the row [`ROWS_AHEAD`] steps on asked for first (each row is on another page, where
/// no hardware prefetcher follows); otherwise (compressed-tensors' `[N, K/8]`, MXFP4 blocks) each channel's words are read
/// as one sequential stream and scattered down the panel's column, whose steps stay cached
/// while its 16 channels are read. The buffer grows by whole passes and is never zero-filled
/// first: its storage starts zeroed, and every word of a pass is written once.
fn gather_words(at: &[ChannelWords<'_>], k: usize) -> AlignedVec<u32> {
    let k_steps = k.div_ceil(K_STEP);
    let panel_len = k_steps * PANEL;
    // Nibbles past K in the last step are padding: the packed format holds code 0 there.
    let tail = match k % K_STEP {
        0 => u32::MAX,
        r => (1u32 << (4 * r)) - 1,
    };
    let mut codes = AlignedVec::with_capacity(at.len().div_ceil(PANEL) * panel_len);
    for pass in at.chunks(PANEL * PANELS_PER_PASS) {
        let start = codes.len();
        codes.grow_to(start + pass.len().div_ceil(PANEL) * panel_len);
        let out = &mut codes[start..];
        let panels: Vec<_> = pass
            .chunks(PANEL)
            .map(|panel| (panel, consecutive_words(panel, PANEL)))
            .collect();
        let any_run = panels.iter().any(|(_, run)| run.is_some());
        for s in (0..k_steps).filter(|_| any_run) {
            for (i, (_, run)) in panels.iter().enumerate() {
                if let Some((words, first, stride)) = *run {
                    if let Some(ahead) = words.get(first + (s + ROWS_AHEAD) * stride) {
                        prefetch(ahead);
                    }
                    let stored: &[[u8; 4]; PANEL] =
                        words[first + s * stride..][..PANEL].try_into().unwrap();
                    let step: &mut [u32; PANEL] = (&mut out[i * panel_len + s * PANEL..][..PANEL])
                        .try_into()
                        .unwrap();
                    *step = stored.map(u32::from_le_bytes);
                }
            }
        }
        for (i, (panel, run)) in panels.iter().enumerate() {
            let steps = &mut out[i * panel_len..][..panel_len];
            if run.is_none() {
                // Channels past N stay 0 in the last panel.
                for (c, ch) in panel.iter().enumerate() {
                    scatter_channel(steps, c, ch, k_steps);
                }
            }
            for w in &mut steps[panel_len - PANEL..] {
                *w &= tail;
            }
        }
    }
    codes
}

/// Writes the `k_steps` words of the channel `ch` locates down column `c` of a panel's steps.
#[inline(always)]
fn scatter_channel(steps: &mut [u32], c: usize, ch: &ChannelWords<'_>, k_steps: usize) {
    let column = steps[c..].iter_mut().step_by(PANEL);
    if ch.stride == 1 {
        for (o, w) in column.zip(&ch.words[ch.first..][..k_steps]) {
            *o = u32::from_le_bytes(*w);
        }
    } else {
        let stored = ch.words[ch.first..].iter().step_by(ch.stride);
        for (o, w) in column.zip(stored) {
            *o = u32::from_le_bytes(*w);
        }
    }
}

/// Channels per AWQ word.
const AWQ_PACK: usize = 8;

/// Where one channel's codes are in its run's words (see [`PackedWna16::pack_words`]).
#[derive(Clone, Copy)]
struct ChannelWords<'a> {
    words: &'a [[u8; 4]],
    /// The word holding the channel's first codes.
    first: usize,
    /// Words between the channel's consecutive words (along K).
    stride: usize,
    /// AWQ: the bit offset of the channel's field (one code per word).
    shift: u32,
}

/// Panels whose tiles one pass over a row-major word matrix fills: 16 panels are 256
/// channels, so each stored row is read 1 KiB at a time instead of one 64-byte line per panel
/// and pass (a line per page, which no hardware prefetcher follows).
const PANELS_PER_PASS: usize = 16;

/// The packed int4 steps of AWQ words whose K values `perm` reorders (no checkpoint format
/// stores that, but the desc allows it): each panel's codes are first spread into a K-major
/// tile of one byte per code and 16 channels per K value (`K·16` bytes), filled K value by K
/// value for [`PANELS_PER_PASS`] panels per pass (each stored row read in order), then each
/// packed step is read from eight tile rows in packed K order and shifted into nibbles. The
/// tiles are reused, so nothing the size of the matrix is unpacked.
fn gather_awq_permuted(at: &[ChannelWords<'_>], k: usize, perm: &[u32]) -> AlignedVec<u32> {
    let k_steps = k.div_ceil(K_STEP);
    let n_panels = at.len().div_ceil(PANEL);
    let tile_len = k_steps * K_STEP * PANEL;
    let mut codes = AlignedVec::with_capacity(n_panels * k_steps * PANEL);
    // Rows past K stay 0 (the packed format's padding), as do channels past N.
    let mut tiles = vec![0u8; tile_len * PANELS_PER_PASS.min(n_panels)];
    for pass in at.chunks(PANEL * PANELS_PER_PASS) {
        if pass.len() < PANEL * PANELS_PER_PASS {
            tiles.fill(0);
        }
        for kk in 0..k {
            for (i, ch) in pass.iter().enumerate() {
                let w = ch.words[ch.first + kk * ch.stride];
                let code = ((u32::from_le_bytes(w) >> ch.shift) & 0xF) as u8;
                tiles[(i / PANEL) * tile_len + kk * PANEL + i % PANEL] = code;
            }
        }
        for tile in tiles
            .chunks_exact(tile_len)
            .take(pass.len().div_ceil(PANEL))
        {
            for s in 0..k_steps {
                let mut step = [0u32; PANEL];
                for j in 0..K_STEP {
                    // Packed K values past K read a padding row.
                    let row = perm
                        .get(s * K_STEP + j)
                        .map_or(s * K_STEP + j, |&r| r as usize);
                    for (w, &q) in step.iter_mut().zip(&tile[row * PANEL..][..PANEL]) {
                        *w |= u32::from(q) << (4 * j);
                    }
                }
                codes.extend_from_slice(&step);
            }
        }
    }
    codes
}

/// The packed int4 steps of AWQ words in K order: the eight words holding a step's eight K
/// values of eight channels are an 8 × 8 matrix of nibbles (row = K value, field = channel in
/// AWQ's order); transposed, field `f` becomes the step word of the channel stored in field
/// `f`. No byte per code is made. AWQ's words are row-major `[K, N/8]`, so the steps of
/// [`PANELS_PER_PASS`] panels are made together, K step by K step: each stored row is read a
/// run of channels at a time rather than one word per row and panel. Eight word columns that
/// sit side by side in one run (four panels) are transposed together, one column per lane
/// (which vectorises); the others one column at a time.
fn gather_awq(at: &[ChannelWords<'_>], k: usize) -> AlignedVec<u32> {
    let k_steps = k.div_ceil(K_STEP);
    // Every run holds whole words of eight channels and panels start at multiples of 16, so
    // each half panel is one stored word column of one run: its first channel locates it.
    let columns: Vec<ChannelWords<'_>> = at.chunks(AWQ_PACK).map(|half| half[0]).collect();
    // Channels past N stay 0 in the last panel.
    let mut codes = AlignedVec::zeroed(at.len().div_ceil(PANEL) * k_steps * PANEL);
    // Where half panel `h`'s eight words of step `s` go.
    let out_at = |h: usize, s: usize| ((h / 2) * k_steps + s) * PANEL + (h % 2) * AWQ_PACK;
    for (pass, group) in columns.chunks(2 * PANELS_PER_PASS).enumerate() {
        let first_half = pass * 2 * PANELS_PER_PASS;
        for s in 0..k_steps {
            let rows = K_STEP.min(k - s * K_STEP);
            // The rows of a later step, a cache line per 16 word columns of the pass.
            let lead = group[0];
            for r in 0..K_STEP {
                let at = lead.first + ((s + AWQ_STEPS_AHEAD) * K_STEP + r) * lead.stride;
                for line in (0..group.len()).step_by(16) {
                    if let Some(ahead) = lead.words.get(at + line) {
                        prefetch(ahead);
                    }
                }
            }
            for (b, block) in group.chunks(AWQ_PACK).enumerate() {
                let block_half = first_half + b * AWQ_PACK;
                if let Some((words, first, stride)) = consecutive_words(block, AWQ_PACK) {
                    let steps = awq_block_steps(words, first + s * K_STEP * stride, stride, rows);
                    for (g, step) in steps.iter().enumerate() {
                        codes[out_at(block_half + g, s)..][..AWQ_PACK].copy_from_slice(step);
                    }
                    continue;
                }
                for (g, col) in block.iter().enumerate() {
                    let mut m = [[0u32; 1]; K_STEP];
                    for (r, v) in m.iter_mut().enumerate().take(rows) {
                        v[0] = u32::from_le_bytes(
                            col.words[col.first + (s * K_STEP + r) * col.stride],
                        );
                    }
                    transpose_nibbles(&mut m);
                    let out = &mut codes[out_at(block_half + g, s)..][..AWQ_PACK];
                    for (o, &f) in out.iter_mut().zip(&AWQ_FIELD_OF_CHANNEL) {
                        *o = m[f][0];
                    }
                }
            }
        }
    }
    codes
}

/// The step words of one block of eight AWQ word columns side by side, at one step: from
/// `rows` stored rows (row `r` is the eight words at `words[at + r·stride..]`; rows past
/// `rows`, beyond K, count as zeros), `steps[g][o]` is the step word of the channel in word
/// column `g`'s field for channel `o` ([`AWQ_FIELD_OF_CHANNEL`]): word `o` of column `g`'s half
/// panel. The eight words of a row are the 8 × 8 nibble matrices' rows, one matrix per column
/// ([`transpose_nibbles`]), and the columns' step words are then transposed into the half
/// panels' order; with AVX2 each row is one register through both transposes.
fn awq_block_steps(words: &[[u8; 4]], at: usize, stride: usize, rows: usize) -> [[u32; 8]; 8] {
    let rows = rows.min(K_STEP);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above, all the function needs.
        return unsafe { awq_block_steps_avx2(words, at, stride, rows) };
    }
    awq_block_steps_portable(words, at, stride, rows)
}

/// [`awq_block_steps`] one 32-bit lane at a time, for any target (`rows ≤ 8`).
fn awq_block_steps_portable(
    words: &[[u8; 4]],
    at: usize,
    stride: usize,
    rows: usize,
) -> [[u32; 8]; 8] {
    let mut m = [[0u32; AWQ_PACK]; K_STEP];
    for (r, lanes) in m.iter_mut().enumerate().take(rows) {
        let row: &[[u8; 4]; AWQ_PACK] = words[at + r * stride..][..AWQ_PACK].try_into().unwrap();
        *lanes = row.map(u32::from_le_bytes);
    }
    transpose_nibbles(&mut m);
    std::array::from_fn(|g| std::array::from_fn(|o| m[AWQ_FIELD_OF_CHANNEL[o]][g]))
}

/// [`awq_block_steps`] in 256-bit registers: the nibble transpose's rounds of block swaps on
/// all eight columns at once, then the 8 × 8 transpose of 32-bit words (unpacks of 32 and 64
/// bits, then 128-bit halves), its rows taken in the half panels' channel order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn awq_block_steps_avx2(words: &[[u8; 4]], at: usize, stride: usize, rows: usize) -> [[u32; 8]; 8] {
    use std::arch::x86_64::*;
    let mut m = [_mm256_setzero_si256(); K_STEP];
    for (r, lanes) in m.iter_mut().enumerate().take(rows) {
        let row: &[[u8; 4]; AWQ_PACK] = words[at + r * stride..][..AWQ_PACK].try_into().unwrap();
        // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
        *lanes = unsafe { _mm256_loadu_si256(row.as_ptr().cast()) };
    }
    /// Rows `a` and `b` of every column exchange the fields a transpose swaps (as
    /// [`swap_fields`]).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn swap<const BITS: i32>(m: &mut [__m256i; K_STEP], a: usize, b: usize, mask: i32) {
        let mask = _mm256_set1_epi32(mask);
        let t = _mm256_and_si256(
            _mm256_xor_si256(_mm256_srli_epi32::<BITS>(m[a]), m[b]),
            mask,
        );
        m[a] = _mm256_xor_si256(m[a], _mm256_slli_epi32::<BITS>(t));
        m[b] = _mm256_xor_si256(m[b], t);
    }
    for r in 0..4 {
        swap::<16>(&mut m, r, r + 4, 0x0000_FFFF);
    }
    for r in [0, 1, 4, 5] {
        swap::<8>(&mut m, r, r + 2, 0x00FF_00FF);
    }
    for r in [0, 2, 4, 6] {
        swap::<4>(&mut m, r, r + 1, 0x0F0F_0F0F);
    }
    // Row `o` of the word transpose is field `AWQ_FIELD_OF_CHANNEL[o]`, so that its column
    // `g` comes out in the half panel's channel order.
    let x: [__m256i; 8] = std::array::from_fn(|o| m[AWQ_FIELD_OF_CHANNEL[o]]);
    let t = [
        _mm256_unpacklo_epi32(x[0], x[1]),
        _mm256_unpackhi_epi32(x[0], x[1]),
        _mm256_unpacklo_epi32(x[2], x[3]),
        _mm256_unpackhi_epi32(x[2], x[3]),
        _mm256_unpacklo_epi32(x[4], x[5]),
        _mm256_unpackhi_epi32(x[4], x[5]),
        _mm256_unpacklo_epi32(x[6], x[7]),
        _mm256_unpackhi_epi32(x[6], x[7]),
    ];
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    let columns = [
        _mm256_permute2x128_si256::<0x20>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x20>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x20>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x20>(u[3], u[7]),
        _mm256_permute2x128_si256::<0x31>(u[0], u[4]),
        _mm256_permute2x128_si256::<0x31>(u[1], u[5]),
        _mm256_permute2x128_si256::<0x31>(u[2], u[6]),
        _mm256_permute2x128_si256::<0x31>(u[3], u[7]),
    ];
    let mut steps = [[0u32; 8]; 8];
    for (step, column) in steps.iter_mut().zip(columns) {
        // SAFETY: the array holds 32 writable bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(step.as_mut_ptr().cast(), column) };
    }
    steps
}

/// How many steps ahead of the one being made [`gather_awq`] asks for its stored rows: each
/// of a step's eight rows is on another page (rows are `N/2` bytes apart), where no hardware
/// prefetcher follows.
const AWQ_STEPS_AHEAD: usize = 8;

/// Transposes `L` independent 8 × 8 matrices of nibbles, lane by lane (matrix `l`: row `r` =
/// `m[r][l]`, column `f` = bits `4f..4f+4`), in three rounds of block swaps: 4 × 4 blocks,
/// then 2 × 2, then single nibbles.
fn transpose_nibbles<const L: usize>(m: &mut [[u32; L]; 8]) {
    for r in 0..4 {
        swap_fields(m, r, r + 4, 16, 0x0000_FFFF);
    }
    for r in [0, 1, 4, 5] {
        swap_fields(m, r, r + 2, 8, 0x00FF_00FF);
    }
    for r in [0, 2, 4, 6] {
        swap_fields(m, r, r + 1, 4, 0x0F0F_0F0F);
    }
}

/// Swaps, lane by lane, the fields of rows `a` and `b` that a transpose exchanges: bits
/// `bits..` of the upper row's fields under `mask << bits` with the lower row's under `mask`.
#[inline(always)]
fn swap_fields<const L: usize, const R: usize>(
    m: &mut [[u32; L]; R],
    a: usize,
    b: usize,
    bits: u32,
    mask: u32,
) {
    let (upper, lower) = m.split_at_mut(b);
    for (x, y) in upper[a].iter_mut().zip(&mut lower[0]) {
        let t = ((*x >> bits) ^ *y) & mask;
        *x ^= t << bits;
        *y ^= t;
    }
}

/// Transposes `L` independent 4 × 4 matrices of bytes, lane by lane (matrix `l`: row `r` =
/// `m[r][l]`, column `f` = bits `8f..8f+8`), in two rounds of block swaps: 2 × 2 blocks, then
/// single bytes.
fn transpose_bytes<const L: usize>(m: &mut [[u32; L]; 4]) {
    for r in 0..2 {
        swap_fields(m, r, r + 2, 16, 0x0000_FFFF);
    }
    for r in [0, 2] {
        swap_fields(m, r, r + 1, 8, 0x00FF_00FF);
    }
}

/// The packed int4 steps of channels whose K order `perm` reorders (act-order GPTQ): packed K
/// value `j` is stored K value `perm[j]`, nibble `perm[j] % 8` of the channel's word
/// `perm[j] / 8`, so each packed step takes its eight nibbles straight from the stored words
/// (no byte per code is made). Where a panel's sixteen channels are sixteen consecutive words
/// of one run's rows (GPTQ's `[K/8, N]` `qweight`), one run of 16 stored words serves the
/// whole panel at once (which vectorises); other panels read each channel's word. The steps of
/// [`panels_per_pass`] panels are made together, step by step, so that GPTQ's stored rows are
/// read in runs of up to 256 channels and stay cached for the later steps that read their
/// other nibbles.
fn gather_permuted_int4(at: &[ChannelWords<'_>], k: usize, perm: &[u32]) -> AlignedVec<u32> {
    // K values past K stay 0 in the last step.
    steps_by_pass(at, k.div_ceil(K_STEP), |panel, s, out| {
        let sources = &perm[s * K_STEP..k.min((s + 1) * K_STEP)];
        let step = match panel.run {
            Some((words, first, stride)) => permuted_run_step(words, first, stride, sources),
            None => {
                let mut step = [0u32; PANEL];
                for (j, &src) in sources.iter().enumerate() {
                    let (word, shift) = source_of(src);
                    for (out, ch) in step.iter_mut().zip(panel.channels) {
                        let w = u32::from_le_bytes(ch.words[ch.first + word * ch.stride]);
                        *out |= ((w >> shift) & 0xF) << (4 * j);
                    }
                }
                step
            }
        };
        out.copy_from_slice(&step);
    })
}

/// The stored word (along K) and bit offset of stored K value `src` in an int4 channel.
fn source_of(src: u32) -> (usize, u32) {
    (src as usize / K_STEP, 4 * (src % K_STEP as u32))
}

/// One packed step of a panel whose 16 channels are consecutive stored words (GPTQ's
/// `[K/8, N]`, the run's `words`, `first` and `stride`): nibble `j` of each channel's step is
/// stored K value `sources[j]` (at most 8), taken from the 16 words of its stored row at once.
fn permuted_run_step(
    words: &[[u8; 4]],
    first: usize,
    stride: usize,
    sources: &[u32],
) -> [u32; PANEL] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above, all the function needs.
        return unsafe { permuted_run_step_avx2(words, first, stride, sources) };
    }
    permuted_run_step_portable(words, first, stride, sources)
}

/// [`permuted_run_step`] one 32-bit lane at a time, for any target.
fn permuted_run_step_portable(
    words: &[[u8; 4]],
    first: usize,
    stride: usize,
    sources: &[u32],
) -> [u32; PANEL] {
    let mut step = [0u32; PANEL];
    for (j, &src) in sources.iter().enumerate().take(K_STEP) {
        let (word, shift) = source_of(src);
        let row: &[[u8; 4]; PANEL] = words[first + word * stride..][..PANEL].try_into().unwrap();
        for (out, &w) in step.iter_mut().zip(row) {
            *out |= ((u32::from_le_bytes(w) >> shift) & 0xF) << (4 * j);
        }
    }
    step
}

/// [`permuted_run_step`] in two 256-bit registers of 8 channels each: one shift moves the
/// source nibble of every channel to its place in the step (right or left, by the difference
/// of the two offsets), one AND keeps it, one OR adds it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn permuted_run_step_avx2(
    words: &[[u8; 4]],
    first: usize,
    stride: usize,
    sources: &[u32],
) -> [u32; PANEL] {
    use std::arch::x86_64::*;
    let mut step = [_mm256_setzero_si256(); 2];
    for (j, &src) in sources.iter().enumerate().take(K_STEP) {
        let (word, shift) = source_of(src);
        let row: &[[u8; 4]; PANEL] = words[first + word * stride..][..PANEL].try_into().unwrap();
        let place = 4 * j as u32;
        let keep = _mm256_set1_epi32((0xF_u32 << place) as i32);
        let by = _mm_cvtsi32_si128(shift.abs_diff(place) as i32);
        for (half, acc) in row.as_chunks::<8>().0.iter().zip(&mut step) {
            // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
            let v = unsafe { _mm256_loadu_si256(half.as_ptr().cast()) };
            let moved = if shift >= place {
                _mm256_srl_epi32(v, by)
            } else {
                _mm256_sll_epi32(v, by)
            };
            *acc = _mm256_or_si256(*acc, _mm256_and_si256(moved, keep));
        }
    }
    let mut out = [0u32; PANEL];
    for (half, acc) in out.as_chunks_mut::<8>().0.iter_mut().zip(step) {
        // SAFETY: the array holds 32 writable bytes; the store is unaligned.
        unsafe { _mm256_storeu_si256(half.as_mut_ptr().cast(), acc) };
    }
    out
}

/// The packed int8 steps of channels stored as words of four K values (GPTQ's `[K/4, N]`,
/// compressed-tensors' `[N, K/4]`), K values reordered by `perm` if given. In K order a
/// channel's stored word `s` is its step `s`, so a step's four byte rows are the 16 words'
/// bytes transposed; with `perm`, byte `j` of a channel's step is byte `src % 4` of its word
/// `src / 4`, `src` the stored K value of packed K value `4s + j`. Where a panel's channels are
/// consecutive words (GPTQ), one run of 16 stored words is read at once, else channel by
/// channel; the steps of [`panels_per_pass`] panels are made together, as in
/// [`gather_permuted_int4`].
fn gather_int8(at: &[ChannelWords<'_>], k: usize, perm: Option<&[u32]>) -> AlignedVec<u32> {
    if perm.is_none() && at.iter().all(|ch| ch.stride == 1) {
        return gather_int8_by_channels(at, k);
    }
    // K values past K stay 0 in the last step.
    steps_by_pass(at, k.div_ceil(K_STEP8), |panel, s, out| {
        let rows = K_STEP8.min(k - s * K_STEP8);
        match perm {
            // Each stored word is one channel's step: the words of four channels,
            // transposed as a 4 × 4 byte matrix, are the step's four words of those
            // channels (one per K value).
            None => {
                // `m[r][g]`: the word of channel `4g + r`.
                let mut m = [[0u32; 4]; K_STEP8];
                let mut word = |c: usize, w: [u8; 4]| m[c % 4][c / 4] = u32::from_le_bytes(w);
                match panel.run {
                    Some((words, first, stride)) => {
                        if let Some(ahead) = words.get(first + (s + ROWS_AHEAD) * stride) {
                            prefetch(ahead);
                        }
                        for (c, &w) in words[first + s * stride..][..PANEL].iter().enumerate() {
                            word(c, w);
                        }
                    }
                    None => {
                        for (c, ch) in panel.channels.iter().enumerate() {
                            word(c, ch.words[ch.first + s * ch.stride]);
                        }
                    }
                }
                transpose_bytes(&mut m);
                for (j, row) in m.iter().enumerate().take(rows) {
                    out[j * 4..][..4].copy_from_slice(row);
                }
            }
            Some(perm) => {
                let mut step = [[0u8; PANEL]; K_STEP8];
                for (j, row) in step.iter_mut().enumerate().take(rows) {
                    let src = perm[s * K_STEP8 + j] as usize;
                    let (word, byte) = (src / K_STEP8, src % K_STEP8);
                    match panel.run {
                        Some((words, first, stride)) => {
                            let stored: &[[u8; 4]; PANEL] =
                                words[first + word * stride..][..PANEL].try_into().unwrap();
                            for (b, w) in row.iter_mut().zip(stored) {
                                *b = w[byte];
                            }
                        }
                        None => {
                            for (b, ch) in row.iter_mut().zip(panel.channels) {
                                *b = ch.words[ch.first + word * ch.stride][byte];
                            }
                        }
                    }
                }
                for (o, b) in out.iter_mut().zip(step.as_flattened().as_chunks::<4>().0) {
                    *o = u32::from_le_bytes(*b);
                }
            }
        }
    })
}

/// The packed int8 steps of channel-major words (`[N, K/4]`) in K order: as
/// [`gather_int8`], four channels' words of a step transposed as a 4 × 4 byte matrix are word
/// `g` of the step's four K rows, but the four channels of each such column are read from
/// start to end before the next four, so four sequential streams are read at a time rather
/// than a panel's sixteen. Each panel's steps are written in place; K values past K and
/// channels past N stay 0.
fn gather_int8_by_channels(at: &[ChannelWords<'_>], k: usize) -> AlignedVec<u32> {
    const LANES: usize = 4;
    let k_steps = k.div_ceil(K_STEP8);
    let panel_len = k_steps * PANEL;
    let mut codes = AlignedVec::with_capacity(at.len().div_ceil(PANEL) * panel_len);
    for panel in at.chunks(PANEL) {
        let start = codes.len();
        codes.grow_to(start + panel_len);
        let steps = &mut codes[start..];
        for (g, four) in panel.chunks(4).enumerate() {
            let words: Vec<&[[u8; 4]]> = four
                .iter()
                .map(|ch| &ch.words[ch.first..][..k_steps])
                .collect();
            // Four steps at a time, one per lane (which vectorises), then the rest one by one.
            let whole = k_steps / LANES * LANES;
            for s0 in (0..whole).step_by(LANES) {
                // `m[r][l]`: the word of channel `4g + r` at step `s0 + l`.
                let mut m = [[0u32; LANES]; K_STEP8];
                for (row, w) in m.iter_mut().zip(&words) {
                    let four: &[[u8; 4]; LANES] = w[s0..][..LANES].try_into().unwrap();
                    *row = four.map(u32::from_le_bytes);
                }
                transpose_bytes(&mut m);
                for l in 0..LANES {
                    let s = s0 + l;
                    let rows = K_STEP8.min(k - s * K_STEP8);
                    for (j, row) in m.iter().enumerate().take(rows) {
                        steps[s * PANEL + j * 4 + g] = row[l];
                    }
                }
            }
            for s in whole..k_steps {
                let mut m = [[0u32; 1]; K_STEP8];
                for (row, w) in m.iter_mut().zip(&words) {
                    row[0] = u32::from_le_bytes(w[s]);
                }
                transpose_bytes(&mut m);
                let rows = K_STEP8.min(k - s * K_STEP8);
                for (j, row) in m.iter().enumerate().take(rows) {
                    steps[s * PANEL + j * 4 + g] = row[0];
                }
            }
        }
    }
    codes
}

/// How many stored rows ahead of the one being gathered [`prefetch`] asks for.
const ROWS_AHEAD: usize = 8;

/// Asks for the cache line of `word` ahead of its use: the rows of a row-major word matrix
/// are read a chunk at a time, each on another page, where no hardware prefetcher follows.
/// A hint only; nothing on other architectures.
#[inline]
fn prefetch(word: &[u8; 4]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE, all `prefetcht0` needs, is part of every x86_64 CPU; a prefetch reads
        // nothing the program sees and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(word.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

/// A panel's channel locations and, where they are consecutive stored words, their run (see
/// [`consecutive_words`]).
#[derive(Clone, Copy)]
struct PanelWords<'p, 'a> {
    channels: &'p [ChannelWords<'a>],
    run: Option<(&'a [[u8; 4]], usize, usize)>,
}

/// The packed steps of the panels of `at`, `k_steps` each, every one written by
/// `make(panel, s, out)` into its 16 zeroed words: [`panels_per_pass`] panels at a time, step
/// by step within a pass. Channels past N stay 0 in the last panel.
fn steps_by_pass(
    at: &[ChannelWords<'_>],
    k_steps: usize,
    mut make: impl FnMut(PanelWords<'_, '_>, usize, &mut [u32]),
) -> AlignedVec<u32> {
    let panels: Vec<&[ChannelWords<'_>]> = at.chunks(PANEL).collect();
    let mut codes = AlignedVec::zeroed(panels.len() * k_steps * PANEL);
    let per_pass = panels_per_pass(at);
    for (pass, group) in panels.chunks(per_pass).enumerate() {
        let words: Vec<PanelWords<'_, '_>> = group
            .iter()
            .map(|&channels| PanelWords {
                channels,
                run: consecutive_words(channels, PANEL),
            })
            .collect();
        for s in 0..k_steps {
            for (i, &panel) in words.iter().enumerate() {
                let p = pass * per_pass + i;
                make(panel, s, &mut codes[(p * k_steps + s) * PANEL..][..PANEL]);
            }
        }
    }
    codes
}

/// Panels whose steps one pass makes together: [`PANELS_PER_PASS`] where the stored words run
/// along the channels (each stored row then read a run of channels at a time), one where they
/// run along K (channel-major: a panel's 16 channels are then 16 sequential streams, and more
/// panels at once would be more streams than the hardware prefetchers follow).
fn panels_per_pass(at: &[ChannelWords<'_>]) -> usize {
    if at.first().is_some_and(|ch| ch.stride > 1) {
        PANELS_PER_PASS
    } else {
        1
    }
}

/// The words, first word and stride shared by `count` locations when they are `count`
/// consecutive words of one run's rows (a panel's channels in GPTQ's `[K/8, N]`, eight AWQ
/// word columns side by side); `None` otherwise (fewer locations, a span across two runs,
/// channel-major words of more than one word per channel).
fn consecutive_words<'a>(
    at: &[ChannelWords<'a>],
    count: usize,
) -> Option<(&'a [[u8; 4]], usize, usize)> {
    let c0 = at.first()?;
    let together = at.len() == count
        && at.iter().enumerate().all(|(c, ch)| {
            std::ptr::eq(ch.words, c0.words) && ch.stride == c0.stride && ch.first == c0.first + c
        });
    together.then_some((c0.words, c0.first, c0.stride))
}

/// Writes row `row`'s int8 codes (`K` bytes) into the packed int8 steps.
fn put_bytes(codes: &mut [u32], k_steps: usize, row: usize, src: &[u8]) {
    let (p, c) = (row / PANEL, row % PANEL);
    for (col, &code) in src.iter().enumerate() {
        let (word, shift) = code_at(8, c, col);
        codes[(p * k_steps + col / K_STEP8) * PANEL + word] |= u32::from(code) << shift;
    }
}

/// Where the code of channel `c` (within its panel) at K value `col` lives inside its step:
/// `(word, bit shift)`.
fn code_at(bits: u32, c: usize, col: usize) -> (usize, u32) {
    if bits == 4 {
        (c, 4 * (col % K_STEP) as u32)
    } else {
        let byte = (col % K_STEP8) * PANEL + c;
        (byte / 4, 8 * (byte % 4) as u32)
    }
}

/// Copies `[N, G]` values into the `[P][G][16]` layout (padding stays default).
fn scatter<T: Copy + Default>(
    n: usize,
    g: usize,
    len: usize,
    src: &[T],
    at: impl Fn(usize, usize) -> usize,
) -> Vec<T> {
    let mut v = vec![T::default(); len];
    for row in 0..n {
        for gi in 0..g {
            v[at(row, gi)] = src[row * g + gi];
        }
    }
    v
}

/// Refuses codes above `max`.
fn check_codes(tensor: &'static str, v: &[u8], max: u8) -> Result<(), KernelError> {
    if all_branch_free(v, |c| c <= max) {
        return Ok(());
    }
    match v.iter().position(|&c| c > max) {
        Some(index) => Err(KernelError::ValueOutOfRange {
            tensor,
            index,
            value: i64::from(v[index]),
            min: 0,
            max: i64::from(max),
        }),
        None => Ok(()),
    }
}

/// Refuses NaN and infinities.
fn check_finite(
    tensor: &'static str,
    len: usize,
    v: impl Fn(usize) -> f32,
) -> Result<(), KernelError> {
    match (0..len).find(|&i| !v(i).is_finite()) {
        Some(index) => Err(KernelError::NonFiniteWeight {
            tensor,
            index,
            value: v(index).to_string(),
        }),
        None => Ok(()),
    }
}

/// Refuses anything but a permutation of `0..k`.
fn check_perm(p: &[u32], k: usize) -> Result<(), KernelError> {
    check_len("perm", k, p.len())?;
    let mut seen = vec![false; k];
    for (index, &v) in p.iter().enumerate() {
        let v = v as usize;
        if v >= k || seen[v] {
            return Err(KernelError::ValueOutOfRange {
                tensor: "perm",
                index,
                value: v as i64,
                min: 0,
                max: k as i64 - 1,
            });
        }
        seen[v] = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_testutil::SplitMix64;

    fn desc<'a>(
        n: usize,
        k: usize,
        codes: &'a [u8],
        g: Option<usize>,
        s: &'a [bf16],
    ) -> Wna16Desc<'a> {
        Wna16Desc {
            n,
            k,
            bits: 4,
            codes,
            group_size: WeightGroups::from_group_size(g).unwrap(),
            scales: Wna16Scales::Bf16(s),
            zeros: None,
            bias: None,
            perm: None,
        }
    }

    #[test]
    fn unpack_inverts_pack_on_ragged_shapes() {
        let mut rng = SplitMix64::new(3);
        let shapes: [(usize, usize, Option<usize>); 4] = [
            (1, 1, None),
            (17, 35, Some(16)),
            (33, 64, Some(32)),
            (5, 130, Some(64)),
        ];
        for ((n, k, g), bits) in shapes.into_iter().flat_map(|s| [(s, 4), (s, 8)]) {
            let groups = g.map_or(1, |g| k.div_ceil(g));
            let levels = 1u64 << bits;
            let codes: Vec<u8> = (0..n * k)
                .map(|_| (rng.next_u64() % levels) as u8)
                .collect();
            let zeros: Vec<u8> = (0..n * groups)
                .map(|_| (rng.next_u64() % levels) as u8)
                .collect();
            let scales: Vec<f16> = (0..n * groups)
                .map(|i| f16::from_f32(0.01 + i as f32 * 1e-3))
                .collect();
            let p = PackedWna16::pack(Wna16Desc {
                n,
                k,
                bits,
                codes: &codes,
                group_size: WeightGroups::from_group_size(g).unwrap(),
                scales: Wna16Scales::F16(&scales),
                zeros: Some(&zeros),
                bias: None,
                perm: None,
            })
            .unwrap();
            let (c, s, z) = p.unpack();
            assert_eq!(c, codes);
            assert_eq!(z, zeros);
            let want: Vec<f32> = scales.iter().map(|v| v.to_f32()).collect();
            assert_eq!(s, want);
            assert_eq!(p.n_groups(), groups);
        }
    }

    /// Channel `c`'s words `[ceil(K·bits/32)]` of codes `[N, K]`, with `pad` in the fields
    /// past K.
    fn words_of(codes: &[u8], k: usize, c: usize, pad: u32, bits: u32) -> Vec<u32> {
        let row = &codes[c * k..][..k];
        let pf = (32 / bits) as usize;
        (0..k.div_ceil(pf))
            .map(|s| {
                (0..pf).fold(0u32, |w, j| {
                    let q = row.get(s * pf + j).map_or(pad, |&q| u32::from(q));
                    w | (q << (bits as usize * j))
                })
            })
            .collect()
    }

    /// Little-endian bytes of channels `range` in `order`.
    fn run_bytes(
        codes: &[u8],
        k: usize,
        range: std::ops::Range<usize>,
        order: WordOrder,
        pad: u32,
        bits: u32,
    ) -> Vec<u8> {
        let words: Vec<u32> = match order {
            WordOrder::Awq => {
                let first = range.start;
                let n = range.len();
                (0..k)
                    .flat_map(|kk| {
                        (0..n / AWQ_PACK).map(move |w| {
                            (0..AWQ_PACK).fold(0u32, |word, c| {
                                let q = u32::from(codes[(first + AWQ_PACK * w + c) * k + kk]);
                                word | (q << (4 * AWQ_FIELD_OF_CHANNEL[c]))
                            })
                        })
                    })
                    .collect()
            }
            _ => {
                let rows: Vec<Vec<u32>> = range.map(|c| words_of(codes, k, c, pad, bits)).collect();
                let per = k.div_ceil((32 / bits) as usize);
                match order {
                    WordOrder::ChannelMajor => rows.concat(),
                    _ => (0..per)
                        .flat_map(|s| rows.iter().map(move |r| r[s]))
                        .collect(),
                }
            }
        };
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// `pack_words` equals `pack` of the same codes for every width, word order and K order,
    /// on ragged shapes (K past a step, N past a panel, runs of any length).
    #[test]
    fn pack_words_equals_pack_of_the_codes() {
        let mut rng = SplitMix64::new(11);
        // The last two span more than one pass of row-major words (16 panels, 256 channels),
        // the last pass partial.
        let shapes: [(usize, usize, Option<usize>); 11] = [
            (1, 1, None),
            (1, 8, Some(8)),
            (7, 35, Some(16)),
            (17, 35, None),
            (33, 64, Some(32)),
            (16, 130, Some(64)),
            (31, 256, Some(128)),
            (48, 301, Some(128)),
            (40, 67, Some(8)),
            (273, 24, Some(8)),
            (520, 17, None),
        ];
        for (n, k, g) in shapes {
            let groups = g.map_or(1, |g| k.div_ceil(g));
            let scales: Vec<bf16> = (0..n * groups)
                .map(|i| bf16::from_f32(0.01 + i as f32 * 1e-3))
                .collect();
            let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            // A random permutation of K (act-order sorted by group).
            let mut perm: Vec<u32> = (0..k as u32).collect();
            for i in (1..k).rev() {
                perm.swap(i, (rng.next_u64() as usize) % (i + 1));
            }
            for bits in [4u32, 8] {
                let max = (1u64 << bits) - 1;
                let codes: Vec<u8> = (0..n * k)
                    .map(|_| (rng.next_u64() % (max + 1)) as u8)
                    .collect();
                let zeros: Vec<u8> = (0..n * groups)
                    .map(|_| (rng.next_u64() % (max + 1)) as u8)
                    .collect();
                for (asym, permuted) in [(false, false), (true, false), (false, true), (true, true)]
                {
                    let perm = permuted.then_some(perm.as_slice());
                    // The codes `pack` takes are in packed K order.
                    let sorted: Vec<u8> = match perm {
                        None => codes.clone(),
                        Some(p) => (0..n * k)
                            .map(|i| codes[(i / k) * k + p[i % k] as usize])
                            .collect(),
                    };
                    let want = PackedWna16::pack(Wna16Desc {
                        n,
                        k,
                        bits,
                        codes: &sorted,
                        group_size: WeightGroups::from_group_size(g).unwrap(),
                        scales: Wna16Scales::Bf16(&scales),
                        zeros: asym.then_some(zeros.as_slice()),
                        bias: asym.then_some(bias.as_slice()),
                        perm,
                    })
                    .unwrap();
                    let orders: &[WordOrder] = match (bits, n % AWQ_PACK) {
                        (4, 0) => &[
                            WordOrder::ChannelMajor,
                            WordOrder::StepMajor,
                            WordOrder::Awq,
                        ],
                        _ => &[WordOrder::ChannelMajor, WordOrder::StepMajor],
                    };
                    for &order in orders {
                        // Split the channels into one, two or three runs (a fused gate/up
                        // matrix), whole AWQ words each.
                        let unit = if order == WordOrder::Awq { AWQ_PACK } else { 1 };
                        let cut = (rng.next_u64() as usize) % (n / unit + 1) * unit;
                        let cuts = [0, cut, n];
                        let pad = (rng.next_u64() % (max + 1)) as u32;
                        let bytes: Vec<Vec<u8>> = cuts
                            .windows(2)
                            .map(|w| run_bytes(&codes, k, w[0]..w[1], order, pad, bits))
                            .collect();
                        let rows: Vec<WordRows<'_>> = cuts
                            .windows(2)
                            .zip(&bytes)
                            .map(|(w, b)| WordRows {
                                channels: w[1] - w[0],
                                bytes: b,
                            })
                            .collect();
                        let got = PackedWna16::pack_words(Wna16WordsDesc {
                            n,
                            k,
                            bits,
                            order,
                            rows: &rows,
                            group_size: WeightGroups::from_group_size(g).unwrap(),
                            scales: Wna16Scales::Bf16(&scales),
                            zeros: asym.then_some(zeros.as_slice()),
                            bias: asym.then_some(bias.as_slice()),
                            perm,
                        })
                        .unwrap();
                        assert_eq!(
                            got, want,
                            "n {n} k {k} g {g:?} bits {bits} asym {asym} perm {permuted} {order:?}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 transposes of an AWQ block give the portable code's step words, for every
    /// count of stored rows (a last step short of K) and rows strided as in a run.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn awq_block_steps_agree_with_and_without_avx2() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("note: skipping the AVX2 AWQ block: no AVX2");
            return;
        }
        let mut rng = SplitMix64::new(0xa3a);
        let stride = 24;
        let words: Vec<[u8; 4]> = (0..9 * stride)
            .map(|_| (rng.next_u64() as u32).to_le_bytes())
            .collect();
        for rows in 0..=K_STEP {
            for at in [0, 5, stride - AWQ_PACK] {
                // SAFETY: AVX2 was detected above.
                let got = unsafe { awq_block_steps_avx2(&words, at, stride, rows) };
                let want = awq_block_steps_portable(&words, at, stride, rows);
                assert_eq!(got, want, "rows {rows} at {at}");
            }
        }
    }

    /// The AVX2 step of an act-order GPTQ panel equals the portable one for every count of
    /// sources (a last step short of K) and nibble offsets above, below and at their place.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn permuted_run_steps_agree_with_and_without_avx2() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            eprintln!("note: skipping the AVX2 act-order step: no AVX2");
            return;
        }
        let mut rng = SplitMix64::new(0x9e7);
        let (stride, k) = (40, 64);
        let words: Vec<[u8; 4]> = (0..k / K_STEP * stride)
            .map(|_| (rng.next_u64() as u32).to_le_bytes())
            .collect();
        for n_sources in 0..=K_STEP {
            for first in [0, 3, stride - PANEL] {
                let sources: Vec<u32> = (0..n_sources).map(|_| rng.below(k) as u32).collect();
                // SAFETY: AVX2 was detected above.
                let got = unsafe { permuted_run_step_avx2(&words, first, stride, &sources) };
                let want = permuted_run_step_portable(&words, first, stride, &sources);
                assert_eq!(got, want, "sources {sources:?} first {first}");
            }
        }
    }

    /// MXFP4 blocks decode to the codes the checkpoint format defines (element `2j` of a block
    /// in the low nibble of byte `j`), nibbles past K dropped, and e8m0 scales to `2^(e − 127)`
    /// exactly, the subnormal `2^-127` and the largest, `2^127`, included.
    #[test]
    fn pack_mxfp4_decodes_blocks_and_e8m0_scales() {
        let mut rng = SplitMix64::new(0x4f4);
        for (n, k) in [
            (1usize, 1usize),
            (3, 32),
            (17, 33),
            (16, 64),
            (33, 100),
            (5, 2880),
        ] {
            let nb = k.div_ceil(MXFP4_BLOCK);
            let blocks: Vec<u8> = (0..n * nb * 16).map(|_| rng.next_u64() as u8).collect();
            let mut e8m0: Vec<u8> = (0..n * nb).map(|_| (rng.next_u64() % 255) as u8).collect();
            e8m0[0] = 0;
            *e8m0.last_mut().unwrap() = 254;
            let bias: Vec<f32> = (0..n).map(|i| i as f32 - 1.5).collect();
            let p = PackedWna16::pack_mxfp4(Mxfp4Desc {
                n,
                k,
                blocks: &blocks,
                scales: &e8m0,
                bias: Some(&bias),
            })
            .unwrap();
            assert_eq!(p.values(), Int4Values::E2m1);
            assert_eq!((p.group_size(), p.n_groups()), (MXFP4_BLOCK, nb));
            assert!(!p.is_asymmetric() && !p.is_channelwise());
            let (codes, scales, zeros) = p.unpack();
            for row in 0..n {
                for col in 0..k {
                    let byte = blocks[row * nb * 16 + col / 2];
                    let want = if col % 2 == 0 { byte & 0xF } else { byte >> 4 };
                    assert_eq!(codes[row * k + col], want, "n {n} k {k} [{row}, {col}]");
                }
            }
            for (i, (&s, &e)) in scales.iter().zip(&e8m0).enumerate() {
                assert_eq!(f64::from(s), 2f64.powi(i32::from(e) - 127), "scale {i}");
            }
            assert!(zeros.iter().all(|&z| z == 0));
            let dq = p.dequantize_f64();
            for row in 0..n {
                for col in 0..k {
                    let g = row * nb + col / MXFP4_BLOCK;
                    let v = f64::from(E2M1_VALUES[usize::from(codes[row * k + col])]);
                    assert_eq!(dq[row * k + col], v * 2f64.powi(i32::from(e8m0[g]) - 127));
                }
            }
        }
    }

    /// Every e4m3fn byte decodes to its value computed from the format's definition in f64:
    /// normals `2^(e − 7)·(1 + m/8)`, subnormals `2^-6·m/8`, signed zeros, up to ±448.
    #[test]
    fn e4m3_value_matches_the_format_definition() {
        for b in 0u8..=255 {
            if b & 0x7F == 0x7F {
                assert!(e4m3_is_nan(b));
                continue;
            }
            let (e, m) = (i32::from((b >> 3) & 0xF), f64::from(b & 7));
            let mag = if e == 0 {
                2f64.powi(-6) * m / 8.0
            } else {
                2f64.powi(e - 7) * (1.0 + m / 8.0)
            };
            let want = if b & 0x80 != 0 { -mag } else { mag };
            let got = e4m3_value(b);
            assert_eq!(f64::from(got), want, "byte {b:#04x}");
            assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "sign of {b:#04x}");
        }
        assert_eq!(e4m3_value(0x7E), 448.0);
        assert_eq!(e4m3_value(0x01), 2f32.powi(-9));
    }

    /// Random e4m3 bytes, NaN codes made −0.
    fn random_fp8_codes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| match rng.next_u64() as u8 {
                b if b & 0x7F == 0x7F => 0x80,
                b => b,
            })
            .collect()
    }

    /// FP8 blocks: codes land where the int8 layout puts them, each channel's scale row is its
    /// block row (runs start their own block rows), weights dequantize to `e4m3·scale`; ragged
    /// N and K, N past one block row.
    #[test]
    fn pack_fp8_repeats_block_scales_per_channel() {
        let mut rng = SplitMix64::new(0xf8);
        for (n, k, split) in [
            (1usize, 1usize, 0usize),
            (3, 129, 1),
            (17, 130, 16),
            (130, 300, 128),
            (257, 128, 129),
        ] {
            let kb = k.div_ceil(FP8_BLOCK);
            let codes = random_fp8_codes(&mut rng, n * k);
            let runs = [(0, split), (split, n)];
            let scales: Vec<Vec<f32>> = runs
                .iter()
                .map(|&(a, b)| {
                    (0..(b - a).div_ceil(FP8_BLOCK) * kb)
                        .map(|i| 1.0 + i as f32 / 64.0)
                        .collect()
                })
                .collect();
            let rows: Vec<Fp8Rows<'_>> = runs
                .iter()
                .zip(&scales)
                .map(|(&(a, b), s)| Fp8Rows {
                    channels: b - a,
                    codes: &codes[a * k..b * k],
                    scales: Fp8Scales::Blocks(s),
                })
                .collect();
            let p = PackedWna16::pack_fp8(Fp8Desc {
                n,
                k,
                rows: &rows,
                bias: None,
            })
            .unwrap();
            assert_eq!(p.int8_values(), Int8Values::E4m3);
            assert_eq!((p.bits(), p.group_size(), p.n_groups()), (8, FP8_BLOCK, kb));
            assert!(!p.is_asymmetric() && !p.is_channelwise());
            let (got_codes, got_scales, zeros) = p.unpack();
            assert_eq!(got_codes, codes, "n {n} k {k}");
            assert!(zeros.iter().all(|&z| z == 0));
            let dq = p.dequantize_f64();
            for row in 0..n {
                let (run, first) = if row < split { (0, 0) } else { (1, split) };
                let block_row = (row - first) / FP8_BLOCK;
                for g in 0..kb {
                    let s = scales[run][block_row * kb + g];
                    assert_eq!(got_scales[row * kb + g], s, "n {n} k {k} [{row}, {g}]");
                }
                for col in 0..k {
                    let s = f64::from(scales[run][block_row * kb + col / FP8_BLOCK]);
                    let want = f64::from(e4m3_value(codes[row * k + col])) * s;
                    assert_eq!(dq[row * k + col], want);
                }
            }
        }
    }

    /// Channel and tensor scales make a channelwise matrix: one group of K per channel, whose
    /// scale is the channel's own or its run's tensor scale, on K inside one step, past one
    /// block and odd N; runs may mix the two kinds.
    #[test]
    fn pack_fp8_keeps_channel_and_tensor_scales_per_channel() {
        let mut rng = SplitMix64::new(0xf9);
        for (n, k, split) in [
            (1usize, 1usize, 0usize),
            (3, 5, 1),
            (17, 130, 16),
            (33, 300, 32),
        ] {
            let codes = random_fp8_codes(&mut rng, n * k);
            let channel: Vec<f32> = (0..split).map(|c| 0.25 + c as f32 / 8.0).collect();
            let tensor = 3.5f32;
            let rows = [
                Fp8Rows {
                    channels: split,
                    codes: &codes[..split * k],
                    scales: Fp8Scales::Channels(&channel),
                },
                Fp8Rows {
                    channels: n - split,
                    codes: &codes[split * k..],
                    scales: Fp8Scales::Tensor(tensor),
                },
            ];
            let p = PackedWna16::pack_fp8(Fp8Desc {
                n,
                k,
                rows: &rows,
                bias: None,
            })
            .unwrap();
            assert_eq!(p.int8_values(), Int8Values::E4m3);
            assert_eq!((p.bits(), p.group_size(), p.n_groups()), (8, k, 1));
            assert!(p.is_channelwise() && !p.is_asymmetric());
            let (got_codes, got_scales, _) = p.unpack();
            assert_eq!(got_codes, codes, "n {n} k {k}");
            let dq = p.dequantize_f64();
            for row in 0..n {
                let s = if row < split { channel[row] } else { tensor };
                assert_eq!(got_scales[row], s, "n {n} k {k} channel {row}");
                for col in 0..k {
                    let want = f64::from(e4m3_value(codes[row * k + col])) * f64::from(s);
                    assert_eq!(dq[row * k + col], want);
                }
            }
        }
    }

    #[test]
    fn bad_fp8_inputs_are_typed_errors() {
        let codes = [0x38u8; 6];
        let scales = [1f32; 2];
        let pack = |codes: &[u8], scales: &[f32], channels: usize| {
            PackedWna16::pack_fp8(Fp8Desc {
                n: 2,
                k: 3,
                rows: &[Fp8Rows {
                    channels,
                    codes,
                    scales: Fp8Scales::Blocks(scales),
                }],
                bias: None,
            })
        };
        assert!(pack(&codes, &scales[..1], 2).is_ok());
        assert!(matches!(
            pack(&codes, &scales[..1], 1),
            Err(KernelError::LengthMismatch {
                tensor: "w_fp8 channels",
                expected: 2,
                got: 1
            })
        ));
        assert!(matches!(
            pack(&codes[..5], &scales[..1], 2),
            Err(KernelError::LengthMismatch {
                tensor: "w_fp8",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            pack(&codes, &scales, 2),
            Err(KernelError::LengthMismatch {
                tensor: "weight_scale",
                expected: 1,
                got: 2
            })
        ));
        for nan in [0x7Fu8, 0xFF] {
            let mut bad = codes;
            bad[4] = nan;
            assert!(matches!(
                pack(&bad, &scales[..1], 2),
                Err(KernelError::NonFiniteWeight {
                    tensor: "w_fp8",
                    index: 4,
                    ..
                })
            ));
        }
        assert!(matches!(
            pack(&codes, &[f32::INFINITY], 2),
            Err(KernelError::NonFiniteWeight {
                tensor: "weight_scale",
                index: 0,
                ..
            })
        ));
        // The index of a NaN code counts the channels of the runs before it.
        let rows = [
            Fp8Rows {
                channels: 1,
                codes: &codes[..3],
                scales: Fp8Scales::Blocks(&scales[..1]),
            },
            Fp8Rows {
                channels: 1,
                codes: &[0, 0xFF, 0],
                scales: Fp8Scales::Blocks(&scales[..1]),
            },
        ];
        let two = |bias| {
            PackedWna16::pack_fp8(Fp8Desc {
                n: 2,
                k: 3,
                rows: &rows,
                bias,
            })
        };
        assert!(matches!(
            two(None),
            Err(KernelError::NonFiniteWeight {
                tensor: "w_fp8",
                index: 4,
                ..
            })
        ));
        assert!(matches!(
            two(Some(&[0.0])),
            Err(KernelError::LengthMismatch { tensor: "bias", .. })
        ));
        assert!(matches!(
            PackedWna16::pack_fp8(Fp8Desc {
                n: 0,
                k: 0,
                rows: &[],
                bias: None
            }),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        // Block scales beside channel scales: one matrix has one grouping.
        let mixed = [
            Fp8Rows {
                channels: 1,
                codes: &codes[..3],
                scales: Fp8Scales::Blocks(&scales[..1]),
            },
            Fp8Rows {
                channels: 1,
                codes: &codes[3..],
                scales: Fp8Scales::Channels(&scales[..1]),
            },
        ];
        assert!(matches!(
            PackedWna16::pack_fp8(Fp8Desc {
                n: 2,
                k: 3,
                rows: &mixed,
                bias: None
            }),
            Err(KernelError::Unsupported { .. })
        ));
        // A channel scale per channel, and finite.
        let channels = |scales| {
            PackedWna16::pack_fp8(Fp8Desc {
                n: 2,
                k: 3,
                rows: &[Fp8Rows {
                    channels: 2,
                    codes: &codes,
                    scales,
                }],
                bias: None,
            })
        };
        assert!(channels(Fp8Scales::Channels(&scales)).is_ok());
        assert!(matches!(
            channels(Fp8Scales::Channels(&scales[..1])),
            Err(KernelError::LengthMismatch {
                tensor: "weight_scale",
                expected: 2,
                got: 1
            })
        ));
        assert!(matches!(
            channels(Fp8Scales::Channels(&[1.0, f32::NAN])),
            Err(KernelError::NonFiniteWeight {
                tensor: "weight_scale",
                index: 1,
                ..
            })
        ));
        assert!(matches!(
            channels(Fp8Scales::Tensor(f32::INFINITY)),
            Err(KernelError::NonFiniteWeight {
                tensor: "weight_scale",
                ..
            })
        ));
    }

    #[test]
    fn bad_mxfp4_inputs_are_typed_errors() {
        let blocks = [0u8; 32];
        let scales = [127u8, 255];
        let d = |n, k, blocks, scales| Mxfp4Desc {
            n,
            k,
            blocks,
            scales,
            bias: None,
        };
        assert!(matches!(
            PackedWna16::pack_mxfp4(d(2, 32, &blocks[..31], &scales[..1])),
            Err(KernelError::LengthMismatch {
                tensor: "blocks",
                expected: 32,
                got: 31
            })
        ));
        assert!(matches!(
            PackedWna16::pack_mxfp4(d(2, 32, &blocks, &scales[..1])),
            Err(KernelError::LengthMismatch {
                tensor: "scales",
                expected: 2,
                got: 1
            })
        ));
        assert!(matches!(
            PackedWna16::pack_mxfp4(d(2, 32, &blocks, &scales)),
            Err(KernelError::ValueOutOfRange {
                tensor: "scales",
                index: 1,
                value: 255,
                ..
            })
        ));
        assert!(matches!(
            PackedWna16::pack_mxfp4(d(2, 0, &[], &[])),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        let mut bad = d(2, 32, &blocks, &scales[..1]);
        bad.n = 1;
        bad.blocks = &blocks[..16];
        bad.bias = Some(&[0.0, 1.0]);
        assert!(matches!(
            PackedWna16::pack_mxfp4(bad),
            Err(KernelError::LengthMismatch {
                tensor: "bias",
                expected: 1,
                got: 2
            })
        ));
        bad.bias = Some(&[f32::NAN]);
        assert!(matches!(
            PackedWna16::pack_mxfp4(bad),
            Err(KernelError::NonFiniteWeight { tensor: "bias", .. })
        ));
    }

    #[test]
    fn bad_words_are_typed_errors() {
        let s = [bf16::ONE; 2];
        let bytes = [0u8; 8];
        let words = |rows: &'static [WordRows<'static>]| Wna16WordsDesc {
            n: 2,
            k: 8,
            bits: 4,
            order: WordOrder::ChannelMajor,
            rows,
            group_size: WeightGroups::Channelwise,
            scales: Wna16Scales::Bf16(&[]),
            zeros: None,
            bias: None,
            perm: None,
        };
        let one = [WordRows {
            channels: 2,
            bytes: &[0; 8],
        }];
        let mut d = words(&[]);
        d.scales = Wna16Scales::Bf16(&s);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch {
                tensor: "w_words channels",
                expected: 2,
                got: 0
            })
        ));
        let short = [WordRows {
            channels: 2,
            bytes: &bytes[..7],
        }];
        let mut d = words(&[]);
        d.rows = &short;
        d.scales = Wna16Scales::Bf16(&s);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch {
                tensor: "w_words",
                expected: 8,
                got: 7
            })
        ));
        let huge = [
            WordRows {
                channels: usize::MAX,
                bytes: &[],
            },
            WordRows {
                channels: 3,
                bytes: &[],
            },
        ];
        let mut d = words(&[]);
        d.rows = &huge;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch {
                tensor: "w_words channels",
                ..
            })
        ));
        let mut d = words(&[]);
        d.rows = &one;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch {
                tensor: "scales",
                expected: 2,
                got: 0
            })
        ));
        let nan = [bf16::ONE, bf16::INFINITY];
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&nan);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::NonFiniteWeight {
                tensor: "scales",
                index: 1,
                ..
            })
        ));
        let zeros = [3u8, 16];
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&s);
        d.zeros = Some(&zeros);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::ValueOutOfRange {
                tensor: "zeros",
                index: 1,
                value: 16,
                ..
            })
        ));
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&s);
        d.group_size = WeightGroups::groups(4).unwrap();
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::UnsupportedDim {
                dim: "group_size",
                got: 4,
                ..
            })
        ));
        let mut d = words(&[]);
        d.k = 0;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        // AWQ words hold int4 codes of whole words of eight channels.
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&s);
        d.order = WordOrder::Awq;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::UnsupportedDim {
                dim: "w_words channels",
                got: 2,
                ..
            })
        ));
        d.bits = 8;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::UnsupportedDim {
                dim: "bits",
                got: 8,
                ..
            })
        ));
        // A permutation that repeats a K value, and one of the wrong length.
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&s);
        d.perm = Some(&[0, 1, 2, 3, 4, 5, 6, 6]);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::ValueOutOfRange {
                tensor: "perm",
                index: 7,
                ..
            })
        ));
        d.perm = Some(&[0, 1]);
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch { tensor: "perm", .. })
        ));
        // 8-bit words: four codes each, so two channels of K = 8 take 16 bytes.
        let mut d = words(&[]);
        d.rows = &one;
        d.scales = Wna16Scales::Bf16(&s);
        d.bits = 8;
        assert!(matches!(
            PackedWna16::pack_words(d),
            Err(KernelError::LengthMismatch {
                tensor: "w_words",
                expected: 16,
                got: 8
            })
        ));
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        let s = [bf16::ONE; 4];
        let c = [0u8; 16];
        assert!(matches!(
            PackedWna16::pack(desc(2, 0, &[], None, &s[..2])),
            Err(KernelError::UnsupportedDim { dim: "K", .. })
        ));
        assert!(matches!(
            PackedWna16::pack(desc(2, 8, &c, Some(12), &s)),
            Err(KernelError::UnsupportedDim {
                dim: "group_size",
                got: 12,
                ..
            })
        ));
        assert!(matches!(
            PackedWna16::pack(desc(2, 8, &c[..15], None, &s[..2])),
            Err(KernelError::LengthMismatch {
                tensor: "w_int",
                expected: 16,
                got: 15
            })
        ));
        assert!(matches!(
            PackedWna16::pack(desc(2, 8, &c, None, &s)),
            Err(KernelError::LengthMismatch {
                tensor: "scales",
                expected: 2,
                got: 4
            })
        ));
        let mut bad = c;
        bad[5] = 16;
        assert!(matches!(
            PackedWna16::pack(desc(2, 8, &bad, None, &s[..2])),
            Err(KernelError::ValueOutOfRange {
                tensor: "w_int",
                index: 5,
                value: 16,
                ..
            })
        ));
        let mut d = desc(2, 8, &c, None, &s[..2]);
        d.bits = 3;
        assert!(matches!(
            PackedWna16::pack(d),
            Err(KernelError::UnsupportedDim {
                dim: "bits",
                got: 3,
                ..
            })
        ));
        let nan = [bf16::NAN, bf16::ONE];
        assert!(matches!(
            PackedWna16::pack(desc(2, 8, &c, None, &nan)),
            Err(KernelError::NonFiniteWeight {
                tensor: "scales",
                index: 0,
                ..
            })
        ));
        // Every stored precision, the non-finite value anywhere in the scales.
        let (f16s, f32s) = ([f16::ONE, f16::INFINITY], [1.0, f32::NEG_INFINITY]);
        for scales in [Wna16Scales::F16(&f16s), Wna16Scales::F32(&f32s)] {
            let mut d = desc(2, 8, &c, None, &s[..2]);
            d.scales = scales;
            assert!(matches!(
                PackedWna16::pack(d),
                Err(KernelError::NonFiniteWeight {
                    tensor: "scales",
                    index: 1,
                    ..
                })
            ));
        }
        let zeros = [3u8, 99];
        let mut d = desc(2, 8, &c, None, &s[..2]);
        d.zeros = Some(&zeros);
        assert!(matches!(
            PackedWna16::pack(d),
            Err(KernelError::ValueOutOfRange {
                tensor: "zeros",
                index: 1,
                ..
            })
        ));
        let mut d = desc(2, 8, &c, None, &s[..2]);
        d.bias = Some(&[0.0]);
        assert!(matches!(
            PackedWna16::pack(d),
            Err(KernelError::LengthMismatch { tensor: "bias", .. })
        ));
        let perm = [0u32, 1, 2, 3, 4, 5, 6, 6];
        let mut d = desc(2, 8, &c, None, &s[..2]);
        d.perm = Some(&perm);
        assert!(matches!(
            PackedWna16::pack(d),
            Err(KernelError::ValueOutOfRange {
                tensor: "perm",
                index: 7,
                value: 6,
                ..
            })
        ));
        let mut d = desc(2, 8, &c, None, &s[..2]);
        d.perm = Some(&perm[..3]);
        assert!(matches!(
            PackedWna16::pack(d),
            Err(KernelError::LengthMismatch { tensor: "perm", .. })
        ));
    }
}
