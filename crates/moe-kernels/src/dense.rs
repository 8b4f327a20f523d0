//! The float GEMM of unquantized experts: `out[M, N] = x[M, K] · wᵀ` on [`PackedDense`]
//! weights, f32 accumulation, no quantization.
//!
//! One portable body, compiled three times: as is, and inside `#[target_feature]` wrappers for
//! AVX2 and AVX-512 (`x86/dense.rs`) so the compiler vectorizes its 16-channel inner loop with
//! wider registers. Each rung registers its build in the [`KernelSet`] ([`DenseBodies`]), as it
//! does its other GEMM bodies; [`KernelSet::dense_isa`] says which build runs.
//! Every output is `Σ_k x[m,k]·w[n,k]` accumulated in ascending k from 0 with a separate
//! multiply and add (Rust never contracts them into FMA), and lanes never mix, so every build of
//! the body gives the same bits as the scalar reference whatever the rung or thread count.
//!
//! Experts stored in bf16 take the rung's bf16 path instead from its row threshold on
//! ([`dense_expert_gemm`]): the weights are already bf16 B rows, the activations are rounded
//! to bf16 and the products summed in f32 by `vdpbf16ps` or the AMX-BF16 tiles. Those are a
//! bf16 model's numerics, not this body's; [`dense_gemm`] itself (the router gate's GEMM)
//! always runs the body.

use std::ops::Range;

use half::bf16;

use crate::gemm::GemmScratch;
use crate::packed::dense::DenseValues;
use crate::packed::{PANEL, PackedDense, check_len};
use crate::par::split_panels;
use crate::ukernel::{Bf16Weights, W4Bf16Job};
use crate::{Isa, KernelError, KernelSet, Par};

/// Rows per register tile.
const MR: usize = 4;

/// A weight element the body widens to f32 (exactly).
pub(crate) trait Widen: Copy + Send + Sync + Sized {
    /// The value as f32.
    fn widen(self) -> f32;
    /// The build of the body for this element type among `bodies`.
    fn entry(bodies: &DenseBodies) -> DensePanelsFn<Self>;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    fn entry(bodies: &DenseBodies) -> DensePanelsFn<Self> {
        bodies.f32
    }
}

impl Widen for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }

    fn entry(bodies: &DenseBodies) -> DensePanelsFn<Self> {
        bodies.bf16
    }
}

/// One build of the body: computes panels `panels` of `job` (all rows), overwriting their
/// outputs.
///
/// # Safety (for callers)
/// - The CPU supports the build's rung (the [`KernelSet`] that holds it was built from its
///   token).
/// - `job.out` holds `m·N` writable f32 that nothing else reads or writes during the call
///   except other calls on disjoint panel ranges; `panels` lies within the weights' panels.
pub(crate) type DensePanelsFn<T> = unsafe fn(&DenseJob<'_, T>, Range<usize>);

/// The dense builds of one rung, one per weight element type, and the rung whose registers
/// they use.
#[derive(Clone, Copy)]
pub(crate) struct DenseBodies {
    /// The rung whose vector width the builds use ([`Isa::Scalar`]: the portable build).
    pub(crate) isa: Isa,
    /// The build for f32 weights.
    pub(crate) f32: DensePanelsFn<f32>,
    /// The build for bf16 weights.
    pub(crate) bf16: DensePanelsFn<bf16>,
}

impl DenseBodies {
    /// The portable build, for every rung without one of its own.
    pub(crate) const PORTABLE: Self = Self {
        isa: Isa::Scalar,
        f32: panels_portable::<f32>,
        bf16: panels_portable::<bf16>,
    };
}

/// One GEMM as the bodies see it.
pub(crate) struct DenseJob<'a, T> {
    /// The packed weights ([`PackedDense`]'s layout).
    pub(crate) w: &'a [T],
    pub(crate) k: usize,
    pub(crate) n: usize,
    /// Rows of `x` and `out`.
    pub(crate) m: usize,
    /// `[m, k]`, row-major.
    pub(crate) x: &'a [f32],
    /// `[m, n]`, row-major.
    pub(crate) out: *mut f32,
}

// SAFETY: the raw output pointer is only written through by bodies working on disjoint panel
// ranges (the split), so sharing the job between threads creates no data race.
unsafe impl<T: Sync> Sync for DenseJob<'_, T> {}

/// Computes rows `m0..m0 + R` of panels `p..p + NP`. Each (row, panel) pair is its own chain
/// of adds, so several panels keep the adder busy when there are few rows; within a lane the
/// sum still runs in ascending k, so the panel count never changes a result.
#[inline(always)]
fn tile<T: Widen, const R: usize, const NP: usize>(job: &DenseJob<'_, T>, p: usize, m0: usize) {
    let k = job.k;
    let steps: [&[[T; PANEL]]; NP] = std::array::from_fn(|j| {
        job.w[(p + j) * k * PANEL..][..k * PANEL]
            .as_chunks::<PANEL>()
            .0
    });
    let rows: [&[f32]; R] = std::array::from_fn(|r| &job.x[(m0 + r) * k..][..k]);
    let mut acc = [[[0f32; PANEL]; NP]; R];
    for kk in 0..k {
        for j in 0..NP {
            let step = &steps[j][kk];
            let mut w = [0f32; PANEL];
            for c in 0..PANEL {
                w[c] = step[c].widen();
            }
            for r in 0..R {
                let xv = rows[r][kk];
                for c in 0..PANEL {
                    acc[r][j][c] += xv * w[c];
                }
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (j, acc_panel) in acc_row.iter().enumerate() {
            let valid = PANEL.min(job.n - (p + j) * PANEL);
            let at = (m0 + r) * job.n + (p + j) * PANEL;
            for (c, v) in acc_panel.iter().enumerate().take(valid) {
                // SAFETY: row `m0 + r < m` and channel `16(p + j) + c < N` address an element
                // of the caller's `m·N` output that belongs to these panels alone (disjoint
                // split).
                unsafe { job.out.wrapping_add(at + c).write(*v) };
            }
        }
    }
}

/// Walks `panels` in groups of up to four (two for tiles of more than two rows, to stay in
/// registers) and each group's row tiles.
#[inline(always)]
pub(crate) fn panels_body<T: Widen>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    let mut p = panels.start;
    while p < panels.end {
        let left = panels.end - p;
        let mut m0 = 0;
        // Panels this group covers: what tiles of up to two rows take (four), and what the
        // larger tiles take (two) inside it.
        let wide = left.min(4);
        while m0 < job.m {
            let rows = MR.min(job.m - m0);
            match (rows, wide) {
                (1, 4) => tile::<T, 1, 4>(job, p, m0),
                (2, 4) => tile::<T, 2, 4>(job, p, m0),
                _ => {
                    let mut q = p;
                    while q < p + wide {
                        let np = (p + wide - q).min(2);
                        match (rows, np) {
                            (1, 2) => tile::<T, 1, 2>(job, q, m0),
                            (1, _) => tile::<T, 1, 1>(job, q, m0),
                            (2, 2) => tile::<T, 2, 2>(job, q, m0),
                            (2, _) => tile::<T, 2, 1>(job, q, m0),
                            (3, 2) => tile::<T, 3, 2>(job, q, m0),
                            (3, _) => tile::<T, 3, 1>(job, q, m0),
                            (_, 2) => tile::<T, MR, 2>(job, q, m0),
                            _ => tile::<T, MR, 1>(job, q, m0),
                        }
                        q += np;
                    }
                }
            }
            m0 += rows;
        }
        p += wide;
    }
}

/// The portable build.
///
/// # Safety
/// - As [`DensePanelsFn`]; it needs no CPU feature.
unsafe fn panels_portable<T: Widen>(job: &DenseJob<'_, T>, panels: Range<usize>) {
    panels_body(job, panels);
}

/// Runs `panels` with the build the kernel set's rung registered.
fn run<T: Widen>(ks: &KernelSet, job: &DenseJob<'_, T>, panels: Range<usize>) {
    let entry = T::entry(&ks.dense_bodies());
    // SAFETY: the kernel set registers a build only from its rung's token; the caller
    // (`dense_gemm`) checked the output length and hands out disjoint, in-bounds panel ranges.
    unsafe { entry(job, panels) }
}

/// The rung whose vector width the dense GEMM uses with kernel set `ks` (reports); the same as
/// [`KernelSet::dense_isa`].
pub fn dense_isa(ks: &KernelSet) -> Isa {
    ks.dense_isa()
}

/// `out[M, N] = x[M, K] · wᵀ` in f32 (no quantization).
///
/// NaN and infinities in `x` propagate to the outputs they touch, as IEEE arithmetic says.
pub fn dense_gemm(
    ks: &KernelSet,
    m: usize,
    x: &[f32],
    w: &PackedDense,
    out: &mut [f32],
    par: Par,
) -> Result<(), KernelError> {
    let (n, k) = (w.n(), w.k());
    check_len("x", m.saturating_mul(k), x.len())?;
    check_len("out", m.saturating_mul(n), out.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let macs = m * n * k;
    let out = out.as_mut_ptr();
    match w.values() {
        DenseValues::F32(v) => {
            let job = DenseJob {
                w: v,
                k,
                n,
                m,
                x,
                out,
            };
            split_panels(w.n_panels(), par, macs, |panels| run(ks, &job, panels));
        }
        DenseValues::Bf16(v) => {
            let job = DenseJob {
                w: v,
                k,
                n,
                m,
                x,
                out,
            };
            split_panels(w.n_panels(), par, macs, |panels| run(ks, &job, panels));
        }
    }
    Ok(())
}

/// An expert GEMM on dense weights: [`dense_gemm`], except that bf16 weights take the rung's
/// bf16 path from its row threshold on (activations rounded to bf16, f32 sums; see the module
/// docs), with the activation layout made once in `scratch`.
pub(crate) fn dense_expert_gemm(
    ks: &KernelSet,
    m: usize,
    x: &[f32],
    w: &PackedDense,
    out: &mut [f32],
    scratch: &mut GemmScratch,
    par: Par,
) -> Result<(), KernelError> {
    let (n, k) = (w.n(), w.k());
    let bf16_path = ks.dense_bf16_for(m).filter(|_| w.is_bf16());
    let Some(t) = bf16_path else {
        return dense_gemm(ks, m, x, w, out, par);
    };
    check_len("x", m.saturating_mul(k), x.len())?;
    check_len("out", m.saturating_mul(n), out.len())?;
    if n == 0 {
        return Ok(());
    }
    let (_, tiles) = scratch.f32_rows_and_tiles(0);
    // SAFETY: the layout function comes from the same `KernelSet` as the entry, registered
    // only where its features are available.
    unsafe { (t.tile_a)(x, m, k, tiles) };
    let job = W4Bf16Job {
        w: Bf16Weights::Dense(w),
        a_tiles: tiles,
        m,
        out: out.as_mut_ptr(),
        ld: n,
    };
    split_panels(w.n_panels(), par, m * n * k, |panels| {
        // SAFETY: the entry comes from the same set as the layout function; `a_tiles` holds
        // `m` rows of K, `out` holds `m·N` (checked above) and the panel ranges are disjoint
        // and in bounds.
        unsafe { (t.entry)(&job, panels) }
    });
    Ok(())
}

/// The literal definition: `Σ_k x·w` in ascending k from 0, one multiply and one add per term.
#[cfg(test)]
pub(crate) fn dense_reference(m: usize, n: usize, k: usize, x: &[f32], w: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut s = 0f32;
            for kk in 0..k {
                s += x[r * k + kk] * w[c * k + kk];
            }
            out[r * n + c] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use moe_testutil::SplitMix64;

    /// Every rung's build of the body, both precisions, both `Par` modes, ragged shapes: equal
    /// to the reference bit for bit.
    #[test]
    fn every_rung_equals_the_reference_bit_for_bit() {
        let mut rng = SplitMix64::new(7);
        let mut sets = vec![KernelSet::scalar()];
        sets.extend(
            crate::available_isas()
                .into_iter()
                .filter_map(KernelSet::for_isa),
        );
        for &(m, n, k) in &[
            (0, 5, 3),
            (1, 1, 1),
            (1, 17, 33),
            (3, 16, 64),
            (5, 33, 70),
            (9, 47, 129),
            // Groups of four panels (tiles of one and two rows) with ragged leftovers.
            (1, 70, 33),
            (2, 64, 17),
            (6, 81, 40),
            (2, 100, 3),
            // Row tiles of three to six rows, split as evenly as they divide (AVX2).
            (7, 19, 5),
            (12, 16, 2),
            (13, 33, 1),
            (17, 1, 31),
            // AVX-512 tiles of three to eight rows over panel pairs, a lone last panel.
            (3, 32, 5),
            (8, 48, 37),
            (24, 50, 19),
        ] {
            let x = rng.vec_uniform(m * k, -2.0, 2.0);
            let w32 = rng.vec_uniform(n * k, -1.0, 1.0);
            let wb: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
            let wb32: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
            for (packed, wref) in [
                (PackedDense::pack_f32(n, k, &w32).unwrap(), &w32),
                (PackedDense::pack_bf16(n, k, &wb).unwrap(), &wb32),
            ] {
                let want = dense_reference(m, n, k, &x, wref);
                for ks in &sets {
                    for par in [Par::Seq, Par::Rayon] {
                        let mut out = vec![f32::NAN; m * n];
                        dense_gemm(ks, m, &x, &packed, &mut out, par).unwrap();
                        let same = out
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{} m={m} n={n} k={k} bf16={}",
                            ks.isa(),
                            packed.is_bf16()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn wrong_lengths_are_typed_errors() {
        let w = PackedDense::pack_f32(2, 3, &[0.0; 6]).unwrap();
        let ks = KernelSet::scalar();
        let mut out = vec![0f32; 4];
        assert!(matches!(
            dense_gemm(&ks, 2, &[0.0; 5], &w, &mut out, Par::Seq),
            Err(KernelError::LengthMismatch {
                tensor: "x",
                expected: 6,
                got: 5
            })
        ));
        assert!(matches!(
            dense_gemm(&ks, 2, &[0.0; 6], &w, &mut out[..3], Par::Seq),
            Err(KernelError::LengthMismatch {
                tensor: "out",
                expected: 4,
                got: 3
            })
        ));
    }
}
