//! [`Platform`]: what the oracle knows about the machine, passed in by the caller.
//!
//! moe-oracle never detects CPU features itself (only moe-kernels does). The caller builds a
//! `Platform` from the ISA rungs moe-kernels reports (and, in tests, from a literal), so the
//! oracle stays a pure function of its inputs. The GPU field exists only because vLLM's Marlin
//! and Triton checks ask for the "current device"; moe-rs never has one.

use std::fmt;
use std::str::FromStr;

use crate::error::OracleError;

/// CPU architecture family, as vLLM's `CpuArchEnum` distinguishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CpuArch {
    /// x86-64.
    X86_64,
    /// AArch64 (vLLM's `ARM`).
    Aarch64,
    /// Anything else (only the scalar rung).
    Other,
}

/// One rung of the kernel ISA ladder, named as the project's env vars and reports name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable scalar code, always available.
    Scalar,
    /// x86 AVX2.
    Avx2,
    /// x86 AVX-VNNI (256-bit VNNI).
    AvxVnni,
    /// x86 AVX-512 VNNI.
    Avx512Vnni,
    /// x86 AMX-INT8 tiles.
    Amx,
    /// AArch64 baseline NEON.
    Neon,
    /// AArch64 `sdot`.
    Dotprod,
    /// AArch64 `smmla`.
    I8mm,
}

impl Isa {
    /// Every rung, lowest first within each architecture.
    pub const ALL: [Isa; 8] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512Vnni,
        Isa::Amx,
        Isa::Neon,
        Isa::Dotprod,
        Isa::I8mm,
    ];

    /// The fixed name (`"avx512-vnni"`, `"i8mm"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
            Isa::Dotprod => "dotprod",
            Isa::I8mm => "i8mm",
        }
    }

    /// The architecture the rung belongs to; `None` for scalar, which runs everywhere.
    pub fn arch(self) -> Option<CpuArch> {
        match self {
            Isa::Scalar => None,
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni | Isa::Amx => Some(CpuArch::X86_64),
            Isa::Neon | Isa::Dotprod | Isa::I8mm => Some(CpuArch::Aarch64),
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Isa {
    type Err = OracleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name() == s)
            .ok_or_else(|| OracleError::InvalidPlatform {
                reason: format!("unknown ISA rung '{s}'"),
            })
    }
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
            if let Some(a) = isa.arch()
                && a != arch
            {
                return Err(OracleError::InvalidPlatform {
                    reason: format!("ISA rung {isa} does not exist on {arch:?}"),
                });
            }
            if !list.contains(&isa) {
                list.push(isa);
            }
        }
        list.sort();
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
            .map(|n| n.parse())
            .collect::<Result<Vec<Isa>, _>>()?;
        Self::cpu(arch, &isas)
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
        self.isas.iter().copied().max().unwrap_or(Isa::Scalar)
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
        assert_eq!(p.best_isa(), Isa::I8mm);
        assert_eq!(
            Platform::cpu(CpuArch::Other, &[]).unwrap().best_isa(),
            Isa::Scalar
        );
        assert!(Platform::cpu(CpuArch::X86_64, &[Isa::Neon]).is_err());
        assert!(Platform::cpu_from_names(CpuArch::X86_64, &["sse9"]).is_err());
    }
}
