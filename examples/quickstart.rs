//! The main job: prints the library version and backend and does a device round trip through the C ABI.
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::ffi::version::*;
use std::ffi::{c_void, CStr};

fn check(status: fmha_status, what: &str) {
    if status != FMHA_OK {
        let mut buffer = [0u8; 512];
        let len = fmha_last_error_message(buffer.as_mut_ptr() as *mut _, buffer.len()).min(511);
        eprintln!("{what} failed: {}", String::from_utf8_lossy(&buffer[..len]));
        std::process::exit(1);
    }
}

fn main() {
    let version = unsafe { CStr::from_ptr(fmha_version()) }.to_string_lossy();
    let backend = match fmha_backend() {
        FMHA_BACKEND_CUDA => "cuda",
        FMHA_BACKEND_ROCM => "rocm",
        _ => "host",
    };
    println!("fmha {version} (backend: {backend})");
    let mut cus = 0;
    check(fmha_device_cu_count(&mut cus), "fmha_device_cu_count");
    let data: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5).collect();
    let bytes = data.len() * 4;
    let mut device = std::ptr::null_mut();
    check(fmha_device_malloc(&mut device, bytes), "fmha_device_malloc");
    let mut back = vec![0f32; data.len()];
    check(fmha_memcpy(device, data.as_ptr() as *const c_void, bytes, FMHA_MEMCPY_HOST_TO_DEVICE), "copy to device");
    check(fmha_memcpy(back.as_mut_ptr() as *mut c_void, device, bytes, FMHA_MEMCPY_DEVICE_TO_HOST), "copy back");
    check(fmha_device_free(device), "fmha_device_free");
    assert_eq!(back, data);
    println!("device round trip of {bytes} bytes on {cus} compute units: ok");
}
