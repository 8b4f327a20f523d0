//! The 256-bit microkernel bodies shared by the AVX2 and AVX-VNNI rungs, written once as
//! macros and instantiated in each rung's file with that rung's `#[target_feature]` list and
//! dot-product helpers (macros rather than generics, so that every helper is compiled with the
//! same features as the body and inlines into it).
//!
//! Tiles are 4 rows × 16 channels, each row holding two 8-lane i32 accumulators (channels 0..8
//! and 8..16 of the panel: bytes 0..32 and 32..64 of every packed step).
//!
//! - [`ymm_kernels!`]: the load and store helpers and the W8A8 tile body, for both rungs. The
//!   invoking module provides `w8_dot(acc, a, w) -> __m256i`: `acc` plus the per-lane `Σ a·w`
//!   of one 4-byte group in the rung's W8A8 encoding, and `W8_OFFSET`: 128 when that encoding
//!   is `q + 128` (compensated with `128·Σw`), 0 when the activations stay signed.
//! - [`ymm_w4a8_offset_tile!`]: the W4A8 tile body of the AVX-VNNI rung (activations encoded
//!   `q + 128`), with `w4_dot(acc, a_lo, w_lo, a_hi, w_hi) -> __m256i` from the invoking module:
//!   `acc` plus the per-lane sums of `u8 a × s8 w` over both 4-byte groups. The AVX2 rung has
//!   its own W4A8 body (`avx2.rs`), which sums its products in 16-bit lanes first.
//!
//! The invoking module then joins its tiles with `impl_microkernels!`.

macro_rules! ymm_kernels {
    ($features:literal, $token:ty, $isa:expr) => {
        use std::arch::x86_64::*;

        use crate::packed::PANEL;
        use crate::ukernel::{W4A8Job, W4A8Out, W8A8Job};

        /// Rows per tile.
        const MR: usize = 4;

        /// Loads 32 bytes.
        #[target_feature(enable = $features)]
        #[inline]
        fn load_bytes(bytes: &[u8; 32]) -> __m256i {
            // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
            unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
        }

        /// Loads 8 i32.
        #[target_feature(enable = $features)]
        #[inline]
        fn load_i32(v: &[i32; 8]) -> __m256i {
            // SAFETY: the reference covers 32 readable bytes; the load is unaligned.
            unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
        }

        /// Loads 8 f32.
        #[target_feature(enable = $features)]
        #[inline]
        fn load_f32(v: &[f32; 8]) -> __m256 {
            // SAFETY: the reference covers 8 readable f32; the load is unaligned.
            unsafe { _mm256_loadu_ps(v.as_ptr()) }
        }

        /// Writes the first `valid` of 16 values to `dst`.
        ///
        /// # Safety
        /// - `dst` is valid for `valid` f32 writes that no one else accesses meanwhile.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn store16(dst: *mut f32, lo: __m256, hi: __m256, valid: usize) {
            let mut tmp = [0f32; 16];
            // SAFETY: `tmp` holds 16 f32; this unaligned store covers elements 0..8.
            unsafe { _mm256_storeu_ps(tmp[..8].as_mut_ptr(), lo) };
            // SAFETY: as above, elements 8..16.
            unsafe { _mm256_storeu_ps(tmp[8..].as_mut_ptr(), hi) };
            // SAFETY: `valid ≤ 16` values from a local array to the caller's valid destination.
            unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid) };
        }

        /// Writes rows `m0..m0 + R` of a W4A8 tile's panel `p`: each row's f32 sums (channels
        /// 0..8 and 8..16) times the row's reciprocal activation scale, plus the panel's bias,
        /// in the contract's epilogue order.
        ///
        /// # Safety
        /// - `ptr` and `ld` are the job's [`W4A8Out::Values`], valid and exclusively ours for
        ///   rows `m0..m0+R` of panel `p`.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn store_w4a8_rows<const R: usize>(
            job: &W4A8Job<'_>,
            p: usize,
            m0: usize,
            sums: &[[__m256; 2]; R],
            ptr: *mut f32,
            ld: usize,
        ) {
            let w = job.w;
            let valid = PANEL.min(w.n() - p * PANEL);
            let bias = w.panel_bias(p).map(|b| {
                [
                    load_f32(b[..8].try_into().unwrap()),
                    load_f32(b[8..].try_into().unwrap()),
                ]
            });
            for r in 0..R {
                let recip = _mm256_set1_ps(job.row_recip[m0 + r]);
                let mut y = [
                    _mm256_mul_ps(sums[r][0], recip),
                    _mm256_mul_ps(sums[r][1], recip),
                ];
                if let Some(bias) = bias {
                    y = [_mm256_add_ps(y[0], bias[0]), _mm256_add_ps(y[1], bias[1])];
                }
                let dst = ptr.wrapping_add((m0 + r) * ld + p * PANEL);
                // SAFETY: row `m0 + r < m`, channels `16p..16p + valid < N`, inside the
                // validated output and owned by this call.
                unsafe { store16(dst, y[0], y[1], valid) };
            }
        }

        /// The W8A8 tile body for `R` rows.
        ///
        /// # Safety
        /// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of
        ///   panel `p`.
        #[target_feature(enable = $features)]
        unsafe fn w8a8_tile<const R: usize>(job: &W8A8Job<'_>, p: usize, m0: usize) {
            let w = job.w;
            let k_pad = w.k_pad();
            let bytes = w.panel_bytes(p);
            let (weight_steps, _) = bytes.as_chunks::<64>();
            let mut row_steps: [&[[u8; 4]]; R] = [&[]; R];
            for r in 0..R {
                row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<4>().0;
            }
            for a in &row_steps {
                assert_eq!(a.len(), weight_steps.len());
            }
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            for (i, step) in weight_steps.iter().enumerate() {
                // SAFETY: `[i8; 64]` and `[u8; 64]` have the same size, alignment and validity.
                let step = unsafe { &*(step as *const [i8; 64]).cast::<[u8; 64]>() };
                let halves = step.as_chunks::<32>().0;
                for h in 0..2 {
                    let v = load_bytes(&halves[h]);
                    for r in 0..R {
                        let a = _mm256_set1_epi32(i32::from_le_bytes(row_steps[r][i]));
                        acc[r][h] = w8_dot(acc[r][h], a, v);
                    }
                }
            }
            let valid = PANEL.min(w.n() - p * PANEL);
            let (wsum, scales) = (w.panel_wsum(p), w.panel_scales(p));
            let comp = [
                _mm256_mullo_epi32(
                    load_i32(wsum[..8].try_into().unwrap()),
                    _mm256_set1_epi32(W8_OFFSET),
                ),
                _mm256_mullo_epi32(
                    load_i32(wsum[8..].try_into().unwrap()),
                    _mm256_set1_epi32(W8_OFFSET),
                ),
            ];
            let sc = [
                load_f32(scales[..8].try_into().unwrap()),
                load_f32(scales[8..].try_into().unwrap()),
            ];
            for r in 0..R {
                let xs = _mm256_set1_ps(job.row_scale[m0 + r]);
                let mut y = [_mm256_setzero_ps(); 2];
                for h in 0..2 {
                    let exact = _mm256_sub_epi32(acc[r][h], comp[h]);
                    y[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), _mm256_mul_ps(xs, sc[h]));
                }
                let dst = job.out.wrapping_add((m0 + r) * job.ld + p * PANEL);
                // SAFETY: row `m0 + r < m`, channels `16p..16p + valid < N`, inside the
                // validated output and owned by this call.
                unsafe { store16(dst, y[0], y[1], valid) };
            }
        }
    };
}

pub(super) use ymm_kernels;

/// The W4A8 tile body of the rungs whose dot product accumulates `u8 × s8` in 32-bit lanes
/// (`vpdpbusd`): activations encoded `q + 128`, weights `w = c − 8` as signed bytes, and the
/// block's weight sums from a virtual row of ones. Invoked after [`ymm_kernels!`] in the same
/// module, which provides the helpers; the module provides `w4_dot`.
macro_rules! ymm_w4a8_offset_tile {
    ($features:literal) => {
        /// The W4A8 tile body for `R` rows; `ACC` selects block-accumulator output.
        ///
        /// # Safety
        /// - The job's output pointer is valid and exclusively ours for rows `m0..m0+R` of
        ///   panel `p`.
        #[target_feature(enable = $features)]
        unsafe fn w4a8_tile<const R: usize, const ACC: bool>(
            job: &W4A8Job<'_>,
            p: usize,
            m0: usize,
        ) {
            let w = job.w;
            let (k_pad, steps_per_block, n_blocks) = (w.k_pad(), w.block_len() / 8, w.n_blocks());
            let nibbles = w.panel_nibbles(p);
            let (weight_steps, _) = nibbles.as_chunks::<64>();
            // Loops, not `array::from_fn`: closures do not inherit `#[target_feature]`, so
            // vectors built in one would travel through memory.
            let mut row_steps: [&[[u8; 8]]; R] = [&[]; R];
            for r in 0..R {
                row_steps[r] = job.a[(m0 + r) * k_pad..][..k_pad].as_chunks::<8>().0;
            }
            let mask = _mm256_set1_epi8(0x0F);
            let eight = _mm256_set1_epi8(8);
            // The block's weight sums are the dot of the weights with a virtual row of ones.
            let ones = _mm256_set1_epi8(1);
            let mut acc_f = [[_mm256_setzero_ps(); 2]; R];
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
                let mut acc = [[_mm256_setzero_si256(); 2]; R];
                let mut wsum = [_mm256_setzero_si256(); 2];
                for (i, w_step) in w_block.iter().enumerate() {
                    let halves = w_step.as_chunks::<32>().0;
                    let mut a_lo = [_mm256_setzero_si256(); R];
                    let mut a_hi = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let a = &a_block[r][i];
                        a_lo[r] = _mm256_set1_epi32(i32::from_le_bytes([a[0], a[1], a[2], a[3]]));
                        a_hi[r] = _mm256_set1_epi32(i32::from_le_bytes([a[4], a[5], a[6], a[7]]));
                    }
                    for h in 0..2 {
                        let v = load_bytes(&halves[h]);
                        let lo = _mm256_sub_epi8(_mm256_and_si256(v, mask), eight);
                        let hi = _mm256_sub_epi8(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask),
                            eight,
                        );
                        for r in 0..R {
                            acc[r][h] = w4_dot(acc[r][h], a_lo[r], lo, a_hi[r], hi);
                        }
                        wsum[h] = w4_dot(wsum[h], ones, lo, ones, hi);
                    }
                }
                let block_scales = w.block_scales(p, b);
                for h in 0..2 {
                    let ws = wsum[h];
                    let sc = load_f32(block_scales[8 * h..][..8].try_into().unwrap());
                    for r in 0..R {
                        let corr = _mm256_set1_epi32(job.row_corr[m0 + r]);
                        let acc_i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(corr, ws));
                        match job.out {
                            W4A8Out::BlockAcc { ptr } if ACC => {
                                let at = ((m0 + r) * n_blocks + b) * PANEL * w.n_panels()
                                    + p * PANEL
                                    + 8 * h;
                                // SAFETY: the driver sized the buffer `[m][n_blocks][n_pad]`;
                                // these 8 channels of row `m0 + r` belong to this call alone.
                                unsafe { _mm256_storeu_si256(ptr.wrapping_add(at).cast(), acc_i) };
                            }
                            _ => {
                                let term = _mm256_mul_ps(_mm256_cvtepi32_ps(acc_i), sc);
                                acc_f[r][h] = _mm256_add_ps(acc_f[r][h], term);
                            }
                        }
                    }
                }
            }
            if let W4A8Out::Values { ptr, ld } = job.out {
                // SAFETY: our contract.
                unsafe { store_w4a8_rows::<R>(job, p, m0, &acc_f, ptr, ld) };
            }
        }
    };
}

pub(super) use ymm_w4a8_offset_tile;
