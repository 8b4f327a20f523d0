//! A CPU executor for Marlin-format weights: it reads the repacked words, the permuted scales and
//! the act-order permutation exactly as the GPU kernel receives them, dequantises tile by tile
//! and multiplies with f32 accumulation (spec `marlin.md` §10.1). It is the WNA16 backend's CPU
//! path and the proof that the layout is right in use, not only in bytes.
//!
//! Numerics: every weight is dequantised as `round_D((q − bias)·s)` in the scale dtype `D`, the
//! same single rounding as vLLM's dequantised reference, then `out = Σ_k x[k]·W[k][n]` in f32,
//! summed in ascending repacked-row order. Channelwise weights apply the scale after the sum, as
//! the kernel does. No 16-bit rounding of the output: callers round to their dtype.

use half::{bf16, f16};

use super::error::{MarlinError, check_len, checked_product};
use super::layout::{MarlinLayout, TILE_CODES, WeightBits, check_tile_shape};
use super::perm::{ScaleLayout, permute_scales};
use super::postprocess::groups_for;
use super::preprocess::fp8_unmap_code;
use super::repack::check_perm;
use crate::GemmScratch;
use crate::par::{Par, for_each_chunk};

/// Scales as handed to the executor, in their dtype (the dequantised weight is rounded to it).
#[derive(Debug, Clone, Copy)]
pub enum ScaleValues<'a> {
    /// fp16 scales.
    F16(&'a [f16]),
    /// bf16 scales.
    Bf16(&'a [bf16]),
    /// f32 scales (no rounding of the dequantised weight).
    F32(&'a [f32]),
    /// INT8-activation scales as the post-processing leaves them (i16 codes and the tensor's
    /// global scale): the effective weight scale is `code · global_scale`, which approximates the
    /// original scale to the i16 step. Dequantised without 16-bit rounding. The W4A8 kernel's
    /// per-token activation quantisation is not emulated: the executor runs 16-bit-activation
    /// math on these weights.
    Int8Act {
        /// i16 scale codes `[G, N]`.
        scales: &'a [i16],
        /// The global scale (`smax / 4096`).
        global_scale: f32,
    },
}

impl ScaleValues<'_> {
    fn len(&self) -> usize {
        match self {
            Self::F16(s) => s.len(),
            Self::Bf16(s) => s.len(),
            Self::F32(s) => s.len(),
            Self::Int8Act { scales, .. } => scales.len(),
        }
    }

    fn to_f32(self) -> (Vec<f32>, Rounding) {
        match self {
            Self::F16(s) => (s.iter().map(|v| v.to_f32()).collect(), Rounding::F16),
            Self::Bf16(s) => (s.iter().map(|v| v.to_f32()).collect(), Rounding::Bf16),
            Self::F32(s) => (s.to_vec(), Rounding::F32),
            Self::Int8Act {
                scales,
                global_scale,
            } => (
                scales
                    .iter()
                    .map(|&q| f32::from(q) * global_scale)
                    .collect(),
                Rounding::F32,
            ),
        }
    }
}

/// The dtype a dequantised weight is rounded to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rounding {
    F16,
    Bf16,
    F32,
}

impl Rounding {
    #[inline]
    fn apply(self, v: f32) -> f32 {
        match self {
            Self::F16 => f16::from_f32(v).to_f32(),
            Self::Bf16 => bf16::from_f32(v).to_f32(),
            Self::F32 => v,
        }
    }
}

/// An activation element type the executor accepts.
pub trait MarlinAct: Copy + Send + Sync {
    /// Widens to f32 (exact for every implementor).
    fn to_f32(self) -> f32;
}

impl MarlinAct for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

impl MarlinAct for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl MarlinAct for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// Everything needed to build one expert's [`MarlinWeights`], as the post-processing produces it.
#[derive(Debug, Clone, Copy)]
pub struct MarlinWeightsDesc<'a> {
    /// Reduction dimension K.
    pub size_k: usize,
    /// Output dimension N.
    pub size_n: usize,
    /// Weight bits, 4 or 8.
    pub num_bits: u32,
    /// Whether the words are in the 32×32 (8-bit-activation) layout.
    pub is_a_8bit: bool,
    /// Group size; `None` for channelwise.
    pub group_size: Option<usize>,
    /// Marlin words, `K·N/pf`.
    pub qweight: &'a [u32],
    /// Scales `[G, N]` in Marlin column order.
    pub scales: ScaleValues<'a>,
    /// The permutation the scales are in ([`ScaleLayout::for_kernel`] for the project's output).
    pub scale_layout: ScaleLayout,
    /// Act-order permutation (length K) or empty.
    pub sort_indices: &'a [u32],
    /// Group of each repacked row (length K), or empty for `k / group_size`.
    pub g_idx_sorted: &'a [u32],
    /// The 4-bit codes were remapped for FP8 activations and the scales multiplied by 512; the
    /// executor undoes both to compute the same layer.
    pub fp8_preprocessed: bool,
}

/// One expert's weight matrix in Marlin format, validated and ready to multiply.
#[derive(Debug, Clone)]
pub struct MarlinWeights {
    layout: MarlinLayout,
    size_k: usize,
    size_n: usize,
    words: Vec<u32>,
    /// Scales `[G, N]` in natural column order, as f32.
    scales: Vec<f32>,
    rounding: Rounding,
    channelwise: bool,
    /// Checkpoint row of each repacked row (identity without act-order).
    perm: Option<Vec<u32>>,
    /// Group of each repacked row.
    row_group: Vec<u32>,
    fp8: bool,
}

impl MarlinWeights {
    /// Validates and stores one expert's Marlin weights.
    pub fn new(desc: MarlinWeightsDesc<'_>) -> Result<Self, MarlinError> {
        let (k, n) = (desc.size_k, desc.size_n);
        let layout = check_tile_shape(k, n, desc.num_bits, desc.is_a_8bit)?;
        let words = checked_product("K·N", &[k, n])? / layout.bits.pack_factor();
        check_len("qweight", words, desc.qweight.len())?;
        let groups = groups_for("qweight", k, desc.group_size)?;
        check_len("scales", groups * n, desc.scales.len())?;
        if desc.fp8_preprocessed && layout.bits != WeightBits::B4 {
            return Err(MarlinError::Fp8NeedsInt4 {
                num_bits: desc.num_bits,
            });
        }
        let perm = if desc.sort_indices.is_empty() {
            None
        } else {
            if layout.a8 {
                return Err(MarlinError::PermWithA8 {
                    num_bits: desc.num_bits,
                });
            }
            check_perm("sort_indices", 0, desc.sort_indices, k)?;
            Some(desc.sort_indices.to_vec())
        };
        let gs = desc.group_size.unwrap_or(k.max(1));
        let row_group: Vec<u32> = if desc.g_idx_sorted.is_empty() {
            (0..k).map(|r| (r / gs) as u32).collect()
        } else {
            check_len("g_idx_sorted", k, desc.g_idx_sorted.len())?;
            if let Some(index) = desc.g_idx_sorted.iter().position(|&g| g as usize >= groups) {
                return Err(MarlinError::GIdxNotGroupPermutation {
                    tensor: "g_idx_sorted",
                    expert: 0,
                    group: u64::from(desc.g_idx_sorted[index]),
                    count: 0,
                    expected: gs,
                });
            }
            desc.g_idx_sorted.to_vec()
        };
        let (permuted, rounding) = desc.scales.to_f32();
        // Both permutations are involutions: permuting again restores natural order.
        let mut scales = permute_scales(&permuted, n, desc.scale_layout)?;
        if desc.fp8_preprocessed {
            scales.iter_mut().for_each(|s| *s /= 512.0);
        }
        Ok(Self {
            layout,
            size_k: k,
            size_n: n,
            words: desc.qweight.to_vec(),
            scales,
            rounding,
            channelwise: desc.group_size.is_none(),
            perm,
            row_group,
            fp8: desc.fp8_preprocessed,
        })
    }

    /// Reduction dimension K.
    pub fn size_k(&self) -> usize {
        self.size_k
    }

    /// Output dimension N.
    pub fn size_n(&self) -> usize {
        self.size_n
    }

    /// The signed weight value (`code − bias`) of a field.
    #[inline]
    fn value(&self, code: u32) -> f32 {
        let code = if self.fp8 { fp8_unmap_code(code) } else { code };
        (code as i32 - self.layout.bits.bias()) as f32
    }

    /// Dequantises one tile (`kt`, `nt`) into `tile` (`[tile_k, tile_n]`, repacked row order):
    /// `round_D(v·s)`, or the bare value `v` for channelwise weights.
    fn dequant_tile(&self, table: &[u16], kt: usize, nt: usize, tile: &mut [f32]) {
        let l = self.layout;
        let (tk, tn, wpt) = (l.tile_k(), l.tile_n(), l.words_per_tile());
        let pf = l.bits.pack_factor();
        let bits = l.bits.bits();
        let mask = l.bits.mask();
        let base = (kt * (self.size_n / tn) + nt) * wpt;
        for (w, &word) in self.words[base..base + wpt].iter().enumerate() {
            for t in 0..pf {
                let idx = table[w * pf + t] as usize;
                let (kl, nl) = (idx / tn, idx % tn);
                let v = self.value((word >> (bits * t as u32)) & mask);
                tile[idx] = if self.channelwise {
                    v
                } else {
                    let g = self.row_group[kt * tk + kl] as usize;
                    self.rounding
                        .apply(v * self.scales[g * self.size_n + nt * tn + nl])
                };
            }
        }
    }

    /// Whether the scales are one per output column (no groups).
    pub fn is_channelwise(&self) -> bool {
        self.channelwise
    }

    /// The dequantised matrix `[K, N]` in checkpoint row order: `round_D((q − bias)·s)` for every
    /// weight, equal bit for bit to vLLM's dequantised reference `w_ref`.
    pub fn dequantize(&self) -> Vec<f32> {
        let (k, n) = (self.size_k, self.size_n);
        let l = self.layout;
        let (tk, tn) = (l.tile_k(), l.tile_n());
        let table = l.tile_table();
        let mut out = vec![0f32; k * n];
        let mut tile = [0f32; TILE_CODES];
        for kt in 0..k / tk {
            for nt in 0..n / tn {
                self.dequant_tile(table, kt, nt, &mut tile);
                for kl in 0..tk {
                    let r = kt * tk + kl;
                    let row = self.perm.as_ref().map_or(r, |p| p[r] as usize);
                    for nl in 0..tn {
                        let mut v = tile[kl * tn + nl];
                        if self.channelwise {
                            v = self.rounding.apply(v * self.scales[nt * tn + nl]);
                        }
                        out[row * n + nt * tn + nl] = v;
                    }
                }
            }
        }
        out
    }

    /// `out[m][n] = Σ_k x[m][k]·W[k][n]` for `m` rows of activations `x` (`[m, K]`), `out`
    /// `[m, N]` overwritten. Columns are split over threads by tile; the result does not
    /// depend on the thread count. Allocates its working memory; a caller that multiplies
    /// repeatedly passes its own scratch to [`Self::gemm_with_scratch`] instead.
    pub fn gemm<A: MarlinAct>(
        &self,
        x: &[A],
        m: usize,
        out: &mut [f32],
        par: Par,
    ) -> Result<(), MarlinError> {
        self.gemm_with_scratch(x, m, out, &mut GemmScratch::new(), par)
    }

    /// [`Self::gemm`] working in `scratch`, with the same result bit for bit. The scratch only
    /// grows, so once it has served a call of `m` rows on a matrix of this size, calls of up
    /// to `m` rows allocate nothing (the tile buffers live on each worker's stack).
    pub fn gemm_with_scratch<A: MarlinAct>(
        &self,
        x: &[A],
        m: usize,
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), MarlinError> {
        let (k, n) = (self.size_k, self.size_n);
        check_len("x", checked_product("m·K", &[m, k])?, x.len())?;
        check_len("out", checked_product("m·N", &[m, n])?, out.len())?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (xp, acc) = scratch.f32_rows_and_out(m * k, m * n);
        // Activations in repacked row order (x'[:, k] = x[:, perm[k]]), as the kernel's
        // permute_cols step does.
        for (dst, src) in xp.chunks_exact_mut(k.max(1)).zip(x.chunks_exact(k.max(1))) {
            match &self.perm {
                Some(p) => dst
                    .iter_mut()
                    .zip(p)
                    .for_each(|(d, &r)| *d = src[r as usize].to_f32()),
                None => dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32()),
            }
        }
        let xp = &*xp;
        let l = self.layout;
        let (tk, tn) = (l.tile_k(), l.tile_n());
        let table = l.tile_table();
        // Per column tile, an [m, tile_n] accumulator; scattered into `out` afterwards.
        acc.fill(0.0);
        for_each_chunk(
            acc,
            m * tn,
            par,
            || [0f32; TILE_CODES],
            |tile, nt, acc| {
                for kt in 0..k / tk {
                    self.dequant_tile(table, kt, nt, tile);
                    for (row, a) in acc.chunks_exact_mut(tn).enumerate() {
                        let xr = &xp[row * k + kt * tk..row * k + (kt + 1) * tk];
                        for (kl, &xv) in xr.iter().enumerate() {
                            let w = &tile[kl * tn..(kl + 1) * tn];
                            a.iter_mut().zip(w).for_each(|(o, &wv)| *o += xv * wv);
                        }
                    }
                }
                if self.channelwise {
                    let s = &self.scales[nt * tn..(nt + 1) * tn];
                    for a in acc.chunks_exact_mut(tn) {
                        a.iter_mut().zip(s).for_each(|(o, &sv)| *o *= sv);
                    }
                }
            },
        );
        for (nt, block) in acc.chunks_exact(m * tn).enumerate() {
            for (row, a) in block.chunks_exact(tn).enumerate() {
                out[row * n + nt * tn..row * n + (nt + 1) * tn].copy_from_slice(a);
            }
        }
        Ok(())
    }

    /// Grows `scratch` so that [`Self::gemm_with_scratch`] of up to `max_rows` rows never
    /// allocates: the activation rows in repacked order and the per-tile accumulators.
    pub(crate) fn reserve_scratch(&self, scratch: &mut GemmScratch, max_rows: usize) {
        scratch.reserve_f32_rows(max_rows.saturating_mul(self.size_k));
        scratch.reserve_f32_out(max_rows.saturating_mul(self.size_n));
    }
}
