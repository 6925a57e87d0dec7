//! Backend-neutral runtime helpers, so that examples and bindings read the same on every backend.
//! Pointers returned by `fmha_device_malloc` are device pointers of the build's backend (host memory
//! on the host backend).

use super::{boundary, fmha_status, write_out};
use crate::error::Error;
use crate::runtime::{self, CopyKind, Stream};
use std::ffi::c_void;

/// A stream: `cudaStream_t` / `hipStream_t` on GPU builds (so framework streams can be passed in),
/// a host-backend stream handle otherwise. NULL is the default stream.
pub type fmha_stream_t = *mut c_void;

pub use crate::abi_values::{FMHA_MEMCPY_DEVICE_TO_DEVICE, FMHA_MEMCPY_DEVICE_TO_HOST, FMHA_MEMCPY_HOST_TO_DEVICE};

/// Allocates `bytes` of device memory into `*ptr` (256-byte aligned).
#[no_mangle]
pub extern "C" fn fmha_device_malloc(ptr: *mut *mut c_void, bytes: usize) -> fmha_status {
    boundary(|| {
        if ptr.is_null() {
            return Err(Error::null("ptr"));
        }
        let allocated = runtime::current()?.malloc(bytes)?;
        write_out(ptr, "ptr", allocated as *mut c_void)
    })
}

/// Frees memory from `fmha_device_malloc` (NULL is a no-op).
#[no_mangle]
pub extern "C" fn fmha_device_free(ptr: *mut c_void) -> fmha_status {
    boundary(|| if ptr.is_null() { Ok(()) } else { runtime::current()?.free(ptr as usize) })
}

/// Allocates `bytes` of page-locked host memory into `*ptr`.
#[no_mangle]
pub extern "C" fn fmha_host_malloc_pinned(ptr: *mut *mut c_void, bytes: usize) -> fmha_status {
    boundary(|| {
        if ptr.is_null() {
            return Err(Error::null("ptr"));
        }
        let allocated = runtime::current()?.malloc_pinned(bytes)?;
        write_out(ptr, "ptr", allocated as *mut c_void)
    })
}

/// Frees memory from `fmha_host_malloc_pinned` (NULL is a no-op).
#[no_mangle]
pub extern "C" fn fmha_host_free_pinned(ptr: *mut c_void) -> fmha_status {
    boundary(|| if ptr.is_null() { Ok(()) } else { runtime::current()?.free_pinned(ptr as usize) })
}

/// Copies `bytes` from `src` to `dst` and waits for the copy; `kind` is an `FMHA_MEMCPY_*` value.
#[no_mangle]
pub extern "C" fn fmha_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: i32) -> fmha_status {
    boundary(|| {
        let kind = CopyKind::from_i32(kind)?;
        runtime::check_range("dst", dst as usize, bytes)?;
        runtime::check_range("src", src as usize, bytes)?;
        runtime::current()?.memcpy(dst as usize, src as usize, bytes, kind)
    })
}

/// Queues a copy on `stream` and returns at once. Host memory must stay valid until the stream has
/// run the copy (use pinned memory for truly asynchronous transfers on GPUs).
#[no_mangle]
pub extern "C" fn fmha_memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: i32,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let kind = CopyKind::from_i32(kind)?;
        runtime::check_range("dst", dst as usize, bytes)?;
        runtime::check_range("src", src as usize, bytes)?;
        runtime::current()?.memcpy_async(dst as usize, src as usize, bytes, kind, Stream(stream as usize))
    })
}

/// Sets `bytes` of device memory at `dst` to the byte `value` (0..=255) and waits.
#[no_mangle]
pub extern "C" fn fmha_memset(dst: *mut c_void, value: i32, bytes: usize) -> fmha_status {
    boundary(|| {
        let value = byte_value(value)?;
        runtime::check_range("dst", dst as usize, bytes)?;
        runtime::current()?.memset(dst as usize, value, bytes)
    })
}

/// Queues a memset on `stream`.
#[no_mangle]
pub extern "C" fn fmha_memset_async(dst: *mut c_void, value: i32, bytes: usize, stream: fmha_stream_t) -> fmha_status {
    boundary(|| {
        let value = byte_value(value)?;
        runtime::check_range("dst", dst as usize, bytes)?;
        runtime::current()?.memset_async(dst as usize, value, bytes, Stream(stream as usize))
    })
}

fn byte_value(value: i32) -> crate::error::Result<u8> {
    u8::try_from(value).map_err(|_| Error::invalid("value", format!("{value} is not a byte value (0..=255)")))
}

/// Creates a stream into `*stream`.
#[no_mangle]
pub extern "C" fn fmha_stream_create(stream: *mut fmha_stream_t) -> fmha_status {
    boundary(|| {
        if stream.is_null() {
            return Err(Error::null("stream"));
        }
        let created = runtime::current()?.stream_create()?;
        write_out(stream, "stream", created.0 as fmha_stream_t)
    })
}

/// Destroys a stream; work already queued on it still completes.
#[no_mangle]
pub extern "C" fn fmha_stream_destroy(stream: fmha_stream_t) -> fmha_status {
    boundary(|| runtime::current()?.stream_destroy(Stream(stream as usize)))
}

/// Waits for all work queued on `stream`; reports an error of that work, if any.
#[no_mangle]
pub extern "C" fn fmha_stream_synchronize(stream: fmha_stream_t) -> fmha_status {
    boundary(|| runtime::current()?.stream_synchronize(Stream(stream as usize)))
}

/// Waits for all work on all streams of the device.
#[no_mangle]
pub extern "C" fn fmha_device_synchronize() -> fmha_status {
    boundary(|| runtime::current()?.device_synchronize())
}

/// Loads this build's kernels onto the current device now. fmha does this itself before its first
/// kernel launch on a device, and there the GPU runtime may wait for all the work already queued on
/// the device (it loads code modules lazily, and loading a module can synchronize the context: on an
/// H200 the first fmha call of a process waited ~1.4 s behind a busy stream). A program that must not
/// stall on its first fmha call calls this at startup, while the device is idle. Later calls (new
/// shapes, new modes) never load kernels. The host backend has nothing to load.
#[no_mangle]
pub extern "C" fn fmha_load_kernels() -> fmha_status {
    boundary(crate::launch::load_kernels)
}

/// The number of compute units (SMs on NVIDIA, CUs on AMD, logical CUs on the host backend) that the
/// persistent scheduler plans for.
#[no_mangle]
pub extern "C" fn fmha_device_cu_count(count: *mut i32) -> fmha_status {
    boundary(|| {
        if count.is_null() {
            return Err(Error::null("count"));
        }
        let cus = runtime::current()?.cu_count()?;
        write_out(count, "count", i32::try_from(cus).unwrap_or(i32::MAX))
    })
}

/// Host backend only: sets the logical CU count (1..=4096) the scheduler and executor use.
/// GPU builds answer `FMHA_ERR_UNSUPPORTED` (their CU count is the device's).
#[no_mangle]
pub extern "C" fn fmha_host_set_cu_count(count: i32) -> fmha_status {
    boundary(|| {
        if runtime::ACTIVE_BACKEND != runtime::BackendKind::Host {
            return Err(Error::unsupported(
                "fmha_host_set_cu_count: only the host backend has a settable CU count; GPU builds use the device's",
            ));
        }
        runtime::host::runtime().set_cu_count(i64::from(count))
    })
}
