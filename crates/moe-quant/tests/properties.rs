//! Property tests: packing round trips in both orders, and reconstruction error bounds of every
//! quantizer (int8 per-row weights, int4 groups, asymmetric and symmetric activations).
//! Case counts come from `moe_testutil::proptest_cases` (`MOE_PROPTEST_CASES` raises them).

use half::bf16;
use moe_quant::act::{quantize_row_asym_i8, quantize_row_sym_i8};
use moe_quant::int4::{dequantize_int4_grouped, quantize_int4_grouped};
use moe_quant::int8::{dequantize_int8_per_row, quantize_int8_per_row};
use moe_quant::pack::{pack_int4_pairs, pack_to_int32, unpack_from_int32, unpack_int4_pairs};
use proptest::prelude::*;

/// Allowed excess over half a quantization step, in steps: the f32 rounding of `x / scale` or
/// `x · (127 / amax)` (a few ulps of a value up to 255) can push an exact tie just past 0.5.
const SLACK: f32 = 1e-4;

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(moe_testutil::proptest_cases(256))
}

/// A `[rows, cols]` matrix of int4 codes with an even number of columns (the pair layout).
fn int4_codes_even_width() -> impl Strategy<Value = (usize, usize, Vec<i8>)> {
    (1usize..5, 1usize..40).prop_flat_map(|(rows, half)| {
        let cols = 2 * half;
        proptest::collection::vec(-8i8..=7, rows * cols).prop_map(move |v| (rows, cols, v))
    })
}

/// A row of floats with a random magnitude, so tiny and large ranges are both covered.
fn float_row(max_len: usize) -> impl Strategy<Value = Vec<f32>> {
    (
        proptest::collection::vec(-1.0f32..1.0, 1..max_len),
        -20i32..20,
    )
        .prop_map(|(v, e)| v.into_iter().map(|x| x * 2f32.powi(e)).collect())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn pack_to_int32_round_trips(bits in 1u32..=8, seed in any::<u64>()) {
        let mut rng = moe_testutil::SplitMix64::new(seed);
        let rows = rng.range_i64(1, 4) as usize;
        let cols = rng.range_i64(1, 70) as usize;
        let lo = -(1i64 << (bits - 1));
        let hi = (1i64 << (bits - 1)) - 1;
        let v: Vec<i8> = (0..rows * cols).map(|_| rng.range_i64(lo, hi) as i8).collect();
        let packed = pack_to_int32(&v, rows, cols, bits).unwrap();
        prop_assert_eq!(packed.len(), rows * (cols * bits as usize).div_ceil(32));
        prop_assert_eq!(unpack_from_int32(&packed, rows, cols, bits).unwrap(), v);
    }

    #[test]
    fn int4_pairs_round_trip_and_match_int32_bytes((rows, cols, v) in int4_codes_even_width()) {
        let bytes = pack_int4_pairs(&v, rows, cols).unwrap();
        prop_assert_eq!(unpack_int4_pairs(&bytes, rows, cols).unwrap(), v.clone());
        if cols % 8 == 0 {
            let words = pack_to_int32(&v, rows, cols, 4).unwrap();
            let le: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            prop_assert_eq!(le, bytes);
        }
    }

    #[test]
    fn int8_per_row_error_within_half_scale(row in float_row(200), rows in 1usize..4) {
        let cols = row.len();
        let w: Vec<f32> = (0..rows).flat_map(|r| row.iter().map(move |&x| x * (r + 1) as f32)).collect();
        let q = quantize_int8_per_row(&w, rows, cols).unwrap();
        let deq = dequantize_int8_per_row(&q.codes, &q.scales, cols).unwrap();
        for (i, (&x, &y)) in w.iter().zip(&deq).enumerate() {
            let s = q.scales[i / cols];
            prop_assert!((x - y).abs() <= s * (0.5 + SLACK), "x {x} y {y} scale {s}");
        }
        prop_assert!(q.codes.iter().all(|&c| c >= -127));
    }

    #[test]
    fn int8_per_row_bf16_error_bound(row in float_row(200)) {
        // The quotient (|quotient| <= 127) is rounded to bf16, whose spacing below 128 is at
        // most 0.5, so it moves by at most 0.25 before the rounding to an integer: the bound is
        // (0.5 + 0.25)·scale with the scale the codes are dequantized with.
        let w: Vec<bf16> = row.iter().map(|&x| bf16::from_f32(x)).collect();
        let q = quantize_int8_per_row(&w, 1, w.len()).unwrap();
        let s = q.scales[0];
        for (&x, &c) in w.iter().zip(&q.codes) {
            prop_assert!((x.to_f32() - f32::from(c) * s).abs() <= 0.75 * s);
        }
    }

    #[test]
    fn int4_group_error_within_half_scale(
        groups in 1usize..6,
        g in prop::sample::select(vec![1usize, 2, 8, 32, 64]),
        rows in 1usize..4,
        seed in any::<u64>(),
    ) {
        let cols = groups * g;
        let mut rng = moe_testutil::SplitMix64::new(seed);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-3.0, 3.0)).collect();
        let q = quantize_int4_grouped(&w, rows, cols, Some(g)).unwrap();
        let deq = dequantize_int4_grouped(&q.codes, &q.scales, rows, cols, Some(g)).unwrap();
        for (i, (&x, &y)) in w.iter().zip(&deq).enumerate() {
            let s = q.scales[i / g];
            prop_assert!((x - y).abs() <= s * (0.5 + SLACK), "x {x} y {y} scale {s}");
        }
    }

    #[test]
    fn asym_act_reconstruction_error(row in float_row(300)) {
        let mut q = vec![0i8; row.len()];
        let p = quantize_row_asym_i8(&row, &mut q);
        let amax = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (&x, &c) in row.iter().zip(&q) {
            let err = (p.dequantize(c) - x).abs();
            prop_assert!(
                err <= p.recip * (0.5 + SLACK) + 1e-6 * amax,
                "x {x} code {c} zp {} recip {}", p.zero_point, p.recip
            );
        }
        // The zero point represents 0.0 exactly.
        prop_assert!((-128..=127).contains(&p.zero_point));
    }

    #[test]
    fn sym_act_reconstruction_error(row in float_row(300)) {
        let mut q = vec![0i8; row.len()];
        let s = quantize_row_sym_i8(&row, &mut q);
        for (&x, &c) in row.iter().zip(&q) {
            prop_assert!((f32::from(c) * s - x).abs() <= s * (0.5 + SLACK));
            prop_assert!(c >= -127);
        }
    }
}
