//! The handle registry: what a `MoeLayerHandle*` is and how it is checked.
//!
//! A handle is never dereferenced. It is a key (a number from a counter that never repeats,
//! cast to a pointer) into a process-wide table of live layers. So a handle that was freed, or
//! was never handed out, is reported as `MOE_STATUS_INVALID_HANDLE` instead of touching freed
//! memory, and freeing twice is an error, not a crash. Each entry is reference counted: a call
//! holds its own reference while it runs, so `moe_layer_free` racing with an `apply` on another
//! thread only unregisters the handle, and the layer is dropped when the last call finishes.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use moe_layer::MoeLayer;

use crate::status::{CapiError, MoeStatus};

/// An opaque MoE layer; C code only ever holds pointers to it.
pub struct MoeLayerHandle {
    _opaque: [u8; 0],
}

/// The backend names of a processed layer, as C strings that live as long as the entry.
#[derive(Debug)]
pub(crate) struct BackendNames {
    pub(crate) backend: CString,
    pub(crate) kernel: CString,
    pub(crate) isa: CString,
    /// What the kernels run per operation, one line each, joined by `\n`.
    pub(crate) ops: CString,
}

/// One live layer with what the C side needs next to it.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Loading and processing take the write lock; `apply` takes the read lock, so calls on
    /// one layer from many threads run concurrently.
    pub(crate) layer: RwLock<MoeLayer>,
    /// Filled once, on the first `moe_layer_backend` after `process`.
    pub(crate) names: OnceLock<BackendNames>,
    /// A private pool for `apply`, when the host asked for a thread count of 2 or more.
    pub(crate) pool: RwLock<Option<Arc<rayon::ThreadPool>>>,
}

/// The first key; any fixed non-zero value works, an odd-looking one makes stray integers
/// less likely to collide with a real handle.
const FIRST_KEY: usize = 0x6d6f_0001;

static NEXT_KEY: AtomicUsize = AtomicUsize::new(FIRST_KEY);
static LIVE: Mutex<BTreeMap<usize, Arc<Entry>>> = Mutex::new(BTreeMap::new());

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, Arc<Entry>>> {
    // The table is only ever inserted into or removed from; a panic cannot leave it
    // half-updated, so a poisoned lock is still consistent.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `layer` and returns its new handle.
pub(crate) fn insert(layer: MoeLayer) -> *mut MoeLayerHandle {
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let entry = Arc::new(Entry {
        layer: RwLock::new(layer),
        names: OnceLock::new(),
        pool: RwLock::new(None),
    });
    live().insert(key, entry);
    std::ptr::without_provenance_mut(key)
}

/// The entry of `handle`, or why there is none.
pub(crate) fn get(handle: *const MoeLayerHandle) -> Result<Arc<Entry>, CapiError> {
    if handle.is_null() {
        return Err(CapiError::null("layer"));
    }
    live()
        .get(&handle.addr())
        .cloned()
        .ok_or_else(|| unknown(handle))
}

/// Unregisters `handle`; the layer is dropped once no call uses it any more.
pub(crate) fn remove(handle: *const MoeLayerHandle) -> Result<(), CapiError> {
    if handle.is_null() {
        return Err(CapiError::null("layer"));
    }
    live()
        .remove(&handle.addr())
        .map(drop)
        .ok_or_else(|| unknown(handle))
}

fn unknown(handle: *const MoeLayerHandle) -> CapiError {
    CapiError::new(
        MoeStatus::InvalidHandle,
        format!("layer handle {handle:p} is not live (already freed, or never created)"),
    )
}

/// The result of a lock, or a status saying an earlier internal error poisoned it.
pub(crate) fn locked<G>(lock: Result<G, impl std::fmt::Display>) -> Result<G, CapiError> {
    lock.map_err(|_| {
        CapiError::new(
            MoeStatus::BadState,
            "the layer is unusable after an internal error in an earlier call; free it",
        )
    })
}
