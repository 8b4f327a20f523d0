//! Bad input through the public API yields typed errors, never a panic or an out-of-range id.

use std::sync::Arc;

use half::bf16;
use moe_router::{
    CustomRouting, ExpertMap, ExpertPlacement, Grouping, IdsOut, Logits, Router, RouterConfig,
    RouterError, ScalingPlacement, ScoringFunc,
};

fn build(config: RouterConfig) -> Result<Router, RouterError> {
    Router::new(config)
}

#[test]
fn top_k_out_of_range() {
    for k in [0, 9] {
        assert_eq!(
            build(RouterConfig::cpu_softmax(8, k)).unwrap_err(),
            RouterError::TopKOutOfRange {
                top_k: k,
                num_experts: 8
            }
        );
    }
    assert_eq!(
        build(RouterConfig::scored_topk(0, 1, ScoringFunc::Sigmoid)).unwrap_err(),
        RouterError::NoExperts
    );
}

#[test]
fn bad_groups() {
    let g = |e, k, groups, kept| {
        build(RouterConfig::grouped_topk(
            e,
            k,
            ScoringFunc::Softmax,
            Grouping::new(groups, kept),
        ))
        .unwrap_err()
    };
    assert_eq!(
        g(16, 2, 4, 5),
        RouterError::TopkGroupOutOfRange {
            topk_group: 5,
            num_groups: 4
        }
    );
    assert_eq!(
        g(16, 2, 4, 0),
        RouterError::TopkGroupOutOfRange {
            topk_group: 0,
            num_groups: 4
        }
    );
    assert_eq!(
        g(18, 2, 4, 2),
        RouterError::ExpertsNotDivisibleByGroups {
            num_experts: 18,
            num_groups: 4
        }
    );
    assert_eq!(g(16, 2, 0, 0), RouterError::NoGroups);
    assert_eq!(
        g(16, 9, 4, 2),
        RouterError::TopKExceedsKeptExperts {
            top_k: 9,
            kept_experts: 8
        }
    );
    let biased_singletons =
        RouterConfig::grouped_topk(8, 2, ScoringFunc::Sigmoid, Grouping::new(8, 4))
            .with_correction_bias(vec![0.0; 8]);
    assert_eq!(
        build(biased_singletons).unwrap_err(),
        RouterError::GroupTooSmallForBias { group_size: 1 }
    );
}

#[test]
fn bad_bias() {
    let c = RouterConfig::scored_topk(8, 2, ScoringFunc::Sigmoid);
    assert_eq!(
        build(c.clone().with_correction_bias(vec![0.0; 7])).unwrap_err(),
        RouterError::BiasLength {
            expected: 8,
            got: 7
        }
    );
    let mut nan = vec![0.0; 8];
    nan[3] = f32::NAN;
    assert!(matches!(
        build(c.with_correction_bias(nan)).unwrap_err(),
        RouterError::NonFiniteBias { expert: 3, .. }
    ));
    assert!(matches!(
        build(RouterConfig::cpu_softmax(8, 2).with_correction_bias(vec![0.0; 8])).unwrap_err(),
        RouterError::UnsupportedOption {
            option: "e_score_correction_bias",
            ..
        }
    ));
    assert!(matches!(
        build(RouterConfig::llama4(8, 1).with_renormalize(true)).unwrap_err(),
        RouterError::UnsupportedOption {
            option: "renormalize",
            ..
        }
    ));
    assert!(matches!(
        build(
            RouterConfig::cpu_softmax(8, 2)
                .with_routed_scaling(f32::INFINITY, ScalingPlacement::OnWeights)
        )
        .unwrap_err(),
        RouterError::InvalidScalingFactor { .. }
    ));
}

#[test]
fn expert_map_of_another_size() {
    let map = ExpertMap::new(16, 2, 0, ExpertPlacement::Linear).unwrap();
    assert_eq!(
        build(RouterConfig::cpu_softmax(8, 2).with_expert_map(map)).unwrap_err(),
        RouterError::ExpertMapMismatch {
            map_experts: 16,
            num_experts: 8
        }
    );
}

#[test]
fn mismatched_buffers() {
    let router = build(RouterConfig::cpu_softmax(4, 2)).unwrap();
    let mut scratch = router.new_scratch();
    let logits = [0.0f32; 8];
    let mut w = [0.0f32; 4];
    let mut ids = [0i32; 4];
    assert_eq!(
        router
            .route_into(
                Logits::F32(&logits[..7]),
                &mut w,
                IdsOut::I32(&mut ids),
                &mut scratch
            )
            .unwrap_err(),
        RouterError::LogitsShape {
            len: 7,
            num_experts: 4
        }
    );
    assert_eq!(
        router
            .route_into(
                Logits::F32(&logits),
                &mut w[..3],
                IdsOut::I32(&mut ids),
                &mut scratch
            )
            .unwrap_err(),
        RouterError::BufferSize {
            buffer: "weights_out",
            expected: 4,
            got: 3
        }
    );
    let mut ids64 = [0i64; 5];
    assert_eq!(
        router
            .route_into(
                Logits::F32(&logits),
                &mut w,
                IdsOut::I64(&mut ids64),
                &mut scratch
            )
            .unwrap_err(),
        RouterError::BufferSize {
            buffer: "ids_out",
            expected: 4,
            got: 5
        }
    );
    let small = build(RouterConfig::cpu_softmax(2, 1))
        .unwrap()
        .new_scratch();
    assert_eq!(
        router
            .route_into(
                Logits::F32(&logits),
                &mut w,
                IdsOut::I32(&mut ids),
                &mut small.clone()
            )
            .unwrap_err(),
        RouterError::ScratchTooSmall {
            what: "experts",
            needed: 4,
            got: 2
        }
    );
}

#[test]
fn non_finite_logits_are_rejected_with_their_position() {
    let configs = [
        RouterConfig::cpu_softmax(4, 2),
        RouterConfig::scored_topk(4, 2, ScoringFunc::Softmax).with_renormalize(true),
        RouterConfig::grouped_topk(4, 2, ScoringFunc::Sigmoid, Grouping::new(2, 1))
            .with_correction_bias(vec![0.1; 4]),
        RouterConfig::llama4(4, 1),
    ];
    for config in configs {
        let router = build(config).unwrap();
        let k = router.config().top_k;
        let mut scratch = router.new_scratch();
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let logits = [0.5, 0.1, -0.2, 0.3, 0.0, 0.2, bad, 0.1];
            let mut w = vec![-1.0f32; 2 * k];
            let mut ids = vec![-7i32; 2 * k];
            let err = router
                .route_into(
                    Logits::F32(&logits),
                    &mut w,
                    IdsOut::I32(&mut ids),
                    &mut scratch,
                )
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    RouterError::NonFiniteLogit {
                        row: 1,
                        expert: 2,
                        ..
                    }
                ),
                "{err}"
            );
            // Row 0 was routed; row 1 untouched.
            assert!(ids[..k].iter().all(|&i| (0..4).contains(&i)));
            assert!(ids[k..].iter().all(|&i| i == -7));
            let bf: Vec<bf16> = logits.iter().map(|&v| bf16::from_f32(v)).collect();
            assert!(matches!(
                router.route_into(
                    Logits::Bf16(&bf),
                    &mut w,
                    IdsOut::I32(&mut ids),
                    &mut scratch
                ),
                Err(RouterError::NonFiniteLogit {
                    row: 1,
                    expert: 2,
                    ..
                })
            ));
        }
    }
}

#[derive(Debug)]
struct Faulty(Vec<u32>, bool);

impl CustomRouting for Faulty {
    fn route_token(&self, _: &[f32], weights: &mut [f32], ids: &mut [u32]) -> Result<(), String> {
        if self.1 {
            return Err("model says no".into());
        }
        ids.copy_from_slice(&self.0);
        weights.fill(0.5);
        Ok(())
    }
}

#[test]
fn custom_hook_output_is_checked() {
    let run = |hook: Faulty| {
        let router = build(RouterConfig::custom(4, 2, Arc::new(hook))).unwrap();
        let mut w = [0.0f32; 2];
        let mut ids = [0i32; 2];
        router.route_into(
            Logits::F32(&[0.0; 4]),
            &mut w,
            IdsOut::I32(&mut ids),
            &mut router.new_scratch(),
        )
    };
    assert_eq!(run(Faulty(vec![3, 1], false)), Ok(1));
    assert_eq!(
        run(Faulty(vec![1, 4], false)),
        Err(RouterError::CustomIdOutOfRange {
            row: 0,
            id: 4,
            num_experts: 4
        })
    );
    assert_eq!(
        run(Faulty(vec![2, 2], false)),
        Err(RouterError::CustomDuplicateId { row: 0, id: 2 })
    );
    assert!(matches!(
        run(Faulty(vec![0, 1], true)),
        Err(RouterError::CustomRouting { row: 0, .. })
    ));
}
