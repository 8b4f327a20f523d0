//! The W8A8 scalar rung: the reference GEMM on unpacked operands and the scalar microkernel
//! over the packed format. Dequantisation is `f32(Σ q·w) · (xs[m] · ws[n])` (spec §5.3).

use std::ops::Range;

use super::Scalar;
use crate::packed::PANEL;
use crate::packed::w8a8::K_STEP;
use crate::ukernel::{W8A8Job, W8A8Microkernel, w8a8_panels};

/// Unpacked operands of the reference W8A8 GEMM.
#[derive(Debug, Clone, Copy)]
pub struct W8A8RefArgs<'a> {
    /// Rows M.
    pub m: usize,
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// Symmetric activation codes `[M, K]`.
    pub q: &'a [i8],
    /// Activation scale per row `[M]`.
    pub row_scale: &'a [f32],
    /// Weights `[N, K]`.
    pub w: &'a [i8],
    /// Weight scale per channel `[N]`.
    pub scales: &'a [f32],
}

/// The exact integer dot products `Σ_k q·w`, `[M, N]`.
pub fn w8a8_reference_acc(args: &W8A8RefArgs<'_>) -> Vec<i32> {
    let W8A8RefArgs { m, n, k, q, w, .. } = *args;
    let mut acc = vec![0i32; m * n];
    for row in 0..m {
        for col in 0..n {
            acc[row * n + col] = (0..k)
                .map(|kk| i32::from(q[row * k + kk]) * i32::from(w[col * k + kk]))
                .sum();
        }
    }
    acc
}

/// The reference W8A8 GEMM, `out[M, N] = f32(Σ q·w) · (xs[m] · ws[n])`.
pub fn w8a8_reference(args: &W8A8RefArgs<'_>) -> Vec<f32> {
    let acc = w8a8_reference_acc(args);
    let mut out = vec![0f32; args.m * args.n];
    for row in 0..args.m {
        for col in 0..args.n {
            out[row * args.n + col] =
                acc[row * args.n + col] as f32 * (args.row_scale[row] * args.scales[col]);
        }
    }
    out
}

impl W8A8Microkernel for Scalar {
    const MR: usize = 1;

    #[inline(always)]
    unsafe fn tile(self, job: &W8A8Job<'_>, p: usize, m0: usize, mr: usize) {
        debug_assert!(mr == 1 && m0 < job.m);
        let w = job.w;
        let k_pad = w.k_pad();
        let a = &job.a[m0 * k_pad..][..k_pad];
        let mut acc = [0i32; PANEL];
        for s in 0..k_pad / K_STEP {
            // The step in the lane order, whatever order the panel is stored in.
            for (j, &wv) in w.lanes_step(p, s).iter().enumerate() {
                acc[j / 4] += i32::from(a[K_STEP * s + j % 4] as i8) * i32::from(wv);
            }
        }
        let scales = w.panel_scales(p);
        let xs = job.row_scale[m0];
        for c in 0..PANEL.min(w.n() - p * PANEL) {
            let y = acc[c] as f32 * (xs * scales[c]);
            // SAFETY: channel `16p + c < N` of row `m0 < m`, inside the validated output and
            // owned by this call (disjoint panels).
            unsafe { *job.out.wrapping_add(m0 * job.ld + p * PANEL + c) = y };
        }
    }
}

/// The scalar rung's entry point.
///
/// # Safety
/// - The job satisfies [`crate::ukernel::W8A8PanelsFn`]'s contract (no CPU feature needed).
pub(crate) unsafe fn w8a8_entry(job: &W8A8Job<'_>, panels: Range<usize>) {
    // SAFETY: forwarded from this function's contract; `Scalar` needs no CPU feature.
    unsafe { w8a8_panels(Scalar, job, panels) }
}
