//! Quantization families, their backends and the `moe_backend` strings that name them (spec
//! sections 5.2, 7.7; seed 002). The per-platform priority lists and the mapping of a user's
//! string live in the `priority` module, a layer above this one.
//!
//! A backend is vLLM's name for a way of running a family; each backend lists kernel
//! candidates ([`KernelId`]). In [`Strictness::VllmCompat`] the candidates are
//! vLLM's kernel classes with vLLM's exact checks; in [`Strictness::Native`] they are moe-rs
//! kernels, and backends that only have GPU kernels upstream have none.

use std::fmt;

use crate::kernel_id::KernelId;
use crate::unsupported::Unsupported;

/// Which acceptance rules the support checks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strictness {
    /// moe-rs kernels with their (broader) capabilities.
    Native,
    /// vLLM's kernel classes with vLLM's exact acceptance sets and messages, for parity tests.
    VllmCompat,
}

/// A quantization family: one oracle each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// int4 weights, int8 dynamic activations (`oracle/w4a8_int8.py`).
    W4A8Int8,
    /// int8 per-channel weights, int8 dynamic per-token activations (`oracle/int8.py`).
    Int8,
    /// int4/int8 weights with 16-bit activations (`oracle/int_wna16.py`).
    Wna16,
    /// Unquantized experts (moe-rs's own oracle).
    Unquantized,
}

impl fmt::Display for Family {
    /// The family as vLLM's messages spell it (`"W4A8 Int8"`, `"Int8"`, `"WNA16"`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::W4A8Int8 => "W4A8 Int8",
            Family::Int8 => "Int8",
            Family::Wna16 => "WNA16",
            Family::Unquantized => "Unquantized",
        })
    }
}

/// A family backend, named by its vLLM enum value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// `W4A8Int8MoeBackend.CPU_INT4`.
    W4A8CpuInt4,
    /// `Int8MoeBackend.TRITON`.
    Int8Triton,
    /// `Int8MoeBackend.HUMMING`.
    Int8Humming,
    /// `Int8MoeBackend.CPU`.
    Int8Cpu,
    /// `WNA16MoEBackend.MARLIN`.
    Wna16Marlin,
    /// `WNA16MoEBackend.BATCHED_MARLIN`.
    Wna16BatchedMarlin,
    /// Unquantized experts on the CPU.
    UnquantizedCpu,
}

impl Backend {
    /// The enum value vLLM prints (`"CPU_INT4"`, `"BATCHED_MARLIN"`).
    pub fn value(self) -> &'static str {
        match self {
            Backend::W4A8CpuInt4 => "CPU_INT4",
            Backend::Int8Triton => "TRITON",
            Backend::Int8Humming => "HUMMING",
            Backend::Int8Cpu | Backend::UnquantizedCpu => "CPU",
            Backend::Wna16Marlin => "MARLIN",
            Backend::Wna16BatchedMarlin => "BATCHED_MARLIN",
        }
    }

    /// The family the backend serves.
    pub fn family(self) -> Family {
        match self {
            Backend::W4A8CpuInt4 => Family::W4A8Int8,
            Backend::Int8Triton | Backend::Int8Humming | Backend::Int8Cpu => Family::Int8,
            Backend::Wna16Marlin | Backend::Wna16BatchedMarlin => Family::Wna16,
            Backend::UnquantizedCpu => Family::Unquantized,
        }
    }

    /// vLLM's `backend_to_kernel_cls` (compat) or the moe-rs kernels behind the backend
    /// (native), in the order they are tried.
    pub fn kernels(self, mode: Strictness) -> &'static [KernelId] {
        use KernelId as K;
        match (mode, self) {
            (Strictness::VllmCompat, Backend::W4A8CpuInt4) => &[K::VllmCpuExpertsInt4],
            (Strictness::VllmCompat, Backend::Int8Triton) => &[K::VllmTritonExperts],
            (Strictness::VllmCompat, Backend::Int8Humming) => &[
                K::VllmBatchedHummingGroupedExperts,
                K::VllmHummingGroupedExperts,
                K::VllmHummingIndexedExperts,
            ],
            (Strictness::VllmCompat, Backend::Int8Cpu) => {
                &[K::VllmCpuExpertsInt8, K::VllmArmCpuExpertsInt8]
            }
            (Strictness::VllmCompat, Backend::Wna16Marlin) => &[K::VllmMarlinExperts],
            (Strictness::VllmCompat, Backend::Wna16BatchedMarlin) => &[K::VllmBatchedMarlinExperts],
            (Strictness::Native, Backend::W4A8CpuInt4) => &[K::CpuInt4W4A8],
            (Strictness::Native, Backend::Int8Cpu) => &[K::CpuInt8W8A8],
            (Strictness::Native, Backend::Wna16Marlin) => &[K::CpuWna16, K::CpuMarlin],
            (Strictness::Native, Backend::Int8Triton)
            | (Strictness::Native, Backend::Int8Humming)
            | (Strictness::Native, Backend::Wna16BatchedMarlin) => &[],
            (_, Backend::UnquantizedCpu) => &[K::CpuUnquantized],
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.value())
    }
}

/// The refusal of a backend that has no kernel in native mode.
pub(crate) fn no_native_kernel() -> Unsupported {
    Unsupported::new("no moe-rs kernel implements it (upstream it runs on GPUs only)")
}

/// The `moe_backend` strings a family accepts, in vLLM's order, with their backends. vLLM's
/// int8 mapping lacks `"cpu"` (a quirk, spec 5.2); native mode adds it. vLLM's WNA16 oracle
/// ignores `moe_backend` entirely, so its compat list is empty.
pub fn backend_names(family: Family, mode: Strictness) -> Vec<(&'static str, Backend)> {
    match (family, mode) {
        (Family::W4A8Int8, _) => vec![("cpu", Backend::W4A8CpuInt4)],
        (Family::Int8, Strictness::VllmCompat) => vec![
            ("triton", Backend::Int8Triton),
            ("humming", Backend::Int8Humming),
        ],
        (Family::Int8, Strictness::Native) => vec![
            ("triton", Backend::Int8Triton),
            ("humming", Backend::Int8Humming),
            ("cpu", Backend::Int8Cpu),
        ],
        (Family::Wna16, Strictness::VllmCompat) => vec![],
        (Family::Wna16, Strictness::Native) => vec![
            ("marlin", Backend::Wna16Marlin),
            ("batched_marlin", Backend::Wna16BatchedMarlin),
            ("cpu", Backend::Wna16Marlin),
        ],
        (Family::Unquantized, _) => vec![("cpu", Backend::UnquantizedCpu)],
    }
}
