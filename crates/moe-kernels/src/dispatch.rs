//! The dispatcher: detects the CPU once, applies the `MOE_KERNELS_MAX_ISA` cap, and keeps the
//! chosen [`KernelSet`] of function pointers in a `static OnceLock`.
//!
//! A `KernelSet` names the rung it was selected for **and**, per operation, the rung whose code
//! actually runs. The two differ where a rung has no kernel of its own yet (the AMX rung uses
//! AVX-512 VNNI below its M threshold), so reports and the `MOE_EXPECT_ISA` guard never claim
//! more than what runs. Each architecture module registers its rungs' kernels
//! (`x86::kernel_set`, `aarch64::kernel_set`, each built from the rung's token).

use std::fmt;
use std::sync::OnceLock;

use crate::arch;
use crate::isa::{Isa, IsaCap, MAX_ISA_ENV};
use crate::ukernel::{ActEncoding, W4A8PanelsFn, W8A8PanelsFn};
use crate::wna16::Wna16PanelsFn;

/// One W4A8 implementation: its rung, activation encoding and entry point.
#[derive(Clone, Copy)]
pub(crate) struct W4A8Kernel {
    pub(crate) isa: Isa,
    pub(crate) encoding: ActEncoding,
    pub(crate) entry: W4A8PanelsFn,
}

/// One W8A8 implementation: its rung, activation encoding and entry point.
#[derive(Clone, Copy)]
pub(crate) struct W8A8Kernel {
    pub(crate) isa: Isa,
    pub(crate) encoding: ActEncoding,
    pub(crate) entry: W8A8PanelsFn,
}

/// The kernels of one rung, ready to call; cheap to copy.
///
/// Built only from a proof of availability (a token), so holding one means its function
/// pointers are safe to call on this CPU.
#[derive(Clone, Copy)]
pub struct KernelSet {
    rung: Isa,
    w4a8: W4A8Kernel,
    w8a8: W8A8Kernel,
    /// A SIMD W4A8 activation quantiser writing the `q + 128` encoding, equal to the scalar one.
    act_asym_u8: Option<(Isa, AsymQuantU8Fn)>,
    /// A SIMD W8A8 (symmetric) activation quantiser, equal to the scalar one.
    act_sym_i8: Option<(Isa, SymQuantI8Fn)>,
    /// Kernels that take over from some row count on (the AMX tiles).
    large_m: Option<LargeM>,
    /// The WNA16 (weight-only int4, f32 compute) body and the rung whose code it is.
    wna16: (Isa, Wna16PanelsFn),
}

/// Kernels that replace a set's own from `min_m` rows on: tile kernels only pay off once a
/// call has enough rows to fill their tiles.
#[derive(Clone, Copy)]
struct LargeM {
    min_m: usize,
    w4a8: W4A8Kernel,
    w8a8: W8A8Kernel,
}

/// Quantises one row like `moe_quant::act::quantize_row_asym_i8`, writing `q + 128`.
///
/// # Safety (for callers)
/// - The CPU supports the quantiser's rung; `dst.len() ≥ x.len()`.
pub(crate) type AsymQuantU8Fn = unsafe fn(&[f32], &mut [u8]) -> moe_quant::act::AsymRowQuant;

/// Quantises one row like `moe_quant::act::quantize_row_sym_i8`, returning the row scale.
///
/// # Safety (for callers)
/// - The CPU supports the quantiser's rung; `q.len() ≥ x.len()`.
pub(crate) type SymQuantI8Fn = unsafe fn(&[f32], &mut [i8]) -> f32;

impl KernelSet {
    /// Assembles a set from `(rung, activation encoding, entry point)` per op.
    ///
    /// # Safety
    /// - Every entry may be called on this CPU: the caller holds the token of each entry's rung.
    pub(crate) unsafe fn from_entries(
        rung: Isa,
        w4a8: (Isa, ActEncoding, W4A8PanelsFn),
        w8a8: (Isa, ActEncoding, W8A8PanelsFn),
    ) -> Self {
        let (isa, encoding, entry) = w4a8;
        let w4a8 = W4A8Kernel {
            isa,
            encoding,
            entry,
        };
        let (isa, encoding, entry) = w8a8;
        let w8a8 = W8A8Kernel {
            isa,
            encoding,
            entry,
        };
        Self {
            rung,
            w4a8,
            w8a8,
            act_asym_u8: None,
            act_sym_i8: None,
            large_m: None,
            wna16: (Isa::Scalar, crate::wna16::panels_portable),
        }
    }

    /// The same set, with `w4a8`/`w8a8` running every call of at least `min_m` rows.
    ///
    /// # Safety
    /// - Both entries may be called on this CPU: the caller holds the token of their rungs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung has them
    pub(crate) unsafe fn with_large_m(
        mut self,
        min_m: usize,
        w4a8: (Isa, ActEncoding, W4A8PanelsFn),
        w8a8: (Isa, ActEncoding, W8A8PanelsFn),
    ) -> Self {
        let (isa, encoding, entry) = w4a8;
        let w4a8 = W4A8Kernel {
            isa,
            encoding,
            entry,
        };
        let (isa, encoding, entry) = w8a8;
        let w8a8 = W8A8Kernel {
            isa,
            encoding,
            entry,
        };
        self.large_m = Some(LargeM { min_m, w4a8, w8a8 });
        self
    }

    /// The same kernels, recorded as selected for rung `rung` (a rung without kernels of its
    /// own for some op keeps the lower rung's, and [`KernelSet::describe_ops`] says so).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung borrows today
    pub(crate) fn for_rung(mut self, rung: Isa) -> Self {
        self.rung = rung;
        self
    }

    /// Adds SIMD activation quantisers (asymmetric for W4A8, symmetric for W8A8).
    ///
    /// # Safety
    /// - `asym` and `sym` may be called on this CPU: the caller holds the token of `isa`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only AVX-512 has one today
    pub(crate) unsafe fn with_act_quant(
        mut self,
        isa: Isa,
        asym: AsymQuantU8Fn,
        sym: SymQuantI8Fn,
    ) -> Self {
        self.act_asym_u8 = Some((isa, asym));
        self.act_sym_i8 = Some((isa, sym));
        self
    }

    /// Adds a WNA16 body of rung `isa`.
    ///
    /// # Safety
    /// - `entry` may be called on this CPU: the caller holds the token of `isa`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has one today
    pub(crate) unsafe fn with_wna16(mut self, isa: Isa, entry: Wna16PanelsFn) -> Self {
        self.wna16 = (isa, entry);
        self
    }

    /// The WNA16 entry point.
    pub(crate) fn wna16_entry(&self) -> Wna16PanelsFn {
        self.wna16.1
    }

    /// The rung whose code runs the WNA16 GEMM.
    pub fn wna16_isa(&self) -> Isa {
        self.wna16.0
    }

    /// Quantises one W8A8 activation row (spec §5.3 stage 0) with this set's SIMD quantiser,
    /// or the scalar one; both give the same bits. `q.len()` must equal `x.len()`.
    pub(crate) fn quantize_row_sym_i8(&self, x: &[f32], q: &mut [i8]) -> f32 {
        assert_eq!(x.len(), q.len(), "quantize_row_sym_i8: lengths differ");
        match self.act_sym_i8 {
            // SAFETY: the quantiser was registered with its rung's token (`with_act_quant`),
            // so the CPU supports it; `q` is as long as `x` (asserted).
            Some((_, f)) => unsafe { f(x, q) },
            None => moe_quant::act::quantize_row_sym_i8(x, q),
        }
    }

    /// The SIMD activation quantiser, when this set has one.
    pub(crate) fn act_asym_u8(&self) -> Option<AsymQuantU8Fn> {
        self.act_asym_u8.map(|(_, f)| f)
    }

    /// The portable kernels, available everywhere.
    pub fn scalar() -> Self {
        use crate::scalar::{w4a8::w4a8_entry, w8a8::w8a8_entry};
        let w4 = (Isa::Scalar, ActEncoding::I8, w4a8_entry as W4A8PanelsFn);
        let w8 = (Isa::Scalar, ActEncoding::I8, w8a8_entry as W8A8PanelsFn);
        // SAFETY: the scalar entries need no CPU feature.
        unsafe { Self::from_entries(Isa::Scalar, w4, w8) }
    }

    /// The kernels of rung `isa` when this CPU supports it (ignoring the cap), else `None`.
    /// Tests and benchmarks use this to run every available rung explicitly.
    pub fn for_isa(isa: Isa) -> Option<Self> {
        if isa == Isa::Scalar {
            Some(Self::scalar())
        } else {
            arch::kernel_set(isa)
        }
    }

    /// The rung this set was selected for.
    pub fn isa(&self) -> Isa {
        self.rung
    }

    /// The rung whose code runs the W4A8 GEMM for `m` rows.
    pub fn w4a8_isa(&self, m: usize) -> Isa {
        self.w4a8_for(m).isa
    }

    /// The rung whose code runs the W8A8 GEMM for `m` rows.
    pub fn w8a8_isa(&self, m: usize) -> Isa {
        self.w8a8_for(m).isa
    }

    /// One line per operation saying which implementation runs, e.g.
    /// `w4a8_gemm: avx512-vnni`.
    /// When a rung switches kernels at some row count, the line says where, e.g.
    /// `w4a8_gemm: avx512-vnni below 16 rows, amx from 16`.
    pub fn describe_ops(&self) -> Vec<String> {
        let per_m = |below: Isa, large: Option<Isa>| match (large, self.large_m) {
            (Some(large), Some(l)) => {
                format!("{below} below {} rows, {large} from {}", l.min_m, l.min_m)
            }
            _ => below.to_string(),
        };
        let large = self.large_m;
        vec![
            format!(
                "w4a8_gemm: {}",
                per_m(self.w4a8.isa, large.map(|l| l.w4a8.isa))
            ),
            format!(
                "w8a8_gemm: {}",
                per_m(self.w8a8.isa, large.map(|l| l.w8a8.isa))
            ),
            format!(
                "w4a8_act_quant: {}",
                self.act_asym_u8.map_or(Isa::Scalar, |(isa, _)| isa)
            ),
            format!(
                "w8a8_act_quant: {}",
                self.act_sym_i8.map_or(Isa::Scalar, |(isa, _)| isa)
            ),
            format!("wna16_gemm: {}", self.wna16.0),
        ]
    }

    /// The W4A8 kernel for a call of `m` rows.
    pub(crate) fn w4a8_for(&self, m: usize) -> W4A8Kernel {
        match self.large_m {
            Some(l) if m >= l.min_m => l.w4a8,
            _ => self.w4a8,
        }
    }

    /// The W8A8 kernel for a call of `m` rows.
    pub(crate) fn w8a8_for(&self, m: usize) -> W8A8Kernel {
        match self.large_m {
            Some(l) if m >= l.min_m => l.w8a8,
            _ => self.w8a8,
        }
    }
}

impl fmt::Debug for KernelSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelSet")
            .field("rung", &self.rung)
            .field("ops", &self.describe_ops())
            .finish()
    }
}

/// The rungs of this binary's architecture that this CPU supports, ascending (cap ignored).
pub fn available_isas() -> Vec<Isa> {
    Isa::native_ladder()
        .into_iter()
        .filter(|&isa| KernelSet::for_isa(isa).is_some())
        .collect()
}

/// The cap in force, read from `MOE_KERNELS_MAX_ISA` once.
pub fn isa_cap() -> &'static IsaCap {
    static CAP: OnceLock<IsaCap> = OnceLock::new();
    CAP.get_or_init(|| IsaCap::parse(std::env::var(MAX_ISA_ENV).ok().as_deref()))
}

/// The dispatched kernels: the best available rung under the cap, chosen once per process.
pub fn kernels() -> &'static KernelSet {
    static KERNELS: OnceLock<KernelSet> = OnceLock::new();
    KERNELS.get_or_init(select)
}

/// The rung of [`kernels`].
pub fn selected_isa() -> Isa {
    kernels().isa()
}

#[inline(never)]
fn select() -> KernelSet {
    let cap = isa_cap();
    if let IsaCap::Ignored { value, reason } = cap {
        tracing::warn!(value = %value, reason, "ignoring {MAX_ISA_ENV}");
    }
    let chosen = Isa::native_ladder()
        .into_iter()
        .rev()
        .filter(|&isa| cap.allows(isa))
        .find_map(KernelSet::for_isa)
        .unwrap_or_else(KernelSet::scalar);
    tracing::debug!(isa = ?chosen.isa(), ops = ?chosen.describe_ops(), cap = ?cap, "selected kernels");
    chosen
}
