//! How work is split over threads: [`Par`] and the few splitting helpers every parallel caller
//! uses, in one place for the whole workspace.
//!
//! This is the only module that names rayon. With the `rayon` feature off, each helper runs
//! its work on the calling thread, in index order, so callers need no `cfg` of their own.
//!
//! Every helper hands each index, range or chunk to exactly one call and never combines
//! results across calls in a thread-dependent order, so whatever the callers compute does not
//! depend on the number of threads.

use std::ops::Range;

/// How a GEMM (or any other splittable job) may use threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Par {
    /// On the calling thread only.
    Seq,
    /// Split over the current rayon pool (install a pool with `ThreadPool::install` to choose
    /// its size; this crate never builds the global pool). Without the `rayon` feature this is
    /// the same as `Seq`.
    Rayon,
}

/// Below this many multiply-accumulates a GEMM runs on one thread: splitting would cost more.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// Runs `f` over a partition of `0..n_panels` into contiguous ranges; `macs` is the work of the
/// whole call, which decides whether splitting is worth it.
pub(crate) fn split_panels(
    n_panels: usize,
    par: Par,
    macs: usize,
    f: impl Fn(Range<usize>) + Sync,
) {
    if n_panels == 0 {
        return;
    }
    match par {
        Par::Rayon if macs >= PARALLEL_MIN_MACS && n_panels > 1 => par_split(n_panels, &f),
        _ => f(0..n_panels),
    }
}

#[cfg(feature = "rayon")]
fn par_split(n_panels: usize, f: &(impl Fn(Range<usize>) + Sync)) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return f(0..n_panels);
    }
    // A few chunks per thread balance uneven progress without making chunks tiny.
    let chunks = n_panels.min(threads * 4);
    (0..chunks)
        .into_par_iter()
        .for_each(|c| f(c * n_panels / chunks..(c + 1) * n_panels / chunks));
}

#[cfg(not(feature = "rayon"))]
fn par_split(n_panels: usize, f: &(impl Fn(Range<usize>) + Sync)) {
    f(0..n_panels)
}

/// Calls `job(scratch, index, chunk)` for every `chunk_len`-sized chunk of `data` (the last may be
/// shorter), on the current rayon pool when `par` is [`Par::Rayon`] and the `rayon` feature is
/// on, otherwise in order on the calling thread. `init` makes one scratch value per worker.
pub(crate) fn for_each_chunk<T, S>(
    data: &mut [T],
    chunk_len: usize,
    par: Par,
    init: impl Fn() -> S + Sync + Send,
    job: impl Fn(&mut S, usize, &mut [T]) + Sync + Send,
) where
    T: Send,
{
    if chunk_len == 0 || data.is_empty() {
        return;
    }
    match par {
        Par::Rayon if data.len() > chunk_len => par_chunks(data, chunk_len, &init, &job),
        _ => seq_chunks(data, chunk_len, &init, &job),
    }
}

fn seq_chunks<T, S>(
    data: &mut [T],
    chunk_len: usize,
    init: &impl Fn() -> S,
    job: &impl Fn(&mut S, usize, &mut [T]),
) {
    let mut scratch = init();
    for (i, chunk) in data.chunks_mut(chunk_len).enumerate() {
        job(&mut scratch, i, chunk);
    }
}

#[cfg(feature = "rayon")]
fn par_chunks<T: Send, S>(
    data: &mut [T],
    chunk_len: usize,
    init: &(impl Fn() -> S + Sync + Send),
    job: &(impl Fn(&mut S, usize, &mut [T]) + Sync + Send),
) {
    use rayon::prelude::*;
    data.par_chunks_mut(chunk_len)
        .enumerate()
        .for_each_init(init, |scratch, (i, chunk)| job(scratch, i, chunk));
}

#[cfg(not(feature = "rayon"))]
fn par_chunks<T: Send, S>(
    data: &mut [T],
    chunk_len: usize,
    init: &(impl Fn() -> S + Sync + Send),
    job: &(impl Fn(&mut S, usize, &mut [T]) + Sync + Send),
) {
    seq_chunks(data, chunk_len, init, job)
}

/// `(0..n).map(f).collect()`, spread over the current rayon pool when `par` allows it.
///
/// The results come back in index order whatever the thread count, so what a caller builds
/// from them (and which error it reports first) never depends on it.
pub fn map_indexed<T: Send>(n: usize, par: Par, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    match par {
        Par::Rayon if n > 1 => par_map(n, &f),
        _ => (0..n).map(f).collect(),
    }
}

#[cfg(feature = "rayon")]
fn par_map<T: Send>(n: usize, f: &(impl Fn(usize) -> T + Sync + Send)) -> Vec<T> {
    use rayon::prelude::*;
    (0..n).into_par_iter().map(f).collect()
}

#[cfg(not(feature = "rayon"))]
fn par_map<T: Send>(n: usize, f: &(impl Fn(usize) -> T + Sync + Send)) -> Vec<T> {
    (0..n).map(f).collect()
}

/// Runs both closures, on two rayon tasks when the feature is on, else `a` then `b`.
#[cfg(feature = "rayon")]
pub(crate) fn join<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    rayon::join(a, b)
}

/// Runs both closures, on two rayon tasks when the feature is on, else `a` then `b`.
#[cfg(not(feature = "rayon"))]
pub(crate) fn join<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    (a(), b())
}

/// Threads of the current rayon pool (1 without the feature).
#[cfg(feature = "rayon")]
pub(crate) fn pool_threads() -> usize {
    rayon::current_num_threads()
}

/// Threads of the current rayon pool (1 without the feature).
#[cfg(not(feature = "rayon"))]
pub(crate) fn pool_threads() -> usize {
    1
}
