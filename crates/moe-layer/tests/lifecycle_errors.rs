//! Bad input through the layer lifecycle: every refusal is a typed [`LayerError`] naming the
//! tensor or argument, a failed load or process leaves the layer unusable, `apply` before
//! `process` is refused, `process` is idempotent, and expert parallelism splits the work
//! exactly (the ranks' outputs sum to the single-rank output).

use half::bf16;
use moe_kernels::Activation;
use moe_layer::layer::vllm_cpu_softmax_router;
use moe_layer::{
    ExpertShard, LayerError, LayerQuant, MoeLayer, MoeLayerConfig, TensorData, TensorKind,
    TensorView,
};
use moe_quant::{DType, WeightGroups};
use moe_router::Logits;
use moe_testutil::SplitMix64;

const E: usize = 4;
const K: usize = 2;
const H: usize = 64;
const I: usize = 64;
const G: usize = 32;

fn config(expert_map: Option<Vec<i32>>) -> MoeLayerConfig {
    MoeLayerConfig::new(
        E,
        K,
        H,
        I,
        LayerQuant::W4A8 {
            group_size: WeightGroups::groups(G).unwrap(),
        },
    )
    .with_expert_map(expert_map)
    .with_activation(Activation::SILU)
    .with_router(vllm_cpu_softmax_router(E, K, true))
    .with_in_dtype(DType::BF16)
    .with_max_tokens(8)
}

/// One expert's random checkpoint tensors: `(shard, codes, code shape, scales, scale shape)`.
type ExpertTensors = Vec<(ExpertShard, Vec<i8>, [usize; 2], Vec<bf16>, [usize; 2])>;

fn random_expert(rng: &mut SplitMix64) -> ExpertTensors {
    [
        (ExpertShard::W1, [I, H]),
        (ExpertShard::W3, [I, H]),
        (ExpertShard::W2, [H, I]),
    ]
    .into_iter()
    .map(|(shard, shape)| {
        let codes = (0..shape[0] * shape[1])
            .map(|_| rng.range_i64(-8, 7) as i8)
            .collect();
        let sshape = [shape[0], shape[1] / G];
        let scales = (0..sshape[0] * sshape[1])
            .map(|_| bf16::from_f32(rng.uniform(0.001, 0.01)))
            .collect();
        (shard, codes, shape, scales, sshape)
    })
    .collect()
}

fn load_expert(layer: &mut MoeLayer, e: usize, t: &ExpertTensors) -> Result<(), LayerError> {
    for (shard, codes, shape, scales, sshape) in t {
        layer.load_expert_tensor(
            e,
            *shard,
            TensorKind::Weight,
            &TensorView {
                name: "w",
                shape,
                data: TensorData::I8(codes),
            },
        )?;
        layer.load_expert_tensor(
            e,
            *shard,
            TensorKind::Scale,
            &TensorView {
                name: "s",
                shape: sshape,
                data: TensorData::Bf16(scales),
            },
        )?;
    }
    Ok(())
}

fn experts(seed: u64) -> Vec<ExpertTensors> {
    let mut rng = SplitMix64::new(seed);
    (0..E).map(|_| random_expert(&mut rng)).collect()
}

fn loaded(map: Option<Vec<i32>>, tensors: &[ExpertTensors]) -> MoeLayer {
    let mut layer = MoeLayer::create(config(map)).unwrap();
    for (e, t) in tensors.iter().enumerate() {
        load_expert(&mut layer, e, t).unwrap();
    }
    layer
}

fn inputs(tokens: usize) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(7);
    (
        rng.vec_uniform(tokens * H, -1.0, 1.0),
        rng.vec_uniform(tokens * E, -2.0, 2.0),
    )
}

fn apply(layer: &MoeLayer, x: &[f32], logits: &[f32]) -> Result<Vec<f32>, LayerError> {
    let mut out = vec![0f32; x.len()];
    layer.apply(x, Logits::F32(logits), &mut out)?;
    Ok(out)
}

fn view<'a>(name: &'a str, shape: &'a [usize], data: TensorData<'a>) -> TensorView<'a> {
    TensorView { name, shape, data }
}

#[test]
fn apply_before_process_is_refused() {
    let layer = loaded(None, &experts(1));
    let (x, logits) = inputs(3);
    assert!(matches!(
        apply(&layer, &x, &logits),
        Err(LayerError::NotProcessed)
    ));
}

#[test]
fn process_names_missing_tensors_and_poisons_the_layer() {
    let tensors = experts(2);
    let mut layer = MoeLayer::create(config(None)).unwrap();
    for (e, t) in tensors.iter().enumerate().skip(1) {
        load_expert(&mut layer, e, t).unwrap();
    }
    match layer.process() {
        Err(LayerError::MissingParams { missing }) => {
            assert_eq!(missing.len(), 6, "{missing:?}");
            assert!(missing.contains(&"experts.0.w1.weight".to_string()));
            assert!(missing.contains(&"experts.0.w2.weight_scale".to_string()));
        }
        other => panic!("{other:?}"),
    }
    let (x, logits) = inputs(2);
    assert!(matches!(
        apply(&layer, &x, &logits),
        Err(LayerError::Unusable { .. })
    ));
    assert!(matches!(layer.process(), Err(LayerError::Unusable { .. })));
}

#[test]
fn wrong_shapes_dtypes_and_values_are_typed_and_poison_the_layer() {
    let codes = vec![0i8; I * H];
    let floats = vec![0.5f32; I * H];
    let cases: Vec<(TensorKind, TensorView<'_>, &str)> = vec![
        (
            TensorKind::Weight,
            view("bad_shape", &[H, I + 1], TensorData::I8(&codes)),
            "ParamShape",
        ),
        (
            TensorKind::Weight,
            view("bad_dtype", &[I, H], TensorData::F32(&floats)),
            "ParamDtype",
        ),
        (
            TensorKind::Scale,
            view(
                "bad_scale_dtype",
                &[I, H / G],
                TensorData::I8(&codes[..I * 2]),
            ),
            "ParamDtype",
        ),
    ];
    for (kind, v, what) in cases {
        let mut layer = MoeLayer::create(config(None)).unwrap();
        let e = layer
            .load_expert_tensor(0, ExpertShard::W1, kind, &v)
            .unwrap_err();
        let ok = match (&e, what) {
            (LayerError::ParamShape { tensor, .. }, "ParamShape") => tensor == v.name,
            (LayerError::ParamDtype { tensor, .. }, "ParamDtype") => tensor == v.name,
            _ => false,
        };
        assert!(ok, "{what}: {e:?}");
        assert!(e.to_string().contains(v.name), "{e}");
        // The layer is unusable afterwards.
        assert!(matches!(layer.process(), Err(LayerError::Unusable { .. })));
        let (x, logits) = inputs(1);
        assert!(matches!(
            apply(&layer, &x, &logits),
            Err(LayerError::Unusable { .. })
        ));
    }
}

#[test]
fn out_of_range_codes_scales_experts_and_biases_are_refused() {
    let mut codes = vec![0i8; I * H];
    codes[5] = 8;
    let mut layer = MoeLayer::create(config(None)).unwrap();
    let e = layer
        .load_expert_tensor(
            0,
            ExpertShard::W3,
            TensorKind::Weight,
            &view("codes", &[I, H], TensorData::I8(&codes)),
        )
        .unwrap_err();
    assert!(
        matches!(e, LayerError::ParamValue { index: 5, .. }),
        "{e:?}"
    );

    let mut scales = vec![0.007_812_5_f32; H * (I / G)];
    scales[3] = f32::NAN;
    let mut layer = MoeLayer::create(config(None)).unwrap();
    let e = layer
        .load_expert_tensor(
            1,
            ExpertShard::W2,
            TensorKind::Scale,
            &view("scales", &[H, I / G], TensorData::F32(&scales)),
        )
        .unwrap_err();
    assert!(
        matches!(e, LayerError::ParamValue { index: 3, .. }),
        "{e:?}"
    );

    // A group scale that overflows when rounded to bf16 (inexact ones are rounded, as vLLM
    // does).
    scales[3] = f32::MAX;
    let mut layer = MoeLayer::create(config(None)).unwrap();
    let e = layer
        .load_expert_tensor(
            1,
            ExpertShard::W2,
            TensorKind::Scale,
            &view("scales", &[H, I / G], TensorData::F32(&scales)),
        )
        .unwrap_err();
    assert!(
        matches!(e, LayerError::ParamValue { index: 3, .. }),
        "{e:?}"
    );

    let ok_codes = vec![0i8; I * H];
    let mut layer = MoeLayer::create(config(None)).unwrap();
    let e = layer
        .load_expert_tensor(
            E,
            ExpertShard::W1,
            TensorKind::Weight,
            &view("t", &[I, H], TensorData::I8(&ok_codes)),
        )
        .unwrap_err();
    assert!(matches!(e, LayerError::InvalidArgument { .. }), "{e:?}");

    // Biases: `[I]` for w1/w3, `[H]` for w2, float and finite.
    let bias = |shard, shape: &[usize], data: TensorData<'_>| {
        let mut layer = MoeLayer::create(config(None)).unwrap();
        layer
            .load_expert_tensor(0, shard, TensorKind::Bias, &view("b", shape, data))
            .unwrap_err()
    };
    let e = bias(ExpertShard::W1, &[I, H], TensorData::I8(&ok_codes));
    assert!(matches!(e, LayerError::ParamShape { .. }), "{e:?}");
    let e = bias(ExpertShard::W2, &[H + 1], TensorData::F32(&[0.0; H + 1]));
    assert!(matches!(e, LayerError::ParamShape { .. }), "{e:?}");
    let e = bias(ExpertShard::W1, &[I], TensorData::I8(&[0; I]));
    assert!(matches!(e, LayerError::ParamDtype { .. }), "{e:?}");
    let mut nan = [0.5f32; H];
    nan[3] = f32::NAN;
    let e = bias(ExpertShard::W2, &[H], TensorData::F32(&nan));
    assert!(
        matches!(e, LayerError::ParamValue { index: 3, .. }),
        "{e:?}"
    );
}

/// A layer with some expert biases must have them all: `process` names the missing ones.
#[test]
fn partial_expert_biases_are_named_missing() {
    let tensors = experts(17);
    let mut layer = MoeLayer::create(config(None)).unwrap();
    for (e, t) in tensors.iter().enumerate() {
        load_expert(&mut layer, e, t).unwrap();
    }
    layer
        .load_expert_tensor(
            1,
            ExpertShard::W3,
            TensorKind::Bias,
            &view("b", &[I], TensorData::F32(&[0.25; I])),
        )
        .unwrap();
    let err = layer.process().unwrap_err().to_string();
    assert!(
        err.contains("experts.1.w2.bias") && err.contains("experts.0.w1.bias"),
        "{err}"
    );
    assert!(!err.contains("experts.1.w3.bias"), "{err}");
}

#[test]
fn process_is_idempotent_and_loading_afterwards_is_refused() {
    let tensors = experts(3);
    let mut layer = loaded(None, &tensors);
    layer.process().unwrap();
    let (x, logits) = inputs(5);
    let first = apply(&layer, &x, &logits).unwrap();
    layer.process().unwrap();
    assert_eq!(apply(&layer, &x, &logits).unwrap(), first);
    assert!(layer.backend().is_some());
    let e = load_expert(&mut layer, 0, &tensors[0]).unwrap_err();
    assert!(matches!(e, LayerError::AlreadyProcessed), "{e:?}");
    // The router weight is refused like the expert tensors, and the refusal leaves the
    // processed layer as it was.
    let e = layer.load_router_weight(&[0.5; E * H]).unwrap_err();
    assert!(matches!(e, LayerError::AlreadyProcessed), "{e:?}");
    assert!(layer.is_processed());
    assert_eq!(apply(&layer, &x, &logits).unwrap(), first);
}

#[test]
fn bad_call_arguments_are_typed() {
    let mut layer = loaded(None, &experts(4));
    layer.process().unwrap();
    let (x, logits) = inputs(3);
    let mut out = vec![0f32; x.len()];
    let e = layer
        .apply(&x[..H + 1], Logits::F32(&logits), &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::InvalidArgument {
                field: "hidden_states",
                ..
            }
        ),
        "{e:?}"
    );
    let e = layer
        .apply(&x, Logits::F32(&logits[..E]), &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::InvalidArgument {
                field: "router_logits",
                ..
            }
        ),
        "{e:?}"
    );
    let e = layer
        .apply(&x, Logits::F32(&logits), &mut out[..H])
        .unwrap_err();
    assert!(
        matches!(e, LayerError::InvalidArgument { field: "out", .. }),
        "{e:?}"
    );
    let mut bad = logits.clone();
    bad[1] = f32::NAN;
    let e = layer.apply(&x, Logits::F32(&bad), &mut out).unwrap_err();
    assert!(matches!(e, LayerError::Router(_)), "{e:?}");
    let ids = vec![0i32, E as i32, 1, 2, 3, 0];
    let w = vec![0.5f32; 6];
    let e = layer.apply_with_topk(&x, &ids, &w, &mut out).unwrap_err();
    assert!(matches!(e, LayerError::Kernel(_)), "{e:?}");
    let e = layer
        .apply_with_topk(&x, &ids[..4], &w[..4], &mut out)
        .unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::InvalidArgument {
                field: "topk_ids",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn invalid_configurations_are_refused() {
    let mut c = config(None);
    c.top_k = E + 1;
    c.router = vllm_cpu_softmax_router(E, E + 1, true);
    assert!(MoeLayer::create(c).is_err());
    let mut c = config(None);
    c.tp_rank = 1;
    assert!(matches!(
        MoeLayer::create(c),
        Err(LayerError::TensorParallel { .. })
    ));
    let mut c = config(None);
    c.tp_size = 4;
    c.tp_rank = 1;
    // I/tp = 16 does not hold whole groups of 32.
    assert!(matches!(
        MoeLayer::create(c),
        Err(LayerError::GroupSizeNotDividing { .. })
    ));
    for map in [
        vec![0, 0, -1, -1],
        vec![0, 1],
        vec![-1, -1, -1, -1],
        vec![0, 2, -1, -1],
    ] {
        assert!(
            matches!(
                MoeLayer::create(config(Some(map.clone()))),
                Err(LayerError::ExpertMap { .. })
            ),
            "{map:?}"
        );
    }
}

#[test]
fn expert_parallel_ranks_sum_to_the_single_rank_output() {
    let tensors = experts(5);
    let (x, logits) = inputs(7);
    let mut whole = loaded(None, &tensors);
    whole.process().unwrap();
    let reference = apply(&whole, &x, &logits).unwrap();
    let mut sum = vec![0f32; x.len()];
    for map in [vec![0, -1, 1, -1], vec![-1, 0, -1, 1]] {
        let mut rank = loaded(Some(map), &tensors);
        rank.process().unwrap();
        for (s, v) in sum.iter_mut().zip(apply(&rank, &x, &logits).unwrap()) {
            *s += v;
        }
    }
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (a, b) in sum.iter().zip(&reference) {
        assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
    }
}

fn int8_config() -> MoeLayerConfig {
    let mut cfg = config(None);
    cfg.quant = LayerQuant::Int8Online;
    cfg
}

#[test]
fn online_int8_refuses_scales_codes_mixed_dtypes_and_non_finite_weights() {
    let w = vec![bf16::from_f32(0.5); I * H];
    let codes = vec![0i8; I * H];
    let mut layer = MoeLayer::create(int8_config()).unwrap();
    let e = layer
        .load_expert_tensor(
            0,
            ExpertShard::W1,
            TensorKind::Scale,
            &view("s", &[I, 2], TensorData::Bf16(&w[..2 * I])),
        )
        .unwrap_err();
    assert!(
        matches!(e, LayerError::InvalidArgument { field: "kind", .. }),
        "{e:?}"
    );

    let mut layer = MoeLayer::create(int8_config()).unwrap();
    let e = layer
        .load_expert_tensor(
            0,
            ExpertShard::W1,
            TensorKind::Weight,
            &view("codes", &[I, H], TensorData::I8(&codes)),
        )
        .unwrap_err();
    assert!(matches!(e, LayerError::ParamDtype { .. }), "{e:?}");

    let mut layer = MoeLayer::create(int8_config()).unwrap();
    layer
        .load_expert_tensor(
            0,
            ExpertShard::W1,
            TensorKind::Weight,
            &view("w1", &[I, H], TensorData::Bf16(&w)),
        )
        .unwrap();
    let f = vec![0.5f32; I * H];
    let e = layer
        .load_expert_tensor(
            0,
            ExpertShard::W3,
            TensorKind::Weight,
            &view("w3", &[I, H], TensorData::F32(&f)),
        )
        .unwrap_err();
    assert!(matches!(e, LayerError::ParamDtype { .. }), "{e:?}");
    assert!(matches!(layer.process(), Err(LayerError::Unusable { .. })));

    let mut bad = w.clone();
    bad[9] = bf16::NAN;
    let mut layer = MoeLayer::create(int8_config()).unwrap();
    let e = layer
        .load_expert_tensor(
            0,
            ExpertShard::W1,
            TensorKind::Weight,
            &view("w1", &[I, H], TensorData::Bf16(&bad)),
        )
        .unwrap_err();
    assert!(
        matches!(e, LayerError::ParamValue { index: 9, .. }),
        "{e:?}"
    );

    // Only weights are required: a layer missing one names the weight, not a scale.
    let mut layer = MoeLayer::create(int8_config()).unwrap();
    match layer.process() {
        Err(LayerError::MissingParams { missing }) => {
            assert_eq!(missing.len(), 3 * E, "{missing:?}");
            assert!(
                missing.iter().all(|m| m.ends_with(".weight")),
                "{missing:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_bad_router_weight_poisons_the_layer() {
    let mut layer = loaded(None, &experts(6));
    let e = layer.load_router_weight(&[0.0; 3]).unwrap_err();
    assert!(matches!(e, LayerError::ParamShape { .. }), "{e:?}");
    assert!(matches!(layer.process(), Err(LayerError::Unusable { .. })));
}

/// A load on a processed layer is refused with [`LayerError::AlreadyProcessed`] and leaves the
/// layer processed, computing what it computed; a load on an unusable layer is refused with
/// the earlier failure's reason, unchanged.
fn refused_without_harm(name: &str, load: impl Fn(&mut MoeLayer) -> Result<(), LayerError>) {
    let tensors = experts(11);
    let mut layer = loaded(None, &tensors);
    layer.process().unwrap();
    let (x, logits) = inputs(3);
    let before = apply(&layer, &x, &logits).unwrap();
    let e = load(&mut layer).unwrap_err();
    assert!(matches!(e, LayerError::AlreadyProcessed), "{name}: {e:?}");
    assert!(
        layer.is_processed(),
        "{name}: the refusal unprocessed the layer"
    );
    assert_eq!(apply(&layer, &x, &logits).unwrap(), before, "{name}");

    let mut layer = loaded(None, &tensors);
    layer.load_router_weight(&[0.0; 3]).unwrap_err();
    let Err(LayerError::Unusable { reason }) = layer.process() else {
        panic!("{name}: a bad router weight must leave the layer unusable");
    };
    match load(&mut layer) {
        Err(LayerError::Unusable { reason: got }) => assert_eq!(got, reason, "{name}"),
        other => panic!("{name}: {other:?}"),
    }
    match layer.process() {
        Err(LayerError::Unusable { reason: got }) => assert_eq!(got, reason, "{name}"),
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn load_router_weight_refuses_a_processed_or_unusable_layer_without_harm() {
    refused_without_harm("router weight", |l| l.load_router_weight(&[0.5; E * H]));
}

#[test]
fn load_router_bias_refuses_a_processed_or_unusable_layer_without_harm() {
    refused_without_harm("router bias", |l| l.load_router_bias(&[0.5; E]));
}

#[test]
fn load_router_correction_bias_refuses_a_processed_or_unusable_layer_without_harm() {
    refused_without_harm("correction bias", |l| {
        l.load_router_correction_bias(&[0.5; E])
    });
}

#[test]
fn load_shared_expert_gate_refuses_a_processed_or_unusable_layer_without_harm() {
    refused_without_harm("shared gate", |l| l.load_shared_expert_gate(&[0.5; H]));
}

#[test]
fn load_shared_expert_tensor_refuses_a_processed_or_unusable_layer_without_harm() {
    let codes = vec![0i8; I * H];
    refused_without_harm("shared tensor", |l| {
        l.load_shared_expert_tensor(
            ExpertShard::W1,
            TensorKind::Weight,
            &view("shared_expert.w1", &[I, H], TensorData::I8(&codes)),
        )
    });
}

/// Under expert parallelism the expert map must hold this rank's share of the experts, as
/// vLLM's `determine_expert_map` splits them (`E / ep_size`, one more on the first
/// `E % ep_size` ranks, whatever the placement), and a map must be given: the error names
/// the rank, the expected count and what the map holds.
#[test]
fn expert_map_must_hold_the_ranks_share_under_expert_parallelism() {
    use moe_router::{ExpertMap, ExpertPlacement};
    for ep_size in [2, 3] {
        for rank in 0..ep_size {
            for placement in [ExpertPlacement::Linear, ExpertPlacement::RoundRobin] {
                let map = ExpertMap::new(E, ep_size, rank, placement).unwrap();
                let cfg = config(Some(map.as_slice().to_vec())).with_expert_parallel(rank, ep_size);
                MoeLayer::create(cfg).unwrap();
            }
        }
    }
    // Rank 0 of 2 holds two of the four experts, not one.
    let cfg = config(Some(vec![0, -1, -1, -1])).with_expert_parallel(0, 2);
    let e = MoeLayer::create(cfg).unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::ExpertParallelMap {
                ep_rank: 0,
                ep_size: 2,
                num_experts: E,
                expected: 2,
                actual: Some(1),
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("holds 2 of 4") && msg.contains("map holds 1"),
        "{msg}"
    );
    // Rank 2 of 3 holds one; two is rank 0's share.
    let cfg = config(Some(vec![-1, -1, 0, 1])).with_expert_parallel(2, 3);
    let e = MoeLayer::create(cfg).unwrap_err();
    assert!(
        matches!(
            e,
            LayerError::ExpertParallelMap {
                expected: 1,
                actual: Some(2),
                ..
            }
        ),
        "{e:?}"
    );
    // Without a map every rank would hold every expert, and the ranks' sum would count each
    // expert twice; the backend choice (`moe inspect`) refuses it the same way.
    let cfg = config(None).with_expert_parallel(1, 2);
    for e in [
        cfg.select_backend().unwrap_err(),
        MoeLayer::create(cfg).unwrap_err(),
    ] {
        assert!(
            matches!(
                e,
                LayerError::ExpertParallelMap {
                    ep_rank: 1,
                    expected: 2,
                    actual: None,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("no expert_map"), "{e}");
    }
}
