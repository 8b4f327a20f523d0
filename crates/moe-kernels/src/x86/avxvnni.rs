//! Placeholder: the AVX-VNNI kernels arrive in the next commit; until then the rung runs scalar.

use super::AvxVnni;

/// The kernels of the AVX-VNNI rung.
pub(crate) fn kernel_set(_token: AvxVnni) -> crate::KernelSet {
    crate::KernelSet::scalar().for_rung(crate::Isa::AvxVnni)
}
