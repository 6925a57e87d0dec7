//! Status codes and the thread-local error message.

use crate::error::Status;
use std::ffi::c_char;

/// Result of every fallible function (`FMHA_OK` = 0). Values are fixed and never renumbered.
pub type fmha_status = i32;

pub use crate::abi_values::{
    FMHA_ERR_ASYNC_FAILURE, FMHA_ERR_DEVICE_RUNTIME, FMHA_ERR_INTERNAL, FMHA_ERR_INVALID_ARGUMENT, FMHA_ERR_NO_DEVICE,
    FMHA_ERR_NULL_POINTER, FMHA_ERR_OUT_OF_MEMORY, FMHA_ERR_UNSUPPORTED, FMHA_ERR_WORKSPACE_NOT_PREPARED,
    FMHA_ERR_WORKSPACE_TOO_SMALL, FMHA_OK,
};

/// A static, NUL-terminated description of `status` ("unknown status" for values that are not codes).
#[no_mangle]
pub extern "C" fn fmha_status_string(status: fmha_status) -> *const c_char {
    let text = Status::from_code(status).map_or(c"unknown status", Status::c_description);
    text.as_ptr()
}

/// Copies the message of the last failed call on this thread into `buffer` (NUL-terminated, truncated
/// to `length - 1` bytes) and returns the full message length in bytes, without the NUL. The message
/// is empty after a successful call. `buffer` may be null (with any `length`) to ask for the length.
#[no_mangle]
pub extern "C" fn fmha_last_error_message(buffer: *mut c_char, length: usize) -> usize {
    let message = super::last_error();
    super::copy_c_string(&message, buffer, length);
    message.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_status_enum() {
        let constants = [
            FMHA_OK,
            FMHA_ERR_INVALID_ARGUMENT,
            FMHA_ERR_UNSUPPORTED,
            FMHA_ERR_DEVICE_RUNTIME,
            FMHA_ERR_OUT_OF_MEMORY,
            FMHA_ERR_WORKSPACE_TOO_SMALL,
            FMHA_ERR_WORKSPACE_NOT_PREPARED,
            FMHA_ERR_NO_DEVICE,
            FMHA_ERR_NULL_POINTER,
            FMHA_ERR_INTERNAL,
            FMHA_ERR_ASYNC_FAILURE,
        ];
        for (status, constant) in Status::ALL.iter().zip(constants) {
            assert_eq!(*status as i32, constant);
            let text = unsafe { std::ffi::CStr::from_ptr(fmha_status_string(constant)) };
            assert_eq!(text.to_str().unwrap(), status.description());
        }
    }
}
