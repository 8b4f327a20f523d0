//! Malformed checkpoints, each broken in one way, must give a typed [`LayerError`] naming the
//! file and the tensor (or config field), never a panic and never a half-loaded layer.
#![cfg(feature = "checkpoint")]

mod checkpoint_support;

use std::path::{Path, PathBuf};

use checkpoint_support::{Ckpt, E, Fmt, G, H, I, bf16_bytes, temp_dir};
use moe_layer::LayerError;
use moe_layer::checkpoint::{Checkpoint, MoeLayerTensors, ReadOptions, ShardAccess};
use safetensors::Dtype;
use serde_json::json;

const EXPERT1_DOWN: &str = "model.layers.0.mlp.experts.1.down_proj";

fn load(dir: &Path) -> Result<MoeLayerTensors, LayerError> {
    load_with(dir, &ReadOptions::single_rank())
}

fn load_with(dir: &Path, opts: &ReadOptions<'_>) -> Result<MoeLayerTensors, LayerError> {
    let ckpt = Checkpoint::open(dir, ShardAccess::Read)?;
    ckpt.read_layer(0, opts)
}

/// Writes `ck` into a fresh directory and returns the error of loading it.
fn error_of(tag: &str, ck: &Ckpt) -> (LayerError, PathBuf) {
    let dir = temp_dir(tag);
    ck.write(&dir);
    let err = load(&dir).expect_err("malformed checkpoint must not load");
    (err, dir)
}

fn w4a8() -> Ckpt {
    Ckpt::build("qwen3_moe", Fmt::IntQuantized, 7).0
}

#[test]
fn the_unbroken_synthetic_checkpoint_loads() {
    let dir = temp_dir("baseline");
    w4a8().write(&dir);
    load(&dir).unwrap();
}

#[test]
fn missing_tensor_names_tensor_and_file() {
    let mut ck = w4a8();
    let name = "model.layers.0.mlp.experts.2.up_proj.weight_scale";
    ck.tensors.remove(name).unwrap();
    let (err, dir) = error_of("missing", &ck);
    match &err {
        LayerError::MissingTensor { tensor, file } => {
            assert_eq!(tensor, name);
            assert_eq!(file, &dir.join("model.safetensors"));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(name), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn missing_tensor_in_a_sharded_checkpoint_names_the_index_or_the_shard() {
    let mut ck = w4a8();
    let name = "model.layers.0.mlp.experts.3.gate_proj.weight";
    ck.tensors.remove(name).unwrap();
    let dir = temp_dir("missing-sharded");
    ck.write_sharded(&dir, 3);
    match load(&dir).unwrap_err() {
        LayerError::MissingTensor { tensor, file } => {
            assert_eq!(tensor, name);
            assert_eq!(file, dir.join("model.safetensors.index.json"));
        }
        other => panic!("{other:?}"),
    }
    // The index lists a tensor its shard does not hold.
    let dir = temp_dir("index-lies");
    w4a8().write_sharded(&dir, 2);
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let listed = index["weight_map"][name].as_str().unwrap().to_string();
    let other = if listed.contains("00001") {
        "model-00002-of-00002.safetensors"
    } else {
        "model-00001-of-00002.safetensors"
    };
    index["weight_map"][name] = json!(other);
    std::fs::write(&index_path, index.to_string()).unwrap();
    match load(&dir).unwrap_err() {
        LayerError::MissingTensor { tensor, file } => {
            assert_eq!(tensor, name);
            assert_eq!(file, dir.join(other));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn extra_expert_is_refused() {
    let mut ck = w4a8();
    let extra = format!("model.layers.0.mlp.experts.{E}.gate_proj.weight");
    let copy = ck.tensors["model.layers.0.mlp.experts.0.gate_proj.weight"].clone();
    ck.tensors.insert(extra.clone(), copy);
    let (err, dir) = error_of("extra", &ck);
    match err {
        LayerError::ExtraExpert {
            tensor,
            file,
            expert,
            num_experts,
        } => {
            assert_eq!((tensor, expert, num_experts), (extra, E, E));
            assert_eq!(file, dir.join("model.safetensors"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn wrong_dtype_names_expected_and_actual() {
    let mut ck = w4a8();
    let name = format!("{EXPERT1_DOWN}.weight");
    let codes = vec![0u8; H * I * 2];
    ck.put(&name, Dtype::I16, &[H, I], codes);
    let (err, _) = error_of("dtype", &ck);
    match err {
        LayerError::WrongDtype {
            tensor,
            expected,
            actual,
            ..
        } => {
            assert_eq!(tensor, name);
            assert_eq!((expected.as_str(), actual.as_str()), ("i8", "i16"));
        }
        other => panic!("{other:?}"),
    }
    // Float weights: one expert in f16 among bf16 ones.
    let (mut ck, _) = Ckpt::build("qwen3_moe", Fmt::Float, 3);
    let name = "model.layers.0.mlp.experts.2.up_proj.weight";
    ck.tensors.get_mut(name).unwrap().dtype = Dtype::F16;
    match error_of("dtype-float", &ck).0 {
        LayerError::WrongDtype {
            tensor,
            expected,
            actual,
            ..
        } => assert_eq!(
            (tensor.as_str(), expected.as_str(), actual.as_str()),
            (name, "bf16", "f16")
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn wrong_scale_shape_names_expected_and_actual() {
    let mut ck = w4a8();
    let name = format!("{EXPERT1_DOWN}.weight_scale");
    ck.put(
        &name,
        Dtype::BF16,
        &[H, I / G + 1],
        bf16_bytes(&[0.01; H * (I / G + 1)]),
    );
    let (err, _) = error_of("shape", &ck);
    match err {
        LayerError::WrongShape {
            tensor,
            expected,
            actual,
            ..
        } => {
            assert_eq!(tensor, name);
            assert_eq!((expected, actual), (vec![H, I / G], vec![H, I / G + 1]));
        }
        other => panic!("{other:?}"),
    }
    // A 3-D weight where a matrix is expected.
    let mut ck = w4a8();
    let name = format!("{EXPERT1_DOWN}.weight");
    ck.put(&name, Dtype::I8, &[1, H, I], vec![0; H * I]);
    assert!(matches!(
        error_of("shape-3d", &ck).0,
        LayerError::WrongShape { tensor, .. } if tensor == name
    ));
}

#[test]
fn truncated_file_is_an_invalid_safetensors_error_naming_the_file() {
    let dir = temp_dir("truncated");
    w4a8().write(&dir);
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for cut in [bytes.len() - 10, 100, 5] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        for access in [ShardAccess::Read, ShardAccess::Mmap] {
            match Checkpoint::open(&dir, access).unwrap_err() {
                LayerError::InvalidSafetensors { file, .. } => assert_eq!(file, path),
                other => panic!("cut {cut}: {other:?}"),
            }
        }
    }
}

#[test]
fn header_offsets_past_the_end_are_refused() {
    let dir = temp_dir("offsets");
    let mut ck = w4a8();
    ck.write(&dir);
    // Hand-written file: the header claims 16 bytes of data, the file holds 8.
    let header =
        br#"{"model.layers.0.mlp.gate.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(&[0u8; 8]);
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &file).unwrap();
    match Checkpoint::open(&dir, ShardAccess::Read).unwrap_err() {
        LayerError::InvalidSafetensors { file, reason } => {
            assert_eq!(file, path);
            assert!(!reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
    // A header length beyond the file.
    let mut file = (1u64 << 20).to_le_bytes().to_vec();
    file.extend_from_slice(b"{}");
    std::fs::write(&path, &file).unwrap();
    assert!(matches!(
        Checkpoint::open(&dir, ShardAccess::Mmap).unwrap_err(),
        LayerError::InvalidSafetensors { file, .. } if file == path
    ));
    // The same in a lazily opened shard: the error comes from read_layer and names the shard.
    let dir = temp_dir("offsets-sharded");
    ck.config["num_hidden_layers"] = json!(1);
    ck.write_sharded(&dir, 2);
    let shard = dir.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    match load(&dir).unwrap_err() {
        LayerError::InvalidSafetensors { file, .. } => assert_eq!(file, shard),
        other => panic!("{other:?}"),
    }
}

#[test]
fn config_disagreeing_with_tensors_names_field_file_and_tensor() {
    let mut ck = w4a8();
    ck.config["moe_intermediate_size"] = json!(2 * I);
    let (err, dir) = error_of("config-inter", &ck);
    match &err {
        LayerError::ConfigMismatch {
            config,
            tensor,
            file,
            field,
            config_value,
            tensor_value,
        } => {
            assert_eq!(config, &dir.join("config.json"));
            assert_eq!(file, &dir.join("model.safetensors"));
            assert_eq!(tensor, "model.layers.0.mlp.experts.0.gate_proj.weight");
            assert_eq!(
                (*field, *config_value, *tensor_value),
                ("moe_intermediate_size", 2 * I, I)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("config.json"), "{err}");

    let mut ck = w4a8();
    ck.config["hidden_size"] = json!(2 * H);
    match error_of("config-hidden", &ck).0 {
        LayerError::ConfigMismatch { tensor, field, .. } => {
            assert_eq!(tensor, "model.layers.0.mlp.gate.weight");
            assert_eq!(field, "hidden_size");
        }
        other => panic!("{other:?}"),
    }

    let mut ck = w4a8();
    ck.config["num_experts"] = json!(E + 1);
    match error_of("config-experts", &ck).0 {
        LayerError::ConfigMismatch { field, .. } => assert_eq!(field, "num_experts"),
        other => panic!("{other:?}"),
    }

    // pack-quantized: weight_shape disagrees with the config.
    let (mut ck, _) = Ckpt::build("qwen3_moe", Fmt::PackQuantized, 5);
    ck.config["hidden_size"] = json!(H + 8);
    ck.tensors.remove("model.layers.0.mlp.gate.weight");
    ck.put(
        "model.layers.0.mlp.gate.weight",
        Dtype::BF16,
        &[E, H + 8],
        bf16_bytes(&vec![0.0; E * (H + 8)]),
    );
    match error_of("config-packed", &ck).0 {
        LayerError::ConfigMismatch { tensor, field, .. } => {
            assert_eq!(
                tensor,
                "model.layers.0.mlp.experts.0.gate_proj.weight_shape"
            );
            assert_eq!(field, "hidden_size");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_schemes_are_named() {
    let cases = [
        (
            json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}),
            "awq",
        ),
        (json!({"quant_method": "fp8"}), "fp8"),
        (
            json!({"quant_method": "gptq", "bits": 3, "group_size": 128}),
            "gptq",
        ),
    ];
    for (i, (qc, scheme_name)) in cases.into_iter().enumerate() {
        let mut ck = w4a8();
        ck.config["quantization_config"] = qc;
        let (err, dir) = error_of(&format!("scheme-{i}"), &ck);
        match err {
            LayerError::UnsupportedScheme { file, scheme, .. } => {
                assert_eq!(scheme, scheme_name);
                assert_eq!(file, dir.join("config.json"));
            }
            other => panic!("{scheme_name}: {other:?}"),
        }
    }
    // compressed-tensors variants outside W4A8-int and WNA16.
    let mut ck = w4a8();
    let qc = &mut ck.config["quantization_config"];
    qc["config_groups"]["group_0"]["weights"]["type"] = json!("float");
    qc["config_groups"]["group_0"]["weights"]["num_bits"] = json!(8);
    assert!(matches!(
        error_of("scheme-fp8", &ck).0,
        LayerError::UnsupportedScheme { scheme, .. } if scheme == "compressed-tensors/int-quantized"
    ));
    let mut ck = w4a8();
    ck.config["quantization_config"]["config_groups"]["group_0"]["format"] = json!("marlin-24");
    assert!(matches!(
        error_of("scheme-marlin-24", &ck).0,
        LayerError::UnsupportedScheme { scheme, .. } if scheme == "compressed-tensors/marlin-24"
    ));
    // `naive-quantized` stores the same int8 tensors as `int-quantized`, and is read so.
    let mut ck = w4a8();
    ck.config["quantization_config"]["config_groups"]["group_0"]["format"] =
        json!("naive-quantized");
    let spec = moe_layer::checkpoint::MoeModelSpec::from_json_str(
        std::path::Path::new("config.json"),
        &ck.config.to_string(),
    )
    .unwrap();
    assert_eq!(spec.quant.name(), "compressed-tensors/int-quantized");
    let mut ck = w4a8();
    ck.config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["dynamic"] =
        json!(false);
    match error_of("scheme-static-act", &ck).0 {
        LayerError::UnsupportedScheme { reason, .. } => assert!(
            reason.contains("W4A8-int MoE needs dynamic per-token activation quantization."),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    // An unknown family.
    let mut ck = w4a8();
    ck.config["model_type"] = json!("llama");
    assert!(matches!(
        error_of("family", &ck).0,
        LayerError::UnsupportedModel { model_type, .. } if model_type == "llama"
    ));
}

#[test]
fn bad_scales_are_named_with_their_index() {
    for (i, bad) in [f32::NAN, f32::INFINITY, -0.5].into_iter().enumerate() {
        let mut ck = w4a8();
        let name = format!("{EXPERT1_DOWN}.weight_scale");
        let mut scales = vec![0.01f32; H * I / G];
        scales[5] = bad;
        ck.put(&name, Dtype::BF16, &[H, I / G], bf16_bytes(&scales));
        let (err, dir) = error_of(&format!("scale-{i}"), &ck);
        match err {
            LayerError::BadScale {
                tensor,
                file,
                index,
                value,
            } => {
                assert_eq!((tensor, index), (name, 5));
                assert_eq!(file, dir.join("model.safetensors"));
                assert!(value.is_nan() || value == bad);
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    // NaN in a GPTQ (transposed) scale tensor, named by its stored index.
    let (mut ck, _) = Ckpt::build("qwen3_moe", Fmt::Gptq, 9);
    let name = format!("{EXPERT1_DOWN}.scales");
    let mut s = [half::f16::from_f32(0.01); I / G * H];
    s[3] = half::f16::NAN;
    let bytes = s.iter().flat_map(|x| x.to_le_bytes()).collect();
    ck.put(&name, Dtype::F16, &[I / G, H], bytes);
    assert!(matches!(
        error_of("scale-gptq", &ck).0,
        LayerError::BadScale { tensor, index: 3, .. } if tensor == name
    ));
}

#[test]
fn codes_outside_int4_and_bad_group_sizes_are_refused() {
    let mut ck = w4a8();
    let name = format!("{EXPERT1_DOWN}.weight");
    let mut codes = vec![0u8; H * I];
    codes[7] = 9;
    ck.put(&name, Dtype::I8, &[H, I], codes);
    assert!(matches!(
        error_of("code-range", &ck).0,
        LayerError::CodeOutOfRange { tensor, index: 7, value: 9, .. } if tensor == name
    ));

    let mut ck = w4a8();
    ck.config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] =
        json!(3);
    match error_of("group-size", &ck).0 {
        // Whichever reduction dimension is checked first (I before any tensor is read).
        LayerError::GroupSizeNotDividing { group_size, k, .. } => {
            assert_eq!(group_size, 3);
            assert!(k == H || k == I, "{k}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tensor_parallel_and_expert_map_requests_are_checked() {
    let dir = temp_dir("parallel");
    w4a8().write(&dir);
    let tp = |rank, size| ReadOptions::single_rank().with_tensor_parallel(rank, size);
    // I = 8 splits over 2 ranks only into 4 columns, less than a group of 8.
    for opts in [tp(0, 2), tp(0, 3), tp(2, 2), tp(0, 0)] {
        assert!(
            matches!(
                load_with(&dir, &opts),
                Err(LayerError::TensorParallel { .. })
            ),
            "{opts:?}"
        );
    }
    let maps: [&[i32]; 4] = [
        &[0, -1, 1],
        &[0, 0, -1, -1],
        &[0, 2, -1, -1],
        &[0, -2, 1, -1],
    ];
    for map in maps {
        let opts = ReadOptions::single_rank().with_expert_map(Some(map));
        assert!(
            matches!(load_with(&dir, &opts), Err(LayerError::ExpertMap { .. })),
            "{map:?}"
        );
    }
    let ckpt = Checkpoint::open(&dir, ShardAccess::Read).unwrap();
    assert!(matches!(
        ckpt.read_layer(1, &ReadOptions::single_rank()),
        Err(LayerError::NotMoeLayer { layer: 1, .. })
    ));
}

#[test]
fn broken_json_and_missing_files_are_typed() {
    let dir = temp_dir("json");
    w4a8().write(&dir);
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    assert!(matches!(
        Checkpoint::open(&dir, ShardAccess::Read).unwrap_err(),
        LayerError::JsonParse { file, .. } if file == dir.join("config.json")
    ));
    let mut ck = w4a8();
    ck.config
        .as_object_mut()
        .unwrap()
        .remove("num_experts_per_tok");
    let dir = temp_dir("json-field");
    ck.write(&dir);
    assert!(matches!(
        Checkpoint::open(&dir, ShardAccess::Read).unwrap_err(),
        LayerError::ConfigField {
            field: "num_experts_per_tok",
            ..
        }
    ));
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    w4a8().write(&dir);
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert!(matches!(
        Checkpoint::open(&dir, ShardAccess::Read).unwrap_err(),
        LayerError::NoWeights { .. }
    ));
    // An index naming a shard that does not exist.
    let dir = temp_dir("json-shard");
    w4a8().write_sharded(&dir, 2);
    std::fs::remove_file(dir.join("model-00001-of-00002.safetensors")).unwrap();
    assert!(matches!(
        load(&dir).unwrap_err(),
        LayerError::Io { file, .. } if file == dir.join("model-00001-of-00002.safetensors")
    ));
    // An index escaping the directory.
    let dir = temp_dir("json-escape");
    w4a8().write_sharded(&dir, 1);
    let index = json!({"weight_map": {"a": "../x.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    assert!(matches!(
        Checkpoint::open(&dir, ShardAccess::Read).unwrap_err(),
        LayerError::JsonParse { .. }
    ));
}
