//! Writes one-layer checkpoints of a real model's MoE shape for timing `moe run` by hand (the
//! checkpoints are hundreds of megabytes, so this is not part of the test run):
//!
//!     MOE_REAL_SHAPED_DIR=<dir> cargo test --release -p moe-layer --test real_shaped_checkpoints -- --ignored
//!
//! writes `w4a8-g32/` (compressed-tensors `int-quantized`, W4A8) and `w4a16-g128/`
//! (`pack-quantized`, WNA16) of the Qwen3-30B-A3B MoE shape (128 experts, top-8, hidden 2048,
//! intermediate 768) with the same random codes; the other WNA16 storages at group size 128,
//! with their own random codes: `awq-g128/` (AWQ `gemm`, zero points), `gptq-actorder-g128/`
//! (GPTQ int4 with `desc_act`), `gptq-w8a16-g128/` (GPTQ int8) and `w8a16-g128/`
//! (`pack-quantized` int8); FP8 `fp8-block/` (`quant_method: fp8`, `[128, 128]` blocks),
//! `fp8-channel/` (compressed-tensors `FP8_DYNAMIC`) and `fp8-tensor/` (AutoFP8, static
//! activations); `w8a8-int8/` (compressed-tensors `INT8_W8A8`); `bf16/` (unquantized); and
//! `x-{1,16,256}.safetensors` inputs (`hidden_states`, bf16). The other tests write one layer of
//! Llama 4 Scout (`llama4-scout-bf16/`) in bf16 and of gpt-oss-20b in MXFP4 and bf16
//! (`gpt-oss-20b-mxfp4/`, `gpt-oss-20b-bf16/`) with their inputs.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use checkpoint_support::{
    Ckpt, Fmt, Fp8Store, Stored, Wna16Spec, Wna16Store, bf16_bytes, fp8, runnable, w8a8_int, wna16,
};
use moe_testutil::SplitMix64;
use safetensors::Dtype;

const SHAPE: [usize; 4] = [128, 8, 2048, 768];

#[test]
#[ignore = "writes about a gigabyte; run by hand to time moe run"]
fn write_real_shaped_checkpoints() {
    let dir = PathBuf::from(
        std::env::var("MOE_REAL_SHAPED_DIR").expect("MOE_REAL_SHAPED_DIR names the output"),
    );
    for (name, fmt, g) in [
        ("w4a8-g32", Fmt::IntQuantized, 32),
        ("w4a16-g128", Fmt::PackQuantized, 128),
    ] {
        let out = dir.join(name);
        std::fs::create_dir_all(&out).unwrap();
        runnable(fmt, SHAPE, g, 0x5ea1).write(&out);
    }
    for (name, store, bits, act_order) in [
        ("awq-g128", Wna16Store::Awq, 4, false),
        ("gptq-actorder-g128", Wna16Store::Gptq, 4, true),
        ("gptq-w8a16-g128", Wna16Store::Gptq, 8, false),
        ("w8a16-g128", Wna16Store::PackQuantized, 8, false),
    ] {
        let out = dir.join(name);
        std::fs::create_dir_all(&out).unwrap();
        let spec = Wna16Spec {
            store,
            bits,
            group: Some(128),
            act_order,
            asym: false,
            shape: SHAPE,
        };
        wna16(&spec, 0x5ea2).write(&out);
    }
    for (name, store) in [
        ("fp8-block", Fp8Store::Blocks),
        ("fp8-channel", Fp8Store::CtChannels),
        ("fp8-tensor", Fp8Store::TensorStatic),
    ] {
        let out = dir.join(name);
        std::fs::create_dir_all(&out).unwrap();
        fp8("qwen3_moe", SHAPE, 0x5ea3, store).0.write(&out);
    }
    let out = dir.join("w8a8-int8");
    std::fs::create_dir_all(&out).unwrap();
    w8a8_int(SHAPE, 0x5ea4).0.write(&out);
    let out = dir.join("bf16");
    std::fs::create_dir_all(&out).unwrap();
    bf16_qwen3(0x5ea6).write(&out);
    let mut rng = SplitMix64::new(0x1f);
    for tokens in [1usize, 16, 256] {
        let x = rng.vec_uniform(tokens * SHAPE[2], -1.0, 1.0);
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "hidden_states".to_string(),
            Stored {
                dtype: Dtype::BF16,
                shape: vec![tokens, SHAPE[2]],
                bytes: bf16_bytes(&x),
            },
        );
        std::fs::write(
            dir.join(format!("x-{tokens}.safetensors")),
            Ckpt::serialize(&tensors),
        )
        .unwrap();
    }
}

/// Random bf16 weights of magnitude about 2^-6 (a random sign and mantissa, exponent 121), as
/// little-endian bytes.
fn random_bf16_bytes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len * 2 + 8);
    for _ in 0..len.div_ceil(4) {
        let r = rng.next_u64();
        for lane in 0..4 {
            let bits = ((r >> (16 * lane)) as u16 & 0x807F) | (121 << 7);
            bytes.extend(bits.to_le_bytes());
        }
    }
    bytes.truncate(len * 2);
    bytes
}

/// The unquantized Qwen3 layer of [`SHAPE`], every projection bf16.
fn bf16_qwen3(seed: u64) -> Ckpt {
    let [e, top_k, h, i] = SHAPE;
    let mut rng = SplitMix64::new(seed);
    let config = serde_json::json!({
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "torch_dtype": "bfloat16", "hidden_act": "silu", "hidden_size": h,
        "num_hidden_layers": 1, "num_experts": e, "num_experts_per_tok": top_k,
        "moe_intermediate_size": i, "norm_topk_prob": true,
    });
    let mut tensors = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, bytes: Vec<u8>| {
        let dtype = Dtype::BF16;
        tensors.insert(
            name,
            Stored {
                dtype,
                shape,
                bytes,
            },
        );
    };
    put(
        "model.layers.0.mlp.gate.weight".into(),
        vec![e, h],
        random_bf16_bytes(&mut rng, e * h),
    );
    for x in 0..e {
        for (name, shape) in [
            ("gate_proj", vec![i, h]),
            ("up_proj", vec![i, h]),
            ("down_proj", vec![h, i]),
        ] {
            put(
                format!("model.layers.0.mlp.experts.{x}.{name}.weight"),
                shape,
                random_bf16_bytes(&mut rng, h * i),
            );
        }
    }
    Ckpt { config, tensors }
}

/// Llama 4 Scout's MoE layer: 16 experts, top-1, hidden 5120, intermediate 8192.
const LLAMA4_SCOUT: [usize; 4] = [16, 1, 5120, 8192];

/// Writes `llama4-scout-bf16/`, one MoE layer as the multimodal bf16 checkpoint stores it (the
/// experts fused per layer with K leading, a shared expert, the config under `text_config`,
/// names under `language_model.`; about 4.3 GB), and `x-llama4-{1,16,256}.safetensors`:
///
///     MOE_REAL_SHAPED_DIR=<dir> cargo test --release -p moe-layer --test real_shaped_checkpoints -- --ignored llama4
#[test]
#[ignore = "writes about four gigabytes; run by hand to time moe run"]
fn write_llama4_scout_layer() {
    let dir = PathBuf::from(
        std::env::var("MOE_REAL_SHAPED_DIR").expect("MOE_REAL_SHAPED_DIR names the output"),
    );
    let [e, top_k, h, i] = LLAMA4_SCOUT;
    let out = dir.join("llama4-scout-bf16");
    std::fs::create_dir_all(&out).unwrap();
    let config = serde_json::json!({
        "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "llama4_text", "hidden_size": h, "num_hidden_layers": 1,
            "num_local_experts": e, "num_experts_per_tok": top_k, "intermediate_size": i,
            "interleave_moe_layer_step": 1, "hidden_act": "silu",
        },
    });
    let mut rng = SplitMix64::new(0x5ea5);
    let mut random = |len: usize| random_bf16_bytes(&mut rng, len);
    let prefix = "language_model.model.layers.0.feed_forward";
    let mut tensors = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>, bytes: Vec<u8>| {
        let stored = Stored {
            dtype: Dtype::BF16,
            shape,
            bytes,
        };
        tensors.insert(name, stored);
    };
    put(format!("{prefix}.router.weight"), vec![e, h], random(e * h));
    put(
        format!("{prefix}.experts.gate_up_proj"),
        vec![e, h, 2 * i],
        random(e * h * 2 * i),
    );
    put(
        format!("{prefix}.experts.down_proj"),
        vec![e, i, h],
        random(e * i * h),
    );
    for (name, shape) in [
        ("gate_proj", vec![i, h]),
        ("up_proj", vec![i, h]),
        ("down_proj", vec![h, i]),
    ] {
        put(
            format!("{prefix}.shared_expert.{name}.weight"),
            shape,
            random(h * i),
        );
    }
    Ckpt { config, tensors }.write(&out);
    let mut rng = SplitMix64::new(0x20);
    for tokens in [1usize, 16, 256] {
        let x = rng.vec_uniform(tokens * h, -1.0, 1.0);
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "hidden_states".to_string(),
            Stored {
                dtype: Dtype::BF16,
                shape: vec![tokens, h],
                bytes: bf16_bytes(&x),
            },
        );
        std::fs::write(
            dir.join(format!("x-llama4-{tokens}.safetensors")),
            Ckpt::serialize(&tensors),
        )
        .unwrap();
    }
}

/// Writes one MoE layer of gpt-oss-20b (32 experts, top-4, hidden 2880, intermediate 2880) twice
/// with the same weights: `gpt-oss-20b-mxfp4/` as the published checkpoint stores it (MXFP4
/// `*_blocks` and `*_scales`, about 0.4 GB) and `gpt-oss-20b-bf16/` as its bf16 conversions do
/// (about 1.6 GB); and `x-gpt-oss-{1,16,256}.safetensors`:
///
///     MOE_REAL_SHAPED_DIR=<dir> cargo test --release -p moe-layer --test real_shaped_checkpoints -- --ignored gpt_oss
#[test]
#[ignore = "writes about 2 gigabytes; run by hand to time moe run"]
fn write_gpt_oss_20b_layers() {
    let dir = PathBuf::from(
        std::env::var("MOE_REAL_SHAPED_DIR").expect("MOE_REAL_SHAPED_DIR names the output"),
    );
    let m = moe_testutil::gpt_oss::GptOss::random(0x5ea7, [32, 4, 2880, 2880], 7.0);
    let out = dir.join("gpt-oss-20b-mxfp4");
    std::fs::create_dir_all(&out).unwrap();
    m.write(&out);
    let out = dir.join("gpt-oss-20b-bf16");
    std::fs::create_dir_all(&out).unwrap();
    Ckpt::gpt_oss_bf16(&m).write(&out);
    let mut rng = SplitMix64::new(0x21);
    for tokens in [1usize, 16, 256] {
        let x = rng.vec_uniform(tokens * m.h, -1.0, 1.0);
        let mut tensors = BTreeMap::new();
        tensors.insert(
            "hidden_states".to_string(),
            Stored {
                dtype: Dtype::BF16,
                shape: vec![tokens, m.h],
                bytes: bf16_bytes(&x),
            },
        );
        std::fs::write(
            dir.join(format!("x-gpt-oss-{tokens}.safetensors")),
            Ckpt::serialize(&tensors),
        )
        .unwrap();
    }
}
