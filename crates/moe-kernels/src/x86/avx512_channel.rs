//! The AVX-512 VNNI body of [`crate::W4A8Prefill::ChannelInt8`]: each panel pair requantised to
//! int8 with one scale per channel once per call (`requant.rs`, in the panels' own channel
//! order), then the W8A8 tile's loop over it: two panels per tile, one `vpdpbusd` chain per row
//! and panel over all of K, one epilogue per output row instead of one per scale block.

// Rows index several arrays in lockstep; index loops read clearer than zips here.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::amx::common::{Row64, write_panel_rows};
use super::requant::ChannelPair;
use crate::ukernel::{W4A8Job, W4A8Out, row_tiles_aligned};

/// Rows per tile, as the rung's W8A8 tile.
const MR: usize = 8;

thread_local! {
    /// Each thread's requantised panel pair, kept between calls so steady-state calls do not
    /// allocate.
    static PAIR: RefCell<ChannelPair> = RefCell::new(ChannelPair::default());
}

/// The entry point: walks `panels` in pairs, requantising each pair once and running every row
/// tile of the call over it.
///
/// # Safety
/// - [`crate::ukernel::W4A8PanelsFn`]'s contract, with the rows encoded as `q + 128` and the row
///   corrections `128 + zp` (`ActEncoding::U8Offset128`), values as the job's output, and a CPU
///   with AVX-512 F/BW/VNNI.
pub(crate) unsafe fn entry(job: &W4A8Job<'_>, panels: Range<usize>) {
    PAIR.with_borrow_mut(|pair| {
        let mut p = panels.start;
        while p < panels.end {
            let nb = 2.min(panels.end - p);
            // SAFETY: the CPU has AVX-512 F/BW/VNNI (our contract).
            unsafe { pair.fill::<true>(job.w, p, nb) };
            for rows in row_tiles_aligned(job.m, MR, 1) {
                // SAFETY: as above; `pair` holds panels `p..p + nb`, and `rows` is at most `MR`
                // rows inside `0..m`.
                unsafe { tile(job, (pair, p, nb), rows) };
            }
            p += nb;
        }
    });
}

/// Runs the tile of `rows.len()` rows over the pair's `nb` panels.
///
/// # Safety
/// - As [`entry`]; `pair` was filled for panels `p..p + nb` of `job.w`; `rows` holds 1 to
///   [`MR`] rows inside `0..job.m`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile(job: &W4A8Job<'_>, (pair, p, nb): (&ChannelPair, usize, usize), rows: Range<usize>) {
    type Body = unsafe fn(&W4A8Job<'_>, &ChannelPair, usize, usize);
    macro_rules! bodies {
        ($($r:literal)*) => {
            match (rows.len(), nb == 2) {
                $(
                    ($r, true) => rows_tile::<$r, 2> as Body,
                    ($r, false) => rows_tile::<$r, 1> as Body,
                )*
                _ => unreachable!("tile rows out of range"),
            }
        };
    }
    let body = bodies!(1 2 3 4 5 6 7 8);
    // SAFETY: forwarded contract; the body's row count is `rows.len()` and its panel count `nb`.
    unsafe { body(job, pair, p, rows.start) }
}

/// Rows `m0..m0 + R` of the pair's `NB` panels.
///
/// # Safety
/// - As [`tile`], with `R` rows starting at `m0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows_tile<const R: usize, const NB: usize>(
    job: &W4A8Job<'_>,
    pair: &ChannelPair,
    p: usize,
    m0: usize,
) {
    let k_pad = job.w.k_pad();
    let steps = [0, NB - 1].map(|j| &pair.panel_rows(j)[..k_pad / 4]);
    let mut row_steps: [&[[u8; 4]]; R] = [&[]; R];
    for r in 0..R {
        row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<4>().0;
    }
    for a in &row_steps {
        assert_eq!(a.len(), steps[0].len());
    }
    // `acc[j][r]`: panel `p + j`, row `m0 + r`.
    let mut acc = [[_mm512_setzero_si512(); R]; NB];
    for (i, (s0, s1)) in steps[0].iter().zip(steps[1]).enumerate() {
        let v = [load(s0), load(s1)];
        for r in 0..R {
            let a = _mm512_set1_epi32(i32::from_le_bytes(row_steps[r][i]));
            for j in 0..NB {
                acc[j][r] = _mm512_dpbusd_epi32(acc[j][r], a, v[j]);
            }
        }
    }
    for (j, acc) in acc.iter().enumerate() {
        // SAFETY: our contract, for panel `p + j`.
        unsafe { store_panel(job, pair, (p, j), m0, acc) };
    }
}

/// One requantised B row.
#[target_feature(enable = "avx512f")]
#[inline]
fn load(row: &Row64) -> __m512i {
    // SAFETY: a `Row64` is 64 readable, 64-byte aligned bytes.
    unsafe { _mm512_load_si512(row.0.as_ptr().cast()) }
}

/// The epilogue of the pair's panel `j` (panel `p + j` of the weights) for rows `m0..m0 + R`:
/// `f32(acc − (128 + zp)·Σw8)·scale·recip + bias`, the channels past N masked out.
///
/// # Safety
/// - As [`rows_tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn store_panel<const R: usize>(
    job: &W4A8Job<'_>,
    pair: &ChannelPair,
    (p, j): (usize, usize),
    m0: usize,
    acc: &[__m512i; R],
) {
    let W4A8Out::Values { ptr, ld } = job.out else {
        debug_assert!(false, "the per-channel body has no block accumulators");
        return;
    };
    let (wsum, scale) = (pair.wsum(j), pair.scale(j));
    let y = |r: usize| {
        let corr = _mm512_set1_epi32(job.row_corr[m0 + r]);
        let exact = _mm512_sub_epi32(acc[r], _mm512_mullo_epi32(corr, wsum));
        let v = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), scale);
        _mm512_mul_ps(v, _mm512_set1_ps(job.row_recip[m0 + r]))
    };
    let w = job.w;
    let bias = w.panel_bias(p + j);
    // SAFETY: rows `m0..m0 + R ≤ m` and panel `p + j`'s channels are inside the validated
    // output and owned by this call (our contract).
    unsafe { write_panel_rows((ptr, ld), w.n(), (m0, R), p + j, bias, y) };
}
