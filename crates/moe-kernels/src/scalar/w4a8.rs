//! The W4A8 scalar rung: spec §4.5 written out literally on unpacked operands (the oracle), and
//! the scalar microkernel over the packed format.

use std::ops::Range;

use super::Scalar;
use crate::packed::PANEL;
use crate::packed::w4a8::K_STEP;
use crate::ukernel::{W4A8Job, W4A8Microkernel, W4A8Out, w4a8_panels};

/// Unpacked operands of the reference W4A8 GEMM.
#[derive(Debug, Clone, Copy)]
pub struct W4A8RefArgs<'a> {
    /// Rows M.
    pub m: usize,
    /// Output channels N.
    pub n: usize,
    /// Reduction dimension K.
    pub k: usize,
    /// Activation codes `[M, K]`.
    pub q: &'a [i8],
    /// Zero point per row `[M]`.
    pub zero_point: &'a [i32],
    /// Dequantisation factor per row `[M]`.
    pub recip: &'a [f32],
    /// int4 weights `[N, K]` in `[-8, 7]`.
    pub w: &'a [i8],
    /// K values per scale block (`K` for channelwise).
    pub block_len: usize,
    /// f32 scales `[N, K / block_len]` (bf16 group scales already widened).
    pub scales: &'a [f32],
    /// Optional bias `[N]`.
    pub bias: Option<&'a [f32]>,
}

/// The integer block accumulators `acc_i[m][n][b] = Σ_{k∈b} (q − zp)·w` of spec §4.5.
pub fn w4a8_reference_block_acc(args: &W4A8RefArgs<'_>) -> Vec<i32> {
    let W4A8RefArgs {
        m,
        n,
        k,
        q,
        zero_point,
        w,
        block_len,
        ..
    } = *args;
    let n_blocks = k / block_len;
    let mut acc = vec![0i32; m * n * n_blocks];
    for row in 0..m {
        for col in 0..n {
            for b in 0..n_blocks {
                acc[(row * n + col) * n_blocks + b] = (b * block_len..(b + 1) * block_len)
                    .map(|kk| {
                        (i32::from(q[row * k + kk]) - zero_point[row]) * i32::from(w[col * k + kk])
                    })
                    .sum();
            }
        }
    }
    acc
}

/// The reference W4A8 GEMM of spec §4.5: `out[M, N]`, blocks summed in order in f32 from 0,
/// then `· recip`, then `+ bias`.
pub fn w4a8_reference(args: &W4A8RefArgs<'_>) -> Vec<f32> {
    let (m, n, k) = (args.m, args.n, args.k);
    let n_blocks = k / args.block_len;
    let acc = w4a8_reference_block_acc(args);
    let mut out = vec![0f32; m * n];
    for row in 0..m {
        for col in 0..n {
            let mut acc_f = 0.0f32;
            for b in 0..n_blocks {
                acc_f +=
                    acc[(row * n + col) * n_blocks + b] as f32 * args.scales[col * n_blocks + b];
            }
            let mut y = acc_f * args.recip[row];
            if let Some(bias) = args.bias {
                y += bias[col];
            }
            out[row * n + col] = y;
        }
    }
    out
}

impl W4A8Microkernel for Scalar {
    const MR: usize = 1;

    #[inline(always)]
    unsafe fn tile(self, job: &W4A8Job<'_>, p: usize, m0: usize, mr: usize) {
        debug_assert!(mr == 1 && m0 < job.m);
        let w = job.w;
        let (k_pad, block_len, n_blocks) = (w.k_pad(), w.block_len(), w.n_blocks());
        let a = &job.a[m0 * k_pad..][..k_pad];
        let zp = job.row_corr[m0];
        let mut acc_f = [0f32; PANEL];
        for b in 0..n_blocks {
            let mut acc = [0i32; PANEL];
            for s in b * block_len / K_STEP..(b + 1) * block_len / K_STEP {
                // The step in the lane order, whatever order the panel is stored in.
                let chunk = w.lanes_step(p, s);
                for (j, &byte) in chunk.iter().enumerate() {
                    let lo = i32::from(byte & 0x0F) - 8;
                    let hi = i32::from(byte >> 4) - 8;
                    let a_lo = i32::from(a[K_STEP * s + j % 4] as i8) - zp;
                    let a_hi = i32::from(a[K_STEP * s + 4 + j % 4] as i8) - zp;
                    acc[j / 4] += a_lo * lo + a_hi * hi;
                }
            }
            match job.out {
                W4A8Out::BlockAcc { ptr } => {
                    let at = (m0 * n_blocks + b) * PANEL * w.n_panels() + p * PANEL;
                    for (c, v) in acc.iter().enumerate() {
                        // SAFETY: the driver made `ptr` valid for the whole `[m][n_blocks][n_pad]`
                        // buffer, and this panel's 16 channels belong to this call alone.
                        unsafe { *ptr.wrapping_add(at + c) = *v };
                    }
                }
                W4A8Out::Values { .. } => {
                    let scales = w.block_scales(p, b);
                    for c in 0..PANEL {
                        acc_f[c] += acc[c] as f32 * scales[c];
                    }
                }
            }
        }
        if let W4A8Out::Values { ptr, ld } = job.out {
            let bias = w.panel_bias(p);
            let recip = job.row_recip[m0];
            for c in 0..PANEL.min(w.n() - p * PANEL) {
                let mut y = acc_f[c] * recip;
                if let Some(bias) = bias {
                    y += bias[c];
                }
                // SAFETY: channel `16p + c < N` of row `m0 < m`, inside the output the driver
                // validated, and owned by this call (disjoint panels).
                unsafe { *ptr.wrapping_add(m0 * ld + p * PANEL + c) = y };
            }
        }
    }
}

/// The scalar rung's entry point.
///
/// # Safety
/// - The job satisfies [`crate::ukernel::W4A8PanelsFn`]'s contract (no CPU feature needed).
pub(crate) unsafe fn w4a8_entry(job: &W4A8Job<'_>, panels: Range<usize>) {
    // SAFETY: forwarded from this function's contract; `Scalar` needs no CPU feature.
    unsafe { w4a8_panels(Scalar, job, panels) }
}
