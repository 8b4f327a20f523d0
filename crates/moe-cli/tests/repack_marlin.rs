//! `moe repack-marlin` end to end on the WNA16 fixture: the Marlin checkpoint it writes is
//! proven in use by running the Marlin executor's dequantisation on every expert and comparing
//! it bit for bit with the weights moe-layer's reader decodes from the source checkpoint.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use moe_kernels::Par;
use moe_kernels::marlin::{MarlinWeights, MarlinWeightsDesc, ScaleLayout, ScaleValues};
use moe_layer::checkpoint::{Checkpoint, ReadOptions, ShardAccess, StoredExperts};
use safetensors::Dtype;
use support::{
    SafetensorsFile, ScratchDir, fixture, moe, path_arg, read_json, write_json, write_safetensors,
};

#[test]
fn repacked_fixture_dequantises_to_the_source_weights() {
    let model = fixture("qwen3moe-w4a16-g32");
    let tmp = ScratchDir::new("repack-fixture");
    let out_dir = tmp.join("marlin");
    let report = moe(&[
        "--json",
        "repack-marlin",
        "--model",
        path_arg(&model),
        "--output",
        path_arg(&out_dir),
    ])
    .json();
    assert_eq!(report["format"], "moe-rs-marlin/1");
    let config = read_json(&out_dir.join("config.json"));
    assert_eq!(config["moe_rs_marlin"]["num_bits"], 4);

    let ckpt = Checkpoint::open(&model, ShardAccess::Read).unwrap();
    let index = read_json(&out_dir.join("model.safetensors.index.json"));
    for &layer in &ckpt.spec().moe_layers {
        let layer_t = ckpt.read_layer(layer, &ReadOptions::single_rank()).unwrap();
        let StoredExperts::Int(int) = &layer_t.experts.weights else {
            panic!("not quantized")
        };
        let (e, h, i) = (
            layer_t.experts.num_experts,
            layer_t.experts.hidden,
            layer_t.experts.intermediate,
        );
        let gs = int.group_size.group_size().expect("grouped fixture");
        let block = ckpt.names().block_prefix(layer);
        let file = index["weight_map"][format!("{block}.experts.w13.marlin_qweight")]
            .as_str()
            .unwrap();
        let repacked = SafetensorsFile::read(&out_dir.join(file));
        for (p, n, k, codes, scales) in [
            ("w13", 2 * i, h, &int.w13, &int.w13_scales),
            ("w2", h, i, &int.w2, &int.w2_scales),
        ] {
            let q = repacked.u32s(&format!("{block}.experts.{p}.marlin_qweight"));
            let s = repacked.bf16s(&format!("{block}.experts.{p}.marlin_scales"));
            let g = k / gs;
            for x in 0..e {
                let w = MarlinWeights::new(MarlinWeightsDesc {
                    size_k: k,
                    size_n: n,
                    num_bits: 4,
                    is_a_8bit: false,
                    group_size: Some(gs),
                    qweight: &q[x * k * n / 8..(x + 1) * k * n / 8],
                    scales: ScaleValues::Bf16(&s[x * g * n..(x + 1) * g * n]),
                    scale_layout: ScaleLayout::for_kernel(g, false),
                    sort_indices: &[],
                    g_idx_sorted: &[],
                    fp8_preprocessed: false,
                })
                .unwrap();
                let deq = w.dequantize();
                for kk in 0..k {
                    for nn in 0..n {
                        let code = f32::from(codes[(x * n + nn) * k + kk]);
                        let want =
                            bf16::from_f32(code * scales[(x * n + nn) * g + kk / gs]).to_f32();
                        assert_eq!(
                            deq[kk * n + nn].to_bits(),
                            want.to_bits(),
                            "layer {layer} {p}[{x}] k {kk} n {nn}"
                        );
                    }
                }
                // And the executor runs on it.
                let mut y = vec![0f32; n];
                w.gemm(&vec![0.5f32; k], 1, &mut y, Par::Seq).unwrap();
                assert!(y.iter().all(|v| v.is_finite()));
            }
        }
    }
}

#[test]
fn repack_marlin_refuses_bad_input_with_a_message() {
    let tmp = ScratchDir::new("repack-bad");
    let out_dir = tmp.join("marlin");
    let w4a8 = fixture("qwen3moe-w4a8-g32");
    let out = moe(&[
        "repack-marlin",
        "--model",
        path_arg(&w4a8),
        "--output",
        path_arg(&out_dir),
    ]);
    out.assert_reported_error("not a WNA16 checkpoint");
    // A non-empty output directory is never overwritten.
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join("keep"), b"x").unwrap();
    let w4a16 = fixture("qwen3moe-w4a16-g32");
    let out = moe(&[
        "repack-marlin",
        "--model",
        path_arg(&w4a16),
        "--output",
        path_arg(&out_dir),
    ]);
    out.assert_reported_error("not empty");
}

/// Writes a one-layer GPTQ act-order checkpoint (Qwen3-MoE names, E = 8, H = 128, I = 64,
/// 4-bit, group 32, fp16 scales) with seeded random codes, scales and group assignments.
fn write_gptq_act_order_model(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = read_json(&fixture("qwen3moe-w4a16-g32").join("config.json"));
    config["num_hidden_layers"] = 1.into();
    config["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": true, "sym": true});
    write_json(&dir.join("config.json"), &config);
    let mut rng = moe_testutil::SplitMix64::new(42);
    let mut tensors = BTreeMap::new();
    let gate: Vec<u8> = (0..8 * 128)
        .flat_map(|_| bf16::from_f32(rng.uniform(-0.1, 0.1)).to_le_bytes())
        .collect();
    tensors.insert(
        "model.layers.0.mlp.gate.weight".to_string(),
        (Dtype::BF16, vec![8, 128], gate),
    );
    for e in 0..8 {
        // One g_idx per input size, shared by gate and up as GPTQ writes it.
        let g_idx_of = |k: usize, rng: &mut moe_testutil::SplitMix64| -> Vec<i32> {
            let mut p: Vec<i32> = (0..k as i32).collect();
            for i in (1..k).rev() {
                p.swap(i, rng.below(i + 1));
            }
            p.iter().map(|&r| r / 32).collect()
        };
        let g_h = g_idx_of(128, &mut rng);
        let g_i = g_idx_of(64, &mut rng);
        for (proj, n, k) in [
            ("gate_proj", 64usize, 128usize),
            ("up_proj", 64, 128),
            ("down_proj", 128, 64),
        ] {
            let prefix = format!("model.layers.0.mlp.experts.{e}.{proj}");
            let q: Vec<u8> = (0..k / 8 * n)
                .flat_map(|_| (rng.next_u64() as u32).to_le_bytes())
                .collect();
            let s: Vec<u8> = (0..k / 32 * n)
                .flat_map(|_| f16::from_f32(rng.uniform(0.001, 0.02)).to_le_bytes())
                .collect();
            let z: Vec<u8> = (0..k / 32 * n / 8)
                .flat_map(|_| 0x7777_7777u32.to_le_bytes())
                .collect();
            let g = if k == 128 { &g_h } else { &g_i };
            let gb: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.insert(format!("{prefix}.qweight"), (Dtype::I32, vec![k / 8, n], q));
            tensors.insert(format!("{prefix}.scales"), (Dtype::F16, vec![k / 32, n], s));
            tensors.insert(
                format!("{prefix}.qzeros"),
                (Dtype::I32, vec![k / 32, n / 8], z),
            );
            tensors.insert(format!("{prefix}.g_idx"), (Dtype::I32, vec![k], gb));
        }
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

#[test]
fn gptq_act_order_checkpoint_repacks_with_its_permutation() {
    let tmp = ScratchDir::new("repack-gptq");
    let model = tmp.join("gptq");
    write_gptq_act_order_model(&model);
    let out_dir = tmp.join("marlin");
    let report = moe(&[
        "--json",
        "repack-marlin",
        "--model",
        path_arg(&model),
        "--output",
        path_arg(&out_dir),
    ])
    .json();
    assert_eq!(report["act_order"], true);

    let ckpt = Checkpoint::open(&model, ShardAccess::Read).unwrap();
    let layer_t = ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
    let StoredExperts::Int(int) = &layer_t.experts.weights else {
        panic!("not quantized")
    };
    let repacked = SafetensorsFile::read(&out_dir.join("model-marlin-layer00000.safetensors"));
    let (e, h, i, gs) = (8, 128, 64, 32);
    for (p, n, k, codes, scales) in [
        ("w13", 2 * i, h, &int.w13, &int.w13_scales),
        ("w2", h, i, &int.w2, &int.w2_scales),
    ] {
        let name = |tensor: &str| format!("model.layers.0.mlp.experts.{p}.{tensor}");
        let q = repacked.u32s(&name("marlin_qweight"));
        let s = repacked.f16s(&name("marlin_scales"));
        let sort = repacked.u32s(&name("sort_indices"));
        let gsorted = repacked.u32s(&name("g_idx_sorted"));
        let g = k / gs;
        for x in 0..e {
            let w = MarlinWeights::new(MarlinWeightsDesc {
                size_k: k,
                size_n: n,
                num_bits: 4,
                is_a_8bit: false,
                group_size: Some(gs),
                qweight: &q[x * k * n / 8..(x + 1) * k * n / 8],
                scales: ScaleValues::F16(&s[x * g * n..(x + 1) * g * n]),
                scale_layout: ScaleLayout::for_kernel(g, false),
                sort_indices: &sort[x * k..(x + 1) * k],
                g_idx_sorted: &gsorted[x * k..(x + 1) * k],
                fp8_preprocessed: false,
            })
            .unwrap();
            let deq = w.dequantize();
            let g_idx = &int.act_order.as_ref().unwrap();
            let g_idx = if p == "w13" {
                &g_idx.w13_g_idx
            } else {
                &g_idx.w2_g_idx
            };
            for kk in 0..k {
                let grp = g_idx[x * k + kk] as usize;
                for nn in 0..n {
                    let code = f32::from(codes[(x * n + nn) * k + kk]);
                    let want = f16::from_f32(code * scales[(x * n + nn) * g + grp]).to_f32();
                    assert_eq!(
                        deq[kk * n + nn].to_bits(),
                        want.to_bits(),
                        "{p}[{x}] k {kk} n {nn}"
                    );
                }
            }
        }
    }
}
