//! aarch64 CPU detection and the ISA tokens that prove it, plus one module per aarch64 rung.
//!
//! The rungs are NEON (`neon.rs`, widening multiplies), dot product (`dotprod.rs`, `sdot`) and
//! int8 matrix multiply (`i8mm.rs`, `smmla`); all three run the NEON WNA16 body (`wna16.rs`),
//! and the dot-product and i8mm rungs take int4 integer codes on the integer body with 15-bit
//! activations (`wna16_i15.rs`, `sdot`). They share their loads and epilogues
//! (`common.rs`); `sdot` and `smmla` are emitted only by `asm.rs` until their intrinsics are
//! stable. Every rung takes the activations as signed codes; W4A8 multiplies them by the weight
//! codes `w + 8` as they come out of the nibbles (`ActEncoding::I8BlockCorrected`, the `+ 8` taken
//! off per block), and every rung reproduces the scalar reference bit for bit.

mod asm;
mod common;
pub(crate) mod dotprod;
pub(crate) mod i8mm;
pub(crate) mod neon;
mod wna16;
pub(crate) mod wna16_i15;

use crate::Isa;

/// Proof that Advanced SIMD (NEON) can be used; always true on aarch64 Linux.
#[derive(Debug, Clone, Copy)]
pub struct Neon(());

/// Proof that the dot-product extension (`sdot`/`udot`) can be used.
#[derive(Debug, Clone, Copy)]
pub struct NeonDot(());

/// Proof that the int8 matrix-multiply extension (`smmla`) can be used.
#[derive(Debug, Clone, Copy)]
pub struct NeonI8mm(());

impl Neon {
    /// The token, when the CPU has NEON.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support NEON.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has NEON.
    pub fn is_available() -> bool {
        std::arch::is_aarch64_feature_detected!("neon")
    }
}

impl NeonDot {
    /// The token, when the CPU has NEON and the dot-product extension.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support NEON and the dot-product extension.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has NEON and the dot-product extension.
    pub fn is_available() -> bool {
        Neon::is_available() && std::arch::is_aarch64_feature_detected!("dotprod")
    }
}

impl NeonI8mm {
    /// The token, when the CPU has NEON, dot product and int8 matrix multiply.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support NEON, dot product and the int8 matrix
    ///   multiply extension.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has NEON, dot product and int8 matrix multiply.
    pub fn is_available() -> bool {
        NeonDot::is_available() && std::arch::is_aarch64_feature_detected!("i8mm")
    }
}

/// What the OS reports about the aarch64 features the ladder cares about.
#[derive(Debug, Clone, Copy, Default)]
pub struct Aarch64Features {
    /// Advanced SIMD.
    pub neon: bool,
    /// Dot product (`sdot`).
    pub dotprod: bool,
    /// Int8 matrix multiply (`smmla`).
    pub i8mm: bool,
    /// Scalable vectors (reported only; no SVE kernels).
    pub sve: bool,
}

/// Reads the feature flags (no side effects).
pub fn detect() -> Aarch64Features {
    Aarch64Features {
        neon: std::arch::is_aarch64_feature_detected!("neon"),
        dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
        i8mm: std::arch::is_aarch64_feature_detected!("i8mm"),
        sve: std::arch::is_aarch64_feature_detected!("sve"),
    }
}

/// The kernel set of rung `isa` if this CPU supports it, built from the rung's token, with the
/// NEON WNA16 body that all three rungs share.
pub(crate) fn kernel_set(isa: Isa) -> Option<crate::KernelSet> {
    let set = match isa {
        Isa::Neon => Neon::try_new().map(neon::kernel_set),
        Isa::NeonDot => NeonDot::try_new().map(dotprod::kernel_set),
        Isa::NeonI8mm => NeonI8mm::try_new().map(i8mm::kernel_set),
        _ => None,
    }?;
    // SAFETY: every aarch64 rung implies NEON, all the WNA16 body needs.
    let set = unsafe { set.with_wna16(Isa::Neon, wna16::wna16_entry) };
    if isa == Isa::Neon || crate::wna16_i15::integer_wna16_setting() == Some(false) {
        return Some(set);
    }
    // SAFETY: the dot-product and int8 matrix-multiply rungs' tokens (made above) prove the
    // dot-product extension, all the integer body needs.
    Some(unsafe { set.with_wna16_int4_dot(wna16_i15::body()) })
}

/// What quantises activations where a rung registers no quantiser of its own (every aarch64
/// rung): the portable loops of `moe_quant::act`, which LLVM vectorises for NEON, the aarch64
/// baseline (the range with `fminnm`/`fmaxnm`, the codes 16 per iteration with `frinta`,
/// `fcvtzs` and saturating narrows), so the report does not call them scalar.
pub(crate) const PORTABLE_ACT_QUANT: &str = "portable (vectorised for NEON by the compiler)";

/// The detected features as `(name, detected)` pairs.
pub(crate) fn feature_report() -> Vec<(&'static str, bool)> {
    let f = detect();
    vec![
        ("neon", f.neon),
        ("dotprod", f.dotprod),
        ("i8mm", f.i8mm),
        ("sve", f.sve),
    ]
}

/// Kernel sets that only tests use (none here).
#[cfg(test)]
pub(crate) fn test_only_kernel_sets() -> Vec<(&'static str, crate::KernelSet)> {
    Vec::new()
}
