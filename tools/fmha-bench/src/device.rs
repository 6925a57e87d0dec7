//! Device memory and status checks through the C ABI.

use anyhow::Result;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use std::ffi::c_void;

/// A failed C call: its status and fmha's message.
#[derive(Debug)]
pub struct CallError {
    pub status: fmha_status,
    pub what: String,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.what, self.message, status_name(self.status))
    }
}

impl std::error::Error for CallError {}

/// `Err(CallError)` when `status` is not `FMHA_OK`.
pub fn check(status: fmha_status, what: &str) -> Result<()> {
    if status == FMHA_OK {
        return Ok(());
    }
    Err(CallError { status, what: what.to_string(), message: last_error() }.into())
}

/// This thread's last error message.
pub fn last_error() -> String {
    let mut buffer = vec![0u8; 1024];
    let len = fmha_last_error_message(buffer.as_mut_ptr() as *mut _, buffer.len()).min(buffer.len() - 1);
    String::from_utf8_lossy(&buffer[..len]).into_owned()
}

pub fn status_name(status: fmha_status) -> String {
    fmha::Status::from_code(status).map_or_else(|| format!("status {status}"), |s| format!("{s:?}"))
}

/// A device allocation, freed on drop.
pub struct Buffer {
    pub ptr: *mut c_void,
    pub bytes: usize,
}

impl Buffer {
    pub fn zeroed(bytes: usize) -> Result<Buffer> {
        let mut ptr = std::ptr::null_mut();
        check(fmha_device_malloc(&mut ptr, bytes.max(16)), "fmha_device_malloc")?;
        let buffer = Buffer { ptr, bytes };
        check(fmha_memset(ptr, 0, bytes.max(16)), "fmha_memset")?;
        Ok(buffer)
    }

    pub fn upload<T: Copy>(values: &[T]) -> Result<Buffer> {
        let bytes = std::mem::size_of_val(values);
        let buffer = Buffer::zeroed(bytes)?;
        if bytes > 0 {
            check(
                fmha_memcpy(buffer.ptr, values.as_ptr() as *const c_void, bytes, FMHA_MEMCPY_HOST_TO_DEVICE),
                "fmha_memcpy",
            )?;
        }
        Ok(buffer)
    }

    /// Fills the buffer with one byte (outputs are poisoned before a verified run).
    pub fn fill(&self, byte: u8) -> Result<()> {
        check(fmha_memset(self.ptr, i32::from(byte), self.bytes), "fmha_memset")
    }

    pub fn download(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.bytes];
        if self.bytes > 0 {
            check(
                fmha_memcpy(out.as_mut_ptr() as *mut c_void, self.ptr, self.bytes, FMHA_MEMCPY_DEVICE_TO_HOST),
                "fmha_memcpy",
            )?;
        }
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        fmha_device_free(self.ptr);
    }
}
