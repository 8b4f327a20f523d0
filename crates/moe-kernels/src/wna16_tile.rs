//! The scaffolding of the f32 WNA16 tile bodies, written once: the group loop, the walk over
//! a group's packed steps with `C` partial-sum chains, the ragged end of K, the group epilogue
//! and the store. A rung's file keeps only what differs, its vector type and how it decodes
//! codes, and invokes [`wna16_f32_tiles!`] with its `#[target_feature]` list (a macro rather
//! than a generic, so that every helper is compiled with the same features as the body and
//! inlines into it).
//!
//! The tile body computes rows `m0..m0 + R` of one panel (16 output channels), or of a window
//! of its channels where a rung's registers cannot hold the partial sums of all 16 for its
//! tallest tiles (the panel is then covered in passes). Per scale group it clears `C × R`
//! partial sums, adds `w_j · x[r][j]` for every K value `j` of the
//! group into chain `j mod C` of row `r` (so one multiply-add latency chain does not bound a
//! tile of few rows), then adds the chains and scales them into the row's accumulator. Weights
//! are decoded once per K value and serve every row of the tile. The accumulators live in
//! memory: they change once per group, and in registers they would crowd out the partial
//! sums of the inner loop.

use crate::packed::{PANEL, PackedWna16};

/// What the codes of a matrix stand for, as a const parameter of the tile bodies: integers
/// (int4 or int8, with or without zero points).
pub(crate) const INTEGER: u8 = 0;
/// See [`INTEGER`]: 4-bit e2m1 values (MXFP4).
pub(crate) const E2M1: u8 = 1;
/// See [`INTEGER`]: 8-bit e4m3 values (FP8).
pub(crate) const E4M3: u8 = 2;

/// The [`INTEGER`]/[`E2M1`]/[`E4M3`] kind of `w`'s codes.
pub(crate) fn code_kind(w: &PackedWna16) -> u8 {
    if w.is_e4m3() {
        E4M3
    } else if w.values() == crate::packed::wna16::Int4Values::E2m1 {
        E2M1
    } else {
        INTEGER
    }
}

/// Adds the bias (if any) to the sums of rows `m0..m0 + R` in channels `first..first + L` of
/// panel `p` and stores the channels that exist into `out` (`m·N`, row-major).
///
/// # Safety
/// - `out` is valid for writes of rows `m0..m0 + R` in those channels, which no other thread
///   writes meanwhile.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline]
pub(crate) unsafe fn store_rows<const R: usize, const L: usize>(
    w: &PackedWna16,
    out: *mut f32,
    p: usize,
    m0: usize,
    first: usize,
    acc: &mut [[f32; L]; R],
) {
    let bias = w.panel_bias(p).map(|b| &b[first..first + L]);
    // Channels that exist (`N` need not fill the last panel).
    let valid = L.min((w.n() - p * PANEL).saturating_sub(first));
    for (r, row) in acc.iter_mut().enumerate() {
        if let Some(b) = bias {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b;
            }
        }
        let dst = out.wrapping_add((m0 + r) * w.n() + p * PANEL + first);
        // SAFETY: channels `16p + first..16p + first + valid` (< N) of row `m0 + r` are
        // elements of the caller's output owned by this panel alone (our contract); the local
        // row does not overlap them.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst, valid) };
    }
}

/// Defines `tile::<BITS, R, C, KIND, ASYM>` (the body above, over a window of `lanes` of the
/// panel's 16 channels), `panels::<BITS, KIND, ASYM>` (its walk over row tiles of at most `mr`
/// rows, each in `16 / lanes` passes, `rows` naming the chains `C` of each row count) and the
/// entry `wna16_entry` ([`crate::wna16::Wna16PanelsFn`]) in the invoking module, compiled with
/// `features`.
///
/// The invoking module provides, each `#[target_feature]` with those features and `#[inline]`
/// (`first` is the window's first channel in the panel):
/// - `Ch`: `lanes` channels of f32, and `Step`: a loaded int4 step's window;
/// - `GroupConsts` and `group_consts::<KIND, ASYM>(w, p, g, first)`: what decoding group `g`
///   of panel `p` needs (its zero points, tables);
/// - `zero() -> Ch`, `add(Ch, Ch) -> Ch`, `fma(part, w, x: f32) -> Ch` (`part + w·x`, fused)
///   and `fma_at(part, w, xs: &[f32], j) -> Ch` (`part + w·xs[j]`, `j` a constant once
///   inlined, so a rung may multiply by a lane of `xs` loaded once for several `j`);
/// - `load_step::<KIND>(&[u32; 16], first) -> Step`, `prefetch_ahead(&[u32; 16])`;
/// - `decode4::<SHIFT, TOP, KIND, ASYM>(&Step, &GroupConsts) -> Ch`: K value `J` of an int4
///   step, `SHIFT = 4J` bringing its nibble to the bottom of the lane and `TOP = 28 − 4J` to
///   the top; `decode4_at::<KIND, ASYM>(&Step, j, &GroupConsts)` for a `j` known at run time;
/// - `decode8::<KIND, ASYM>(&[u32; 16], j, first, &GroupConsts) -> Ch`: K value `j` of an
///   8-bit step, and `e4m3_sum(Ch) -> Ch`: a group's sum of e4m3 products as the value's
///   sum (a rung whose decode yields e4m3 values times a power of two restores it here, once
///   per group, instead of once per K value);
/// - `load_scales(w, p, g, first) -> Ch`: the window's scales of group `g` of panel `p`, and
///   `scale_into(&mut [f32; lanes], sum: Ch, scales: Ch)`: the accumulator row plus
///   `sum · scales`.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_macros)
)]
macro_rules! wna16_f32_tiles {
    (
        features: $features:literal,
        lanes: $lanes:expr,
        mr: $mr:expr,
        rows: [$($n:literal => $chains:literal),+ $(,)?] $(,)?
    ) => {
        /// Computes rows `m0..m0 + R` of channels `first..first + lanes` of panel `p` with `C`
        /// partial sums per row, for `BITS`-bit codes of kind `KIND` (zero points exactly when
        /// `ASYM`).
        ///
        /// # Safety
        /// - The job's output pointer is valid and exclusively ours for rows `m0..m0 + R` of
        ///   panel `p`; `m0 + R ≤ job.m`, `job.x` holds `m·K` values, and the codes are what
        ///   `BITS`, `KIND` and `ASYM` say.
        // Kept out of line: one function per row count, as the walk picks one per tile.
        #[target_feature(enable = $features)]
        #[inline(never)]
        unsafe fn tile<
            const BITS: u32,
            const R: usize,
            const C: usize,
            const KIND: u8,
            const ASYM: bool,
        >(
            job: &$crate::wna16::Wna16Job<'_>,
            p: usize,
            m0: usize,
            first: usize,
        ) {
            use $crate::packed::PANEL;
            use $crate::packed::wna16::{K_STEP, K_STEP8};
            let w = job.w;
            let (k, ks, ng, gs) = (w.k(), w.k_steps(), w.n_groups(), w.group_size());
            let (steps, _) = w.codes()[p * ks * PANEL..][..ks * PANEL].as_chunks::<PANEL>();
            let rows: [&[f32]; R] = ::std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
            // The rows' whole steps as fixed-size chunks, so the inner loop indexes them with
            // one bound check per row and step.
            let row_steps: [&[[f32; K_STEP]]; R] = ::std::array::from_fn(|r| rows[r].as_chunks().0);
            let row_steps8: [&[[f32; K_STEP8]]; R] =
                ::std::array::from_fn(|r| rows[r].as_chunks().0);
            // The rows' accumulators live in memory (see the scaffolding's docs).
            let mut acc = [[0f32; $lanes]; R];
            for g in 0..ng {
                let (k0, k1) = (g * gs, k.min((g + 1) * gs));
                let gc = group_consts::<KIND, ASYM>(w, p, g, first);
                let mut part = [[zero(); R]; C];
                if BITS == 4 {
                    // Group sizes are multiples of K_STEP, so `k0` starts a step.
                    let (s0, s_full) = (k0 / K_STEP, k1 / K_STEP);
                    for s in s0..s_full {
                        let step = &steps[s];
                        prefetch_ahead(step);
                        let v = load_step::<KIND>(step, first);
                        let xs: [&[f32; K_STEP]; R] = ::std::array::from_fn(|r| &row_steps[r][s]);
                        macro_rules! k_value {
                            ($j:literal) => {{
                                let wj = decode4::<{ 4 * $j }, { 28 - 4 * $j }, KIND, ASYM>(
                                    &v, &gc,
                                );
                                for r in 0..R {
                                    part[$j % C][r] = fma_at(part[$j % C][r], wj, xs[r], $j);
                                }
                            }};
                        }
                        k_value!(0);
                        k_value!(1);
                        k_value!(2);
                        k_value!(3);
                        k_value!(4);
                        k_value!(5);
                        k_value!(6);
                        k_value!(7);
                    }
                    // The last step of K, when K is not a multiple of K_STEP.
                    if s_full * K_STEP < k1 {
                        let v = load_step::<KIND>(&steps[s_full], first);
                        for kk in s_full * K_STEP..k1 {
                            let wj = decode4_at::<KIND, ASYM>(&v, kk % K_STEP, &gc);
                            for r in 0..R {
                                part[0][r] = fma(part[0][r], wj, rows[r][kk]);
                            }
                        }
                    }
                } else {
                    // Group sizes are multiples of 8, so `k0` starts a step.
                    let (s0, s_full) = (k0 / K_STEP8, k1 / K_STEP8);
                    for s in s0..s_full {
                        let step = &steps[s];
                        prefetch_ahead(step);
                        let xs: [&[f32; K_STEP8]; R] =
                            ::std::array::from_fn(|r| &row_steps8[r][s]);
                        macro_rules! k_value {
                            ($j:literal) => {{
                                let wj = decode8::<KIND, ASYM>(step, $j, first, &gc);
                                for r in 0..R {
                                    part[$j % C][r] = fma_at(part[$j % C][r], wj, xs[r], $j);
                                }
                            }};
                        }
                        k_value!(0);
                        k_value!(1);
                        k_value!(2);
                        k_value!(3);
                    }
                    for kk in s_full * K_STEP8..k1 {
                        let wj =
                            decode8::<KIND, ASYM>(&steps[s_full], kk % K_STEP8, first, &gc);
                        for r in 0..R {
                            part[0][r] = fma(part[0][r], wj, rows[r][kk]);
                        }
                    }
                }
                let scales = load_scales(w, p, g, first);
                for r in 0..R {
                    let mut sum = part[0][r];
                    for chain in &part[1..] {
                        sum = add(sum, chain[r]);
                    }
                    if KIND == $crate::wna16_tile::E4M3 {
                        sum = e4m3_sum(sum);
                    }
                    scale_into(&mut acc[r], sum, scales);
                }
                // Keeps the accumulators in memory rather than promoted to registers.
                ::std::hint::black_box(&mut acc);
            }
            // SAFETY: forwarded from our contract (rows `m0..m0 + R` of panel `p` are ours).
            unsafe { $crate::wna16_tile::store_rows(w, job.out, p, m0, first, &mut acc) };
        }

        /// Walks the row tiles of `panels`.
        ///
        /// # Safety
        /// - As [`crate::wna16::Wna16PanelsFn`], on a CPU with this rung's features, for
        ///   `BITS`-bit codes of kind `KIND` with zero points exactly when `ASYM`.
        #[target_feature(enable = $features)]
        unsafe fn panels<const BITS: u32, const KIND: u8, const ASYM: bool>(
            job: &$crate::wna16::Wna16Job<'_>,
            panels: ::std::ops::Range<usize>,
        ) {
            // Every row count `1..=MR` has a tile instantiation, so the match is total.
            const _: () = $crate::ukernel::assert_rows_one_to(&[$($n),+], $mr);
            const { assert!($crate::packed::PANEL % $lanes == 0, "windows tile the panel") };
            for p in panels {
                for rows in $crate::ukernel::row_tiles(job.m, $mr) {
                    let m0 = rows.start;
                    for first in (0..$crate::packed::PANEL).step_by($lanes) {
                        match rows.len() {
                            $(
                                // SAFETY: rows `m0..m0 + n` lie within `0..m`, panel `p` is
                                // ours (caller), and the caller's CPU has the features the
                                // tile needs.
                                $n => unsafe {
                                    tile::<BITS, $n, $chains, KIND, ASYM>(job, p, m0, first)
                                },
                            )+
                            _ => unreachable!("tile rows out of range"),
                        }
                    }
                }
            }
        }

        /// This rung's WNA16 entry: the instance of [`panels`] for the weights' codes.
        ///
        /// # Safety
        #[doc = concat!(
            "- [`crate::wna16::Wna16PanelsFn`]'s contract, including ", $features, " support."
        )]
        pub(crate) unsafe fn wna16_entry(
            job: &$crate::wna16::Wna16Job<'_>,
            range: ::std::ops::Range<usize>,
        ) {
            use $crate::wna16_tile::{E2M1, E4M3, INTEGER};
            let w = job.w;
            let walk: unsafe fn(&$crate::wna16::Wna16Job<'_>, ::std::ops::Range<usize>) =
                match ($crate::wna16_tile::code_kind(w), w.bits(), w.zeros().is_some()) {
                    (E4M3, _, _) => panels::<8, E4M3, false>,
                    (E2M1, _, _) => panels::<4, E2M1, false>,
                    (_, 4, false) => panels::<4, INTEGER, false>,
                    (_, 4, true) => panels::<4, INTEGER, true>,
                    (_, _, false) => panels::<8, INTEGER, false>,
                    (_, _, true) => panels::<8, INTEGER, true>,
                };
            // SAFETY: forwarded from the caller; the instance matches the weights' codes.
            unsafe { walk(job, range) }
        }
    };
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_imports)
)]
pub(crate) use wna16_f32_tiles;
