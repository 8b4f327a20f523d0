//! The kernel deny-list: moe-rs's equivalent of vLLM's `VLLM_DISABLED_KERNELS`.
//!
//! `MOE_DISABLED_KERNELS` holds comma-separated kernel names. A name matches a vLLM class
//! name (`CPUExpertsInt4`), one of our kernel names (`cpu-int4-w4a8`, every rung), or one of
//! our kernels on one rung (`cpu-int4-w4a8/avx2`). The environment is read only by
//! [`DisabledKernels::from_env`]; selection takes the list as a value so tests never depend on
//! the environment.

use crate::kernels::Kernel;

/// The environment variable read by [`DisabledKernels::from_env`].
pub const ENV_VAR: &str = "MOE_DISABLED_KERNELS";

/// A set of disabled kernel names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DisabledKernels {
    names: Vec<String>,
}

impl DisabledKernels {
    /// Nothing disabled.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses a comma-separated list; blanks and empty entries are ignored.
    pub fn parse(list: &str) -> Self {
        Self {
            names: list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// Reads `MOE_DISABLED_KERNELS` (unset or non-UTF-8 means nothing disabled).
    pub fn from_env() -> Self {
        std::env::var(ENV_VAR)
            .map(|v| Self::parse(&v))
            .unwrap_or_default()
    }

    /// Whether a kernel, as it would run, is disabled.
    pub fn is_disabled(&self, kernel: &Kernel) -> bool {
        let full = kernel.to_string();
        self.names
            .iter()
            .any(|n| n == kernel.id.name() || *n == full)
    }

    /// The names in the list.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KernelId;
    use crate::platform::Isa;

    #[test]
    fn matching() {
        let d = DisabledKernels::parse(" CPUExpertsInt4, ,cpu-int8-w8a8/avx2 ");
        assert_eq!(d.names().len(), 2);
        let k = |id, isa| Kernel { id, isa };
        assert!(d.is_disabled(&k(KernelId::VllmCpuExpertsInt4, None)));
        assert!(d.is_disabled(&k(KernelId::CpuInt8W8A8, Some(Isa::Avx2))));
        assert!(!d.is_disabled(&k(KernelId::CpuInt8W8A8, Some(Isa::Amx))));
        assert!(!DisabledKernels::none().is_disabled(&k(KernelId::CpuMarlin, Some(Isa::Neon))));
    }
}
