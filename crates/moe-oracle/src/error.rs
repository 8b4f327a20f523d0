//! Why selection failed: [`OracleError`] and the [`Refusal`] of each candidate it tried. The
//! reason one kernel refuses ([`Unsupported`]) lives in its own module, which the hooks use.
//!
//! Where the spec quotes vLLM (sections 7.6 and 7.7), the `Display` text is vLLM's, verbatim, so
//! that logs and user-facing errors read the same as upstream.

use std::fmt;

use thiserror::Error;

use crate::backend::{Backend, Family};
use crate::kernel_id::Kernel;
pub use crate::unsupported::Unsupported;

/// One candidate that selection tried and the reason it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The family backend the kernel belongs to.
    pub backend: Backend,
    /// The kernel that refused, or `None` when the backend has no kernel in this mode.
    pub kernel: Option<Kernel>,
    /// Why it refused.
    pub reason: Unsupported,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kernel {
            Some(k) => write!(f, "{} ({}): {}", self.backend.value(), k, self.reason),
            None => write!(f, "{}: {}", self.backend.value(), self.reason),
        }
    }
}

/// Why the oracle could not pick a kernel, or why its input was malformed.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum OracleError {
    /// The platform has no backend for the family at all (vLLM's `NotImplementedError`, e.g.
    /// `"W4A8 Int8 MoE is only supported on CPU platforms"`).
    #[error("{message}")]
    NoPlatformBackend {
        /// The quantization family asked about.
        family: Family,
        /// vLLM's message.
        message: &'static str,
    },
    /// A user-requested `moe_backend` string that the family does not know.
    #[error(
        "moe_backend='{requested}' is not supported for {family} MoE. Expected one of {}.",
        py_list(expected)
    )]
    UnknownBackendName {
        /// The quantization family asked about.
        family: Family,
        /// The string the user passed.
        requested: String,
        /// The strings the family accepts, in vLLM's order.
        expected: Vec<&'static str>,
    },
    /// The user-requested backend exists but refuses the configuration.
    #[error("{}", unsupported_message(*family, *backend, reason.as_ref()))]
    RequestedBackendUnsupported {
        /// The quantization family asked about.
        family: Family,
        /// The backend the user asked for.
        backend: Backend,
        /// The last kernel's refusal, if the backend had any kernel.
        reason: Option<Unsupported>,
        /// Every kernel of the backend with its refusal.
        refusals: Vec<Refusal>,
    },
    /// No backend in the priority list accepts the configuration. `refusals` lists every
    /// candidate with its reason, in the order they were tried.
    #[error("No {family} MoE backend supports the deployment configuration.")]
    NoBackendSupports {
        /// The quantization family asked about.
        family: Family,
        /// Every candidate kernel tried, with its refusal.
        refusals: Vec<Refusal>,
    },
    /// `make_w4a8_int8_moe_kernel` refuses modular experts.
    #[error("W4A8 Int8 MoE only supports monolithic experts, but got {kernel}")]
    NotMonolithic {
        /// Class or kernel name of the refused experts.
        kernel: String,
    },
    /// A configuration value that cannot describe a MoE layer (zero sizes, bad ranks, ...).
    #[error("invalid MoE configuration: {field}: {reason}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A platform description that contradicts itself (an ISA rung of another architecture).
    #[error("invalid platform: {reason}")]
    InvalidPlatform {
        /// What is wrong.
        reason: String,
    },
}

impl OracleError {
    /// The candidates tried and refused, for the two selection failures; empty otherwise.
    pub fn refusals(&self) -> &[Refusal] {
        match self {
            OracleError::RequestedBackendUnsupported { refusals, .. }
            | OracleError::NoBackendSupports { refusals, .. } => refusals,
            _ => &[],
        }
    }

    /// The message followed by one line per refused candidate, for logs and CLI output.
    pub fn detailed(&self) -> String {
        let mut out = self.to_string();
        for r in self.refusals() {
            out.push_str("\n  - ");
            out.push_str(&r.to_string());
        }
        out
    }
}

/// A Python list literal of strings, as vLLM prints `list(mapping.keys())`: `['cpu', 'triton']`.
pub(crate) fn py_list(items: &[&str]) -> String {
    let inner: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}]", inner.join(", "))
}

/// vLLM's `_make_log_unsupported` for each family. W4A8 Int8 and Int8 quote the backend only
/// when there is no reason; WNA16 always quotes it.
pub(crate) fn unsupported_message(
    family: Family,
    backend: Backend,
    reason: Option<&Unsupported>,
) -> String {
    let b = backend.value();
    let quoted = match family {
        Family::Wna16 => true,
        _ => reason.is_none(),
    };
    let name = if quoted {
        format!("'{b}'")
    } else {
        b.to_string()
    };
    match reason {
        Some(r) => format!(
            "{family} MoE backend {name} does not support the deployment configuration since {r}."
        ),
        None => {
            format!("{family} MoE backend {name} does not support the deployment configuration.")
        }
    }
}
