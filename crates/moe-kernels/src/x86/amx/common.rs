//! What the W4A8 and W8A8 tile bodies share: the row-group geometry, the aligned staging
//! buffers, and the steps that move activation rows into the A tile and C tiles out to memory.
//!
//! One call handles up to [`MR`] rows of one 16-channel panel: `MR / 16` C tiles (registers
//! 0..=3), each 16 rows × 16 int32 channels, share every B tile (one K chunk of the panel's
//! weights), so a weight chunk is loaded once per 64 rows.

use super::tiles::{TILE_A, TILE_B, TILE_MAX_COLSB, TILE_MAX_ROWS, TileConfig, TileUnit};
use crate::packed::PANEL;

/// Rows per C tile.
pub(crate) const TILE_ROWS: usize = TILE_MAX_ROWS;
/// C tiles used at once.
pub(crate) const C_TILES: usize = 4;
/// Rows per call.
pub(crate) const MR: usize = TILE_ROWS * C_TILES;

/// A 64-byte aligned tile-sized buffer (16 rows × 64 bytes).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct TileBuf(pub(crate) [[u8; TILE_MAX_COLSB]; TILE_MAX_ROWS]);

impl TileBuf {
    pub(crate) fn zeroed() -> Self {
        Self([[0; TILE_MAX_COLSB]; TILE_MAX_ROWS])
    }
}

/// The int32 results of all C tiles of one call, `[MR][16]`, 64-byte aligned.
#[repr(C, align(64))]
pub(crate) struct AccBuf(pub(crate) [[i32; PANEL]; MR]);

impl AccBuf {
    pub(crate) fn zeroed() -> Self {
        Self([[0; PANEL]; MR])
    }
}

/// The configuration for K chunks of `chunk` bytes (a multiple of 4, at most 64): C tiles
/// 16 × 64 bytes, A 16 × `chunk`, B `chunk / 4` × 64.
pub(crate) fn tile_config(chunk: usize) -> TileConfig {
    let mut cfg = TileConfig::new();
    for c in 0..C_TILES as u8 {
        cfg = cfg.with_tile(c, TILE_ROWS, 4 * PANEL);
    }
    cfg.with_tile(TILE_A, TILE_ROWS, chunk)
        .with_tile(TILE_B, chunk / 4, 4 * PANEL)
}

/// The activation rows of one row group for one K chunk, as the A tile sees them.
pub(crate) struct ARows<'a> {
    /// Encoded activations, `[m][k_pad]`.
    pub a: &'a [u8],
    /// Row stride (`k_pad`).
    pub k_pad: usize,
    /// First row of the group.
    pub row0: usize,
    /// Valid rows in the group (1..=16).
    pub rows: usize,
    /// First K value of the chunk.
    pub k0: usize,
    /// Valid K values in the chunk (≤ the configured chunk).
    pub len: usize,
    /// The configured chunk length.
    pub chunk: usize,
}

/// Loads the A tile from `src`: straight from the activation rows when the group and chunk
/// are whole, otherwise through `pad` (rows past the group and bytes past `len` are stale but
/// harmless: their B rows are zero, their C rows are never read).
///
/// # Safety
/// - The unit is configured with [`tile_config`]`(src.chunk)`.
#[inline(always)]
pub(crate) unsafe fn load_a<U: TileUnit>(unit: &mut U, src: &ARows<'_>, pad: &mut TileBuf) {
    if src.rows == TILE_ROWS && src.len == src.chunk {
        let block = &src.a[src.row0 * src.k_pad..(src.row0 + TILE_ROWS) * src.k_pad];
        assert!(src.k0 + src.chunk <= src.k_pad);
        // SAFETY: the tile reads 16 rows of `chunk` bytes at `k0 + r·k_pad` inside `block`
        // (the bound is asserted above), and the unit is configured (caller contract).
        unsafe { unit.load::<TILE_A>(block[src.k0..].as_ptr(), src.k_pad) };
    } else {
        for r in 0..src.rows {
            let at = (src.row0 + r) * src.k_pad + src.k0;
            pad.0[r][..src.len].copy_from_slice(&src.a[at..at + src.len]);
        }
        // SAFETY: `pad` holds 16 rows of 64 readable bytes at stride 64, and the unit is
        // configured (caller contract).
        unsafe { unit.load::<TILE_A>(pad.0.as_ptr().cast(), TILE_MAX_COLSB) };
    }
}

/// `C[g] += A·B` for C tile `g < C_TILES`.
///
/// # Safety
/// - The unit is configured with [`tile_config`], and A and B are loaded.
#[inline(always)]
pub(crate) unsafe fn dpbusd_into<U: TileUnit>(unit: &mut U, g: usize) {
    // Every arm: the shapes of `tile_config` agree for each C tile (caller contract).
    match g {
        // SAFETY: C tile 0, per the comment above the match.
        0 => unsafe { unit.dpbusd::<0, TILE_A, TILE_B>() },
        // SAFETY: C tile 1, per the comment above the match.
        1 => unsafe { unit.dpbusd::<1, TILE_A, TILE_B>() },
        // SAFETY: C tile 2, per the comment above the match.
        2 => unsafe { unit.dpbusd::<2, TILE_A, TILE_B>() },
        // SAFETY: C tile 3, per the comment above the match.
        3 => unsafe { unit.dpbusd::<3, TILE_A, TILE_B>() },
        _ => unreachable!("C tile index out of range"),
    }
}

/// Zeroes the first `groups` C tiles.
///
/// # Safety
/// - The unit is configured with [`tile_config`].
#[inline(always)]
pub(crate) unsafe fn zero_c<U: TileUnit>(unit: &mut U, groups: usize) {
    // Every arm: C tiles 0..=3 are shaped by `tile_config` (caller contract).
    for g in 0..groups {
        match g {
            // SAFETY: C tile 0, per the comment above the match.
            0 => unsafe { unit.zero::<0>() },
            // SAFETY: C tile 1, per the comment above the match.
            1 => unsafe { unit.zero::<1>() },
            // SAFETY: C tile 2, per the comment above the match.
            2 => unsafe { unit.zero::<2>() },
            // SAFETY: C tile 3, per the comment above the match.
            3 => unsafe { unit.zero::<3>() },
            _ => unreachable!("C tile index out of range"),
        }
    }
}

/// Stores the first `groups` C tiles into `acc` (group `g` to rows `16g..16g + 16`).
///
/// # Safety
/// - The unit is configured with [`tile_config`].
#[inline(always)]
pub(crate) unsafe fn store_c<U: TileUnit>(unit: &mut U, groups: usize, acc: &mut AccBuf) {
    for g in 0..groups {
        let dst: *mut u8 = acc.0[g * TILE_ROWS..].as_mut_ptr().cast();
        let stride = 4 * PANEL;
        // Every arm: `dst` starts 16 rows of 64 writable bytes inside `acc`, which we
        // borrow mutably; tile `g` is shaped 16 × 64 by `tile_config` (caller contract).
        match g {
            // SAFETY: C tile 0, per the comment above the match.
            0 => unsafe { unit.store::<0>(dst, stride) },
            // SAFETY: C tile 1, per the comment above the match.
            1 => unsafe { unit.store::<1>(dst, stride) },
            // SAFETY: C tile 2, per the comment above the match.
            2 => unsafe { unit.store::<2>(dst, stride) },
            // SAFETY: C tile 3, per the comment above the match.
            3 => unsafe { unit.store::<3>(dst, stride) },
            _ => unreachable!("C tile index out of range"),
        }
    }
}
