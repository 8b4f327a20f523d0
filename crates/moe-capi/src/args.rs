//! Turning raw C arguments into Rust values: strings (NUL-terminated, UTF-8), typed buffers
//! (pointer plus element count, checked for NULL and alignment) and out-pointers. These are the
//! only places that build references from C pointers; what they cannot check (that the
//! memory really holds `len` elements and stays valid during the call) is the caller's
//! contract, stated on every exported function.

use std::ffi::{CStr, c_char};

use half::{bf16, f16};

use crate::status::{CapiError, MoeDtype, MoeStatus};

/// The UTF-8 string at `ptr`, named `field` in errors.
///
/// # Safety
/// - `ptr` is NULL or points to a NUL-terminated string that stays valid and unchanged while
///   the returned reference is used.
pub(crate) unsafe fn utf8<'a>(ptr: *const c_char, field: &str) -> Result<&'a str, CapiError> {
    if ptr.is_null() {
        return Err(CapiError::null(field));
    }
    // SAFETY: non-NULL, and NUL-terminated and valid per this function's contract.
    let text = unsafe { CStr::from_ptr(ptr) };
    text.to_str().map_err(|e| {
        CapiError::new(
            MoeStatus::InvalidUtf8,
            format!("{field}: not valid UTF-8 ({e})"),
        )
    })
}

/// Checks that `ptr` can hold `T`s: not NULL unless `len` is 0, and aligned for `T`.
fn check_buffer<T>(ptr: *const T, len: usize, field: &str) -> Result<(), CapiError> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(())
        } else {
            Err(CapiError::null(field))
        };
    }
    if !ptr.cast::<u8>().addr().is_multiple_of(align_of::<T>()) {
        return Err(CapiError::invalid(format!(
            "{field}: address {ptr:p} is not aligned to {} bytes",
            align_of::<T>()
        )));
    }
    if len
        .checked_mul(size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(CapiError::invalid(format!(
            "{field}: {len} elements is more than any buffer can hold"
        )));
    }
    Ok(())
}

/// `len` elements of `T` at `ptr` (NULL allowed when `len` is 0).
///
/// # Safety
/// - When `len > 0`, `ptr` points to `len` initialised `T`s that nothing writes to while the
///   returned slice is used.
pub(crate) unsafe fn slice<'a, T>(
    ptr: *const T,
    len: usize,
    field: &str,
) -> Result<&'a [T], CapiError> {
    check_buffer(ptr, len, field)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-NULL, aligned and at most isize::MAX bytes (checked above); valid for
    // `len` reads and not mutated during the borrow per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// `len` writable elements of `T` at `ptr` (NULL allowed when `len` is 0).
///
/// # Safety
/// - When `len > 0`, `ptr` points to `len` `T`s that only the returned slice accesses while it
///   is used (no other reader or writer, no overlap with input buffers).
pub(crate) unsafe fn slice_mut<'a, T>(
    ptr: *mut T,
    len: usize,
    field: &str,
) -> Result<&'a mut [T], CapiError> {
    check_buffer(ptr, len, field)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: non-NULL, aligned and at most isize::MAX bytes (checked above); exclusively
    // ours for `len` elements during the borrow per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Writes `value` through the out-pointer `ptr`.
///
/// # Safety
/// - `ptr` is NULL or points to writable memory for one `T`.
pub(crate) unsafe fn write_out<T>(ptr: *mut T, value: T, field: &str) -> Result<(), CapiError> {
    check_buffer(ptr, 1, field)?;
    if ptr.is_null() {
        return Err(CapiError::null(field));
    }
    // SAFETY: non-NULL and aligned (checked above), writable per this function's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// A read-only float buffer of one of the three activation dtypes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FloatSlice<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

/// A writable float buffer of one of the three activation dtypes.
#[derive(Debug)]
pub(crate) enum FloatSliceMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

/// Refuses dtypes that are not activation dtypes.
pub(crate) fn float_dtype(dtype: MoeDtype, field: &str) -> Result<MoeDtype, CapiError> {
    match dtype {
        MoeDtype::F32 | MoeDtype::Bf16 | MoeDtype::F16 => Ok(dtype),
        MoeDtype::I8 => Err(CapiError::invalid(format!(
            "{field}: activations must be f32, bf16 or f16, not i8"
        ))),
    }
}

/// `len` elements of `dtype` (a float dtype) at `ptr`.
///
/// # Safety
/// - As [`slice`], for elements of `dtype` (2 bytes for bf16/f16, 4 for f32).
pub(crate) unsafe fn float_slice<'a>(
    dtype: MoeDtype,
    ptr: *const std::ffi::c_void,
    len: usize,
    field: &str,
) -> Result<FloatSlice<'a>, CapiError> {
    // Every bit pattern is a valid f32, bf16 or f16 (the half types are
    // `repr(transparent)` over u16), so reading C memory as any of them is sound.
    Ok(match float_dtype(dtype, field)? {
        // SAFETY: forwarded from this function's contract.
        MoeDtype::F32 => FloatSlice::F32(unsafe { slice(ptr.cast(), len, field)? }),
        // SAFETY: forwarded from this function's contract.
        MoeDtype::Bf16 => FloatSlice::Bf16(unsafe { slice(ptr.cast(), len, field)? }),
        // SAFETY: forwarded from this function's contract.
        _ => FloatSlice::F16(unsafe { slice(ptr.cast(), len, field)? }),
    })
}

/// `len` writable elements of `dtype` (a float dtype) at `ptr`.
///
/// # Safety
/// - As [`slice_mut`], for elements of `dtype`.
pub(crate) unsafe fn float_slice_mut<'a>(
    dtype: MoeDtype,
    ptr: *mut std::ffi::c_void,
    len: usize,
    field: &str,
) -> Result<FloatSliceMut<'a>, CapiError> {
    // Every bit pattern is a valid f32, bf16 or f16, so the caller's memory is valid as any.
    Ok(match float_dtype(dtype, field)? {
        // SAFETY: forwarded from this function's contract.
        MoeDtype::F32 => FloatSliceMut::F32(unsafe { slice_mut(ptr.cast(), len, field)? }),
        // SAFETY: forwarded from this function's contract.
        MoeDtype::Bf16 => FloatSliceMut::Bf16(unsafe { slice_mut(ptr.cast(), len, field)? }),
        // SAFETY: forwarded from this function's contract.
        _ => FloatSliceMut::F16(unsafe { slice_mut(ptr.cast(), len, field)? }),
    })
}
