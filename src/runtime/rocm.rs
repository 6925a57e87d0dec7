//! The HIP runtime (libamdhip64 through `hip-runtime-sys`) under the names [`super::gpu`] uses.
//! Only this mapping lives here; the one GPU runtime implementation is shared with CUDA.

use hip_runtime_sys as hip;
use std::ffi::{c_char, c_int, c_void};

pub(super) type Code = c_int;
pub(super) type RawStream = *mut c_void;
pub(super) type RawEvent = *mut c_void;
pub(super) type HostCallback = unsafe extern "C" fn(*mut c_void);

pub(super) const SUCCESS: Code = 0;
pub(super) const ATTRIBUTE_CU_COUNT: c_int = hip::hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount as c_int;
pub(super) const ATTRIBUTE_ARCH_MAJOR: c_int =
    hip::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMajor as c_int;
pub(super) const ATTRIBUTE_ARCH_MINOR: c_int =
    hip::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMinor as c_int;
pub(super) const BACKEND_NAME: &str = "HIP";

fn memcpy_kind(kind: c_int) -> hip::hipMemcpyKind {
    match kind {
        1 => hip::hipMemcpyKind::hipMemcpyHostToDevice,
        2 => hip::hipMemcpyKind::hipMemcpyDeviceToHost,
        _ => hip::hipMemcpyKind::hipMemcpyDeviceToDevice,
    }
}

fn attribute(value: c_int) -> hip::hipDeviceAttribute_t {
    if value == ATTRIBUTE_CU_COUNT {
        hip::hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount
    } else if value == ATTRIBUTE_ARCH_MAJOR {
        hip::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMajor
    } else {
        hip::hipDeviceAttribute_t::hipDeviceAttributeComputeCapabilityMinor
    }
}

// SAFETY (every function below): each forwards to the HIP function of the same meaning with the
// caller's arguments unchanged; the caller upholds that function's contract.
pub(super) unsafe fn malloc(ptr: *mut *mut c_void, bytes: usize) -> Code {
    unsafe { hip::hipMalloc(ptr, bytes) as Code }
}
pub(super) unsafe fn free(ptr: *mut c_void) -> Code {
    unsafe { hip::hipFree(ptr) as Code }
}
pub(super) unsafe fn malloc_host(ptr: *mut *mut c_void, bytes: usize) -> Code {
    unsafe { hip::hipHostMalloc(ptr, bytes, 0) as Code }
}
pub(super) unsafe fn free_host(ptr: *mut c_void) -> Code {
    unsafe { hip::hipHostFree(ptr) as Code }
}
pub(super) unsafe fn memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int) -> Code {
    unsafe { hip::hipMemcpy(dst, src, bytes, memcpy_kind(kind)) as Code }
}
pub(super) unsafe fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    stream: RawStream,
) -> Code {
    unsafe { hip::hipMemcpyAsync(dst, src, bytes, memcpy_kind(kind), stream.cast()) as Code }
}
pub(super) unsafe fn memset(dst: *mut c_void, value: c_int, bytes: usize) -> Code {
    unsafe { hip::hipMemset(dst, value, bytes) as Code }
}
pub(super) unsafe fn memset_async(dst: *mut c_void, value: c_int, bytes: usize, stream: RawStream) -> Code {
    unsafe { hip::hipMemsetAsync(dst, value, bytes, stream.cast()) as Code }
}
pub(super) unsafe fn stream_create(stream: *mut RawStream) -> Code {
    unsafe { hip::hipStreamCreate(stream.cast()) as Code }
}
pub(super) unsafe fn stream_destroy(stream: RawStream) -> Code {
    unsafe { hip::hipStreamDestroy(stream.cast()) as Code }
}
pub(super) unsafe fn stream_synchronize(stream: RawStream) -> Code {
    unsafe { hip::hipStreamSynchronize(stream.cast()) as Code }
}
pub(super) unsafe fn stream_is_capturing(stream: RawStream, status: *mut c_int) -> Code {
    let mut capture = hip::hipStreamCaptureStatus::hipStreamCaptureStatusNone;
    let code = unsafe { hip::hipStreamIsCapturing(stream.cast(), &mut capture) as Code };
    unsafe { status.write(capture as c_int) };
    code
}
pub(super) unsafe fn launch_host_func(stream: RawStream, func: HostCallback, user_data: *mut c_void) -> Code {
    unsafe { hip::hipLaunchHostFunc(stream.cast(), Some(func), user_data) as Code }
}
pub(super) unsafe fn event_create(event: *mut RawEvent) -> Code {
    unsafe { hip::hipEventCreate(event.cast()) as Code }
}
pub(super) unsafe fn event_destroy(event: RawEvent) -> Code {
    unsafe { hip::hipEventDestroy(event.cast()) as Code }
}
pub(super) unsafe fn event_record(event: RawEvent, stream: RawStream) -> Code {
    unsafe { hip::hipEventRecord(event.cast(), stream.cast()) as Code }
}
pub(super) unsafe fn event_synchronize(event: RawEvent) -> Code {
    unsafe { hip::hipEventSynchronize(event.cast()) as Code }
}
pub(super) unsafe fn event_elapsed_time(ms: *mut f32, start: RawEvent, end: RawEvent) -> Code {
    unsafe { hip::hipEventElapsedTime(ms, start.cast(), end.cast()) as Code }
}
pub(super) unsafe fn device_synchronize() -> Code {
    unsafe { hip::hipDeviceSynchronize() as Code }
}
pub(super) unsafe fn get_device(device: *mut c_int) -> Code {
    unsafe { hip::hipGetDevice(device) as Code }
}
pub(super) unsafe fn get_device_count(count: *mut c_int) -> Code {
    unsafe { hip::hipGetDeviceCount(count) as Code }
}
pub(super) unsafe fn device_get_attribute(value: *mut c_int, attr: c_int, device: c_int) -> Code {
    unsafe { hip::hipDeviceGetAttribute(value, attribute(attr), device) as Code }
}
pub(super) unsafe fn error_string(code: Code) -> *const c_char {
    // hipGetErrorString takes the enum; codes outside it are reported by number by the caller.
    match code {
        0 => c"hipSuccess".as_ptr(),
        _ => std::ptr::null(),
    }
}

/// HIP reports gfx9xx as compute capability 9.x: gfx942 → 9.4, gfx950 → 9.5.
pub(super) fn arch_from_version(major: c_int, minor: c_int) -> super::Arch {
    match (major, minor) {
        (9, 4) => super::Arch::Gfx942,
        (9, 5) => super::Arch::Gfx950,
        _ => super::Arch::Other,
    }
}
