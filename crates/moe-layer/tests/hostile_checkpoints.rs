//! The hostile-checkpoint suite: well over a hundred generated malformed model directories
//! (bad `config.json`, broken safetensors headers, wrong shapes and dtypes, missing and extra
//! tensors, non-finite scales, out-of-range codes and group indices, configs that disagree with
//! the tensors, sizes that would overflow or exhaust memory) plus hostile calls on a loaded
//! layer. Each case must end in the typed [`LayerError`] variant it names, never in a panic and
//! never in an allocation larger than [`ALLOC_LIMIT`].
//!
//! Every case runs even when others fail; the test fails once at the end with the list of every
//! case that did not behave. A panic is caught with `catch_unwind` and reported as that case's
//! failure. Allocation sizes are watched by a counting global allocator (this test binary only):
//! the largest single request made by the case's thread is compared with the limit, which is
//! how "rejected before allocation" is checked for headers and configs that declare huge sizes.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use checkpoint_support::{
    Ckpt, Fmt, Fp8Store, Stored, Wna16Spec, Wna16Store, f32_bytes, i32_bytes,
};
use moe_layer::checkpoint::{Checkpoint, ReadOptions, ShardAccess};
use moe_layer::{LayerError, MoeLayer};
use moe_router::Logits;
use moe_testutil::SplitMix64;
use safetensors::Dtype;
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Allocation watch.

/// Largest single allocation any case may make. The checkpoints here are a few tens of KiB, so
/// anything near this means a size was taken from a header or config before it was checked.
const ALLOC_LIMIT: usize = 64 << 20;

thread_local! {
    /// Largest allocation request seen on this thread since the last reset.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|m| {
        if size > m.get() {
            m.set(size);
        }
    });
}

/// The system allocator, recording the largest request per thread.
struct Watching;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; recording a
// size touches only a const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static WATCH: Watching = Watching;

// ---------------------------------------------------------------------------------------------
// The valid base model the cases break.

/// Sizes of the base model: small, but runnable by the W4A8 kernels (group 32).
const E: usize = 4;
const H: usize = 64;
const I: usize = 32;
const G: usize = 32;
const EXPERTS: &str = "model.layers.0.mlp.experts";
const ROUTER: &str = "model.layers.0.mlp.gate.weight";
const PROJ: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// A one-layer Qwen3-MoE W4A8 checkpoint with group size `g` that loads, processes and runs.
fn w4a8_with_group(g: usize) -> Ckpt {
    checkpoint_support::runnable_w4a8(E, H, I, g, 0x4057)
}

fn w4a8() -> Ckpt {
    w4a8_with_group(G)
}

fn pack_quantized() -> Ckpt {
    Ckpt::build("qwen3_moe", Fmt::PackQuantized, 11).0
}

fn gptq() -> Ckpt {
    Ckpt::build("qwen3_moe", Fmt::Gptq, 12).0
}

fn deepseek() -> Ckpt {
    Ckpt::build("deepseek_v3", Fmt::IntQuantized, 13).0
}

/// A one-layer gpt-oss MXFP4 checkpoint (fused 3-D experts with biases, router with a bias)
/// with the hidden size of the call cases, so that it loads and runs on their tokens.
fn gpt_oss() -> Ckpt {
    let m = moe_testutil::gpt_oss::GptOss::random(0x6055, [E, 2, H, 32], 0.75);
    let mut ck = Ckpt {
        config: m.config(),
        tensors: Default::default(),
    };
    for (name, (dtype, shape, bytes)) in m.tensors() {
        ck.put(&name, dtype, &shape, bytes);
    }
    ck
}

/// Tensor name of expert `e`'s projection `p` (0 gate, 1 up, 2 down), tensor `what`.
fn t(e: usize, p: usize, what: &str) -> String {
    format!("{EXPERTS}.{e}.{}.{what}", PROJ[p])
}

fn stored<'a>(ck: &'a mut Ckpt, name: &str) -> &'a mut Stored {
    ck.tensors
        .get_mut(name)
        .unwrap_or_else(|| panic!("case setup: no tensor {name}"))
}

/// Overwrites element `index` of a bf16 tensor.
fn set_bf16(ck: &mut Ckpt, name: &str, index: usize, v: f32) {
    let b = half::bf16::from_f32(v).to_le_bytes();
    stored(ck, name).bytes[2 * index..2 * index + 2].copy_from_slice(&b);
}

/// Replaces a tensor by one of another dtype/shape filled with zero bytes.
fn retype(ck: &mut Ckpt, name: &str, dtype: Dtype, shape: &[usize]) {
    let n: usize = shape.iter().product::<usize>() * dtype.bitsize() / 8;
    ck.put(name, dtype, shape, vec![0; n]);
}

// ---------------------------------------------------------------------------------------------
// Byte-level helpers for safetensors files.

/// Splits a safetensors file into its header JSON and data section.
fn split_file(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header, bytes[8 + n..].to_vec())
}

/// Reassembles a file from a header and a data section.
fn join_file(header: &Value, data: &[u8]) -> Vec<u8> {
    let text = header.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(data);
    out
}

/// The name of the tensor stored last in the data section (largest end offset).
fn last_tensor(header: &Value) -> String {
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .max_by_key(|(_, v)| v["data_offsets"][1].as_u64().unwrap())
        .map(|(k, _)| k.clone())
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// How a case is driven once its directory is written.
#[derive(Clone, Copy)]
enum Via {
    /// `Checkpoint::open` (read) → `MoeLayer::from_checkpoint` → `apply` on 3 tokens.
    Layer,
    /// `Checkpoint::open` with the given access → `read_layer(0)`.
    Reader(ShardAccess),
    /// Load the (valid) base layer, then make this hostile call.
    Call(fn(&MoeLayer) -> Result<(), LayerError>),
}

/// What a case must produce.
enum Expect {
    /// Success (a control: the mutation is harmless).
    Ok,
    /// An error matching the named pattern.
    Err(&'static str, fn(&LayerError) -> bool),
}

macro_rules! err {
    ($p:pat) => {
        Expect::Err(stringify!($p), |e| matches!(e, $p))
    };
}

type Setup = Box<dyn Fn(&Path)>;

struct Case {
    name: String,
    via: Via,
    expect: Expect,
    setup: Setup,
}

/// Collects cases with small constructors for each kind of mutation.
#[derive(Default)]
struct Cases(Vec<Case>);

impl Cases {
    /// A mutation of the base's config or tensors, written normally.
    fn model(
        &mut self,
        name: &str,
        base: fn() -> Ckpt,
        via: Via,
        expect: Expect,
        edit: impl Fn(&mut Ckpt) + 'static,
    ) {
        self.0.push(Case {
            name: name.into(),
            via,
            expect,
            setup: Box::new(move |dir| {
                let mut ck = base();
                edit(&mut ck);
                ck.write(dir);
            }),
        });
    }

    /// A W4A8 mutation run through the whole layer.
    fn layer(&mut self, name: &str, expect: Expect, edit: impl Fn(&mut Ckpt) + 'static) {
        self.model(name, w4a8, Via::Layer, expect, edit);
    }

    /// A config mutation (JSON edit) run through the whole layer.
    fn config(&mut self, name: &str, expect: Expect, edit: impl Fn(&mut Value) + 'static) {
        self.layer(name, expect, move |ck| edit(&mut ck.config));
    }

    /// A mutation of the serialized `model.safetensors` bytes, read with `access`.
    fn bytes(
        &mut self,
        name: &str,
        access: ShardAccess,
        expect: Expect,
        edit: impl Fn(&mut Vec<u8>) + 'static,
    ) {
        let via = match access {
            ShardAccess::Mmap => Via::Reader(ShardAccess::Mmap),
            _ => Via::Layer,
        };
        self.0.push(Case {
            name: name.into(),
            via,
            expect,
            setup: Box::new(move |dir| {
                let ck = w4a8();
                ck.write(dir);
                let mut bytes = Ckpt::serialize(&ck.tensors);
                edit(&mut bytes);
                std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
            }),
        });
    }

    /// A header edit: the JSON header is parsed, changed and written back with the data.
    fn header(&mut self, name: &str, expect: Expect, edit: impl Fn(&mut Value) + 'static) {
        self.bytes(name, ShardAccess::Read, expect, move |bytes| {
            let (mut header, data) = split_file(bytes);
            edit(&mut header);
            *bytes = join_file(&header, &data);
        });
    }

    /// A directory edit after the base is written (sharded layouts, missing files).
    fn dir(&mut self, name: &str, via: Via, expect: Expect, edit: impl Fn(&Path) + 'static) {
        self.0.push(Case {
            name: name.into(),
            via,
            expect,
            setup: Box::new(move |dir| {
                w4a8().write(dir);
                edit(dir);
            }),
        });
    }

    /// A hostile call on the loaded base layer.
    fn call(&mut self, name: &str, expect: Expect, f: fn(&MoeLayer) -> Result<(), LayerError>) {
        self.0.push(Case {
            name: name.into(),
            via: Via::Call(f),
            expect,
            setup: Box::new(|dir| w4a8().write(dir)),
        });
    }
}

fn config_cases(c: &mut Cases) {
    c.dir(
        "config.json missing",
        Via::Layer,
        err!(LayerError::Io { .. }),
        |d| std::fs::remove_file(d.join("config.json")).unwrap(),
    );
    for (name, text) in [
        ("config.json empty", &b""[..]),
        (
            "config.json truncated JSON",
            b"{\"model_type\": \"qwen3_moe\"",
        ),
        ("config.json is an array", b"[1, 2, 3]"),
        ("config.json is a number", b"42"),
        (
            "config.json has a NUL",
            b"{\"model_type\": \"qwen3_moe\"\0}",
        ),
        ("config.json deeply nested", &[b'['; 100_000][..]),
    ] {
        c.dir(
            name,
            Via::Layer,
            err!(LayerError::JsonParse { .. }),
            move |d| std::fs::write(d.join("config.json"), text).unwrap(),
        );
    }
    c.dir(
        "config.json not UTF-8",
        Via::Layer,
        err!(LayerError::Io { .. }),
        |d| std::fs::write(d.join("config.json"), [0xff, 0xfe, b'{', b'}']).unwrap(),
    );
    c.config(
        "model_type unknown",
        err!(LayerError::UnsupportedModel { .. }),
        |v| {
            v["model_type"] = json!("llama");
            v["architectures"] = json!(["LlamaForCausalLM"]);
        },
    );
    c.config(
        "model_type and architectures absent",
        err!(LayerError::UnsupportedModel { .. }),
        |v| {
            v.as_object_mut().unwrap().remove("model_type");
            v.as_object_mut().unwrap().remove("architectures");
        },
    );
    c.config(
        "model_type is a number",
        err!(LayerError::JsonParse { .. }),
        |v| v["model_type"] = json!(3),
    );
    for field in [
        "hidden_size",
        "num_hidden_layers",
        "num_experts_per_tok",
        "moe_intermediate_size",
    ] {
        c.config(
            &format!("{field} missing"),
            err!(LayerError::ConfigField { .. }),
            move |v| {
                v.as_object_mut().unwrap().remove(field);
            },
        );
        c.config(
            &format!("{field} zero"),
            err!(LayerError::ConfigField { .. }),
            move |v| v[field] = json!(0),
        );
        c.config(
            &format!("{field} negative"),
            err!(LayerError::JsonParse { .. }),
            move |v| v[field] = json!(-1),
        );
        c.config(
            &format!("{field} fractional"),
            err!(LayerError::JsonParse { .. }),
            move |v| v[field] = json!(64.5),
        );
        c.config(
            &format!("{field} a string"),
            err!(LayerError::JsonParse { .. }),
            move |v| v[field] = json!("64"),
        );
        c.config(
            &format!("{field} beyond u64"),
            err!(LayerError::JsonParse { .. }),
            move |v| v[field] = serde_json::from_str("1e30").unwrap(),
        );
    }
    c.config(
        "num_experts zero",
        err!(LayerError::ConfigField { .. }),
        |v| v["num_experts"] = json!(0),
    );
    c.config(
        "num_experts_per_tok above num_experts",
        err!(LayerError::ConfigField { .. }),
        |v| v["num_experts_per_tok"] = json!(E + 1),
    );
    c.config(
        "num_hidden_layers absurd (2^60): no enumeration of layers",
        err!(LayerError::ConfigField { .. }),
        |v| v["num_hidden_layers"] = json!(1u64 << 60),
    );
    c.config(
        "decoder_sparse_step zero",
        err!(LayerError::ConfigField { .. }),
        |v| v["decoder_sparse_step"] = json!(0),
    );
    c.config(
        "decoder_sparse_step makes layer 0 dense",
        err!(LayerError::NotMoeLayer { .. }),
        |v| v["decoder_sparse_step"] = json!(2),
    );
    c.config(
        "mlp_only_layers makes layer 0 dense",
        err!(LayerError::NotMoeLayer { .. }),
        |v| v["mlp_only_layers"] = json!([0]),
    );
    c.config(
        "torch_dtype unknown",
        err!(LayerError::ConfigField { .. }),
        |v| v["torch_dtype"] = json!("float99"),
    );
    c.config(
        "hidden_act unsupported",
        err!(LayerError::ConfigField { .. }),
        |v| v["hidden_act"] = json!("relu"),
    );
    c.config(
        "norm_topk_prob a string",
        err!(LayerError::JsonParse { .. }),
        |v| v["norm_topk_prob"] = json!("yes"),
    );
    // Sizes that disagree with the tensors, including sizes whose products overflow: every one
    // must be caught on the tensors before anything is allocated from it.
    for (field, value, name) in [
        ("hidden_size", 32u64, "hidden_size smaller than the tensors"),
        ("hidden_size", 128, "hidden_size larger than the tensors"),
        ("hidden_size", 1 << 40, "hidden_size 2^40"),
        ("hidden_size", u64::MAX, "hidden_size u64::MAX"),
        ("moe_intermediate_size", 64, "moe_intermediate_size larger"),
        (
            "moe_intermediate_size",
            1 << 50,
            "moe_intermediate_size 2^50",
        ),
        ("num_experts", 8, "num_experts larger than the tensors"),
        ("num_experts", 1 << 60, "num_experts 2^60"),
        ("num_experts", u64::MAX, "num_experts u64::MAX"),
    ] {
        c.config(name, err!(LayerError::ConfigMismatch { .. }), move |v| {
            v[field] = json!(value);
            if field == "num_experts" {
                v["num_experts_per_tok"] = json!(2);
            }
        });
    }
    // Not a whole number of groups: refused before any tensor is compared.
    for (value, name) in [
        (16u64, "moe_intermediate_size smaller than one group"),
        (u64::MAX, "moe_intermediate_size u64::MAX"),
    ] {
        c.config(
            name,
            err!(LayerError::GroupSizeNotDividing { .. }),
            move |v| v["moe_intermediate_size"] = json!(value),
        );
    }
    c.config(
        "num_experts smaller than the tensors",
        err!(LayerError::ExtraExpert { .. }),
        |v| v["num_experts"] = json!(2),
    );
}

fn quant_config_cases(c: &mut Cases) {
    fn w(v: &mut Value) -> &mut Value {
        &mut v["quantization_config"]["config_groups"]["group_0"]["weights"]
    }
    fn qc(v: &mut Value) -> &mut Value {
        &mut v["quantization_config"]
    }
    c.config(
        "quant_method unknown",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| qc(v)["quant_method"] = json!("hqq"),
    );
    c.config(
        "quant_method absent",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| {
            qc(v).as_object_mut().unwrap().remove("quant_method");
        },
    );
    c.config(
        "quantization_config a string",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| v["quantization_config"] = json!("int4"),
    );
    c.config(
        "config_groups absent",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| {
            qc(v).as_object_mut().unwrap().remove("config_groups");
        },
    );
    c.config(
        "config_groups empty",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| qc(v)["config_groups"] = json!({}),
    );
    c.config(
        "group_size does not divide K",
        err!(LayerError::GroupSizeNotDividing { .. }),
        |v| w(v)["group_size"] = json!(24),
    );
    c.config(
        "group_size zero",
        err!(LayerError::QuantConfig { .. }),
        |v| w(v)["group_size"] = json!(0),
    );
    c.config(
        "group_size negative",
        err!(LayerError::JsonParse { .. } | LayerError::QuantConfig { .. }),
        |v| w(v)["group_size"] = json!(-32),
    );
    c.config(
        "group_size larger than K",
        err!(LayerError::GroupSizeNotDividing { .. }),
        |v| w(v)["group_size"] = json!(1 << 20),
    );
    c.config(
        "group_size disagrees with the scale tensors",
        err!(LayerError::WrongShape { .. }),
        |v| w(v)["group_size"] = json!(16),
    );
    c.config(
        "num_bits 3",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| w(v)["num_bits"] = json!(3),
    );
    c.config(
        "num_bits 200",
        err!(LayerError::UnsupportedScheme { .. } | LayerError::QuantConfig { .. }),
        |v| w(v)["num_bits"] = json!(200),
    );
    c.config(
        "asymmetric weights",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| w(v)["symmetric"] = json!(false),
    );
    c.config(
        "strategy tensor",
        err!(LayerError::UnsupportedScheme { .. } | LayerError::QuantConfig { .. }),
        |v| w(v)["strategy"] = json!("tensor"),
    );
    c.config(
        "strategy unknown",
        err!(LayerError::JsonParse { .. }),
        |v| w(v)["strategy"] = json!("diagonal"),
    );
    c.config(
        "weights type float",
        err!(LayerError::UnsupportedScheme { .. } | LayerError::QuantConfig { .. }),
        |v| w(v)["type"] = json!("float"),
    );
    c.config(
        "format unknown",
        err!(LayerError::UnsupportedScheme { .. }),
        |v| {
            qc(v)["format"] = json!("marlin-24");
            qc(v)["config_groups"]["group_0"]["format"] = json!("marlin-24");
        },
    );
    c.config(
        "static per-tensor activations",
        err!(LayerError::UnsupportedScheme { .. } | LayerError::QuantConfig { .. }),
        |v| {
            qc(v)["config_groups"]["group_0"]["input_activations"] =
                json!({"num_bits": 8, "type": "int", "symmetric": true,
                       "strategy": "tensor", "dynamic": false});
        },
    );
    // GPTQ and pack-quantized configs go through the reader (the layer runs W4A8 only).
    let gptq_cfg =
        |edit: fn(&mut Value)| move |ck: &mut Ckpt| edit(&mut ck.config["quantization_config"]);
    let reader = Via::Reader(ShardAccess::Read);
    c.model(
        "gptq bits 3",
        gptq,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        gptq_cfg(|q| q["bits"] = json!(3)),
    );
    c.model(
        "gptq bits absent",
        gptq,
        reader,
        err!(LayerError::JsonParse { .. }),
        gptq_cfg(|q| {
            q.as_object_mut().unwrap().remove("bits");
        }),
    );
    c.model(
        "gptq group_size -2",
        gptq,
        reader,
        err!(LayerError::ConfigField { .. }),
        gptq_cfg(|q| q["group_size"] = json!(-2)),
    );
    // Asymmetric GPTQ reads `qzeros` `[K/g, N/8]`; the base's are the v1 encoding of zero 8.
    c.model(
        "gptq asymmetric reads its qzeros",
        gptq,
        reader,
        Expect::Ok,
        gptq_cfg(|q| q["sym"] = json!(false)),
    );
    c.model(
        "gptq asymmetric qzeros of the wrong shape",
        gptq,
        reader,
        err!(LayerError::WrongShape { .. }),
        |ck| {
            ck.config["quantization_config"]["sym"] = json!(false);
            retype(ck, &t(0, 0, "qzeros"), Dtype::I32, &[H / G + 1, I / 8]);
        },
    );
    c.model(
        "gptq asymmetric qzeros of the wrong dtype",
        gptq,
        reader,
        err!(LayerError::WrongDtype { .. }),
        |ck| {
            ck.config["quantization_config"]["sym"] = json!(false);
            retype(ck, &t(1, 2, "qzeros"), Dtype::I64, &[I / G, H / 8]);
        },
    );
    c.model(
        "gptq asymmetric without qzeros",
        gptq,
        reader,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.config["quantization_config"]["sym"] = json!(false);
            ck.tensors.remove(&t(2, 1, "qzeros"));
        },
    );
    // AWQ packs along N (`qweight` `[K, N/8]`): GPTQ's K-packed tensors disagree with the config.
    // (The GPTQ base is built by the support module, with groups of 8.)
    c.model(
        "gptq tensors declared awq",
        gptq,
        reader,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| {
            ck.config["quantization_config"] = json!({"quant_method": "awq", "bits": 4,
                "group_size": 8, "zero_point": true, "version": "gemm"});
        },
    );
    c.model(
        "awq version gemv",
        gptq,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| {
            ck.config["quantization_config"] = json!({"quant_method": "awq", "bits": 4,
                "group_size": 8, "zero_point": true, "version": "gemv"});
        },
    );
    c.model(
        "awq group_size missing",
        gptq,
        reader,
        err!(LayerError::JsonParse { .. }),
        |ck| {
            ck.config["quantization_config"] = json!({"quant_method": "awq", "bits": 4});
        },
    );
    c.model(
        "gptq checkpoint_format unknown",
        gptq,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        gptq_cfg(|q| q["checkpoint_format"] = json!("marlin")),
    );
    c.model(
        "pack-quantized num_bits 2",
        pack_quantized,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        gptq_cfg(|q| q["config_groups"]["group_0"]["weights"]["num_bits"] = json!(2)),
    );
    // 4-bit WNA16 runs on the native kernels, which take any width Marlin's tiles refuse.
    c.model(
        "pack-quantized layer narrower than a Marlin tile",
        pack_quantized,
        Via::Layer,
        Expect::Ok,
        |_| {},
    );
    // DeepSeek routing fields.
    for (name, field, value) in [
        (
            "deepseek n_group does not divide experts",
            "n_group",
            json!(3),
        ),
        ("deepseek n_group zero", "n_group", json!(0)),
        ("deepseek topk_group above n_group", "topk_group", json!(5)),
        ("deepseek topk_group zero", "topk_group", json!(0)),
        (
            "deepseek routed_scaling_factor negative",
            "routed_scaling_factor",
            json!(-2.5),
        ),
        (
            "deepseek routed_scaling_factor zero",
            "routed_scaling_factor",
            json!(0.0),
        ),
        (
            "deepseek scoring_func unknown",
            "scoring_func",
            json!("tanh"),
        ),
    ] {
        c.model(
            name,
            deepseek,
            reader,
            err!(LayerError::ConfigField { .. }),
            move |ck| ck.config[field] = value.clone(),
        );
    }
}

fn safetensors_cases(c: &mut Cases) {
    use ShardAccess::{Mmap, Read};
    let invalid = || err!(LayerError::InvalidSafetensors { .. });
    c.dir(
        "model.safetensors missing",
        Via::Layer,
        err!(LayerError::NoWeights { .. }),
        |d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
    );
    c.bytes("file empty", Read, invalid(), |b| b.clear());
    c.bytes("file empty (mmap)", Mmap, invalid(), |b| b.clear());
    c.bytes("file of 7 bytes", Read, invalid(), |b| b.truncate(7));
    c.bytes("header length only", Read, invalid(), |b| b.truncate(8));
    for (name, len) in [
        ("header length u64::MAX", u64::MAX),
        ("header length 2^40", 1 << 40),
        ("header length 99 MB, beyond the file", 99_000_000),
        ("header length one past the file", 0),
        ("header length zero", 0),
    ] {
        c.bytes(name, Read, invalid(), move |b| {
            let len = if name.contains("one past") {
                b.len() as u64 - 8 + 1
            } else {
                len
            };
            b[..8].copy_from_slice(&len.to_le_bytes());
        });
    }
    c.bytes(
        "header length beyond the file (mmap)",
        Mmap,
        invalid(),
        |b| b[..8].copy_from_slice(&(1u64 << 33).to_le_bytes()),
    );
    c.bytes("header not UTF-8", Read, invalid(), |b| {
        b[8] = 0xff;
        b[9] = 0xfe;
    });
    c.bytes("header not JSON", Read, invalid(), |b| b[8] = b'#');
    c.bytes("header truncated by one byte", Read, invalid(), |b| {
        let n = u64::from_le_bytes(b[..8].try_into().unwrap());
        b[..8].copy_from_slice(&(n - 1).to_le_bytes());
    });
    c.bytes("data section truncated by one byte", Read, invalid(), |b| {
        b.pop();
    });
    c.bytes(
        "data section truncated by one byte (mmap)",
        Mmap,
        invalid(),
        |b| {
            b.pop();
        },
    );
    c.bytes("data section cut in half", Read, invalid(), |b| {
        b.truncate(b.len() / 2)
    });
    c.bytes("trailing garbage after the data", Read, invalid(), |b| {
        b.extend_from_slice(&[0xAB; 13])
    });
    c.header("header is a JSON array", invalid(), |h| *h = json!([1, 2]));
    c.header("header entry without dtype", invalid(), |h| {
        h[ROUTER].as_object_mut().unwrap().remove("dtype");
    });
    c.header("header dtype unknown", invalid(), |h| {
        h[ROUTER]["dtype"] = json!("Q4_K")
    });
    c.header("header shape negative", invalid(), |h| {
        h[ROUTER]["shape"] = json!([-4, 64])
    });
    c.header("header shape disagrees with offsets", invalid(), |h| {
        h[ROUTER]["shape"] = json!([E, H + 1])
    });
    c.header("header shape product overflows usize", invalid(), |h| {
        h[ROUTER]["shape"] = json!([1u64 << 40, 1u64 << 40])
    });
    c.header("header byte size overflows usize", invalid(), |h| {
        h[ROUTER]["shape"] = json!([1u64 << 62, 2])
    });
    c.header(
        "header shape huge but consistent offsets past the end",
        invalid(),
        |h| {
            let last = last_tensor(h);
            let start = h[&last]["data_offsets"][0].as_u64().unwrap();
            h[&last]["shape"] = json!([1u64 << 30, 1024]);
            h[&last]["dtype"] = json!("I8");
            h[&last]["data_offsets"] = json!([start, start + (1u64 << 40)]);
        },
    );
    c.header("offsets past the end", invalid(), |h| {
        let last = last_tensor(h);
        let end = h[&last]["data_offsets"][1].as_u64().unwrap();
        h[&last]["data_offsets"][1] = json!(end + 100);
    });
    c.header("offsets reversed", invalid(), |h| {
        let last = last_tensor(h);
        let (s, e) = (
            h[&last]["data_offsets"][0].clone(),
            h[&last]["data_offsets"][1].clone(),
        );
        h[&last]["data_offsets"] = json!([e, s]);
    });
    c.header("offsets overlapping", invalid(), |h| {
        h[ROUTER]["data_offsets"][0] = json!(1);
    });
    c.header("offsets negative", invalid(), |h| {
        h[ROUTER]["data_offsets"][0] = json!(-8);
    });
    c.header("offsets u64::MAX", invalid(), |h| {
        let last = last_tensor(h);
        h[&last]["data_offsets"][1] = json!(u64::MAX);
    });
    c.header("__metadata__ not a string map", invalid(), |h| {
        h["__metadata__"] = json!({"format": 3})
    });
    c.header("__metadata__ strings are harmless", Expect::Ok, |h| {
        h["__metadata__"] = json!({"format": "pt"})
    });
    // Sharded layouts.
    let sharded = |d: &Path| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap();
        w4a8().write_sharded(d, 2);
    };
    c.dir(
        "sharded: index not JSON",
        Via::Layer,
        err!(LayerError::JsonParse { .. }),
        move |d| {
            sharded(d);
            std::fs::write(d.join("model.safetensors.index.json"), "{weight_map").unwrap();
        },
    );
    c.dir(
        "sharded: index without weight_map",
        Via::Layer,
        err!(LayerError::JsonParse { .. }),
        move |d| {
            sharded(d);
            std::fs::write(d.join("model.safetensors.index.json"), "{}").unwrap();
        },
    );
    c.dir(
        "sharded: index points outside the directory",
        Via::Layer,
        err!(LayerError::JsonParse { .. }),
        move |d| {
            sharded(d);
            let index = json!({"weight_map": {ROUTER: "../model.safetensors"}});
            std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        },
    );
    c.dir(
        "sharded: index names an absolute path",
        Via::Layer,
        err!(LayerError::JsonParse { .. }),
        move |d| {
            sharded(d);
            let index = json!({"weight_map": {ROUTER: "/etc/passwd"}});
            std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        },
    );
    c.dir(
        "sharded: a shard file is missing",
        Via::Layer,
        err!(LayerError::Io { .. }),
        move |d| {
            sharded(d);
            std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
        },
    );
    c.dir(
        "sharded: a shard is truncated",
        Via::Layer,
        err!(LayerError::InvalidSafetensors { .. }),
        move |d| {
            sharded(d);
            let p = d.join("model-00001-of-00002.safetensors");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() - 3]).unwrap();
        },
    );
    c.dir(
        "sharded: the index lists a tensor its shard lacks",
        Via::Layer,
        err!(LayerError::MissingTensor { .. }),
        move |d| {
            sharded(d);
            let p = d.join("model.safetensors.index.json");
            let mut index: Value =
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let listed = index["weight_map"][ROUTER].as_str().unwrap().to_string();
            let other = if listed.contains("00001") {
                "model-00002-of-00002.safetensors"
            } else {
                "model-00001-of-00002.safetensors"
            };
            index["weight_map"][ROUTER] = json!(other);
            std::fs::write(&p, index.to_string()).unwrap();
        },
    );
}

fn tensor_cases(c: &mut Cases) {
    // Missing and extra tensors.
    c.layer(
        "router missing",
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors.remove(ROUTER);
        },
    );
    for (e, p, what) in [
        (0, 0, "weight"),
        (1, 1, "weight_scale"),
        (3, 2, "weight"),
        (2, 2, "weight_scale"),
    ] {
        c.layer(
            &format!("missing {}", t(e, p, what)),
            err!(LayerError::MissingTensor { .. }),
            move |ck| {
                ck.tensors.remove(&t(e, p, what));
            },
        );
    }
    c.layer(
        "an expert entirely missing",
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors
                .retain(|n, _| !n.starts_with(&format!("{EXPERTS}.2.")));
        },
    );
    for expert in [E, E + 1, 1_000_000] {
        c.layer(
            &format!("extra expert {expert}"),
            err!(LayerError::ExtraExpert { .. }),
            move |ck| {
                let copy = ck.tensors[&t(0, 0, "weight")].clone();
                ck.tensors
                    .insert(format!("{EXPERTS}.{expert}.gate_proj.weight"), copy);
            },
        );
    }
    c.layer("unrelated extra tensors are ignored", Expect::Ok, |ck| {
        ck.put(
            "model.embed_tokens.weight",
            Dtype::BF16,
            &[8, H],
            vec![0; 16 * H],
        );
        ck.put("lm_head.weight", Dtype::F32, &[0], vec![]);
    });
    c.layer(
        "expert index that is not a number is ignored",
        Expect::Ok,
        |ck| {
            ck.put(
                &format!("{EXPERTS}.99999999999999999999999.gate_proj.weight"),
                Dtype::I8,
                &[1],
                vec![0],
            );
        },
    );
    c.layer(
        "a bias on one projection only",
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.put(&t(1, 0, "bias"), Dtype::BF16, &[I], vec![0; 2 * I]);
        },
    );
    c.layer(
        "bias of the wrong length",
        err!(LayerError::WrongShape { .. }),
        |ck| {
            ck.put(
                &t(0, 0, "bias"),
                Dtype::BF16,
                &[I + 1],
                vec![0; 2 * (I + 1)],
            );
        },
    );
    c.layer("biases on every projection load", Expect::Ok, |ck| {
        for e in 0..E {
            for (p, n) in [(0, I), (1, I), (2, H)] {
                ck.put(&t(e, p, "bias"), Dtype::BF16, &[n], vec![0; 2 * n]);
            }
        }
    });
    c.layer(
        "a NaN expert bias",
        err!(LayerError::ParamValue { .. }),
        |ck| {
            for e in 0..E {
                for (p, n) in [(0, I), (1, I), (2, H)] {
                    let mut b = vec![0u8; 2 * n];
                    if (e, p) == (2, 2) {
                        b[6..8].copy_from_slice(&half::bf16::NAN.to_le_bytes());
                    }
                    ck.put(&t(e, p, "bias"), Dtype::BF16, &[n], b);
                }
            }
        },
    );
    // Router.
    c.layer(
        "router dtype i8",
        err!(LayerError::WrongDtype { .. }),
        |ck| retype(ck, ROUTER, Dtype::I8, &[E, H]),
    );
    c.layer("router 1-D", err!(LayerError::WrongShape { .. }), |ck| {
        retype(ck, ROUTER, Dtype::BF16, &[E * H])
    });
    c.layer("router 3-D", err!(LayerError::WrongShape { .. }), |ck| {
        retype(ck, ROUTER, Dtype::BF16, &[E, H, 1])
    });
    c.layer(
        "router transposed",
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, ROUTER, Dtype::BF16, &[H, E]),
    );
    c.layer(
        "router zero-size",
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, ROUTER, Dtype::BF16, &[0, H]),
    );
    for (name, v) in [
        ("router NaN", f32::NAN),
        ("router +Inf", f32::INFINITY),
        ("router -Inf", f32::NEG_INFINITY),
    ] {
        c.layer(name, err!(LayerError::NonFinite { .. }), move |ck| {
            set_bf16(ck, ROUTER, 77, v)
        });
    }
    // Weights.
    for (name, dtype) in [
        ("weight dtype bf16", Dtype::BF16),
        ("weight dtype u8", Dtype::U8),
        ("weight dtype i32", Dtype::I32),
        ("weight dtype bool", Dtype::BOOL),
    ] {
        c.layer(name, err!(LayerError::WrongDtype { .. }), move |ck| {
            retype(ck, &t(1, 2, "weight"), dtype, &[H, I])
        });
    }
    for (name, shape) in [
        ("gate weight transposed", vec![H, I]),
        ("gate weight zero rows", vec![0, H]),
        ("gate weight zero columns", vec![I, 0]),
        ("gate weight one row short", vec![I - 1, H]),
    ] {
        c.layer(name, err!(LayerError::ConfigMismatch { .. }), move |ck| {
            retype(ck, &t(2, 0, "weight"), Dtype::I8, &shape)
        });
    }
    for (name, shape) in [
        ("down weight 1-D", vec![H * I]),
        ("down weight 3-D", vec![H, I, 1]),
        ("down weight scalar", vec![]),
    ] {
        c.layer(name, err!(LayerError::WrongShape { .. }), move |ck| {
            retype(ck, &t(0, 2, "weight"), Dtype::I8, &shape)
        });
    }
    for (name, code) in [
        ("int4 code 8", 8i8),
        ("int4 code -9", -9),
        ("int4 code 127", 127),
        ("int4 code -128", -128),
    ] {
        c.layer(name, err!(LayerError::CodeOutOfRange { .. }), move |ck| {
            stored(ck, &t(3, 1, "weight")).bytes[123] = code as u8;
        });
    }
    // Scales.
    for (name, v) in [
        ("scale NaN", f32::NAN),
        ("scale +Inf", f32::INFINITY),
        ("scale -Inf", f32::NEG_INFINITY),
        ("scale negative", -0.01),
    ] {
        c.layer(name, err!(LayerError::BadScale { .. }), move |ck| {
            set_bf16(ck, &t(2, 2, "weight_scale"), 5, v)
        });
    }
    c.layer("scale zero is a valid (zero) weight", Expect::Ok, |ck| {
        set_bf16(ck, &t(2, 2, "weight_scale"), 5, 0.0)
    });
    c.layer(
        "scale dtype i8",
        err!(LayerError::WrongDtype { .. }),
        |ck| retype(ck, &t(0, 1, "weight_scale"), Dtype::I8, &[I, H / G]),
    );
    c.layer(
        "scale dtype f64",
        err!(LayerError::WrongDtype { .. }),
        |ck| retype(ck, &t(0, 1, "weight_scale"), Dtype::F64, &[I, H / G]),
    );
    c.layer(
        "scale dtypes differ between experts",
        err!(LayerError::WrongDtype { .. }),
        |ck| {
            let n = I * H / G;
            let f16: Vec<u8> = (0..n)
                .flat_map(|_| half::f16::from_f32(0.01).to_le_bytes())
                .collect();
            ck.put(&t(3, 0, "weight_scale"), Dtype::F16, &[I, H / G], f16);
        },
    );
    c.layer(
        "f32 group scale not exact in bf16 is rounded",
        Expect::Ok,
        |ck| {
            for e in 0..E {
                for (p, (n, k)) in [(I, H), (I, H), (H, I)].into_iter().enumerate() {
                    let s = vec![0.0123457f32; n * k / G];
                    ck.put(
                        &t(e, p, "weight_scale"),
                        Dtype::F32,
                        &[n, k / G],
                        f32_bytes(&s),
                    );
                }
            }
        },
    );
    c.layer(
        "f32 group scale that overflows bf16",
        err!(LayerError::ParamValue { .. }),
        |ck| {
            for e in 0..E {
                for (p, (n, k)) in [(I, H), (I, H), (H, I)].into_iter().enumerate() {
                    let s = vec![f32::MAX; n * k / G];
                    ck.put(
                        &t(e, p, "weight_scale"),
                        Dtype::F32,
                        &[n, k / G],
                        f32_bytes(&s),
                    );
                }
            }
        },
    );
    for (name, shape) in [
        ("scale channelwise shape for group weights", vec![I, 1]),
        ("scale transposed", vec![H / G, I]),
        ("scale 3-D", vec![I, H / G, 1]),
        ("scale zero-size", vec![I, 0]),
    ] {
        c.layer(name, err!(LayerError::WrongShape { .. }), move |ck| {
            retype(ck, &t(1, 0, "weight_scale"), Dtype::BF16, &shape)
        });
    }
    c.model(
        "group size 16 is refused by backend selection (kernels need multiples of 32)",
        || w4a8_with_group(16),
        Via::Layer,
        err!(LayerError::Oracle(_)),
        |_| {},
    );
}

fn format_cases(c: &mut Cases) {
    let reader = Via::Reader(ShardAccess::Read);
    let pp = "model.layers.0.mlp.experts.1.down_proj";
    c.model(
        "pack-quantized weight_shape missing",
        pack_quantized,
        reader,
        err!(LayerError::MissingTensor { .. }),
        move |ck| {
            ck.tensors.remove(&format!("{pp}.weight_shape"));
        },
    );
    for (name, dims) in [
        ("pack-quantized weight_shape disagrees", [16i64, 16]),
        ("pack-quantized weight_shape negative", [-16, 8]),
        ("pack-quantized weight_shape huge", [i64::MAX, i64::MAX]),
    ] {
        c.model(
            name,
            pack_quantized,
            reader,
            err!(LayerError::ConfigMismatch { .. }),
            move |ck| {
                let b = dims.iter().flat_map(|v| v.to_le_bytes()).collect();
                ck.put(&format!("{pp}.weight_shape"), Dtype::I64, &[2], b);
            },
        );
    }
    c.model(
        "pack-quantized weight_shape dtype f32",
        pack_quantized,
        reader,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, &format!("{pp}.weight_shape"), Dtype::F32, &[2]),
    );
    c.model(
        "pack-quantized weight_shape of 3 entries",
        pack_quantized,
        reader,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, &format!("{pp}.weight_shape"), Dtype::I64, &[3]),
    );
    c.model(
        "pack-quantized weight_packed dtype i64",
        pack_quantized,
        reader,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, &format!("{pp}.weight_packed"), Dtype::I64, &[16, 1]),
    );
    c.model(
        "pack-quantized weight_packed too few words",
        pack_quantized,
        reader,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, &format!("{pp}.weight_packed"), Dtype::I32, &[16, 0]),
    );
    c.model(
        "pack-quantized scale NaN",
        pack_quantized,
        reader,
        err!(LayerError::BadScale { .. }),
        move |ck| set_bf16(ck, &format!("{pp}.weight_scale"), 0, f32::NAN),
    );
    // Act-order pack-quantized: add g_idx everywhere, then break one.
    fn with_g_idx(ck: &mut Ckpt) {
        ck.config["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] =
            json!("group");
        for e in 0..4 {
            for (p, k) in PROJ.iter().zip([16usize, 16, 8]) {
                let g: Vec<i32> = (0..k).map(|kk| (kk / 8) as i32).collect();
                ck.put(
                    &format!("{EXPERTS}.{e}.{p}.weight_g_idx"),
                    Dtype::I32,
                    &[k],
                    i32_bytes(&g),
                );
            }
        }
    }
    c.model(
        "act-order control loads",
        pack_quantized,
        reader,
        Expect::Ok,
        with_g_idx,
    );
    for (name, v) in [
        ("act-order g_idx out of range", 2i32),
        ("act-order g_idx negative", -1),
        ("act-order g_idx i32::MAX", i32::MAX),
    ] {
        c.model(
            name,
            pack_quantized,
            reader,
            err!(LayerError::BadGroupIndex { .. }),
            move |ck| {
                with_g_idx(ck);
                let name = format!("{EXPERTS}.2.up_proj.weight_g_idx");
                stored(ck, &name).bytes[4..8].copy_from_slice(&v.to_le_bytes());
            },
        );
    }
    c.model(
        "act-order gate and up g_idx differ",
        pack_quantized,
        reader,
        err!(LayerError::BadGroupIndex { .. }),
        |ck| {
            with_g_idx(ck);
            let g: Vec<i32> = (0..16).map(|kk| (kk + 1) % 16 / 8).collect();
            ck.put(
                &format!("{EXPERTS}.0.up_proj.weight_g_idx"),
                Dtype::I32,
                &[16],
                i32_bytes(&g),
            );
        },
    );
    c.model(
        "act-order g_idx missing",
        pack_quantized,
        reader,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            with_g_idx(ck);
            ck.tensors
                .remove(&format!("{EXPERTS}.3.down_proj.weight_g_idx"));
        },
    );
    // GPTQ.
    let gp = "model.layers.0.mlp.experts.2.gate_proj";
    c.model(
        "gptq qweight rows disagree",
        gptq,
        reader,
        err!(LayerError::ConfigMismatch { .. }),
        move |ck| retype(ck, &format!("{gp}.qweight"), Dtype::I32, &[3, 8]),
    );
    c.model(
        "gptq qweight dtype u8",
        gptq,
        reader,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, &format!("{gp}.qweight"), Dtype::U8, &[2, 8]),
    );
    c.model(
        "gptq scales transposed the wrong way",
        gptq,
        reader,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, &format!("{gp}.scales"), Dtype::F16, &[8, 2]),
    );
    c.model(
        "gptq scale +Inf",
        gptq,
        reader,
        err!(LayerError::BadScale { .. }),
        move |ck| {
            let s = &mut stored(ck, &format!("{gp}.scales")).bytes;
            s[2..4].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        },
    );
    c.model(
        "gptq desc_act g_idx out of range",
        gptq,
        reader,
        err!(LayerError::BadGroupIndex { .. }),
        move |ck| {
            ck.config["quantization_config"]["desc_act"] = json!(true);
            stored(ck, &format!("{gp}.g_idx")).bytes[0..4].copy_from_slice(&7i32.to_le_bytes());
        },
    );
    c.model(
        "gptq hidden not a multiple of the pack factor",
        gptq,
        reader,
        err!(LayerError::ConfigMismatch { .. } | LayerError::ConfigField { .. }),
        |ck| ck.config["hidden_size"] = json!(12),
    );
    // DeepSeek-V3 correction bias.
    let bias = "model.layers.0.mlp.gate.e_score_correction_bias";
    c.model(
        "correction bias NaN",
        deepseek,
        reader,
        err!(LayerError::NonFinite { .. }),
        move |ck| {
            stored(ck, bias).bytes[0..4].copy_from_slice(&f32::NAN.to_le_bytes());
        },
    );
    c.model(
        "correction bias wrong length",
        deepseek,
        reader,
        err!(LayerError::ConfigMismatch { .. }),
        move |ck| retype(ck, bias, Dtype::F32, &[3]),
    );
    c.model(
        "correction bias missing",
        deepseek,
        reader,
        err!(LayerError::MissingTensor { .. }),
        move |ck| {
            ck.tensors.remove(bias);
        },
    );
}

/// Three tokens of hidden states for the call cases.
fn tokens() -> Vec<f32> {
    SplitMix64::new(5).vec_uniform(3 * H, -1.0, 1.0)
}

fn call_cases(c: &mut Cases) {
    fn with_topk(layer: &MoeLayer, ids: &[i32], weights: &[f32]) -> Result<(), LayerError> {
        let x = tokens();
        let mut out = vec![0f32; x.len()];
        layer.apply_with_topk(&x, ids, weights, &mut out)
    }
    c.call(
        "topk id equal to num_experts",
        err!(LayerError::Kernel(_)),
        |l| with_topk(l, &[0, 1, 2, E as i32, 1, 0], &[0.5; 6]),
    );
    c.call("topk id negative", err!(LayerError::Kernel(_)), |l| {
        with_topk(l, &[0, -1, 2, 3, 1, 0], &[0.5; 6])
    });
    c.call("topk id i32::MAX", err!(LayerError::Kernel(_)), |l| {
        with_topk(l, &[0, 1, 2, 3, i32::MAX, 0], &[0.5; 6])
    });
    c.call("topk id i32::MIN", err!(LayerError::Kernel(_)), |l| {
        with_topk(l, &[i32::MIN, 1, 2, 3, 1, 0], &[0.5; 6])
    });
    c.call(
        "topk weight NaN",
        err!(LayerError::NonFiniteInput { .. }),
        |l| with_topk(l, &[0, 1, 2, 3, 1, 0], &[0.5, 0.5, f32::NAN, 0.5, 0.5, 0.5]),
    );
    c.call(
        "topk ids too short",
        err!(LayerError::InvalidArgument { .. }),
        |l| with_topk(l, &[0, 1, 2], &[0.5; 3]),
    );
    c.call(
        "hidden state NaN",
        err!(LayerError::NonFiniteInput { .. }),
        |l| {
            let mut x = tokens();
            x[H + 3] = f32::NAN;
            let logits = vec![0.0f32; 3 * E];
            l.apply(&x, Logits::F32(&logits), &mut vec![0.0; x.len()])
        },
    );
    c.call(
        "hidden state -Inf (bf16)",
        err!(LayerError::NonFiniteInput { .. }),
        |l| {
            let mut x: Vec<half::bf16> =
                tokens().iter().map(|&v| half::bf16::from_f32(v)).collect();
            x[2 * H] = half::bf16::NEG_INFINITY;
            let logits = vec![half::bf16::ZERO; 3 * E];
            l.apply(
                &x,
                Logits::Bf16(&logits),
                &mut vec![half::bf16::ZERO; x.len()],
            )
        },
    );
    c.call("router logit NaN", err!(LayerError::Router(_)), |l| {
        let x = tokens();
        let mut logits = vec![0.0f32; 3 * E];
        logits[5] = f32::NAN;
        l.apply(&x, Logits::F32(&logits), &mut vec![0.0; x.len()])
    });
    c.call("router logit +Inf", err!(LayerError::Router(_)), |l| {
        let x = tokens();
        let mut logits = vec![0.0f32; 3 * E];
        logits[0] = f32::INFINITY;
        l.apply(&x, Logits::F32(&logits), &mut vec![0.0; x.len()])
    });
    c.call(
        "hidden states not whole rows",
        err!(LayerError::InvalidArgument { .. }),
        |l| {
            let x = vec![0.0f32; H + 1];
            l.apply(&x, Logits::F32(&[0.0; E]), &mut vec![0.0; x.len()])
        },
    );
    c.call(
        "router logits of the wrong length",
        err!(LayerError::InvalidArgument { .. }),
        |l| {
            let x = tokens();
            l.apply(&x, Logits::F32(&[0.0; 5]), &mut vec![0.0; x.len()])
        },
    );
    c.call(
        "output buffer of the wrong length",
        err!(LayerError::InvalidArgument { .. }),
        |l| {
            let x = tokens();
            l.apply(&x, Logits::F32(&[0.0; 3 * E]), &mut [0.0; 5])
        },
    );
}

fn all_cases() -> Vec<Case> {
    let mut c = Cases::default();
    c.layer(
        "control: the base checkpoint loads and runs",
        Expect::Ok,
        |_| {},
    );
    config_cases(&mut c);
    quant_config_cases(&mut c);
    safetensors_cases(&mut c);
    tensor_cases(&mut c);
    format_cases(&mut c);
    mxfp4_cases(&mut c);
    fp8_cases(&mut c);
    word_cases(&mut c);
    family_cases(&mut c);
    call_cases(&mut c);
    c.0
}

/// Llama 4 Scout's multimodal bf16 checkpoint at the suite's sizes: the wrapper's config, the
/// names under `language_model.`, each layer's experts fused and K-major.
fn llama4() -> Ckpt {
    Ckpt::build("llama4_text", Fmt::Float, 0x1a4)
        .0
        .fused_llama4_experts()
        .llama4_multimodal()
}

const FUSED: &str = "language_model.model.layers.0.feed_forward.experts";

/// The model families whose configs nest, whose experts are fused (Llama 4, gpt-oss in bf16),
/// or whose routing reads a bias from its own place.
fn family_cases(c: &mut Cases) {
    // The sizes of `Ckpt::build`, not this suite's W4A8 ones.
    use checkpoint_support::{H, I};
    let layer = Via::Layer;
    c.model("llama4: control", llama4, layer, Expect::Ok, |_| {});
    c.model(
        "llama4: fused gate_up_proj wider than 2·intermediate_size",
        llama4,
        layer,
        err!(LayerError::ConfigMismatch {
            field: "intermediate_size",
            ..
        }),
        |ck| {
            retype(
                ck,
                &format!("{FUSED}.gate_up_proj"),
                Dtype::BF16,
                &[E, H, 2 * I + 2],
            )
        },
    );
    c.model(
        "llama4: fused down_proj for one expert more",
        llama4,
        layer,
        err!(LayerError::ConfigMismatch {
            field: "num_local_experts",
            ..
        }),
        |ck| {
            retype(
                ck,
                &format!("{FUSED}.down_proj"),
                Dtype::BF16,
                &[E + 1, I, H],
            )
        },
    );
    c.model(
        "llama4: fused down_proj of rank 2",
        llama4,
        layer,
        err!(LayerError::WrongShape { .. }),
        |ck| retype(ck, &format!("{FUSED}.down_proj"), Dtype::BF16, &[E * I, H]),
    );
    c.model(
        "llama4: fused down_proj in f32 beside a bf16 gate_up_proj",
        llama4,
        layer,
        err!(LayerError::WrongDtype { .. }),
        |ck| retype(ck, &format!("{FUSED}.down_proj"), Dtype::F32, &[E, I, H]),
    );
    c.model(
        "llama4: fused down_proj missing",
        llama4,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors.remove(&format!("{FUSED}.down_proj"));
        },
    );
    c.model(
        "llama4: a NaN in the fused gate_up_proj",
        llama4,
        layer,
        err!(LayerError::ParamValue { .. }),
        |ck| set_bf16(ck, &format!("{FUSED}.gate_up_proj"), 37, f32::NAN),
    );
    c.model(
        "llama4: text_config not an object (its fields are missing)",
        llama4,
        layer,
        err!(LayerError::ConfigField { .. }),
        |ck| ck.config["text_config"] = "llama4_text".into(),
    );
    c.model(
        "llama4: interleave_moe_layer_step 0 (no MoE layer)",
        llama4,
        layer,
        err!(LayerError::NotMoeLayer { .. }),
        |ck| ck.config["text_config"]["interleave_moe_layer_step"] = 0.into(),
    );
    c.model(
        "llama4: moe_layers beyond num_hidden_layers",
        llama4,
        layer,
        err!(LayerError::ConfigField {
            field: "moe_layers",
            ..
        }),
        |ck| ck.config["text_config"]["moe_layers"] = serde_json::json!([0, 4]),
    );
    c.model(
        "llama4: a config of 2^40 experts over a router of 4",
        llama4,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| ck.config["text_config"]["num_local_experts"] = (1u64 << 40).into(),
    );
    fn glm4() -> Ckpt {
        Ckpt::build("glm4_moe", Fmt::Float, 0x614).0
    }
    c.model("glm4_moe: control", glm4, layer, Expect::Ok, |_| {});
    c.model(
        "glm4_moe: n_group that does not divide the experts",
        glm4,
        layer,
        err!(LayerError::ConfigField {
            field: "n_group",
            ..
        }),
        |ck| ck.config["n_group"] = 3.into(),
    );
    c.model(
        "glm4_moe: a NaN correction bias",
        glm4,
        layer,
        err!(LayerError::NonFinite { .. }),
        |ck| {
            let name = "model.layers.0.mlp.gate.e_score_correction_bias";
            stored(ck, name).bytes[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        },
    );
    fn minimax() -> Ckpt {
        Ckpt::build("minimax_m2", Fmt::Float, 0x3a3).0
    }
    c.model("minimax_m2: control", minimax, layer, Expect::Ok, |_| {});
    c.model(
        "minimax_m2: a correction bias of E + 1 values",
        minimax,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| {
            let name = "model.layers.0.block_sparse_moe.e_score_correction_bias";
            retype(ck, name, Dtype::F32, &[E + 1]);
        },
    );
    c.model(
        "minimax_m2: an unknown scoring_func",
        minimax,
        layer,
        err!(LayerError::ConfigField {
            field: "scoring_func",
            ..
        }),
        |ck| ck.config["scoring_func"] = "sqrt".into(),
    );
    fn ernie() -> Ckpt {
        Ckpt::build("ernie4_5_moe", Fmt::Float, 0xe45).0
    }
    const ERNIE_BIAS: &str = "model.layers.0.mlp.moe_statics.e_score_correction_bias";
    c.model("ernie4_5_moe: control", ernie, layer, Expect::Ok, |_| {});
    c.model(
        "ernie4_5_moe: a correction bias of two rows (ERNIE-4.5-VL's modalities)",
        ernie,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, ERNIE_BIAS, Dtype::F32, &[2, E]),
    );
    c.model(
        "ernie4_5_moe: the correction bias missing",
        ernie,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors.remove(ERNIE_BIAS);
        },
    );
    c.model(
        "ernie4_5_moe: moe_k a list per modality",
        ernie,
        layer,
        err!(LayerError::ConfigField { field: "moe_k", .. }),
        |ck| ck.config["moe_k"] = serde_json::json!([2, 2]),
    );
    fn phimoe() -> Ckpt {
        Ckpt::build("phimoe", Fmt::Float, 0x9e).0
    }
    c.model("phimoe: control", phimoe, layer, Expect::Ok, |_| {});
    c.model(
        "phimoe: three experts per token for the two-expert sparse mixer",
        phimoe,
        layer,
        err!(LayerError::ConfigField {
            field: "num_experts_per_tok",
            ..
        }),
        |ck| ck.config["num_experts_per_tok"] = 3.into(),
    );
    c.model(
        "phimoe: a negative router_jitter_noise",
        phimoe,
        layer,
        err!(LayerError::ConfigField {
            field: "router_jitter_noise",
            ..
        }),
        |ck| ck.config["router_jitter_noise"] = (-0.5).into(),
    );
    fn gpt_oss_bf16() -> Ckpt {
        Ckpt::gpt_oss_bf16(&moe_testutil::gpt_oss::GptOss::random(
            0x6b9,
            [4, 2, 64, 32],
            7.0,
        ))
    }
    const GPT_OSS: &str = "model.layers.0.mlp.experts";
    c.model(
        "gpt-oss bf16: control",
        gpt_oss_bf16,
        layer,
        Expect::Ok,
        |_| {},
    );
    c.model(
        "gpt-oss bf16: gate_up_proj_bias missing",
        gpt_oss_bf16,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors.remove(&format!("{GPT_OSS}.gate_up_proj_bias"));
        },
    );
    c.model(
        "gpt-oss bf16: a NaN down_proj_bias",
        gpt_oss_bf16,
        layer,
        err!(LayerError::NonFinite { .. }),
        |ck| set_bf16(ck, &format!("{GPT_OSS}.down_proj_bias"), 5, f32::NAN),
    );
    c.model(
        "gpt-oss bf16: gate_up_proj_bias one column short",
        gpt_oss_bf16,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| {
            retype(
                ck,
                &format!("{GPT_OSS}.gate_up_proj_bias"),
                Dtype::BF16,
                &[4, 63],
            )
        },
    );
    fn granite() -> Ckpt {
        let mut ck = Ckpt::build("mixtral", Fmt::Float, 0x64a).0;
        let bf16 = Dtype::BF16;
        let block = "model.layers.0.block_sparse_moe";
        let mut input = Vec::new();
        let mut output = Vec::new();
        for e in 0..E {
            let mut take = |w: &str| {
                let name = format!("{block}.experts.{e}.{w}.weight");
                ck.tensors.remove(&name).unwrap().bytes
            };
            input.extend(take("w1"));
            input.extend(take("w3"));
            output.extend(take("w2"));
        }
        ck.put(
            &format!("{block}.input_linear.weight"),
            bf16,
            &[E, 2 * I, H],
            input,
        );
        ck.put(
            &format!("{block}.output_linear.weight"),
            bf16,
            &[E, H, I],
            output,
        );
        let router = ck.tensors.remove(&format!("{block}.gate.weight")).unwrap();
        ck.tensors
            .insert(format!("{block}.router.layer.weight"), router);
        ck.config["model_type"] = "granitemoe".into();
        ck
    }
    c.model("granitemoe: control", granite, layer, Expect::Ok, |_| {});
    c.model(
        "granitemoe: input_linear for an intermediate size one wider",
        granite,
        layer,
        err!(LayerError::ConfigMismatch {
            field: "intermediate_size",
            ..
        }),
        |ck| {
            let name = "model.layers.0.block_sparse_moe.input_linear.weight";
            retype(ck, name, Dtype::BF16, &[E, 2 * I + 2, H]);
        },
    );
    c.model(
        "granitemoe: quantized experts",
        granite,
        layer,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| {
            ck.config["quantization_config"] =
                serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": 8});
        },
    );
    fn qwen3_next() -> Ckpt {
        Ckpt::build("qwen3_next", Fmt::Float, 0x3e7).0
    }
    c.model("qwen3_next: control", qwen3_next, layer, Expect::Ok, |_| {});
    c.model(
        "qwen3_next: the shared expert gate missing",
        qwen3_next,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors
                .remove("model.layers.0.mlp.shared_expert_gate.weight");
        },
    );
}

fn wna16_base(store: Wna16Store, bits: u32, act_order: bool) -> Ckpt {
    checkpoint_support::wna16(
        &Wna16Spec {
            store,
            bits,
            group: Some(G),
            act_order,
            asym: false,
            shape: [E, 2, H, I],
        },
        0x40d5,
    )
}

fn awq() -> Ckpt {
    wna16_base(Wna16Store::Awq, 4, false)
}

fn gptq_act_order() -> Ckpt {
    wna16_base(Wna16Store::Gptq, 4, true)
}

fn gptq_int8() -> Ckpt {
    wna16_base(Wna16Store::Gptq, 8, false)
}

fn pack_quantized_int8_act_order() -> Ckpt {
    wna16_base(Wna16Store::PackQuantized, 8, true)
}

/// The formats a layer packs from their stored words (AWQ, act-order, 8-bit codes) through the
/// whole layer: each base loads and runs, and each break is the typed error of the whole-layer
/// read, whichever road met it first.
fn word_cases(c: &mut Cases) {
    let layer = Via::Layer;
    for (name, base) in [
        ("awq", awq as fn() -> Ckpt),
        ("gptq act-order", gptq_act_order),
        ("gptq int8", gptq_int8),
        (
            "pack-quantized int8 act-order",
            pack_quantized_int8_act_order,
        ),
    ] {
        c.model(
            &format!("control: {name} loads and runs"),
            base,
            layer,
            Expect::Ok,
            |_| {},
        );
    }
    c.model(
        "awq qweight one row short",
        awq,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, &t(2, 1, "qweight"), Dtype::I32, &[H - 1, I / 8]),
    );
    c.model(
        "awq qweight dtype i64",
        awq,
        layer,
        err!(LayerError::WrongDtype { .. }),
        |ck| retype(ck, &t(0, 2, "qweight"), Dtype::I64, &[I, H / 8]),
    );
    c.model(
        "awq qzeros of the wrong shape",
        awq,
        layer,
        err!(LayerError::WrongShape { .. }),
        |ck| retype(ck, &t(1, 0, "qzeros"), Dtype::I32, &[H / G + 1, I / 8]),
    );
    c.model(
        "awq scale infinite",
        awq,
        layer,
        err!(LayerError::BadScale { .. }),
        |ck| {
            let b = half::f16::INFINITY.to_le_bytes();
            stored(ck, &t(3, 2, "scales")).bytes[..2].copy_from_slice(&b);
        },
    );
    // f32 scales: kept as stored by the WNA16 kernels, so values 16 bits cannot hold load and
    // run; values beyond bf16's range are refused, since int8 activations would round them
    // to bf16 on the W4A8 kernels.
    fn scales_f32(ck: &mut Ckpt, value: f32) {
        for t in ck.tensors.values_mut().filter(|t| t.dtype == Dtype::F16) {
            let n = t.bytes.len() / 2;
            (t.dtype, t.bytes) = (Dtype::F32, f32_bytes(&vec![value; n]));
        }
    }
    for (name, base) in [
        ("awq", awq as fn() -> Ckpt),
        ("gptq act-order", gptq_act_order),
        ("gptq int8", gptq_int8),
    ] {
        c.model(
            &format!("{name} f32 scales that 16 bits cannot hold load and run"),
            base,
            layer,
            Expect::Ok,
            |ck| scales_f32(ck, 0.0123457),
        );
        c.model(
            &format!("{name} f32 scales beyond bf16's range"),
            base,
            layer,
            err!(LayerError::ParamValue { .. }),
            |ck| scales_f32(ck, f32::MAX),
        );
    }
    c.model(
        "gptq act-order g_idx entry past the groups",
        gptq_act_order,
        layer,
        err!(LayerError::BadGroupIndex { .. }),
        |ck| stored(ck, &t(1, 2, "g_idx")).bytes[..4].copy_from_slice(&7i32.to_le_bytes()),
    );
    c.model(
        "gptq act-order groups of uneven size",
        gptq_act_order,
        layer,
        err!(LayerError::ParamValue { .. }),
        |ck| {
            // Gate and up alike (they must agree), all of K in the first group.
            for p in [0, 1] {
                ck.put(&t(2, p, "g_idx"), Dtype::I32, &[H], i32_bytes(&[0; H]));
            }
        },
    );
    c.model(
        "gptq act-order up g_idx differs from gate",
        gptq_act_order,
        layer,
        err!(LayerError::BadGroupIndex { .. }),
        |ck| {
            let g: Vec<i32> = (0..H).map(|k| ((H - 1 - k) / G) as i32).collect();
            ck.put(&t(0, 1, "g_idx"), Dtype::I32, &[H], i32_bytes(&g));
        },
    );
    c.model(
        "gptq act-order g_idx missing",
        gptq_act_order,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.tensors.remove(&t(3, 0, "g_idx"));
        },
    );
    c.model(
        "gptq int8 qweight packed as int4",
        gptq_int8,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, &t(1, 0, "qweight"), Dtype::I32, &[H / 8, I]),
    );
    c.model(
        "pack-quantized int8 weight_packed of int4 width",
        pack_quantized_int8_act_order,
        layer,
        err!(LayerError::WrongShape { .. }),
        |ck| retype(ck, &t(2, 2, "weight_packed"), Dtype::I32, &[H, I / 8]),
    );
    c.model(
        "pack-quantized int8 weight_g_idx negative",
        pack_quantized_int8_act_order,
        layer,
        err!(LayerError::BadGroupIndex { .. }),
        |ck| {
            stored(ck, &t(0, 0, "weight_g_idx")).bytes[4..8].copy_from_slice(&(-1i32).to_le_bytes())
        },
    );
}

/// gpt-oss MXFP4: every fused expert tensor and the router bias missing, mistyped, misshapen
/// or holding a value the format cannot mean, and configs the loader must refuse.
fn mxfp4_cases(c: &mut Cases) {
    let layer = Via::Layer;
    let reader = Via::Reader(ShardAccess::Read);
    let x = |t: &str| format!("{EXPERTS}.{t}");
    c.model(
        "gpt-oss control: the MXFP4 checkpoint loads and runs",
        gpt_oss,
        layer,
        Expect::Ok,
        |_| {},
    );
    for t in [
        "gate_up_proj_blocks",
        "gate_up_proj_scales",
        "gate_up_proj_bias",
        "down_proj_blocks",
        "down_proj_scales",
        "down_proj_bias",
    ] {
        let name = x(t);
        c.model(
            &format!("gpt-oss {t} missing"),
            gpt_oss,
            reader,
            err!(LayerError::MissingTensor { .. }),
            move |ck| {
                ck.tensors.remove(&name);
            },
        );
    }
    for name in ["router.weight", "router.bias"] {
        let name = format!("model.layers.0.mlp.{name}");
        c.model(
            &format!("gpt-oss {name} missing"),
            gpt_oss,
            reader,
            err!(LayerError::MissingTensor { .. }),
            move |ck| {
                ck.tensors.remove(&name);
            },
        );
    }
    let blocks = x("gate_up_proj_blocks");
    let b = blocks.clone();
    c.model(
        "gpt-oss blocks stored as i32",
        gpt_oss,
        reader,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, &b, Dtype::I32, &[E, 64, 2, 4]),
    );
    let b = blocks.clone();
    c.model(
        "gpt-oss blocks of 8 bytes",
        gpt_oss,
        reader,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, &b, Dtype::U8, &[E, 64, 2, 8]),
    );
    let b = blocks.clone();
    c.model(
        "gpt-oss blocks for fewer experts than the config",
        gpt_oss,
        reader,
        err!(LayerError::ConfigMismatch {
            field: "num_local_experts",
            ..
        }),
        move |ck| retype(ck, &b, Dtype::U8, &[E - 1, 64, 2, 16]),
    );
    let b = x("down_proj_blocks");
    c.model(
        "gpt-oss down blocks for another hidden size",
        gpt_oss,
        reader,
        err!(LayerError::ConfigMismatch {
            field: "hidden_size",
            ..
        }),
        move |ck| retype(ck, &b, Dtype::U8, &[E, H + 1, 1, 16]),
    );
    let s = x("down_proj_scales");
    c.model(
        "gpt-oss down scales with two blocks per row",
        gpt_oss,
        reader,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, &s, Dtype::U8, &[E, H, 2]),
    );
    let s = x("gate_up_proj_scales");
    c.model(
        "gpt-oss e8m0 scale 255 (NaN)",
        gpt_oss,
        reader,
        err!(LayerError::BadScale { index: 5, .. }),
        move |ck| stored(ck, &s).bytes[5] = 255,
    );
    let s = x("down_proj_scales");
    c.model(
        "gpt-oss e8m0 scales 0 and 254 are values",
        gpt_oss,
        layer,
        Expect::Ok,
        move |ck| {
            stored(ck, &s).bytes[0] = 0;
            stored(ck, &s).bytes[1] = 254;
        },
    );
    let bias = x("gate_up_proj_bias");
    c.model(
        "gpt-oss NaN expert bias",
        gpt_oss,
        reader,
        err!(LayerError::NonFinite { index: 3, .. }),
        move |ck| set_bf16(ck, &bias, 3, f32::NAN),
    );
    let bias = x("down_proj_bias");
    c.model(
        "gpt-oss down bias [E, H + 1]",
        gpt_oss,
        reader,
        err!(LayerError::ConfigMismatch { .. }),
        move |ck| retype(ck, &bias, Dtype::BF16, &[E, H + 1]),
    );
    c.model(
        "gpt-oss router bias [E + 1]",
        gpt_oss,
        reader,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| retype(ck, "model.layers.0.mlp.router.bias", Dtype::BF16, &[E + 1]),
    );
    c.model(
        "gpt-oss infinite router bias",
        gpt_oss,
        reader,
        err!(LayerError::NonFinite { .. }),
        |ck| set_bf16(ck, "model.layers.0.mlp.router.bias", 1, f32::INFINITY),
    );
    c.model(
        "gpt-oss swiglu_limit negative",
        gpt_oss,
        reader,
        err!(LayerError::ConfigField {
            field: "swiglu_limit",
            ..
        }),
        |ck| ck.config["swiglu_limit"] = serde_json::json!(-7.0),
    );
    c.model(
        "gpt-oss experts listed in modules_to_not_convert",
        gpt_oss,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| {
            ck.config["quantization_config"]["modules_to_not_convert"] =
                serde_json::json!(["model.layers.*.mlp.experts"]);
        },
    );
    c.model(
        "gpt-oss without a quantization_config (MXFP4 tensors under a bf16 config)",
        gpt_oss,
        reader,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            ck.config
                .as_object_mut()
                .unwrap()
                .remove("quantization_config");
        },
    );
    c.model(
        "gpt-oss top-k from experts_per_token only",
        gpt_oss,
        layer,
        Expect::Ok,
        |ck| {
            ck.config
                .as_object_mut()
                .unwrap()
                .remove("num_experts_per_tok");
        },
    );
    c.model(
        "mxfp4 quant_method on a qwen3_moe config",
        w4a8,
        reader,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| ck.config["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"}),
    );
}

// ---------------------------------------------------------------------------------------------
// Running.

/// Drives one case's directory; panics only if the library does.
fn drive(dir: &Path, via: Via) -> Result<(), LayerError> {
    match via {
        Via::Reader(access) => {
            let ckpt = Checkpoint::open(dir, access)?;
            ckpt.read_layer(0, &ReadOptions::single_rank()).map(|_| ())
        }
        Via::Layer | Via::Call(_) => {
            let ckpt = Checkpoint::open(dir, ShardAccess::Read)?;
            let layer = MoeLayer::from_checkpoint(&ckpt, 0, 4)?;
            if let Via::Call(f) = via {
                return f(&layer);
            }
            let x = tokens();
            let logits = layer.router_logits(&x)?;
            let mut out = vec![0f32; x.len()];
            layer.apply(&x, Logits::F32(&logits), &mut out)?;
            assert!(
                out.iter().all(|v| v.is_finite()),
                "non-finite output from a checkpoint that loaded"
            );
            Ok(())
        }
    }
}

#[test]
fn hostile_checkpoints_give_typed_errors() {
    // The watch itself works: a request above the limit is seen.
    LARGEST.with(|m| m.set(0));
    drop(std::hint::black_box(Vec::<u8>::with_capacity(
        ALLOC_LIMIT + 1,
    )));
    assert!(
        LARGEST.with(|m| m.get()) > ALLOC_LIMIT,
        "allocation watch inactive"
    );
    let cases = all_cases();
    let root = checkpoint_support::temp_dir("hostile");
    let mut names = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for (n, case) in cases.iter().enumerate() {
        assert!(
            names.insert(case.name.clone()),
            "duplicate case {}",
            case.name
        );
        let dir = root.join(format!("case-{n:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        (case.setup)(&dir);
        LARGEST.with(|m| m.set(0));
        let outcome = catch_unwind(AssertUnwindSafe(|| drive(&dir, case.via)));
        let largest = LARGEST.with(|m| m.get());
        let problem = match (&outcome, &case.expect) {
            (Err(panic), _) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Some(format!("panicked: {msg}"))
            }
            (Ok(Ok(())), Expect::Ok) => None,
            (Ok(Ok(())), Expect::Err(want, _)) => Some(format!("loaded, expected {want}")),
            (Ok(Err(e)), Expect::Ok) => Some(format!("expected success, got {e:?}")),
            (Ok(Err(e)), Expect::Err(want, ok)) => {
                (!ok(e)).then(|| format!("expected {want}, got {e:?}"))
            }
        };
        let problem = problem.or_else(|| {
            (largest > ALLOC_LIMIT).then(|| format!("allocated {largest} bytes in one request"))
        });
        if let Some(p) = problem {
            failures.push(format!("{}: {p}", case.name));
        }
    }
    std::panic::set_hook(quiet);
    let _ = std::fs::remove_dir_all(&root);
    eprintln!("{} hostile cases, {} failed", cases.len(), failures.len());
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{} of {} cases misbehaved:\n  {}",
        failures.len(),
        cases.len(),
        failures.join("\n  ")
    );
}

/// An FP8 block-quantized checkpoint of the suite's sizes (every block short).
fn fp8() -> Ckpt {
    checkpoint_support::fp8_block("qwen3_moe", [E, 2, H, I], 0xf8).0
}

/// FP8 block checkpoints: wrong dtypes and shapes, NaN codes, bad scales, missing tensors,
/// expert biases, configs that disagree, and the whole-layer reader, each named.
fn fp8_cases(c: &mut Cases) {
    let layer = Via::Layer;
    let w = "model.layers.0.mlp.experts.2.up_proj.weight";
    let s = "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv";
    c.model(
        "fp8 control: loads and runs",
        fp8,
        layer,
        Expect::Ok,
        |_| {},
    );
    c.model(
        "fp8 weight stored as bf16",
        fp8,
        layer,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, w, Dtype::BF16, &[I, H]),
    );
    c.model(
        "fp8 weight stored as e5m2",
        fp8,
        layer,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, w, Dtype::F8_E5M2, &[I, H]),
    );
    c.model(
        "fp8 weight_scale_inv stored as i32",
        fp8,
        layer,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, s, Dtype::I32, &[1, 1]),
    );
    c.model(
        "fp8 weight_scale_inv of the wrong block grid",
        fp8,
        layer,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, s, Dtype::F32, &[2, 1]),
    );
    c.model(
        "fp8 weight disagrees with hidden_size",
        fp8,
        layer,
        err!(LayerError::ConfigMismatch {
            field: "hidden_size",
            ..
        }),
        move |ck| retype(ck, w, Dtype::F8_E4M3, &[I, H + 4]),
    );
    for (name, byte) in [("fp8 NaN code 0x7f", 0x7F), ("fp8 NaN code 0xff", 0xFF)] {
        c.model(
            name,
            fp8,
            layer,
            err!(LayerError::NonFinite { index: 77, .. }),
            move |ck| stored(ck, w).bytes[77] = byte,
        );
    }
    for (name, v) in [
        ("fp8 negative block scale", -1.0f32),
        ("fp8 infinite block scale", f32::INFINITY),
        ("fp8 NaN block scale", f32::NAN),
    ] {
        c.model(
            name,
            fp8,
            layer,
            err!(LayerError::BadScale { index: 0, .. }),
            move |ck| stored(ck, s).bytes[..4].copy_from_slice(&v.to_le_bytes()),
        );
    }
    for (name, gone) in [
        ("fp8 weight_scale_inv missing", s.to_string()),
        ("fp8 weight missing", w.to_string()),
    ] {
        c.model(
            name,
            fp8,
            layer,
            err!(LayerError::MissingTensor { .. }),
            move |ck| {
                ck.tensors.remove(&gone);
            },
        );
    }
    c.model(
        "fp8 expert bias",
        fp8,
        layer,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| {
            let b = "model.layers.0.mlp.experts.0.gate_proj.bias";
            ck.put(b, Dtype::F32, &[I], f32_bytes(&[0.0; I]));
        },
    );
    c.model(
        "fp8 blocks of 128 x 64",
        fp8,
        layer,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| ck.config["quantization_config"]["weight_block_size"] = json!([128, 64]),
    );
    c.model(
        "fp8 huge moe_intermediate_size",
        fp8,
        layer,
        err!(LayerError::ConfigMismatch { .. }),
        |ck| ck.config["moe_intermediate_size"] = json!(1u64 << 40),
    );
    c.model(
        "fp8 through the whole-layer reader",
        fp8,
        Via::Reader(ShardAccess::Read),
        err!(LayerError::UnsupportedScheme { .. }),
        |_| {},
    );
    fp8_scale_cases(c);
    w8a8_cases(c);
}

/// A compressed-tensors int8 W8A8 checkpoint (channel scales `[n, 1]` in bf16).
fn w8a8() -> Ckpt {
    checkpoint_support::w8a8_int([E, 2, H, I], 0x88).0
}

/// Int8 W8A8: wrong dtypes and shapes, bad scales, missing tensors, configs vLLM's int8 MoE
/// method refuses, each named.
fn w8a8_cases(c: &mut Cases) {
    let layer = Via::Layer;
    let w = "model.layers.0.mlp.experts.1.down_proj.weight";
    let s = "model.layers.0.mlp.experts.2.gate_proj.weight_scale";
    c.model("w8a8 control", w8a8, layer, Expect::Ok, |_| {});
    c.model(
        "w8a8 weight stored as i32",
        w8a8,
        layer,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, w, Dtype::I32, &[H, I]),
    );
    c.model(
        "w8a8 scales of two columns",
        w8a8,
        layer,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, s, Dtype::BF16, &[I, 2]),
    );
    c.model(
        "w8a8 negative scale",
        w8a8,
        layer,
        err!(LayerError::BadScale { index: 3, .. }),
        move |ck| set_bf16(ck, s, 3, -1.0),
    );
    c.model(
        "w8a8 scale missing",
        w8a8,
        layer,
        err!(LayerError::MissingTensor { .. }),
        move |ck| {
            ck.tensors.remove(s);
        },
    );
    c.model(
        "w8a8 group scales",
        w8a8,
        layer,
        err!(LayerError::UnsupportedScheme { .. }),
        |ck| {
            let wq = &mut ck.config["quantization_config"]["config_groups"]["group_0"]["weights"];
            wq["strategy"] = json!("group");
            wq["group_size"] = json!(16);
        },
    );
}

/// A compressed-tensors FP8 checkpoint with bf16 channel scales `[n, 1]`.
fn fp8_channels() -> Ckpt {
    checkpoint_support::fp8("qwen3_moe", [E, 2, H, I], 0xf9, Fp8Store::CtChannels).0
}

/// An AutoFP8 Mixtral checkpoint with per-tensor scales `[]` and static `input_scale`s.
fn fp8_tensor() -> Ckpt {
    checkpoint_support::fp8("mixtral", [E, 2, H, I], 0xfa, Fp8Store::TensorStatic).0
}

/// FP8 channel and tensor scales: wrong dtypes and shapes, bad values, missing tensors, a
/// block layout named by a config without blocks, each named.
fn fp8_scale_cases(c: &mut Cases) {
    let layer = Via::Layer;
    let cs = "model.layers.0.mlp.experts.1.gate_proj.weight_scale";
    let ts = "model.layers.0.block_sparse_moe.experts.3.w2.weight_scale";
    c.model(
        "fp8 channel control",
        fp8_channels,
        layer,
        Expect::Ok,
        |_| {},
    );
    c.model("fp8 tensor control", fp8_tensor, layer, Expect::Ok, |_| {});
    c.model(
        "fp8 channel scales stored as i32",
        fp8_channels,
        layer,
        err!(LayerError::WrongDtype { .. }),
        move |ck| retype(ck, cs, Dtype::I32, &[I, 1]),
    );
    c.model(
        "fp8 channel scales of another width",
        fp8_channels,
        layer,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, cs, Dtype::BF16, &[I, 2]),
    );
    c.model(
        "fp8 channel scales for another channel count",
        fp8_channels,
        layer,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, cs, Dtype::BF16, &[I + 1]),
    );
    c.model(
        "fp8 negative channel scale",
        fp8_channels,
        layer,
        err!(LayerError::BadScale { index: 5, .. }),
        move |ck| set_bf16(ck, cs, 5, -1.0),
    );
    c.model(
        "fp8 tensor scale of two values",
        fp8_tensor,
        layer,
        err!(LayerError::WrongShape { .. }),
        move |ck| retype(ck, ts, Dtype::F32, &[2]),
    );
    c.model(
        "fp8 NaN tensor scale",
        fp8_tensor,
        layer,
        err!(LayerError::BadScale { index: 0, .. }),
        move |ck| {
            stored(ck, ts)
                .bytes
                .copy_from_slice(&f32::NAN.to_le_bytes())
        },
    );
    c.model(
        "fp8 tensor scale missing",
        fp8_tensor,
        layer,
        err!(LayerError::MissingTensor { .. }),
        move |ck| {
            ck.tensors.remove(ts);
        },
    );
    c.model(
        "fp8 per-tensor config over block scales",
        fp8,
        layer,
        err!(LayerError::MissingTensor { .. }),
        |ck| {
            let qc = ck.config["quantization_config"].as_object_mut().unwrap();
            qc.remove("weight_block_size");
        },
    );
}
