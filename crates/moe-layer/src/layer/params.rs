//! The layer's unpacked parameters between `create` and `process`: the fused `w13` / `w2`
//! int4 codes and their scales with local shapes, what has been loaded so far, and
//! [`Params::load_expert_tensor`], which cuts one checkpoint tensor's tensor-parallel shard
//! and writes it in place (spec section 6.3).

use half::{bf16, f16};
use moe_quant::WeightGroups;

use super::config::{LayerQuant, MoeLayerConfig};
use crate::LayerError;

/// Which projection of an expert a tensor belongs to (vLLM's shard ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExpertShard {
    /// Gate projection `[I, H]`: rows `0..I` of `w13`.
    W1,
    /// Up projection `[I, H]`: rows `I..2I` of `w13`.
    W3,
    /// Down projection `[H, I]`: `w2`.
    W2,
}

impl ExpertShard {
    const ALL: [Self; 3] = [Self::W1, Self::W3, Self::W2];

    /// `w1`, `w3` or `w2`.
    pub fn name(self) -> &'static str {
        match self {
            Self::W1 => "w1",
            Self::W3 => "w3",
            Self::W2 => "w2",
        }
    }
}

/// Which tensor of a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TensorKind {
    /// The (quantized) weight.
    Weight,
    /// Its scales.
    Scale,
    /// Its bias.
    Bias,
}

impl TensorKind {
    /// The kinds every scheme here requires.
    const REQUIRED: [Self; 2] = [Self::Weight, Self::Scale];

    /// `weight`, `weight_scale` or `bias`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Weight => "weight",
            Self::Scale => "weight_scale",
            Self::Bias => "bias",
        }
    }
}

/// The elements of a tensor handed to the layer, row-major.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum TensorData<'a> {
    /// int8 values (int4 codes for W4A8).
    I8(&'a [i8]),
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    Bf16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
}

impl TensorData<'_> {
    fn dtype_name(&self) -> &'static str {
        match self {
            Self::I8(_) => "i8",
            Self::F32(_) => "f32",
            Self::Bf16(_) => "bf16",
            Self::F16(_) => "f16",
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::I8(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }

    fn float_at(&self, i: usize) -> Option<f32> {
        match self {
            Self::I8(_) => None,
            Self::F32(v) => Some(v[i]),
            Self::Bf16(v) => Some(v[i].to_f32()),
            Self::F16(v) => Some(v[i].to_f32()),
        }
    }
}

/// One checkpoint tensor of one expert, whole (not yet sliced for tensor parallelism).
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Its name, for error messages.
    pub name: &'a str,
    /// Its shape: `[I_full, H]` for `w1`/`w3` weights, `[H, I_full]` for `w2`; scales
    /// `[rows, cols / g]` (or `[rows, 1]` channelwise).
    pub shape: &'a [usize],
    /// Its elements; `shape`'s product of them.
    pub data: TensorData<'a>,
}

/// Unpacked parameters with local shapes: `w13` `[E_local, 2I, H]`, `w2` `[E_local, H, I]`
/// (`I` per rank), scales `[E_local, 2I, H/g]` and `[E_local, H, I/g]` widened to f32.
#[derive(Debug, Clone)]
pub(crate) struct Params {
    pub(crate) w13: Vec<i8>,
    pub(crate) w2: Vec<i8>,
    pub(crate) w13_scale: Vec<f32>,
    pub(crate) w2_scale: Vec<f32>,
    /// Online int8 only: float weights `[E_local, 2I, H]` / `[E_local, H, I]` widened to f32,
    /// their stored dtype, and the amax of each whole (unsharded) `w2` row `[E_local, H]`.
    pub(crate) w13_f: Vec<f32>,
    pub(crate) w2_f: Vec<f32>,
    pub(crate) float_dtype: Option<moe_quant::DType>,
    pub(crate) w2_amax: Vec<f32>,
    /// WNA16 only: the dtype the scales were stored in (f32 when given in several; Marlin keeps
    /// 16-bit scales, the native kernels take any of the three), and the act-order group of
    /// every input row, `[E_local, H]` / `[E_local, I]` (empty without).
    pub(crate) scale_dtype: Option<moe_quant::DType>,
    pub(crate) w13_g_idx: Vec<i32>,
    pub(crate) w2_g_idx: Vec<i32>,
    /// WNA16 with zero points only: the unsigned zero point of every scale group, laid out
    /// like the scales (empty without; only a checkpoint load fills them).
    pub(crate) w13_zeros: Vec<u8>,
    pub(crate) w2_zeros: Vec<u8>,
    /// Expert biases: `[E_local, 2I]` (gate rows then up rows, this rank's slice) and
    /// `[E_local, H]` (whole), zero until loaded.
    pub(crate) w13_bias: Vec<f32>,
    pub(crate) w2_bias: Vec<f32>,
    /// MXFP4 only: the checkpoint's blocks and e8m0 scales, this rank's slice (empty
    /// otherwise; the integer code and scale vectors above stay empty for MXFP4).
    pub(crate) mx: MxBytes,
    /// `[E_local][shard]`: whether its bias was written (biases are optional, but a layer
    /// with any has them all).
    bias_loaded: Vec<bool>,
    /// `[E_local][shard][kind]`: whether it was written.
    loaded: Vec<bool>,
    local_experts: Vec<usize>,
}

/// MXFP4 weights as bytes: `w13` `[E_local, 2I, ceil(H/32), 16]` blocks (gate/up rows
/// interleaved) with `[E_local, 2I, ceil(H/32)]` e8m0 scales, `w2` `[E_local, H, I/32, 16]`
/// with `[E_local, H, I/32]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct MxBytes {
    pub(crate) w13_blocks: Vec<u8>,
    pub(crate) w13_scales: Vec<u8>,
    pub(crate) w2_blocks: Vec<u8>,
    pub(crate) w2_scales: Vec<u8>,
}

/// Per-expert sizes the slicing needs.
#[derive(Debug, Clone, Copy)]
struct Dims {
    h: usize,
    i: usize,
    i_full: usize,
    rank: usize,
    quant: LayerQuant,
}

impl Params {
    /// Allocates zeroed parameters for `cfg` (already validated).
    pub(crate) fn create(cfg: &MoeLayerConfig) -> Self {
        let local_experts = cfg.local_experts();
        let e = local_experts.len();
        let (h, i) = (cfg.hidden, cfg.intermediate_per_rank());
        let mut loaded = vec![false; e * ExpertShard::ALL.len() * TensorKind::REQUIRED.len()];
        if matches!(cfg.quant, LayerQuant::Fp8 { .. }) {
            // FP8 experts are packed straight from a checkpoint; nothing is loaded by name (and
            // `process` says so rather than listing every tensor as missing).
            loaded.fill(true);
            return Self {
                w13: Vec::new(),
                w2: Vec::new(),
                w13_scale: Vec::new(),
                w2_scale: Vec::new(),
                w13_f: Vec::new(),
                w2_f: Vec::new(),
                float_dtype: None,
                w2_amax: Vec::new(),
                scale_dtype: None,
                w13_g_idx: Vec::new(),
                w2_g_idx: Vec::new(),
                w13_zeros: Vec::new(),
                w2_zeros: Vec::new(),
                w13_bias: Vec::new(),
                w2_bias: Vec::new(),
                bias_loaded: Vec::new(),
                mx: MxBytes::default(),
                loaded,
                local_experts,
            };
        }
        if cfg.quant.loads_float_weights() {
            // Online int8 computes its scales and unquantized layers have none; only the float
            // weights are loaded.
            for local in 0..e {
                for shard in ExpertShard::ALL {
                    loaded[Self::slot(local, shard, TensorKind::Scale)] = true;
                }
            }
            return Self {
                w13: Vec::new(),
                w2: Vec::new(),
                w13_scale: Vec::new(),
                w2_scale: Vec::new(),
                w13_f: vec![0.0; e * 2 * i * h],
                w2_f: vec![0.0; e * h * i],
                float_dtype: None,
                w2_amax: vec![0.0; e * h],
                scale_dtype: None,
                w13_g_idx: Vec::new(),
                w2_g_idx: Vec::new(),
                w13_zeros: Vec::new(),
                w2_zeros: Vec::new(),
                w13_bias: vec![0.0; e * 2 * i],
                w2_bias: vec![0.0; e * h],
                mx: MxBytes::default(),
                bias_loaded: vec![false; e * ExpertShard::ALL.len()],
                loaded,
                local_experts,
            };
        }
        // MXFP4 keeps the checkpoint's bytes (`mx`), filled whole by a checkpoint load.
        let codes = if cfg.quant == LayerQuant::Mxfp4 { 0 } else { 1 };
        Self {
            w13: vec![0; codes * e * 2 * i * h],
            w2: vec![0; codes * e * h * i],
            w13_scale: vec![0.0; codes * e * 2 * i * cfg.quant.scale_cols(h)],
            w2_scale: vec![0.0; codes * e * h * cfg.quant.scale_cols(i)],
            w13_f: Vec::new(),
            w2_f: Vec::new(),
            float_dtype: None,
            w2_amax: Vec::new(),
            scale_dtype: None,
            w13_g_idx: Vec::new(),
            w2_g_idx: Vec::new(),
            w13_zeros: Vec::new(),
            w2_zeros: Vec::new(),
            w13_bias: vec![0.0; e * 2 * i],
            w2_bias: vec![0.0; e * h],
            mx: MxBytes::default(),
            bias_loaded: vec![false; e * ExpertShard::ALL.len()],
            loaded,
            local_experts,
        }
    }

    /// Whether any expert bias was loaded.
    pub(crate) fn has_biases(&self) -> bool {
        self.bias_loaded.iter().any(|&b| b)
    }

    /// Marks every expert bias loaded (after a whole-layer copy from a checkpoint).
    #[cfg(feature = "checkpoint")]
    pub(crate) fn mark_biases_loaded(&mut self) {
        self.bias_loaded.fill(true);
    }

    /// The biases the fused pipeline adds, if the layer has them: `w13` on every rank, `w2`
    /// on tensor-parallel rank 0 only, since every rank holds it whole and the ranks' outputs
    /// are summed.
    pub(crate) fn expert_biases(&self, tp_rank: usize) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
        if !self.has_biases() {
            return (None, None);
        }
        let w2 = (tp_rank == 0).then(|| self.w2_bias.clone());
        (Some(self.w13_bias.clone()), w2)
    }

    /// Writes one expert's bias: `w1`/`w3` `[I_full]` (this rank's rows kept), `w2` `[H]`.
    fn load_bias(
        &mut self,
        local: usize,
        shard: ExpertShard,
        d: &Dims,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        let full = match shard {
            ExpertShard::W1 | ExpertShard::W3 => d.i_full,
            ExpertShard::W2 => d.h,
        };
        if view.shape != [full] || view.data.len() != full {
            return Err(LayerError::ParamShape {
                tensor: view.name.to_string(),
                expected: vec![full],
                actual: if view.shape == [full] {
                    vec![view.data.len()]
                } else {
                    view.shape.to_vec()
                },
            });
        }
        if matches!(view.data, TensorData::I8(_)) {
            return Err(LayerError::ParamDtype {
                tensor: view.name.to_string(),
                expected: "f32, bf16 or f16".into(),
                actual: "i8".into(),
            });
        }
        let (dst, src0) = match shard {
            ExpertShard::W1 => (&mut self.w13_bias[local * 2 * d.i..][..d.i], d.rank * d.i),
            ExpertShard::W3 => (
                &mut self.w13_bias[local * 2 * d.i + d.i..][..d.i],
                d.rank * d.i,
            ),
            ExpertShard::W2 => (&mut self.w2_bias[local * d.h..][..d.h], 0),
        };
        for (j, out) in dst.iter_mut().enumerate() {
            let index = src0 + j;
            let v = view.data.float_at(index).unwrap_or(f32::NAN);
            if !v.is_finite() {
                return Err(LayerError::ParamValue {
                    tensor: view.name.to_string(),
                    index,
                    value: f64::from(v),
                    reason: "biases must be finite",
                });
            }
            *out = v;
        }
        let s = ExpertShard::ALL
            .iter()
            .position(|x| *x == shard)
            .unwrap_or(0);
        self.bias_loaded[local * ExpertShard::ALL.len() + s] = true;
        Ok(())
    }

    fn slot(local: usize, shard: ExpertShard, kind: TensorKind) -> usize {
        let s = ExpertShard::ALL
            .iter()
            .position(|x| *x == shard)
            .unwrap_or(0);
        let k = usize::from(kind == TensorKind::Scale);
        (local * 3 + s) * 2 + k
    }

    /// Every parameter not yet loaded, named `experts.{global}.{shard}.{kind}`.
    pub(crate) fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        let biased = self.has_biases();
        for (local, &global) in self.local_experts.iter().enumerate() {
            for (s, shard) in ExpertShard::ALL.into_iter().enumerate() {
                for kind in TensorKind::REQUIRED {
                    if !self.loaded[Self::slot(local, shard, kind)] {
                        out.push(format!("experts.{global}.{}.{}", shard.name(), kind.name()));
                    }
                }
                if biased && !self.bias_loaded[local * ExpertShard::ALL.len() + s] {
                    out.push(format!("experts.{global}.{}.bias", shard.name()));
                }
            }
        }
        out
    }

    /// Marks everything loaded (after a whole-layer copy from a checkpoint).
    #[cfg(feature = "checkpoint")]
    pub(crate) fn mark_all_loaded(&mut self) {
        self.loaded.fill(true);
    }

    /// Writes one expert tensor (see [`crate::MoeLayer::load_expert_tensor`]).
    pub(crate) fn load_expert_tensor(
        &mut self,
        cfg: &MoeLayerConfig,
        expert: usize,
        shard: ExpertShard,
        kind: TensorKind,
        view: &TensorView<'_>,
    ) -> Result<(), LayerError> {
        if expert >= cfg.num_experts {
            return Err(LayerError::InvalidArgument {
                field: "expert",
                reason: format!(
                    "{}: expert {expert} but the layer has {} experts",
                    view.name, cfg.num_experts
                ),
            });
        }
        let local = match &cfg.expert_map {
            None => expert,
            Some(map) if map[expert] < 0 => return Ok(()),
            Some(map) => map[expert] as usize,
        };
        let d = Dims {
            h: cfg.hidden,
            i: cfg.intermediate_per_rank(),
            i_full: cfg.intermediate,
            rank: cfg.tp_rank,
            quant: cfg.quant,
        };
        if d.quant == LayerQuant::Mxfp4 {
            return Err(LayerError::InvalidArgument {
                field: "quant",
                reason: format!(
                    "{}: MXFP4 experts are loaded from a checkpoint's fused tensors, not tensor \
                     by tensor",
                    view.name
                ),
            });
        }
        if kind == TensorKind::Bias {
            return self.load_bias(local, shard, &d, view);
        }
        if d.quant.loads_float_weights() && kind == TensorKind::Scale {
            return Err(LayerError::InvalidArgument {
                field: "kind",
                reason: format!(
                    "{}: a {} layer has no weight scales to load",
                    view.name,
                    d.quant.name()
                ),
            });
        }
        // The whole tensor's shape, and the window this rank keeps: (row0, rows, col0, cols).
        let (full, window) = d.window(shard, kind);
        if view.shape != full {
            return Err(LayerError::ParamShape {
                tensor: view.name.to_string(),
                expected: full.to_vec(),
                actual: view.shape.to_vec(),
            });
        }
        if view.data.len() != full[0] * full[1] {
            return Err(LayerError::ParamShape {
                tensor: view.name.to_string(),
                expected: full.to_vec(),
                actual: vec![view.data.len()],
            });
        }
        let (row0, rows, col0, cols) = window;
        let width = full[1];
        let dst_row0 = if shard == ExpertShard::W3 { d.i } else { 0 };
        match kind {
            TensorKind::Weight if d.quant.loads_float_weights() => {
                self.load_float_weight(local, shard, view, &d, window)?;
            }
            TensorKind::Weight => {
                let TensorData::I8(src) = view.data else {
                    return Err(LayerError::ParamDtype {
                        tensor: view.name.to_string(),
                        expected: "i8".into(),
                        actual: view.data.dtype_name().into(),
                    });
                };
                let (lo, hi) = d.quant.code_range();
                if let Some(index) = src.iter().position(|v| !(lo..=hi).contains(v)) {
                    return Err(LayerError::ParamValue {
                        tensor: view.name.to_string(),
                        index,
                        value: f64::from(src[index]),
                        reason: "int4 codes must lie in [-8, 7]",
                    });
                }
                let (dst, dst_rows) = match shard {
                    ExpertShard::W2 => (&mut self.w2[local * d.h * d.i..][..d.h * d.i], d.h),
                    _ => (
                        &mut self.w13[local * 2 * d.i * d.h..][..2 * d.i * d.h],
                        2 * d.i,
                    ),
                };
                copy_window(
                    src,
                    width,
                    (row0, rows, col0, cols),
                    dst,
                    dst_row0,
                    dst_rows,
                );
            }
            TensorKind::Scale => {
                if matches!(view.data, TensorData::I8(_)) {
                    return Err(LayerError::ParamDtype {
                        tensor: view.name.to_string(),
                        expected: "f32, bf16 or f16".into(),
                        actual: "i8".into(),
                    });
                }
                let dtype = match view.data {
                    TensorData::Bf16(_) => moe_quant::DType::BF16,
                    TensorData::F16(_) => moe_quant::DType::F16,
                    _ => moe_quant::DType::F32,
                };
                // Scales given in different dtypes are kept in f32, which holds them all
                // exactly; narrowing them to the last one's dtype would round the others.
                self.scale_dtype = Some(match self.scale_dtype {
                    Some(before) if before != dtype => moe_quant::DType::F32,
                    _ => dtype,
                });
                let src: Vec<f32> = (0..view.data.len())
                    .map(|index| view.data.float_at(index).unwrap_or(f32::NAN))
                    .collect();
                check_scales(view.name, 0, &src, d.quant)?;
                let (dst, dst_rows) = match shard {
                    ExpertShard::W2 => {
                        let n = d.h * d.quant.scale_cols(d.i);
                        (&mut self.w2_scale[local * n..][..n], d.h)
                    }
                    _ => {
                        let n = 2 * d.i * d.quant.scale_cols(d.h);
                        (&mut self.w13_scale[local * n..][..n], 2 * d.i)
                    }
                };
                copy_window(
                    &src,
                    width,
                    (row0, rows, col0, cols),
                    dst,
                    dst_row0,
                    dst_rows,
                );
            }
            TensorKind::Bias => {}
        }
        self.loaded[Self::slot(local, shard, kind)] = true;
        Ok(())
    }
}

impl Params {
    /// Online int8: widens a float weight, checks it is finite and of the layer's one float
    /// dtype, and writes this rank's window (plus, for `w2`, each whole row's amax).
    fn load_float_weight(
        &mut self,
        local: usize,
        shard: ExpertShard,
        view: &TensorView<'_>,
        d: &Dims,
        window: (usize, usize, usize, usize),
    ) -> Result<(), LayerError> {
        let dtype = match view.data {
            TensorData::Bf16(_) => moe_quant::DType::BF16,
            TensorData::F16(_) => moe_quant::DType::F16,
            TensorData::F32(_) => moe_quant::DType::F32,
            TensorData::I8(_) => {
                return Err(LayerError::ParamDtype {
                    tensor: view.name.to_string(),
                    expected: "bf16, f16 or f32".into(),
                    actual: "i8".into(),
                });
            }
        };
        if let Some(prev) = self.float_dtype
            && prev != dtype
        {
            return Err(LayerError::ParamDtype {
                tensor: view.name.to_string(),
                expected: format!("{prev:?} (the dtype of the weights loaded before)"),
                actual: view.data.dtype_name().into(),
            });
        }
        let mut src = Vec::with_capacity(view.data.len());
        for index in 0..view.data.len() {
            let v = view.data.float_at(index).unwrap_or(f32::NAN);
            if !v.is_finite() {
                return Err(LayerError::ParamValue {
                    tensor: view.name.to_string(),
                    index,
                    value: f64::from(v),
                    reason: "weights must be finite",
                });
            }
            src.push(v);
        }
        self.float_dtype = Some(dtype);
        let width = view.shape[1];
        let (dst, dst_rows, dst_row0) = match shard {
            ExpertShard::W2 => {
                for (r, row) in src.chunks_exact(width).enumerate() {
                    self.w2_amax[local * d.h + r] = moe_quant::int8::row_amax(row);
                }
                (&mut self.w2_f[local * d.h * d.i..][..d.h * d.i], d.h, 0)
            }
            _ => (
                &mut self.w13_f[local * 2 * d.i * d.h..][..2 * d.i * d.h],
                2 * d.i,
                if shard == ExpertShard::W3 { d.i } else { 0 },
            ),
        };
        copy_window(&src, width, window, dst, dst_row0, dst_rows);
        Ok(())
    }
}

impl Dims {
    /// The whole checkpoint tensor's shape and the `(row0, rows, col0, cols)` window of it this
    /// rank keeps.
    fn window(
        &self,
        shard: ExpertShard,
        kind: TensorKind,
    ) -> ([usize; 2], (usize, usize, usize, usize)) {
        let (h, i, i_full, r) = (self.h, self.i, self.i_full, self.rank);
        match (shard, kind) {
            (ExpertShard::W1 | ExpertShard::W3, TensorKind::Scale) => {
                let c = self.quant.scale_cols(h);
                ([i_full, c], (r * i, i, 0, c))
            }
            (ExpertShard::W1 | ExpertShard::W3, _) => ([i_full, h], (r * i, i, 0, h)),
            (ExpertShard::W2, TensorKind::Scale) => match self.quant.group_size() {
                None => ([h, 1], (0, h, 0, 1)),
                Some(g) => ([h, i_full / g], (0, h, r * (i / g), i / g)),
            },
            (ExpertShard::W2, _) => ([h, i_full], (0, h, r * i, i)),
        }
    }
}

/// Copies `src[row0.., col0..]` (`rows × cols` of a `width`-wide matrix) into rows
/// `dst_row0..` of `dst` (`cols` wide, `dst_rows` rows).
fn copy_window<T: Copy>(
    src: &[T],
    width: usize,
    (row0, rows, col0, cols): (usize, usize, usize, usize),
    dst: &mut [T],
    dst_row0: usize,
    dst_rows: usize,
) {
    debug_assert!(dst_row0 + rows <= dst_rows);
    for r in 0..rows {
        let s = &src[(row0 + r) * width + col0..][..cols];
        dst[(dst_row0 + r) * cols..][..cols].copy_from_slice(s);
    }
}

/// Checks the scale values `values` of `tensor`, the first at flat index `first`. A scale must
/// be finite and non-negative. W4A8 group scales run as bf16, the kernels' format: an f32
/// checkpoint scale is rounded to bf16 (nearest, ties to even) when packed, as vLLM's W4A8
/// method rounds it when copying it into its bf16 parameter, so it must stay finite after that
/// rounding. WNA16 group scales may take that road too (int8 activations on the W4A8
/// kernels), so the same bound holds for them; the WNA16 kernels themselves keep f32 scales as
/// stored. Blocks are first tested branch-free (which vectorises) by a condition that implies
/// all of this; only a block that fails it is checked value by value, so the first bad value
/// is the one reported.
pub(crate) fn check_scales(
    tensor: &str,
    first: usize,
    values: &[f32],
    quant: LayerQuant,
) -> Result<(), LayerError> {
    const BLOCK: usize = 4096;
    // Values up to bf16's largest stay finite when rounded to bf16.
    let max = if rounded_to_bf16(quant) {
        bf16::MAX.to_f32()
    } else {
        f32::MAX
    };
    let surely_fine = |v: f32| (v >= 0.0) & (v <= max);
    for (b, block) in values.chunks(BLOCK).enumerate() {
        if !block.iter().fold(true, |ok, &v| ok & surely_fine(v)) {
            for (i, &v) in block.iter().enumerate() {
                check_scale(tensor, first + b * BLOCK + i, v, quant)?;
            }
        }
    }
    Ok(())
}

/// Whether the scales of `quant` may be rounded to bf16 when packed: W4A8 group scales always,
/// and WNA16 group scales too, since a layer with int8 activations runs them on the W4A8
/// kernels (the native WNA16 kernels keep them as stored, where such values would overflow the
/// products anyway).
fn rounded_to_bf16(quant: LayerQuant) -> bool {
    matches!(
        quant,
        LayerQuant::W4A8 {
            group_size: WeightGroups::Groups(_)
        } | LayerQuant::Wna16 {
            group_size: WeightGroups::Groups(_),
            ..
        }
    )
}

/// Refuses one scale value `v` (flat index `index` of `tensor`) that the packed format cannot
/// hold (see [`check_scales`]).
pub(crate) fn check_scale(
    tensor: &str,
    index: usize,
    v: f32,
    quant: LayerQuant,
) -> Result<(), LayerError> {
    let reason = if !v.is_finite() || v < 0.0 {
        Some("scales must be finite and non-negative")
    } else if rounded_to_bf16(quant) && !bf16::from_f32(v).to_f32().is_finite() {
        Some("group scales must stay finite when rounded to bf16")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LayerError::ParamValue {
            tensor: tensor.to_string(),
            index,
            value: f64::from(v),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;

    /// The bad value's index as [`check_scales`] reports it, or `None` when all pass.
    fn refused(first: usize, values: &[f32], quant: LayerQuant) -> Option<usize> {
        match check_scales("s", first, values, quant) {
            Ok(()) => None,
            Err(LayerError::ParamValue { index, .. }) => Some(index),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    /// The block test lets through only what the value-by-value check would, and the first
    /// bad value, in whichever block, is the one named.
    #[test]
    fn scale_checks_name_the_first_bad_value() {
        let grouped = LayerQuant::W4A8 {
            group_size: WeightGroups::Groups(NonZeroUsize::new(32).unwrap()),
        };
        let channelwise = LayerQuant::W4A8 {
            group_size: WeightGroups::Channelwise,
        };
        let wna16 = LayerQuant::Wna16 {
            bits: 4,
            group_size: WeightGroups::Channelwise,
            act_order: false,
            zero_points: false,
        };
        let wna16_grouped = LayerQuant::Wna16 {
            bits: 4,
            group_size: WeightGroups::Groups(NonZeroUsize::new(128).unwrap()),
            act_order: false,
            zero_points: false,
        };
        let all = [grouped, channelwise, wna16, wna16_grouped];
        let mut values = vec![0.5f32; 10_000];
        values[3] = 0.0;
        values[4] = -0.0;
        // Not exact in bf16 nor in f16: f32 scales are kept or rounded, never refused for it.
        values[5_000] = 0.1;
        for quant in all {
            assert_eq!(refused(7, &values, quant), None);
        }
        // Beyond bf16's range once rounded: only group scales may run as bf16.
        let mut wide = values.clone();
        wide[9_000] = f32::MAX;
        assert_eq!(refused(7, &wide, grouped), Some(9_007));
        assert_eq!(refused(7, &wide, wna16_grouped), Some(9_007));
        assert_eq!(refused(7, &wide, channelwise), None);
        assert_eq!(refused(7, &wide, wna16), None);
        // The largest finite bf16 passes both tests; the next f32 rounds down to it, so the
        // block test fails it and the value check passes it.
        wide[9_000] = bf16::MAX.to_f32();
        assert_eq!(refused(7, &wide, grouped), None);
        wide[9_000] = f32::from_bits(bf16::MAX.to_f32().to_bits() + 1);
        assert_eq!(refused(7, &wide, wna16_grouped), None);
        for bad in [f32::NAN, f32::INFINITY, -1e-30] {
            let mut v = values.clone();
            v[6_000] = bad;
            v[8_000] = bad;
            for quant in all {
                assert_eq!(refused(1, &v, quant), Some(6_001), "{bad} under {quant:?}");
            }
        }
    }
}
