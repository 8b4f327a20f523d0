//! Maps a function over `0..n` on the current rayon pool ([`Par::Rayon`] with the `rayon`
//! feature) or on the calling thread, returning the results in index order, so that what is
//! built (and which error is reported first) never depends on the thread count.

use moe_kernels::Par;

/// `(0..n).map(f).collect()`, spread over the current rayon pool when `par` allows it.
pub(crate) fn map_indexed<T: Send>(
    n: usize,
    par: Par,
    f: impl Fn(usize) -> T + Sync + Send,
) -> Vec<T> {
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
