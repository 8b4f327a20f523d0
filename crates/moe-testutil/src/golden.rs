//! The golden-vector harness: locate the goldens, read one safetensors case, run a check over
//! every case of an area and report failures by file name.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// The workspace root (two levels above this crate's manifest).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("moe-testutil lives at <root>/crates/moe-testutil")
        .to_path_buf()
}

/// The goldens directory: `$MOE_GOLDENS`, else `<root>/../shared/goldens`.
pub fn goldens_dir() -> PathBuf {
    match std::env::var_os("MOE_GOLDENS") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("../shared/goldens"),
    }
}

/// The fixtures directory: `$MOE_FIXTURES`, else `<root>/../shared/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("MOE_FIXTURES") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace_root().join("../shared/fixtures"),
    }
}

/// One golden case: a safetensors file held in memory.
pub struct GoldenCase {
    /// File name, e.g. `e4_h64_i32_m1_k2_bfloat16.safetensors`.
    pub name: String,
    /// Full path of the file.
    pub path: PathBuf,
    bytes: Vec<u8>,
    metadata: HashMap<String, String>,
}

impl GoldenCase {
    /// Reads and parses one case file.
    pub fn open(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (_, meta) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| format!("{}: bad safetensors header: {e}", path.display()))?;
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(Self {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            path: path.to_path_buf(),
            bytes,
            metadata,
        })
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("header was parsed in open()")
    }

    /// Whether the case holds a tensor of that name.
    pub fn has(&self, name: &str) -> bool {
        self.tensors().tensor(name).is_ok()
    }

    /// The raw metadata string (JSON-encoded) for `key`.
    pub fn meta_raw(&self, key: &str) -> Option<&str> {
        self.metadata.get(key).map(String::as_str)
    }

    /// The metadata value for `key`, JSON-decoded. Panics with the case name when absent.
    pub fn meta(&self, key: &str) -> serde_json::Value {
        let raw = self
            .meta_raw(key)
            .unwrap_or_else(|| panic!("{}: no metadata key {key:?}", self.name));
        serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.to_string()))
    }

    /// Metadata as an integer (accepts `"32"` and `32`).
    pub fn meta_i64(&self, key: &str) -> i64 {
        let v = self.meta(key);
        v.as_i64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("{}: metadata {key} = {v} is not an integer", self.name))
    }

    /// Metadata as a bool (accepts `"true"` and `true`).
    pub fn meta_bool(&self, key: &str) -> bool {
        let v = self.meta(key);
        v.as_bool()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .unwrap_or_else(|| panic!("{}: metadata {key} = {v} is not a bool", self.name))
    }

    /// Metadata as a string (JSON strings are unquoted).
    pub fn meta_str(&self, key: &str) -> String {
        match self.meta(key) {
            serde_json::Value::String(s) => s,
            other => other.to_string(),
        }
    }

    /// The tensor's shape and dtype.
    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.view(name, |v| v.shape().to_vec())
    }

    /// The tensor's safetensors dtype.
    pub fn dtype(&self, name: &str) -> Dtype {
        self.view(name, |v| v.dtype())
    }

    fn view<R>(&self, name: &str, f: impl FnOnce(&safetensors::tensor::TensorView<'_>) -> R) -> R {
        let st = self.tensors();
        let v = st
            .tensor(name)
            .unwrap_or_else(|e| panic!("{}: tensor {name:?}: {e}", self.name));
        f(&v)
    }

    /// Raw little-endian bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Vec<u8> {
        self.view(name, |v| v.data().to_vec())
    }

    /// A float tensor (f32, bf16 or f16) widened to f32; panics on other dtypes.
    pub fn f32s(&self, name: &str) -> Vec<f32> {
        let (dtype, data) = self.view(name, |v| (v.dtype(), v.data().to_vec()));
        match dtype {
            Dtype::F32 => le_chunks::<4>(&data).map(f32::from_le_bytes).collect(),
            Dtype::BF16 => le_chunks::<2>(&data)
                .map(|b| half::bf16::from_le_bytes(b).to_f32())
                .collect(),
            Dtype::F16 => le_chunks::<2>(&data)
                .map(|b| half::f16::from_le_bytes(b).to_f32())
                .collect(),
            other => panic!("{}: tensor {name:?} is {other:?}, not a float", self.name),
        }
    }

    /// A 16-bit float tensor as raw bits (bf16 or f16); panics on other dtypes.
    pub fn u16_bits(&self, name: &str) -> Vec<u16> {
        let (dtype, data) = self.view(name, |v| (v.dtype(), v.data().to_vec()));
        assert!(
            matches!(dtype, Dtype::BF16 | Dtype::F16),
            "{}: tensor {name:?} is {dtype:?}, not 16-bit float",
            self.name
        );
        le_chunks::<2>(&data).map(u16::from_le_bytes).collect()
    }

    /// An integer tensor (i8, u8, i16, i32, i64 or bool) widened to i64.
    pub fn i64s(&self, name: &str) -> Vec<i64> {
        let (dtype, data) = self.view(name, |v| (v.dtype(), v.data().to_vec()));
        match dtype {
            Dtype::I8 => data.iter().map(|&b| b as i8 as i64).collect(),
            Dtype::U8 | Dtype::BOOL => data.iter().map(|&b| b as i64).collect(),
            Dtype::I16 => le_chunks::<2>(&data)
                .map(|b| i16::from_le_bytes(b) as i64)
                .collect(),
            Dtype::I32 => le_chunks::<4>(&data)
                .map(|b| i32::from_le_bytes(b) as i64)
                .collect(),
            Dtype::I64 => le_chunks::<8>(&data).map(i64::from_le_bytes).collect(),
            other => panic!(
                "{}: tensor {name:?} is {other:?}, not an integer",
                self.name
            ),
        }
    }

    /// An i8 tensor; panics on other dtypes.
    pub fn i8s(&self, name: &str) -> Vec<i8> {
        let (dtype, data) = self.view(name, |v| (v.dtype(), v.data().to_vec()));
        assert_eq!(dtype, Dtype::I8, "{}: tensor {name:?}", self.name);
        data.iter().map(|&b| b as i8).collect()
    }
}

fn le_chunks<const N: usize>(data: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    data.chunks_exact(N).map(|c| c.try_into().unwrap())
}

/// Runs `check` on every `.safetensors` case of `<goldens>/<area>/`, in file-name order.
///
/// Panics when the area holds no case (a missing directory must not pass as success), and after
/// running every case, when any failed, listing each failing file with its message.
pub fn for_each_golden_case(area: &str, mut check: impl FnMut(&GoldenCase) -> Result<(), String>) {
    let dir = goldens_dir().join(area);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("golden area {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "golden area {} holds no .safetensors case",
        dir.display()
    );
    let mut failures = String::new();
    let mut failed = 0;
    for path in &files {
        let outcome = GoldenCase::open(path).and_then(|case| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&case)))
                .unwrap_or_else(|p| Err(panic_message(&p)))
        });
        if let Err(msg) = outcome {
            failed += 1;
            let name = path.file_name().unwrap().to_string_lossy();
            let _ = writeln!(failures, "  {name}: {msg}");
        }
    }
    assert!(
        failed == 0,
        "{failed} of {} golden cases in {area}/ failed:\n{failures}",
        files.len()
    );
    eprintln!("golden area {area}: {} cases passed", files.len());
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}
