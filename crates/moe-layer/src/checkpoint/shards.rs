//! The safetensors shards of a model directory, behind one [`TensorSource`] that finds a
//! tensor by name whichever shard holds it.
//!
//! A directory holds either one `model.safetensors` or a `model.safetensors.index.json` whose
//! `weight_map` sends each tensor name to a shard file. Shards are opened lazily, on the first
//! lookup of a tensor they hold, so reading one layer of a large sharded model touches only the
//! shards that layer lives in. Every shard's header is validated by the safetensors crate when it
//! is opened (header length, JSON, contiguous offsets, sizes matching dtype × shape, and a data
//! section that ends exactly at the end of the file); a truncated file or offsets past the end
//! become [`LayerError::InvalidSafetensors`] naming the file.
//!
//! Shard bytes are read into memory by default ([`ShardAccess::Read`]). [`ShardAccess::Mmap`]
//! maps them instead, which is the one place the crate uses `unsafe` (see `map_file` and the [`crate::checkpoint`] module docs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use safetensors::Dtype;
use safetensors::SafeTensors;
use safetensors::tensor::{Metadata, TensorInfo};
use serde::Deserialize;

use crate::error::LayerError;

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// How shard bytes are brought into memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardAccess {
    /// `std::fs::read` the whole shard (safe; costs memory and a copy).
    Read,
    /// Memory-map the shard (no copy; the file must not be truncated or rewritten while the
    /// [`TensorSource`] lives, see `map_file`).
    Mmap,
}

/// The bytes of one shard file.
enum ShardBytes {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl ShardBytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            ShardBytes::Owned(v) => v,
            ShardBytes::Mapped(m) => m,
        }
    }
}

/// One opened, header-validated shard.
struct Shard {
    bytes: ShardBytes,
    /// Offset of the data section (8-byte length prefix + JSON header).
    data_start: usize,
    metadata: Metadata,
}

impl Shard {
    fn open(path: &Path, access: ShardAccess) -> Result<Self, LayerError> {
        let io = |source| LayerError::Io {
            file: path.to_path_buf(),
            source,
        };
        let bytes = match access {
            ShardAccess::Read => ShardBytes::Owned(std::fs::read(path).map_err(io)?),
            ShardAccess::Mmap => {
                let file = std::fs::File::open(path).map_err(io)?;
                ShardBytes::Mapped(map_file(&file).map_err(io)?)
            }
        };
        let (header_len, metadata) = SafeTensors::read_metadata(bytes.as_slice()).map_err(|e| {
            LayerError::InvalidSafetensors {
                file: path.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        Ok(Self {
            bytes,
            data_start: 8 + header_len,
            metadata,
        })
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> &'a [u8] {
        let (start, end) = info.data_offsets;
        // `read_metadata` checked that the offsets are contiguous and end exactly at the end of
        // the buffer, so this range is in bounds.
        &self.bytes.as_slice()[self.data_start + start..self.data_start + end]
    }
}

/// Memory-maps a whole file read-only. The only `unsafe` code of moe-layer.
///
/// A mapping is only sound while no one truncates or rewrites the file: a truncated file makes
/// reads of the lost pages fault (SIGBUS), and a rewrite changes bytes we already validated.
/// Model checkpoints are immutable inputs, so callers who pick [`ShardAccess::Mmap`] accept that
/// hazard in exchange for not copying multi-gigabyte shards; [`ShardAccess::Read`] (the default
/// of [`TensorSource::open`]) has none of it.
#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and private to this process; `Mmap::map` is unsafe only
    // because another process could truncate or modify the file while it is mapped, which the
    // caller accepted by choosing `ShardAccess::Mmap` (documented on that variant and above).
    unsafe { memmap2::Mmap::map(file) }
}

/// A tensor found in a shard: its name, the file holding it, dtype, shape and bytes.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    /// The tensor name.
    pub name: String,
    /// The shard file holding it.
    pub file: &'a Path,
    /// The stored element type.
    pub dtype: Dtype,
    /// The stored shape.
    pub shape: &'a [usize],
    /// The raw little-endian bytes, borrowed from the shard (`dtype` size × element count).
    pub bytes: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Returns [`LayerError::WrongDtype`] unless the dtype is one of `allowed`.
    pub fn expect_dtype(&self, allowed: &[Dtype]) -> Result<(), LayerError> {
        if allowed.contains(&self.dtype) {
            return Ok(());
        }
        Err(LayerError::WrongDtype {
            tensor: self.name.clone(),
            file: self.file.to_path_buf(),
            expected: allowed
                .iter()
                .map(|d| dtype_name(*d))
                .collect::<Vec<_>>()
                .join(" or "),
            actual: dtype_name(self.dtype),
        })
    }

    /// Returns [`LayerError::WrongShape`] unless the shape is exactly `expected`.
    pub fn expect_shape(&self, expected: &[usize]) -> Result<(), LayerError> {
        if self.shape == expected {
            return Ok(());
        }
        Err(LayerError::WrongShape {
            tensor: self.name.clone(),
            file: self.file.to_path_buf(),
            expected: expected.to_vec(),
            actual: self.shape.to_vec(),
        })
    }
}

/// The PyTorch-style abbreviation of a safetensors dtype (`bf16`, `i32`, ...).
pub fn dtype_name(d: Dtype) -> String {
    match d {
        Dtype::BOOL => "bool".into(),
        Dtype::U8 => "u8".into(),
        Dtype::I8 => "i8".into(),
        Dtype::I16 => "i16".into(),
        Dtype::U16 => "u16".into(),
        Dtype::I32 => "i32".into(),
        Dtype::U32 => "u32".into(),
        Dtype::I64 => "i64".into(),
        Dtype::U64 => "u64".into(),
        Dtype::F16 => "f16".into(),
        Dtype::BF16 => "bf16".into(),
        Dtype::F32 => "f32".into(),
        Dtype::F64 => "f64".into(),
        other => format!("{other:?}"),
    }
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

/// All tensors of a model directory, found by name across shards.
pub struct TensorSource {
    /// The shard index, when the directory has one (named for tensors it does not list).
    index_path: Option<PathBuf>,
    /// Tensor name → position in `files`.
    weight_map: BTreeMap<String, usize>,
    files: Vec<PathBuf>,
    shards: Vec<OnceLock<Shard>>,
    access: ShardAccess,
}

impl std::fmt::Debug for TensorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorSource")
            .field("files", &self.files)
            .field("tensors", &self.weight_map.len())
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl TensorSource {
    /// Opens the weights of a model directory: `model.safetensors.index.json` if present
    /// (shards are opened on first use), otherwise `model.safetensors` (opened and validated
    /// now).
    pub fn open(dir: &Path, access: ShardAccess) -> Result<Self, LayerError> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            return Self::open_indexed(dir, index_path, access);
        }
        let single = dir.join(SINGLE_FILE);
        if !single.is_file() {
            return Err(LayerError::NoWeights {
                dir: dir.to_path_buf(),
            });
        }
        let shard = Shard::open(&single, access)?;
        let weight_map = shard
            .metadata
            .offset_keys()
            .into_iter()
            .map(|n| (n, 0))
            .collect();
        Ok(Self {
            index_path: None,
            weight_map,
            files: vec![single],
            shards: vec![OnceLock::from(shard)],
            access,
        })
    }

    fn open_indexed(
        dir: &Path,
        index_path: PathBuf,
        access: ShardAccess,
    ) -> Result<Self, LayerError> {
        let text = std::fs::read_to_string(&index_path).map_err(|source| LayerError::Io {
            file: index_path.clone(),
            source,
        })?;
        let index: IndexFile = serde_json::from_str(&text).map_err(|e| LayerError::JsonParse {
            file: index_path.clone(),
            message: e.to_string(),
        })?;
        let mut files: Vec<PathBuf> = Vec::new();
        let mut weight_map = BTreeMap::new();
        for (name, file) in index.weight_map {
            // Shards live next to the index; anything else (paths, `..`) is refused.
            let plain = matches!(
                Path::new(&file).components().collect::<Vec<_>>().as_slice(),
                [std::path::Component::Normal(_)]
            );
            if !plain {
                return Err(LayerError::JsonParse {
                    file: index_path.clone(),
                    message: format!("weight_map[{name:?}] = {file:?} is not a plain file name"),
                });
            }
            let path = dir.join(&file);
            let slot = match files.iter().position(|f| *f == path) {
                Some(i) => i,
                None => {
                    files.push(path);
                    files.len() - 1
                }
            };
            weight_map.insert(name, slot);
        }
        let shards = files.iter().map(|_| OnceLock::new()).collect();
        Ok(Self {
            index_path: Some(index_path),
            weight_map,
            files,
            shards,
            access,
        })
    }

    /// Every tensor name with the file that holds it (for an index, the file the index names),
    /// in ascending name order.
    pub fn names(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.weight_map
            .iter()
            .map(|(n, &i)| (n.as_str(), self.files[i].as_path()))
    }

    /// Whether the checkpoint has a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.weight_map.contains_key(name)
    }

    /// The file a tensor is (or would be) in: the shard holding it, the index for a name it
    /// does not list, or `model.safetensors`.
    pub fn file_of(&self, name: &str) -> &Path {
        match (self.weight_map.get(name), &self.index_path) {
            (Some(&i), _) => &self.files[i],
            (None, Some(index)) => index,
            (None, None) => &self.files[0],
        }
    }

    /// Finds a tensor by name. Errors: [`LayerError::MissingTensor`] (not in the checkpoint, or
    /// not in the shard the index names), and shard open or validation errors.
    pub fn get(&self, name: &str) -> Result<TensorRef<'_>, LayerError> {
        let missing = |file: &Path| LayerError::MissingTensor {
            tensor: name.to_string(),
            file: file.to_path_buf(),
        };
        let Some(&slot) = self.weight_map.get(name) else {
            return Err(missing(self.file_of(name)));
        };
        let file = self.files[slot].as_path();
        let shard = self.shard(slot)?;
        let info = shard.metadata.info(name).ok_or_else(|| missing(file))?;
        Ok(TensorRef {
            name: name.to_string(),
            file,
            dtype: info.dtype,
            shape: &info.shape,
            bytes: shard.view(info),
        })
    }

    /// Like [`TensorSource::get`], then checks the dtype is one of `dtypes`.
    pub fn get_as(&self, name: &str, dtypes: &[Dtype]) -> Result<TensorRef<'_>, LayerError> {
        let t = self.get(name)?;
        t.expect_dtype(dtypes)?;
        Ok(t)
    }

    fn shard(&self, slot: usize) -> Result<&Shard, LayerError> {
        let cell = &self.shards[slot];
        if let Some(s) = cell.get() {
            return Ok(s);
        }
        let opened = Shard::open(&self.files[slot], self.access)?;
        Ok(cell.get_or_init(|| opened))
    }
}
