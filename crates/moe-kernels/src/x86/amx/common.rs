//! What the W4A8 and W8A8 tile bodies share: the 2 × 2 tile blocking, the tile configuration,
//! the aligned staging buffers, and the steps that move activation rows into A tiles and C
//! tiles out to memory.
//!
//! One step covers a row group of up to [`GROUP_ROWS`] rows (two A tiles of 16 rows) and a
//! panel pair of up to [`PAIR`] channels (two B tiles of 16 channels): four C tiles, so every
//! loaded A tile serves two products and every loaded B tile two. The live tile counts `NA`
//! and `NB` (1 or 2) are const parameters, so each body is compiled once per shape and no tile
//! instruction sits behind a runtime branch on its register number.

use super::tiles::{TILE_MAX_COLSB, TILE_MAX_ROWS, TileConfig, TileUnit};
use crate::packed::PANEL;

/// Rows per A and C tile.
pub(crate) const TILE_ROWS: usize = TILE_MAX_ROWS;
/// Rows per row group: two A tiles.
pub(crate) const GROUP_ROWS: usize = 2 * TILE_ROWS;
/// Channels per panel pair: two B tiles.
pub(crate) const PAIR: usize = 2 * PANEL;

/// C tile of row half `a` and panel `b` is register `2a + b`.
pub(crate) const C00: u8 = 0;
/// See [`C00`].
pub(crate) const C01: u8 = 1;
/// See [`C00`].
pub(crate) const C10: u8 = 2;
/// See [`C00`].
pub(crate) const C11: u8 = 3;
/// A tile of the first 16 rows of a group.
pub(crate) const A0: u8 = 4;
/// A tile of the second 16 rows of a group.
pub(crate) const A1: u8 = 5;
/// B tile of the first panel of a pair.
pub(crate) const B0: u8 = 6;
/// B tile of the second panel of a pair.
pub(crate) const B1: u8 = 7;

/// One 64-byte tile row, aligned so that a slice of them is a tile-loadable block.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Row64(pub(crate) [u8; TILE_MAX_COLSB]);

impl Row64 {
    pub(crate) const ZERO: Self = Self([0; TILE_MAX_COLSB]);
}

/// A 64-byte aligned tile-sized buffer (16 rows × 64 bytes).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct TileBuf(pub(crate) [[u8; TILE_MAX_COLSB]; TILE_MAX_ROWS]);

impl TileBuf {
    pub(crate) fn zeroed() -> Self {
        Self([[0; TILE_MAX_COLSB]; TILE_MAX_ROWS])
    }
}

/// The int32 results of one step's C tiles, `[GROUP_ROWS][PAIR]`: C tile `(a, b)` fills rows
/// `16a..16a + 16`, channels `16b..16b + 16`. 64-byte aligned.
#[repr(C, align(64))]
pub(crate) struct AccBuf(pub(crate) [[i32; PAIR]; GROUP_ROWS]);

impl AccBuf {
    pub(crate) fn zeroed() -> Self {
        Self([[0; PAIR]; GROUP_ROWS])
    }
}

/// The configuration for K chunks of `chunk` bytes (a multiple of 4, at most 64): C tiles
/// 16 × 64 bytes, A tiles 16 × `chunk`, B tiles `chunk / 4` × 64.
pub(crate) fn tile_config(chunk: usize) -> TileConfig {
    let c_shape = (TILE_ROWS, 4 * PANEL);
    [C00, C01, C10, C11]
        .into_iter()
        .fold(TileConfig::new(), |cfg, t| {
            cfg.with_tile(t, c_shape.0, c_shape.1)
        })
        .with_tile(A0, TILE_ROWS, chunk)
        .with_tile(A1, TILE_ROWS, chunk)
        .with_tile(B0, chunk / 4, 4 * PANEL)
        .with_tile(B1, chunk / 4, 4 * PANEL)
}

/// The encoded activation rows of one GEMM and the chunk the A tiles are configured for.
#[derive(Clone, Copy)]
pub(crate) struct ARows<'a> {
    /// Encoded activations, `[m][k_pad]`.
    pub a: &'a [u8],
    /// Rows.
    pub m: usize,
    /// Row stride (`k_pad`).
    pub k_pad: usize,
    /// The configured chunk length.
    pub chunk: usize,
}

/// Loads A tile `T` with rows `row0..row0 + 16` and K values `k0..k0 + chunk`: straight from
/// the activation rows when all 16 rows exist and the chunk lies inside them, otherwise
/// through `pad`. Padded rows and bytes are stale but harmless: the B rows past a chunk's data
/// are zero, and C rows past `m` are never read.
///
/// # Safety
/// - The unit is configured with [`tile_config`]`(src.chunk)`; `T` is [`A0`] or [`A1`];
///   `row0 < src.m` and `k0 < src.k_pad`.
#[inline(always)]
pub(crate) unsafe fn load_a<U: TileUnit, const T: u8>(
    unit: &mut U,
    src: ARows<'_>,
    row0: usize,
    k0: usize,
    pad: &mut TileBuf,
) {
    let rows = TILE_ROWS.min(src.m - row0);
    if rows == TILE_ROWS && k0 + src.chunk <= src.k_pad {
        let block = &src.a[row0 * src.k_pad..(row0 + TILE_ROWS) * src.k_pad];
        // SAFETY: the tile reads 16 rows of `chunk` bytes at `k0 + r·k_pad`, inside `block`
        // because `k0 + chunk ≤ k_pad` (checked above); the unit is configured (our contract).
        unsafe { unit.load::<T>(block[k0..].as_ptr(), src.k_pad) };
    } else {
        let len = src.chunk.min(src.k_pad - k0);
        for r in 0..rows {
            let at = (row0 + r) * src.k_pad + k0;
            pad.0[r][..len].copy_from_slice(&src.a[at..at + len]);
        }
        // SAFETY: `pad` holds 16 rows of 64 readable bytes at stride 64; configured unit.
        unsafe { unit.load::<T>(pad.0.as_ptr().cast(), TILE_MAX_COLSB) };
    }
}

/// Loads the live A tiles of the row group at `row0` for the chunk at `k0`.
///
/// # Safety
/// - As [`load_a`], and `row0 + 16 < src.m` when `NA == 2`.
#[inline(always)]
pub(crate) unsafe fn load_a_live<U: TileUnit, const NA: usize>(
    unit: &mut U,
    src: ARows<'_>,
    row0: usize,
    k0: usize,
    pads: &mut [TileBuf; 2],
) {
    // SAFETY: forwarded contract.
    unsafe { load_a::<U, A0>(unit, src, row0, k0, &mut pads[0]) };
    if NA == 2 {
        // SAFETY: forwarded contract; the second half's first row exists.
        unsafe { load_a::<U, A1>(unit, src, row0 + TILE_ROWS, k0, &mut pads[1]) };
    }
}

/// Loads the live B tiles from `b[j]`, `chunk / 4` rows of 64 bytes each at stride 64.
///
/// # Safety
/// - The unit is configured with [`tile_config`]`(chunk)`, and each live `b[j]` points at
///   `chunk / 4` readable rows of 64 bytes.
#[inline(always)]
pub(crate) unsafe fn load_b_live<U: TileUnit, const NB: usize>(unit: &mut U, b: [*const u8; 2]) {
    // SAFETY: forwarded contract.
    unsafe { unit.load::<B0>(b[0], TILE_MAX_COLSB) };
    if NB == 2 {
        // SAFETY: forwarded contract.
        unsafe { unit.load::<B1>(b[1], TILE_MAX_COLSB) };
    }
}

/// `C(a, b) += A(a)·B(b)` for the live tiles.
///
/// # Safety
/// - The unit is configured with [`tile_config`], and the live A and B tiles are loaded.
#[inline(always)]
pub(crate) unsafe fn dpbusd_live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
    // SAFETY: `tile_config` shapes C 16 × 64, A 16 × chunk and B chunk/4 × 64, so every
    // product's shapes agree (our contract); the same holds for each call below.
    unsafe { unit.dpbusd::<C00, A0, B0>() };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbusd::<C01, A0, B1>() };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbusd::<C10, A1, B0>() };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.dpbusd::<C11, A1, B1>() };
        }
    }
}

/// Zeroes the live C tiles.
///
/// # Safety
/// - The unit is configured with [`tile_config`].
#[inline(always)]
pub(crate) unsafe fn zero_live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
    // SAFETY: C tiles are shaped by `tile_config` (our contract); likewise below.
    unsafe { unit.zero::<C00>() };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.zero::<C01>() };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.zero::<C10>() };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.zero::<C11>() };
        }
    }
}

/// Stores the live C tiles into `acc` (tile `(a, b)` to rows `16a..`, channels `16b..`).
///
/// # Safety
/// - The unit is configured with [`tile_config`].
#[inline(always)]
pub(crate) unsafe fn store_live<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    acc: &mut AccBuf,
) {
    let stride = PAIR * 4;
    let base: *mut u8 = acc.0.as_mut_ptr().cast();
    let at = |a: usize, b: usize| base.wrapping_add(a * TILE_ROWS * stride + b * PANEL * 4);
    // SAFETY: `at(a, b)` starts 16 rows of 64 writable bytes at stride `stride` inside `acc`,
    // which we borrow mutably; C tiles are 16 × 64 (our contract); likewise below.
    unsafe { unit.store::<C00>(at(0, 0), stride) };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.store::<C01>(at(0, 1), stride) };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.store::<C10>(at(1, 0), stride) };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.store::<C11>(at(1, 1), stride) };
        }
    }
}
