//! The bodies of moe-rs's fuzz targets (checkpoint loader, config parser, packers, Marlin
//! repack), kept in a library so that the committed seeds and
//! regression inputs can be replayed by a plain `cargo test` (see `tests` below) as well as
//! fuzzed by libFuzzer through the thin `fuzz_targets/*.rs` entry points.
//!
//! Every function takes arbitrary bytes and must return normally: a typed error is fine, a
//! panic, an abort or an allocation beyond libFuzzer's `-rss_limit_mb` is a finding. Round
//! trips that must hold (pack then unpack) are asserted, so a silent corruption is a finding
//! too. A new target is a new function here, a two-line file in `fuzz_targets/`, a `[[bin]]`
//! in Cargo.toml and its name in xtask's `FUZZ_TARGETS`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use half::bf16;
use moe_kernels::{PackedW4A8, PackedW8A8, PanelOrder, W4A8Scales};
use moe_layer::checkpoint::{Checkpoint, MoeModelSpec, ReadOptions, ShardAccess};
use moe_layer::{MoeLayer, MoeLayerConfig};
use moe_router::Logits;

/// A model directory: `u16` little-endian length `n`, then `n` bytes of `config.json`, then the
/// bytes of `model.safetensors`. The directory is opened, every MoE layer (at most two) is read,
/// and, when that works, turned into a layer and applied to one token.
pub fn checkpoint_loader(data: &[u8]) {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let split = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    let (config, weights) = rest.split_at(split);
    let dir = scratch_dir();
    std::fs::write(dir.join("config.json"), config).expect("scratch dir is writable");
    std::fs::write(dir.join("model.safetensors"), weights).expect("scratch dir is writable");
    let Ok(ckpt) = Checkpoint::open(dir, ShardAccess::Read) else {
        return;
    };
    for &layer in ckpt.spec().moe_layers.iter().take(2) {
        if ckpt.read_layer(layer, &ReadOptions::single_rank()).is_err() {
            continue;
        }
        let Ok(moe) = MoeLayer::from_checkpoint(&ckpt, layer, 2) else {
            continue;
        };
        let h = moe.config().hidden;
        let x = vec![bf16::from_f32(0.5); h];
        if let Ok(logits) = moe.router_logits(&x) {
            let logits: Vec<bf16> = logits.into_iter().map(bf16::from_f32).collect();
            let mut out = vec![bf16::ZERO; h];
            let _ = moe.apply(&x, Logits::Bf16(&logits), &mut out);
        }
    }
}

/// A directory private to this process for the loader's files.
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("moe-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("cannot create the fuzz scratch directory");
        dir
    })
}

/// `config.json` text: the model config parser, the layer configuration derived from it, and
/// the compressed-tensors `quantization_config` parser and checks of moe-quant.
pub fn config_parser(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = MoeModelSpec::from_json_str(Path::new("config.json"), text) {
        let _ = MoeLayerConfig::from_spec(&spec, 0, 1, None, 4);
        let _ = MoeLayerConfig::from_spec(&spec, 1, 2, None, 4);
    }
    let _ = text.parse::<moe_quant::DType>();
    for parsed in [
        moe_quant::QuantizationConfig::from_json_str(text),
        moe_quant::QuantizationConfig::from_model_config_str(text),
    ] {
        let Ok(cfg) = parsed else { continue };
        let _ = cfg.validate();
        for scheme in cfg.config_groups.values() {
            let _ = scheme.validate();
            if let Some(w) = &scheme.weights {
                let _ = w.scale_dtype();
                let _ = w.zp_dtype();
                let _ = w.group_size_usize();
                let input = scheme.input_activations.as_ref();
                let _ = moe_quant::ct_args::is_dynamic_token_w4a8_int(w, input);
                let _ = moe_quant::ct_args::check_w4a8_int_moe(w, input);
            }
        }
    }
}

/// Reads little-endian numbers off the front of the input; missing bytes read as zero.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn i8s(&self) -> Vec<i8> {
        self.0.iter().map(|&b| b as i8).collect()
    }

    fn f32s(&self) -> Vec<f32> {
        self.0
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

/// The packers and quantizers on arbitrary shapes and data: the first byte picks the function,
/// the next few give its sizes, the rest is its data (codes are either raw bytes, mostly out of
/// range, or folded into the valid range so that packing succeeds and the round trip is checked).
pub fn packers(data: &[u8]) {
    let mut b = Bytes(data);
    let op = b.u8();
    let fold = op & 0x80 != 0;
    match op & 0x7F {
        0 => {
            let (rows, cols, bits) = (usize::from(b.u8()), usize::from(b.u16()), u32::from(b.u8()));
            let bits = bits % 10;
            let mut values = b.i8s();
            if fold && (1..=8).contains(&bits) {
                let span = 1i16 << bits;
                for v in &mut values {
                    *v = (i16::from(*v).rem_euclid(span) - span / 2) as i8;
                }
            }
            if let Ok(words) = moe_quant::pack_to_int32(&values, rows, cols, bits) {
                let back = moe_quant::unpack_from_int32(&words, rows, cols, bits)
                    .expect("unpacking what was packed");
                assert_eq!(back, values, "pack_to_int32 round trip");
            }
        }
        1 => {
            let (rows, cols, bits) = (b.u32() as usize, b.u32() as usize, u32::from(b.u8()));
            let words: Vec<i32> = b.f32s().iter().map(|f| f.to_bits() as i32).collect();
            if let Ok(codes) = moe_quant::unpack_from_int32(&words, rows, cols, bits) {
                assert_eq!(codes.len(), rows * cols);
            }
        }
        2 => {
            let (rows, cols) = (usize::from(b.u8()), usize::from(b.u16()));
            let mut values = b.i8s();
            if fold {
                values.iter_mut().for_each(|v| *v = (*v).rem_euclid(16) - 8);
            }
            if let Ok(bytes) = moe_quant::pack_int4_pairs(&values, rows, cols) {
                let back = moe_quant::unpack_int4_pairs(&bytes, rows, cols).expect("unpack");
                assert_eq!(back, values, "pack_int4_pairs round trip");
            }
        }
        3 => {
            let (rows, cols) = (b.u32() as usize, b.u32() as usize);
            let _ = moe_quant::unpack_int4_pairs(b.0, rows, cols);
        }
        4 => packed_w4a8(&mut b, fold),
        5 => {
            let (n, k) = (usize::from(b.u8()), b.u32() as usize);
            let mut w = b.i8s();
            let scales = vec![0.01f32; n];
            if fold {
                w.truncate(n.saturating_mul(k));
            }
            if let Ok(p) = PackedW8A8::pack(n, k, &w, &scales) {
                assert_eq!((p.n(), p.k()), (n, k));
                assert_eq!(p.unpack_int8(), w, "PackedW8A8 round trip");
                let pairs = p.with_order(PanelOrder::Pairs);
                assert_eq!(pairs.unpack_int8(), w, "PackedW8A8 pair-order round trip");
            }
        }
        6 => {
            let x = b.f32s();
            let mut q = vec![0i8; x.len()];
            let r = moe_quant::act::quantize_row_asym_i8(&x, &mut q);
            assert!(r.recip.is_finite() && (-128..=127).contains(&r.zero_point));
            let s = moe_quant::act::quantize_row_sym_i8(&x, &mut q);
            assert!(x.iter().any(|v| v.is_infinite()) || s.is_finite());
            let _ = moe_quant::act::try_quantize_row_asym_i8(&x, &mut q[..x.len() / 2]);
        }
        _ => {
            let (rows, g) = (usize::from(b.u8()), usize::from(b.u16()));
            let w = b.f32s();
            let cols = if rows == 0 { 0 } else { w.len() / rows };
            let group = (g != 0).then_some(g);
            if let Ok(q) = moe_quant::quantize_int4_grouped(&w, rows, cols, group) {
                let _ = moe_quant::dequantize_int4_grouped(&q.codes, &q.scales, rows, cols, group)
                    .expect("dequantizing what was quantized");
            }
            let _ = moe_quant::quantize_int8_per_row(&w, rows, cols);
        }
    }
}

/// The Marlin repack on arbitrary shapes, bit widths, permutations and words: whatever the
/// input, a typed error or a result; for codes packed by `pack_gptq` on a valid tile shape
/// (first byte even), `unpack(repack(w)) == w` is asserted.
pub fn marlin(data: &[u8]) {
    use moe_kernels::Par;
    use moe_kernels::marlin::{RepackSpec, pack_gptq, repack, unpack};
    let mut b = Bytes(data);
    let op = b.u8();
    let bits = if op & 2 == 0 { 4 } else { 8 };
    let is_a_8bit = op & 4 != 0;
    if op & 1 == 0 {
        // A valid shape: K a multiple of 32 (both tile heights, 8-bit packing), N of 64.
        let k = 32 * (usize::from(b.u8() % 4) + 1);
        let n = 64 * (usize::from(b.u8() % 3) + 1);
        let codes: Vec<u8> = (0..k * n)
            .map(|i| b.0.get(i % b.0.len().max(1)).copied().unwrap_or(0) & ((1 << bits) - 1) as u8)
            .collect();
        let words = pack_gptq(&codes, k, n, bits).expect("codes fit the bit width");
        let spec = RepackSpec {
            size_k: k,
            size_n: n,
            num_bits: bits,
            is_a_8bit,
        };
        let Ok(len) = spec.words() else { return };
        let mut out = vec![0u32; len];
        let pf = 32 / bits as usize;
        if repack(&words, [k / pf, n], &[], spec, &mut out, Par::Seq).is_ok() {
            let back = unpack(&out, spec, &[]).expect("unpacking what was repacked");
            assert_eq!(back, words, "Marlin repack round trip");
        }
    } else {
        // Arbitrary sizes, permutation and words: only typed errors are allowed.
        let (k, n) = (usize::from(b.u16()), usize::from(b.u16()));
        let perm_len = usize::from(b.u8());
        let perm: Vec<u32> = (0..perm_len).map(|_| u32::from(b.u8())).collect();
        let words: Vec<u32> = b.f32s().iter().map(|f| f.to_bits()).collect();
        let spec = RepackSpec {
            size_k: k,
            size_n: n,
            num_bits: bits,
            is_a_8bit,
        };
        let mut out = vec![0u32; words.len()];
        let _ = repack(&words, [k / 8, n], &perm, spec, &mut out, Par::Seq);
        let _ = unpack(&words, spec, &perm);
    }
}

fn packed_w4a8(b: &mut Bytes<'_>, fold: bool) {
    let (n, k, mode, g) = (
        usize::from(b.u8()),
        b.u32() as usize,
        b.u8(),
        usize::from(b.u16()),
    );
    let mut w = b.i8s();
    if fold {
        w.truncate(n.saturating_mul(k));
        w.iter_mut().for_each(|v| *v = (*v).rem_euclid(16) - 8);
    }
    let bias = (mode & 1 != 0).then(|| vec![0.25f32; n]);
    let channel = vec![0.01f32; n];
    let per_row = if g == 0 { 0 } else { k / g };
    let grouped = vec![bf16::from_f32(0.01); n.saturating_mul(per_row).min(1 << 20)];
    let scales = if mode & 2 != 0 {
        W4A8Scales::Grouped {
            group_size: g,
            scales: &grouped,
        }
    } else {
        W4A8Scales::Channelwise(&channel)
    };
    if let Ok(p) = PackedW4A8::pack(n, k, &w, scales, bias.as_deref()) {
        assert_eq!((p.n(), p.k()), (n, k));
        assert_eq!(p.unpack_int4(), w, "PackedW4A8 round trip");
        let pairs = p.clone().with_order(PanelOrder::Pairs);
        assert_eq!(pairs.unpack_int4(), w, "PackedW4A8 pair-order round trip");
        assert_eq!(pairs.with_order(PanelOrder::Lanes), p);
    }
}

#[cfg(test)]
mod tests {
    //! Replays every committed seed and regression input through its target.

    use std::path::Path;

    fn replay(target: &str, run: fn(&[u8])) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut count = 0;
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                run(&std::fs::read(&path).unwrap());
                count += 1;
            }
        }
        eprintln!("{target}: replayed {count} inputs");
    }

    #[test]
    fn checkpoint_loader_inputs() {
        replay("checkpoint_loader", super::checkpoint_loader);
    }

    #[test]
    fn config_parser_inputs() {
        replay("config_parser", super::config_parser);
    }

    #[test]
    fn marlin_inputs() {
        replay("marlin", super::marlin);
    }

    #[test]
    fn packers_inputs() {
        replay("packers", super::packers);
    }
}
