//! vLLM's WNA16 MoE weight post-processing (`_process_weights_marlin`, spec
//! `marlin.md` §8), in its order, with the checks upstream lacks: FP8 preprocessing, act-order
//! sort, repack, scale permutation, INT8 scale processing, bias permutation.
//!
//! Inputs are the loaded GPTQ-layout parameters of all experts (`w13 [E, H/pf, 2I]`,
//! `w2 [E, I/pf, H]`, scales `[E, G, N]`); compressed-tensors checkpoints reach the same layout
//! by transposing on load. Everything that would make the kernels compute garbage is refused
//! with a [`MarlinError`] before any work is done.

use super::error::{MarlinError, check_len, checked_product};
use super::layout::{WeightBits, check_tile_shape};
use super::perm::{ScaleLayout, permute_bias, permute_scales};
use super::preprocess::{
    Scale16, check_g_idx, check_perm_sorts, fp8_remap_int4, fp8_scale_x512, int8_act_scales,
    stable_argsort,
};
use super::repack::{RepackSpec, check_perm, repack_experts};
use crate::Par;

/// The activation dtype the Marlin kernel will be run with (`VLLM_MARLIN_INPUT_DTYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActDtype {
    /// fp16 / bf16 activations (W4A16, W8A16): the 16×64 tile layout.
    Bits16,
    /// Per-token int8 activations (W4A8-INT8): the 32×32 layout and i16 scales.
    Int8,
    /// fp8-e4m3 activations (W4A8-FP8): the 32×32 layout, remapped codes, scales ×512.
    Fp8,
}

impl ActDtype {
    /// Whether activations are one byte wide (`is_a_8bit`).
    pub const fn is_8bit(self) -> bool {
        !matches!(self, Self::Bits16)
    }
}

/// Which rule chooses the w13 scale permutation (spec §4, §12.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleRule {
    /// What the kernel reads: grouped iff `G > 1` and 16-bit activations. The project default.
    Kernel,
    /// vLLM's call, `size_k = I` for w13: differs from the kernel when `I ≤ gs < H` or
    /// `H ≤ gs < I`. Only for reproducing upstream's bytes.
    Upstream,
}

/// The quantisation and layer shape of a WNA16 MoE layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wna16Config {
    /// Local experts E.
    pub num_experts: usize,
    /// Hidden size H (K of w13, N of w2).
    pub hidden_size: usize,
    /// Intermediate size I per partition (w13 has N = 2I, w2 has K = I).
    pub intermediate_size: usize,
    /// Weight bits, 4 or 8.
    pub num_bits: u32,
    /// Group size along K; `None` for channelwise (one group).
    pub group_size: Option<usize>,
    /// GPTQ `desc_act` / compressed-tensors `actorder: "group"`. Ignored when channelwise, as
    /// upstream does.
    pub act_order: bool,
    /// Activation dtype the kernel will run with.
    pub input_dtype: ActDtype,
    /// Which w13 scale permutation rule to follow.
    pub scale_rule: ScaleRule,
}

/// One projection's loaded parameters, all experts.
#[derive(Debug, Clone, Copy)]
pub struct Wna16Tensor<'a, S> {
    /// GPTQ-layout packed codes `[E, K/pf, N]`.
    pub qweight: &'a [u32],
    /// Scales `[E, G, N]`.
    pub scales: &'a [S],
    /// Act-order group of every checkpoint row `[E, K]`; ignored (may be empty) without
    /// act-order.
    pub g_idx: &'a [u32],
    /// Precomputed act-order permutations `[E, K]` (for example a checkpoint's or a golden's);
    /// `None` computes a stable argsort of `g_idx`. Checked to be permutations that sort `g_idx`.
    pub sort_indices: Option<&'a [u32]>,
    /// Bias `[E, N]`, if the layer has one.
    pub bias: Option<&'a [S]>,
}

/// Scales after post-processing.
#[derive(Debug, Clone, PartialEq)]
pub enum MarlinScales<S> {
    /// Permuted 16-bit scales (×512 for FP8 activations).
    Plain(Vec<S>),
    /// INT8 activations with more than one group: scales quantised to i16 against the tensor's
    /// largest scale, and the f32 global scale `smax / 4096`.
    Int8 {
        /// The i16 scales, permuted.
        scales: Vec<i16>,
        /// The global activation scale factor.
        global_scale: f32,
    },
}

/// One projection after post-processing, all experts: what the Marlin kernel consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct MarlinTensor<S> {
    /// Marlin words `[E, K/16, N·bits/2]` (each expert `K·N/pf` flat words).
    pub qweight: Vec<u32>,
    /// Scales `[E, G, N]` in the kernel's column order.
    pub scales: MarlinScales<S>,
    /// Act-order permutations `[E, K]`, empty without act-order.
    pub sort_indices: Vec<u32>,
    /// `g_idx` in sorted order `[E, K]` (`g_idx[sort_indices]`), empty without act-order. The
    /// vLLM computes but drops it; the kernel needs it when K is split (spec §12.4).
    pub g_idx_sorted: Vec<u32>,
    /// Permuted bias `[E, N]`.
    pub bias: Option<Vec<S>>,
    /// Reduction dimension K.
    pub size_k: usize,
    /// Output dimension N.
    pub size_n: usize,
    /// Scale groups G.
    pub num_groups: usize,
}

/// Both projections after post-processing.
#[derive(Debug, Clone, PartialEq)]
pub struct MarlinMoeWeights<S> {
    /// Gate and up (`[E, H/16, 2I·b/2]`).
    pub w13: MarlinTensor<S>,
    /// Down (`[E, I/16, H·b/2]`).
    pub w2: MarlinTensor<S>,
}

/// Checks a group size against a reduction dimension: one of Marlin's (32, 64, 128) dividing
/// K, or channelwise. Returns the group count.
pub fn groups_for(
    tensor: &'static str,
    size_k: usize,
    group_size: Option<usize>,
) -> Result<usize, MarlinError> {
    let Some(gs) = group_size else {
        return Ok(1);
    };
    let bad = |reason| MarlinError::InvalidGroupSize {
        tensor,
        group_size: gs,
        size_k,
        reason,
    };
    if ![32, 64, 128].contains(&gs) {
        return Err(bad(
            "Marlin supports group sizes 32, 64, 128 and channelwise",
        ));
    }
    if !size_k.is_multiple_of(gs) {
        return Err(bad("it must divide size_k"));
    }
    Ok(size_k / gs)
}

/// Refuses the activation/weight combinations the Marlin kernels cannot run (spec §12.5, §12.7).
pub fn check_act_support(num_bits: u32, input_dtype: ActDtype) -> Result<WeightBits, MarlinError> {
    let bits = WeightBits::new(num_bits)?;
    match (input_dtype, bits) {
        (ActDtype::Fp8, WeightBits::B8) => Err(MarlinError::Fp8NeedsInt4 { num_bits }),
        (ActDtype::Int8, WeightBits::B8) => Err(MarlinError::W8A8Unsupported { num_bits }),
        _ => Ok(bits),
    }
}

/// Runs vLLM's WNA16 post-processing on both projections (spec §8), refusing what the
/// kernels cannot run.
pub fn process_wna16_moe<S: Scale16>(
    config: &Wna16Config,
    w13: Wna16Tensor<'_, S>,
    w2: Wna16Tensor<'_, S>,
    par: Par,
) -> Result<MarlinMoeWeights<S>, MarlinError> {
    let bits = check_act_support(config.num_bits, config.input_dtype)?;
    let a8 = config.input_dtype.is_8bit();
    let (h, i) = (config.hidden_size, config.intermediate_size);
    if h == 0 || i == 0 || config.num_experts == 0 {
        return Err(MarlinError::Unsupported {
            reason: "the number of experts, the hidden size and the intermediate size must be positive",
        });
    }
    let n13 = i
        .checked_mul(2)
        .ok_or(MarlinError::ShapeOverflow { what: "2I" })?;
    check_tile_shape(h, n13, config.num_bits, a8)?;
    check_tile_shape(i, h, config.num_bits, a8)?;
    let act_order = config.act_order && config.group_size.is_some();
    if act_order && a8 {
        return Err(MarlinError::PermWithA8 {
            num_bits: config.num_bits,
        });
    }
    let g13 = groups_for("w13", h, config.group_size)?;
    let g2 = groups_for("w2", i, config.group_size)?;
    // vLLM's w13 call passes size_k = I; w2's passes G2·gs, which is always right.
    let w13_layout = match config.scale_rule {
        ScaleRule::Kernel => ScaleLayout::for_kernel(g13, a8),
        ScaleRule::Upstream => ScaleLayout::upstream_rule(i, config.group_size, a8),
    };
    let w2_layout = ScaleLayout::for_kernel(g2, a8);
    let proj = |name, t, k, n, g, layout| Projection {
        names: name,
        t,
        k,
        n,
        groups: g,
        layout,
    };
    let p13 = proj(&W13, w13, h, n13, g13, w13_layout);
    let p2 = proj(&W2, w2, i, h, g2, w2_layout);
    for p in [&p13, &p2] {
        p.validate(config, bits, act_order)?;
    }
    Ok(MarlinMoeWeights {
        w13: p13.process(config, bits, act_order, par)?,
        w2: p2.process(config, bits, act_order, par)?,
    })
}

/// Tensor names used in errors, per projection.
struct Names {
    qweight: &'static str,
    scales: &'static str,
    g_idx: &'static str,
    sort_indices: &'static str,
    bias: &'static str,
}

const W13: Names = Names {
    qweight: "w13_qweight",
    scales: "w13_scales",
    g_idx: "w13_g_idx",
    sort_indices: "w13_sort_indices",
    bias: "w13_bias",
};

const W2: Names = Names {
    qweight: "w2_qweight",
    scales: "w2_scales",
    g_idx: "w2_g_idx",
    sort_indices: "w2_sort_indices",
    bias: "w2_bias",
};

/// One projection on its way through the pipeline.
struct Projection<'a, S> {
    names: &'static Names,
    t: Wna16Tensor<'a, S>,
    k: usize,
    n: usize,
    groups: usize,
    layout: ScaleLayout,
}

impl<S: Scale16> Projection<'_, S> {
    /// Every length and index check, before any work.
    fn validate(
        &self,
        config: &Wna16Config,
        bits: WeightBits,
        act_order: bool,
    ) -> Result<(), MarlinError> {
        let e = config.num_experts;
        let words = checked_product(self.names.qweight, &[e, self.k, self.n])? / bits.pack_factor();
        check_len(self.names.qweight, words, self.t.qweight.len())?;
        let scales = checked_product(self.names.scales, &[e, self.groups, self.n])?;
        check_len(self.names.scales, scales, self.t.scales.len())?;
        if let Some(b) = self.t.bias {
            check_len(self.names.bias, e * self.n, b.len())?;
        }
        if act_order {
            let gs = config.group_size.unwrap_or(self.k);
            check_len(self.names.g_idx, e * self.k, self.t.g_idx.len())?;
            for (x, g) in self.t.g_idx.chunks_exact(self.k).enumerate() {
                check_g_idx(self.names.g_idx, x, g, gs)?;
            }
            if let Some(perm) = self.t.sort_indices {
                check_len(self.names.sort_indices, e * self.k, perm.len())?;
                for (x, (p, g)) in perm
                    .chunks_exact(self.k)
                    .zip(self.t.g_idx.chunks_exact(self.k))
                    .enumerate()
                {
                    check_perm(self.names.sort_indices, x, p, self.k)?;
                    check_perm_sorts(self.names.sort_indices, x, p, g)?;
                }
            }
        }
        Ok(())
    }

    /// Steps 2–7 of vLLM's post-processing for this projection.
    fn process(
        self,
        config: &Wna16Config,
        bits: WeightBits,
        act_order: bool,
        par: Par,
    ) -> Result<MarlinTensor<S>, MarlinError> {
        let (k, n, e) = (self.k, self.n, config.num_experts);
        let fp8 = config.input_dtype == ActDtype::Fp8;
        // Step 2: FP8 preprocessing of the GPTQ words and ×512 on the scales.
        let mut remapped;
        let qweight = if fp8 {
            remapped = self.t.qweight.to_vec();
            fp8_remap_int4(&mut remapped);
            &remapped[..]
        } else {
            self.t.qweight
        };
        let mut scales = self.t.scales.to_vec();
        if fp8 {
            fp8_scale_x512(self.names.scales, &mut scales)?;
        }
        // Step 3: act-order sort indices and the sorted g_idx.
        let (sort_indices, g_idx_sorted) = if act_order {
            let mut perm = Vec::with_capacity(e * k);
            let mut sorted = Vec::with_capacity(e * k);
            for (x, g) in self.t.g_idx.chunks_exact(k).enumerate() {
                match self.t.sort_indices {
                    Some(given) => {
                        let p = &given[x * k..(x + 1) * k];
                        sorted.extend(p.iter().map(|&r| g[r as usize]));
                        perm.extend_from_slice(p);
                    }
                    None => {
                        let (p, s) = stable_argsort(g);
                        perm.extend(p);
                        sorted.extend(s);
                    }
                }
            }
            (perm, sorted)
        } else {
            (Vec::new(), Vec::new())
        };
        // Step 4: the repack.
        let spec = RepackSpec {
            size_k: k,
            size_n: n,
            num_bits: bits.bits(),
            is_a_8bit: config.input_dtype.is_8bit(),
        };
        let mut marlin = vec![0u32; qweight.len()];
        repack_experts(
            qweight,
            [e, k / bits.pack_factor(), n],
            &sort_indices,
            spec,
            &mut marlin,
            par,
        )?;
        // Step 5: scale permutation; step 6: INT8 scale processing when grouped.
        let permuted = permute_scales(&scales, n, self.layout)?;
        let scales = if config.input_dtype == ActDtype::Int8 && self.groups > 1 {
            let (q, global_scale) = int8_act_scales(self.names.scales, &permuted)?;
            MarlinScales::Int8 {
                scales: q,
                global_scale,
            }
        } else {
            MarlinScales::Plain(permuted)
        };
        // Step 7: bias.
        let bias = self.t.bias.map(|b| permute_bias(b, n)).transpose()?;
        Ok(MarlinTensor {
            qweight: marlin,
            scales,
            sort_indices,
            g_idx_sorted,
            bias,
            size_k: k,
            size_n: n,
            num_groups: self.groups,
        })
    }
}
