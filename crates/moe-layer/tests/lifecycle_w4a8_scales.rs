//! W4A8 checkpoints with f32 group scales: vLLM's W4A8 method copies them into a bf16
//! parameter (round to nearest, ties to even) and runs, so the layer loads them rounded the
//! same way. A checkpoint with f32 scales that are not exact in bf16 must give bit for bit
//! the output of the same checkpoint with those scales rounded to bf16 beforehand.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use checkpoint_support::{bf16_bytes, f32_bytes, runnable_w4a8, temp_dir};
use half::bf16;
use moe_layer::MoeLayer;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use safetensors::Dtype;

#[test]
fn f32_group_scales_are_rounded_to_bf16_at_load() {
    let (e, h, i, g) = (4, 64, 96, 32);
    let base = runnable_w4a8(e, h, i, g, 31);
    let (mut f32_ck, mut bf16_ck) = (base.clone(), base);
    let mut rng = SplitMix64::new(5);
    let mut changed = 0;
    let names: Vec<String> = f32_ck
        .tensors
        .keys()
        .filter(|n| n.ends_with(".weight_scale"))
        .cloned()
        .collect();
    for name in &names {
        let stored = &f32_ck.tensors[name];
        assert_eq!(stored.dtype, Dtype::BF16, "{name}");
        let shape = stored.shape.clone();
        // Each bf16 scale gets random low bits: some round down, some up, some tie.
        let exact: Vec<f32> = stored
            .bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        let wide: Vec<f32> = exact
            .iter()
            .map(|v| {
                let low = match rng.below(4) {
                    0 => 0x8000,
                    _ => rng.below(0x1_0000) as u32,
                };
                f32::from_bits(v.to_bits() | low)
            })
            .collect();
        changed += wide
            .iter()
            .filter(|v| bf16::from_f32(**v).to_f32() != **v)
            .count();
        let rounded: Vec<f32> = wide.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        f32_ck.put(name, Dtype::F32, &shape, f32_bytes(&wide));
        bf16_ck.put(name, Dtype::BF16, &shape, bf16_bytes(&rounded));
    }
    assert!(changed > 0, "some scales must be inexact in bf16");

    let load = |ck: &checkpoint_support::Ckpt, tag: &str| {
        let dir = temp_dir(tag);
        ck.write(&dir);
        let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
        MoeLayer::from_checkpoint(&ckpt, 0, 32).unwrap()
    };
    let from_f32 = load(&f32_ck, "w4a8-f32-scales");
    let from_bf16 = load(&bf16_ck, "w4a8-bf16-scales");
    for t in [1, 7, 32] {
        let x = rng.vec_uniform(t * h, -1.0, 1.0);
        let logits = rng.vec_uniform(t * e, -1.0, 1.0);
        let (mut a, mut b) = (vec![0f32; t * h], vec![0f32; t * h]);
        from_f32.apply(&x, Logits::F32(&logits), &mut a).unwrap();
        from_bf16.apply(&x, Logits::F32(&logits), &mut b).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "t={t}");
        assert!(a.iter().any(|v| *v != 0.0));
    }
}
