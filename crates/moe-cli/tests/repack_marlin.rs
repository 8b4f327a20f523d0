//! `moe repack-marlin` end to end on the WNA16 fixture: the Marlin checkpoint it writes is
//! proven in use by running the Marlin executor's dequantisation on every expert and comparing
//! it bit for bit with the weights moe-layer's reader decodes from the source checkpoint.

use std::path::PathBuf;
use std::process::{Command, Output};

use half::bf16;
use moe_kernels::Par;
use moe_kernels::marlin::{MarlinWeights, MarlinWeightsDesc, ScaleLayout, ScaleValues};
use moe_layer::checkpoint::{Checkpoint, ExpertWeights, ReadOptions, ShardAccess};
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
        let ExpertWeights::Int(int) = &layer_t.experts.weights else {
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
