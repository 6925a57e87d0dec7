//! Version and backend queries.

use crate::runtime::ACTIVE_BACKEND;
use std::ffi::c_char;

pub use crate::abi_values::{FMHA_BACKEND_CUDA, FMHA_BACKEND_HOST, FMHA_BACKEND_ROCM};

/// The library version as a static string, e.g. "0.2.0".
#[no_mangle]
pub extern "C" fn fmha_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The library version as `major * 10000 + minor * 100 + patch` (compare with `FMHA_VERSION_NUMBER`
/// from the header to detect a header/library mismatch).
#[no_mangle]
pub extern "C" fn fmha_version_number() -> u32 {
    crate::VERSION_NUMBER
}

/// The backend this library was built with: `FMHA_BACKEND_HOST`, `FMHA_BACKEND_CUDA` or
/// `FMHA_BACKEND_ROCM`.
#[no_mangle]
pub extern "C" fn fmha_backend() -> i32 {
    ACTIVE_BACKEND as i32
}
