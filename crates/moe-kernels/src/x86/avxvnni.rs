//! The AVX-VNNI rung: the shared 256-bit bodies (`ymm.rs`) with VEX-encoded `vpdpbusd`.
//!
//! Both GEMMs take the activations as `u8 = q + 128`; W8A8 subtracts `128·Σw` per channel.
//! Some AVX-512 machines lack AVX-VNNI, so the tests also run the identical bodies with the
//! EVEX-encoded AVX-512 VL form of the instruction (same semantics), see `evex_twin`.

use super::AvxVnni;

super::ymm::ymm_kernels!("avx2,avxvnni", AvxVnni, crate::Isa::AvxVnni);
super::ymm::ymm_w4a8_offset_tile!("avx2,avxvnni");

crate::ukernel::impl_microkernels! {
    token: AvxVnni,
    features: "avx2,avxvnni",
    mr: MR,
    rows: [1 2 3 4],
    w4a8_tile: w4a8_tile,
    w8a8_tile: w8a8_tile,
}

/// W8A8 activations are `q + 128`: compensate with `128·Σw`.
const W8_OFFSET: i32 = 128;

/// `acc` plus the per-lane sums of two 4-byte `u8 × s8` groups.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn w4_dot(acc: __m256i, a_lo: __m256i, w_lo: __m256i, a_hi: __m256i, w_hi: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, a_lo, w_lo), a_hi, w_hi)
}

/// `acc` plus the per-lane `Σ (q + 128)·w` of one 4-byte group.
#[target_feature(enable = "avx2,avxvnni")]
#[inline]
fn w8_dot(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, a, w)
}

crate::ukernel::rung_kernel_set! {
    doc: "The kernels of the AVX-VNNI rung.",
    token: AvxVnni,
    isa: crate::Isa::AvxVnni,
    w4a8: U8Offset128,
    w8a8: U8Offset128,
}

/// The same bodies with the EVEX `vpdpbusd ymm` (AVX-512 VNNI + VL), so the AVX-VNNI code path
/// is tested on machines that have AVX-512 but not AVX-VNNI.
#[cfg(test)]
pub(crate) mod evex_twin {
    /// Test-only token: AVX-512 VNNI and VL (checked by `kernel_set`).
    #[derive(Clone, Copy)]
    pub(crate) struct EvexYmm(());

    impl EvexYmm {
        /// # Safety
        /// - The CPU supports AVX2, AVX-512 VL and AVX-512 VNNI.
        unsafe fn new_unchecked() -> Self {
            Self(())
        }
    }

    super::super::ymm::ymm_kernels!("avx2,avx512vl,avx512vnni", EvexYmm, crate::Isa::AvxVnni);
    super::super::ymm::ymm_w4a8_offset_tile!("avx2,avx512vl,avx512vnni");

    crate::ukernel::impl_microkernels! {
        token: EvexYmm,
        features: "avx2,avx512vl,avx512vnni",
        mr: MR,
        rows: [1 2 3 4],
        w4a8_tile: w4a8_tile,
        w8a8_tile: w8a8_tile,
    }

    const W8_OFFSET: i32 = 128;

    #[target_feature(enable = "avx2,avx512vl,avx512vnni")]
    #[inline]
    fn w4_dot(acc: __m256i, a_lo: __m256i, w_lo: __m256i, a_hi: __m256i, w_hi: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, a_lo, w_lo), a_hi, w_hi)
    }

    #[target_feature(enable = "avx2,avx512vl,avx512vnni")]
    #[inline]
    fn w8_dot(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, w)
    }

    /// The twin's kernel set, when the CPU has AVX-512 VNNI (which implies VL here).
    pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
        use crate::ukernel::ActEncoding::U8Offset128;
        super::super::Avx512Vnni::try_new()?;
        // SAFETY: AVX-512 F/BW/VL/VNNI were just detected.
        Some(unsafe {
            crate::KernelSet::from_entries(
                crate::Isa::AvxVnni,
                (crate::Isa::AvxVnni, U8Offset128, w4a8_entry),
                (crate::Isa::AvxVnni, U8Offset128, w8a8_entry),
            )
        })
    }
}
