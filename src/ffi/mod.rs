//! The C ABI. Every `extern "C"` function of the library lives under this module, and every one that
//! can fail goes through [`boundary`]: it catches panics, turns errors into status codes and keeps the
//! message in a thread-local buffer for `fmha_last_error_message`.

#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C and check them (null, extent) before use; marking them
// `unsafe fn` in Rust would change nothing for their C callers.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod runtime;
pub mod status;
pub mod version;

use crate::error::{panic_message, Error, Result, Status};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use status::fmha_status;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_last_error(message: String) {
    LAST_ERROR.with(|m| *m.borrow_mut() = message);
}

pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|m| m.borrow().clone())
}

/// Runs the body of an exported function: `Ok` → `FMHA_OK` and the message cleared; `Err` → its
/// status with the message kept; a panic → `FMHA_ERR_INTERNAL`, never an unwind into C.
pub(crate) fn boundary(body: impl FnOnce() -> Result<()>) -> fmha_status {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        Err(Error::internal(format!("internal error (please report): {}", panic_message(&*panic))))
    });
    match outcome {
        Ok(()) => {
            set_last_error(String::new());
            Status::Ok as fmha_status
        }
        Err(e) => {
            let status = e.status as fmha_status;
            set_last_error(e.message);
            status
        }
    }
}

/// Writes `value` through an out-pointer given by the caller.
pub(crate) fn write_out<T>(out: *mut T, field: &str, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::null(field));
    }
    // SAFETY: non-null (checked); the C caller passes a pointer to a writable `T` (the documented
    // contract of every out-parameter); `write` does not read or drop the old value.
    unsafe { out.write(value) };
    Ok(())
}
