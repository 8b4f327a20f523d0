//! The microkernel contract shared by every rung: the argument structs the driver hands over,
//! the trait a rung implements, the panel loop that walks row tiles of one panel, and the
//! per-rung glue written once as macros (`impl_microkernels!`: the trait impls and entry points
//! around a rung's tile bodies; `rung_kernel_set!`: the rung's `KernelSet`).
//!
//! Maths contract of a W4A8 tile (rows `m0..m0+mr`, 16 channels of panel `p`): for every scale
//! block `b`, the kernel forms the exact int32 `acc_i = Σ_{k∈b} (q_k − zp)·w_k` (however it
//! gets there, e.g. as `Σ (q+128)·w − (128+zp)·Σw`), then in f32 and in this order
//! `acc_f = acc_f + f32(acc_i) · scale[b]` from `acc_f = 0`, and finally
//! `y = acc_f · recip (+ bias)`, without fused multiply-adds. The result **overwrites** the
//! output elements. Because every rung follows this order the f32 outputs are bit-identical to
//! the scalar reference (spec §4.5). In block-accumulator mode the kernel instead stores each
//! `acc_i` (used by the tests to compare integer sums exactly).
//!
//! W8A8 tiles form `acc = Σ_k q_k·w_k` exactly in int32 and write `f32(acc) · (xs[m] · ws[n])`.

use std::ops::Range;

use crate::aligned::AlignedVec;
use crate::packed::{PackedW4A8, PackedW8A8};

/// How a kernel wants the int8 activation codes laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActEncoding {
    /// The codes as they are (`q` as i8 bytes); W4A8 row correction is `zp`.
    I8,
    /// `q + 128` as u8 (`q ^ 0x80`), for `vpdpbusd`/`vpmaddubsw` whose first operand is
    /// unsigned; W4A8 row correction is `128 + zp`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    // aarch64 uses `I8`, `I8BlockCorrected`
    U8Offset128,
    /// The codes as they are, plus a correction per row and scale block: for W4A8 kernels
    /// that make the weight codes `c = w + 8` the unsigned operand of `vpdpbusd` or
    /// `vpmaddubsw` (no per-step `− 8` on the weights). Such a kernel forms
    /// `Σ q·c`, and `Σ (q − zp)·w = Σ q·c − zp·Σc − κ` with the per-(row, block) constant
    /// `κ = 8·(Σ_{k∈b} q_k − zp·B)` (B the block length, padding included), which the driver
    /// computes into [`W4A8Job::block_corr`]. The row correction is `zp`. The aarch64 rungs
    /// use it too, with the codes as signed bytes (`0..=15`) in `sdot`/`smmla`/`smull`.
    I8BlockCorrected,
}

impl ActEncoding {
    /// Encodes one code.
    #[inline]
    pub(crate) fn encode(self, q: i8) -> u8 {
        match self {
            ActEncoding::I8 | ActEncoding::I8BlockCorrected => q as u8,
            ActEncoding::U8Offset128 => (q as u8) ^ 0x80,
        }
    }

    /// The encoded byte for padding K values (their weights are zero, so any value works).
    pub(crate) fn pad(self) -> u8 {
        self.encode(0)
    }

    /// The per-row W4A8 correction for zero point `zp`.
    pub(crate) fn w4a8_row_corr(self, zp: i32) -> i32 {
        match self {
            ActEncoding::I8 | ActEncoding::I8BlockCorrected => zp,
            ActEncoding::U8Offset128 => 128 + zp,
        }
    }

    /// Whether W4A8 kernels of this encoding read [`W4A8Job::block_corr`].
    pub(crate) fn needs_block_corr(self) -> bool {
        self == ActEncoding::I8BlockCorrected
    }
}

/// Where a W4A8 kernel writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum W4A8Out {
    /// The f32 outputs, row-major with row stride `ld` (only channels `< N` are written).
    Values {
        /// Element `[m, n]` is at `ptr + m·ld + n`.
        ptr: *mut f32,
        /// Row stride in elements.
        ld: usize,
    },
    /// The int32 block accumulators, `[m][n_blocks][16·n_panels]` (all padded channels).
    #[cfg_attr(not(test), allow(dead_code))] // only the exactness tests ask for them
    BlockAcc {
        /// Element `[m, b, n]` is at `ptr + (m·n_blocks + b)·16·n_panels + n`.
        ptr: *mut i32,
    },
}

/// One W4A8 GEMM as the kernels see it, after validation and activation encoding.
#[derive(Debug)]
pub(crate) struct W4A8Job<'a> {
    /// The packed weights.
    pub w: &'a PackedW4A8,
    /// Encoded activation rows, `[m][w.k_pad()]`.
    pub a: &'a [u8],
    /// The same rows in the kernel's own layout ([`W4A8TileAFn`]), made once per GEMM; empty
    /// for kernels without one.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )] // the AMX tiles and the i8mm rung read it
    pub a_tiles: &'a [u8],
    /// Per-row correction (see [`ActEncoding::w4a8_row_corr`]).
    pub row_corr: &'a [i32],
    /// Per-(row, scale block) correction `[m][n_blocks]` for encodings that ask for it
    /// ([`ActEncoding::I8BlockCorrected`]); empty otherwise.
    pub block_corr: &'a [i32],
    /// The same corrections with the row's zero point as one 32-bit word per (block, row),
    /// `[n_blocks][m]`: the i16 pair `(−zp, −κ/8)` that multiplies a block's `(Σc, 8)` lanes in
    /// one `vpdpwssd` or `vpmaddwd`. The driver makes them where blocks are short enough
    /// (`255·B < 2^15`), block-major so that a tile reads its rows' words of a block from one
    /// place and broadcasts each from memory instead of building it in a register; empty
    /// otherwise.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the aarch64 bodies read `κ`
    pub block_words: &'a [i32],
    /// Per-row dequantization factor `recip`.
    pub row_recip: &'a [f32],
    /// Rows.
    pub m: usize,
    /// Destination.
    pub out: W4A8Out,
}

// SAFETY: the raw output pointer is only written through by kernels working on disjoint panels
// (the driver's partition), so sharing the job between threads creates no data race.
unsafe impl Sync for W4A8Job<'_> {}

impl<'a> W4A8Job<'a> {
    /// The paired correction words of block `b` for rows `m0..m0 + R`, side by side
    /// ([`W4A8Job::block_words`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the aarch64 bodies read `κ`
    #[inline(always)]
    pub(crate) fn paired_words<const R: usize>(&self, b: usize, m0: usize) -> &'a [i32; R] {
        self.block_words[b * self.m + m0..][..R].try_into().unwrap()
    }
}

/// One W8A8 GEMM as the kernels see it.
#[derive(Debug)]
pub(crate) struct W8A8Job<'a> {
    /// The packed weights.
    pub w: &'a PackedW8A8,
    /// Encoded activation rows, `[m][w.k_pad()]`.
    pub a: &'a [u8],
    /// The same rows in the kernel's own layout ([`W8A8TileAFn`]), made once per GEMM; empty
    /// for kernels without one.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )] // the AMX tiles and the i8mm rung read it
    pub a_tiles: &'a [u8],
    /// Per-row activation scale `xs`.
    pub row_scale: &'a [f32],
    /// Rows.
    pub m: usize,
    /// Output, row-major `[m][ld]`; only channels `< N` are written.
    pub out: *mut f32,
    /// Output row stride in elements.
    pub ld: usize,
}

// SAFETY: as for `W4A8Job`: kernels write disjoint panels only.
unsafe impl Sync for W8A8Job<'_> {}

/// The weights a bf16 tile GEMM reads as bf16 B rows: int4 and e4m3 formats dequantized per
/// call, or bf16 dense weights as they are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bf16Weights<'a> {
    /// W4A8-packed weights (bf16 or f32 scales, symmetric).
    W4A8(&'a PackedW4A8),
    /// WNA16-packed int4 weights (any scale precision, optional zero points) or e4m3 weights
    /// (FP8 blocks, f32 block scales).
    Wna16(&'a crate::PackedWna16),
    /// Dense weights stored in bf16 (exact as B rows).
    Dense(&'a crate::PackedDense),
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX tiles read them
impl Bf16Weights<'_> {
    /// Output channels N.
    pub(crate) fn n(&self) -> usize {
        match self {
            Self::W4A8(w) => w.n(),
            Self::Wna16(w) => w.n(),
            Self::Dense(w) => w.n(),
        }
    }

    /// Reduction dimension K.
    pub(crate) fn k(&self) -> usize {
        match self {
            Self::W4A8(w) => w.k(),
            Self::Wna16(w) => w.k(),
            Self::Dense(w) => w.k(),
        }
    }

    /// The bias of panel `p`, if any.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn panel_bias(&self, p: usize) -> Option<&[f32]> {
        match self {
            Self::W4A8(w) => w.panel_bias(p),
            Self::Wna16(w) => w.panel_bias(p),
            Self::Dense(_) => None,
        }
    }

    /// Where panel `p`'s stored weights lie: their first byte and their length in bytes
    /// (codes, nibbles or bf16 values, as packed), for a prefetch to fetch them ahead of use.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn panel_span(&self, p: usize) -> (*const u8, usize) {
        match self {
            Self::W4A8(w) => {
                let nibbles = w.panel_nibbles(p);
                (nibbles.as_ptr(), nibbles.len())
            }
            Self::Wna16(w) => {
                let len = w.k_steps() * crate::packed::PANEL;
                let words = &w.codes()[p * len..][..len];
                (words.as_ptr().cast(), std::mem::size_of_val(words))
            }
            Self::Dense(w) => {
                let len = w.k() * crate::packed::PANEL;
                match w.bf16_values() {
                    Some(values) => {
                        let values = &values[p * len..][..len];
                        (values.as_ptr().cast(), std::mem::size_of_val(values))
                    }
                    None => (std::ptr::null(), 0),
                }
            }
        }
    }
}

/// One GEMM of int4 weights with bf16 activations (the bf16 tile path), as the kernels see
/// it: the rows already rounded to bf16 in the kernel's layout.
#[derive(Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the AMX tiles read it
pub(crate) struct W4Bf16Job<'a> {
    /// The packed weights.
    pub w: Bf16Weights<'a>,
    /// The activation rows in the kernel's own layout ([`W4Bf16TileAFn`]), made once per GEMM.
    pub a_tiles: &'a [u8],
    /// Rows.
    pub m: usize,
    /// Output, row-major `[m][ld]`; only channels `< N` are written.
    pub out: *mut f32,
    /// Output row stride in elements.
    pub ld: usize,
}

// SAFETY: as for `W4A8Job`: kernels write disjoint panels only.
unsafe impl Sync for W4Bf16Job<'_> {}

/// Re-lays a W4A8 GEMM's encoded rows (`[m][w.k_pad()]`) into a kernel's own layout, once per
/// GEMM, so that every panel range the GEMM is split into reads the same copy. `corr` holds the
/// rows' corrections ([`W4A8Job::row_corr`]), for layouts that carry them into the products.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) type W4A8TileAFn =
    fn(a: &[u8], corr: &[i32], m: usize, w: &PackedW4A8, dst: &mut AlignedVec<u8>);

/// The W8A8 counterpart of [`W4A8TileAFn`].
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) type W8A8TileAFn = fn(a: &[u8], m: usize, k_pad: usize, dst: &mut AlignedVec<u8>);

/// Rounds a GEMM's f32 rows (`[m][k]`) into the bf16 tile path's layout, once per GEMM.
///
/// # Safety (for callers)
/// - The CPU supports the function's rung (it comes from the same `KernelSet` as the entry).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) type W4Bf16TileAFn = unsafe fn(x: &[f32], m: usize, k: usize, dst: &mut AlignedVec<u8>);

/// A rung's entry point for the bf16-activation int4 GEMM over a range of panels.
///
/// # Safety (for callers)
/// - The CPU supports the entry's rung (AMX-BF16 and AVX-512 BF16).
/// - `a_tiles` was made by the entry's layout function for `m` rows of `w.k()` values, and
///   `out` is valid for writes of every element of
///   rows `0..m` in the channels of `panels`, which no other thread accesses meanwhile.
/// - `panels` lies within `0..w.n_panels()`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) type W4Bf16PanelsFn = unsafe fn(&W4Bf16Job<'_>, Range<usize>);

/// A rung's entry point for the W4A8 GEMM over a range of panels.
///
/// # Safety (for callers)
/// - The CPU supports the rung's ISA (the `KernelSet` holding the pointer was built from its
///   token).
/// - The job was validated by the driver: `a`, `row_corr`, `row_recip` hold `m` rows, the
///   activations use the rung's encoding, and `out` is valid for writes of every element of
///   rows `0..m` in the channels of `panels`, which no other thread accesses meanwhile.
/// - `panels` lies within `0..w.n_panels()`.
pub(crate) type W4A8PanelsFn = unsafe fn(&W4A8Job<'_>, Range<usize>);

/// A rung's entry point for the W8A8 GEMM over a range of panels; same contract as
/// [`W4A8PanelsFn`].
pub(crate) type W8A8PanelsFn = unsafe fn(&W8A8Job<'_>, Range<usize>);

/// A W4A8 microkernel: `MR` rows by one 16-channel panel.
pub(crate) trait W4A8Microkernel: Copy {
    /// Rows per tile.
    const MR: usize;
    /// Channels per tile (the panel width of the packed format).
    const NR: usize = crate::packed::PANEL;
    /// K granularity the packed format guarantees.
    const KC_ALIGN: usize = crate::packed::w4a8::K_STEP;
    /// Row tiles start at multiples of this ([`row_tiles_aligned`]): a kernel that reads its
    /// activations as row pairs in its own layout needs its tiles on pair boundaries.
    const ROW_ALIGN: usize = 1;

    /// Computes rows `m0..m0 + mr` (`1 ≤ mr ≤ MR`) of panel `p` per the module contract.
    ///
    /// # Safety
    /// - `self` proves the ISA; the job satisfies [`W4A8PanelsFn`]'s contract for panel `p`;
    /// - `m0 + mr ≤ job.m`.
    unsafe fn tile(self, job: &W4A8Job<'_>, p: usize, m0: usize, mr: usize);

    /// Calls of at most this many rows (`0` for none) run as one row tile over pairs of panels
    /// ([`W4A8Microkernel::pair_tile`]) where K reaches [`W4A8Microkernel::PAIR_MIN_K`]; at
    /// most `MR`.
    const PAIR_MAX_ROWS: usize = 0;

    /// K from which calls of up to [`W4A8Microkernel::PAIR_MAX_ROWS`] rows take pair tiles.
    const PAIR_MIN_K: usize = 0;

    /// Computes rows `m0..m0 + mr` (`1 ≤ mr ≤ PAIR_MAX_ROWS`) of panels `p` and `p + 1`.
    ///
    /// # Safety
    /// - As [`W4A8Microkernel::tile`] for both panels.
    unsafe fn pair_tile(self, job: &W4A8Job<'_>, p: usize, m0: usize, mr: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.tile(job, p, m0, mr) };
        // SAFETY: as above.
        unsafe { self.tile(job, p + 1, m0, mr) };
    }
}

/// A W8A8 microkernel: `MR` rows by one 16-channel panel.
pub(crate) trait W8A8Microkernel: Copy {
    /// Rows per tile.
    const MR: usize;
    /// K granularity the packed format guarantees.
    const KC_ALIGN: usize = crate::packed::w8a8::K_STEP;
    /// Row tiles start at multiples of this ([`row_tiles_aligned`]): a kernel that reads its
    /// activations as row pairs in its own layout needs its tiles on pair boundaries.
    const ROW_ALIGN: usize = 1;

    /// Panels per tile: 2 when the rung has [`W8A8Microkernel::pair_tile`].
    const NP: usize = 1;

    /// Computes rows `m0..m0 + mr` (`1 ≤ mr ≤ MR`) of panel `p`.
    ///
    /// # Safety
    /// - `self` proves the ISA; the job satisfies [`W8A8PanelsFn`]'s contract for panel `p`;
    /// - `m0 + mr ≤ job.m`.
    unsafe fn tile(self, job: &W8A8Job<'_>, p: usize, m0: usize, mr: usize);

    /// Computes rows `m0..m0 + mr` of panels `p` and `p + 1` (rungs with `NP == 2`).
    ///
    /// # Safety
    /// - As [`W8A8Microkernel::tile`] for both panels.
    unsafe fn pair_tile(self, job: &W8A8Job<'_>, p: usize, m0: usize, mr: usize) {
        // SAFETY: forwarded contract.
        unsafe { self.tile(job, p, m0, mr) };
        // SAFETY: as above.
        unsafe { self.tile(job, p + 1, m0, mr) };
    }
}

/// Walks the panels and, inside each, the row tiles; the body every rung's entry inlines.
///
/// # Safety
/// - As [`W4A8PanelsFn`], with `kern` proving the ISA.
#[inline(always)]
pub(crate) unsafe fn w4a8_panels<K: W4A8Microkernel>(
    kern: K,
    job: &W4A8Job<'_>,
    panels: Range<usize>,
) {
    debug_assert!(K::NR == crate::packed::PANEL && job.w.k_pad().is_multiple_of(K::KC_ALIGN));
    if (1..=K::PAIR_MAX_ROWS).contains(&job.m) && job.w.k() >= K::PAIR_MIN_K {
        // One row tile of every row, over pairs of panels.
        let mut p = panels.start;
        while p < panels.end {
            if p + 1 < panels.end {
                // SAFETY: forwarded from this function's contract for panels `p` and
                // `p + 1 < panels.end`; the tile's `m ≤ PAIR_MAX_ROWS` rows are `0..m`.
                unsafe { kern.pair_tile(job, p, 0, job.m) };
                p += 2;
            } else {
                // SAFETY: as above, for panel `p` (`m ≤ PAIR_MAX_ROWS ≤ MR` rows).
                unsafe { kern.tile(job, p, 0, job.m) };
                p += 1;
            }
        }
        return;
    }
    for p in panels {
        for rows in row_tiles_aligned(job.m, K::MR, K::ROW_ALIGN) {
            // SAFETY: forwarded from this function's contract; `row_tiles` yields ranges of
            // at most `MR` rows inside `0..m`.
            unsafe { kern.tile(job, p, rows.start, rows.len()) };
        }
    }
}

/// Cuts `0..m` into the fewest row tiles of at most `mr` rows, of sizes that differ by at most
/// one: 13 rows are 7 + 6, not 8 + 5. A tile of few rows has few independent accumulator
/// chains and shares each weight vector with few rows, so it runs well below the rate of a
/// full one; evening the sizes keeps every tile near full whenever `m ≥ mr`. Each row's
/// result does not depend on its tile, so the bits do not change.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86 bodies walk row tiles themselves
pub(crate) fn row_tiles(m: usize, mr: usize) -> impl Iterator<Item = Range<usize>> {
    row_tiles_aligned(m, mr, 1)
}

/// [`row_tiles`] in units of `align` rows (`align` divides `mr`): every tile starts at a
/// multiple of `align`, and only the last may end elsewhere (at `m`). The units are evened out
/// as the rows are in [`row_tiles`]: 13 rows in tiles of up to 8, pairs aligned, are 6 + 7.
pub(crate) fn row_tiles_aligned(
    m: usize,
    mr: usize,
    align: usize,
) -> impl Iterator<Item = Range<usize>> {
    debug_assert!(align >= 1 && mr.is_multiple_of(align));
    let units = m.div_ceil(align);
    let tiles = units.div_ceil(mr / align);
    (0..tiles).map(move |t| {
        let start = t * units / tiles * align;
        let end = ((t + 1) * units / tiles * align).min(m);
        start..end
    })
}

/// W8A8 counterpart of [`w4a8_panels`].
///
/// # Safety
/// - As [`W8A8PanelsFn`], with `kern` proving the ISA.
#[inline(always)]
pub(crate) unsafe fn w8a8_panels<K: W8A8Microkernel>(
    kern: K,
    job: &W8A8Job<'_>,
    panels: Range<usize>,
) {
    debug_assert!(job.w.k_pad().is_multiple_of(K::KC_ALIGN));
    let mut p = panels.start;
    while p < panels.end {
        let pair = K::NP == 2 && p + 1 < panels.end;
        for rows in row_tiles_aligned(job.m, K::MR, K::ROW_ALIGN) {
            if pair {
                // SAFETY: forwarded from this function's contract for panels `p` and
                // `p + 1 < panels.end`; `row_tiles` yields ranges of at most `MR` rows inside
                // `0..m`.
                unsafe { kern.pair_tile(job, p, rows.start, rows.len()) };
            } else {
                // SAFETY: as above, for panel `p`.
                unsafe { kern.tile(job, p, rows.start, rows.len()) };
            }
        }
        p += if pair { 2 } else { 1 };
    }
}

/// Checks, at compile time in the tile macros, that a rung instantiates its tile for the row
/// counts `1, 2, ..., mr` in order, so that a walk's `match` on the row count is total.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) const fn assert_rows_one_to(rows: &[usize], mr: usize) {
    assert!(
        rows.len() == mr,
        "one tile instantiation per row count 1..=MR"
    );
    let mut i = 0;
    while i < rows.len() {
        assert!(
            rows[i] == i + 1,
            "tile row counts are 1, 2, ..., MR in order"
        );
        i += 1;
    }
}

/// The per-rung glue around a rung's tile bodies, written once: the [`W4A8Microkernel`] and
/// [`W8A8Microkernel`] impls for the rung's token, which turn the runtime row count `mr` into
/// the const-generic tile (`w4a8_tile::<R, ACC>`, `w8a8_tile::<R>`), and the two entry points
/// `w4a8_entry`/`w8a8_entry` ([`W4A8PanelsFn`]/[`W8A8PanelsFn`]) that rebuild the token and walk
/// the panels.
///
/// The invoking module provides the tile bodies (unsafe fns with the row-tile contract of
/// [`W4A8Microkernel::tile`]) and names its token, a description of its CPU features for the
/// entries' docs, its tile height `MR`, optionally the alignment of its tiles' first rows
/// (`row_align`, [`W4A8Microkernel::ROW_ALIGN`]), and the row counts `1..=MR` (checked at
/// compile time) its tiles are instantiated for.
macro_rules! impl_microkernels {
    (
        token: $token:ty,
        features: $features:literal,
        mr: $mr:expr,
        $(row_align: $align:expr,)?
        rows: [$($n:literal)+],
        w4a8_tile: $w4a8_tile:ident,
        $(w4a8_pair_tile: $w4a8_pair:ident for [$($pn:literal)+] from_k $pair_k:expr,)?
        w8a8_tile: $w8a8_tile:ident
        $(, w8a8_pair_tile: $w8a8_pair:ident)? $(,)?
    ) => {
        // Every row count `1..=MR` has a tile instantiation, so `tile` never reaches the
        // `unreachable!` arm for a valid `mr`.
        const _: () = $crate::ukernel::assert_rows_one_to(&[$($n),+], $mr);

        impl $crate::ukernel::W4A8Microkernel for $token {
            const MR: usize = $mr;
            $(const ROW_ALIGN: usize = $align;)?

            #[inline(always)]
            unsafe fn tile(
                self,
                job: &$crate::ukernel::W4A8Job<'_>,
                p: usize,
                m0: usize,
                mr: usize,
            ) {
                let acc = matches!(job.out, $crate::ukernel::W4A8Out::BlockAcc { .. });
                match (mr, acc) {
                    $(
                        // SAFETY: `self` is this rung's token, so the CPU has the features the
                        // tile body is compiled for; the output contract is forwarded from our
                        // caller, and `mr` is the tile's row count.
                        ($n, true) => unsafe { $w4a8_tile::<$n, true>(job, p, m0) },
                        // SAFETY: as above.
                        ($n, false) => unsafe { $w4a8_tile::<$n, false>(job, p, m0) },
                    )+
                    _ => unreachable!("tile rows out of range"),
                }
            }
            $(
            const PAIR_MAX_ROWS: usize = {
                const ROWS: &[usize] = &[$($pn),+];
                $crate::ukernel::assert_rows_one_to(ROWS, ROWS.len());
                assert!(ROWS.len() <= $mr);
                ROWS.len()
            };
            const PAIR_MIN_K: usize = $pair_k;

            #[inline(always)]
            unsafe fn pair_tile(
                self,
                job: &$crate::ukernel::W4A8Job<'_>,
                p: usize,
                m0: usize,
                mr: usize,
            ) {
                let acc = matches!(job.out, $crate::ukernel::W4A8Out::BlockAcc { .. });
                match (mr, acc) {
                    $(
                        // SAFETY: `self` is this rung's token, so the CPU has the features the
                        // tile body is compiled for; the output contract is forwarded from our
                        // caller for both panels, and `mr` is the tile's row count.
                        ($pn, true) => unsafe { $w4a8_pair::<$pn, true>(job, p, m0) },
                        // SAFETY: as above.
                        ($pn, false) => unsafe { $w4a8_pair::<$pn, false>(job, p, m0) },
                    )+
                    _ => unreachable!("pair tile rows out of range"),
                }
            }
            )?
        }

        impl $crate::ukernel::W8A8Microkernel for $token {
            const MR: usize = $mr;
            $(const ROW_ALIGN: usize = $align;)?

            #[inline(always)]
            unsafe fn tile(
                self,
                job: &$crate::ukernel::W8A8Job<'_>,
                p: usize,
                m0: usize,
                mr: usize,
            ) {
                $crate::ukernel::w8a8_tile_for_rows!($w8a8_tile, mr, job, p, m0; $($n)+)
            }
            $crate::ukernel::w8a8_pair_methods!($($w8a8_pair)?; $($n)+);
        }

        /// The W4A8 entry point of this rung.
        ///
        /// # Safety
        #[doc = concat!(
            "- [`crate::ukernel::W4A8PanelsFn`]'s contract, including ", $features, " support."
        )]
        pub(crate) unsafe fn w4a8_entry(
            job: &$crate::ukernel::W4A8Job<'_>,
            panels: ::std::ops::Range<usize>,
        ) {
            // SAFETY: the caller guarantees the CPU features (the `KernelSet` holding this
            // entry was built from the token).
            let token = unsafe { <$token>::new_unchecked() };
            // SAFETY: the job contract is forwarded from our caller.
            unsafe { $crate::ukernel::w4a8_panels(token, job, panels) }
        }

        /// The W8A8 entry point of this rung.
        ///
        /// # Safety
        #[doc = concat!(
            "- [`crate::ukernel::W8A8PanelsFn`]'s contract, including ", $features, " support."
        )]
        pub(crate) unsafe fn w8a8_entry(
            job: &$crate::ukernel::W8A8Job<'_>,
            panels: ::std::ops::Range<usize>,
        ) {
            // SAFETY: the caller guarantees the CPU features (the `KernelSet` holding this
            // entry was built from the token).
            let token = unsafe { <$token>::new_unchecked() };
            // SAFETY: the job contract is forwarded from our caller.
            unsafe { $crate::ukernel::w8a8_panels(token, job, panels) }
        }
    };
}

pub(crate) use impl_microkernels;

/// The two-panel items of a [`W8A8Microkernel`] impl made by [`impl_microkernels!`]: nothing
/// for a rung without a two-panel tile, else `NP = 2` and [`W8A8Microkernel::pair_tile`] over
/// the rung's row counts.
macro_rules! w8a8_pair_methods {
    (; $($n:literal)+) => {};
    ($pair:ident; $($n:literal)+) => {
        const NP: usize = 2;

        #[inline(always)]
        unsafe fn pair_tile(
            self,
            job: &$crate::ukernel::W8A8Job<'_>,
            p: usize,
            m0: usize,
            mr: usize,
        ) {
            $crate::ukernel::w8a8_tile_for_rows!($pair, mr, job, p, m0; $($n)+)
        }
    };
}

pub(crate) use w8a8_pair_methods;

/// Calls the W8A8 tile body `$tile::<R>(job, p, m0)` whose `R` is the runtime row count `mr`,
/// one of the rung's row counts `$n` (the body of [`W8A8Microkernel::tile`] and
/// [`W8A8Microkernel::pair_tile`] in [`impl_microkernels!`]).
macro_rules! w8a8_tile_for_rows {
    ($tile:ident, $mr:expr, $job:expr, $p:expr, $m0:expr; $($n:literal)+) => {
        match $mr {
            $(
                // SAFETY: the method invoking this is called on the rung's token, so the CPU
                // has the features the tile body is compiled for; its output contract is
                // forwarded from its caller, and `mr` is the tile's row count.
                $n => unsafe { $tile::<$n>($job, $p, $m0) },
            )+
            _ => unreachable!("tile rows out of range"),
        }
    };
}

pub(crate) use w8a8_tile_for_rows;

/// The `kernel_set(token)` of a rung whose two entries (from [`impl_microkernels!`]) run on the
/// rung itself: `isa` names it, and `w4a8`/`w8a8` are the [`ActEncoding`] variants its entries
/// expect.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_macros)
)]
macro_rules! rung_kernel_set {
    (
        doc: $doc:literal,
        token: $token:ty,
        isa: $isa:expr,
        w4a8: $w4a8_enc:ident,
        w8a8: $w8a8_enc:ident $(,)?
    ) => {
        #[doc = $doc]
        pub(crate) fn kernel_set(_token: $token) -> $crate::KernelSet {
            use $crate::ukernel::ActEncoding;
            let w4a8 = (
                $isa,
                ActEncoding::$w4a8_enc,
                w4a8_entry as $crate::ukernel::W4A8PanelsFn,
            );
            let w8a8 = (
                $isa,
                ActEncoding::$w8a8_enc,
                w8a8_entry as $crate::ukernel::W8A8PanelsFn,
            );
            // SAFETY: the token proves this rung's CPU features, all its two entries need.
            unsafe { $crate::KernelSet::from_entries($isa, w4a8, w8a8) }
        }
    };
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_imports)
)]
pub(crate) use rung_kernel_set;

#[cfg(test)]
mod tests {
    use super::{row_tiles, row_tiles_aligned};

    #[test]
    fn aligned_row_tiles_start_on_units_and_cover_the_rows_evenly() {
        assert_eq!(
            row_tiles_aligned(13, 8, 2).collect::<Vec<_>>(),
            [0..6, 6..13]
        );
        assert_eq!(
            row_tiles_aligned(15, 8, 2).collect::<Vec<_>>(),
            [0..8, 8..15]
        );
        assert_eq!(
            row_tiles_aligned(1, 8, 2).collect::<Vec<_>>(),
            vec![std::ops::Range { start: 0, end: 1 }]
        );
        for align in [1, 2, 4] {
            for mr in [align, 2 * align, 8] {
                for m in 0..100 {
                    let tiles: Vec<_> = row_tiles_aligned(m, mr, align).collect();
                    assert_eq!(tiles.len(), m.div_ceil(align).div_ceil(mr / align));
                    let mut next = 0;
                    for t in &tiles {
                        assert_eq!(t.start, next);
                        assert!(t.start.is_multiple_of(align), "m {m} mr {mr}: {t:?}");
                        assert!(!t.is_empty() && t.len() <= mr, "m {m} mr {mr}: {t:?}");
                        next = t.end;
                    }
                    assert_eq!(next, m);
                }
            }
        }
    }

    #[test]
    fn row_tiles_cover_the_rows_in_the_fewest_even_tiles() {
        assert_eq!(row_tiles(0, 8).count(), 0);
        assert_eq!(
            row_tiles(13, 8).map(|r| r.len()).collect::<Vec<_>>(),
            [6, 7]
        );
        for mr in 1..=8 {
            for m in 0..100 {
                let tiles: Vec<_> = row_tiles(m, mr).collect();
                assert_eq!(tiles.len(), m.div_ceil(mr), "m {m} mr {mr}");
                let mut next = 0;
                for t in &tiles {
                    assert_eq!(t.start, next);
                    assert!(!t.is_empty() && t.len() <= mr, "m {m} mr {mr}: {t:?}");
                    next = t.end;
                }
                assert_eq!(next, m);
                let (lo, hi) = tiles.iter().fold((usize::MAX, 0), |(lo, hi), t| {
                    (lo.min(t.len()), hi.max(t.len()))
                });
                assert!(tiles.is_empty() || hi - lo <= 1, "m {m} mr {mr}");
            }
        }
    }
}
