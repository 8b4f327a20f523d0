//! The bf16 path for int4 and e4m3 weights on AVX-512 BF16 (`vdpbf16ps`), for CPUs without
//! AMX-BF16 where that instruction runs at twice the f32 FMA rate.
//!
//! Same numerics and the same data as the AMX-BF16 tiles (`amx/bf16.rs`): activations rounded
//! to bf16 and laid out once per GEMM by `amx::bf16::fill_a`, each panel pair dequantized once
//! per call to `bf16(w·scale)` pairs by `WideBf16Pair`, f32 sums. A B row of that pair holds
//! K values `2r, 2r + 1` of 16 channels, which is exactly one `vdpbf16ps` operand; the
//! activation pair `(x[2r], x[2r + 1])` of a row is its broadcast partner. A tile is up to
//! [`MR`] rows by the pair's 32 channels, its sums held in registers over the whole of K.
//!
//! `vdpbf16ps` adds the two products of a lane to the sum in one step and treats bf16
//! denormals as zero, so results are compared with the f64 model of these roundings within a
//! tolerance (as for the tiles), not bit for bit.

// Rows and panels index register arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::amx::bf16::{CHUNK_BYTES, CHUNK_K, WideBf16Pair};
use super::amx::common::{TILE_ROWS, TiledA, write_panel_rows};
use crate::aligned::AlignedVec;
use crate::ukernel::{Bf16Weights, W4Bf16Job, row_tiles};

/// Rows per tile: 8 rows × 2 panels are 16 accumulators, with room for the two weight
/// vectors.
const MR: usize = 8;

/// B rows (K pairs) per chunk of the dequantized pair.
const PAIRS_PER_CHUNK: usize = CHUNK_K / 2;

thread_local! {
    /// Each thread's dequantized panel pair, kept between calls so that steady-state calls do
    /// not allocate.
    static WIDE: RefCell<WideBf16Pair> = RefCell::new(WideBf16Pair::default());
}

/// Loads one 64-byte B row.
#[target_feature(enable = "avx512f")]
#[inline]
fn load_row(row: *const u8) -> __m512bh {
    // SAFETY: the caller passes a pointer to one of the pair's 64-byte rows (`chunk_rows`
    // points at 16 of them); unaligned load.
    let v = unsafe { _mm512_loadu_si512(row.cast()) };
    // SAFETY: a plain 512-bit vector reinterpreted as 32 bf16 bit patterns.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Broadcasts the activation pair at `pair` (4 bytes) to all 16 lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn broadcast_pair(pair: *const u8) -> __m512bh {
    // SAFETY: the caller passes a pointer to 4 readable bytes of the tiled activations;
    // unaligned read.
    let bits = unsafe { pair.cast::<i32>().read_unaligned() };
    let v = _mm512_set1_epi32(bits);
    // SAFETY: as in `load_row`.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// Bytes of L2 the next pair's weights may share with a pair's own working set (half of the
/// smallest L2 of the cores this path runs on). Measured on an AMD core with AVX-512 BF16
/// (`moe bench --experts-only`, builds alternated): with the next pair fetched at every size,
/// Mixtral's FP8 experts at 1024 tokens (256 rows, K up to 14336, working sets past the L2)
/// ran 1.1-1.25× slower, while bf16 experts of Qwen3 and DeepSeek at 256 tokens (16 and 24
/// rows, within the budget) ran 1.1-1.3× faster.
const AHEAD_BUDGET: usize = 512 << 10;

/// Lines of the next panel pair's stored weights that a row tile asks for while it runs: the
/// tiles of a pair compute from the dequantized pair, so without this the next pair's weights
/// would stream from memory only when its own fill starts, and the two phases would take
/// turns instead of overlapping.
#[derive(Clone, Copy)]
struct Ahead {
    /// Up to two runs (one per panel of the next pair): first byte and number of lines.
    runs: [(*const u8, usize); 2],
}

impl Ahead {
    /// Share `t` of `tiles` of the panels `next..next + nb` of `w` (nothing when `nb` is 0).
    fn share(w: &Bf16Weights<'_>, (next, nb): (usize, usize), (t, tiles): (usize, usize)) -> Self {
        let mut runs = [(std::ptr::null(), 0); 2];
        for (j, run) in runs.iter_mut().enumerate().take(nb) {
            let (start, bytes) = w.panel_span(next + j);
            let lines = bytes.div_ceil(64);
            let (first, end) = (t * lines / tiles, (t + 1) * lines / tiles);
            *run = (start.wrapping_add(first * 64), end - first);
        }
        Self { runs }
    }

    /// Prefetches into L2 the part of each run that falls to chunk `c` of `n_chunks`.
    #[target_feature(enable = "sse")]
    #[inline]
    fn chunk(&self, c: usize, n_chunks: usize) {
        for &(start, lines) in &self.runs {
            for line in c * lines / n_chunks..(c + 1) * lines / n_chunks {
                // A prefetch is a hint that never faults; the addresses lie in the weights.
                _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(64 * line).cast());
            }
        }
    }
}

/// Rows `row0..row0 + R` (inside one 16-row group of `a`) by the `NB` panels from `p`, asking
/// for its share of the next pair's weights (`ahead`) as it goes.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/BF16; `wide` holds panels `p..p + NB` of `job.w`, and `a` views
///   this job's rows ([`super::amx::bf16::fill_a`]).
/// - The job satisfies [`crate::ukernel::W4Bf16PanelsFn`]'s contract for those panels, and
///   `row0 + R ≤ job.m` with `row0 / 16 == (row0 + R − 1) / 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn tile<const R: usize, const NB: usize>(
    job: &W4Bf16Job<'_>,
    wide: &WideBf16Pair,
    a: &TiledA<'_>,
    (p, row0): (usize, usize),
    ahead: Ahead,
) {
    let w = job.w;
    let n_chunks = w.k().div_ceil(CHUNK_K);
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    for c in 0..n_chunks {
        ahead.chunk(c, n_chunks);
        let mut b_rows = [std::ptr::null::<u8>(); NB];
        for j in 0..NB {
            b_rows[j] = wide.chunk_rows(j, c);
        }
        let mut a_rows = [std::ptr::null::<u8>(); R];
        for r in 0..R {
            a_rows[r] = a.row(row0 + r, c);
        }
        for i in 0..PAIRS_PER_CHUNK {
            let mut b = [load_row(b_rows[0].wrapping_add(i * CHUNK_BYTES)); NB];
            for j in 1..NB {
                b[j] = load_row(b_rows[j].wrapping_add(i * CHUNK_BYTES));
            }
            for r in 0..R {
                let x = broadcast_pair(a_rows[r].wrapping_add(4 * i));
                for j in 0..NB {
                    acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b[j], x);
                }
            }
        }
    }
    for j in 0..NB {
        let bias = w.panel_bias(p + j);
        // SAFETY: rows `row0..row0 + R ≤ m` and panel `p + j`'s channels are inside the
        // validated output and owned by this call (our contract).
        unsafe {
            write_panel_rows((job.out, job.ld), w.n(), (row0, R), p + j, bias, |r| {
                acc[r][j]
            })
        };
    }
}

/// One row-count and panel-count instance of [`tile`].
type TileFn = unsafe fn(&W4Bf16Job<'_>, &WideBf16Pair, &TiledA<'_>, (usize, usize), Ahead);

/// The instance of [`tile`] for `rows` rows (1 to [`MR`]) and `nb` panels (1 or 2).
fn tile_fn(rows: usize, nb: usize) -> TileFn {
    macro_rules! by_rows {
        ($nb:literal) => {
            match rows {
                1 => tile::<1, $nb>,
                2 => tile::<2, $nb>,
                3 => tile::<3, $nb>,
                4 => tile::<4, $nb>,
                5 => tile::<5, $nb>,
                6 => tile::<6, $nb>,
                7 => tile::<7, $nb>,
                _ => tile::<MR, $nb>,
            }
        };
    }
    if nb == 2 { by_rows!(2) } else { by_rows!(1) }
}

/// The entry point: walks `panels` in pairs, dequantizes each pair once, and runs every row
/// tile of the call on it (row tiles stay inside the 16-row groups of the activation layout).
///
/// # Safety
/// - [`crate::ukernel::W4Bf16PanelsFn`]'s contract, with AVX-512 F/BW/BF16 for the CPU.
pub(crate) unsafe fn entry(job: &W4Bf16Job<'_>, panels: Range<usize>) {
    let n_chunks = job.w.k().div_ceil(CHUNK_K);
    let a = TiledA::new(job.a_tiles, job.m, CHUNK_BYTES, n_chunks);
    // Row tiles per pair, among which the next pair's lines are shared.
    let tiles = (0..job.m)
        .step_by(TILE_ROWS)
        .map(|g| row_tiles(TILE_ROWS.min(job.m - g), MR).count())
        .sum::<usize>();
    WIDE.with_borrow_mut(|wide| {
        let mut p = panels.start;
        while p < panels.end {
            let nb = 2.min(panels.end - p);
            // SAFETY: the CPU has AVX-512 F/BW/BF16 (our contract).
            unsafe { wide.fill(job.w, p, nb, 0..n_chunks) };
            let next_nb = 2.min(panels.end.saturating_sub(p + nb));
            let next_bytes: usize = (p + nb..p + nb + next_nb)
                .map(|q| job.w.panel_span(q).1)
                .sum();
            // Fetched ahead only while the pair's working set (the activations, the
            // dequantized pair) and the next pair's weights fit the budget; otherwise the
            // fetched lines would push the tiles' own data out of L2 before they are used.
            let working = 2 * job.m * job.w.k() + nb * job.w.k() * 32 + next_bytes;
            let next = (p + nb, if working <= AHEAD_BUDGET { next_nb } else { 0 });
            let mut t = 0;
            let mut group0 = 0;
            while group0 < job.m {
                let group_rows = TILE_ROWS.min(job.m - group0);
                for rows in row_tiles(group_rows, MR) {
                    let row0 = group0 + rows.start;
                    let ahead = Ahead::share(&job.w, next, (t, tiles));
                    t += 1;
                    // SAFETY: `wide` holds panels `p..p + nb`, `a` views this job's rows; the
                    // tile's rows lie inside `0..m` and inside one 16-row group; the CPU
                    // features and the job contract are forwarded from ours.
                    unsafe { tile_fn(rows.len(), nb)(job, wide, &a, (p, row0), ahead) };
                }
                group0 += group_rows;
            }
            p += nb;
        }
    });
}

/// The activation layout of this path (the driver's hook): the AMX-BF16 tiles' own.
///
/// # Safety
/// - The CPU has AVX-512 F/BW/BF16.
pub(crate) unsafe fn tile_a(x: &[f32], m: usize, k: usize, dst: &mut AlignedVec<u8>) {
    // SAFETY: our contract.
    unsafe { super::amx::bf16::fill_a(x, m, k, dst) }
}

#[cfg(test)]
mod tests {
    use super::Ahead;
    use crate::ukernel::Bf16Weights;

    /// The row tiles of a pair share the next pair's lines between them: every line of both
    /// panels once, in order, whatever the number of tiles.
    #[test]
    fn row_tiles_share_every_line_of_the_next_pair_once() {
        let w = crate::PackedWna16::pack(crate::Wna16Desc {
            n: 64,
            k: 1000,
            bits: 4,
            codes: &vec![3; 64 * 1000],
            group_size: moe_quant::WeightGroups::from_group_size(Some(128)).unwrap(),
            scales: crate::Wna16Scales::F32(&vec![1.0; 64 * 8]),
            zeros: None,
            bias: None,
            perm: None,
        })
        .unwrap();
        let weights = Bf16Weights::Wna16(&w);
        let (_, nothing) = Ahead::share(&weights, (2, 0), (0, 1)).runs[0];
        assert_eq!(nothing, 0, "no next pair, nothing to fetch");
        for tiles in [1usize, 2, 3, 7] {
            for j in 0..2 {
                let (start, bytes) = weights.panel_span(2 + j);
                let mut next_line = 0;
                for t in 0..tiles {
                    let (first, lines) = Ahead::share(&weights, (2, 2), (t, tiles)).runs[j];
                    assert_eq!(
                        first,
                        start.wrapping_add(64 * next_line),
                        "tiles={tiles} t={t}"
                    );
                    next_line += lines;
                }
                assert_eq!(next_line, bytes.div_ceil(64), "tiles={tiles} panel {j}");
            }
        }
    }
}
