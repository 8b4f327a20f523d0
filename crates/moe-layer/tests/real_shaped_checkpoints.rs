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
//! activations); `w8a8-int8/` (compressed-tensors `INT8_W8A8`); and `x-{1,16,256}.safetensors`
//! inputs (`hidden_states`, bf16).
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
