//! [`Unsupported`]: the reason one kernel refuses one configuration, the answer of every
//! support hook. Depends on nothing else in the crate, so every module may use it.

use std::fmt;

/// Why one kernel cannot serve a configuration. `reason` is the text vLLM's
/// `is_supported_config` returns (for example `kernel does not support routing method 3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// Human-readable reason, verbatim vLLM text where vLLM has one.
    pub reason: String,
}

impl Unsupported {
    /// A refusal with an arbitrary reason.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// vLLM's `_make_reason`: `"kernel does not support {what}"`.
    pub fn kernel_does_not_support(what: impl fmt::Display) -> Self {
        Self::new(format!("kernel does not support {what}"))
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unsupported {}
