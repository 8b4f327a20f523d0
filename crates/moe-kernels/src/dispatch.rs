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
use crate::dense::DenseBodies;
use crate::isa::{Isa, IsaCap, MAX_ISA_ENV};
use crate::packed::{PackedW4A8, PackedWna16, PanelOrder};
use crate::ukernel::{
    ActEncoding, W4A8PanelsFn, W4A8TileAFn, W4Bf16PanelsFn, W4Bf16TileAFn, W8A8PanelsFn,
    W8A8TileAFn,
};
use crate::wna16::{Int4DotFillFn, Int4DotPanelsFn, Wna16PanelsFn};

/// How W4A8 GEMMs with many rows per call compute (the numerics contract of prefill).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum W4A8Prefill {
    /// int8 activations on every row count: bit-equal to the scalar reference of spec §4.5 and
    /// to vLLM's W4A8 kernel.
    #[default]
    ExactInt8,
    /// From the rung's threshold on, activations rounded to bf16 and weights dequantized to
    /// bf16 (`bf16(w·scale)`) on the AMX-BF16 tiles, f32 accumulation: closer to the f32
    /// reference than int8 activations, but not bit-equal to it or to vLLM's W4A8 kernel.
    /// Only where the rung has the bf16 tiles (AMX with AMX-BF16); elsewhere the same as
    /// [`W4A8Prefill::ExactInt8`].
    Bf16Tiles,
    /// From the rung's threshold on, weights with group scales requantised to int8 with one
    /// scale per channel once per call ([`crate::scalar::w4a8_channel`]), int8 activations as
    /// [`W4A8Prefill::ExactInt8`], one int32 sum over all of K: the W8A8 kernel's rate instead
    /// of an epilogue per group. Each weight moves by at most half an int8 step of its
    /// channel's largest group; on weights quantised as checkpoints are, the relative L2 error
    /// against the f32 reference is about 1.6 times the exact path's (1.2 % against 0.76 %),
    /// and outputs are not bit-equal to the exact ones or to vLLM's W4A8 kernel.
    /// The AMX rung runs it on the AMX-INT8 tiles, the AVX-512 VNNI rung on its W8A8 tile's
    /// loop; channelwise weights, K above [`crate::scalar::w4a8_channel::MAX_K`] and the other
    /// rungs keep [`W4A8Prefill::ExactInt8`].
    ChannelInt8,
}

impl W4A8Prefill {
    /// The name `MOE_KERNELS_W4A8_PREFILL` and reports use: `int8`, `bf16` or `int8-channel`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ExactInt8 => "int8",
            Self::Bf16Tiles => "bf16",
            Self::ChannelInt8 => "int8-channel",
        }
    }

    /// The choice a [`W4A8Prefill::name`] names.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::ExactInt8, Self::Bf16Tiles, Self::ChannelInt8]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// The environment variable that chooses the process-wide [`W4A8Prefill`] (`int8`, the
/// default, `bf16` or `int8-channel`), read once by [`kernels`].
pub const W4A8_PREFILL_ENV: &str = "MOE_KERNELS_W4A8_PREFILL";

/// Rows from which a rung's bf16 path takes over, per kind of GEMM: the weight-only int4 and
/// e4m3 GEMMs and the bf16 dense experts weigh it against the rung's f32 FMA body, the W4A8
/// GEMMs (when their bf16 prefill is chosen) against its int8 kernels, so each has its own
/// switch-over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bf16MinRows {
    /// Int4 and e4m3 WNA16 GEMMs.
    pub(crate) wna16: usize,
    /// Dense experts stored in bf16.
    pub(crate) dense: usize,
    /// W4A8 GEMMs under [`W4A8Prefill::Bf16Tiles`].
    pub(crate) w4a8: usize,
}

impl Bf16MinRows {
    /// The same switch-over for every kind.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 rungs have the path
    pub(crate) fn all(m: usize) -> Self {
        Self {
            wna16: m,
            dense: m,
            w4a8: m,
        }
    }
}

/// The bf16 tile path of a rung: where it starts and its entry.
#[derive(Clone, Copy)]
pub(crate) struct Bf16Tiles {
    /// What runs the products, for reports (`amx-bf16 tiles`, `avx512-bf16 dot products`).
    pub(crate) unit: &'static str,
    pub(crate) min_m: Bf16MinRows,
    pub(crate) entry: W4Bf16PanelsFn,
    pub(crate) tile_a: W4Bf16TileAFn,
}

/// A rung's WNA16 body for int4 codes (and, where it says so, int8 ones) on dot products with
/// the codes decoded in registers or tiles: the activations laid out once per GEMM in the
/// body's numerics (rounded to bf16, or quantized to 15-bit integers), exact code values, f32
/// sums per group.
#[derive(Clone, Copy)]
pub(crate) struct Int4Dot {
    /// What runs the products and how it reads the codes, for reports.
    pub(crate) unit: &'static str,
    /// What the activations become, for reports (`bf16 activations`).
    pub(crate) activations: &'static str,
    /// Which int4 codes it serves, for reports (` for integer codes`, or empty for all).
    pub(crate) codes: &'static str,
    /// Rows from which it runs.
    pub(crate) min_m: usize,
    /// Rows from which it no longer runs (`usize::MAX`: none).
    pub(crate) max_m: usize,
    /// Whether it also takes int8 codes (integer ones: `serves` says which), in their K-major
    /// steps of four.
    pub(crate) int8: bool,
    /// Whether it also takes e4m3 codes (FP8), in the same steps.
    pub(crate) e4m3: bool,
    /// Which GEMMs of rows in `min_m..max_m` it takes: `serves(w, m)`.
    pub(crate) serves: fn(&PackedWna16, usize) -> bool,
    pub(crate) fill: Int4DotFillFn,
    pub(crate) entry: Int4DotPanelsFn,
}

impl Int4Dot {
    /// Whether it takes the GEMM of `m` rows on `w`.
    fn takes(&self, w: &PackedWna16, m: usize) -> bool {
        let width = match w.bits() {
            4 => true,
            8 if w.is_e4m3() => self.e4m3,
            8 => self.int8,
            _ => false,
        };
        width && (self.min_m..self.max_m).contains(&m) && (self.serves)(w, m)
    }

    /// Its rows, for reports: `from 8`, `below 8`, `from 1 below 8`, or nothing for all.
    fn rows_phrase(&self) -> String {
        match (self.min_m <= 1, self.max_m == usize::MAX) {
            (true, true) => String::new(),
            (false, true) => format!(" from {}", self.min_m),
            (true, false) => format!(" below {} rows", self.max_m),
            (false, false) => format!(" from {} below {} rows", self.min_m, self.max_m),
        }
    }
}

/// One int8-activation GEMM implementation: its rung, activation encoding and entry point
/// (`E`), and the activation layout (`T`) it may make once per GEMM.
#[derive(Clone, Copy)]
pub(crate) struct GemmKernel<E, T> {
    pub(crate) isa: Isa,
    pub(crate) encoding: ActEncoding,
    pub(crate) entry: E,
    /// The kernel's own activation layout, made once per GEMM, if it reads one.
    pub(crate) tile_a: Option<T>,
    /// The most bytes that layout takes, so that scratch can be sized before the hot path.
    pub(crate) tile_a_bytes: Option<TileABytesFn>,
    /// Whether the entry reads [`PanelOrder::Pairs`] panels too (every entry reads the lane
    /// order); the GEMMs hand other orders to the portable body.
    pub(crate) pairs: bool,
}

impl<E, T> GemmKernel<E, T> {
    /// A kernel of `(rung, activation encoding, entry point)` that reads the activations as
    /// quantised and the lane order only.
    fn plain((isa, encoding, entry): (Isa, ActEncoding, E)) -> Self {
        Self {
            isa,
            encoding,
            entry,
            tile_a: None,
            tile_a_bytes: None,
            pairs: false,
        }
    }

    /// The bytes of this kernel's activation layout for `m` rows of `k_pad` values in scale
    /// blocks of `block_len` (0 when it reads the rows as they are).
    fn layout_bytes(&self, m: usize, k_pad: usize, block_len: usize) -> usize {
        self.tile_a_bytes.map_or(0, |f| f(m, k_pad, block_len))
    }
}

/// The size of a kernel's own activation layout: bytes for `m` rows of `k_pad` values whose
/// weights have scale blocks of `block_len` values (`k_pad` for one scale per channel).
pub(crate) type TileABytesFn = fn(m: usize, k_pad: usize, block_len: usize) -> usize;

/// One W4A8 implementation.
pub(crate) type W4A8Kernel = GemmKernel<W4A8PanelsFn, W4A8TileAFn>;

/// One W8A8 implementation.
pub(crate) type W8A8Kernel = GemmKernel<W8A8PanelsFn, W8A8TileAFn>;

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
    act_sym: Option<(Isa, SymQuantFn)>,
    /// Kernels that take over from some row count on (the AMX tiles).
    large_m: Option<LargeM>,
    /// The rung's bf16 tile path for int4 and e4m3 weights, if it has one.
    bf16_tiles: Option<Bf16Tiles>,
    /// The rung's dot-product bodies for int4 WNA16 weights (up to three), the first that
    /// takes a GEMM ([`Int4Dot::takes`]) running it instead of the bf16 path and the f32 body.
    wna16_int4_dot: [Option<Int4Dot>; 3],
    /// Whether W4A8 GEMMs use the bf16 tiles from their threshold on.
    w4a8_prefill: W4A8Prefill,
    /// The W4A8 kernel on weights requantised per channel ([`W4A8Prefill::ChannelInt8`]) and
    /// the rows from which it takes over, if the rung has one.
    w4a8_channel: Option<(W4A8Kernel, usize)>,
    /// The WNA16 (weight-only int4, f32 compute) body and the rung whose code it is.
    wna16: (Isa, Wna16PanelsFn),
    /// The dense (float) GEMM's builds for this rung: the router gate, f32 experts, and bf16
    /// experts below the bf16 path's threshold.
    dense: DenseBodies,
    /// How many bytes the own kernels' activation layout of `m` rows of `k_pad` values takes
    /// at most, when they read one (see [`KernelSet::with_layouts`]).
    layout_bytes: Option<LayoutBytesFn>,
    /// The panel order the own W4A8 and W8A8 kernels read fastest.
    panel_order: PanelOrder,
}

/// The size bound of a kernel's activation layout: bytes for `m` rows of `k_pad` values.
pub(crate) type LayoutBytesFn = fn(m: usize, k_pad: usize) -> usize;

/// Rows from which a large-row W4A8 kernel takes over, by the length of the weights' scale
/// blocks: a kernel that pays an epilogue per block wins from fewer rows when blocks are long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct W4A8MinRows {
    /// Blocks shorter than [`W4A8MinRows::LONG_BLOCK`] values.
    pub(crate) short_blocks: usize,
    /// Blocks of at least [`W4A8MinRows::LONG_BLOCK`] values (channelwise scales included).
    pub(crate) long_blocks: usize,
}

impl W4A8MinRows {
    /// The shortest block counted as long: groups of 128, the common GPTQ/AWQ size.
    pub(crate) const LONG_BLOCK: usize = 128;

    /// The same threshold for every block length.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung has one
    pub(crate) const fn all(rows: usize) -> Self {
        Self {
            short_blocks: rows,
            long_blocks: rows,
        }
    }

    /// The threshold for blocks of `block_len` values.
    pub(crate) fn for_block(self, block_len: usize) -> usize {
        if block_len >= Self::LONG_BLOCK {
            self.long_blocks
        } else {
            self.short_blocks
        }
    }
}

/// Kernels that replace a set's own from `min_m` rows on: tile kernels only pay off once a
/// call has enough rows to fill their tiles.
#[derive(Clone, Copy)]
struct LargeM {
    /// Rows from which the W4A8 kernel takes over.
    min_m: W4A8MinRows,
    /// Rows from which the W8A8 kernel takes over.
    min_m_w8a8: usize,
    w4a8: W4A8Kernel,
    w8a8: W8A8Kernel,
}

/// Quantises one row like `moe_quant::act::quantize_row_asym_i8`, writing `q + 128`.
///
/// # Safety (for callers)
/// - The CPU supports the quantiser's rung; `dst.len() ≥ x.len()`.
pub(crate) type AsymQuantU8Fn = unsafe fn(&[f32], &mut [u8]) -> AsymRowU8;

/// What an asymmetric row quantiser reports besides the codes.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only AVX-512 has one today
pub(crate) struct AsymRowU8 {
    /// The row's zero point and dequantization factor, as `moe_quant` computes them.
    pub(crate) row: moe_quant::act::AsymRowQuant,
    /// Whether the row held a NaN (its outputs become NaN, spec §4.6).
    pub(crate) has_nan: bool,
}

/// What a symmetric row quantiser reports besides the codes.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only AVX-512 has one today
pub(crate) struct SymRowQuant {
    /// The row scale, as `moe_quant::act::quantize_row_sym_i8` returns it.
    pub(crate) scale: f32,
    /// Whether the row held a NaN (its outputs become NaN, spec §4.6).
    pub(crate) has_nan: bool,
}

/// Quantises one row like `moe_quant::act::quantize_row_sym_i8`, writing each code `q` as the
/// byte `q as u8 ^ flip` (the third argument).
///
/// # Safety (for callers)
/// - The CPU supports the quantiser's rung; `dst.len() ≥ x.len()`.
pub(crate) type SymQuantFn = unsafe fn(&[f32], &mut [u8], u8) -> SymRowQuant;

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
        let (w4a8, w8a8) = (W4A8Kernel::plain(w4a8), W8A8Kernel::plain(w8a8));
        Self {
            rung,
            w4a8,
            w8a8,
            act_asym_u8: None,
            act_sym: None,
            large_m: None,
            bf16_tiles: None,
            wna16_int4_dot: [None; 3],
            w4a8_prefill: W4A8Prefill::ExactInt8,
            w4a8_channel: None,
            wna16: (Isa::Scalar, crate::wna16::panels_portable),
            dense: DenseBodies::PORTABLE,
            layout_bytes: None,
            panel_order: PanelOrder::Lanes,
        }
    }

    /// The same set, with its own W4A8 and W8A8 kernels (those below any large-row threshold)
    /// reading [`PanelOrder::Pairs`] panels too, and asking for them
    /// ([`KernelSet::panel_order`]).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // only the i8mm rung has them
    pub(crate) fn with_pairs_order(mut self) -> Self {
        self.w4a8.pairs = true;
        self.w8a8.pairs = true;
        self.panel_order = PanelOrder::Pairs;
        self
    }

    /// The panel order this set's W4A8 and W8A8 kernels read fastest: pack weights for the set
    /// with [`crate::PackedW4A8::with_order`] and [`crate::PackedW8A8::with_order`]. Every
    /// set reads every order (a kernel without a body for one hands the call to the portable
    /// body), so weights packed for one set stay correct on any other.
    pub fn panel_order(&self) -> PanelOrder {
        self.panel_order
    }

    /// The same set, with its own kernels (those below any large-row threshold) reading their
    /// activations in their own layouts, made once per GEMM by `w4a8` and `w8a8`; `bytes`
    /// bounds the layouts' size, so that scratch can be sized up front
    /// ([`KernelSet::layout_bytes`]).
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))] // only the i8mm rung has them
    pub(crate) fn with_layouts(
        mut self,
        w4a8: W4A8TileAFn,
        w8a8: W8A8TileAFn,
        bytes: LayoutBytesFn,
    ) -> Self {
        self.w4a8.tile_a = Some(w4a8);
        self.w8a8.tile_a = Some(w8a8);
        self.layout_bytes = Some(bytes);
        self
    }

    /// The most bytes the own kernels' activation layout takes for `m` rows of `k` values (0
    /// when they read the rows as they are), to size scratch before the hot path: the W4A8 and
    /// W8A8 kernels' own, and the bf16 tiles' when W4A8 prefill runs on them.
    pub(crate) fn layout_bytes(&self, m: usize, k: usize) -> usize {
        let k_pad = k.next_multiple_of(crate::packed::w4a8::K_STEP);
        let own = self.layout_bytes.map_or(0, |f| f(m, k_pad));
        let bf16 = match self.w4a8_prefill() {
            W4A8Prefill::Bf16Tiles => crate::gemm::bf16_tile_bytes(m, k),
            _ => 0,
        };
        own.max(bf16)
    }

    /// The same set, with `w4a8` running every call of at least `min_m.0` rows (for its
    /// weights' block length) and `w8a8` every call of at least `min_m.1`.
    ///
    /// # Safety
    /// - Both entries may be called on this CPU: the caller holds the token of their rungs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung has them
    pub(crate) unsafe fn with_large_m(
        mut self,
        min_m: (W4A8MinRows, usize),
        w4a8: (Isa, ActEncoding, W4A8PanelsFn),
        w8a8: (Isa, ActEncoding, W8A8PanelsFn),
    ) -> Self {
        let (w4a8, w8a8) = (W4A8Kernel::plain(w4a8), W8A8Kernel::plain(w8a8));
        self.large_m = Some(LargeM {
            min_m: min_m.0,
            min_m_w8a8: min_m.1,
            w4a8,
            w8a8,
        });
        self
    }

    /// The same set with `kernel`, the W4A8 kernel of [`W4A8Prefill::ChannelInt8`], from
    /// `min_m` rows (replacing any the set had).
    ///
    /// # Safety
    /// - `kernel.entry` and its layout hook may be called on this CPU: the caller holds the
    ///   token of its rung.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 rungs have one
    pub(crate) unsafe fn with_w4a8_channel(mut self, kernel: W4A8Kernel, min_m: usize) -> Self {
        self.w4a8_channel = Some((kernel, min_m));
        self
    }

    /// The same set, with the large-row kernels reading their activations in their own
    /// layouts, made once per GEMM by `w4a8` and `w8a8`, whose sizes the second functions
    /// give.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung has them
    pub(crate) fn with_large_m_layouts(
        mut self,
        w4a8: (W4A8TileAFn, TileABytesFn),
        w8a8: (W8A8TileAFn, TileABytesFn),
    ) -> Self {
        if let Some(l) = &mut self.large_m {
            (l.w4a8.tile_a, l.w4a8.tile_a_bytes) = (Some(w4a8.0), Some(w4a8.1));
            (l.w8a8.tile_a, l.w8a8.tile_a_bytes) = (Some(w8a8.0), Some(w8a8.1));
        }
        self
    }

    /// The most bytes the activation layout of any W4A8 kernel of this set takes for a GEMM
    /// of up to `max_rows` rows on `w`, to size scratch before the hot path (the own
    /// kernels' layout is [`KernelSet::layout_bytes`]).
    pub(crate) fn w4a8_layout_bytes(&self, w: &PackedW4A8, max_rows: usize) -> usize {
        let (k_pad, block_len) = (w.k_pad(), w.block_len());
        let large = self.large_m.map(|l| l.w4a8);
        let channel = self.w4a8_channel.map(|(kernel, _)| kernel);
        [large, channel]
            .iter()
            .flatten()
            .map(|kernel| kernel.layout_bytes(max_rows, k_pad, block_len))
            .max()
            .unwrap_or(0)
    }

    /// The most bytes the activation layout of any W8A8 kernel of this set takes for a GEMM
    /// of up to `max_rows` rows of `k_pad` values (as [`KernelSet::w4a8_layout_bytes`]).
    pub(crate) fn w8a8_layout_bytes(&self, k_pad: usize, max_rows: usize) -> usize {
        self.large_m
            .map_or(0, |l| l.w8a8.layout_bytes(max_rows, k_pad, k_pad))
    }

    /// The same set with a bf16 path for int4 and e4m3 weights (`unit` names what runs its
    /// products), from `min_m` rows: int4 and e4m3 WNA16 GEMMs take it, W4A8 ones when
    /// [`W4A8Prefill::Bf16Tiles`] is chosen.
    ///
    /// # Safety
    /// - `entry` and `tile_a` may be called on this CPU: the caller holds the token of their
    ///   rung and has checked the features they need.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 rungs have one
    pub(crate) unsafe fn with_bf16_tiles(
        mut self,
        unit: &'static str,
        min_m: Bf16MinRows,
        entry: W4Bf16PanelsFn,
        tile_a: W4Bf16TileAFn,
    ) -> Self {
        self.bf16_tiles = Some(Bf16Tiles {
            unit,
            min_m,
            entry,
            tile_a,
        });
        self
    }

    /// The same set with `body`, a dot-product body for int4 WNA16 weights, beside the one it
    /// may hold already; of bodies whose rows overlap, the one added first takes the GEMMs it
    /// serves.
    ///
    /// # Safety
    /// - `body.fill` and `body.entry` may be called on this CPU: the caller holds the token of
    ///   their rung and has checked the features they need.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) unsafe fn with_wna16_int4_dot(mut self, body: Int4Dot) -> Self {
        let free = self
            .wna16_int4_dot
            .iter_mut()
            .find(|d| d.is_none())
            .expect("at most three int4 dot-product bodies per set");
        *free = Some(body);
        self
    }

    /// The same set without its int4 dot-product bodies (a rung that brings its own).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX rung drops them
    pub(crate) fn without_wna16_int4_dot(mut self) -> Self {
        self.wna16_int4_dot = [None; 3];
        self
    }

    /// The dot-product body for the WNA16 GEMM of `m` rows on `w`, where the rung has one that
    /// takes it: `w` holds int4 codes, `m` lies in the body's rows and the body serves `w`.
    pub(crate) fn wna16_int4_dot_for(&self, w: &PackedWna16, m: usize) -> Option<Int4Dot> {
        self.wna16_int4_dot
            .iter()
            .flatten()
            .find(|d| d.takes(w, m))
            .copied()
    }

    /// The same kernels with prefill numerics `prefill`. [`W4A8Prefill::Bf16Tiles`] changes
    /// nothing on a rung without bf16 tiles; [`KernelSet::w4a8_prefill`] says what is in force.
    pub fn with_w4a8_prefill(mut self, prefill: W4A8Prefill) -> Self {
        self.w4a8_prefill = prefill;
        self
    }

    /// The W4A8 prefill numerics in force: [`W4A8Prefill::Bf16Tiles`] only when it was chosen
    /// and the rung has the bf16 tiles, [`W4A8Prefill::ChannelInt8`] only when it was chosen
    /// and the rung has its kernel.
    pub fn w4a8_prefill(&self) -> W4A8Prefill {
        match (
            self.w4a8_prefill,
            self.bf16_tiles,
            self.w4a8_channel_kernel(),
        ) {
            (W4A8Prefill::Bf16Tiles, Some(_), _) => W4A8Prefill::Bf16Tiles,
            (W4A8Prefill::ChannelInt8, _, Some(_)) => W4A8Prefill::ChannelInt8,
            _ => W4A8Prefill::ExactInt8,
        }
    }

    /// The rung's kernel for [`W4A8Prefill::ChannelInt8`] and its first row count, if it has
    /// one.
    pub(crate) fn w4a8_channel_kernel(&self) -> Option<(W4A8Kernel, usize)> {
        self.w4a8_channel
    }

    /// The same kernels without the bf16 paths and the integer WNA16 body: WNA16 GEMMs run the
    /// f32 body at every row count, and [`W4A8Prefill::Bf16Tiles`] has nothing to choose. For
    /// callers who want the weight-only GEMM's f32 numerics whatever the CPU.
    pub fn without_bf16_path(mut self) -> Self {
        self.bf16_tiles = None;
        self.wna16_int4_dot = [None; 3];
        self
    }

    /// Whether this set's rung has the bf16 tile path (whether or not it is chosen).
    pub fn has_bf16_tiles(&self) -> bool {
        self.bf16_tiles.is_some()
    }

    /// The bf16 tile path for an int4 or e4m3 (FP8) WNA16 GEMM of `m` rows, where the rung has
    /// it and `m` reaches it. WNA16 computes in float, and the tiles' numerics (activations and
    /// dequantized weights rounded to bf16, f32 sums) are those of a bf16 model's weight-only
    /// kernels, so no choice is needed; `MOE_KERNELS_AMX_BF16_MIN_M` moves the threshold.
    pub(crate) fn wna16_bf16_for(&self, m: usize) -> Option<Bf16Tiles> {
        self.bf16_tiles.filter(|t| m >= t.min_m.wna16)
    }

    /// The bf16 path for a dense GEMM of `m` rows over bf16-stored experts, where the rung has
    /// it and `m` reaches it (the weights are exact in bf16; the activations are rounded).
    pub(crate) fn dense_bf16_for(&self, m: usize) -> Option<Bf16Tiles> {
        self.bf16_tiles.filter(|t| m >= t.min_m.dense)
    }

    /// The bf16 tile path for a W4A8 GEMM of `m` rows, when chosen and `m` reaches it.
    pub(crate) fn w4bf16_for(&self, m: usize, order: PanelOrder) -> Option<Bf16Tiles> {
        match (self.w4a8_prefill, self.bf16_tiles) {
            (W4A8Prefill::Bf16Tiles, Some(t))
                if m >= t.min_m.w4a8 && order == PanelOrder::Lanes =>
            {
                Some(t)
            }
            _ => None,
        }
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
        sym: SymQuantFn,
    ) -> Self {
        self.act_asym_u8 = Some((isa, asym));
        self.act_sym = Some((isa, sym));
        self
    }

    /// Adds a WNA16 body of rung `isa`.
    ///
    /// # Safety
    /// - `entry` may be called on this CPU: the caller holds the token of `isa`.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(crate) unsafe fn with_wna16(mut self, isa: Isa, entry: Wna16PanelsFn) -> Self {
        self.wna16 = (isa, entry);
        self
    }

    /// Adds the dense builds `dense`.
    ///
    /// # Safety
    /// - Both builds may be called on this CPU: the caller holds the token of `dense.isa`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only x86 has them today
    pub(crate) unsafe fn with_dense(mut self, dense: DenseBodies) -> Self {
        self.dense = dense;
        self
    }

    /// The dense builds.
    pub(crate) fn dense_bodies(&self) -> DenseBodies {
        self.dense
    }

    /// The rung whose code runs the dense GEMM ([`crate::dense_gemm`], and bf16 experts below
    /// the bf16 path's threshold): the rung whose vector width its build uses, or
    /// [`Isa::Scalar`] for the portable build.
    pub fn dense_isa(&self) -> Isa {
        self.dense.isa
    }

    /// The WNA16 entry point.
    pub(crate) fn wna16_entry(&self) -> Wna16PanelsFn {
        self.wna16.1
    }

    /// The rung whose code runs the WNA16 GEMM.
    pub fn wna16_isa(&self) -> Isa {
        self.wna16.0
    }

    /// The SIMD activation quantiser, when this set has one.
    pub(crate) fn act_asym_u8(&self) -> Option<AsymQuantU8Fn> {
        self.act_asym_u8.map(|(_, f)| f)
    }

    /// The SIMD symmetric quantiser (W8A8), when this set has one.
    pub(crate) fn act_sym(&self) -> Option<SymQuantFn> {
        self.act_sym.map(|(_, f)| f)
    }

    /// The portable kernels, available everywhere.
    pub fn scalar() -> Self {
        use crate::scalar::{w4a8::w4a8_entry, w8a8::w8a8_entry};
        let w4 = (Isa::Scalar, ActEncoding::I8, w4a8_entry as W4A8PanelsFn);
        let w8 = (Isa::Scalar, ActEncoding::I8, w8a8_entry as W8A8PanelsFn);
        // SAFETY: the scalar entries need no CPU feature.
        let mut set = unsafe { Self::from_entries(Isa::Scalar, w4, w8) };
        // The portable body reads every order (`lanes_step`); it prefers none.
        set.w4a8.pairs = true;
        set.w8a8.pairs = true;
        set
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

    /// The rung whose code runs the W4A8 GEMM for `m` rows, on weights with scale blocks of
    /// `block_len` values (the group size, or K for channelwise scales) in the set's
    /// [`KernelSet::panel_order`].
    pub fn w4a8_isa(&self, m: usize, block_len: usize) -> Isa {
        // The requantised kernel runs on the same rung as the exact one.
        self.w4a8_for_shape(m, block_len, false, self.panel_order)
            .isa
    }

    /// The rung whose code runs the W8A8 GEMM for `m` rows, on weights in the set's
    /// [`KernelSet::panel_order`].
    pub fn w8a8_isa(&self, m: usize) -> Isa {
        self.w8a8_for(m, self.panel_order).isa
    }

    /// The `wna16_gemm` line of [`KernelSet::describe_ops`].
    fn describe_wna16(&self) -> String {
        let f32_body = self.wna16.0;
        let rest = match self.bf16_tiles {
            Some(t) => format!(
                "{f32_body} below {} rows, {} (bf16 activations) from {}",
                t.min_m.wna16, t.unit, t.min_m.wna16
            ),
            None => f32_body.to_string(),
        };
        let mut dots: Vec<Int4Dot> = self.wna16_int4_dot.iter().flatten().copied().collect();
        if dots.is_empty() {
            return match self.bf16_tiles {
                Some(_) => format!("wna16_gemm: {rest} (int4, int8, fp8)"),
                None => format!("wna16_gemm: {rest}"),
            };
        }
        // By first row (a stable sort keeps the order of precedence among equal ones).
        dots.sort_by_key(|d| d.min_m);
        let mut int4: Vec<String> = Vec::new();
        for d in &dots {
            int4.push(format!(
                "{} ({}){}{}",
                d.unit,
                d.activations,
                d.codes,
                d.rows_phrase()
            ));
        }
        if dots.iter().all(|d| !d.codes.is_empty() || d.min_m > 1) {
            int4.push(format!("otherwise {f32_body}"));
        }
        // The bodies that take 8-bit codes of one kind, then where the others go.
        let bytes = |takes: fn(&Int4Dot) -> bool| {
            let listed: Vec<&Int4Dot> = dots.iter().filter(|d| takes(d)).collect();
            if listed.is_empty() {
                return None;
            }
            let mut parts: Vec<String> = listed
                .iter()
                .map(|d| format!("{} ({}){}", d.unit, d.activations, d.rows_phrase()))
                .collect();
            if listed.iter().all(|d| d.min_m > 1 || d.max_m < usize::MAX) {
                parts.push(format!("otherwise {rest}"));
            }
            Some(parts.join(", "))
        };
        let int4 = int4.join(", ");
        match (bytes(|d| d.int8), bytes(|d| d.e4m3)) {
            (None, None) => format!("wna16_gemm: int4 codes: {int4}; int8 and fp8 codes: {rest}"),
            (Some(int8), Some(fp8)) if int8 == fp8 => {
                format!("wna16_gemm: int4 codes: {int4}; int8 and fp8 codes: {int8}")
            }
            (int8, fp8) => format!(
                "wna16_gemm: int4 codes: {int4}; int8 codes: {}; fp8 codes: {}",
                int8.unwrap_or_else(|| rest.clone()),
                fp8.unwrap_or_else(|| rest.clone())
            ),
        }
    }

    /// One line per operation saying which implementation runs, e.g.
    /// `w4a8_gemm: avx512-vnni`.
    /// When a rung switches kernels at some row count, the line says where, e.g.
    /// `w4a8_gemm: avx512-vnni below 16 rows, amx from 16`.
    pub fn describe_ops(&self) -> Vec<String> {
        let per_m = |below: Isa, large: Option<(Isa, usize)>| match large {
            Some((large, min)) => format!("{below} below {min} rows, {large} from {min}"),
            None => below.to_string(),
        };
        let large = self.large_m;
        // W4A8 says where long blocks switch when that differs.
        let w4a8_per_m = match large {
            Some(l) if l.min_m.long_blocks != l.min_m.short_blocks => format!(
                "{} below {} rows ({} for groups of {} or more), {} from there",
                self.w4a8.isa,
                l.min_m.short_blocks,
                l.min_m.long_blocks,
                W4A8MinRows::LONG_BLOCK,
                l.w4a8.isa
            ),
            _ => per_m(
                self.w4a8.isa,
                large.map(|l| (l.w4a8.isa, l.min_m.short_blocks)),
            ),
        };
        let prefill = match (
            self.w4a8_prefill(),
            self.bf16_tiles,
            self.w4a8_channel_kernel(),
        ) {
            (W4A8Prefill::Bf16Tiles, Some(t), _) => {
                format!(", {} (bf16 activations) from {} rows", t.unit, t.min_m.w4a8)
            }
            (W4A8Prefill::ChannelInt8, _, Some((k, min))) => format!(
                "; groups: {} on weights requantised to int8 per channel from {min} rows \
                 ({W4A8_PREFILL_ENV}=int8-channel)",
                k.isa
            ),
            (_, bf16, channel) => {
                let names: Vec<&str> = [
                    (bf16.is_some(), "bf16"),
                    (channel.is_some(), "int8-channel"),
                ]
                .into_iter()
                .filter_map(|(has, name)| has.then_some(name))
                .collect();
                match names.as_slice() {
                    [] => String::new(),
                    [one] => format!(" ({one} path available: {W4A8_PREFILL_ENV}={one})"),
                    many => format!(
                        " (other paths available: {W4A8_PREFILL_ENV}={})",
                        many.join(" or ")
                    ),
                }
            }
        };
        vec![
            format!("w4a8_gemm: {w4a8_per_m}{prefill}"),
            format!(
                "w8a8_gemm: {}",
                per_m(self.w8a8.isa, large.map(|l| (l.w8a8.isa, l.min_m_w8a8)))
            ),
            format!(
                "w4a8_act_quant: {}",
                self.act_asym_u8
                    .map_or(arch::PORTABLE_ACT_QUANT.to_string(), |(isa, _)| isa
                        .to_string())
            ),
            format!(
                "w8a8_act_quant: {}",
                self.act_sym
                    .map_or(arch::PORTABLE_ACT_QUANT.to_string(), |(isa, _)| isa
                        .to_string())
            ),
            self.describe_wna16(),
            format!("dense_gemm: {}", self.dense.isa),
            match self.bf16_tiles {
                Some(t) => format!(
                    "dense_expert_gemm: {} below {} rows, {} (bf16 activations) from {} \
                     (bf16 weights)",
                    self.dense.isa, t.min_m.dense, t.unit, t.min_m.dense
                ),
                None => format!("dense_expert_gemm: {}", self.dense.isa),
            },
        ]
    }

    /// The W4A8 kernel for a call of `m` rows on weights with scale blocks of `block_len`
    /// values, in panels of `order`: the portable body where the rung's kernel does not read
    /// that order.
    pub(crate) fn w4a8_for(&self, m: usize, w: &PackedW4A8) -> W4A8Kernel {
        // Channelwise weights have one block already.
        let requantise = w.block_len() < w.k_pad() && w.k() <= crate::scalar::w4a8_channel::MAX_K;
        self.w4a8_for_shape(m, w.block_len(), requantise, w.order())
    }

    /// [`KernelSet::w4a8_for`] by the weights' shape: scale blocks of `block_len` values,
    /// whether [`W4A8Prefill::ChannelInt8`] may requantise them, their panel order.
    fn w4a8_for_shape(
        &self,
        m: usize,
        block_len: usize,
        requantise: bool,
        order: PanelOrder,
    ) -> W4A8Kernel {
        let chosen = requantise && self.w4a8_prefill == W4A8Prefill::ChannelInt8;
        let kernel = match (self.w4a8_channel, self.large_m) {
            (Some((channel, min)), _) if chosen && m >= min => channel,
            (_, Some(l)) if m >= l.min_m.for_block(block_len) => l.w4a8,
            _ => self.w4a8,
        };
        match order {
            PanelOrder::Pairs if !kernel.pairs => Self::scalar().w4a8,
            _ => kernel,
        }
    }

    /// The W8A8 kernel for a call of `m` rows on panels in `order`: the portable body where
    /// the rung's kernel does not read that order.
    pub(crate) fn w8a8_for(&self, m: usize, order: PanelOrder) -> W8A8Kernel {
        let kernel = match self.large_m {
            Some(l) if m >= l.min_m_w8a8 => l.w8a8,
            _ => self.w8a8,
        };
        match order {
            PanelOrder::Pairs if !kernel.pairs => Self::scalar().w8a8,
            _ => kernel,
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

/// The W4A8 prefill numerics this process asks for through `MOE_KERNELS_W4A8_PREFILL` (`int8`,
/// the default, `bf16` or `int8-channel`; read once, anything else ignored with a warning).
/// [`kernels`] and the kernel sets a layer selects apply it unless the layer chooses its own;
/// [`KernelSet::w4a8_prefill`] says whether the rung can honour it.
pub fn w4a8_prefill_requested() -> W4A8Prefill {
    static PREFILL: OnceLock<W4A8Prefill> = OnceLock::new();
    *PREFILL.get_or_init(|| {
        match std::env::var(W4A8_PREFILL_ENV)
            .ok()
            .as_deref()
            .map(str::trim)
        {
            None | Some("") => W4A8Prefill::ExactInt8,
            Some(name) => W4A8Prefill::from_name(name).unwrap_or_else(|| {
                tracing::warn!(
                    value = %name,
                    "ignoring {W4A8_PREFILL_ENV}: expected int8, bf16 or int8-channel"
                );
                W4A8Prefill::ExactInt8
            }),
        }
    })
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
        .unwrap_or_else(KernelSet::scalar)
        .with_w4a8_prefill(w4a8_prefill_requested());
    tracing::debug!(isa = ?chosen.isa(), ops = ?chosen.describe_ops(), cap = ?cap, "selected kernels");
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long scale blocks switch to the large-row W4A8 kernel from their own row count, and
    /// `describe_ops` says so.
    #[test]
    fn w4a8_large_rows_switch_by_block_length() {
        let min = W4A8MinRows {
            short_blocks: 32,
            long_blocks: 24,
        };
        assert_eq!(
            [32, 64, 127, 128, 4096].map(|b| min.for_block(b)),
            [32, 32, 32, 24, 24]
        );
        let base = KernelSet::scalar();
        let w4a8 = (Isa::Amx, ActEncoding::U8Offset128, base.w4a8.entry);
        let w8a8 = (Isa::Amx, ActEncoding::U8Offset128, base.w8a8.entry);
        // SAFETY: both entries are the portable ones, which run anywhere.
        let set = unsafe { base.with_large_m((min, 16), w4a8, w8a8) };
        let isa = |m, block_len| set.w4a8_isa(m, block_len);
        assert_eq!(
            [
                isa(23, 128),
                isa(24, 128),
                isa(24, 2048),
                isa(31, 32),
                isa(32, 32)
            ],
            [Isa::Scalar, Isa::Amx, Isa::Amx, Isa::Scalar, Isa::Amx]
        );
        assert_eq!(
            (set.w8a8_isa(15), set.w8a8_isa(16)),
            (Isa::Scalar, Isa::Amx)
        );
        let line = &set.describe_ops()[0];
        assert!(
            line.contains("scalar below 32 rows (24 for groups of 128 or more), amx from there"),
            "{line}"
        );
        // SAFETY: as above.
        let same = unsafe { base.with_large_m((W4A8MinRows::all(32), 16), w4a8, w8a8) };
        let line = &same.describe_ops()[0];
        assert!(line.contains("scalar below 32 rows, amx from 32"), "{line}");
    }
}
