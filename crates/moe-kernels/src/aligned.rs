//! Heap buffers whose first element sits on a 64-byte boundary.
//!
//! The kernels read packed weights and re-laid activations in 64-byte units (one `zmm` load,
//! one tile row). The system allocator returns large blocks 16 bytes past a page boundary, so
//! in a `Vec<u8>` every such unit would straddle two cache lines and cost two line reads. An
//! [`AlignedVec`] starts its elements on a line instead, so a unit that starts at a multiple
//! of 64 bytes from the first element lies in one line.
//!
//! The storage is a zeroed `Vec<u8>` with 63 spare bytes, the elements starting at its first
//! line boundary. A zeroed byte vector comes from `calloc`, which maps fresh zero pages for a
//! large buffer; an allocation with 64-byte alignment would be zeroed by writing every byte,
//! one more pass over a layer's weights at load.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// Bytes per cache line.
const LINE: usize = 64;

/// Element types an [`AlignedVec`] may hold.
///
/// # Safety
/// Implementors are plain data: every bit pattern of their size is a valid value (all zeros
/// included), they hold no padding and no pointers, and their alignment divides 64.
pub(crate) unsafe trait Plain: Copy + 'static {}

// SAFETY: the primitive integers and floats are plain data of alignment at most 8.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i8 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}
// SAFETY: a transparent wrapper of `u16`: every bit pattern is some bf16 value.
unsafe impl Plain for half::bf16 {}

/// A growable array of `T` whose first element is 64-byte aligned.
pub(crate) struct AlignedVec<T: Plain> {
    /// Zero-initialized storage: the elements and, before and after them, up to 63 spare
    /// bytes.
    bytes: Vec<u8>,
    /// Where the elements start in `bytes`: its first line boundary.
    start: usize,
    /// Elements.
    len: usize,
    elem: PhantomData<T>,
}

impl<T: Plain> AlignedVec<T> {
    /// An empty buffer; it allocates nothing.
    pub(crate) const fn new() -> Self {
        Self {
            bytes: Vec::new(),
            start: 0,
            len: 0,
            elem: PhantomData,
        }
    }

    /// Bytes that `len` elements take.
    fn size_of_len(len: usize) -> usize {
        len.checked_mul(size_of::<T>())
            .expect("buffer size overflows usize")
    }

    /// Zeroed storage for `len` elements, and where they start in it.
    fn storage(len: usize) -> (Vec<u8>, usize) {
        let size = Self::size_of_len(len);
        if size == 0 {
            return (Vec::new(), 0);
        }
        let bytes = vec![0u8; size + LINE - 1];
        let addr = bytes.as_ptr() as usize;
        let start = addr.next_multiple_of(LINE) - addr;
        (bytes, start)
    }

    /// `len` elements of all-zero bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        let (bytes, start) = Self::storage(len);
        Self {
            bytes,
            start,
            len,
            elem: PhantomData,
        }
    }

    /// A copy of `values`.
    pub(crate) fn from_slice(values: &[T]) -> Self {
        let mut v = Self::zeroed(values.len());
        v.copy_from_slice(values);
        v
    }

    /// Elements the storage holds from `start` on.
    fn capacity(&self) -> usize {
        self.bytes.len().saturating_sub(self.start) / size_of::<T>()
    }

    /// Grows the length to `len` if it is shorter, the new elements zero; never shrinks, so a
    /// scratch buffer stops allocating once its largest use is seen. The storage past the
    /// length has never been written (the length only grows, and a new storage is zeroed
    /// before the elements are copied in), so the new elements need no pass to be zero.
    pub(crate) fn grow_to(&mut self, len: usize) {
        if len <= self.len {
            return;
        }
        if len > self.capacity() {
            self.reserve_total(len.max(2 * self.len));
        }
        self.len = len;
    }

    /// An empty buffer with room for `len` elements.
    pub(crate) fn with_capacity(len: usize) -> Self {
        let mut v = Self::new();
        v.reserve_total(len);
        v
    }

    /// Appends `values`.
    pub(crate) fn extend_from_slice(&mut self, values: &[T]) {
        let old = self.len;
        self.grow_to(old + values.len());
        self[old..].copy_from_slice(values);
    }

    /// Makes room for `len` elements without changing the length.
    pub(crate) fn reserve_total(&mut self, len: usize) {
        if len <= self.capacity() {
            return;
        }
        let (mut bytes, start) = Self::storage(len);
        let live = Self::size_of_len(self.len);
        bytes[start..start + live].copy_from_slice(&self.bytes[self.start..self.start + live]);
        self.bytes = bytes;
        self.start = start;
    }
}

impl<T: Plain> Default for AlignedVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Plain> Clone for AlignedVec<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<T: Plain> Deref for AlignedVec<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        let first = self.bytes[self.start..].as_ptr().cast::<T>();
        // SAFETY: `first` is 64-byte aligned (a multiple of `T`'s alignment) and followed by
        // at least `len · size_of::<T>()` initialized bytes of `bytes` (`reserve_total` and
        // `storage` size it so), every bit pattern is a valid `T` (`Plain`), and the borrow of
        // `self` covers the slice's lifetime.
        unsafe { std::slice::from_raw_parts(first, self.len) }
    }
}

impl<T: Plain> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        let first = self.bytes[self.start..].as_mut_ptr().cast::<T>();
        // SAFETY: as in `deref`, with the unique borrow of `self`; any value written is a
        // valid byte pattern for the storage.
        unsafe { std::slice::from_raw_parts_mut(first, self.len) }
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Plain + PartialEq> PartialEq for AlignedVec<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Plain> From<Vec<T>> for AlignedVec<T> {
    fn from(v: Vec<T>) -> Self {
        Self::from_slice(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::AlignedVec;
    use crate::packed::dense::DenseValues;
    use crate::packed::{PANEL, PanelOrder};
    use crate::{PackedDense, PackedW4A8, PackedW8A8, W4A8Scales};

    /// Whether `ptr` starts a cache line.
    fn on_a_line<T>(ptr: *const T) -> bool {
        (ptr as usize).is_multiple_of(64)
    }

    /// Every packed format's panels start on a cache line, in both panel orders: the layout the
    /// kernels' 64-byte loads and tile rows are written for.
    #[test]
    fn packed_panels_start_on_cache_lines() {
        let (n, k) = (40, 192);
        let w8 = PackedW8A8::pack(n, k, &vec![1; n * k], &vec![0.5; n]).unwrap();
        let scales = vec![half::bf16::ONE; n * k / 32];
        let grouped = W4A8Scales::Grouped {
            group_size: 32,
            scales: &scales,
        };
        let w4 = PackedW4A8::pack(n, k, &vec![-3; n * k], grouped, None).unwrap();
        for order in [PanelOrder::Lanes, PanelOrder::Pairs] {
            let (w8, w4) = (w8.clone().with_order(order), w4.clone().with_order(order));
            for p in 0..w8.n_panels() {
                assert!(
                    on_a_line(w8.panel_bytes(p).as_ptr()),
                    "W8A8 panel {p}, {order:?}"
                );
                assert!(
                    on_a_line(w4.panel_nibbles(p).as_ptr()),
                    "W4A8 panel {p}, {order:?}"
                );
            }
        }
        let wna16 = crate::PackedWna16::int4_for_layout(k, 32, true);
        let per_panel = wna16.k_steps() * PANEL;
        for p in 0..wna16.n_panels() {
            assert!(
                on_a_line(wna16.codes()[p * per_panel..].as_ptr()),
                "WNA16 panel {p}"
            );
        }
        let dense = PackedDense::pack_f32(n, k, &vec![0.25; n * k]).unwrap();
        let DenseValues::F32(values) = dense.values() else {
            panic!("f32 weights stay f32");
        };
        for p in 0..dense.n_panels() {
            assert!(
                on_a_line(values[p * k * PANEL..].as_ptr()),
                "dense panel {p}"
            );
        }
    }

    #[test]
    fn elements_start_on_a_line_and_keep_their_values() {
        for len in [0, 1, 15, 16, 17, 1000, 200_000] {
            let values: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect();
            let v = AlignedVec::from_slice(&values);
            assert!(len == 0 || on_a_line(v.as_ptr()), "len {len}");
            assert_eq!(&*v, &values[..]);
        }
    }

    #[test]
    fn growing_zero_fills_new_lines_and_keeps_old_values() {
        let mut v = AlignedVec::<u8>::zeroed(3);
        v.copy_from_slice(&[1, 2, 3]);
        v.grow_to(200);
        assert_eq!(&v[..3], &[1, 2, 3]);
        assert!(v[3..].iter().all(|&b| b == 0));
        assert!(on_a_line(v.as_ptr()));
        v.grow_to(2);
        assert_eq!(v.len(), 200);
        let mut w = AlignedVec::<u32>::with_capacity(3);
        w.extend_from_slice(&[7, 8]);
        w.extend_from_slice(&[9; 20]);
        assert_eq!(w.len(), 22);
        assert_eq!(&w[..3], &[7, 8, 9]);
        assert!(on_a_line(w.as_ptr()));
    }
}
