//! The AMX rung. No tile kernels yet: AMX could not be exercised on the development machine (its
//! CPUID reports neither AMX-TILE nor AMX-INT8), so the rung runs the AVX-512 VNNI kernels, and
//! its `KernelSet` says so. The detection and the permission request live in `x86/mod.rs`.

use super::Amx;

/// The kernels of the AMX rung: AVX-512 VNNI for every op until tile kernels exist.
pub(crate) fn kernel_set(token: Amx) -> crate::KernelSet {
    super::avx512vnni_kernel_set(token.avx512vnni()).for_rung(crate::Isa::Amx)
}
