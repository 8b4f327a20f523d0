//! What the W4A8 and W8A8 tile bodies share: the 2 × 2 tile blocking, the tile configuration,
//! the aligned staging buffers, and the steps that move activation rows into A tiles and C
//! tiles out to memory.
//!
//! One step covers a row group of up to [`GROUP_ROWS`] rows (two A tiles of 16 rows) and a
//! panel pair of up to [`PAIR`] channels (two B tiles of 16 channels): four C tiles, so every
//! loaded A tile serves two products and every loaded B tile two. The live tile counts `NA`
//! and `NB` (1 or 2) are const parameters, so each body is compiled once per shape and no tile
//! instruction sits behind a runtime branch on its register number.

use std::arch::x86_64::{
    __m512, __mmask16, _MM_HINT_T0, _mm_prefetch, _mm512_add_ps, _mm512_loadu_ps,
    _mm512_mask_storeu_ps,
};
use std::ops::Range;

use super::tiles::{TILE_MAX_COLSB, TILE_MAX_ROWS, TileConfig, TileUnit};
use crate::aligned::AlignedVec;
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

/// The encoded activation rows of one GEMM.
#[derive(Clone, Copy)]
pub(crate) struct ARows<'a> {
    /// Encoded activations, `[m][k_pad]`.
    pub a: &'a [u8],
    /// Rows.
    pub m: usize,
    /// Row stride (`k_pad`).
    pub k_pad: usize,
}

/// The activation rows of one GEMM re-laid as whole A tiles: for row tile `t` (rows
/// `16t..16t + 16`) and chunk `c`, 16 rows of `chunk` bytes at stride `chunk`, the tiles of one
/// row tile in chunk order. A tile then loads from one contiguous block (the activation rows
/// themselves are `k_pad` bytes apart, which for K a multiple of 4096 puts all 16 rows of a
/// tile in one L1 set), rows past `m` and bytes past a chunk's data need no staging, and the
/// K walk of a row group reads two sequential streams. The driver makes the copy once per
/// GEMM ([`tile_rows`]); every panel range reads it.
#[derive(Clone, Copy)]
pub(crate) struct TiledA<'a> {
    /// The tiles, `[tile][chunk][16][chunk]` bytes.
    bytes: &'a [u8],
    /// Bytes per tile row.
    chunk: usize,
    /// Chunks per row tile.
    n_chunks: usize,
}

/// Sizes `dst` for `m` rows of `n_chunks` chunks of `chunk` bytes and returns it, with
/// whatever it held before (no pass over the bytes: the fills write what the tiles read).
pub(crate) fn tiles_for(
    dst: &mut AlignedVec<u8>,
    m: usize,
    chunk: usize,
    n_chunks: usize,
) -> &mut [u8] {
    let len = tiles_len(m, chunk, n_chunks);
    dst.grow_to(len);
    &mut dst[..len]
}

/// Bytes of the [`TiledA`] tiles of `m` rows in `n_chunks` chunks of `chunk` bytes: whole row
/// tiles, so the rows past `m` of the last one count.
pub(crate) fn tiles_len(m: usize, chunk: usize, n_chunks: usize) -> usize {
    m.div_ceil(TILE_ROWS) * n_chunks * TILE_ROWS * chunk
}

/// Re-lays `src` into `dst` as [`TiledA`] tiles of chunks of `chunk` bytes; chunk `c` starts at
/// K value `starts(c).0` and holds `starts(c).1 ≤ chunk` values of data. `dst` only grows, so
/// the calls stop allocating once the largest GEMM is seen.
pub(crate) fn tile_rows(
    src: ARows<'_>,
    chunk: usize,
    n_chunks: usize,
    starts: impl Fn(usize) -> (usize, usize),
    dst: &mut AlignedVec<u8>,
) {
    let tile_bytes = TILE_ROWS * chunk;
    let bytes = tiles_for(dst, src.m, chunk, n_chunks);
    if n_chunks == 0 {
        return;
    }
    for (t, tile_row) in bytes.chunks_exact_mut(n_chunks * tile_bytes).enumerate() {
        for (c, block) in tile_row.chunks_exact_mut(tile_bytes).enumerate() {
            let (k0, len) = starts(c);
            for (r, dst) in block.chunks_exact_mut(chunk).enumerate() {
                let row = t * TILE_ROWS + r;
                if row >= src.m {
                    break;
                }
                let at = row * src.k_pad + k0;
                copy_row_chunk(&mut dst[..len], &src.a[at..at + len]);
            }
        }
    }
}

/// Copies one row's chunk: whole 64- and 32-byte chunks, all but the ragged ones, as
/// fixed-size copies the compiler turns into a few vector moves, the rest through
/// `copy_from_slice` (a `memmove` call per chunk cost several per cent of a W8A8 call).
#[inline]
fn copy_row_chunk(dst: &mut [u8], src: &[u8]) {
    if !copy_fixed::<64>(dst, src) && !copy_fixed::<32>(dst, src) {
        dst.copy_from_slice(src);
    }
}

/// Copies `src` into `dst` when both are `N` bytes long; says whether it did.
#[inline]
fn copy_fixed<const N: usize>(dst: &mut [u8], src: &[u8]) -> bool {
    match (<&mut [u8; N]>::try_from(dst), <&[u8; N]>::try_from(src)) {
        (Ok(d), Ok(s)) => {
            *d = *s;
            true
        }
        _ => false,
    }
}

impl<'a> TiledA<'a> {
    /// The view of `bytes`, made by [`tile_rows`] for `m` rows, `chunk` and `n_chunks`.
    pub(crate) fn new(bytes: &'a [u8], m: usize, chunk: usize, n_chunks: usize) -> Self {
        let len = m.div_ceil(TILE_ROWS) * n_chunks * TILE_ROWS * chunk;
        assert!(bytes.len() >= len, "tiled activations of another shape");
        Self {
            bytes: &bytes[..len],
            chunk,
            n_chunks,
        }
    }

    /// The first byte of tile (`t`, `c`).
    fn tile(&self, t: usize, c: usize) -> *const u8 {
        let tile_bytes = TILE_ROWS * self.chunk;
        let at = (t * self.n_chunks + c) * tile_bytes;
        self.bytes[at..at + tile_bytes].as_ptr()
    }

    /// The first byte of chunk `c` of row `r`.
    pub(crate) fn row(&self, r: usize, c: usize) -> *const u8 {
        self.tile(r / TILE_ROWS, c)
            .wrapping_add((r % TILE_ROWS) * self.chunk)
    }
}

/// Loads the live A tiles of the row group starting at row tile `t` for chunk `c`.
///
/// # Safety
/// - The unit is configured with [`tile_config`]`(a.chunk)`, `a` was filled for this GEMM, `c`
///   is one of its chunks and row tile `t + NA − 1` exists.
#[inline(always)]
pub(crate) unsafe fn load_a_live<U: TileUnit, const NA: usize>(
    unit: &mut U,
    a: &TiledA<'_>,
    t: usize,
    c: usize,
) {
    // SAFETY: `tile` checks that 16 rows of `chunk` bytes exist at stride `chunk`; the unit is
    // configured for that chunk (our contract).
    unsafe { unit.load::<A0>(a.tile(t, c), a.chunk) };
    if NA == 2 {
        // SAFETY: as above, for the next row tile, which exists (our contract).
        unsafe { unit.load::<A1>(a.tile(t + 1, c), a.chunk) };
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

/// Prefetches into L1 the `chunk / 4` 64-byte rows of the live B tiles at `b[j]`: the first
/// row group over a panel pair reads its weights from memory, and with the tile loads alone
/// too few of their lines are in flight to cover the memory's latency. A prefetch never
/// faults, so addresses past the weights are harmless.
#[inline(always)]
pub(crate) fn prefetch_b_live<const NB: usize>(b: [*const u8; 2], rows: usize) {
    for panel in &b[..NB] {
        for r in 0..rows {
            let line = panel.wrapping_add(r * TILE_MAX_COLSB);
            // SAFETY: a prefetch reads nothing architecturally and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast()) };
        }
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

/// `C(a, b) += A(a)·B(b)` for the live tiles, A's bytes signed and B's unsigned.
///
/// # Safety
/// - As [`dpbusd_live`].
#[inline(always)]
pub(crate) unsafe fn dpbsud_live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
    // SAFETY: as in `dpbusd_live`; likewise below.
    unsafe { unit.dpbsud::<C00, A0, B0>() };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbsud::<C01, A0, B1>() };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbsud::<C10, A1, B0>() };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.dpbsud::<C11, A1, B1>() };
        }
    }
}

/// `C(a, b) += A(a)·B(b)` in bf16 pairs for the live tiles.
///
/// # Safety
/// - As [`dpbusd_live`], and the CPU has AMX-BF16.
#[inline(always)]
pub(crate) unsafe fn dpbf16_live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
    // SAFETY: `tile_config(64)` shapes C 16 × 64, A 16 × 64 and B 16 × 64, so every product's
    // shapes agree, and the CPU has AMX-BF16 (our contract); likewise below.
    unsafe { unit.dpbf16ps::<C00, A0, B0>() };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbf16ps::<C01, A0, B1>() };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.dpbf16ps::<C10, A1, B0>() };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.dpbf16ps::<C11, A1, B1>() };
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

/// Loads the live C tiles back from `acc`, where [`store_live`] put them: the sums of a walk
/// that resumes over more of K.
///
/// # Safety
/// - The unit is configured with [`tile_config`].
#[inline(always)]
pub(crate) unsafe fn load_c_live<U: TileUnit, const NA: usize, const NB: usize>(
    unit: &mut U,
    acc: &AccBuf,
) {
    let stride = PAIR * 4;
    let base: *const u8 = acc.0.as_ptr().cast();
    let at = |a: usize, b: usize| base.wrapping_add(a * TILE_ROWS * stride + b * PANEL * 4);
    // SAFETY: `at(a, b)` starts 16 rows of 64 readable bytes at stride `stride` inside `acc`;
    // C tiles are 16 × 64 (our contract); likewise below.
    unsafe { unit.load::<C00>(at(0, 0), stride) };
    if NB == 2 {
        // SAFETY: as above.
        unsafe { unit.load::<C01>(at(0, 1), stride) };
    }
    if NA == 2 {
        // SAFETY: as above.
        unsafe { unit.load::<C10>(at(1, 0), stride) };
        if NB == 2 {
            // SAFETY: as above.
            unsafe { unit.load::<C11>(at(1, 1), stride) };
        }
    }
}

/// Which tile product a body accumulates with.
pub(crate) trait TileProduct {
    /// `C(a, b) += A(a)·B(b)` for the live tiles.
    ///
    /// # Safety
    /// - As [`dpbusd_live`], and the CPU has the product's instruction.
    unsafe fn live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U);
}

/// `tdpbf16ps`: bf16 pairs into f32 sums.
pub(crate) struct Bf16Pairs;

impl TileProduct for Bf16Pairs {
    #[inline(always)]
    unsafe fn live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
        // SAFETY: forwarded contract.
        unsafe { dpbf16_live::<U, NA, NB>(unit) }
    }
}

/// `tdpbsud`: signed A bytes times unsigned B bytes into int32 sums.
pub(crate) struct SignedBytes;

impl TileProduct for SignedBytes {
    #[inline(always)]
    unsafe fn live<U: TileUnit, const NA: usize, const NB: usize>(unit: &mut U) {
        // SAFETY: forwarded contract.
        unsafe { dpbsud_live::<U, NA, NB>(unit) }
    }
}

/// B rows a body decoded for a span of a panel pair's chunks.
pub(crate) trait DecodedSpan {
    /// The first of the 16 B rows (64 bytes apart) of chunk `c` of the pair's panel `j`.
    fn chunk_rows(&self, j: usize, c: usize) -> *const u8;
}

/// What one item of a walk over decoded spans reads: the span's B rows, the activation tiles,
/// the row group's first A tile and the chunks of the item's block of K.
pub(crate) struct SpanTiles<'a, S> {
    pub(crate) span: &'a S,
    pub(crate) a: &'a TiledA<'a>,
    pub(crate) t: usize,
    pub(crate) chunks: Range<usize>,
}

/// Zeroes the C tiles, accumulates the item's chunks with product `P` for A tiles `t..t + NA`
/// (two when `two_a`) and the pair's `nb` panels, and stores the C tiles into `buf`: one branch
/// on the shape per item, none per tile instruction.
///
/// # Safety
/// - `unit` can run `P` and is configured with [`tile_config`] for 64-byte A and B rows;
///   `tiles.a` holds A tiles `t..t + 2` (`t..t + 1` unless `two_a`) of every chunk and
///   `tiles.span` the B rows of the item's chunks of `nb` (1 or 2) panels.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn span_tiles<U: TileUnit, P: TileProduct, S: DecodedSpan>(
    unit: &mut U,
    tiles: SpanTiles<'_, S>,
    (two_a, nb): (bool, usize),
    buf: &mut AccBuf,
) {
    match (two_a, nb == 2) {
        // SAFETY: our contract, for the shape the item has; likewise below.
        (false, false) => unsafe { span_tiles_shaped::<U, P, S, 1, 1>(unit, tiles, buf) },
        // SAFETY: as above.
        (false, true) => unsafe { span_tiles_shaped::<U, P, S, 1, 2>(unit, tiles, buf) },
        // SAFETY: as above.
        (true, false) => unsafe { span_tiles_shaped::<U, P, S, 2, 1>(unit, tiles, buf) },
        // SAFETY: as above.
        (true, true) => unsafe { span_tiles_shaped::<U, P, S, 2, 2>(unit, tiles, buf) },
    }
}

/// [`span_tiles`] for `NA` A tiles and `NB` panels.
///
/// # Safety
/// - As [`span_tiles`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn span_tiles_shaped<
    U: TileUnit,
    P: TileProduct,
    S: DecodedSpan,
    const NA: usize,
    const NB: usize,
>(
    unit: &mut U,
    tiles: SpanTiles<'_, S>,
    buf: &mut AccBuf,
) {
    let SpanTiles { span, a, t, chunks } = tiles;
    // SAFETY: for this and the tile calls below, the unit is configured with 64-byte A and B
    // rows, `a` holds A tiles `t..t + NA` of every chunk, `chunk_rows` points at 16 rows of
    // the decoded span (our contract).
    unsafe { zero_live::<U, NA, NB>(unit) };
    for c in chunks {
        // SAFETY: see above.
        unsafe { load_a_live::<U, NA>(unit, a, t, c) };
        let b_rows = [span.chunk_rows(0, c), span.chunk_rows(NB - 1, c)];
        // SAFETY: see above.
        unsafe { load_b_live::<U, NB>(unit, b_rows) };
        // SAFETY: see above.
        unsafe { P::live::<U, NA, NB>(unit) };
    }
    // SAFETY: see above.
    unsafe { store_live::<U, NA, NB>(unit, buf) };
}

/// Writes rows `row0..row0 + rows` of panel `p` of an `[m][ld]` f32 output: `y(r)` plus the
/// bias for row `row0 + r`, the channels past `n` masked out.
///
/// # Safety
/// - Rows `row0..row0 + rows` and channels `16p..min(16p + 16, n)` of `out` are valid for
///   writes and owned by the caller meanwhile.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn write_panel_rows(
    out: (*mut f32, usize),
    n: usize,
    (row0, rows): (usize, usize),
    p: usize,
    bias: Option<&[f32]>,
    y: impl Fn(usize) -> __m512,
) {
    let (ptr, ld) = out;
    let valid = PANEL.min(n - p * PANEL);
    let keep: __mmask16 = if valid == PANEL { !0 } else { (1 << valid) - 1 };
    // SAFETY: a present bias slice holds 16 readable f32; unaligned load.
    let bias = bias.map(|b| unsafe { _mm512_loadu_ps(b[..PANEL].as_ptr()) });
    for r in 0..rows {
        let mut v = y(r);
        if let Some(bias) = bias {
            v = _mm512_add_ps(v, bias);
        }
        let dst = ptr.wrapping_add((row0 + r) * ld + p * PANEL);
        // SAFETY: row `row0 + r` and the masked-in channels are the caller's (our contract);
        // masked-out lanes are not accessed.
        unsafe { _mm512_mask_storeu_ps(dst, keep, v) };
    }
}

/// Where one row group's walk over a pair stands between the K blocks of a walk that goes
/// over K in several blocks (the bf16 and W8A8 steps).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum KBlock {
    /// All of K in one go: zero the C tiles, run every chunk, write the output.
    Whole,
    /// The first block: zero the C tiles, park them in the row group's buffer.
    First,
    /// A block between: reload the parked tiles, park them again.
    Middle,
    /// The last block: reload the parked tiles, write the output.
    Last,
}

impl KBlock {
    /// The place of the block of chunks `chunks` in a walk over `n_chunks`.
    pub(crate) fn of(chunks: &Range<usize>, n_chunks: usize) -> Self {
        match (chunks.start == 0, chunks.end >= n_chunks) {
            (true, true) => Self::Whole,
            (true, false) => Self::First,
            (false, false) => Self::Middle,
            (false, true) => Self::Last,
        }
    }
}
