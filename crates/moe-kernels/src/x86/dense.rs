//! The x86 builds of the dense (float) GEMM body: the portable body of `crate::dense` inside
//! `#[target_feature]` wrappers, so the compiler vectorizes its 16-channel inner loop with
//! 256-bit (AVX2) or 512-bit (AVX-512) registers. The body keeps separate multiplies and adds
//! and never mixes lanes, so every build gives the same bits.

use std::ops::Range;

use half::bf16;

use crate::Isa;
use crate::dense::{DenseBodies, DenseJob, Widen, panels_body};

/// The AVX2 build.
///
/// # Safety
/// - As [`crate::dense::DensePanelsFn`], on a CPU with AVX2.
#[target_feature(enable = "avx2")]
unsafe fn panels_avx2<T: Widen>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    panels_body(job, panels);
}

/// The AVX-512 build.
///
/// # Safety
/// - As [`crate::dense::DensePanelsFn`], on a CPU with AVX-512 F.
#[target_feature(enable = "avx512f")]
unsafe fn panels_avx512<T: Widen>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    panels_body(job, panels);
}

/// The AVX2 builds, reported as the AVX2 rung's.
pub(crate) const AVX2: DenseBodies = DenseBodies {
    isa: Isa::Avx2,
    f32: panels_avx2::<f32>,
    bf16: panels_avx2::<bf16>,
};

/// The AVX-512 builds, reported as the AVX-512 VNNI rung's (they need AVX-512 F only).
pub(crate) const AVX512: DenseBodies = DenseBodies {
    isa: Isa::Avx512Vnni,
    f32: panels_avx512::<f32>,
    bf16: panels_avx512::<bf16>,
};
