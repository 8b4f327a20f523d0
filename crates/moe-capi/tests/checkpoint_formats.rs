//! MXFP4 (gpt-oss) and FP8 block-quantized checkpoints written by the test open through the C
//! ABI (`moe_layer_open_checkpoint`, and `moe_layer_open_checkpoint_with` with NULL ranks and
//! options) and compute bit for bit what the Rust layer opened from the same directory
//! computes, from router logits and from hidden states alone, at token counts below and above
//! the bf16 path's row threshold. `MoeQuant` has no value for these schemes:
//! `moe_layer_create` refuses one and says to open the checkpoint.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{null, null_mut};

use half::bf16;
use moe_capi::*;
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use moe_testutil::gpt_oss::{GptOss, Tensor};
use safetensors::Dtype;
use serde_json::json;

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string for the calling thread.
    unsafe { CStr::from_ptr(moe_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn expect(status: MoeStatus, want: MoeStatus) {
    assert_eq!(status, want, "message: {}", last_error());
}

/// A fresh directory for one checkpoint.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moe-capi-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A one-layer Qwen3-MoE FP8 checkpoint (`quant_method: fp8`, `[128, 128]` blocks): random
/// e4m3 codes (any non-NaN byte, subnormals and both zeros common), block scales, a bf16
/// router gate. H and I are not multiples of 128, so every matrix has short blocks.
fn write_fp8(dir: &Path, [e, top_k, h, i]: [usize; 4], seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let config = json!({
        "model_type": "qwen3_moe",
        "architectures": [],
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "hidden_size": h,
        "num_hidden_layers": 1,
        "num_experts": e,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": i,
        "norm_topk_prob": true,
        "quantization_config": {
            "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    });
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    let gate: Vec<u8> = rng
        .vec_uniform(e * h, -0.5, 0.5)
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    tensors.insert(
        "model.layers.0.mlp.gate.weight".into(),
        (Dtype::BF16, vec![e, h], gate),
    );
    for x in 0..e {
        for (name, n, k) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            let codes: Vec<u8> = (0..n * k)
                .map(|_| {
                    let b = rng.below(256) as u8;
                    let b = if rng.below(8) == 0 { b & 0x87 } else { b };
                    if b & 0x7F == 0x7F { b ^ 0x08 } else { b }
                })
                .collect();
            let scales: Vec<u8> = rng
                .vec_uniform(n.div_ceil(128) * k.div_ceil(128), 2e-5, 4e-4)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let prefix = format!("model.layers.0.mlp.experts.{x}.{name}");
            tensors.insert(
                format!("{prefix}.weight"),
                (Dtype::F8_E4M3, vec![n, k], codes),
            );
            tensors.insert(
                format!("{prefix}.weight_scale_inv"),
                (Dtype::F32, vec![n.div_ceil(128), k.div_ceil(128)], scales),
            );
        }
    }
    GptOss::write_with(&config, &tensors, dir);
}

/// Opens `dir` through the ABI, plainly or through the `_with` form with NULL ranks and
/// options.
fn open(dir: &Path, with: bool) -> *mut MoeLayerHandle {
    let dir = CString::new(dir.to_str().unwrap()).unwrap();
    let mut layer = null_mut();
    // SAFETY: a valid C string and out-pointer; NULL ranks and options are allowed.
    let status = unsafe {
        if with {
            moe_layer_open_checkpoint_with(
                dir.as_ptr(),
                MOE_FIRST_MOE_LAYER,
                64,
                null(),
                null(),
                &mut layer,
            )
        } else {
            moe_layer_open_checkpoint(dir.as_ptr(), MOE_FIRST_MOE_LAYER, 64, &mut layer)
        }
    };
    expect(status, MoeStatus::Ok);
    assert!(!layer.is_null());
    layer
}

/// `moe_layer_apply` on f32 buffers, with router logits or (NULL) from the hidden states.
fn apply(layer: *mut MoeLayerHandle, x: &[f32], logits: Option<&[f32]>, out: &mut [f32]) {
    let (l_ptr, l_len) = logits.map_or((null(), 0), |l| (l.as_ptr().cast(), l.len()));
    // SAFETY: valid buffers of the stated lengths.
    let status = unsafe {
        moe_layer_apply(
            layer,
            MoeDtype::F32 as u32,
            x.as_ptr().cast(),
            x.len(),
            l_ptr,
            l_len,
            out.as_mut_ptr().cast(),
            out.len(),
        )
    };
    expect(status, MoeStatus::Ok);
}

/// Opens `dir` both ways through the ABI and once in Rust, and compares the outputs bit for
/// bit at 1, 5 and 48 tokens (48 puts enough rows on every expert for the bf16 path where
/// the CPU has one), from logits and from hidden states.
fn abi_equals_rust(dir: &Path, e: usize, h: usize, what: &str) {
    let ckpt = Checkpoint::open(dir, ShardAccess::Read).unwrap();
    let rust = MoeLayer::from_checkpoint(&ckpt, 0, 64).unwrap();
    let mut rng = SplitMix64::new(0xcab1);
    for with in [false, true] {
        let layer = open(dir, with);
        for t in [1, 5, 48] {
            let x = rng.vec_uniform(t * h, -2.0, 2.0);
            let logits = rng.vec_uniform(t * e, -1.0, 1.0);
            let (mut want, mut got) = (vec![0f32; t * h], vec![f32::NAN; t * h]);
            rust.apply(&x, Logits::F32(&logits), &mut want).unwrap();
            apply(layer, &x, Some(&logits), &mut got);
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&want, &got), "{what} with={with} t={t}: from logits");
            rust.apply_with_gate(&x, &mut want).unwrap();
            apply(layer, &x, None, &mut got);
            assert!(
                same(&want, &got),
                "{what} with={with} t={t}: from hidden states"
            );
            assert!(got.iter().all(|v| v.is_finite()), "{what}");
        }
        expect(moe_layer_free(layer), MoeStatus::Ok);
    }
}

#[test]
fn fp8_checkpoint_opens_through_the_abi_and_equals_the_rust_layer() {
    let dir = temp_dir("fp8");
    let (e, h) = (4, 160);
    write_fp8(&dir, [e, 2, h, 72], 61);
    abi_equals_rust(&dir, e, h, "fp8");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mxfp4_checkpoint_opens_through_the_abi_and_equals_the_rust_layer() {
    let dir = temp_dir("mxfp4");
    let (e, h) = (4, 80);
    GptOss::random(67, [e, 2, h, 64], 7.0).write(&dir);
    abi_equals_rust(&dir, e, h, "mxfp4");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `moe_layer_create` has no MXFP4 or FP8 value, and its refusal of an unknown scheme points
/// at the checkpoint road.
#[test]
fn create_refuses_other_schemes_and_points_at_the_checkpoint_road() {
    for quant in [4u32, 5] {
        let desc = MoeLayerDesc {
            num_experts: 4,
            top_k: 2,
            hidden: 64,
            intermediate: 64,
            quant,
            group_size: 0,
            renormalize: 1,
            dtype: MoeDtype::F32 as u32,
            max_tokens: 8,
        };
        let mut layer = null_mut();
        // SAFETY: a valid desc and out-pointer.
        let status = unsafe { moe_layer_create(&desc, &mut layer) };
        expect(status, MoeStatus::InvalidArgument);
        assert!(layer.is_null());
        let msg = last_error();
        assert!(
            msg.contains("desc.quant") && msg.contains("moe_layer_open_checkpoint"),
            "{msg}"
        );
    }
}
