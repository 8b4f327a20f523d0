//! Unquantized (bf16) checkpoints through the whole lifecycle: the layer keeps the weights in
//! bf16, the oracle picks the unquantized CPU kernel, and `apply` equals a float64 MoE
//! reference on the same weights within f32 rounding, for f32 and bf16 hidden states and
//! through the layer's own router.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{Ckpt, E, Fmt, H, I, Proj, bf16_weights, matvec, rel_l2, temp_dir};
use half::bf16;
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_router::Logits;
use moe_testutil::SplitMix64;

/// `Σ_j weight_j · down(silu(gate(x)) · up(x))` over the token's experts, in f64.
fn reference(experts: &[[Proj; 3]], x: &[f32], ids: &[i32], gates: &[f32], k: usize) -> Vec<f64> {
    let tokens = x.len() / H;
    let mut out = vec![0f64; tokens * H];
    for t in 0..tokens {
        let xt: Vec<f64> = x[t * H..][..H].iter().map(|&v| f64::from(v)).collect();
        for j in 0..k {
            let [gate, up, down] = &experts[ids[t * k + j] as usize];
            let g = matvec(&bf16_weights(gate), I, H, &xt);
            let u = matvec(&bf16_weights(up), I, H, &xt);
            let a: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let y = matvec(&bf16_weights(down), H, I, &a);
            for (o, v) in out[t * H..][..H].iter_mut().zip(y) {
                *o += f64::from(gates[t * k + j]) * v;
            }
        }
    }
    out
}

#[test]
fn bf16_checkpoint_runs_unquantized_and_matches_a_float_reference() {
    let (ck, experts) = Ckpt::build("qwen3_moe", Fmt::Float, 41);
    let dir = temp_dir("unquantized-layer");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 8).unwrap();
    let info = layer.backend().unwrap();
    assert!(info.kernel.starts_with("cpu-unquantized"), "{info:?}");

    let mut rng = SplitMix64::new(5);
    let tokens = 11; // more than max_tokens: the layer cuts the call into pieces
    let k = 2;
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    let ids: Vec<i32> = (0..tokens * k)
        .map(|s| ((s / k * 3 + (s % k) * 2) % E) as i32)
        .collect();
    let gates = rng.vec_uniform(tokens * k, 0.1, 0.9);
    let want = reference(&experts, &x, &ids, &gates, k);

    let mut out = vec![0f32; tokens * H];
    layer.apply_with_topk(&x, &ids, &gates, &mut out).unwrap();
    let err = rel_l2(&out, &want);
    assert!(err < 1e-5, "f32 hidden states: relative L2 {err:e}");

    // bf16 hidden states: the same computation, one bf16 rounding of the result.
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xr: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
    let want_b = reference(&experts, &xr, &ids, &gates, k);
    let mut out_b = vec![bf16::ZERO; tokens * H];
    layer
        .apply_with_topk(&xb, &ids, &gates, &mut out_b)
        .unwrap();
    let out_b: Vec<f32> = out_b.iter().map(|v| v.to_f32()).collect();
    let err = rel_l2(&out_b, &want_b);
    assert!(err < 4e-3, "bf16 hidden states: relative L2 {err:e}");

    // Through the router: logits that pick experts (t mod E, t+1 mod E) with equal weight.
    let logits: Vec<f32> = (0..tokens * E)
        .map(|s| {
            let (t, e) = (s / E, s % E);
            if e == t % E || e == (t + 1) % E {
                2.0
            } else {
                -2.0
            }
        })
        .collect();
    let ids_r: Vec<i32> = (0..tokens * k)
        .map(|s| {
            let (t, j) = (s / k, s % k);
            let (a, b) = (t % E, (t + 1) % E);
            (if j == 0 { a.min(b) } else { a.max(b) }) as i32
        })
        .collect();
    let want_r = reference(&experts, &x, &ids_r, &vec![0.5; tokens * k], k);
    let mut out_r = vec![0f32; tokens * H];
    layer.apply(&x, Logits::F32(&logits), &mut out_r).unwrap();
    let err = rel_l2(&out_r, &want_r);
    assert!(err < 1e-5, "routed: relative L2 {err:e}");
}

/// DeepSeek-V3-style routing from the checkpoint: sigmoid scores, the correction bias loaded
/// from the router's tensor (selection only), top-2-sum group scores, one group kept,
/// renormalized weights times `routed_scaling_factor` 2.5. The layer's output equals the
/// float64 MoE on routing recomputed here from the definition.
#[test]
fn grouped_biased_scaled_routing_from_a_deepseek_v3_checkpoint() {
    let (mut ck, experts) = Ckpt::build("deepseek_v3", Fmt::Float, 43);
    // Shared experts are not run by the layer yet: drop them from this model.
    ck.config
        .as_object_mut()
        .unwrap()
        .remove("n_shared_experts");
    ck.tensors
        .retain(|name, _| !name.contains("shared_experts"));
    let dir = temp_dir("unquantized-deepseek");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    let bias = ckpt
        .read_layer(0, &moe_layer::checkpoint::ReadOptions::single_rank())
        .unwrap()
        .router
        .correction_bias
        .unwrap();

    let mut rng = SplitMix64::new(9);
    let tokens = 6;
    let k = 2;
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    let logits = rng.vec_uniform(tokens * E, -3.0, 3.0);
    let (mut ids, mut gates) = (Vec::new(), Vec::new());
    for t in 0..tokens {
        let s: Vec<f64> = (0..E)
            .map(|e| 1.0 / (1.0 + (-f64::from(logits[t * E + e])).exp()))
            .collect();
        let b: Vec<f64> = (0..E).map(|e| s[e] + f64::from(bias[e])).collect();
        // Two groups of E/2 experts; a group's score is the sum of its two best biased scores.
        let group_score = |g: usize| -> f64 {
            let mut v: Vec<f64> = b[g * E / 2..(g + 1) * E / 2].to_vec();
            v.sort_by(|a, c| c.total_cmp(a));
            v[0] + v[1]
        };
        let g = if group_score(1) > group_score(0) {
            1
        } else {
            0
        };
        let mut members: Vec<usize> = (g * E / 2..(g + 1) * E / 2).collect();
        members.sort_by(|&a, &c| b[c].total_cmp(&b[a]).then(a.cmp(&c)));
        let chosen = &members[..k];
        let sum: f64 = chosen.iter().map(|&e| s[e]).sum();
        for &e in chosen {
            ids.push(e as i32);
            gates.push((s[e] / sum * 2.5) as f32);
        }
    }
    let want = reference(&experts, &x, &ids, &gates, k);
    let mut out = vec![0f32; tokens * H];
    layer.apply(&x, Logits::F32(&logits), &mut out).unwrap();
    let err = rel_l2(&out, &want);
    assert!(err < 1e-5, "relative L2 {err:e}");
}

/// A checkpoint that promises a correction bias but whose layer was loaded without it never
/// runs: `process` names the missing tensor.
#[test]
fn a_pending_correction_bias_blocks_process() {
    let (mut ck, _) = Ckpt::build("deepseek_v3", Fmt::Float, 44);
    ck.config
        .as_object_mut()
        .unwrap()
        .remove("n_shared_experts");
    ck.tensors
        .retain(|name, _| !name.contains("shared_experts"));
    let dir = temp_dir("unquantized-deepseek-pending");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let cfg = moe_layer::MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 4).unwrap();
    assert!(cfg.router_bias_pending);
    let mut layer = MoeLayer::create(cfg).unwrap();
    let t = ckpt
        .read_layer(0, &moe_layer::checkpoint::ReadOptions::single_rank())
        .unwrap();
    let mut no_bias = t.clone();
    no_bias.router.correction_bias = None;
    layer.load_layer_tensors(&no_bias).unwrap();
    let err = layer.process().unwrap_err();
    assert!(err.to_string().contains("e_score_correction_bias"), "{err}");
}

/// The same DeepSeek-V3-style model with its shared expert: the block's output is the routed
/// experts' plus the shared MLP's on every token (weight 1), here against float64.
#[test]
fn shared_experts_are_added_to_the_routed_output() {
    let (ck, experts) = Ckpt::build("deepseek_v3", Fmt::Float, 45);
    let dir = temp_dir("unquantized-deepseek-shared");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    let t = ckpt
        .read_layer(0, &moe_layer::checkpoint::ReadOptions::single_rank())
        .unwrap();
    let shared = t.shared.as_ref().expect("the model has a shared expert");
    let moe_layer::checkpoint::StoredExperts::Float { w13, w2 } = &shared.mlp.weights else {
        panic!("float shared expert")
    };
    let (w13, w2): (Vec<f64>, Vec<f64>) = (
        w13.to_f32_vec().into_iter().map(f64::from).collect(),
        w2.to_f32_vec().into_iter().map(f64::from).collect(),
    );
    let si = shared.mlp.intermediate;

    let mut rng = SplitMix64::new(10);
    let tokens = 5;
    let k = 2;
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    let ids: Vec<i32> = (0..tokens * k).map(|s| (s % E) as i32).collect();
    let gates = rng.vec_uniform(tokens * k, 0.2, 0.8);
    let mut want = reference(&experts, &x, &ids, &gates, k);
    for tok in 0..tokens {
        let xt: Vec<f64> = x[tok * H..][..H].iter().map(|&v| f64::from(v)).collect();
        let gu = matvec(&w13, 2 * si, H, &xt);
        let a: Vec<f64> = (0..si)
            .map(|j| gu[j] / (1.0 + (-gu[j]).exp()) * gu[si + j])
            .collect();
        for (o, v) in want[tok * H..][..H].iter_mut().zip(matvec(&w2, H, si, &a)) {
            *o += v;
        }
    }
    let mut out = vec![0f32; tokens * H];
    layer.apply_with_topk(&x, &ids, &gates, &mut out).unwrap();
    let err = rel_l2(&out, &want);
    assert!(err < 1e-5, "relative L2 {err:e}");

    // Without the shared tensors the layer names them and does not run.
    let cfg = moe_layer::MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, None, 4).unwrap();
    let mut partial = MoeLayer::create(cfg).unwrap();
    let mut no_shared = t.clone();
    no_shared.shared = None;
    partial.load_layer_tensors(&no_shared).unwrap();
    let err = partial.process().unwrap_err().to_string();
    assert!(err.contains("shared_experts.experts.0"), "{err}");
}

/// Under expert parallelism the ranks' outputs sum to the single-rank block, shared experts
/// included once: only the rank holding expert 0 adds them.
#[test]
fn shared_experts_count_once_across_expert_parallel_ranks() {
    use moe_router::{ExpertMap, ExpertPlacement};
    let (ck, _) = Ckpt::build("deepseek_v3", Fmt::Float, 46);
    let dir = temp_dir("unquantized-deepseek-shared-ep");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let whole = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();

    let mut rng = SplitMix64::new(11);
    let (tokens, k) = (6, 2);
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    let ids: Vec<i32> = (0..tokens * k).map(|s| ((s * 3) % E) as i32).collect();
    let gates = rng.vec_uniform(tokens * k, 0.2, 0.8);
    let mut want = vec![0f32; tokens * H];
    whole.apply_with_topk(&x, &ids, &gates, &mut want).unwrap();

    for placement in [ExpertPlacement::Linear, ExpertPlacement::RoundRobin] {
        let ep_size = 2;
        let mut sum = vec![0f64; tokens * H];
        let mut adding = 0;
        for rank in 0..ep_size {
            let map = ExpertMap::new(E, ep_size, rank, placement).unwrap();
            let map = map.as_slice().to_vec();
            let cfg =
                moe_layer::MoeLayerConfig::from_spec(ckpt.spec(), 0, 1, Some(map.clone()), 16)
                    .unwrap();
            adding += usize::from(cfg.adds_shared_experts());
            let mut layer = MoeLayer::create(cfg).unwrap();
            let t = ckpt
                .read_layer(
                    0,
                    &moe_layer::checkpoint::ReadOptions::single_rank().with_expert_map(Some(&map)),
                )
                .unwrap();
            layer.load_layer_tensors(&t).unwrap();
            layer.process().unwrap();
            let mut out = vec![0f32; tokens * H];
            layer.apply_with_topk(&x, &ids, &gates, &mut out).unwrap();
            for (s, o) in sum.iter_mut().zip(&out) {
                *s += f64::from(*o);
            }
        }
        assert_eq!(
            adding, 1,
            "{placement}: exactly one rank adds the shared experts"
        );
        let want64: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
        let sum32: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
        let err = rel_l2(&sum32, &want64);
        assert!(
            err < 1e-5,
            "{placement}: sum over ranks vs one rank, relative L2 {err:e}"
        );
    }
}

/// Expert biases (`<proj>.bias`, as gpt-oss stores them) are added inside each expert: gate
/// and up biases before the activation, the down bias before the router weight; under tensor
/// parallelism the ranks' outputs sum to the single-rank block, the down bias counted once.
#[test]
fn expert_biases_are_added_inside_each_expert() {
    let (mut ck, experts) = Ckpt::build("qwen3_moe", Fmt::Float, 47);
    let mut rng = SplitMix64::new(12);
    let mut biases = Vec::new();
    for e in 0..E {
        let mut per = Vec::new();
        for (proj, n) in [("gate_proj", I), ("up_proj", I), ("down_proj", H)] {
            let b: Vec<f32> = rng
                .vec_uniform(n, -0.5, 0.5)
                .into_iter()
                .map(|v| bf16::from_f32(v).to_f32())
                .collect();
            ck.put(
                &format!("model.layers.0.mlp.experts.{e}.{proj}.bias"),
                safetensors::Dtype::BF16,
                &[n],
                checkpoint_support::bf16_bytes(&b),
            );
            per.push(b.into_iter().map(f64::from).collect::<Vec<f64>>());
        }
        biases.push(per);
    }
    let dir = temp_dir("unquantized-expert-bias");
    ck.write(&dir);
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    let layer = MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();

    let (tokens, k) = (5, 2);
    let x = rng.vec_uniform(tokens * H, -1.0, 1.0);
    let ids: Vec<i32> = (0..tokens * k).map(|s| ((s * 3 + 1) % E) as i32).collect();
    let gates = rng.vec_uniform(tokens * k, 0.2, 0.8);
    let mut want = vec![0f64; tokens * H];
    for t in 0..tokens {
        let xt: Vec<f64> = x[t * H..][..H].iter().map(|&v| f64::from(v)).collect();
        for j in 0..k {
            let e = ids[t * k + j] as usize;
            let [gate, up, down] = &experts[e];
            let b = &biases[e];
            let g = matvec(&bf16_weights(gate), I, H, &xt);
            let u = matvec(&bf16_weights(up), I, H, &xt);
            let a: Vec<f64> = (0..I)
                .map(|r| {
                    let (g, u) = (g[r] + b[0][r], u[r] + b[1][r]);
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            let y = matvec(&bf16_weights(down), H, I, &a);
            for (c, o) in want[t * H..][..H].iter_mut().enumerate() {
                *o += f64::from(gates[t * k + j]) * (y[c] + b[2][c]);
            }
        }
    }
    let mut out = vec![0f32; tokens * H];
    layer.apply_with_topk(&x, &ids, &gates, &mut out).unwrap();
    let err = rel_l2(&out, &want);
    assert!(err < 1e-5, "relative L2 {err:e}");

    // Two tensor-parallel ranks: each keeps its rows of the gate/up biases, rank 0 alone adds
    // the down bias.
    let mut sum = vec![0f64; tokens * H];
    for rank in 0..2 {
        let cfg = moe_layer::MoeLayerConfig::from_spec(ckpt.spec(), rank, 2, None, 16).unwrap();
        let mut part = MoeLayer::create(cfg).unwrap();
        let t = ckpt
            .read_layer(
                0,
                &moe_layer::checkpoint::ReadOptions::single_rank().with_tensor_parallel(rank, 2),
            )
            .unwrap();
        part.load_layer_tensors(&t).unwrap();
        part.process().unwrap();
        let mut o = vec![0f32; tokens * H];
        part.apply_with_topk(&x, &ids, &gates, &mut o).unwrap();
        for (s, v) in sum.iter_mut().zip(&o) {
            *s += f64::from(*v);
        }
    }
    let sum32: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
    let err = rel_l2(&sum32, &want);
    assert!(err < 1e-5, "tp=2 sum: relative L2 {err:e}");
}
