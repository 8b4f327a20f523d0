//! The checkpoint reader on the real compressed-tensors fixtures of `$MOE_FIXTURES`: every
//! fixture loads, expert 0's dequantized `w13` matches `w13_dequant_f32_expert0` exactly, the
//! `pack-quantized` and `int-quantized` twins of one base model give identical codes and scales,
//! and tensor-parallel slices and expert maps cut the single-rank result as spec section 6.3 says.

#![cfg(feature = "checkpoint")]
use std::path::PathBuf;

use moe_layer::checkpoint::{
    Checkpoint, FloatData, IntExperts, MoeLayerTensors, QuantScheme, ReadOptions, ShardAccess,
    StoredExperts,
};
use moe_quant::DType;
use moe_quant::half_conv::{round_to_bf16, round_to_f16};
use moe_testutil::{GoldenCase, fixtures_dir};

/// Every fixture directory (one holding a `config.json`), in name order.
fn fixture_dirs() -> Vec<PathBuf> {
    let root = fixtures_dir();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("fixtures {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixture under {}", root.display());
    dirs
}

fn int_experts(t: &MoeLayerTensors) -> &IntExperts {
    match &t.experts.weights {
        StoredExperts::Int(q) => q,
        other => panic!(
            "layer {}: expected quantized experts, got {other:?}",
            t.layer
        ),
    }
}

fn open(dir: &std::path::Path) -> Checkpoint {
    Checkpoint::open(dir, ShardAccess::Read).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

#[test]
fn every_fixture_loads_with_the_shapes_of_its_config() {
    for dir in fixture_dirs() {
        let ckpt = open(&dir);
        let spec = ckpt.spec().clone();
        assert!(!spec.moe_layers.is_empty(), "{}", dir.display());
        let layers = ckpt
            .read_moe_layers(&ReadOptions::single_rank())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(layers.len(), spec.moe_layers.len());
        let (e, h, i) = (spec.num_experts, spec.hidden, spec.intermediate);
        for t in &layers {
            assert_eq!(t.local_experts, (0..e).collect::<Vec<_>>());
            assert_eq!(
                (
                    t.experts.num_experts,
                    t.experts.hidden,
                    t.experts.intermediate
                ),
                (e, h, i)
            );
            assert_eq!(t.router.weight.len(), e * h);
            match &t.experts.weights {
                StoredExperts::Int(q) => {
                    let g = q.group_size.group_size().unwrap_or(h);
                    assert_eq!(q.w13.len(), e * 2 * i * h);
                    assert_eq!(q.w2.len(), e * h * i);
                    assert_eq!(q.w13_scales.len(), e * 2 * i * (h / g));
                    let g2 = q.group_size.group_size().unwrap_or(i);
                    assert_eq!(q.w2_scales.len(), e * h * (i / g2));
                    let max = (1i16 << (q.bits - 1)) - 1;
                    assert!(
                        q.w13
                            .iter()
                            .chain(&q.w2)
                            .all(|&c| (-max - 1..=max).contains(&i16::from(c)))
                    );
                }
                StoredExperts::Float { w13, w2 } => {
                    assert_eq!((w13.len(), w2.len()), (e * 2 * i * h, e * h * i));
                }
                other => panic!("unexpected weights {other:?}"),
            }
        }

        // The expected file records the sizes it was made with.
        let expected = dir.join("expected.safetensors");
        if expected.is_file() {
            let case = GoldenCase::open(&expected).unwrap();
            assert_eq!(case.meta_i64("num_experts") as usize, e);
            assert_eq!(case.meta_i64("top_k") as usize, spec.top_k);
            assert_eq!(case.meta_i64("hidden_size") as usize, h);
            assert_eq!(case.meta_i64("moe_intermediate_size") as usize, i);
        }
    }
}

#[test]
fn expert0_w13_dequantizes_exactly_to_the_expected_tensor() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        let expected = dir.join("expected.safetensors");
        if !expected.is_file() {
            continue;
        }
        let case = GoldenCase::open(&expected).unwrap();
        if !case.has("w13_dequant_f32_expert0") {
            continue;
        }
        let ckpt = open(&dir);
        let layer = case.meta_i64("layer") as usize;
        let t = ckpt
            .read_layer(layer, &ReadOptions::single_rank())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let q = int_experts(&t);
        let (h, i) = (t.experts.hidden, t.experts.intermediate);
        let g = q.group_size.group_size().unwrap_or(h);
        let groups = h / g;
        let want = case.f32s("w13_dequant_f32_expert0");
        assert_eq!(case.shape("w13_dequant_f32_expert0"), [2 * i, h]);
        let got: Vec<f32> = (0..2 * i * h)
            .map(|idx| f32::from(q.w13[idx]) * q.w13_scales[(idx / h) * groups + (idx % h) / g])
            .collect();
        let first_diff = |cand: &[f32]| {
            cand.iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits())
        };
        // compressed-tensors' `dequantize` returns `q · scale` in the scale dtype: the expected
        // tensor is that product rounded to bf16 (f16) and widened, which is exact in f32 but
        // not the f32 product itself. Accept either, element for element, with no tolerance.
        let round = match q.scale_dtype {
            DType::BF16 => round_to_bf16,
            DType::F16 => round_to_f16,
            _ => |v| v,
        };
        let rounded: Vec<f32> = got.iter().map(|&v| round(v)).collect();
        if let (Some(_), Some(idx)) = (first_diff(&got), first_diff(&rounded)) {
            panic!(
                "{}: w13[0] flat {idx} = {} (rounded to {}: {}), expected {}",
                dir.display(),
                got[idx],
                q.scale_dtype,
                rounded[idx],
                want[idx]
            );
        }

        // The router weight is the gate the expected logits were computed with (bf16 output).
        let x = case.f32s("x");
        let logits = case.f32s("router_logits");
        let w = t.router.weight.to_f32_vec();
        let e = t.experts.num_experts;
        for (row, xr) in x.chunks_exact(h).enumerate() {
            for ex in 0..e {
                let dot: f32 = xr
                    .iter()
                    .zip(&w[ex * h..(ex + 1) * h])
                    .map(|(a, b)| a * b)
                    .sum();
                let want = logits[row * e + ex];
                assert!(
                    (dot - want).abs() <= 1e-2 * want.abs().max(1e-2),
                    "{}: router logit [{row}][{ex}] = {dot}, expected {want}",
                    dir.display()
                );
            }
        }
        checked += 1;
    }
    assert!(checked > 0, "no fixture has w13_dequant_f32_expert0");
}

#[test]
fn pack_quantized_twin_gives_identical_codes_and_scales() {
    let mut pairs = 0;
    for dir in fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !name.contains("w4a16") {
            continue;
        }
        let twin = dir.with_file_name(name.replace("w4a16", "w4a8"));
        if !twin.join("config.json").is_file() {
            continue;
        }
        let (a, b) = (open(&dir), open(&twin));
        assert!(matches!(
            a.spec().quant,
            QuantScheme::CompressedTensorsWna16 { bits: 4, .. }
        ));
        assert!(matches!(
            b.spec().quant,
            QuantScheme::CompressedTensorsW4A8 { .. }
        ));
        let opts = ReadOptions::single_rank();
        let la = a.read_moe_layers(&opts).unwrap();
        let lb = b.read_moe_layers(&opts).unwrap();
        for (ta, tb) in la.iter().zip(&lb) {
            let (qa, qb) = (int_experts(ta), int_experts(tb));
            assert_eq!(qa.w13, qb.w13, "{name} layer {} w13 codes", ta.layer);
            assert_eq!(qa.w2, qb.w2, "{name} layer {} w2 codes", ta.layer);
            assert_eq!(qa.w13_scales, qb.w13_scales);
            assert_eq!(qa.w2_scales, qb.w2_scales);
            assert_eq!(
                (qa.group_size, qa.scale_dtype),
                (qb.group_size, qb.scale_dtype)
            );
            assert_eq!(ta.router, tb.router);
        }
        pairs += 1;
    }
    let public = fixtures_dir().join("qwen3moe-w4a16-g32");
    assert!(
        pairs > 0 || !public.is_dir(),
        "the public w4a16/w4a8 pair was not compared"
    );
}

#[test]
fn mmap_and_read_give_the_same_tensors() {
    for dir in fixture_dirs() {
        let a = open(&dir);
        let b = Checkpoint::open(&dir, ShardAccess::Mmap).unwrap();
        let opts = ReadOptions::single_rank();
        assert_eq!(
            a.read_moe_layers(&opts).unwrap(),
            b.read_moe_layers(&opts).unwrap()
        );
    }
}

/// `rows × cols` block of a row-major `[.., row_len]` matrix.
fn block<T: Copy>(
    src: &[T],
    row_len: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> Vec<T> {
    rows.flat_map(|r| src[r * row_len + cols.start..r * row_len + cols.end].to_vec())
        .collect()
}

#[test]
fn tensor_parallel_ranks_cut_the_single_rank_tensors() {
    for dir in fixture_dirs() {
        let ckpt = open(&dir);
        let layer = ckpt.spec().moe_layers[0];
        let full = ckpt.read_layer(layer, &ReadOptions::single_rank()).unwrap();
        let q = int_experts(&full);
        let (e, h, i_full) = (
            full.experts.num_experts,
            full.experts.hidden,
            full.experts.intermediate,
        );
        let g = q.group_size.group_size().unwrap_or(h);
        let (g13, g2_full) = (h / g, q.group_size.group_size().map_or(1, |g| i_full / g));
        let tp = 2;
        let i = i_full / tp;
        for rank in 0..tp {
            let opts = ReadOptions::single_rank().with_tensor_parallel(rank, tp);
            let part = ckpt.read_layer(layer, &opts).unwrap();
            let p = int_experts(&part);
            assert_eq!(part.experts.intermediate, i);
            assert_eq!(part.router, full.router);
            let rows = rank * i..(rank + 1) * i;
            let (mut w13, mut s13, mut w2, mut s2) = (vec![], vec![], vec![], vec![]);
            for ex in 0..e {
                let w13e = &q.w13[ex * 2 * i_full * h..(ex + 1) * 2 * i_full * h];
                let s13e = &q.w13_scales[ex * 2 * i_full * g13..(ex + 1) * 2 * i_full * g13];
                for half in 0..2 {
                    let r = half * i_full + rows.start..half * i_full + rows.end;
                    w13.extend(block(w13e, h, r.clone(), 0..h));
                    s13.extend(block(s13e, g13, r, 0..g13));
                }
                let w2e = &q.w2[ex * h * i_full..(ex + 1) * h * i_full];
                w2.extend(block(w2e, i_full, 0..h, rows.clone()));
                let s2e = &q.w2_scales[ex * h * g2_full..(ex + 1) * h * g2_full];
                let cols = match q.group_size.group_size() {
                    Some(g) => rank * i / g..(rank + 1) * i / g,
                    None => 0..1,
                };
                s2.extend(block(s2e, g2_full, 0..h, cols));
            }
            assert_eq!(p.w13, w13, "rank {rank} w13");
            assert_eq!(p.w13_scales, s13, "rank {rank} w13 scales");
            assert_eq!(p.w2, w2, "rank {rank} w2");
            assert_eq!(p.w2_scales, s2, "rank {rank} w2 scales");
        }
    }
}

#[test]
fn expert_map_keeps_only_local_experts_in_local_order() {
    for dir in fixture_dirs() {
        let ckpt = open(&dir);
        let layer = ckpt.spec().moe_layers[0];
        let e = ckpt.spec().num_experts;
        let full = ckpt.read_layer(layer, &ReadOptions::single_rank()).unwrap();
        let q = int_experts(&full);
        // Round-robin rank 1 of 2, local ids assigned in reverse to check the ordering.
        let owned: Vec<usize> = (1..e).step_by(2).collect();
        let mut map = vec![-1i32; e];
        for (n, &g) in owned.iter().rev().enumerate() {
            map[g] = n as i32;
        }
        let opts = ReadOptions::single_rank().with_expert_map(Some(&map));
        let part = ckpt.read_layer(layer, &opts).unwrap();
        let want_order: Vec<usize> = owned.iter().rev().copied().collect();
        assert_eq!(part.local_experts, want_order);
        assert_eq!(part.experts.num_experts, owned.len());
        let p = int_experts(&part);
        let per13 = q.w13.len() / e;
        for (local, &global) in want_order.iter().enumerate() {
            assert_eq!(
                p.w13[local * per13..(local + 1) * per13],
                q.w13[global * per13..(global + 1) * per13]
            );
        }
        assert!(matches!(
            part.router.weight,
            FloatData::BF16(_) | FloatData::F16(_) | FloatData::F32(_)
        ));
        assert_eq!(part.router.weight.len(), e * full.experts.hidden);
    }
}
