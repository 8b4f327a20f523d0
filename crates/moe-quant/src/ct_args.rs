//! The compressed-tensors `quantization_config` of a checkpoint's `config.json` (spec section
//! 6.1): [`QuantizationConfig`], its config groups ([`QuantizationScheme`]) and per-tensor
//! [`QuantizationArgs`], parsed with serde and checked by [`QuantizationArgs::validate`].
//!
//! Field names and enum spellings follow compressed-tensors' `quant_args.py` and
//! `quant_scheme.py`. Unknown fields are ignored, so newer producers still parse.
//! Also here: [`is_dynamic_token_w4a8_int`], the predicate vLLM uses to pick its W4A8-int MoE
//! method, and [`check_w4a8_int_moe`], that method's constructor checks with vLLM's messages.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::dtype::DType;
use crate::error::QuantError;
use crate::weight_groups::WeightGroups;

/// Integer or floating-point quantized values (`"type"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum QuantizationType {
    /// Integer codes.
    Int,
    /// Floating-point codes (fp8, fp4).
    Float,
}

/// Scale granularity (`"strategy"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum QuantizationStrategy {
    /// One scale for the tensor.
    Tensor,
    /// One scale per output channel.
    Channel,
    /// One scale per `group_size` input columns of each output channel.
    Group,
    /// One scale per `block_structure` block.
    Block,
    /// One scale per token (activations).
    Token,
    /// Groups plus a per-tensor global scale (NVFP4).
    TensorGroup,
    /// One scale per attention head.
    AttnHead,
}

/// Whether scales are fixed or computed at run time (`"dynamic"`: `false`, `true` or `"local"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DynamicType {
    /// `false`: scales computed at calibration and stored.
    #[default]
    Static,
    /// `true`: scales computed per call.
    Dynamic,
    /// `"local"`: local scales dynamic, global scale static (tensor_group strategy).
    Local,
}

impl DynamicType {
    /// Python truthiness of the value (`"local"` is truthy), which is how vLLM tests it.
    pub fn is_truthy(self) -> bool {
        !matches!(self, DynamicType::Static)
    }
}

impl<'de> Deserialize<'de> for DynamicType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(false) => Ok(DynamicType::Static),
            Raw::Bool(true) => Ok(DynamicType::Dynamic),
            Raw::Str(s) if s == "local" => Ok(DynamicType::Local),
            Raw::Str(s) => Err(serde::de::Error::custom(format!(
                "dynamic must be true, false or \"local\", got {s:?}"
            ))),
        }
    }
}

/// Activation ordering of GPTQ-style weights (`"actorder"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ActivationOrdering {
    /// Columns reordered, groups follow `g_idx` (checkpoint carries `weight_g_idx`).
    Group,
    /// Columns reordered during calibration only; groups stay contiguous.
    Weight,
    /// Alias of `group`.
    Dynamic,
    /// Alias of `weight`.
    Static,
}

fn deserialize_actorder<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<ActivationOrdering>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bool(bool),
        Named(ActivationOrdering),
    }
    // compressed-tensors maps `true` to "group" and `false` to none.
    Ok(match Option::<Raw>::deserialize(d)? {
        None | Some(Raw::Bool(false)) => None,
        Some(Raw::Bool(true)) => Some(ActivationOrdering::Group),
        Some(Raw::Named(a)) => Some(a),
    })
}

fn deserialize_block_structure<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<i64>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        List(Vec<i64>),
        Str(String),
    }
    // Older producers wrote "128x128".
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::List(v)) => Ok(Some(v)),
        Some(Raw::Str(s)) => s
            .split('x')
            .map(|p| p.trim().parse::<i64>())
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("bad block_structure {s:?}"))),
    }
}

fn default_num_bits() -> u32 {
    8
}

fn default_type() -> QuantizationType {
    QuantizationType::Int
}

fn default_true() -> bool {
    true
}

/// How one kind of tensor (weights, input or output activations) is quantized
/// (compressed-tensors `QuantizationArgs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuantizationArgs {
    /// Bits per quantized value.
    #[serde(default = "default_num_bits")]
    pub num_bits: u32,
    /// Integer or float codes.
    #[serde(rename = "type", default = "default_type")]
    pub kind: QuantizationType,
    /// Symmetric (no zero point) or asymmetric.
    #[serde(default = "default_true")]
    pub symmetric: bool,
    /// Columns per group; `-1` is an older spelling of channelwise.
    #[serde(default)]
    pub group_size: Option<i64>,
    /// Scale granularity; inferred from `group_size` when absent
    /// (see [`QuantizationArgs::effective_strategy`]).
    #[serde(default)]
    pub strategy: Option<QuantizationStrategy>,
    /// Block shape `[rows, cols]` for the block strategy.
    #[serde(default, deserialize_with = "deserialize_block_structure")]
    pub block_structure: Option<Vec<i64>>,
    /// Static, dynamic or local scales.
    #[serde(default)]
    pub dynamic: DynamicType,
    /// Activation ordering, if any.
    #[serde(default, deserialize_with = "deserialize_actorder")]
    pub actorder: Option<ActivationOrdering>,
    /// Scale dtype as written (`"torch.bfloat16"`, `"bfloat16"`); `None` = the model dtype.
    #[serde(default)]
    pub scale_dtype: Option<String>,
    /// Zero-point dtype as written; `None` = default.
    #[serde(default)]
    pub zp_dtype: Option<String>,
    /// Calibration observer name (informational).
    #[serde(default)]
    pub observer: Option<String>,
    /// Calibration observer arguments (informational).
    #[serde(default)]
    pub observer_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl QuantizationArgs {
    /// The strategy, inferred as compressed-tensors does when the field is absent:
    /// `group_size > 0` → group, `group_size == -1` → channel, none → tensor.
    pub fn effective_strategy(&self) -> QuantizationStrategy {
        match (self.strategy, self.group_size) {
            (Some(s), _) => s,
            (None, Some(g)) if g > 0 => QuantizationStrategy::Group,
            (None, Some(-1)) => QuantizationStrategy::Channel,
            (None, _) => QuantizationStrategy::Tensor,
        }
    }

    /// The group size of a group or tensor_group strategy, once validated positive.
    pub fn group_size_usize(&self) -> Option<usize> {
        self.group_size
            .filter(|&g| g > 0)
            .and_then(|g| usize::try_from(g).ok())
    }

    /// The weight grouping of the group and channel strategies, parsed from `group_size`
    /// (`Ok(None)` for every other strategy, which groups no weight columns). A group strategy
    /// without a valid positive size is an error, as [`Self::validate`] reports it.
    pub fn weight_groups(&self) -> Result<Option<WeightGroups>, QuantError> {
        match self.effective_strategy() {
            QuantizationStrategy::Group => match self.group_size {
                Some(g) if g > 0 => WeightGroups::from_config(g).map(Some),
                other => Err(QuantError::InvalidQuantArgs {
                    field: "group_size",
                    reason: format!("strategy Group needs a positive group_size, got {other:?}"),
                }),
            },
            QuantizationStrategy::Channel => Ok(Some(WeightGroups::Channelwise)),
            _ => Ok(None),
        }
    }

    /// `scale_dtype` parsed; `Ok(None)` when unset.
    pub fn scale_dtype(&self) -> Result<Option<DType>, QuantError> {
        self.scale_dtype.as_deref().map(str::parse).transpose()
    }

    /// `zp_dtype` parsed; `Ok(None)` when unset.
    pub fn zp_dtype(&self) -> Result<Option<DType>, QuantError> {
        self.zp_dtype.as_deref().map(str::parse).transpose()
    }

    /// Checks that the fields are consistent with each other:
    ///
    /// - `num_bits` in `1..=8` for int, `4` or `8` for float;
    /// - group and tensor_group need `group_size > 0`; channel allows none or `-1`; tensor,
    ///   token and attn_head allow none; `group_size` is never `0` or below `-1`;
    /// - block needs a `block_structure` of two positive extents, and only block has one;
    /// - `actorder` only with the group strategy;
    /// - `dynamic: "local"` only with tensor_group;
    /// - `scale_dtype` and `zp_dtype` name known dtypes.
    pub fn validate(&self) -> Result<(), QuantError> {
        let bits_ok = match self.kind {
            QuantizationType::Int => (1..=8).contains(&self.num_bits),
            QuantizationType::Float => matches!(self.num_bits, 4 | 8),
        };
        if !bits_ok {
            let (what, min, max) = match self.kind {
                QuantizationType::Int => ("int quantization args", 1, 8),
                QuantizationType::Float => ("float quantization args (4 or 8)", 4, 8),
            };
            return Err(QuantError::UnsupportedNumBits {
                what,
                num_bits: self.num_bits,
                min,
                max,
            });
        }
        if let Some(g) = self.group_size
            && (g == 0 || g < -1)
        {
            return Err(invalid(
                "group_size",
                format!("must be positive or -1, got {g}"),
            ));
        }
        let strategy = self.effective_strategy();
        use QuantizationStrategy as S;
        match strategy {
            S::Group | S::TensorGroup => {
                if self.group_size_usize().is_none() {
                    return Err(invalid(
                        "group_size",
                        format!(
                            "strategy {strategy:?} needs a positive group_size, got {:?}",
                            self.group_size
                        ),
                    ));
                }
            }
            S::Channel => {
                if !matches!(self.group_size, None | Some(-1)) {
                    return Err(invalid(
                        "group_size",
                        format!(
                            "strategy channel takes no group_size, got {:?}",
                            self.group_size
                        ),
                    ));
                }
            }
            S::Tensor | S::Token | S::AttnHead | S::Block => {
                if self.group_size.is_some() {
                    return Err(invalid(
                        "group_size",
                        format!(
                            "strategy {strategy:?} takes no group_size, got {:?}",
                            self.group_size
                        ),
                    ));
                }
            }
        }
        match (strategy, &self.block_structure) {
            (S::Block, None) => {
                return Err(invalid(
                    "block_structure",
                    "strategy block needs a block_structure".into(),
                ));
            }
            (S::Block, Some(b)) if b.len() != 2 || b.iter().any(|&x| x <= 0) => {
                return Err(invalid(
                    "block_structure",
                    format!("must be two positive extents, got {b:?}"),
                ));
            }
            (S::Block, Some(_)) | (_, None) => {}
            (_, Some(b)) => {
                return Err(invalid(
                    "block_structure",
                    format!("only the block strategy takes one, got {b:?} with {strategy:?}"),
                ));
            }
        }
        if let Some(a) = self.actorder
            && strategy != S::Group
        {
            return Err(invalid(
                "actorder",
                format!("{a:?} needs the group strategy, got {strategy:?}"),
            ));
        }
        if self.dynamic == DynamicType::Local && strategy != S::TensorGroup {
            return Err(invalid(
                "dynamic",
                format!("\"local\" needs the tensor_group strategy, got {strategy:?}"),
            ));
        }
        self.scale_dtype()?;
        self.zp_dtype()?;
        Ok(())
    }
}

fn invalid(field: &'static str, reason: String) -> QuantError {
    QuantError::InvalidQuantArgs { field, reason }
}

/// One config group: which modules it targets and how their tensors are quantized
/// (compressed-tensors `QuantizationScheme`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuantizationScheme {
    /// Module names, class names (`"Linear"`) or `re:` patterns the scheme applies to.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Weight quantization, if any.
    #[serde(default)]
    pub weights: Option<QuantizationArgs>,
    /// Input activation quantization, if any.
    #[serde(default)]
    pub input_activations: Option<QuantizationArgs>,
    /// Output activation quantization, if any.
    #[serde(default)]
    pub output_activations: Option<QuantizationArgs>,
    /// Per-group compression format override (`"int-quantized"`, `"pack-quantized"`, ...).
    #[serde(default)]
    pub format: Option<String>,
}

impl QuantizationScheme {
    /// Validates every present [`QuantizationArgs`].
    pub fn validate(&self) -> Result<(), QuantError> {
        for args in [
            &self.weights,
            &self.input_activations,
            &self.output_activations,
        ]
        .into_iter()
        .flatten()
        {
            args.validate()?;
        }
        Ok(())
    }
}

/// A checkpoint's `quantization_config` (compressed-tensors `QuantizationConfig`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[non_exhaustive]
pub struct QuantizationConfig {
    /// `"compressed-tensors"` for the checkpoints we load.
    pub quant_method: String,
    /// Global compression format (`"int-quantized"` for W4A8, `"pack-quantized"` for W4A16).
    #[serde(default)]
    pub format: Option<String>,
    /// `"compressed"` for stored checkpoints.
    #[serde(default)]
    pub quantization_status: Option<String>,
    /// Named config groups (`"group_0"`, ...), ordered by name.
    #[serde(default)]
    pub config_groups: BTreeMap<String, QuantizationScheme>,
    /// Modules left unquantized (router gates, `lm_head`).
    #[serde(default)]
    pub ignore: Vec<String>,
    /// KV-cache quantization scheme (kept raw; unused here).
    #[serde(default)]
    pub kv_cache_scheme: Option<serde_json::Value>,
    /// Producer version string.
    #[serde(default)]
    pub version: Option<String>,
}

impl QuantizationConfig {
    /// Parses a `quantization_config` object given as JSON text.
    pub fn from_json_str(json: &str) -> Result<Self, QuantError> {
        serde_json::from_str(json).map_err(parse_error)
    }

    /// Parses the `quantization_config` member of a whole `config.json`.
    pub fn from_model_config_str(config_json: &str) -> Result<Self, QuantError> {
        let mut root: serde_json::Value = serde_json::from_str(config_json).map_err(parse_error)?;
        let qc = root
            .get_mut("quantization_config")
            .map(serde_json::Value::take)
            .ok_or_else(|| QuantError::ConfigParse {
                message: "config.json has no quantization_config".into(),
            })?;
        serde_json::from_value(qc).map_err(parse_error)
    }

    /// Validates every config group.
    pub fn validate(&self) -> Result<(), QuantError> {
        if self.quant_method != "compressed-tensors" {
            return Err(invalid(
                "quant_method",
                format!(
                    "expected \"compressed-tensors\", got {:?}",
                    self.quant_method
                ),
            ));
        }
        self.config_groups.values().try_for_each(|s| s.validate())
    }
}

fn parse_error(e: serde_json::Error) -> QuantError {
    QuantError::ConfigParse {
        message: e.to_string(),
    }
}

/// vLLM's `_is_dynamic_token_w4a8_int` (spec section 6.1): whether a scheme selects the W4A8-int
/// MoE method. Weights: 4 bits, group or channel strategy, symmetric, static. Activations:
/// 8 bits, token strategy, dynamic. Activation symmetry is ignored (the method quantizes
/// activations itself); like vLLM, the value type (`int`/`float`) is not looked at.
pub fn is_dynamic_token_w4a8_int(
    weights: &QuantizationArgs,
    input: Option<&QuantizationArgs>,
) -> bool {
    let Some(input) = input else {
        return false;
    };
    let weight_strategy_ok = matches!(
        weights.effective_strategy(),
        QuantizationStrategy::Group | QuantizationStrategy::Channel
    );
    weights.num_bits == 4
        && input.num_bits == 8
        && weight_strategy_ok
        && input.effective_strategy() == QuantizationStrategy::Token
        && weights.symmetric
        && !weights.dynamic.is_truthy()
        && input.dynamic.is_truthy()
}

/// The checks of vLLM's W4A8-int MoE method constructor, in its order and with its messages:
/// activations must be dynamic per token
/// ([`QuantError::W4A8NeedsDynamicTokenActivations`]), weights must be 4-bit
/// ([`QuantError::W4A8OnlyFourBitWeights`]).
pub fn check_w4a8_int_moe(
    weights: &QuantizationArgs,
    input: Option<&QuantizationArgs>,
) -> Result<(), QuantError> {
    let dynamic_token = input.is_some_and(|a| {
        a.effective_strategy() == QuantizationStrategy::Token && a.dynamic.is_truthy()
    });
    if !dynamic_token {
        return Err(QuantError::W4A8NeedsDynamicTokenActivations);
    }
    if weights.num_bits != 4 {
        return Err(QuantError::W4A8OnlyFourBitWeights {
            num_bits: weights.num_bits,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(json: &str) -> QuantizationArgs {
        serde_json::from_str(json).unwrap()
    }

    const W4_GROUP: &str = r#"{"num_bits": 4, "type": "int", "symmetric": true,
        "strategy": "group", "group_size": 128, "dynamic": false, "actorder": null}"#;
    const A8_TOKEN: &str = r#"{"num_bits": 8, "type": "int", "symmetric": false, "strategy": "token", "dynamic": true}"#;

    #[test]
    fn parses_variants_of_dynamic_actorder_block() {
        let a = args(
            r#"{"dynamic": "local", "strategy": "tensor_group", "group_size": 16,
            "type": "float", "num_bits": 4}"#,
        );
        assert_eq!(a.dynamic, DynamicType::Local);
        a.validate().unwrap();
        let a = args(r#"{"num_bits": 4, "group_size": 32, "actorder": true}"#);
        assert_eq!(a.actorder, Some(ActivationOrdering::Group));
        assert_eq!(a.effective_strategy(), QuantizationStrategy::Group);
        a.validate().unwrap();
        let a = args(r#"{"strategy": "block", "block_structure": "128x128", "type": "float"}"#);
        assert_eq!(a.block_structure, Some(vec![128, 128]));
        a.validate().unwrap();
        assert!(serde_json::from_str::<QuantizationArgs>(r#"{"dynamic": "sometimes"}"#).is_err());
    }

    #[test]
    fn weight_groups_of_the_strategies() {
        let groups = |json: &str| args(json).weight_groups();
        assert_eq!(
            groups(W4_GROUP),
            Ok(Some(WeightGroups::groups(128).unwrap()))
        );
        assert_eq!(
            groups(r#"{"group_size": -1}"#),
            Ok(Some(WeightGroups::Channelwise))
        );
        assert_eq!(
            groups(r#"{"strategy": "channel"}"#),
            Ok(Some(WeightGroups::Channelwise))
        );
        assert_eq!(groups(r#"{"strategy": "token"}"#), Ok(None));
        assert_eq!(groups(r#"{}"#), Ok(None));
        assert!(matches!(
            groups(r#"{"strategy": "group"}"#),
            Err(QuantError::InvalidQuantArgs {
                field: "group_size",
                ..
            })
        ));
    }

    #[test]
    fn validate_rejects_inconsistent_args() {
        let field_of = |json: &str| match args(json).validate() {
            Err(QuantError::InvalidQuantArgs { field, .. }) => field,
            other => panic!("{json}: {other:?}"),
        };
        assert_eq!(field_of(r#"{"strategy": "group"}"#), "group_size");
        assert_eq!(
            field_of(r#"{"strategy": "group", "group_size": 0}"#),
            "group_size"
        );
        assert_eq!(
            field_of(r#"{"strategy": "channel", "group_size": 32}"#),
            "group_size"
        );
        assert_eq!(
            field_of(r#"{"strategy": "token", "group_size": 32}"#),
            "group_size"
        );
        assert_eq!(field_of(r#"{"strategy": "block"}"#), "block_structure");
        assert_eq!(
            field_of(r#"{"strategy": "block", "block_structure": [128, 0]}"#),
            "block_structure"
        );
        assert_eq!(
            field_of(r#"{"strategy": "channel", "actorder": "group"}"#),
            "actorder"
        );
        assert_eq!(
            field_of(r#"{"strategy": "token", "dynamic": "local"}"#),
            "dynamic"
        );
        assert!(matches!(
            args(r#"{"num_bits": 9}"#).validate(),
            Err(QuantError::UnsupportedNumBits { num_bits: 9, .. })
        ));
        assert!(matches!(
            args(r#"{"num_bits": 6, "type": "float"}"#).validate(),
            Err(QuantError::UnsupportedNumBits { num_bits: 6, .. })
        ));
        assert!(matches!(
            args(r#"{"scale_dtype": "torch.float7"}"#).validate(),
            Err(QuantError::UnknownDType { .. })
        ));
        args(r#"{"strategy": "channel", "group_size": -1, "scale_dtype": "torch.bfloat16"}"#)
            .validate()
            .unwrap();
    }

    #[test]
    fn w4a8_predicate_and_constructor_checks() {
        let w = args(W4_GROUP);
        let a = args(A8_TOKEN);
        assert!(is_dynamic_token_w4a8_int(&w, Some(&a)));
        assert!(!is_dynamic_token_w4a8_int(&w, None));
        check_w4a8_int_moe(&w, Some(&a)).unwrap();

        let w8 = QuantizationArgs {
            num_bits: 8,
            ..w.clone()
        };
        assert!(!is_dynamic_token_w4a8_int(&w8, Some(&a)));
        let err = check_w4a8_int_moe(&w8, Some(&a)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "This method only supports 4-bit weights (num_bits=4)."
        );

        let static_a = QuantizationArgs {
            dynamic: DynamicType::Static,
            ..a.clone()
        };
        assert!(!is_dynamic_token_w4a8_int(&w, Some(&static_a)));
        let err = check_w4a8_int_moe(&w, Some(&static_a)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "W4A8-int MoE needs dynamic per-token activation quantization."
        );
        assert_eq!(
            check_w4a8_int_moe(&w8, None),
            Err(QuantError::W4A8NeedsDynamicTokenActivations)
        );

        let asym_w = QuantizationArgs {
            symmetric: false,
            ..w.clone()
        };
        assert!(!is_dynamic_token_w4a8_int(&asym_w, Some(&a)));
        let tensor_w = QuantizationArgs {
            strategy: Some(QuantizationStrategy::Tensor),
            group_size: None,
            ..w.clone()
        };
        assert!(!is_dynamic_token_w4a8_int(&tensor_w, Some(&a)));
        let channel_w = QuantizationArgs {
            strategy: Some(QuantizationStrategy::Channel),
            group_size: None,
            ..w
        };
        assert!(is_dynamic_token_w4a8_int(&channel_w, Some(&a)));
    }

    #[test]
    fn rejects_malformed_json_with_typed_error() {
        assert!(matches!(
            QuantizationConfig::from_json_str("{"),
            Err(QuantError::ConfigParse { .. })
        ));
        assert!(matches!(
            QuantizationConfig::from_model_config_str(r#"{"hidden_size": 8}"#),
            Err(QuantError::ConfigParse { .. })
        ));
    }
}
