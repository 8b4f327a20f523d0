//! The AMX rung: AMX-INT8 tile kernels for the W4A8 and W8A8 GEMMs from [`min_rows`] rows
//! on, the AVX-512 VNNI kernels below (a few rows cannot fill the tiles, and decode is bound by
//! memory, not by MACs), and an optional bf16 tile path for int4 and e4m3 weights
//! (AMX-BF16).
//!
//! - `tiles.rs`: the tile unit (hardware `asm!`, and a test emulation of its semantics);
//! - `common.rs`: the 2 × 2 tile step (two A, two B, four C tiles), the activation tiles the
//!   driver makes once per GEMM, C tiles out to memory;
//! - `w4a8.rs`, `w8a8.rs`: the int8 tile bodies, with the AVX-512 epilogue of the lower rung so
//!   the outputs are bit-identical to the scalar reference;
//! - `bf16.rs`: the bf16 tile body (other numerics, chosen with `W4A8Prefill::Bf16Tiles`); its
//!   activation layout and dequantized panel pairs also feed the AVX-512 BF16 body
//!   (`x86/bf16dot.rs`);
//! - `int4.rs`: WNA16 codes decoded exactly onto the bf16 tiles, scaled per group in f32, for
//!   calls with no more rows than the group size; `byte_codes.rs` decodes its 8-bit codes.
//! - `int4_i15.rs`: WNA16 int4 codes as bytes on the int8 tiles against the 15-bit integer
//!   activations of the integer body, whose outputs it equals bit for bit.
//!
//! Each entry configures the tiles once (`ldtilecfg`), walks its panels in pairs and each pair's
//! rows in groups of 32, and releases the tile state before returning, so no tile state leaks
//! into the caller's thread. Detection and the Linux permission request live in `x86/mod.rs`.
//!
//! The tests run the same bodies on the emulated unit (the rung tests' set "amx bodies on
//! emulated tiles"); on an AMX machine they also run on the hardware.

pub(crate) mod bf16;
mod byte_codes;
pub(crate) mod common;
mod int4;
mod int4_i15;
pub(crate) mod probe;
mod tiles;
mod w4a8;
mod w4a8_channel;
mod w8a8;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::OnceLock;

use super::Amx;
use super::requant::ChannelPair;
use crate::Isa;
use crate::aligned::AlignedVec;
use crate::dispatch::{Bf16MinRows, W4A8MinRows};
use crate::ukernel::{ActEncoding, W4A8Job, W4A8PanelsFn, W4Bf16Job, W8A8Job, W8A8PanelsFn};
use crate::wna16::Int4DotJob;
use bf16::{WideBf16Pair, bf16_step};
use common::{AccBuf, GROUP_ROWS, KBlock, TILE_ROWS, TileBuf, TiledA, tile_config};
use int4::{CodePair, RowAccs, int4_pair};
use tiles::{HwTiles, TileUnit};
use w4a8::{AccF, BatchAccs, W4A8Step, WidePair, w4a8_step};
use w4a8_channel::channel_step;
use w8a8::{PanelPair, w8a8_step};

/// Rows per call (rows per expert, in the fused pipeline) from which the W4A8 tiles take over
/// unless `MOE_KERNELS_AMX_MIN_M` says otherwise, by scale block. Measured on one core with
/// AMX-INT8: with groups of 32 the int8 tiles run at the AVX-512 VNNI kernel's rate at 16 rows
/// and 1.3× faster at 64 (the per-block epilogue, not the tile unit, bounds them); both rungs
/// interleaved call by call on two cores, every token on all 8 experts of 2048 × 768: groups
/// of 32 at 0.93-0.94× the VNNI kernel's time at 24 rows, 1.05-1.10× at 28, 1.12-1.21× at 32;
/// groups of 128 at 0.96-1.00× at 16 and 20 rows, 1.08-1.09× at 24, 1.23× at 28.
pub(crate) const DEFAULT_AMX_MIN_ROWS_W4A8: W4A8MinRows = W4A8MinRows {
    short_blocks: 32,
    long_blocks: 24,
};

/// The same for W4A8 under `W4A8Prefill::ChannelInt8`, whose tiles hold their sums over all of
/// K once each panel pair is requantised. Both rungs interleaved call by call on two cores,
/// every token on all 8 experts of 2048 × 768, groups of 32: the VNNI kernel's time over the
/// tiles' 0.62-0.63 at 8 rows, 0.89-0.94 at 12, 0.98-1.02 at 16, 1.13-1.17 at 24, 1.40-1.44 at
/// 32.
pub(crate) const DEFAULT_AMX_MIN_ROWS_W4A8_CHANNEL: usize = 20;

/// The same for W8A8, whose tiles hold their sums over all of K: 1.3× faster than AVX-512
/// VNNI at 16 rows on the same machine.
pub(crate) const DEFAULT_AMX_MIN_ROWS_W8A8: usize = 16;

/// The environment variable that overrides every threshold (read once).
pub(crate) const AMX_MIN_ROWS_ENV: &str = "MOE_KERNELS_AMX_MIN_M";

/// The one threshold `MOE_KERNELS_AMX_MIN_M` sets, if it does (read once).
fn min_rows_set() -> Option<usize> {
    static MIN: OnceLock<Option<usize>> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var(AMX_MIN_ROWS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map(|v| v.max(1))
    })
}

/// Rows from which the AMX rung runs its W4A8 and W8A8 tile kernels.
pub(crate) fn min_rows() -> (W4A8MinRows, usize) {
    match min_rows_set() {
        Some(v) => (W4A8MinRows::all(v), v),
        None => (DEFAULT_AMX_MIN_ROWS_W4A8, DEFAULT_AMX_MIN_ROWS_W8A8),
    }
}

/// Rows from which the AMX rung runs its W4A8 tiles on weights requantised per channel.
fn channel_min_rows() -> usize {
    min_rows_set().unwrap_or(DEFAULT_AMX_MIN_ROWS_W4A8_CHANNEL)
}

/// Runs `$step::<U, NA, NB>` for a row group of `$rows` rows and a pair of `$nb` panels: one
/// branch per step, none per tile instruction.
macro_rules! live_shape {
    ($rows:expr, $nb:expr, $step:ident::<$u:ty>($($arg:expr),* $(,)?)) => {
        match ($rows > TILE_ROWS, $nb == 2) {
            (false, false) => $step::<$u, 1, 1>($($arg),*),
            (false, true) => $step::<$u, 1, 2>($($arg),*),
            (true, false) => $step::<$u, 2, 1>($($arg),*),
            (true, true) => $step::<$u, 2, 2>($($arg),*),
        }
    };
}

thread_local! {
    /// Each thread's widened panel pair and tiled activations, kept between calls so
    /// steady-state calls do not allocate.
    static WIDE: RefCell<(WidePair, Vec<AccF>)> = RefCell::new(Default::default());
    /// The same for the bf16 path, with the C tiles its walk in K blocks parks between blocks.
    static WIDE_BF16: RefCell<(WideBf16Pair, Vec<AccBuf>)> = RefCell::new(Default::default());
    /// The same for the int4 codes decoded exactly.
    static CODES: RefCell<(CodePair, RowAccs)> = RefCell::new(Default::default());
    /// The same for the int4 codes as bytes against 15-bit integer activations.
    static CODE_BYTES: RefCell<(int4_i15::BytePair, int4_i15::RowAccs)> =
        RefCell::new(Default::default());
    /// The same for the codes requantised per channel.
    static CHANNEL: RefCell<ChannelPair> = RefCell::new(ChannelPair::default());
    /// The C tiles the W8A8 walk in K blocks parks between blocks.
    static PARKED_W8A8: RefCell<Vec<AccBuf>> = const { RefCell::new(Vec::new()) };
}

/// Scale blocks per K block of the W4A8 walk over `m` rows of `w` with A chunks of `chunk`
/// bytes ([`k_block_units`] on the row tiles of A).
///
/// Blocks of up to 32 values keep one walk over all of K: their per-block tile stores and
/// epilogue bound them, not where A comes from. One core, 256 rows, blocks on and off
/// alternated in one process: groups of 128 at 4096 × 14336 ran at 410-429 against 345-357
/// G MAC/s per core, groups of 32 at 190 both ways there and 203 against 212 at 14336 × 4096.
fn w4a8_block_blocks(m: usize, w: &crate::PackedW4A8, chunk: usize) -> usize {
    let (n_chunks, _) = w4a8::chunks(w);
    let n_blocks = w.n_blocks().max(1);
    if w4a8::corr_in_tile(w.block_len()) {
        return n_blocks;
    }
    let per_block = n_chunks.div_ceil(n_blocks).max(1);
    k_block_units(m.next_multiple_of(TILE_ROWS) * chunk, per_block, n_blocks)
}

/// Walks `panels` in pairs, widening each pair once and running every row group of the call
/// over it, on a configured unit it releases at the end. When the activations are too long to
/// stay in L2 ([`w4a8_block_blocks`]), K goes in blocks of scale blocks, every pair over one
/// block of K before the next, each row group's f32 sums parked in memory in between: the
/// blocks still add in K order, so the outputs keep their bits.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/VNNI and `unit` can run tile instructions;
/// - the job satisfies [`W4A8PanelsFn`]'s contract.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w4a8_panels<U: TileUnit>(unit: &mut U, job: &W4A8Job<'_>, panels: Range<usize>) {
    let chunk = w4a8::chunk_len(job.w.block_len());
    // SAFETY: `cfg` comes from `tile_config`, whose shapes are legal.
    unsafe { unit.configure(&tile_config(chunk)) };
    let mut accs: BatchAccs = std::array::from_fn(|_| std::array::from_fn(|_| AccBuf::zeroed()));
    let (n_chunks, _) = w4a8::chunks(job.w);
    let a = TiledA::new(job.a_tiles, job.m, chunk, n_chunks);
    let n_blocks = job.w.n_blocks();
    let block = w4a8_block_blocks(job.m, job.w, chunk);
    let groups = job.m.div_ceil(GROUP_ROWS);
    WIDE.with_borrow_mut(|(wide, parked)| {
        if block < n_blocks {
            let slots = panels.len().div_ceil(2) * groups;
            if parked.len() < slots {
                parked.resize(
                    slots,
                    [[std::arch::x86_64::_mm512_setzero_ps(); 2]; GROUP_ROWS],
                );
            }
        }
        for b0 in (0..n_blocks.max(1)).step_by(block) {
            let blocks = b0..n_blocks.min(b0 + block);
            for (pair, p) in panels.clone().step_by(2).enumerate() {
                let nb = 2.min(panels.end - p);
                wide.fill(job.w, (p, nb), chunk, blocks.clone());
                for (g, row0) in (0..job.m).step_by(GROUP_ROWS).enumerate() {
                    let rows = GROUP_ROWS.min(job.m - row0);
                    let step = W4A8Step {
                        wide,
                        p,
                        a,
                        row0,
                        accs: &mut accs,
                        blocks: blocks.clone(),
                        parked: (block < n_blocks).then(|| &mut parked[pair * groups + g]),
                    };
                    // SAFETY: the unit is configured for this matrix's chunk, `wide` was
                    // filled for this pair and blocks with it and `a` with this job's rows;
                    // a row group's parked sums are the ones its previous block of K left;
                    // the job contract is forwarded from our caller; `row0 < m` is a multiple
                    // of 16, and the shape has two row halves exactly when `row0 + 16 < m`.
                    unsafe { live_shape!(rows, nb, w4a8_step::<U>(unit, job, step)) };
                }
            }
        }
    });
    unit.release();
}

/// The K blocks of a tile walk over `n_chunks` chunks in blocks of `block`: each block's
/// chunks and its place in the walk ([`KBlock`]). A walk has at least one block, so a step
/// always runs and writes its rows.
fn k_blocks(n_chunks: usize, block: usize) -> impl Iterator<Item = (Range<usize>, KBlock)> {
    let block = block.max(1);
    (0..n_chunks.max(1)).step_by(block).map(move |k0| {
        let chunks = k0..n_chunks.min(k0 + block);
        let place = KBlock::of(&chunks, n_chunks);
        (chunks, place)
    })
}

/// Grows `parked` to one C-tile buffer per row group (`groups` per pair) of each panel pair of
/// `panels`, for a walk that goes over K in several blocks.
fn reserve_parked(parked: &mut Vec<AccBuf>, panels: &Range<usize>, groups: usize) {
    let slots = panels.len().div_ceil(2) * groups;
    if parked.len() < slots {
        parked.resize_with(slots, AccBuf::zeroed);
    }
}

/// Where a row group keeps its C tiles in block `place` of a walk: `whole` when the walk is one
/// block, else slot `slot` of `parked`.
fn row_group_acc<'a>(
    place: KBlock,
    whole: &'a mut AccBuf,
    parked: &'a mut [AccBuf],
    slot: usize,
) -> &'a mut AccBuf {
    match place {
        KBlock::Whole => whole,
        _ => &mut parked[slot],
    }
}

/// Chunks per K block of the W8A8 walk over `m` rows and `n_chunks` chunks ([`k_block_units`]
/// on the row tiles of A and a pair's B rows).
fn w8a8_block_chunks(m: usize, n_chunks: usize) -> usize {
    // A chunk's A tiles for every row tile, and its 16 B rows of 64 bytes for each panel.
    let per_chunk = m.next_multiple_of(TILE_ROWS) * w8a8::CHUNK + 2 * 16 * 64;
    k_block_units(per_chunk, 1, n_chunks)
}

/// W8A8 counterpart of [`w4a8_panels`]; the packed panels need no widening.
///
/// When the activations are too long to stay in L2 ([`w8a8_block_chunks`]), K goes in blocks
/// as in the bf16 walk ([`w4bf16_panels`]): every pair of the range over one block, each row
/// group's C tiles parked in memory in between.
///
/// # Safety
/// - As [`w4a8_panels`], with [`W8A8PanelsFn`]'s contract.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w8a8_panels<U: TileUnit>(unit: &mut U, job: &W8A8Job<'_>, panels: Range<usize>) {
    // SAFETY: `tile_config` shapes are legal.
    unsafe { unit.configure(&tile_config(w8a8::CHUNK)) };
    let mut acc = AccBuf::zeroed();
    let mut tails: w8a8::Tails = [TileBuf::zeroed(), TileBuf::zeroed()];
    let (n_chunks, _) = w8a8::chunks(job.w.k_pad());
    let a = TiledA::new(job.a_tiles, job.m, w8a8::CHUNK, n_chunks);
    let block = w8a8_block_chunks(job.m, n_chunks);
    let groups = job.m.div_ceil(GROUP_ROWS);
    PARKED_W8A8.with_borrow_mut(|parked| {
        if block < n_chunks {
            reserve_parked(parked, &panels, groups);
        }
        for (chunks, kb) in k_blocks(n_chunks, block) {
            for (pair_index, p) in panels.clone().step_by(2).enumerate() {
                let nb = 2.min(panels.end - p);
                let pair = PanelPair::new(job.w, p, nb, &mut tails);
                for (g, row0) in (0..job.m).step_by(GROUP_ROWS).enumerate() {
                    let rows = GROUP_ROWS.min(job.m - row0);
                    let acc = row_group_acc(kb, &mut acc, parked, pair_index * groups + g);
                    // SAFETY: configured unit, `a` views this job's tiled rows; a row group's
                    // parked tiles are the ones its previous block stored; job contract
                    // forwarded; `row0 < m` is a multiple of 16, and the shape has two row
                    // halves exactly when `row0 + 16 < m`.
                    unsafe {
                        live_shape!(
                            rows,
                            nb,
                            w8a8_step::<U>(unit, job, &pair, &a, row0, chunks.clone(), kb, acc)
                        )
                    };
                }
            }
        }
    });
    unit.release();
}

/// The per-channel counterpart of [`w4a8_panels`] (`W4A8Prefill::ChannelInt8`): each panel pair
/// requantised to int8 once, C tiles held over all of K.
///
/// # Safety
/// - As [`w4a8_panels`], with the rows laid out by [`channel_tile_a`] and values as the job's
///   output.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn w4a8_channel_panels<U: TileUnit>(unit: &mut U, job: &W4A8Job<'_>, panels: Range<usize>) {
    // SAFETY: `tile_config` shapes are legal.
    unsafe { unit.configure(&tile_config(w8a8::CHUNK)) };
    let mut acc = AccBuf::zeroed();
    let (n_chunks, _) = w8a8::chunks(job.w.k_pad());
    let a = TiledA::new(job.a_tiles, job.m, w8a8::CHUNK, n_chunks);
    CHANNEL.with_borrow_mut(|pair| {
        let mut p = panels.start;
        while p < panels.end {
            let nb = 2.min(panels.end - p);
            pair.fill::<false>(job.w, p, nb);
            let mut row0 = 0;
            while row0 < job.m {
                let rows = GROUP_ROWS.min(job.m - row0);
                let pair = (&*pair, p);
                // SAFETY: the unit is configured for 64-byte chunks, `pair` was filled for
                // these panels and `a` views this job's rows in the W8A8 layout; the job
                // contract is forwarded; `row0 < m` is a multiple of 16, and the shape has two
                // row halves exactly when `row0 + 16 < m`.
                unsafe {
                    live_shape!(
                        rows,
                        nb,
                        channel_step::<U>(unit, job, pair, &a, row0, &mut acc)
                    )
                };
                row0 += rows;
            }
            p += nb;
        }
    });
    unit.release();
}

/// The per-channel body's activation layout: the W8A8 body's 64-byte chunks of the same
/// encoded rows (the driver's hook).
fn channel_tile_a(
    a: &[u8],
    _corr: &[i32],
    m: usize,
    w: &crate::PackedW4A8,
    dst: &mut AlignedVec<u8>,
) {
    w8a8::tile_a(a, m, w.k_pad(), dst);
}

/// Bytes of activation tiles (and B rows, for the bf16 walk) that one K block of a tile walk
/// reads: about half of an L2, so that they stay there while every pair of the call passes
/// over the block. One
/// core, 256 rows of int4 g128 weights on the one-block walk: 442 G MAC/s at K = 2048 (768 KiB
/// of activation tiles and a 128 KiB pair), 306 at K = 4096 and 190 at K = 14336 (7 MiB of
/// tiles, which every pair then read again from the L3).
const K_BLOCK_BYTES: usize = 1 << 20;

/// Fewest chunks per K block: the parked C tiles' stores and loads then cost at most about a
/// sixteenth of the block's products.
const K_BLOCK_MIN_CHUNKS: usize = 16;

#[cfg(test)]
thread_local! {
    /// A smaller [`K_BLOCK_BYTES`] on this thread, so that tests walk small GEMMs in blocks.
    static K_BLOCK_BYTES_FOR_TESTS: std::cell::Cell<Option<usize>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `run` (which fills `len` outputs) once on one walk over K, then once per budget of
/// `budgets` (bytes a K block may read, on this thread), and returns the first budget whose
/// walk in blocks gave other bits, if any.
#[cfg(test)]
pub(crate) fn budget_changing_bits(
    len: usize,
    budgets: impl IntoIterator<Item = usize>,
    run: impl Fn(&mut [f32]),
) -> Option<usize> {
    let mut whole = vec![f32::NAN; len];
    run(&mut whole);
    budgets.into_iter().find(|&bytes| {
        K_BLOCK_BYTES_FOR_TESTS.with(|b| b.set(Some(bytes)));
        let mut blocked = vec![f32::NAN; len];
        run(&mut blocked);
        K_BLOCK_BYTES_FOR_TESTS.with(|b| b.set(None));
        whole
            .iter()
            .zip(&blocked)
            .any(|(a, b)| a.to_bits() != b.to_bits())
    })
}

/// The bytes a K block may read and the fewest chunks it covers (tests may shrink both).
fn block_budget() -> (usize, usize) {
    #[cfg(test)]
    if let Some(bytes) = K_BLOCK_BYTES_FOR_TESTS.with(|b| b.get()) {
        return (bytes, 1);
    }
    (K_BLOCK_BYTES, K_BLOCK_MIN_CHUNKS)
}

/// Units per K block of a tile walk that reads `chunk_bytes` per chunk of 32 values, a unit
/// being `per_unit` chunks (one chunk, a scale group or a scale block) and K holding `units`:
/// all of them when they fit [`K_BLOCK_BYTES`], else as many whole units as fit, but at least
/// [`K_BLOCK_MIN_CHUNKS`] chunks' worth.
fn k_block_units(chunk_bytes: usize, per_unit: usize, units: usize) -> usize {
    let (budget, least) = block_budget();
    let unit_bytes = chunk_bytes.saturating_mul(per_unit.max(1));
    if unit_bytes.saturating_mul(units) <= budget {
        units
    } else {
        (budget / unit_bytes.max(1))
            .max(least.div_ceil(per_unit.max(1)))
            .clamp(1, units.max(1))
    }
}

/// Chunks per K block of the bf16 walk over `m` rows and `n_chunks` chunks
/// ([`k_block_units`] on the row tiles of A and a pair's B rows).
fn bf16_block_chunks(m: usize, n_chunks: usize) -> usize {
    // A chunk's A tiles for every row tile, and its 16 B rows of 64 bytes for each panel.
    let per_chunk = m.next_multiple_of(TILE_ROWS) * bf16::CHUNK_BYTES + 2 * 16 * 64;
    k_block_units(per_chunk, 1, n_chunks)
}

/// The bf16 counterpart of [`w4a8_panels`]: activations rounded to bf16 once per call, each
/// panel pair dequantized to bf16 once, C tiles held over all of K.
///
/// When the activations are too long to stay in L2 ([`bf16_block_chunks`]), K goes in blocks:
/// every pair of the range over one block (its weights dequantized for that block only), then
/// the next block, each row group's C tiles parked in memory in between, so that the block's
/// activation tiles are read from L2 by every pair instead of from memory.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/BF16 and `unit` can run AMX-BF16 tile instructions;
/// - the job satisfies [`crate::ukernel::W4Bf16PanelsFn`]'s contract.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn w4bf16_panels<U: TileUnit>(unit: &mut U, job: &W4Bf16Job<'_>, panels: Range<usize>) {
    // SAFETY: `tile_config` shapes are legal.
    unsafe { unit.configure(&tile_config(bf16::CHUNK_BYTES)) };
    let mut acc = AccBuf::zeroed();
    let n_chunks = job.w.k().div_ceil(bf16::CHUNK_K);
    let a = TiledA::new(job.a_tiles, job.m, bf16::CHUNK_BYTES, n_chunks);
    let block = bf16_block_chunks(job.m, n_chunks);
    let groups = job.m.div_ceil(GROUP_ROWS);
    WIDE_BF16.with_borrow_mut(|(wide, parked)| {
        let a = &a;
        if block < n_chunks {
            reserve_parked(parked, &panels, groups);
        }
        for (chunks, kb) in k_blocks(n_chunks, block) {
            for (pair, p) in panels.clone().step_by(2).enumerate() {
                let nb = 2.min(panels.end - p);
                wide.fill(job.w, p, nb, chunks.clone());
                for (g, row0) in (0..job.m).step_by(GROUP_ROWS).enumerate() {
                    let rows = GROUP_ROWS.min(job.m - row0);
                    let acc = row_group_acc(kb, &mut acc, parked, pair * groups + g);
                    // SAFETY: configured unit with 64-byte rows, `a` and `wide` filled for
                    // this job, pair and chunks; a row group's parked tiles are the ones its
                    // previous block stored; the job contract (AMX-BF16 included) is
                    // forwarded; `row0 < m` is a multiple of 16, and the shape has two row
                    // halves exactly when `row0 + 16 < m`.
                    unsafe {
                        live_shape!(
                            rows,
                            nb,
                            bf16_step::<U>(unit, job, wide, a, (p, row0), chunks.clone(), kb, acc)
                        )
                    };
                }
            }
        }
    });
    unit.release();
}

/// Scale groups per K block of the int4 walk over `m` rows of `w` ([`k_block_units`] on the
/// row tiles of A; the decoded codes of a span stay in L1 anyway).
fn int4_block_groups(m: usize, w: &crate::PackedWna16) -> usize {
    let per_chunk = m.next_multiple_of(TILE_ROWS) * bf16::CHUNK_BYTES;
    k_block_units(per_chunk, int4::chunks_per_group(w), w.n_groups())
}

/// The exactly decoded int4 counterpart of [`w4bf16_panels`]: each panel pair's codes decoded
/// to bf16 a few scale groups at a time, C tiles stored and scaled once per scale group
/// (`int4.rs`). When the activations are too long to stay in L2 ([`int4_block_groups`]), K
/// goes in blocks of groups, every pair over one block before the next, each pair's row
/// accumulators kept in memory in between.
///
/// # Safety
/// - The CPU has AVX-512 F/BW and `unit` can run AMX-BF16 tile instructions;
/// - the job satisfies [`crate::wna16::Int4DotPanelsFn`]'s contract, its activations laid out
///   by [`int4::fill`], and [`int4::serves`] holds for its weights and rows.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int4_panels<U: TileUnit>(unit: &mut U, job: &Int4DotJob<'_>, panels: Range<usize>) {
    // SAFETY: `tile_config` shapes are legal.
    unsafe { unit.configure(&tile_config(bf16::CHUNK_BYTES)) };
    let mut bufs = [AccBuf::zeroed(), AccBuf::zeroed()];
    let n_chunks = job.w.k().div_ceil(bf16::CHUNK_K);
    let a = TiledA::new(job.pairs, job.m, bf16::CHUNK_BYTES, n_chunks);
    let ng = job.w.n_groups();
    let block = int4_block_groups(job.m, job.w);
    // One set of row accumulators per pair when the pairs take turns over the blocks.
    let sets = if block < ng {
        panels.len().div_ceil(2)
    } else {
        1
    };
    CODES.with_borrow_mut(|(codes, accs)| {
        accs.resize(sets * job.m, [std::arch::x86_64::_mm512_setzero_ps(); 2]);
        for g0 in (0..ng).step_by(block) {
            let groups = g0..ng.min(g0 + block);
            for (pair, p) in panels.clone().step_by(2).enumerate() {
                let nb = 2.min(panels.end - p);
                let set = &mut accs[(pair % sets) * job.m..][..job.m];
                // SAFETY: the unit is configured with 64-byte rows and `a` is filled for this
                // job; the job contract (AMX-BF16 and `serves` included) is forwarded for the
                // pair; `groups` lies in `0..ng`, and `set` holds the pair's sums over the
                // groups before it (the blocks go in K order, each over every pair).
                unsafe {
                    int4_pair::<U>(
                        unit,
                        job,
                        (codes, &a),
                        (p, nb),
                        groups.clone(),
                        &mut bufs,
                        set,
                    )
                };
            }
        }
    });
    unit.release();
}

/// Bytes the int4 byte-code body's activation layout takes for `rows` rows of K values `k`.
pub(crate) fn i15_tile_layout_bytes(k: usize, rows: usize) -> usize {
    int4_i15::layout_bytes(k, rows)
}

/// The int4 byte-code walk (`int4_i15.rs`) on `unit` with this thread's buffers.
///
/// # Safety
/// - As [`int4_i15::panels`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn int4_i15_panels<U: TileUnit>(unit: &mut U, job: &Int4DotJob<'_>, panels: Range<usize>) {
    CODE_BYTES.with_borrow_mut(|(codes, accs)| {
        // SAFETY: our contract.
        unsafe { int4_i15::panels(unit, job, panels, (codes, accs)) }
    });
}

/// The bf16 tile path's activation layout (the driver's hook).
///
/// # Safety
/// - The CPU has AVX-512 F/BW/BF16 (the set registers it only then).
unsafe fn bf16_tile_a(x: &[f32], m: usize, k: usize, dst: &mut AlignedVec<u8>) {
    // SAFETY: our contract.
    unsafe { bf16::fill_a(x, m, k, dst) }
}

/// The bf16 tile entry point.
///
/// # Safety
/// - [`crate::ukernel::W4Bf16PanelsFn`]'s contract, including AMX-BF16 and the tile permission.
unsafe fn w4bf16_entry(job: &W4Bf16Job<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token, and registers
    // it only where AMX-BF16 and AVX-512 BF16 are present.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: as above; the job contract is forwarded.
    unsafe { w4bf16_panels(&mut HwTiles::new(token), job, panels) }
}

/// The exactly decoded int4 entry point.
///
/// # Safety
/// - [`crate::wna16::Int4DotPanelsFn`]'s contract, including AMX-BF16 and the tile permission.
unsafe fn int4_entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token, and registers
    // it only where AMX-BF16 and AVX-512 BF16 are present.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: as above; the job contract is forwarded.
    unsafe { int4_panels(&mut HwTiles::new(token), job, panels) }
}

/// The int4 byte-code entry point.
///
/// # Safety
/// - [`crate::wna16::Int4DotPanelsFn`]'s contract, including AMX-INT8 and the tile
///   permission, the activations laid out by [`int4_i15::fill`].
unsafe fn int4_i15_entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: AMX implies AVX-512 F/BW; the job contract is forwarded.
    unsafe { int4_i15_panels(&mut HwTiles::new(token), job, panels) }
}

/// The W4A8 tile entry point.
///
/// # Safety
/// - [`W4A8PanelsFn`]'s contract, including AMX-INT8 support and the tile permission.
unsafe fn w4a8_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: AMX implies AVX-512 VNNI; the job contract is forwarded.
    unsafe { w4a8_panels(&mut HwTiles::new(token), job, panels) }
}

/// The per-channel W4A8 tile entry point.
///
/// # Safety
/// - [`W4A8PanelsFn`]'s contract, including AMX-INT8 support and the tile permission, with the
///   rows laid out by [`channel_tile_a`].
unsafe fn w4a8_channel_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: AMX implies AVX-512 VNNI; the job contract is forwarded.
    unsafe { w4a8_channel_panels(&mut HwTiles::new(token), job, panels) }
}

/// The W8A8 tile entry point.
///
/// # Safety
/// - [`W8A8PanelsFn`]'s contract, including AMX-INT8 support and the tile permission.
unsafe fn w8a8_entry(job: &W8A8Job<'_>, panels: Range<usize>) {
    // SAFETY: the `KernelSet` holding this entry was built from the AMX token.
    let token = unsafe { Amx::new_unchecked() };
    // SAFETY: AMX implies AVX-512 VNNI; the job contract is forwarded.
    unsafe { w8a8_panels(&mut HwTiles::new(token), job, panels) }
}

/// The AVX-512 VNNI set recorded as the AMX rung, with the tile entries `int4` (W4A8) and
/// `int8` (W8A8) from `min` rows and their activation layouts.
///
/// # Safety
/// - Both entries may be called on this CPU.
unsafe fn with_tile_entries(
    token: super::Avx512Vnni,
    min: TileMinRows,
    (int4, int4_channel): (W4A8PanelsFn, W4A8PanelsFn),
    int8: W8A8PanelsFn,
) -> crate::KernelSet {
    let TileMinRows {
        w4a8: min_w4a8,
        w4a8_channel: min_channel,
        w8a8: min_w8a8,
    } = min;
    let min = (min_w4a8, min_w8a8);
    // Int4 WNA16 GEMMs keep the f32 body below the AMX-BF16 tiles' threshold: the AVX-512
    // BF16 dot-product body that the VNNI rung may run for them is not measured against the
    // tiles.
    let base = super::avx512vnni_kernel_set(token)
        .for_rung(Isa::Amx)
        .without_wna16_int4_dot();
    let int4 = (Isa::Amx, ActEncoding::U8Offset128, int4);
    let int8 = (Isa::Amx, ActEncoding::U8Offset128, int8);
    // SAFETY: our contract.
    let set = unsafe { base.with_large_m(min, int4, int8) };
    let set = set.with_large_m_layouts(
        (w4a8::tile_a, w4a8::tile_a_bytes),
        (w8a8::tile_a, w8a8::tile_a_bytes),
    );
    let channel = crate::dispatch::W4A8Kernel {
        isa: Isa::Amx,
        encoding: ActEncoding::U8Offset128,
        entry: int4_channel,
        tile_a: Some(channel_tile_a),
        tile_a_bytes: Some(w8a8::tile_a_bytes),
        pairs: false,
    };
    // SAFETY: our contract.
    unsafe { set.with_w4a8_channel(channel, min_channel) }
}

/// Rows from which each tile kernel of the rung takes over.
#[derive(Clone, Copy)]
struct TileMinRows {
    w4a8: W4A8MinRows,
    w4a8_channel: usize,
    w8a8: usize,
}

impl TileMinRows {
    /// The rung's thresholds, or the one `MOE_KERNELS_AMX_MIN_M` sets.
    fn dispatched() -> Self {
        let (w4a8, w8a8) = min_rows();
        Self {
            w4a8,
            w4a8_channel: channel_min_rows(),
            w8a8,
        }
    }

    /// Every tile kernel from `rows` rows.
    #[cfg(test)]
    fn all(rows: usize) -> Self {
        Self {
            w4a8: W4A8MinRows::all(rows),
            w4a8_channel: rows,
            w8a8: rows,
        }
    }
}

/// The kernels of the AMX rung: AVX-512 VNNI below [`min_rows`] rows, tiles from there.
pub(crate) fn kernel_set(token: Amx) -> crate::KernelSet {
    // SAFETY: the token proves AMX (and AVX-512 VNNI), all the tile entries need.
    let set = unsafe {
        with_tile_entries(
            token.avx512vnni(),
            TileMinRows::dispatched(),
            (w4a8_entry, w4a8_channel_entry),
            w8a8_entry,
        )
    };
    let byte_codes = i15_tile_rows();
    let set = if super::integer_wna16_on() {
        // SAFETY: the token proves AMX-INT8 and AVX-512 F/BW/VL/VNNI, all the body and its
        // layout need.
        unsafe {
            set.with_wna16_int4_dot(int4_i15::body(
                byte_codes.start,
                byte_codes.end,
                int4_i15_entry,
            ))
        }
    } else {
        set
    };
    if bf16_tiles_on() {
        // SAFETY: the token proves AMX; AMX-BF16 and AVX-512 BF16 were just checked.
        let set = unsafe {
            set.with_bf16_tiles("amx-bf16 tiles", bf16_min_rows(), w4bf16_entry, bf16_tile_a)
        };
        let tiles_from = bf16_min_rows().wna16;
        // SAFETY: as above.
        let set = unsafe { set.with_wna16_int4_dot(int4::body(tiles_from, int4_entry)) };
        if !super::integer_wna16_on() {
            return set;
        }
        // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all the integer body needs.
        unsafe { set.with_wna16_int4_dot(crate::x86::wna16_i15::body(1, tiles_from)) }
    } else if !super::integer_wna16_on() {
        set
    } else {
        // SAFETY: as above.
        unsafe { set.with_wna16_int4_dot(crate::x86::wna16_i15::body(1, usize::MAX)) }
    }
}

/// Rows for which int4 WNA16 GEMMs take the byte codes on the int8 tiles (`int4_i15.rs`) where
/// they serve, unless `MOE_KERNELS_AMX_I15_ROWS` (`min..max`, read once) says otherwise.
/// Against the AVX-512 VNNI integer body below 8 rows and the exactly decoded bf16 tiles at 8
/// (one core, 28672 × 4096 int4 codes in groups of 128 cycled from memory): 0.78× their rate
/// of codes at one row and 0.85× at four, 1.25× at six and 1.17× at eight, where the tiles'
/// products cost little and the decode's stream bounds the body; on the layer with every expert's weights
/// from memory (`moe bench --format w4a16 --group-size 128 --experts-only`, three
/// alternations), Mixtral at 16 tokens (4 rows per expert on average) ran 36-39 ms against
/// 41-44 and DeepSeek at 64 tokens 18-19 against 20-21, while from 16 rows (Qwen3 and DeepSeek
/// at 256 tokens) the bf16 tiles stay ahead.
pub(crate) const DEFAULT_I15_TILE_ROWS: Range<usize> = 5..9;

/// The rows of [`DEFAULT_I15_TILE_ROWS`] in force.
fn i15_tile_rows() -> Range<usize> {
    static ROWS: OnceLock<Range<usize>> = OnceLock::new();
    ROWS.get_or_init(|| {
        std::env::var("MOE_KERNELS_AMX_I15_ROWS")
            .ok()
            .and_then(|v| {
                let (a, b) = v.trim().split_once("..")?;
                Some(a.parse::<usize>().ok()?.max(1)..b.parse().ok()?)
            })
            .unwrap_or(DEFAULT_I15_TILE_ROWS)
    })
    .clone()
}

/// Whether the CPU has what the bf16 tile path needs besides AMX: AMX-BF16 for the products
/// and AVX-512 BF16 for rounding activations and weights.
fn has_bf16() -> bool {
    let f = super::detect();
    f.amx_bf16 && f.avx512bf16
}

/// Whether the rung takes its bf16 tile path: the CPU has it ([`has_bf16`]) and
/// `MOE_KERNELS_BF16_DOT=0` does not ask for f32 products everywhere.
fn bf16_tiles_on() -> bool {
    has_bf16() && !super::bf16_paths_off()
}

/// Rows from which the bf16 tile path takes over unless `MOE_KERNELS_AMX_BF16_MIN_M` sets
/// one value for all of them. Measured on one core with AMX-BF16 (N × K = 1536 × 2048 and
/// 2048 × 768): against the f32 FMA body, int4 WNA16 is about even at 8 rows (0.8-1.1×) and
/// 2-2.6× faster from 16, bf16 dense experts 1.1× faster at 4 rows and 2.5× at 8. In the
/// pipeline, whose experts get a spread of row counts around the mean, WNA16 from 8 rows made
/// Qwen3 and DeepSeek at 256 tokens 1.5× and 2.0× faster than the f32 body, from 16 rows only
/// 1.1× and 1.6×. W4A8, whose alternative is the int8 tiles, gains only from 64 rows (at 16
/// slower, at 64 1.1-1.3× faster, at 256 1.5-1.9×). Each panel pair is dequantized once per
/// call and shared by all its rows, which is what the first rows pay for.
pub(crate) const DEFAULT_BF16_MIN_ROWS: Bf16MinRows = Bf16MinRows {
    wna16: 8,
    dense: 8,
    w4a8: 64,
};

/// Rows from which the bf16 tile path runs (read once).
fn bf16_min_rows() -> Bf16MinRows {
    static MIN: OnceLock<Bf16MinRows> = OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("MOE_KERNELS_AMX_BF16_MIN_M")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(DEFAULT_BF16_MIN_ROWS, |m| Bf16MinRows::all(m.max(1)))
    })
}

/// The AMX rung on the hardware tile unit with its bf16 tile path from one row on, chosen,
/// when the CPU has AMX-BF16: the rung as dispatched runs that path only from
/// [`DEFAULT_BF16_MIN_ROWS`], and tests of the path need it on every row count.
#[cfg(test)]
pub(crate) fn hardware_bf16_kernel_set() -> Option<crate::KernelSet> {
    let token = Amx::try_new().filter(|_| has_bf16())?;
    let int4: (W4A8PanelsFn, W4A8PanelsFn) = (w4a8_entry, w4a8_channel_entry);
    let min = TileMinRows::dispatched();
    // SAFETY: the token proves AMX (and AVX-512 VNNI), all the tile entries need.
    let set = unsafe { with_tile_entries(token.avx512vnni(), min, int4, w8a8_entry) };
    // SAFETY: the token proves AMX; AMX-BF16 and AVX-512 BF16 were just checked.
    Some(unsafe { with_bf16_from_one_row(set, w4bf16_entry) })
}

/// The AMX rung on the hardware tile unit with its bf16 tile path and its exactly decoded int4
/// body from one row on, when the CPU has AMX-BF16 (tests).
#[cfg(test)]
pub(crate) fn hardware_int4_kernel_set() -> Option<crate::KernelSet> {
    let set = hardware_bf16_kernel_set()?;
    // SAFETY: that set exists only where AMX-BF16 and AVX-512 BF16 are usable.
    Some(unsafe { set.with_wna16_int4_dot(int4::body(1, int4_entry)) })
}

/// The AMX rung with the int4 byte-code body from one row on, ahead of the AVX-512 VNNI
/// integer body (which takes what it does not serve), when the CPU has AMX (tests).
#[cfg(test)]
pub(crate) fn hardware_i15_tile_kernel_set() -> Option<crate::KernelSet> {
    let set = hardware_kernel_set_from_one_row()?.without_wna16_int4_dot();
    // SAFETY: that set exists only where AMX-INT8 and AVX-512 F/BW/VL/VNNI are usable.
    let set = unsafe { set.with_wna16_int4_dot(int4_i15::body(1, usize::MAX, int4_i15_entry)) };
    // SAFETY: as above.
    Some(unsafe { set.with_wna16_int4_dot(crate::x86::wna16_i15::body(1, usize::MAX)) })
}

/// The int8 tile bodies from one row on, on the emulated unit and, when the CPU has AMX, on
/// the hardware (tests of bodies the dispatched rung takes only from its thresholds).
#[cfg(test)]
pub(crate) fn int8_tile_kernel_sets() -> Vec<crate::KernelSet> {
    [emulated::kernel_set(), hardware_kernel_set_from_one_row()]
        .into_iter()
        .flatten()
        .collect()
}

/// The AMX rung on the hardware tile unit with its int8 tile entries from one row on, when the
/// CPU has AMX (tests of bodies the dispatched rung takes only from its thresholds).
#[cfg(test)]
pub(crate) fn hardware_kernel_set_from_one_row() -> Option<crate::KernelSet> {
    let token = Amx::try_new()?;
    let int4: (W4A8PanelsFn, W4A8PanelsFn) = (w4a8_entry, w4a8_channel_entry);
    let min = TileMinRows::all(1);
    // SAFETY: the token proves AMX (and AVX-512 VNNI), all the tile entries need.
    Some(unsafe { with_tile_entries(token.avx512vnni(), min, int4, w8a8_entry) })
}

/// `set` with the bf16 tile path `entry` from one row on, chosen: what the tests of the path
/// run, on the hardware or the emulated unit.
///
/// # Safety
/// - `entry` and the bf16 activation layout may be called on this CPU.
#[cfg(test)]
unsafe fn with_bf16_from_one_row(
    set: crate::KernelSet,
    entry: crate::ukernel::W4Bf16PanelsFn,
) -> crate::KernelSet {
    // SAFETY: our contract.
    let set =
        unsafe { set.with_bf16_tiles("amx-bf16 tiles", Bf16MinRows::all(1), entry, bf16_tile_a) };
    set.with_w4a8_prefill(crate::W4A8Prefill::Bf16Tiles)
}

/// The tile bodies on the emulated unit, for every row count, where AVX-512 VNNI runs (tests).
#[cfg(test)]
pub(crate) mod emulated {
    use super::*;
    use crate::x86::Avx512Vnni;
    use tiles::EmulatedTiles;

    /// # Safety
    /// - [`W4A8PanelsFn`]'s contract, including AVX-512 F/BW/VNNI support.
    unsafe fn w4a8_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512; the emulated unit runs anywhere.
        unsafe { w4a8_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// # Safety
    /// - [`W4A8PanelsFn`]'s contract, including AVX-512 F/BW/VNNI support, with the rows
    ///   laid out by [`channel_tile_a`].
    unsafe fn w4a8_channel_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512; the emulated unit runs anywhere.
        unsafe { w4a8_channel_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// # Safety
    /// - [`W8A8PanelsFn`]'s contract, including AVX-512 F/BW/VNNI support.
    unsafe fn w8a8_entry(job: &W8A8Job<'_>, panels: Range<usize>) {
        // SAFETY: as above.
        unsafe { w8a8_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// # Safety
    /// - [`crate::wna16::Int4DotPanelsFn`]'s contract, with AVX-512 F/BW/VL instead of AMX,
    ///   the activations laid out by [`int4_i15::fill`].
    unsafe fn int4_i15_entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512; the emulated unit runs anywhere.
        unsafe { int4_i15_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// The emulated [`kernel_set`] with the int4 byte-code body from one row on, ahead of the
    /// AVX-512 VNNI integer body (which takes what it does not serve).
    pub(crate) fn i15_tile_kernel_set() -> Option<crate::KernelSet> {
        let set = kernel_set()?.without_wna16_int4_dot();
        // SAFETY: the set exists only with AVX-512 VNNI (and F/BW/VL with it here); the
        // emulated unit needs nothing else.
        let set = unsafe { set.with_wna16_int4_dot(int4_i15::body(1, usize::MAX, int4_i15_entry)) };
        // SAFETY: as above.
        Some(unsafe { set.with_wna16_int4_dot(crate::x86::wna16_i15::body(1, usize::MAX)) })
    }

    /// The AMX rung with the emulated unit from one row on, when AVX-512 VNNI is available.
    pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
        let token = Avx512Vnni::try_new()?;
        let int4: (W4A8PanelsFn, W4A8PanelsFn) = (w4a8_entry, w4a8_channel_entry);
        let min = TileMinRows::all(1);
        // SAFETY: the token proves AVX-512 VNNI, all the emulated entries need.
        Some(unsafe { with_tile_entries(token, min, int4, w8a8_entry) })
    }

    /// # Safety
    /// - [`crate::ukernel::W4Bf16PanelsFn`]'s contract, with AVX-512 F/BW/BF16 instead of AMX-BF16.
    unsafe fn w4bf16_entry(job: &W4Bf16Job<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512 BF16; the emulated unit runs anywhere.
        unsafe { w4bf16_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// The AMX rung with the bf16 tile bodies on the emulated unit from one row on, chosen,
    /// when AVX-512 VNNI and BF16 are available.
    pub(crate) fn bf16_kernel_set() -> Option<crate::KernelSet> {
        let f = crate::x86::detect();
        if !f.avx512bf16 {
            return None;
        }
        let set = kernel_set()?;
        // SAFETY: AVX-512 BF16 was just checked; the emulated unit needs nothing else.
        Some(unsafe { super::with_bf16_from_one_row(set, w4bf16_entry) })
    }

    /// # Safety
    /// - [`crate::wna16::Int4DotPanelsFn`]'s contract, with AVX-512 F/BW/BF16 instead of
    ///   AMX-BF16.
    unsafe fn int4_entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512 BF16; the emulated unit runs anywhere.
        unsafe { int4_panels(&mut EmulatedTiles::new(), job, panels) }
    }

    /// [`bf16_kernel_set`] with the exactly decoded int4 body from one row on (where it
    /// serves), when AVX-512 VNNI, VL and BF16 are available.
    pub(crate) fn int4_kernel_set() -> Option<crate::KernelSet> {
        let set = bf16_kernel_set()?;
        // SAFETY: the set exists only with AVX-512 BF16 (and VNNI, which comes with VL here);
        // the emulated unit needs nothing else.
        Some(unsafe { set.with_wna16_int4_dot(super::int4::body(1, int4_entry)) })
    }
}

/// The AMX rung on the no-op tile unit, for timing its non-tile work (`tile-cost-model`).
#[cfg(feature = "tile-cost-model")]
pub(crate) mod cost_model {
    use super::*;
    use crate::x86::Avx512Vnni;
    use tiles::NoopTiles;

    /// # Safety
    /// - [`W4A8PanelsFn`]'s contract, with AVX-512 F/BW/VNNI instead of AMX.
    unsafe fn w4a8_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
        // SAFETY: the caller guarantees AVX-512; the no-op unit runs anywhere.
        unsafe { w4a8_panels(&mut NoopTiles, job, panels) }
    }

    /// # Safety
    /// - [`W4A8PanelsFn`]'s contract, with AVX-512 F/BW/VNNI instead of AMX.
    unsafe fn w4a8_channel_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
        // SAFETY: as above.
        unsafe { w4a8_channel_panels(&mut NoopTiles, job, panels) }
    }

    /// # Safety
    /// - [`W8A8PanelsFn`]'s contract, with AVX-512 F/BW/VNNI instead of AMX.
    unsafe fn w8a8_entry(job: &W8A8Job<'_>, panels: Range<usize>) {
        // SAFETY: as above.
        unsafe { w8a8_panels(&mut NoopTiles, job, panels) }
    }

    /// # Safety
    /// - [`crate::ukernel::W4Bf16PanelsFn`]'s contract, with AVX-512 BF16 instead of AMX.
    unsafe fn w4bf16_entry(job: &W4Bf16Job<'_>, panels: Range<usize>) {
        // SAFETY: as above, with AVX-512 BF16 checked when the set was built.
        unsafe { w4bf16_panels(&mut NoopTiles, job, panels) }
    }

    /// # Safety
    /// - [`crate::wna16::Int4DotPanelsFn`]'s contract, with AVX-512 BF16 instead of AMX.
    unsafe fn int4_entry(job: &Int4DotJob<'_>, panels: Range<usize>) {
        // SAFETY: as above.
        unsafe { int4_panels(&mut NoopTiles, job, panels) }
    }

    /// The set, when asked for (`MOE_KERNELS_TILE_COST_MODEL=1`) and AVX-512 VNNI is there.
    pub(crate) fn kernel_set() -> Option<crate::KernelSet> {
        if std::env::var("MOE_KERNELS_TILE_COST_MODEL").as_deref() != Ok("1") {
            return None;
        }
        let token = Avx512Vnni::try_new()?;
        let int4: (W4A8PanelsFn, W4A8PanelsFn) = (w4a8_entry, w4a8_channel_entry);
        // SAFETY: the token proves AVX-512 VNNI, all the no-op entries need.
        let set = unsafe { with_tile_entries(token, TileMinRows::dispatched(), int4, w8a8_entry) };
        if crate::x86::detect().avx512bf16 {
            // SAFETY: AVX-512 BF16 was just checked; the no-op unit needs nothing else.
            let set = unsafe {
                set.with_bf16_tiles("amx-bf16 tiles", bf16_min_rows(), w4bf16_entry, bf16_tile_a)
            };
            // SAFETY: as above.
            Some(unsafe { set.with_wna16_int4_dot(int4::body(bf16_min_rows().wna16, int4_entry)) })
        } else {
            Some(set)
        }
    }
}
