//! [`MoEActivation`]: the expert activation function names of vLLM's `MoEActivation`
//! (spec section 3), with the gated / non-gated distinction the support checks read.
//!
//! This is only the vocabulary; the formulas live with the kernels.

use std::fmt;
use std::str::FromStr;

use crate::error::OracleError;

/// An expert activation, named as vLLM's newest `MoEActivation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MoEActivation {
    /// `silu(g)·u`.
    Silu,
    /// `gelu_erf(g)·u`.
    Gelu,
    /// `gelu_tanh(g)·u` (alias `gelu_pytorch_tanh`).
    GeluTanh,
    /// `relu(g)²·u`.
    Relu2,
    /// SwiGLU-OAI on interleaved gate/up.
    Swigluoai,
    /// SITU (parameterised; no moe-rs kernel implements it).
    Situ,
    /// SwiGLU-OAI on concatenated gate/up halves.
    SwigluoaiUninterleave,
    /// `min(silu(g), 7)·clamp(u, −7, 7)`.
    Swiglustep,
    /// `silu(x)`, non-gated.
    SiluNoMul,
    /// `gelu_erf(x)`, non-gated.
    GeluNoMul,
    /// `gelu_tanh(x)`, non-gated.
    GeluTanhNoMul,
    /// `relu(x)²`, non-gated.
    Relu2NoMul,
}

impl MoEActivation {
    /// Every variant, in vLLM's declaration order.
    pub const ALL: [MoEActivation; 12] = [
        MoEActivation::Silu,
        MoEActivation::Gelu,
        MoEActivation::GeluTanh,
        MoEActivation::Relu2,
        MoEActivation::Swigluoai,
        MoEActivation::Situ,
        MoEActivation::SwigluoaiUninterleave,
        MoEActivation::Swiglustep,
        MoEActivation::SiluNoMul,
        MoEActivation::GeluNoMul,
        MoEActivation::GeluTanhNoMul,
        MoEActivation::Relu2NoMul,
    ];

    /// The string value (`"silu"`, `"gelu_tanh_no_mul"`, ...).
    pub fn value(self) -> &'static str {
        match self {
            MoEActivation::Silu => "silu",
            MoEActivation::Gelu => "gelu",
            MoEActivation::GeluTanh => "gelu_tanh",
            MoEActivation::Relu2 => "relu2",
            MoEActivation::Swigluoai => "swigluoai",
            MoEActivation::Situ => "situ",
            MoEActivation::SwigluoaiUninterleave => "swigluoai_uninterleave",
            MoEActivation::Swiglustep => "swiglustep",
            MoEActivation::SiluNoMul => "silu_no_mul",
            MoEActivation::GeluNoMul => "gelu_no_mul",
            MoEActivation::GeluTanhNoMul => "gelu_tanh_no_mul",
            MoEActivation::Relu2NoMul => "relu2_no_mul",
        }
    }

    /// The Python member name (`"SILU"`), used by [`Self::python_str`].
    pub fn member_name(self) -> &'static str {
        match self {
            MoEActivation::Silu => "SILU",
            MoEActivation::Gelu => "GELU",
            MoEActivation::GeluTanh => "GELU_TANH",
            MoEActivation::Relu2 => "RELU2",
            MoEActivation::Swigluoai => "SWIGLUOAI",
            MoEActivation::Situ => "SITU",
            MoEActivation::SwigluoaiUninterleave => "SWIGLUOAI_UNINTERLEAVE",
            MoEActivation::Swiglustep => "SWIGLUSTEP",
            MoEActivation::SiluNoMul => "SILU_NO_MUL",
            MoEActivation::GeluNoMul => "GELU_NO_MUL",
            MoEActivation::GeluTanhNoMul => "GELU_TANH_NO_MUL",
            MoEActivation::Relu2NoMul => "RELU2_NO_MUL",
        }
    }

    /// How vLLM's f-strings print the member (`"MoEActivation.SILU"`): `MoEActivation` is a
    /// plain `Enum` without `__str__`, so this is what appears in its refusal reasons.
    pub fn python_str(self) -> String {
        format!("MoEActivation.{}", self.member_name())
    }

    /// Gated ("act_and_mul") unless the name ends in `_no_mul`.
    pub fn is_gated(self) -> bool {
        !self.value().ends_with("_no_mul")
    }

    /// The non-gated variant where one exists, else `self`.
    pub fn without_mul(self) -> Self {
        match self {
            MoEActivation::Silu => MoEActivation::SiluNoMul,
            MoEActivation::Gelu => MoEActivation::GeluNoMul,
            MoEActivation::GeluTanh => MoEActivation::GeluTanhNoMul,
            MoEActivation::Relu2 => MoEActivation::Relu2NoMul,
            other => other,
        }
    }
}

impl fmt::Display for MoEActivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.value())
    }
}

impl FromStr for MoEActivation {
    type Err = OracleError;

    /// vLLM's `from_str`: exact values plus the alias `gelu_pytorch_tanh` → `gelu_tanh`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = if s == "gelu_pytorch_tanh" {
            "gelu_tanh"
        } else {
            s
        };
        MoEActivation::ALL
            .into_iter()
            .find(|a| a.value() == name)
            .ok_or_else(|| {
                let valid: Vec<String> = MoEActivation::ALL
                    .iter()
                    .map(|a| format!("'{}'", a.value()))
                    .collect();
                OracleError::InvalidConfig {
                    field: "activation",
                    reason: format!(
                        "Unknown MoE activation: '{s}'. Valid activations: [{}]",
                        valid.join(", ")
                    ),
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_alias_and_gating() {
        for a in MoEActivation::ALL {
            assert_eq!(a.value().parse::<MoEActivation>().unwrap(), a);
        }
        assert_eq!(
            "gelu_pytorch_tanh".parse::<MoEActivation>().unwrap(),
            MoEActivation::GeluTanh
        );
        assert!("swish".parse::<MoEActivation>().is_err());
        assert!(MoEActivation::Swigluoai.is_gated());
        assert!(!MoEActivation::Relu2NoMul.is_gated());
        assert_eq!(MoEActivation::Gelu.without_mul(), MoEActivation::GeluNoMul);
        assert_eq!(
            MoEActivation::Swiglustep.without_mul(),
            MoEActivation::Swiglustep
        );
        assert_eq!(
            MoEActivation::GeluTanh.python_str(),
            "MoEActivation.GELU_TANH"
        );
    }
}
