//! [`Platform`]: what the oracle knows about the machine, passed in by the caller.
//!
//! moe-oracle never detects CPU features itself (only moe-kernels does): [`Platform::detect`]
//! asks moe-kernels which rungs this CPU runs (honouring `MOE_KERNELS_MAX_ISA`), and tests build
//! a `Platform` from a literal, so the oracle stays a pure function of its inputs. The GPU field exists only because vLLM's Marlin
//! and Triton checks ask for the "current device"; moe-rs never has one.

pub use moe_kernels::Isa;
use moe_kernels::IsaArch;

use crate::error::OracleError;

/// CPU architecture family, as vLLM's `CpuArchEnum` distinguishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuArch {
    /// x86-64.
    X86_64,
    /// AArch64 (vLLM's `ARM`).
    Aarch64,
    /// Anything else (only the scalar rung).
    Other,
}

/// A CUDA device, only for reproducing vLLM's GPU-kernel device checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// `current_platform.device_name`, e.g. `"cuda"`.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub capability: (u32, u32),
}

/// The machine as the oracle sees it: CPU architecture, the kernel ISA rungs available, and
/// whether the current device is a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    arch: CpuArch,
    isas: Vec<Isa>,
    gpu: Option<Gpu>,
}

impl Platform {
    /// A CPU platform with the given rungs (scalar is always added). Rejects a rung that
    /// belongs to another architecture.
    pub fn cpu(arch: CpuArch, isas: &[Isa]) -> Result<Self, OracleError> {
        let mut list = vec![Isa::Scalar];
        for &isa in isas {
            let foreign = match isa.arch() {
                IsaArch::Portable => false,
                IsaArch::X86_64 => arch != CpuArch::X86_64,
                IsaArch::Aarch64 => arch != CpuArch::Aarch64,
                // An architecture this crate does not know is foreign to every CpuArch.
                _ => true,
            };
            if foreign {
                return Err(OracleError::InvalidPlatform {
                    reason: format!("ISA rung {isa} does not exist on {arch:?}"),
                });
            }
            if !list.contains(&isa) {
                list.push(isa);
            }
        }
        list.sort_by_key(|isa| isa.rank());
        Ok(Self {
            arch,
            isas: list,
            gpu: None,
        })
    }

    /// A CPU platform from rung names (`["avx2", "avx512-vnni"]`), as moe-kernels reports them.
    pub fn cpu_from_names(arch: CpuArch, names: &[&str]) -> Result<Self, OracleError> {
        let isas = names
            .iter()
            .map(|n| {
                n.parse::<Isa>().map_err(|_| OracleError::InvalidPlatform {
                    reason: format!("unknown ISA rung '{n}'"),
                })
            })
            .collect::<Result<Vec<Isa>, _>>()?;
        Self::cpu(arch, &isas)
    }

    /// This machine: its architecture and the rungs moe-kernels can run here, within the
    /// `MOE_KERNELS_MAX_ISA` cap.
    pub fn detect() -> Self {
        let arch = if cfg!(target_arch = "x86_64") {
            CpuArch::X86_64
        } else if cfg!(target_arch = "aarch64") {
            CpuArch::Aarch64
        } else {
            CpuArch::Other
        };
        let cap = moe_kernels::isa_cap();
        let isas: Vec<Isa> = moe_kernels::available_isas()
            .into_iter()
            .filter(|&isa| cap.allows(isa))
            .collect();
        Self::cpu(arch, &isas).expect("moe-kernels reports only rungs of this architecture")
    }

    /// The same machine with a GPU as the current device (tests of vLLM's GPU-only kernels).
    pub fn with_gpu(mut self, gpu: Gpu) -> Self {
        self.gpu = Some(gpu);
        self
    }

    /// CPU architecture.
    pub fn arch(&self) -> CpuArch {
        self.arch
    }

    /// Available rungs, scalar included, in ladder order.
    pub fn isas(&self) -> &[Isa] {
        &self.isas
    }

    /// The GPU, if the current device is one.
    pub fn gpu(&self) -> Option<&Gpu> {
        self.gpu.as_ref()
    }

    /// vLLM's `current_platform.is_cpu()`.
    pub fn is_cpu(&self) -> bool {
        self.gpu.is_none()
    }

    /// vLLM's `current_platform.device_name`: `"cpu"` or the GPU's name.
    pub fn device_name(&self) -> &str {
        match &self.gpu {
            Some(g) => &g.name,
            None => "cpu",
        }
    }

    /// The fastest available rung, which our integer kernels will run on.
    pub fn best_isa(&self) -> Isa {
        self.isas
            .iter()
            .copied()
            .max_by_key(|isa| isa.rank())
            .unwrap_or(Isa::Scalar)
    }

    /// Whether a rung is available.
    pub fn has(&self, isa: Isa) -> bool {
        self.isas.contains(&isa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_rung_and_validation() {
        let p = Platform::cpu(CpuArch::X86_64, &[Isa::Avx2, Isa::Avx512Vnni]).unwrap();
        assert_eq!(p.best_isa(), Isa::Avx512Vnni);
        assert!(p.has(Isa::Scalar));
        let p = Platform::cpu_from_names(CpuArch::Aarch64, &["neon", "dotprod", "i8mm"]).unwrap();
        assert_eq!(p.best_isa(), Isa::NeonI8mm);
        assert_eq!(
            Platform::cpu(CpuArch::Other, &[]).unwrap().best_isa(),
            Isa::Scalar
        );
        assert!(Platform::cpu(CpuArch::X86_64, &[Isa::Neon]).is_err());
        assert!(Platform::cpu_from_names(CpuArch::X86_64, &["sse9"]).is_err());
    }

    #[test]
    fn detect_names_this_architecture() {
        let p = Platform::detect();
        assert!(p.has(Isa::Scalar));
        assert!(p.is_cpu());
        assert!(moe_kernels::available_isas().contains(&p.best_isa()));
    }
}
