//! Checkpoint tensor names of the MoE blocks of each [`ModelFamily`], and the mapping of a
//! per-expert name to (expert, shard `w1`/`w3`/`w2`, parameter kind), as vLLM's
//! `FusedMoE.make_expert_params_mapping` does it (spec section 6.3).
//!
//! | family | routed expert `e` of layer `l` | router | extras |
//! |---|---|---|---|
//! | Qwen2/3-MoE | `model.layers.{l}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.{suffix}` | `mlp.gate.weight` | Qwen2: `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight` |
//! | Mixtral | `model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.{suffix}` or `…{gate_proj,up_proj,down_proj}…` | `block_sparse_moe.gate.weight` | |
//! | DeepSeek-V2/V3 | `model.layers.{l}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.{suffix}` | `mlp.gate.weight` | `mlp.gate.e_score_correction_bias`, `mlp.shared_experts.*` |
//! | GLM-4 MoE | as DeepSeek | `mlp.gate.weight` | `mlp.gate.e_score_correction_bias`, `mlp.shared_experts.*` |
//! | OLMoE | as Qwen3-MoE | `mlp.gate.weight` | |
//! | Qwen3-Next | as Qwen2-MoE | `mlp.gate.weight` | `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight` |
//! | MiniMax-M2 | `model.layers.{l}.block_sparse_moe.experts.{e}.{w1,w3,w2}.{suffix}` | `block_sparse_moe.gate.weight` | `block_sparse_moe.e_score_correction_bias` |
//! | Llama 4 | bf16: all experts fused, transposed: `model.layers.{l}.feed_forward.experts.{gate_up_proj,down_proj}`; quantized: `….feed_forward.experts.{e}.{gate_proj,up_proj,down_proj}.{suffix}` | `feed_forward.router.weight` | `feed_forward.shared_expert.*`; multimodal checkpoints prefix every name with `language_model.` |
//! | Granite MoE | all experts fused: `model.layers.{l}.block_sparse_moe.{input_linear,output_linear}.weight` `[E, 2I, H]`, `[E, H, I]` | `block_sparse_moe.router.layer.weight` | `shared_mlp.{input_linear,output_linear}.weight` |
//! | ERNIE-4.5 MoE | as Qwen3-MoE | `mlp.gate.weight` | `mlp.moe_statics.e_score_correction_bias` `[1, E]`, `mlp.shared_experts.*` |
//! | PhiMoE | as Mixtral | `block_sparse_moe.gate.weight` | |
//! | gpt-oss | all experts fused: `model.layers.{l}.mlp.experts.{gate_up_proj,down_proj}_{blocks,scales,bias}` (MXFP4) or `….experts.{gate_up_proj,down_proj}{,_bias}` (bf16) | `mlp.router.weight` | `mlp.router.bias` |
//!
//! `gate_proj`/`w1` is shard `w1` (rows `0..I` of `w13`), `up_proj`/`w3` is `w3` (rows
//! `I..2I`), `down_proj`/`w2` is `w2`. The suffix says which tensor of the projection it is
//! ([`ParamKind`]); vLLM keeps it when renaming (`experts.3.gate_proj.weight_scale` →
//! `w13_weight_scale`, expert 3, shard `w1`).

use std::fmt;

use super::config::ModelFamily;

/// Which part of the fused expert weights a projection fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShardId {
    /// The gate projection: rows `0..I` of `w13`.
    W1,
    /// The up projection: rows `I..2I` of `w13`.
    W3,
    /// The down projection: `w2`.
    W2,
}

impl ShardId {
    /// All three, in `w1, w3, w2` order.
    pub const ALL: [ShardId; 3] = [ShardId::W1, ShardId::W3, ShardId::W2];

    /// vLLM's shard id string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::W1 => "w1",
            Self::W3 => "w3",
            Self::W2 => "w2",
        }
    }

    /// The fused parameter prefix (`w13_` or `w2_`).
    pub fn fused_prefix(self) -> &'static str {
        match self {
            Self::W1 | Self::W3 => "w13_",
            Self::W2 => "w2_",
        }
    }

    /// The projection module name used by current tooling (`gate_proj`, `up_proj`, `down_proj`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::W1 => "gate_proj",
            Self::W3 => "up_proj",
            Self::W2 => "down_proj",
        }
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which tensor of a projection a name holds (its last name component).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ParamKind {
    /// `weight`: float weights, or int8-stored codes (`int-quantized`).
    Weight,
    /// `bias`.
    Bias,
    /// `weight_scale` (compressed-tensors).
    WeightScale,
    /// `weight_zero_point` (compressed-tensors, asymmetric only).
    WeightZeroPoint,
    /// `weight_packed` (compressed-tensors `pack-quantized`).
    WeightPacked,
    /// `weight_shape` (compressed-tensors `pack-quantized`).
    WeightShape,
    /// `weight_g_idx` (compressed-tensors act-order).
    WeightGIdx,
    /// `input_scale` (static activation quantization).
    InputScale,
    /// `qweight` (GPTQ).
    QWeight,
    /// `scales` (GPTQ).
    Scales,
    /// `qzeros` (GPTQ).
    QZeros,
    /// `g_idx` (GPTQ).
    GIdx,
}

impl ParamKind {
    /// Every kind.
    pub const ALL: [ParamKind; 12] = [
        Self::Weight,
        Self::Bias,
        Self::WeightScale,
        Self::WeightZeroPoint,
        Self::WeightPacked,
        Self::WeightShape,
        Self::WeightGIdx,
        Self::InputScale,
        Self::QWeight,
        Self::Scales,
        Self::QZeros,
        Self::GIdx,
    ];

    /// The name suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Weight => "weight",
            Self::Bias => "bias",
            Self::WeightScale => "weight_scale",
            Self::WeightZeroPoint => "weight_zero_point",
            Self::WeightPacked => "weight_packed",
            Self::WeightShape => "weight_shape",
            Self::WeightGIdx => "weight_g_idx",
            Self::InputScale => "input_scale",
            Self::QWeight => "qweight",
            Self::Scales => "scales",
            Self::QZeros => "qzeros",
            Self::GIdx => "g_idx",
        }
    }

    /// Parses a suffix.
    pub fn from_suffix(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.suffix() == s)
    }
}

/// A routed-expert tensor name, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertParam {
    /// Decoder layer.
    pub layer: usize,
    /// Global expert index as written in the name.
    pub expert: usize,
    /// Which part of the fused weights it fills.
    pub shard: ShardId,
    /// Which tensor of the projection it is.
    pub kind: ParamKind,
}

impl ExpertParam {
    /// The fused parameter vLLM loads it into (`w13_weight_scale`, `w2_qweight`, ...).
    pub fn fused_param_name(&self) -> String {
        format!("{}{}", self.shard.fused_prefix(), self.kind.suffix())
    }
}

/// Tensor names of one model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeNames {
    family: ModelFamily,
    /// The decoder layers' prefix, before the layer index.
    layers: &'static str,
}

impl MoeNames {
    /// The names of `family`.
    pub fn new(family: ModelFamily) -> Self {
        Self {
            family,
            layers: "model.layers",
        }
    }

    /// The same names under the language model of a multimodal checkpoint whose tensors
    /// include `name` (`language_model.model.layers.…` as Llama 4 stores them,
    /// `model.language_model.layers.…` as Qwen3-VL does); `None` when `name` lies under
    /// neither.
    pub fn in_language_model_of(self, name: &str) -> Option<Self> {
        const ROOTS: [&str; 2] = ["language_model.model.layers", "model.language_model.layers"];
        let layers = ROOTS.into_iter().find(|root| {
            name.strip_prefix(root)
                .is_some_and(|rest| rest.starts_with('.'))
        })?;
        Some(Self { layers, ..self })
    }

    /// The MoE block prefix of a layer: `model.layers.{l}.mlp`,
    /// `model.layers.{l}.block_sparse_moe` or `model.layers.{l}.feed_forward`.
    pub fn block_prefix(&self, layer: usize) -> String {
        format!("{}.{layer}.{}", self.layers, self.block_module())
    }

    fn block_module(&self) -> &'static str {
        match self.family {
            ModelFamily::Mixtral
            | ModelFamily::MiniMaxM2
            | ModelFamily::GraniteMoe
            | ModelFamily::PhiMoe => "block_sparse_moe",
            ModelFamily::Llama4 => "feed_forward",
            _ => "mlp",
        }
    }

    /// The projection module names accepted for a shard, preferred first. Mixtral accepts both
    /// its historical `w1`/`w3`/`w2` and the current `gate_proj`/`up_proj`/`down_proj`.
    pub fn projection_names(&self, shard: ShardId) -> &'static [&'static str] {
        match (self.family, shard) {
            (ModelFamily::Mixtral | ModelFamily::PhiMoe, ShardId::W1) => &["w1", "gate_proj"],
            (ModelFamily::Mixtral | ModelFamily::PhiMoe, ShardId::W3) => &["w3", "up_proj"],
            (ModelFamily::Mixtral | ModelFamily::PhiMoe, ShardId::W2) => &["w2", "down_proj"],
            (ModelFamily::MiniMaxM2, ShardId::W1) => &["w1"],
            (ModelFamily::MiniMaxM2, ShardId::W3) => &["w3"],
            (ModelFamily::MiniMaxM2, ShardId::W2) => &["w2"],
            (_, ShardId::W1) => &["gate_proj"],
            (_, ShardId::W3) => &["up_proj"],
            (_, ShardId::W2) => &["down_proj"],
        }
    }

    /// The module prefixes of one routed expert's projection, one per accepted spelling
    /// (append `.{suffix}` for a tensor name).
    pub fn expert_projection(&self, layer: usize, expert: usize, shard: ShardId) -> Vec<String> {
        let block = self.block_prefix(layer);
        self.projection_names(shard)
            .iter()
            .map(|p| format!("{block}.experts.{expert}.{p}"))
            .collect()
    }

    /// The router (gate) weight `[E, H]`.
    pub fn router_weight(&self, layer: usize) -> String {
        format!(
            "{}.{}.weight",
            self.block_prefix(layer),
            self.router_module()
        )
    }

    /// The router linear's bias `[E]`, for the families whose router has one (gpt-oss).
    pub fn router_bias(&self, layer: usize) -> Option<String> {
        (self.family == ModelFamily::GptOss)
            .then(|| format!("{}.router.bias", self.block_prefix(layer)))
    }

    fn router_module(&self) -> &'static str {
        match self.family {
            ModelFamily::GptOss | ModelFamily::Llama4 => "router",
            ModelFamily::GraniteMoe => "router.layer",
            _ => "gate",
        }
    }

    /// A tensor of the experts a family stores fused per layer (gpt-oss, Llama 4 in bf16):
    /// `tensor` is `gate_up_proj_blocks`, `down_proj_scales`, `gate_up_proj`, ...
    pub fn fused_experts(&self, layer: usize, tensor: &str) -> String {
        format!("{}.experts.{tensor}", self.block_prefix(layer))
    }

    /// A linear of Granite MoE's fused experts (`input_linear`, `output_linear`), every expert
    /// in one `[E, N, K]` weight.
    pub fn fused_linear(&self, layer: usize, linear: &str) -> String {
        format!("{}.{linear}.weight", self.block_prefix(layer))
    }

    /// A linear of Granite MoE's shared MLP (`input_linear` `[2I, H]`, gate rows then up rows;
    /// `output_linear` `[H, I]`), which sits beside the block rather than in it.
    pub fn shared_mlp_linear(&self, layer: usize, linear: &str) -> String {
        format!("{}.{layer}.shared_mlp.{linear}.weight", self.layers)
    }

    /// The router's score correction bias `[E]` (DeepSeek-V3 `noaux_tc`, GLM-4 MoE: under the
    /// gate; MiniMax-M2: on the block; ERNIE-4.5: `[1, E]` under `moe_statics`).
    pub fn correction_bias(&self, layer: usize) -> String {
        match self.family {
            ModelFamily::MiniMaxM2 => {
                format!("{}.e_score_correction_bias", self.block_prefix(layer))
            }
            ModelFamily::Ernie45Moe => format!(
                "{}.moe_statics.e_score_correction_bias",
                self.block_prefix(layer)
            ),
            _ => format!("{}.gate.e_score_correction_bias", self.block_prefix(layer)),
        }
    }

    /// The module prefix of a shared-expert projection, if the family has shared experts.
    pub fn shared_projection(&self, layer: usize, shard: ShardId) -> Option<String> {
        let module = match self.family {
            ModelFamily::Qwen2Moe | ModelFamily::Qwen3Next | ModelFamily::Llama4 => "shared_expert",
            ModelFamily::DeepseekV2
            | ModelFamily::DeepseekV3
            | ModelFamily::Glm4Moe
            | ModelFamily::Ernie45Moe => "shared_experts",
            _ => return None,
        };
        Some(format!(
            "{}.{module}.{}",
            self.block_prefix(layer),
            shard.hf_name()
        ))
    }

    /// The sigmoid gate of the shared expert `[1, H]` (Qwen2-MoE, Qwen3-Next).
    pub fn shared_expert_gate(&self, layer: usize) -> Option<String> {
        matches!(self.family, ModelFamily::Qwen2Moe | ModelFamily::Qwen3Next)
            .then(|| format!("{}.shared_expert_gate.weight", self.block_prefix(layer)))
    }

    /// Decodes a routed-expert tensor name of this family; `None` for any other name (router,
    /// shared experts, attention, names with an unknown projection or suffix).
    pub fn parse_expert_param(&self, name: &str) -> Option<ExpertParam> {
        let rest = name.strip_prefix(self.layers)?.strip_prefix('.')?;
        let (layer, rest) = rest.split_once('.')?;
        let layer = parse_index(layer)?;
        let rest = rest.strip_prefix(self.block_module())?;
        let rest = rest.strip_prefix(".experts.")?;
        let (expert, rest) = rest.split_once('.')?;
        let expert = parse_index(expert)?;
        let (projection, suffix) = rest.split_once('.')?;
        let shard = ShardId::ALL
            .into_iter()
            .find(|&s| self.projection_names(s).contains(&projection))?;
        let kind = ParamKind::from_suffix(suffix)?;
        Some(ExpertParam {
            layer,
            expert,
            shard,
            kind,
        })
    }

    /// Whether `name` is under layer `layer`'s routed experts (`….experts.`), whatever follows.
    pub fn is_layer_expert_tensor(&self, layer: usize, name: &str) -> bool {
        name.strip_prefix(&self.block_prefix(layer))
            .is_some_and(|r| r.starts_with(".experts."))
    }
}

/// A decimal index without sign or leading zeros (except `0` itself).
fn parse_index(s: &str) -> Option<usize> {
    if s.is_empty() || (s.len() > 1 && s.starts_with('0')) || !s.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_expert_names_like_make_expert_params_mapping() {
        let q = MoeNames::new(ModelFamily::Qwen3Moe);
        let p = q
            .parse_expert_param("model.layers.7.mlp.experts.3.gate_proj.weight_scale")
            .unwrap();
        assert_eq!(
            p,
            ExpertParam {
                layer: 7,
                expert: 3,
                shard: ShardId::W1,
                kind: ParamKind::WeightScale
            }
        );
        assert_eq!(p.fused_param_name(), "w13_weight_scale");
        let p = q
            .parse_expert_param("model.layers.0.mlp.experts.12.down_proj.qweight")
            .unwrap();
        assert_eq!(
            (p.expert, p.shard, p.fused_param_name().as_str()),
            (12, ShardId::W2, "w2_qweight")
        );
        assert!(
            q.parse_expert_param("model.layers.0.mlp.gate.weight")
                .is_none()
        );
        assert!(
            q.parse_expert_param("model.layers.0.mlp.experts.1.w1.weight")
                .is_none()
        );
        assert!(
            q.parse_expert_param("model.layers.0.mlp.experts.01.up_proj.weight")
                .is_none()
        );

        let m = MoeNames::new(ModelFamily::Mixtral);
        for (name, shard) in [
            (
                "model.layers.2.block_sparse_moe.experts.5.w3.weight",
                ShardId::W3,
            ),
            (
                "model.layers.2.block_sparse_moe.experts.5.up_proj.weight",
                ShardId::W3,
            ),
            (
                "model.layers.2.block_sparse_moe.experts.5.w2.weight_packed",
                ShardId::W2,
            ),
        ] {
            let p = m.parse_expert_param(name).unwrap();
            assert_eq!((p.layer, p.expert, p.shard), (2, 5, shard));
        }
        assert_eq!(
            m.router_weight(4),
            "model.layers.4.block_sparse_moe.gate.weight"
        );
        assert!(m.shared_projection(0, ShardId::W1).is_none());
        assert!(m.router_bias(4).is_none());

        let g = MoeNames::new(ModelFamily::GptOss);
        assert_eq!(g.router_weight(1), "model.layers.1.mlp.router.weight");
        assert_eq!(g.router_bias(1).unwrap(), "model.layers.1.mlp.router.bias");
        assert_eq!(
            g.fused_experts(1, "down_proj_scales"),
            "model.layers.1.mlp.experts.down_proj_scales"
        );
        assert!(g.is_layer_expert_tensor(1, "model.layers.1.mlp.experts.gate_up_proj_bias"));

        let d = MoeNames::new(ModelFamily::DeepseekV3);
        assert_eq!(
            d.correction_bias(3),
            "model.layers.3.mlp.gate.e_score_correction_bias"
        );
        assert_eq!(
            d.shared_projection(3, ShardId::W2).unwrap(),
            "model.layers.3.mlp.shared_experts.down_proj"
        );
        let q2 = MoeNames::new(ModelFamily::Qwen2Moe);
        assert_eq!(
            q2.shared_projection(1, ShardId::W3).unwrap(),
            "model.layers.1.mlp.shared_expert.up_proj"
        );
        assert_eq!(
            q2.shared_expert_gate(1).unwrap(),
            "model.layers.1.mlp.shared_expert_gate.weight"
        );
    }
}
