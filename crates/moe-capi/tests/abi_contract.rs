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
