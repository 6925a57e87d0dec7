//! The CUDA runtime (libcudart, linked statically) under the names [`super::gpu`] uses. Only the
//! declarations live here; the one GPU runtime implementation is shared with ROCm.

use std::ffi::{c_char, c_int, c_void};

pub(super) type Code = c_int;
pub(super) type RawStream = *mut c_void;
pub(super) type RawEvent = *mut c_void;
pub(super) type HostCallback = unsafe extern "C" fn(*mut c_void);

pub(super) const SUCCESS: Code = 0;
pub(super) const ATTRIBUTE_CU_COUNT: c_int = 16; // cudaDevAttrMultiProcessorCount
pub(super) const ATTRIBUTE_ARCH_MAJOR: c_int = 75; // cudaDevAttrComputeCapabilityMajor
pub(super) const ATTRIBUTE_ARCH_MINOR: c_int = 76; // cudaDevAttrComputeCapabilityMinor
pub(super) const BACKEND_NAME: &str = "CUDA";

extern "C" {
    #[link_name = "cudaMalloc"]
    pub(super) fn malloc(ptr: *mut *mut c_void, bytes: usize) -> Code;
    #[link_name = "cudaFree"]
    pub(super) fn free(ptr: *mut c_void) -> Code;
    #[link_name = "cudaMallocHost"]
    fn cuda_malloc_host(ptr: *mut *mut c_void, bytes: usize) -> Code;
    #[link_name = "cudaFreeHost"]
    pub(super) fn free_host(ptr: *mut c_void) -> Code;
    #[link_name = "cudaMemcpy"]
    pub(super) fn memcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: c_int) -> Code;
    #[link_name = "cudaMemcpyAsync"]
    pub(super) fn memcpy_async(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: c_int,
        stream: RawStream,
    ) -> Code;
    #[link_name = "cudaMemset"]
    pub(super) fn memset(dst: *mut c_void, value: c_int, bytes: usize) -> Code;
    #[link_name = "cudaMemsetAsync"]
    pub(super) fn memset_async(dst: *mut c_void, value: c_int, bytes: usize, stream: RawStream) -> Code;
    #[link_name = "cudaStreamCreate"]
    pub(super) fn stream_create(stream: *mut RawStream) -> Code;
    #[link_name = "cudaStreamDestroy"]
    pub(super) fn stream_destroy(stream: RawStream) -> Code;
    #[link_name = "cudaStreamSynchronize"]
    pub(super) fn stream_synchronize(stream: RawStream) -> Code;
    #[link_name = "cudaStreamIsCapturing"]
    pub(super) fn stream_is_capturing(stream: RawStream, status: *mut c_int) -> Code;
    #[link_name = "cudaLaunchHostFunc"]
    pub(super) fn launch_host_func(stream: RawStream, func: HostCallback, user_data: *mut c_void) -> Code;
    #[link_name = "cudaEventCreate"]
    pub(super) fn event_create(event: *mut RawEvent) -> Code;
    #[link_name = "cudaEventDestroy"]
    pub(super) fn event_destroy(event: RawEvent) -> Code;
    #[link_name = "cudaEventRecord"]
    pub(super) fn event_record(event: RawEvent, stream: RawStream) -> Code;
    #[link_name = "cudaEventSynchronize"]
    pub(super) fn event_synchronize(event: RawEvent) -> Code;
    #[link_name = "cudaEventElapsedTime"]
    pub(super) fn event_elapsed_time(ms: *mut f32, start: RawEvent, end: RawEvent) -> Code;
    #[link_name = "cudaDeviceSynchronize"]
    pub(super) fn device_synchronize() -> Code;
    #[link_name = "cudaGetDevice"]
    pub(super) fn get_device(device: *mut c_int) -> Code;
    #[link_name = "cudaGetDeviceCount"]
    pub(super) fn get_device_count(count: *mut c_int) -> Code;
    #[link_name = "cudaDeviceGetAttribute"]
    pub(super) fn device_get_attribute(value: *mut c_int, attribute: c_int, device: c_int) -> Code;
    #[link_name = "cudaGetErrorString"]
    pub(super) fn error_string(code: Code) -> *const c_char;
}

/// `cudaMallocHost`: page-locked, default flags.
pub(super) unsafe fn malloc_host(ptr: *mut *mut c_void, bytes: usize) -> Code {
    // SAFETY: forwarded contract of cudaMallocHost (caller passes a writable out-pointer).
    unsafe { cuda_malloc_host(ptr, bytes) }
}

/// Maps a compute capability to the architecture kernels are compiled for.
pub(super) fn arch_from_version(major: c_int, minor: c_int) -> super::Arch {
    match (major, minor) {
        (9, 0) => super::Arch::Sm90,
        _ => super::Arch::Other,
    }
}
