//! Architectures without SIMD kernels: only the scalar rung exists.

use crate::dispatch::KernelSet;
use crate::isa::Isa;

/// No rung but scalar exists here.
pub(crate) fn kernel_set(_isa: Isa) -> Option<KernelSet> {
    None
}

/// The portable activation quantisers.
pub(crate) const PORTABLE_ACT_QUANT: &str = "scalar";

/// Nothing to report.
pub(crate) fn feature_report() -> Vec<(&'static str, bool)> {
    Vec::new()
}

/// Kernel sets that only tests use (none here).
#[cfg(test)]
pub(crate) fn test_only_kernel_sets() -> Vec<(&'static str, crate::KernelSet)> {
    Vec::new()
}
