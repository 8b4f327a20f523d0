//! The scaffolding of the x86 W4A8 tile bodies, written once: slicing the rows' activation
//! steps, the loop over scale blocks, where each block's exact sums go (added into the rows'
//! f32 accumulators in the reference order, or stored as block accumulators for the tests that
//! compare rungs exactly), and the final scaling by the row factor, the bias and the masked
//! store. A macro, like `ymm_kernels!`, so that the body and every helper it calls compile with
//! the invoking rung's target features.
//!
//! The invoking module provides, for one panel's 16 channels:
//!
//! - `I32s` and `F32s`: the channels' i32 sums and f32 values (one 512-bit vector, or two
//!   256-bit halves);
//! - `W4Tile<R>` with `W4Tile::new(job, m0, n_blocks)`: what every block of a tile needs (the
//!   rows' corrections);
//! - `block_sums::<R, ACC>(&tile, w_block, a_block, b) -> [I32s; R]`: the exact
//!   `Σ (q − zp)·w` of each row over scale block `b`, from the block's packed weight steps and
//!   the rows' activation steps in the rung's encoding (what the rungs do differently:
//!   unpacking, dot products, corrections). `ACC` is the tile's; each instance has one caller,
//!   so the compiler inlines it and the sums stay in registers;
//! - `zero_f32s()`, `load_f32s(&[f32; 16])`, `add_scaled(acc, sums, scales)` (`acc +
//!   f32(sums)·scales`, multiply then add), `scale_row(acc, recip, bias)` (`acc·recip`, then
//!   `+ bias`), `store_i32s(ptr, sums)` and `store_f32s(ptr, values, valid)` (the first
//!   `valid` channels).

macro_rules! w4a8_tile_scaffold {
    ($features:literal) => {
        /// The W4A8 tile body for `R` rows of panel `p` from row `m0`; `ACC` selects
        /// block-accumulator output.
        ///
        /// # Safety
        /// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of
        ///   panel `p` (see [`crate::ukernel::W4A8PanelsFn`]), and the job's rows and
        ///   corrections are in this rung's encoding.
        #[target_feature(enable = $features)]
        unsafe fn w4a8_tile<const R: usize, const ACC: bool>(
            job: &$crate::ukernel::W4A8Job<'_>,
            p: usize,
            m0: usize,
        ) {
            use $crate::packed::PANEL;
            use $crate::ukernel::W4A8Out;
            let w = job.w;
            let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
            // Steps as fixed-size chunks, so the inner loop indexes arrays with one proven
            // bound. Loops, not `array::from_fn`: closures do not inherit `#[target_feature]`.
            let (weight_steps, _) = w.panel_nibbles(p).as_chunks::<64>();
            let mut row_steps: [&[[u8; 8]]; R] = [&[]; R];
            for r in 0..R {
                row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0;
            }
            let tile = W4Tile::<R>::new(job, m0, n_blocks);
            let mut acc_f = [zero_f32s(); R];
            for b in 0..n_blocks {
                let steps = b * steps_per_block..(b + 1) * steps_per_block;
                let w_block = &weight_steps[steps.clone()];
                let mut a_block: [&[[u8; 8]]; R] = [&[]; R];
                for r in 0..R {
                    a_block[r] = &row_steps[r][steps.clone()];
                }
                for a in &a_block {
                    assert_eq!(a.len(), w_block.len());
                }
                let sums: [I32s; R] = block_sums::<R, ACC>(&tile, w_block, &a_block, b);
                match job.out {
                    W4A8Out::BlockAcc { ptr } if ACC => {
                        for r in 0..R {
                            let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels() + p * PANEL;
                            // SAFETY: the driver sized the accumulator buffer
                            // `[m][n_blocks][n_pad]`; these 16 channels of row `m0 + r` belong to
                            // this call alone.
                            unsafe { store_i32s(ptr.wrapping_add(at), sums[r]) };
                        }
                    }
                    _ => {
                        let sc = load_f32s(&w.block_scales(p, b));
                        for r in 0..R {
                            acc_f[r] = add_scaled(acc_f[r], sums[r], sc);
                        }
                    }
                }
            }
            if let W4A8Out::Values { ptr, ld } = job.out {
                let valid = PANEL.min(w.n() - p * PANEL);
                let bias = w.panel_bias(p).map(|b| load_f32s(b.try_into().unwrap()));
                for r in 0..R {
                    let y = scale_row(acc_f[r], job.row_recip[m0 + r], bias);
                    let dst = ptr.wrapping_add((m0 + r) * ld + p * PANEL);
                    // SAFETY: row `m0 + r < m` and channels `16p..16p + valid < N` lie inside
                    // the validated output and belong to this call.
                    unsafe { store_f32s(dst, y, valid) };
                }
            }
        }
    };
}

pub(super) use w4a8_tile_scaffold;
