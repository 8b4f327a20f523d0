//! The boundary every exported function goes through: [`guard`] runs the Rust body, catches a
//! panic so that it never unwinds into C, turns the outcome into a [`MoeStatus`] and keeps the
//! message in the calling thread's last-error slot, which `moe_last_error_message` reads.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::status::{CapiError, MoeStatus};

thread_local! {
    /// The message of the last failed call on this thread (empty after a success).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `body`; returns `MOE_STATUS_OK` or the error's status, recording the message.
///
/// A panic inside `body` is caught and reported as [`MoeStatus::Internal`]. `AssertUnwindSafe`
/// is sound here because the only state a panic can leave half-updated is a layer behind a
/// lock, and a poisoned lock is reported as an error by every later call.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), CapiError>) -> MoeStatus {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Err(CapiError::new(
            MoeStatus::Internal,
            format!("internal error caught at the C boundary: {what}"),
        ))
    });
    match outcome {
        Ok(()) => {
            set_last_error("");
            MoeStatus::Ok
        }
        Err(e) => {
            set_last_error(&e.message);
            e.status
        }
    }
}

/// Replaces this thread's last error message (interior NUL bytes become spaces).
fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// A pointer to this thread's last error message, valid until the next call on this thread.
pub(crate) fn last_error_ptr() -> *const std::ffi::c_char {
    // During thread teardown the slot may be gone; an empty static string stands in.
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The library's version as a static C string.
pub(crate) fn version() -> &'static CStr {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    CStr::from_bytes_with_nul(VERSION.as_bytes()).unwrap_or(c"unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_status_with_its_message() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, MoeStatus::Internal);
        // SAFETY: the pointer comes from this thread's slot and no call happened since.
        let message = unsafe { CStr::from_ptr(last_error_ptr()) };
        assert!(message.to_str().unwrap().contains("boom"), "{message:?}");
        assert_eq!(guard(|| Ok(())), MoeStatus::Ok);
        // SAFETY: as above.
        assert!(unsafe { CStr::from_ptr(last_error_ptr()) }.is_empty());
    }
}
