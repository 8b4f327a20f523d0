//! Documented behaviour: the tie rule, the scaling placement, expert maps, id and logit dtypes,
//! Llama4, the method-type label, and a seeded property test against the float64 reference.

mod common;

use common::{RefAlgorithm, RefSpec};
use half::{bf16, f16};
use moe_router::{
    ExpertMap, ExpertPlacement, Grouping, IdsOut, Logits, RoundingProfile, Router, RouterConfig,
    RoutingMethodType, ScalingPlacement, ScoringFunc,
};
use moe_testutil::{SplitMix64, proptest_cases};

fn route(router: &Router, logits: &[f32]) -> (Vec<f32>, Vec<i32>) {
    let k = router.config().top_k;
    let m = logits.len() / router.config().num_experts;
    let mut w = vec![0.0; m * k];
    let mut ids = vec![0; m * k];
    router
        .route_into(
            Logits::F32(logits),
            &mut w,
            IdsOut::I32(&mut ids),
            &mut router.new_scratch(),
        )
        .unwrap();
    (w, ids)
}

#[test]
fn ties_go_to_the_lower_expert_index() {
    let logits = [1.0, 3.0, 2.0, 3.0, 2.0, 3.0];
    let r = Router::new(RouterConfig::cpu_softmax(6, 4)).unwrap();
    assert_eq!(route(&r, &logits).1, [1, 3, 5, 2]);
    let r = Router::new(RouterConfig::scored_topk(6, 2, ScoringFunc::Sigmoid)).unwrap();
    assert_eq!(route(&r, &logits).1, [1, 3]);
    let all_equal = [0.25f32; 8];
    let r = Router::new(RouterConfig::cpu_softmax(8, 3).with_renormalize(true)).unwrap();
    let (w, ids) = route(&r, &all_equal);
    assert_eq!(ids, [0, 1, 2]);
    assert!(w.iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-7));
}

#[test]
fn tied_groups_go_to_the_lower_group_index() {
    // Groups of 2: group maxima 0.9, 0.9, 0.9, 0.1; keep 2 groups -> groups 0 and 1.
    let logits = [0.9, 0.0, 0.2, 0.9, 0.9, 0.8, 0.1, 0.0];
    let r = Router::new(RouterConfig::grouped_topk(
        8,
        3,
        ScoringFunc::Softmax,
        Grouping::new(4, 2),
    ))
    .unwrap();
    assert_eq!(route(&r, &logits).1, [0, 3, 2]);
}

#[test]
fn routed_scaling_on_weights_or_left_to_the_caller() {
    let logits = [0.3, -1.0, 2.0, 0.5, 0.0, 1.0, -0.5, 0.25];
    let base = RouterConfig::grouped_topk(8, 2, ScoringFunc::Sigmoid, Grouping::new(4, 2))
        .with_renormalize(true)
        .with_correction_bias(vec![0.0, 0.1, 0.0, 0.2, 0.0, 0.0, 0.3, 0.0]);
    let on_w = Router::new(
        base.clone()
            .with_routed_scaling(2.5, ScalingPlacement::OnWeights),
    )
    .unwrap();
    let on_out = Router::new(base.with_routed_scaling(2.5, ScalingPlacement::OnOutput)).unwrap();
    let (w1, ids1) = route(&on_w, &logits);
    let (w2, ids2) = route(&on_out, &logits);
    assert_eq!(ids1, ids2);
    assert_eq!(on_w.output_scale(), 1.0);
    assert_eq!(on_out.output_scale(), 2.5);
    assert!((w2.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    for (a, b) in w1.iter().zip(&w2) {
        assert!((a - 2.5 * b).abs() < 1e-6);
    }
    assert_eq!(on_w.routing_method_type(), RoutingMethodType::DeepSeekV3);
}

#[test]
fn expert_map_writes_local_ids_and_marks_other_ranks() {
    let logits = [0.0, 5.0, 1.0, 4.0, 2.0, 3.0];
    let global = Router::new(RouterConfig::cpu_softmax(6, 3)).unwrap();
    assert_eq!(route(&global, &logits).1, [1, 3, 5]);
    // Rank 1 of 2, linear: owns globals 3, 4, 5 as locals 0, 1, 2.
    let map = ExpertMap::new(6, 2, 1, ExpertPlacement::Linear).unwrap();
    let local = Router::new(RouterConfig::cpu_softmax(6, 3).with_expert_map(map)).unwrap();
    let (w, ids) = route(&local, &logits);
    assert_eq!(ids, [ExpertMap::NOT_LOCAL, 0, 2]);
    assert_eq!(w, route(&global, &logits).0);
    // Round robin, rank 1 of 2: owns globals 1, 3, 5.
    let map = ExpertMap::new(6, 2, 1, ExpertPlacement::RoundRobin).unwrap();
    let rr = Router::new(RouterConfig::cpu_softmax(6, 3).with_expert_map(map)).unwrap();
    assert_eq!(route(&rr, &logits).1, [0, 1, 2]);
}

#[test]
fn i64_ids_and_16_bit_logits() {
    let logits = [0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75, 0.0, 1.0];
    let r = Router::new(
        RouterConfig::cpu_softmax(4, 2)
            .with_renormalize(true)
            .with_rounding(RoundingProfile::TorchEager),
    )
    .unwrap();
    let (w32, ids32) = route(&r, &logits);
    let mut scratch = r.new_scratch();
    for logits16 in [
        Logits::Bf16(&logits.map(bf16::from_f32)),
        Logits::F16(&logits.map(f16::from_f32)),
    ] {
        let mut w = [0.0; 4];
        let mut ids = [0i64; 4];
        assert_eq!(
            r.route_into(logits16, &mut w, IdsOut::I64(&mut ids), &mut scratch),
            Ok(2)
        );
        assert_eq!(ids.map(|i| i as i32), ids32.as_slice());
        // Weights rounded to the 16-bit dtype: within one of its ulps of the f32 result.
        for (a, b) in w.iter().zip(&w32) {
            assert!((a - b).abs() <= b * 2f32.powi(-8), "{a} vs {b}");
        }
    }
    // Zero tokens route to nothing.
    assert_eq!(
        r.route_into(
            Logits::F32(&[]),
            &mut [],
            IdsOut::I32(&mut []),
            &mut scratch
        ),
        Ok(0)
    );
}

#[test]
fn llama4_weights_are_the_sigmoid_of_the_chosen_logit() {
    let r = Router::new(RouterConfig::llama4(4, 1)).unwrap();
    assert!(r.apply_router_weight_on_input());
    assert_eq!(r.routing_method_type(), RoutingMethodType::Llama4);
    let (w, ids) = route(&r, &[0.1, 2.0, -3.0, 1.0]);
    assert_eq!(ids, [1]);
    assert!((w[0] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
}

#[test]
fn method_type_of_common_configurations() {
    let t = |c: RouterConfig| Router::new(c).unwrap().routing_method_type();
    assert_eq!(
        t(RouterConfig::cpu_softmax(8, 2)),
        RoutingMethodType::Default
    );
    assert_eq!(
        t(RouterConfig::cpu_softmax(8, 2).with_renormalize(true)),
        RoutingMethodType::RenormalizeNaive
    );
    assert_eq!(
        t(RouterConfig::scored_topk(8, 2, ScoringFunc::Sigmoid)
            .with_renormalize(true)
            .with_correction_bias(vec![0.0; 8])),
        RoutingMethodType::MiniMax2
    );
    assert_eq!(
        t(RouterConfig::scored_topk(8, 2, ScoringFunc::SqrtSoftplus).with_renormalize(true)),
        RoutingMethodType::DeepseekV4
    );
}

/// Random configurations and logits: the router in f32 matches the float64 reference.
#[test]
fn matches_the_float64_reference() {
    let mut rng = SplitMix64::new(0x5EED_0003);
    let scorings = [
        ("softmax", ScoringFunc::Softmax),
        ("sigmoid", ScoringFunc::Sigmoid),
        ("sqrtsoftplus", ScoringFunc::SqrtSoftplus),
    ];
    for case in 0..proptest_cases(256) {
        let groups = [1, 2, 4, 8][rng.below(4)];
        let e = groups * (2 + rng.below(16));
        let kind = rng.below(4);
        let (name, scoring) = scorings[rng.below(3)];
        let renormalize = rng.below(2) == 1;
        let bias: Option<Vec<f32>> =
            ((1..=2).contains(&kind) && rng.below(2) == 1).then(|| rng.vec_uniform(e, -0.5, 0.5));
        let scale = [1.0f32, 2.5][rng.below(2)];
        let kept = 1 + rng.below(groups);
        let k = 1 + rng.below(if kind == 2 { kept * e / groups } else { e });
        let (mut config, algorithm) = match kind {
            0 => (RouterConfig::cpu_softmax(e, k), RefAlgorithm::CpuSoftmax),
            1 => (
                RouterConfig::scored_topk(e, k, scoring),
                RefAlgorithm::Scored(name),
            ),
            2 => (
                RouterConfig::grouped_topk(e, k, scoring, Grouping::new(groups, kept)),
                RefAlgorithm::Grouped(name, groups, kept),
            ),
            _ => (RouterConfig::llama4(e, k), RefAlgorithm::Llama4),
        };
        if kind != 3 {
            config = config
                .with_renormalize(renormalize)
                .with_routed_scaling(scale, ScalingPlacement::OnWeights);
        }
        if let Some(b) = &bias {
            config = config.with_correction_bias(b.clone());
        }
        let spec = RefSpec {
            algorithm,
            top_k: k,
            renormalize: renormalize && kind != 3,
            bias: bias.map(|b| b.iter().map(|&v| v as f64).collect()),
            scale: if kind == 3 { 1.0 } else { scale as f64 },
        };
        let router = Router::new(config).unwrap();
        let m = 1 + rng.below(4);
        let logits = rng.vec_uniform(m * e, -4.0, 4.0);
        let (w, ids) = route(&router, &logits);
        for row in 0..m {
            let x: Vec<f64> = logits[row * e..(row + 1) * e]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let (ref_ids, ref_w) = common::route(&spec, &x);
            let got = &ids[row * k..(row + 1) * k];
            // Near-ties may resolve differently between f32 and f64; uniform logits make them rare.
            if got.iter().map(|&i| i as usize).ne(ref_ids.iter().copied()) {
                let mut a: Vec<_> = got.iter().map(|&i| i as usize).collect();
                let mut b = ref_ids.clone();
                a.sort();
                b.sort();
                assert_eq!(a, b, "case {case} row {row}: ids");
            }
            for (j, &id) in got.iter().enumerate() {
                let pos = ref_ids.iter().position(|&r| r == id as usize).unwrap();
                let diff = (w[row * k + j] as f64 - ref_w[pos]).abs();
                assert!(
                    diff < 1e-5,
                    "case {case} row {row}: weight differs by {diff}"
                );
            }
        }
    }
}
