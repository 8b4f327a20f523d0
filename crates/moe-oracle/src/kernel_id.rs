//! The names of the kernel candidates ([`KernelId`]) and of a chosen kernel on its rung
//! ([`Kernel`]): plain data that errors and backends can name without the support hooks,
//! which the `kernels` module adds to these types a layer above.

use std::fmt;

use moe_kernels::Isa;

/// A kernel candidate: one of vLLM's expert classes or one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelId {
    /// vLLM `CPUExpertsInt4` (KleidiAI, AArch64 only).
    VllmCpuExpertsInt4,
    /// vLLM `CPUExpertsInt8` (x86 AMX, SGLang kernel).
    VllmCpuExpertsInt8,
    /// vLLM `ArmCPUExpertsInt8` (NEON `smmla`).
    VllmArmCpuExpertsInt8,
    /// vLLM `TritonExperts` (GPU; modelled by its device check only).
    VllmTritonExperts,
    /// vLLM `BatchedHummingGroupedExperts` (GPU; device and format checks only).
    VllmBatchedHummingGroupedExperts,
    /// vLLM `HummingGroupedExperts` (GPU; device check only).
    VllmHummingGroupedExperts,
    /// vLLM `HummingIndexedExperts` (GPU; device check only).
    VllmHummingIndexedExperts,
    /// vLLM `MarlinExperts` (CUDA ≥ 7.5).
    VllmMarlinExperts,
    /// vLLM `BatchedMarlinExperts` (CUDA ≥ 7.5, batched format).
    VllmBatchedMarlinExperts,
    /// moe-rs int4×int8 W4A8 kernel.
    CpuInt4W4A8,
    /// moe-rs int8×int8 W8A8 kernel.
    CpuInt8W8A8,
    /// moe-rs CPU executor for Marlin-packed WNA16 weights.
    CpuMarlin,
    /// moe-rs native WNA16 kernel: int4/int8 weights in our panels, f32 compute.
    CpuWna16,
    /// moe-rs unquantized experts.
    CpuUnquantized,
}

/// A chosen kernel: which one, and for ours, the ISA rung it will run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The kernel.
    pub id: KernelId,
    /// The best available rung, for moe-rs kernels with SIMD rungs; `None` for vLLM's classes
    /// and for our portable code (`cpu-marlin`), which runs the same on every rung.
    pub isa: Option<Isa>,
}

impl Kernel {
    /// `"cpu-int4-w4a8/avx512-vnni"` for ours, the class name for vLLM's.
    pub fn name(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.isa {
            Some(isa) => write!(f, "{}/{}", self.id.name(), isa),
            None => f.write_str(self.id.name()),
        }
    }
}

impl KernelId {
    /// Class name (vLLM) or kernel name (ours).
    pub fn name(self) -> &'static str {
        match self {
            KernelId::VllmCpuExpertsInt4 => "CPUExpertsInt4",
            KernelId::VllmCpuExpertsInt8 => "CPUExpertsInt8",
            KernelId::VllmArmCpuExpertsInt8 => "ArmCPUExpertsInt8",
            KernelId::VllmTritonExperts => "TritonExperts",
            KernelId::VllmBatchedHummingGroupedExperts => "BatchedHummingGroupedExperts",
            KernelId::VllmHummingGroupedExperts => "HummingGroupedExperts",
            KernelId::VllmHummingIndexedExperts => "HummingIndexedExperts",
            KernelId::VllmMarlinExperts => "MarlinExperts",
            KernelId::VllmBatchedMarlinExperts => "BatchedMarlinExperts",
            KernelId::CpuInt4W4A8 => "cpu-int4-w4a8",
            KernelId::CpuInt8W8A8 => "cpu-int8-w8a8",
            KernelId::CpuMarlin => "cpu-marlin",
            KernelId::CpuWna16 => "cpu-wna16",
            KernelId::CpuUnquantized => "cpu-unquantized",
        }
    }

    /// Whether this is a moe-rs kernel (runnable here) rather than a vLLM class.
    pub fn is_ours(self) -> bool {
        matches!(
            self,
            KernelId::CpuInt4W4A8
                | KernelId::CpuInt8W8A8
                | KernelId::CpuMarlin
                | KernelId::CpuWna16
                | KernelId::CpuUnquantized
        )
    }

    /// Whether the kernel is ours with code per ISA rung (all ours but the portable CPU
    /// Marlin executor).
    pub fn has_rungs(self) -> bool {
        self.is_ours() && self != KernelId::CpuMarlin
    }
}
