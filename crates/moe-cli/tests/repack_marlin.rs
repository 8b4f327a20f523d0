//! `moe repack-marlin` end to end on the WNA16 fixture: the Marlin checkpoint it writes is
//! proven in use by running the Marlin executor's dequantisation on every expert and comparing
//! it bit for bit with the weights moe-layer's reader decodes from the source checkpoint.

use std::path::PathBuf;
use std::process::{Command, Output};

use half::bf16;
use moe_kernels::Par;
use moe_kernels::marlin::{MarlinWeights, MarlinWeightsDesc, ScaleLayout, ScaleValues};
use moe_layer::checkpoint::{Checkpoint, ReadOptions, ShardAccess, StoredExperts};
use safetensors::SafeTensors;

fn moe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moe"))
        .args(args)
        .output()
        .expect("the moe binary runs")
}

fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moe-repack-marlin-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn le_u32(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn le_bf16(bytes: &[u8]) -> Vec<bf16> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn repacked_fixture_dequantises_to_the_source_weights() {
    let model = moe_testutil::fixtures_dir().join("qwen3moe-w4a16-g32");
    let out_dir = scratch_dir("fixture");
    let out = moe(&[
        "--json",
        "repack-marlin",
        "--model",
        model.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["format"], "moe-rs-marlin/1");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["moe_rs_marlin"]["num_bits"], 4);

    let ckpt = Checkpoint::open(&model, ShardAccess::Read).unwrap();
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
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
        let gs = int.group_size.expect("grouped fixture");
        let block = ckpt.names().block_prefix(layer);
        let file = index["weight_map"][format!("{block}.experts.w13.marlin_qweight")]
            .as_str()
            .unwrap();
        let bytes = std::fs::read(out_dir.join(file)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for (p, n, k, codes, scales) in [
            ("w13", 2 * i, h, &int.w13, &int.w13_scales),
            ("w2", h, i, &int.w2, &int.w2_scales),
        ] {
            let q = le_u32(
                st.tensor(&format!("{block}.experts.{p}.marlin_qweight"))
                    .unwrap()
                    .data(),
            );
            let s = le_bf16(
                st.tensor(&format!("{block}.experts.{p}.marlin_scales"))
                    .unwrap()
                    .data(),
            );
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
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn repack_marlin_refuses_bad_input_with_a_message() {
    let out_dir = scratch_dir("bad");
    let w4a8 = moe_testutil::fixtures_dir().join("qwen3moe-w4a8-g32");
    let out = moe(&[
        "repack-marlin",
        "--model",
        w4a8.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a WNA16 checkpoint"));
    // A non-empty output directory is never overwritten.
    std::fs::create_dir_all(&out_dir).unwrap();
    std::fs::write(out_dir.join("keep"), b"x").unwrap();
    let w4a16 = moe_testutil::fixtures_dir().join("qwen3moe-w4a16-g32");
    let out = moe(&[
        "repack-marlin",
        "--model",
        w4a16.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// Writes a one-layer GPTQ act-order checkpoint (Qwen3-MoE names, E = 8, H = 128, I = 64,
/// 4-bit, group 32, fp16 scales) with seeded random codes, scales and group assignments.
fn write_gptq_act_order_model(dir: &std::path::Path) {
    use safetensors::Dtype;
    std::fs::create_dir_all(dir).unwrap();
    let fixture = moe_testutil::fixtures_dir().join("qwen3moe-w4a16-g32");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    config["num_hidden_layers"] = 1.into();
    config["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": true, "sym": true});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = moe_testutil::SplitMix64::new(42);
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let gate: Vec<u8> = (0..8 * 128)
        .flat_map(|_| bf16::from_f32(rng.uniform(-0.1, 0.1)).to_le_bytes())
        .collect();
    tensors.push((
        "model.layers.0.mlp.gate.weight".into(),
        Dtype::BF16,
        vec![8, 128],
        gate,
    ));
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
                .flat_map(|_| half::f16::from_f32(rng.uniform(0.001, 0.02)).to_le_bytes())
                .collect();
            let z: Vec<u8> = (0..k / 32 * n / 8)
                .flat_map(|_| 0x7777_7777u32.to_le_bytes())
                .collect();
            let g = if k == 128 { &g_h } else { &g_i };
            let gb: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.push((format!("{prefix}.qweight"), Dtype::I32, vec![k / 8, n], q));
            tensors.push((format!("{prefix}.scales"), Dtype::F16, vec![k / 32, n], s));
            tensors.push((
                format!("{prefix}.qzeros"),
                Dtype::I32,
                vec![k / 32, n / 8],
                z,
            ));
            tensors.push((format!("{prefix}.g_idx"), Dtype::I32, vec![k], gb));
        }
    }
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

#[test]
fn gptq_act_order_checkpoint_repacks_with_its_permutation() {
    let model = scratch_dir("gptq-src");
    write_gptq_act_order_model(&model);
    let out_dir = scratch_dir("gptq-out");
    let out = moe(&[
        "--json",
        "repack-marlin",
        "--model",
        model.to_str().unwrap(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["act_order"], true);

    let ckpt = Checkpoint::open(&model, ShardAccess::Read).unwrap();
    let layer_t = ckpt.read_layer(0, &ReadOptions::single_rank()).unwrap();
    let StoredExperts::Int(int) = &layer_t.experts.weights else {
        panic!("not quantized")
    };
    let bytes = std::fs::read(out_dir.join("model-marlin-layer00000.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (e, h, i, gs) = (8, 128, 64, 32);
    for (p, n, k, codes, scales) in [
        ("w13", 2 * i, h, &int.w13, &int.w13_scales),
        ("w2", h, i, &int.w2, &int.w2_scales),
    ] {
        let get = |name: &str| {
            st.tensor(&format!("model.layers.0.mlp.experts.{p}.{name}"))
                .unwrap()
        };
        let q = le_u32(get("marlin_qweight").data());
        let s: Vec<half::f16> = get("marlin_scales")
            .data()
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]))
            .collect();
        let sort = le_u32(get("sort_indices").data());
        let gsorted = le_u32(get("g_idx_sorted").data());
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
                    let want = half::f16::from_f32(code * scales[(x * n + nn) * g + grp]).to_f32();
                    assert_eq!(
                        deq[kk * n + nn].to_bits(),
                        want.to_bits(),
                        "{p}[{x}] k {kk} n {nn}"
                    );
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&model);
    let _ = std::fs::remove_dir_all(&out_dir);
}
