//! PhiMoE's sparse mixer (vLLM's `phimoe_routing_function`, the inference form of SparseMixer):
//! two experts chosen one after the other. Each is the largest logit left (the first of equal
//! ones, as `torch.max` picks), weighted by a softmax over the logits close to it: those whose
//! gap below it, relative to `max(|logit|, largest)`, is at most `2ε` (`router_jitter_noise`).
//! The second choice leaves out the first. Weights are not renormalized; with `ε = 0` each is
//! one over the number of logits tied with its expert's.
//!
//! Computed in f32 from the widened logits; vLLM computes in the logits' dtype (bf16 for Phi-3.5-MoE),
//! so a logit within rounding of the threshold may be kept here and masked there.

/// Routes one token: `ids` and `weights` get the two experts in the order chosen.
pub(crate) fn route(logits: &[f32], jitter_eps: f32, ids: &mut [u32], weights: &mut [f32]) {
    let (first, w_first) = choose(logits, None, jitter_eps);
    let (second, w_second) = choose(logits, Some(first), jitter_eps);
    ids[..2].copy_from_slice(&[first as u32, second as u32]);
    weights[..2].copy_from_slice(&[w_first, w_second]);
}

/// The expert of the largest logit other than `skip`, and its weight: `1 / Σ exp(v − max)` over
/// the logits (other than `skip`) kept by the mask, the expert's own softmax value.
fn choose(logits: &[f32], skip: Option<usize>, jitter_eps: f32) -> (usize, f32) {
    let others = || {
        logits
            .iter()
            .copied()
            .enumerate()
            .filter(move |&(j, _)| Some(j) != skip)
    };
    let (best, max) = others()
        .reduce(|best, cur| if cur.1 > best.1 { cur } else { best })
        .unwrap_or((0, 0.0));
    let threshold = 2.0 * jitter_eps;
    let sum: f32 = others()
        // Masked where the relative gap is above the threshold. `factor` is 0 only for a zero
        // logit equal to the largest, whose gap, 0/0, is NaN: not above, so kept, as in torch.
        .filter(|&(_, v)| {
            let gap = (max - v) / v.abs().max(max);
            gap.partial_cmp(&threshold) != Some(std::cmp::Ordering::Greater)
        })
        .map(|(_, v)| (v - max).exp())
        .sum();
    (best, 1.0 / sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's function transcribed literally in f64: masks as `-inf`, softmax, gather.
    fn literal(scores: &[f64], eps: f64) -> ([usize; 2], [f64; 2]) {
        let argmax = |s: &[f64]| {
            let mut best = 0;
            for (j, &v) in s.iter().enumerate() {
                if v > s[best] {
                    best = j;
                }
            }
            best
        };
        let softmax_at = |s: &[f64], at: usize| {
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|v| (v - max).exp()).sum();
            (s[at] - max).exp() / sum
        };
        let mask = |s: &[f64], m: f64| -> Vec<f64> {
            s.iter()
                .zip(scores)
                .map(|(&v, &orig)| {
                    let factor = orig.abs().max(m);
                    if (m - orig) / factor > 2.0 * eps {
                        f64::NEG_INFINITY
                    } else {
                        v
                    }
                })
                .collect()
        };
        let i1 = argmax(scores);
        let w1 = softmax_at(&mask(scores, scores[i1]), i1);
        let mut rest = scores.to_vec();
        rest[i1] = f64::NEG_INFINITY;
        let i2 = argmax(&rest);
        let w2 = softmax_at(&mask(&rest, rest[i2]), i2);
        ([i1, i2], [w1, w2])
    }

    #[test]
    fn matches_the_literal_function() {
        let mut rng = moe_testutil::SplitMix64::new(5);
        for eps in [0.0f32, 0.01, 0.1, 0.5] {
            for case in 0..200 {
                // Narrow spreads make many logits fall inside the mask's band; some rows
                // straddle zero, some are all negative.
                let spread = [0.05f32, 0.5, 4.0][case % 3];
                let centre = [-1.0f32, 0.0, 2.0][case / 3 % 3];
                let logits: Vec<f32> = (0..16)
                    .map(|_| centre + rng.uniform(-spread, spread))
                    .collect();
                let (mut ids, mut weights) = ([0u32; 2], [0f32; 2]);
                route(&logits, eps, &mut ids, &mut weights);
                let wide: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
                let (want_ids, want_w) = literal(&wide, f64::from(eps));
                assert_eq!(ids.map(|i| i as usize), want_ids, "eps {eps} {logits:?}");
                for (w, want) in weights.iter().zip(want_w) {
                    assert!((f64::from(*w) - want).abs() < 1e-6, "{w} vs {want}");
                }
            }
        }
    }

    #[test]
    fn ties_and_zeros() {
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        // Without jitter only ties share a weight; the first of equals is chosen.
        route(&[1.0, 3.0, 3.0, 0.5], 0.0, &mut ids, &mut w);
        assert_eq!((ids, w), ([1, 2], [0.5, 1.0]));
        // All zero: 0/0 gaps keep every logit.
        route(&[0.0; 4], 0.0, &mut ids, &mut w);
        assert_eq!(ids, [0, 1]);
        assert_eq!(w, [0.25, 1.0 / 3.0]);
    }

    #[test]
    fn options_it_does_not_take_are_refused() {
        use crate::{Router, RouterConfig, RouterError, RoutingMethodType};
        let ok = RouterConfig::sparse_mixer(8, 0.01);
        assert_eq!(ok.routing_method_type(), RoutingMethodType::Custom);
        assert!(Router::new(ok.clone()).is_ok());
        let mut top3 = ok.clone();
        top3.top_k = 3;
        for cfg in [
            ok.clone().with_renormalize(true),
            ok.clone().with_correction_bias(vec![0.0; 8]),
            RouterConfig::sparse_mixer(8, -0.1),
            RouterConfig::sparse_mixer(8, f32::NAN),
            top3,
        ] {
            let err = Router::new(cfg).unwrap_err();
            assert!(
                matches!(
                    err,
                    RouterError::UnsupportedOption {
                        algorithm: "sparse_mixer",
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
}
