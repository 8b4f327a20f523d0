//! Placeholder: the AVX2 kernels arrive in the next commit; until then the rung runs scalar.

use super::Avx2;

/// The kernels of the AVX2 rung.
pub(crate) fn kernel_set(_token: Avx2) -> crate::KernelSet {
    crate::KernelSet::scalar().for_rung(crate::Isa::Avx2)
}
