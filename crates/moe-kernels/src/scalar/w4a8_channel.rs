//! Int4 weights with group scales requantised to int8 with one scale per output channel: the
//! numerics of [`crate::W4A8Prefill::ChannelInt8`], written out on unpacked operands (the
//! oracle its tile body is tested against bit for bit).
//!
//! A channel's group scales `s_b` become one scale `S/16`, `S = max_b |s_b|`, and each code
//! `q ∈ [-8, 7]` of block `b` the int8 value `clamp((q·R_b + 64) >> 7)` with the ratio
//! `R_b = round(2048·s_b/S)` (ties to even, `|R_b| ≤ 2048`). The block of largest scale keeps
//! its codes exactly (`16q`); the others round to a grid 16 times finer than that block's int4
//! steps, so the weights move by at most `S/32` (half an int8 step). A channel whose scales
//! include a non-finite value gets a NaN scale and zero codes, so its outputs are NaN; one
//! whose scales are all zero gets zero.
//!
//! The activations are the W4A8 GEMM's own (asymmetric int8 per row), so the whole of K sums
//! in one int32, `acc = Σ_k (q_x − zp)·w8`, and `y = f32(acc)·(S/16)·recip + bias`.

use super::w4a8::W4A8RefArgs;

/// `R_b` of a block whose scale equals the channel's largest: the ratio's fixed point.
pub const RATIO_ONE: i32 = 1 << 11;

/// Right shift that takes `q·R_b` to the int8 grid (`16·q` when `R_b` is [`RATIO_ONE`]).
pub const RATIO_SHIFT: u32 = 7;

/// Largest K whose int32 sums `Σ_k (q_x − zp)·w8` cannot overflow: `255·128·K < 2^31`.
pub const MAX_K: usize = 1 << 16;

/// A channel's int8 scale and the ratios of its block scales `scales` (in K order).
pub fn channel_ratios(scales: &[f32]) -> (f32, Vec<i32>) {
    if scales.iter().any(|s| !s.is_finite()) {
        return (f32::NAN, vec![0; scales.len()]);
    }
    let max = scales.iter().fold(0f32, |m, s| m.max(s.abs()));
    if max == 0.0 {
        return (0.0, vec![0; scales.len()]);
    }
    let ratios = scales
        .iter()
        .map(|&s| (s / max * RATIO_ONE as f32).round_ties_even() as i32)
        .collect();
    (max * (1.0 / 16.0), ratios)
}

/// The int8 value of code `q` in a block of ratio `ratio`.
pub fn requantize(q: i8, ratio: i32) -> i8 {
    let r = (i32::from(q) * ratio + (1 << (RATIO_SHIFT - 1))) >> RATIO_SHIFT;
    r.clamp(i32::from(i8::MIN), i32::from(i8::MAX)) as i8
}

/// The weights of `args` requantised: `([N, K]` int8 values, `[N]` channel scales).
pub fn requantize_weights(args: &W4A8RefArgs<'_>) -> (Vec<i8>, Vec<f32>) {
    let (n, k, block_len) = (args.n, args.k, args.block_len);
    let n_blocks = k / block_len;
    let mut w8 = vec![0i8; n * k];
    let mut channel_scales = vec![0f32; n];
    for col in 0..n {
        let (scale, ratios) = channel_ratios(&args.scales[col * n_blocks..][..n_blocks]);
        channel_scales[col] = scale;
        for kk in 0..k {
            w8[col * k + kk] = requantize(args.w[col * k + kk], ratios[kk / block_len]);
        }
    }
    (w8, channel_scales)
}

/// The GEMM of [`crate::W4A8Prefill::ChannelInt8`]: `out[M, N]`, int32 sums over all of K
/// (wrapping, as the tiles'), then `· S/16`, `· recip`, `+ bias` in f32.
pub fn w4a8_channel_reference(args: &W4A8RefArgs<'_>) -> Vec<f32> {
    let (m, n, k) = (args.m, args.n, args.k);
    let (w8, scales) = requantize_weights(args);
    let mut out = vec![0f32; m * n];
    for row in 0..m {
        let zp = args.zero_point[row];
        for col in 0..n {
            let acc = (0..k).fold(0i32, |acc, kk| {
                let x = i32::from(args.q[row * k + kk]) - zp;
                acc.wrapping_add(x.wrapping_mul(i32::from(w8[col * k + kk])))
            });
            let mut y = acc as f32 * scales[col] * args.recip[row];
            if let Some(bias) = args.bias {
                y += bias[col];
            }
            out[row * n + col] = y;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_block_keeps_its_codes_and_the_others_round_to_the_finer_grid() {
        let (scale, ratios) = channel_ratios(&[0.5, 2.0, -1.0, 0.0]);
        assert_eq!(scale, 0.125);
        assert_eq!(ratios, [512, 2048, -1024, 0]);
        for q in -8..=7i8 {
            assert_eq!(requantize(q, RATIO_ONE), 16 * q);
            assert_eq!(requantize(q, 0), 0);
            assert_eq!(i32::from(requantize(q, 1024)), (i32::from(q) * 8));
        }
        // Half an int8 step rounds up; a negated largest block saturates at 127.
        assert_eq!(requantize(1, 64), 1);
        assert_eq!(requantize(1, 63), 0);
        assert_eq!(requantize(-8, -RATIO_ONE), 127);
    }

    #[test]
    fn non_finite_scales_poison_the_channel_and_zero_scales_zero_it() {
        let (scale, ratios) = channel_ratios(&[1.0, f32::INFINITY]);
        assert!(scale.is_nan());
        assert_eq!(ratios, [0, 0]);
        let (scale, ratios) = channel_ratios(&[f32::NAN, 1.0]);
        assert!(scale.is_nan());
        assert_eq!(ratios, [0, 0]);
        assert_eq!(channel_ratios(&[0.0, -0.0]), (0.0, vec![0, 0]));
    }
}
