//! The C ABI's contract, exercised from Rust through the exported functions: a layer built
//! tensor by tensor (`moe_layer_create` + `moe_layer_load_tensor` + `moe_layer_process`)
//! computes exactly what `moe_layer_open_checkpoint` computes on the fixture; bad input of
//! every kind (NULL, unknown and freed handles, wrong sizes and names, misaligned buffers,
//! invalid UTF-8, bad enum values) returns its status code and a message; and a free racing
//! with applies on other threads neither crashes nor disturbs the running calls.

use std::ffi::{CStr, CString, c_void};
use std::ptr::{null, null_mut};

use half::bf16;
use moe_capi::*;
use moe_layer::checkpoint::{Checkpoint, ShardAccess};

fn fixture() -> std::path::PathBuf {
    moe_testutil::fixtures_dir().join("qwen3moe-w4a8-g32")
}

fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated string for the calling thread.
    unsafe { CStr::from_ptr(moe_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn expect(status: MoeStatus, want: MoeStatus) {
    assert_eq!(status, want, "message: {}", last_error());
    if want != MoeStatus::Ok {
        assert!(!last_error().is_empty(), "an error without a message");
    }
}

fn open_fixture() -> *mut MoeLayerHandle {
    let dir = CString::new(fixture().to_str().unwrap()).unwrap();
    let mut layer = null_mut();
    // SAFETY: a valid C string and out-pointer.
    let status =
        unsafe { moe_layer_open_checkpoint(dir.as_ptr(), MOE_FIRST_MOE_LAYER, 16, &mut layer) };
    expect(status, MoeStatus::Ok);
    layer
}

/// The fixture's hidden states as f32 `[T, H]`.
fn fixture_x() -> Vec<f32> {
    let case = moe_testutil::GoldenCase::open(&fixture().join("expected.safetensors")).unwrap();
    case.u16_bits("x")
        .into_iter()
        .map(|b| bf16::from_bits(b).to_f32())
        .collect()
}

fn apply_f32(layer: *mut MoeLayerHandle, x: &[f32], out: &mut [f32]) -> MoeStatus {
    // SAFETY: valid buffers of the stated lengths.
    unsafe {
        moe_layer_apply(
            layer,
            MoeDtype::F32 as u32,
            x.as_ptr().cast(),
            x.len(),
            null(),
            0,
            out.as_mut_ptr().cast(),
            out.len(),
        )
    }
}

/// Loads one tensor through the ABI.
fn load(
    layer: *mut MoeLayerHandle,
    name: &str,
    dtype: MoeDtype,
    shape: &[usize],
    data: *const c_void,
    len: usize,
) -> MoeStatus {
    let name = CString::new(name).unwrap();
    // SAFETY: valid name, shape and a buffer of `len` elements of `dtype`.
    unsafe {
        moe_layer_load_tensor(
            layer,
            name.as_ptr(),
            dtype as u32,
            shape.as_ptr(),
            shape.len(),
            data,
            len,
        )
    }
}

/// Loads every expert tensor and the router gate of the fixture's first MoE layer through
/// `moe_layer_load_tensor`.
fn load_fixture_tensors(layer: *mut MoeLayerHandle, ckpt: &Checkpoint) {
    let spec = ckpt.spec();
    let src = ckpt.source();
    let layer_index = spec.moe_layers[0];
    for e in 0..spec.num_experts {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            let name = format!("model.layers.{layer_index}.mlp.experts.{e}.{proj}.weight");
            let w = src.get(&name).unwrap();
            let codes: Vec<i8> = w.bytes.iter().map(|&b| b as i8).collect();
            expect(
                load(
                    layer,
                    &name,
                    MoeDtype::I8,
                    w.shape,
                    codes.as_ptr().cast(),
                    codes.len(),
                ),
                MoeStatus::Ok,
            );
            let name = format!("{name}_scale");
            let s = src.get(&name).unwrap();
            let scales: Vec<u16> = s
                .bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            expect(
                load(
                    layer,
                    &name,
                    MoeDtype::Bf16,
                    s.shape,
                    scales.as_ptr().cast(),
                    scales.len(),
                ),
                MoeStatus::Ok,
            );
        }
    }
    let name = format!("model.layers.{layer_index}.mlp.gate.weight");
    let g = src.get(&name).unwrap();
    let gate: Vec<u16> = g
        .bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    expect(
        load(
            layer,
            &name,
            MoeDtype::Bf16,
            g.shape,
            gate.as_ptr().cast(),
            gate.len(),
        ),
        MoeStatus::Ok,
    );
}

#[test]
fn a_layer_built_tensor_by_tensor_matches_the_checkpoint_path() {
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let spec = ckpt.spec();
    let desc = MoeLayerDesc {
        num_experts: spec.num_experts,
        top_k: spec.top_k,
        hidden: spec.hidden,
        intermediate: spec.intermediate,
        quant: MoeQuant::W4a8 as u32,
        group_size: 32,
        renormalize: 1,
        dtype: MoeDtype::Bf16 as u32,
        max_tokens: 16,
    };
    let mut layer = null_mut();
    // SAFETY: a valid desc and out-pointer.
    expect(
        unsafe { moe_layer_create(&desc, &mut layer) },
        MoeStatus::Ok,
    );
    let mut info = std::mem::MaybeUninit::<MoeLayerInfo>::uninit();
    // SAFETY: a valid out-pointer.
    expect(
        unsafe { moe_layer_info(layer, info.as_mut_ptr()) },
        MoeStatus::Ok,
    );
    // SAFETY: written by the successful call.
    assert!(!unsafe { info.assume_init() }.processed);
    let mut x = fixture_x();
    let mut out = vec![0f32; x.len()];
    expect(apply_f32(layer, &x, &mut out), MoeStatus::BadState);

    load_fixture_tensors(layer, &ckpt);
    expect(moe_layer_process(layer), MoeStatus::Ok);
    expect(moe_layer_process(layer), MoeStatus::Ok);

    let reference = open_fixture();
    let mut want = vec![0f32; x.len()];
    expect(apply_f32(reference, &x, &mut want), MoeStatus::Ok);
    expect(apply_f32(layer, &x, &mut out), MoeStatus::Ok);
    assert_eq!(out, want, "per-tensor and checkpoint layers differ");
    assert!(out.iter().any(|v| *v != 0.0));

    // Sizes that do not fit.
    x.pop();
    expect(
        apply_f32(layer, &x, &mut out[..x.len()]),
        MoeStatus::InvalidArgument,
    );
    expect(moe_layer_free(layer), MoeStatus::Ok);
    expect(moe_layer_free(reference), MoeStatus::Ok);
}

#[test]
fn bad_descriptions_and_tensors_are_refused_with_their_status() {
    let good = MoeLayerDesc {
        num_experts: 4,
        top_k: 2,
        hidden: 64,
        intermediate: 64,
        quant: MoeQuant::W4a8 as u32,
        group_size: 32,
        renormalize: 1,
        dtype: MoeDtype::Bf16 as u32,
        max_tokens: 8,
    };
    let mut layer = null_mut();
    for (desc, want) in [
        (
            MoeLayerDesc { top_k: 5, ..good },
            MoeStatus::InvalidArgument,
        ),
        (
            MoeLayerDesc { hidden: 0, ..good },
            MoeStatus::InvalidArgument,
        ),
        (
            MoeLayerDesc {
                group_size: 48,
                ..good
            },
            MoeStatus::InvalidArgument,
        ),
        (
            MoeLayerDesc { quant: 9, ..good },
            MoeStatus::InvalidArgument,
        ),
        (
            MoeLayerDesc {
                dtype: MoeDtype::I8 as u32,
                ..good
            },
            MoeStatus::InvalidArgument,
        ),
        (
            MoeLayerDesc {
                dtype: 1000,
                ..good
            },
            MoeStatus::InvalidArgument,
        ),
    ] {
        // SAFETY: valid pointers.
        expect(unsafe { moe_layer_create(&desc, &mut layer) }, want);
        assert!(layer.is_null(), "a failed create leaves *out NULL");
    }
    // SAFETY: NULL pointers are reported, not dereferenced.
    expect(
        unsafe { moe_layer_create(null(), &mut layer) },
        MoeStatus::NullPointer,
    );
    // SAFETY: as above.
    expect(
        unsafe { moe_layer_create(&good, null_mut()) },
        MoeStatus::NullPointer,
    );

    let fresh = || {
        let mut layer = null_mut();
        // SAFETY: valid pointers.
        expect(
            unsafe { moe_layer_create(&good, &mut layer) },
            MoeStatus::Ok,
        );
        layer
    };
    let codes = vec![0i8; 64 * 64 + 1];
    // Wrong shape for the data, wrong tensor shape, bad names, bad dtype, NULL data.
    for (name, dtype, shape, len, want) in [
        (
            "experts.0.w1.weight",
            MoeDtype::I8 as u32,
            vec![64, 64],
            64 * 64 - 1,
            MoeStatus::InvalidArgument,
        ),
        (
            "experts.0.w1.weight",
            MoeDtype::I8 as u32,
            vec![63, 64],
            63 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "experts.9.w1.weight",
            MoeDtype::I8 as u32,
            vec![64, 64],
            64 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "experts.0.w5.weight",
            MoeDtype::I8 as u32,
            vec![64, 64],
            64 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "lm_head.weight",
            MoeDtype::I8 as u32,
            vec![64, 64],
            64 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "experts.0.w1.weight",
            42,
            vec![64, 64],
            64 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "gate.weight",
            MoeDtype::I8 as u32,
            vec![4, 64],
            4 * 64,
            MoeStatus::InvalidArgument,
        ),
        (
            "experts.0.w1.weight",
            MoeDtype::I8 as u32,
            vec![usize::MAX, 2],
            0,
            MoeStatus::InvalidArgument,
        ),
    ] {
        let layer = fresh();
        let name = CString::new(name).unwrap();
        // SAFETY: `codes` holds at least `len` elements.
        let status = unsafe {
            moe_layer_load_tensor(
                layer,
                name.as_ptr(),
                dtype,
                shape.as_ptr(),
                shape.len(),
                codes.as_ptr().cast(),
                len,
            )
        };
        expect(status, want);
        expect(moe_layer_free(layer), MoeStatus::Ok);
    }
    let layer = fresh();
    // A misaligned f32 buffer (odd address) is refused, not read.
    let bytes = vec![0u8; 4 * 64 * 2 + 1];
    let misaligned = bytes[1..].as_ptr();
    expect(
        load(
            layer,
            "experts.0.w1.weight_scale",
            MoeDtype::F32,
            &[64, 2],
            misaligned.cast(),
            128,
        ),
        MoeStatus::InvalidArgument,
    );
    let layer2 = fresh();
    expect(
        load(
            layer2,
            "experts.0.w1.weight",
            MoeDtype::I8,
            &[64, 64],
            null(),
            64 * 64,
        ),
        MoeStatus::NullPointer,
    );
    // Invalid UTF-8 and NULL names.
    let bad = [b'e', 0xff, 0];
    // SAFETY: a NUL-terminated byte string; shape and data valid.
    let status = unsafe {
        moe_layer_load_tensor(
            fresh(),
            bad.as_ptr().cast(),
            MoeDtype::I8 as u32,
            [1usize].as_ptr(),
            1,
            codes.as_ptr().cast(),
            1,
        )
    };
    expect(status, MoeStatus::InvalidUtf8);
    // SAFETY: NULL is reported.
    let status =
        unsafe { moe_layer_load_tensor(layer2, null(), MoeDtype::I8 as u32, null(), 0, null(), 0) };
    expect(status, MoeStatus::NullPointer);
    // Processing an incomplete layer, then using it.
    expect(moe_layer_process(layer), MoeStatus::BadState);
    let mut backend = std::mem::MaybeUninit::<MoeBackendInfo>::uninit();
    // SAFETY: a valid out-pointer.
    expect(
        unsafe { moe_layer_backend(layer, backend.as_mut_ptr()) },
        MoeStatus::BadState,
    );
    let mut ops = null();
    // SAFETY: a valid out-pointer.
    expect(
        unsafe { moe_layer_backend_ops(layer, &mut ops) },
        MoeStatus::BadState,
    );
    expect(moe_layer_free(layer), MoeStatus::Ok);
    expect(moe_layer_free(layer), MoeStatus::InvalidHandle);
    expect(moe_layer_free(null_mut()), MoeStatus::NullPointer);
    expect(
        moe_layer_free(0x10 as *mut MoeLayerHandle),
        MoeStatus::InvalidHandle,
    );
    expect(moe_layer_free(layer2), MoeStatus::Ok);
    // SAFETY: static strings.
    let name = unsafe { CStr::from_ptr(moe_status_name(MoeStatus::InvalidUtf8 as u32)) };
    assert_eq!(name.to_str().unwrap(), "MOE_STATUS_INVALID_UTF8");
}

#[test]
fn a_free_racing_with_applies_only_unregisters_the_handle() {
    let layer = open_fixture();
    let handle = layer as usize;
    let x = fixture_x();
    let mut want = vec![0f32; x.len()];
    expect(apply_f32(layer, &x, &mut want), MoeStatus::Ok);
    std::thread::scope(|s| {
        for _ in 0..4 {
            let x = &x;
            let want = &want;
            s.spawn(move || {
                let layer = handle as *mut MoeLayerHandle;
                let mut out = vec![0f32; x.len()];
                for _ in 0..50 {
                    match apply_f32(layer, x, &mut out) {
                        MoeStatus::Ok => assert_eq!(&out, want),
                        MoeStatus::InvalidHandle => return,
                        other => panic!("{other:?}: {}", last_error()),
                    }
                }
            });
        }
        s.spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(2));
            expect(moe_layer_free(handle as *mut MoeLayerHandle), MoeStatus::Ok);
        });
    });
    expect(moe_layer_free(layer), MoeStatus::InvalidHandle);
}

/// The defaults of `moe_layer_options_default`, changed by `f`.
fn options(f: impl FnOnce(&mut MoeLayerOptions)) -> MoeLayerOptions {
    let mut o = std::mem::MaybeUninit::<MoeLayerOptions>::uninit();
    // SAFETY: a valid out-pointer.
    unsafe { moe_layer_options_default(o.as_mut_ptr()) };
    // SAFETY: written by the call above.
    let mut o = unsafe { o.assume_init() };
    assert_eq!(o.struct_size, size_of::<MoeLayerOptions>());
    f(&mut o);
    o
}

fn fixture_desc(ckpt: &Checkpoint) -> MoeLayerDesc {
    let spec = ckpt.spec();
    MoeLayerDesc {
        num_experts: spec.num_experts,
        top_k: spec.top_k,
        hidden: spec.hidden,
        intermediate: spec.intermediate,
        quant: MoeQuant::W4a8 as u32,
        group_size: 32,
        renormalize: 1,
        dtype: MoeDtype::Bf16 as u32,
        max_tokens: 16,
    }
}

/// The settings of `MoeLayerOptions` reach the layer: created with GELU experts and
/// DeepSeek-V3-style routing (grouped sigmoid scores, a correction bias, a scaling factor),
/// the layer refuses to process until the bias is loaded, then computes exactly what the Rust
/// layer of that configuration computes, and something else than the default layer.
#[test]
fn layer_options_reach_the_layer() {
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let spec = ckpt.spec();
    let e = spec.num_experts;
    let opts = options(|o| {
        o.activation = MoeActivation::Gelu as u32;
        o.routing = MoeRouting::GroupedSigmoid as u32;
        o.num_groups = 4;
        o.topk_group = 2;
        o.routed_scaling_factor = 2.5;
        o.correction_bias = 1;
    });
    let create = || {
        let mut layer = null_mut();
        // SAFETY: valid desc, options and out-pointer.
        expect(
            unsafe { moe_layer_create_with(&fixture_desc(&ckpt), &opts, &mut layer) },
            MoeStatus::Ok,
        );
        load_fixture_tensors(layer, &ckpt);
        layer
    };
    let unbiased = create();
    expect(moe_layer_process(unbiased), MoeStatus::BadState);
    assert!(
        last_error().contains("e_score_correction_bias"),
        "{}",
        last_error()
    );
    expect(moe_layer_free(unbiased), MoeStatus::Ok);
    let layer = create();
    let bias: Vec<f32> = (0..e).map(|x| (x as f32 - 3.0) * 0.02).collect();
    let name = "model.layers.0.mlp.gate.e_score_correction_bias";
    expect(
        load(
            layer,
            name,
            MoeDtype::F32,
            &[e + 1],
            bias.as_ptr().cast(),
            e,
        ),
        MoeStatus::InvalidArgument,
    );
    expect(
        load(layer, name, MoeDtype::F32, &[e], bias.as_ptr().cast(), e),
        MoeStatus::Ok,
    );
    expect(moe_layer_process(layer), MoeStatus::Ok);

    let routing = moe_layer::checkpoint::RoutingSpec {
        scoring: moe_router::ScoringFunc::Sigmoid,
        renormalize: true,
        num_expert_group: Some(4),
        topk_group: Some(2),
        routed_scaling_factor: 2.5,
        has_correction_bias: true,
        topk_method: None,
        llama4: false,
        sparse_mixer_jitter: None,
    };
    let mut cfg = moe_layer::MoeLayerConfig::from_spec(spec, 0, 1, None, 16)
        .unwrap()
        .with_activation(moe_kernels::Activation::Gelu)
        .with_router(moe_layer::layer::router_from_spec(&routing, e, spec.top_k).unwrap());
    cfg.router_bias_pending = true;
    assert_layer_computes_as_rust(layer, &ckpt, cfg, Some(&bias));
}

/// Frees `layer` (made from the fixture's tensors through the ABI) after checking that it
/// computes exactly what the Rust layer of `cfg` on the same tensors (and correction bias)
/// computes, and something else than the default layer.
fn assert_layer_computes_as_rust(
    layer: *mut MoeLayerHandle,
    ckpt: &Checkpoint,
    cfg: moe_layer::MoeLayerConfig,
    correction_bias: Option<&[f32]>,
) {
    let mut reference = moe_layer::MoeLayer::create(cfg).unwrap();
    let tensors = ckpt
        .read_layer(
            ckpt.spec().moe_layers[0],
            &moe_layer::checkpoint::ReadOptions::single_rank(),
        )
        .unwrap();
    reference.load_layer_tensors(&tensors).unwrap();
    if let Some(bias) = correction_bias {
        reference.load_router_correction_bias(bias).unwrap();
    }
    reference.process().unwrap();
    let x = fixture_x();
    let mut got = vec![0f32; x.len()];
    expect(apply_f32(layer, &x, &mut got), MoeStatus::Ok);
    let logits = reference.router_logits(&x).unwrap();
    let mut want = vec![0f32; x.len()];
    reference
        .apply(&x, moe_router::Logits::F32(&logits), &mut want)
        .unwrap();
    assert_eq!(got, want);
    let default = open_fixture();
    let mut plain = vec![0f32; x.len()];
    expect(apply_f32(default, &x, &mut plain), MoeStatus::Ok);
    assert_ne!(got, plain);
    expect(moe_layer_free(layer), MoeStatus::Ok);
    expect(moe_layer_free(default), MoeStatus::Ok);
}

/// `MOE_ROUTING_LLAMA4` builds Llama 4's router: the layer computes exactly what the Rust layer
/// with that router computes (the sigmoid of each chosen logit scaling the token before its
/// expert), not what the default layer computes; renormalization, a correction bias or a
/// scaling factor with it are refused, naming the field.
#[test]
fn llama4_routing_reaches_the_layer() {
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let spec = ckpt.spec();
    let desc = MoeLayerDesc {
        renormalize: 0,
        ..fixture_desc(&ckpt)
    };
    let create = |desc: &MoeLayerDesc, o: &MoeLayerOptions| {
        let mut layer = null_mut();
        // SAFETY: valid desc, options and out-pointer.
        let status = unsafe { moe_layer_create_with(desc, o, &mut layer) };
        (status, layer)
    };
    let llama4 = options(|o| o.routing = MoeRouting::Llama4 as u32);
    let (status, layer) = create(&desc, &llama4);
    expect(status, MoeStatus::Ok);
    load_fixture_tensors(layer, &ckpt);
    expect(moe_layer_process(layer), MoeStatus::Ok);

    let cfg = moe_layer::MoeLayerConfig::from_spec(spec, 0, 1, None, 16)
        .unwrap()
        .with_router(moe_router::RouterConfig::llama4(
            spec.num_experts,
            spec.top_k,
        ));
    assert_layer_computes_as_rust(layer, &ckpt, cfg, None);

    for (desc, o, field) in [
        (fixture_desc(&ckpt), llama4, "renormalize"),
        (
            desc,
            options(|o| {
                o.routing = MoeRouting::Llama4 as u32;
                o.correction_bias = 1;
            }),
            "correction_bias",
        ),
        (
            desc,
            options(|o| {
                o.routing = MoeRouting::Llama4 as u32;
                o.routed_scaling_factor = 2.0;
            }),
            "routed_scaling_factor",
        ),
    ] {
        let (status, layer) = create(&desc, &o);
        expect(status, MoeStatus::InvalidArgument);
        assert!(layer.is_null());
        assert!(last_error().contains(field), "{field}: {}", last_error());
    }
}

/// `moe_layer_open_checkpoint_with` passes the WNA16 activations: the int4 WNA16 fixture with
/// int8 activations runs on the W4A8 kernels and computes exactly what the W4A8 fixture (the
/// same codes and scales) computes; with float activations it runs on the WNA16 kernels.
#[test]
fn open_checkpoint_with_int8_activations_runs_wna16_on_the_w4a8_kernels() {
    let wna16 = moe_testutil::fixtures_dir().join("qwen3moe-w4a16-g32");
    let dir = CString::new(wna16.to_str().unwrap()).unwrap();
    let open = |o: &MoeLayerOptions| {
        let mut layer = null_mut();
        // SAFETY: a valid C string, options and out-pointer; NULL ranks mean one rank.
        let status = unsafe {
            moe_layer_open_checkpoint_with(
                dir.as_ptr(),
                MOE_FIRST_MOE_LAYER,
                16,
                null(),
                o,
                &mut layer,
            )
        };
        expect(status, MoeStatus::Ok);
        layer
    };
    let kernel = |layer| {
        let mut info = std::mem::MaybeUninit::<MoeBackendInfo>::uninit();
        // SAFETY: a valid out-pointer.
        expect(
            unsafe { moe_layer_backend(layer, info.as_mut_ptr()) },
            MoeStatus::Ok,
        );
        // SAFETY: written by the successful call; its strings are static and NUL-terminated.
        let info = unsafe { info.assume_init() };
        // SAFETY: as above.
        unsafe { CStr::from_ptr(info.kernel) }
            .to_string_lossy()
            .into_owned()
    };
    let int8 = open(&options(|o| {
        o.wna16_activations = MoeWna16Activations::Int8 as u32
    }));
    let float = open(&options(|_| {}));
    assert!(
        kernel(int8).starts_with("cpu-int4-w4a8/"),
        "{}",
        kernel(int8)
    );
    assert!(kernel(float).starts_with("cpu-wna16/"), "{}", kernel(float));
    let w4a8 = open_fixture();
    let x = fixture_x();
    let run = |layer| {
        let mut out = vec![0f32; x.len()];
        expect(apply_f32(layer, &x, &mut out), MoeStatus::Ok);
        out
    };
    assert_eq!(run(int8), run(w4a8));
    assert_ne!(run(float), run(w4a8));
    for layer in [int8, float, w4a8] {
        expect(moe_layer_free(layer), MoeStatus::Ok);
    }
}

/// A processed layer reports what its kernels run per operation, numerics included, as the
/// Rust layer's backend does, one line per operation; a NULL out-pointer is refused.
#[test]
fn backend_ops_say_what_runs_per_operation() {
    let layer = open_fixture();
    let mut ops = null();
    // SAFETY: a valid out-pointer.
    expect(
        unsafe { moe_layer_backend_ops(layer, &mut ops) },
        MoeStatus::Ok,
    );
    // SAFETY: written by the successful call: a NUL-terminated string owned by the layer.
    let got = unsafe { CStr::from_ptr(ops) }.to_str().unwrap().to_owned();
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let rust = moe_layer::MoeLayer::from_checkpoint(&ckpt, 0, 16).unwrap();
    assert_eq!(got, rust.backend().unwrap().ops.join("\n"));
    for op in ["w4a8_gemm", "w8a8_gemm", "wna16_gemm", "dense_gemm"] {
        assert!(
            got.lines().any(|l| l.starts_with(op)),
            "no {op} line in {got:?}"
        );
    }
    let mut again = null();
    // SAFETY: a valid out-pointer.
    expect(
        unsafe { moe_layer_backend_ops(layer, &mut again) },
        MoeStatus::Ok,
    );
    assert_eq!(again, ops, "the string is kept with the layer");
    // SAFETY: NULL is reported.
    expect(
        unsafe { moe_layer_backend_ops(layer, null_mut()) },
        MoeStatus::NullPointer,
    );
    expect(moe_layer_free(layer), MoeStatus::Ok);
}

/// An expert-parallel rank reaches the oracle: more ranks than the fixture's 8 experts is
/// refused for the oracle's reason, as `moe inspect` and `moe run` refuse it, while a rank of
/// a group the experts fill opens.
#[test]
fn open_checkpoint_ranked_asks_the_oracle_with_the_expert_parallel_rank() {
    let dir = CString::new(fixture().to_str().unwrap()).unwrap();
    let open = |ep_rank: usize, ep_size: usize| {
        let ranks = MoeRanks {
            tp_rank: 0,
            tp_size: 1,
            ep_rank,
            ep_size,
        };
        let mut layer = null_mut();
        // SAFETY: a valid C string, ranks and out-pointer.
        let status = unsafe {
            moe_layer_open_checkpoint_ranked(
                dir.as_ptr(),
                MOE_FIRST_MOE_LAYER,
                16,
                &ranks,
                &mut layer,
            )
        };
        (status, layer)
    };
    let (status, layer) = open(0, 9);
    expect(status, MoeStatus::Unsupported);
    assert!(layer.is_null());
    assert!(last_error().contains("EP ranks"), "{}", last_error());
    let (status, layer) = open(1, 2);
    expect(status, MoeStatus::Ok);
    expect(moe_layer_free(layer), MoeStatus::Ok);
}

/// Bad options are refused with `MOE_STATUS_INVALID_ARGUMENT` and a message naming the field.
#[test]
fn bad_layer_options_are_refused() {
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let desc = fixture_desc(&ckpt);
    let cases: [(MoeLayerOptions, &str); 8] = [
        (options(|o| o.struct_size = 8), "struct_size"),
        (options(|o| o.w4a8_prefill = 4), "w4a8_prefill"),
        (options(|o| o.reserved = 1), "reserved"),
        (options(|o| o.activation = 9), "activation"),
        (options(|o| o.routing = 7), "routing"),
        (
            options(|o| o.routing = MoeRouting::GroupedSoftmax as u32),
            "grouped routing",
        ),
        (
            options(|o| o.routed_scaling_factor = f32::NAN),
            "routed_scaling_factor",
        ),
        (options(|o| o.wna16_activations = 2), "wna16_activations"),
    ];
    for (opts, field) in cases {
        let mut layer = null_mut();
        // SAFETY: valid desc, options and out-pointer.
        let status = unsafe { moe_layer_create_with(&desc, &opts, &mut layer) };
        expect(status, MoeStatus::InvalidArgument);
        assert!(last_error().contains(field), "{field}: {}", last_error());
        assert!(layer.is_null());
    }
    // SwiGLU-OAI needs a usable limit (0 is its default, 7).
    let opts = options(|o| {
        o.activation = MoeActivation::SwigluOai as u32;
        o.activation_limit = -1.0;
    });
    let mut layer = null_mut();
    // SAFETY: valid desc, options and out-pointer.
    let status = unsafe { moe_layer_create_with(&desc, &opts, &mut layer) };
    expect(status, MoeStatus::InvalidArgument);
}

/// A caller compiled against the first version of `MoeLayerOptions` (which ended with
/// `wna16_activations`) is read up to there: its fields count, and whatever lies past them (its
/// padding, here garbage) is neither read nor refused.
#[test]
fn options_of_the_first_version_are_read_up_to_their_size() {
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let desc = fixture_desc(&ckpt);
    let first = |f: fn(&mut MoeLayerOptions)| {
        options(|o| {
            o.struct_size = OPTIONS_FIRST_VERSION_SIZE;
            o.w4a8_prefill = 99;
            o.reserved = 7;
            f(o);
        })
    };
    assert!(OPTIONS_FIRST_VERSION_SIZE < size_of::<MoeLayerOptions>());
    let mut layer = null_mut();
    // SAFETY: valid desc, options and out-pointer.
    let status = unsafe { moe_layer_create_with(&desc, &first(|_| {}), &mut layer) };
    expect(status, MoeStatus::Ok);
    expect(moe_layer_free(layer), MoeStatus::Ok);
    let mut layer = null_mut();
    // SAFETY: as above.
    let status = unsafe { moe_layer_create_with(&desc, &first(|o| o.activation = 9), &mut layer) };
    expect(status, MoeStatus::InvalidArgument);
    assert!(last_error().contains("activation"), "{}", last_error());
    let too_small = first(|o| o.struct_size = OPTIONS_FIRST_VERSION_SIZE - 8);
    // SAFETY: as above.
    let status = unsafe { moe_layer_create_with(&desc, &too_small, &mut layer) };
    expect(status, MoeStatus::InvalidArgument);
    assert!(last_error().contains("struct_size"), "{}", last_error());
}

/// `w4a8_prefill` reaches the layer a checkpoint opens: on 128 tokens (32 rows per expert on
/// average, past every rung's prefill threshold) each choice computes exactly what the Rust
/// layer loaded with the same choice computes; where the kernels have the requantised body,
/// `MOE_W4A8_PREFILL_INT8_CHANNEL` moves the outputs, by about the documented 1 %.
#[test]
fn w4a8_prefill_option_reaches_the_layer() {
    use moe_layer::{LoadOptions, MoeLayer, W4A8Prefill};
    let tokens = 128;
    let dir = CString::new(fixture().to_str().unwrap()).unwrap();
    let ckpt = Checkpoint::open(&fixture(), ShardAccess::Read).unwrap();
    let hidden = fixture_x().len() / 5;
    let mut rng = moe_testutil::SplitMix64::new(0x4a8);
    let x: Vec<f32> = (0..tokens * hidden).map(|_| rng.normal()).collect();
    let mut outputs = Vec::new();
    for (choice, prefill) in [
        (MoeW4a8Prefill::Int8, W4A8Prefill::ExactInt8),
        (MoeW4a8Prefill::Int8Channel, W4A8Prefill::ChannelInt8),
    ] {
        let o = options(|o| o.w4a8_prefill = choice as u32);
        let mut layer = null_mut();
        // SAFETY: a valid C string, options and out-pointer; NULL ranks mean one rank.
        let status = unsafe {
            moe_layer_open_checkpoint_with(
                dir.as_ptr(),
                MOE_FIRST_MOE_LAYER,
                tokens,
                null(),
                &o,
                &mut layer,
            )
        };
        expect(status, MoeStatus::Ok);
        let mut got = vec![0f32; x.len()];
        expect(apply_f32(layer, &x, &mut got), MoeStatus::Ok);
        expect(moe_layer_free(layer), MoeStatus::Ok);
        let load = LoadOptions::new().with_w4a8_prefill(prefill);
        let rust = MoeLayer::from_checkpoint_with(&ckpt, 0, tokens, &load).unwrap();
        let mut want = vec![0f32; x.len()];
        rust.apply_with_gate(&x, &mut want).unwrap();
        let first_diff = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g.to_bits() != w.to_bits());
        assert_eq!(
            first_diff, None,
            "{choice:?}: the ABI's layer and the Rust layer differ"
        );
        outputs.push(got);
    }
    let ops = moe_kernels::kernels().describe_ops().join("; ");
    let diff: f64 = outputs[0]
        .iter()
        .zip(&outputs[1])
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = outputs[0].iter().map(|a| f64::from(*a).powi(2)).sum();
    let rel = (diff / norm).sqrt();
    if ops.contains("int8-channel") {
        assert!(rel > 0.0, "the requantised body did not run: {ops}");
    } else {
        assert_eq!(
            rel, 0.0,
            "no requantised body, yet the outputs moved: {ops}"
        );
    }
    assert!(rel < 3e-2, "requantised prefill {rel:e} from the exact one");
}

/// The data of one expert tensor, as both roads are handed it.
enum TensorValues {
    Bf16(Vec<bf16>),
    I8(Vec<i8>),
}

/// One expert tensor: global expert, shard, kind, checkpoint name, shape and values.
struct ExpertTensor {
    expert: usize,
    shard: moe_layer::ExpertShard,
    kind: moe_layer::TensorKind,
    name: String,
    shape: Vec<usize>,
    values: TensorValues,
}

/// Builds a layer of `quant` through the ABI (`moe_layer_create`, `moe_layer_load_tensor`,
/// `moe_layer_process`) and the Rust layer `cfg` from the same `tensors` and router `gate`,
/// and checks that they compute the same outputs on `x` (f32, routed by the gate), bit for
/// bit, and not all zero.
fn abi_layer_equals_rust(
    quant: MoeQuant,
    cfg: moe_layer::MoeLayerConfig,
    tensors: &[ExpertTensor],
    gate: &[f32],
    x: &[f32],
) {
    use moe_layer::{MoeLayer, TensorData, TensorView};
    let (e, h) = (cfg.num_experts, cfg.hidden);
    let desc = MoeLayerDesc {
        num_experts: e,
        top_k: cfg.top_k,
        hidden: h,
        intermediate: cfg.intermediate,
        quant: quant as u32,
        group_size: 0,
        renormalize: 1,
        dtype: MoeDtype::Bf16 as u32,
        max_tokens: cfg.max_tokens,
    };
    let mut layer = null_mut();
    // SAFETY: a valid desc and out-pointer.
    expect(
        unsafe { moe_layer_create(&desc, &mut layer) },
        MoeStatus::Ok,
    );
    let mut reference = MoeLayer::create(cfg).unwrap();
    for t in tensors {
        let (dtype, ptr, len, data) = match &t.values {
            TensorValues::Bf16(v) => (
                MoeDtype::Bf16,
                v.as_ptr().cast::<c_void>(),
                v.len(),
                TensorData::Bf16(v),
            ),
            TensorValues::I8(v) => (
                MoeDtype::I8,
                v.as_ptr().cast::<c_void>(),
                v.len(),
                TensorData::I8(v),
            ),
        };
        expect(
            load(layer, &t.name, dtype, &t.shape, ptr, len),
            MoeStatus::Ok,
        );
        let view = TensorView {
            name: &t.name,
            shape: &t.shape,
            data,
        };
        reference
            .load_expert_tensor(t.expert, t.shard, t.kind, &view)
            .unwrap();
    }
    expect(
        load(
            layer,
            "gate.weight",
            MoeDtype::F32,
            &[e, h],
            gate.as_ptr().cast(),
            gate.len(),
        ),
        MoeStatus::Ok,
    );
    reference.load_router_weight(gate).unwrap();
    expect(moe_layer_process(layer), MoeStatus::Ok);
    reference.process().unwrap();
    let mut got = vec![0f32; x.len()];
    expect(apply_f32(layer, x, &mut got), MoeStatus::Ok);
    let mut want = vec![0f32; x.len()];
    reference.apply_with_gate(x, &mut want).unwrap();
    assert_eq!(got, want);
    assert!(got.iter().any(|v| *v != 0.0));
    expect(moe_layer_free(layer), MoeStatus::Ok);
}

/// A small deterministic generator of the two tests below.
fn lcg(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    }
}

/// The projections of `e` experts: `(expert, shard, name, shape)`.
fn projections(
    e: usize,
    h: usize,
    i: usize,
) -> Vec<(usize, moe_layer::ExpertShard, String, [usize; 2])> {
    use moe_layer::ExpertShard;
    (0..e)
        .flat_map(|x| {
            [
                ("gate_proj", ExpertShard::W1, [i, h]),
                ("up_proj", ExpertShard::W3, [i, h]),
                ("down_proj", ExpertShard::W2, [h, i]),
            ]
            .map(|(proj, shard, shape)| (x, shard, format!("experts.{x}.{proj}"), shape))
        })
        .collect()
}

/// An unquantized layer built through the ABI from bf16 tensors computes exactly what the Rust
/// layer built from the same tensors computes.
#[test]
fn an_unquantized_layer_built_tensor_by_tensor_matches_the_rust_layer() {
    use moe_layer::{LayerQuant, MoeLayerConfig, TensorKind};
    let (e, k, h, i) = (4usize, 2usize, 64usize, 32usize);
    let mut next = lcg(0x5eed);
    let mut unit = move || (next() % 20_000) as f32 / 100_000.0 - 0.1;
    let tensors: Vec<ExpertTensor> = projections(e, h, i)
        .into_iter()
        .map(|(expert, shard, name, shape)| ExpertTensor {
            expert,
            shard,
            kind: TensorKind::Weight,
            name: format!("{name}.weight"),
            shape: shape.to_vec(),
            values: TensorValues::Bf16((0..h * i).map(|_| bf16::from_f32(unit())).collect()),
        })
        .collect();
    let gate: Vec<f32> = (0..e * h).map(|_| unit()).collect();
    let x: Vec<f32> = (0..12 * h).map(|_| unit() * 10.0).collect();
    let cfg = MoeLayerConfig::new(e, k, h, i, LayerQuant::Unquantized)
        .with_in_dtype(moe_quant::DType::BF16)
        .with_max_tokens(16);
    abi_layer_equals_rust(MoeQuant::Unquantized, cfg, &tensors, &gate, &x);
}

/// A W8A8 layer built through the ABI from int8 codes (`−128` included) and bf16 channel
/// scales `[n, 1]` computes exactly what the Rust layer built from the same tensors computes.
/// Its gate and up products reach well past 7, so this also shows that the default options
/// leave SiLU unclamped.
#[test]
fn a_w8a8_layer_built_tensor_by_tensor_matches_the_rust_layer() {
    use moe_layer::{LayerQuant, MoeLayerConfig, TensorKind};
    let (e, k, h, i) = (4usize, 2usize, 64usize, 32usize);
    let mut next = lcg(0x8a8);
    let mut tensors = Vec::new();
    for (expert, shard, name, [n, kk]) in projections(e, h, i) {
        let mut codes: Vec<i8> = (0..n * kk).map(|_| next() as u8 as i8).collect();
        codes[expert] = i8::MIN;
        let scales = (0..n)
            .map(|_| bf16::from_f32(1e-3 + (next() % 1000) as f32 * 1e-5))
            .collect();
        for (kind, suffix, shape, values) in [
            (
                TensorKind::Weight,
                "weight",
                vec![n, kk],
                TensorValues::I8(codes),
            ),
            (
                TensorKind::Scale,
                "weight_scale",
                vec![n, 1],
                TensorValues::Bf16(scales),
            ),
        ] {
            tensors.push(ExpertTensor {
                expert,
                shard,
                kind,
                name: format!("{name}.{suffix}"),
                shape,
                values,
            });
        }
    }
    let gate: Vec<f32> = (0..e * h)
        .map(|_| (next() % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let x: Vec<f32> = (0..12 * h)
        .map(|_| (next() % 2000) as f32 / 500.0 - 2.0)
        .collect();
    // The model dtype rounds the W8A8 pipeline's intermediate activations, as vLLM's does.
    let cfg = MoeLayerConfig::new(e, k, h, i, LayerQuant::W8A8)
        .with_in_dtype(moe_quant::DType::BF16)
        .with_max_tokens(16);
    abi_layer_equals_rust(MoeQuant::W8a8, cfg, &tensors, &gate, &x);
}
