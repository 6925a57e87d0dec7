//! Status codes of the C ABI and the crate's error type.
//!
//! The numeric values of [`Status`] are part of the ABI: they are never renumbered, new codes are only
//! appended.

use crate::abi_values::*;
use std::ffi::CStr;
use std::fmt;

abi_enum! {
    /// Result codes returned by every exported function (`fmha_status` in C).
    pub enum Status {
        /// Success.
        Ok = FMHA_OK => "ok",
        /// An argument is out of range or inconsistent with another one.
        InvalidArgument = FMHA_ERR_INVALID_ARGUMENT => "invalid argument",
        /// The request is valid but this build has no kernel instance (or feature) for it.
        Unsupported = FMHA_ERR_UNSUPPORTED => "unsupported",
        /// The device runtime (CUDA/HIP, or the host backend's emulation of it) reported an error.
        DeviceRuntime = FMHA_ERR_DEVICE_RUNTIME => "device runtime",
        /// A device, pinned or host allocation failed.
        OutOfMemory = FMHA_ERR_OUT_OF_MEMORY => "out of memory",
        /// The workspace passed to `run` is smaller than `workspace_size` requires.
        WorkspaceTooSmall = FMHA_ERR_WORKSPACE_TOO_SMALL => "workspace too small",
        /// The workspace was never prepared, or was prepared for other traits or sequence lengths.
        WorkspaceNotPrepared = FMHA_ERR_WORKSPACE_NOT_PREPARED => "workspace not prepared",
        /// A GPU build runs on a machine without a usable device.
        NoDevice = FMHA_ERR_NO_DEVICE => "no device",
        /// A required pointer argument is null.
        NullPointer = FMHA_ERR_NULL_POINTER => "null pointer",
        /// A bug inside the library (a caught panic, a broken invariant).
        Internal = FMHA_ERR_INTERNAL => "internal",
        /// An asynchronous step (a host function on a stream) failed; reported by the next call.
        AsyncFailure = FMHA_ERR_ASYNC_FAILURE => "async failure",
    }
}

impl Status {
    /// The status with this numeric value, if there is one.
    pub fn from_code(code: i32) -> Option<Status> {
        Status::parse(code)
    }

    /// A short static description, NUL-terminated for `fmha_status_string`.
    pub fn c_description(self) -> &'static CStr {
        match self {
            Status::Ok => c"success",
            Status::InvalidArgument => c"invalid argument",
            Status::Unsupported => c"unsupported: no kernel instance or feature for this request",
            Status::DeviceRuntime => c"device runtime error",
            Status::OutOfMemory => c"out of memory",
            Status::WorkspaceTooSmall => c"workspace too small",
            Status::WorkspaceNotPrepared => c"workspace not prepared",
            Status::NoDevice => c"no device",
            Status::NullPointer => c"null pointer",
            Status::Internal => c"internal error",
            Status::AsyncFailure => c"an asynchronous operation failed",
        }
    }

    /// A short static description.
    pub fn description(self) -> &'static str {
        self.c_description().to_str().expect("status descriptions are ASCII")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// An error: a status code plus a message naming what went wrong (the field, the value, the limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct Error {
    pub status: Status,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        Error { status, message: message.into() }
    }
    /// An invalid value for the named field.
    pub fn invalid(field: &str, detail: impl fmt::Display) -> Self {
        Error::new(Status::InvalidArgument, format!("{field}: {detail}"))
    }
    /// A required pointer that is null.
    pub fn null(field: &str) -> Self {
        Error::new(Status::NullPointer, format!("{field} must not be null"))
    }
    pub fn unsupported(detail: impl Into<String>) -> Self {
        Error::new(Status::Unsupported, detail)
    }
    pub fn runtime(detail: impl Into<String>) -> Self {
        Error::new(Status::DeviceRuntime, detail)
    }
    pub fn internal(detail: impl Into<String>) -> Self {
        Error::new(Status::Internal, detail)
    }
}

/// Fails with `InvalidArgument` naming `field` unless `condition` holds.
pub fn ensure(condition: bool, field: &str, detail: impl FnOnce() -> String) -> Result<()> {
    ensure_field(condition, || field.to_string(), detail)
}

/// [`ensure`] for a field whose name is built (`"q.row_stride"`): the name, like the detail, is formatted
/// only when `condition` fails. Validation runs on every launch, and formatting names there cost a
/// call more host time than the checks themselves.
pub fn ensure_field(condition: bool, field: impl FnOnce() -> String, detail: impl FnOnce() -> String) -> Result<()> {
    if condition {
        Ok(())
    } else {
        Err(Error::invalid(&field(), detail()))
    }
}

/// The message carried by a caught panic payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}
