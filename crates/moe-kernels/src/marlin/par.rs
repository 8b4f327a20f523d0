//! Runs a job over the fixed-size chunks of an output buffer, sequentially or on the current
//! rayon pool ([`Par`]), with one reusable scratch value per worker.
//!
//! Every chunk is written by exactly one call, so results never depend on the thread count.

use crate::Par;

/// Calls `job(scratch, index, chunk)` for every `chunk_len`-sized chunk of `data` (the last may be
/// shorter), on the current rayon pool when `par` is [`Par::Rayon`] and the `rayon` feature is
/// on, otherwise in order on the calling thread.
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
        _ => {
            let mut scratch = init();
            for (i, chunk) in data.chunks_mut(chunk_len).enumerate() {
                job(&mut scratch, i, chunk);
            }
        }
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
    let mut scratch = init();
    for (i, chunk) in data.chunks_mut(chunk_len).enumerate() {
        job(&mut scratch, i, chunk);
    }
}
