//! Every exported runtime helper, through the C ABI: happy paths and bad inputs.

mod common;

use common::{expect_error, last_error, no_device, ok};
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::ffi::version::*;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

#[test]
fn version_and_backend() {
    let version = unsafe { CStr::from_ptr(fmha_version()) }.to_str().unwrap();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(fmha_version_number(), parts[0] * 10000 + parts[1] * 100 + parts[2]);
    let expected = if cfg!(feature = "cuda") {
        FMHA_BACKEND_CUDA
    } else if cfg!(feature = "rocm") {
        FMHA_BACKEND_ROCM
    } else {
        FMHA_BACKEND_HOST
    };
    assert_eq!(fmha_backend(), expected);
}

#[test]
fn status_strings_and_error_message_buffer() {
    for code in 0..=FMHA_ERR_ASYNC_FAILURE {
        let text = unsafe { CStr::from_ptr(fmha_status_string(code)) }.to_str().unwrap();
        assert!(!text.is_empty() && text != "unknown status", "code {code}");
    }
    assert_eq!(unsafe { CStr::from_ptr(fmha_status_string(-7)) }.to_str().unwrap(), "unknown status");

    expect_error(fmha_memcpy(null_mut(), null(), 16, 9), FMHA_ERR_INVALID_ARGUMENT, &["kind", "9"]);
    let full = last_error();
    // Truncation: a 6-byte buffer holds 5 bytes and the NUL; the full length is returned.
    let mut small = [0x7fu8; 6];
    let len = fmha_last_error_message(small.as_mut_ptr() as *mut _, small.len());
    assert_eq!(len, full.len());
    assert_eq!(&small[..5], &full.as_bytes()[..5]);
    assert_eq!(small[5], 0);
    // Zero length writes nothing; NULL buffer asks for the length.
    let mut untouched = [0x7fu8; 1];
    assert_eq!(fmha_last_error_message(untouched.as_mut_ptr() as *mut _, 0), full.len());
    assert_eq!(untouched[0], 0x7f);
    assert_eq!(fmha_last_error_message(null_mut(), 100), full.len());
    // A successful call clears the message.
    assert_eq!(fmha_device_free(null_mut()), FMHA_OK);
    assert_eq!(last_error(), "");
}

#[test]
fn memory_streams_and_copies_round_trip() {
    if no_device() {
        let mut p = null_mut();
        expect_error(fmha_device_malloc(&mut p, 16), FMHA_ERR_NO_DEVICE, &["device"]);
        return;
    }
    let n = 1 << 16;
    let input: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2654435761)).collect();
    let bytes = n * 4;
    let (mut a, mut b, mut pinned) = (null_mut(), null_mut(), null_mut());
    ok(fmha_device_malloc(&mut a, bytes));
    ok(fmha_device_malloc(&mut b, bytes));
    ok(fmha_host_malloc_pinned(&mut pinned, bytes));
    assert_eq!(a as usize % 256, 0);
    let mut stream: fmha_stream_t = null_mut();
    ok(fmha_stream_create(&mut stream));

    unsafe { std::ptr::copy_nonoverlapping(input.as_ptr() as *const u8, pinned as *mut u8, bytes) };
    ok(fmha_memcpy_async(a, pinned, bytes, FMHA_MEMCPY_HOST_TO_DEVICE, stream));
    ok(fmha_memcpy_async(b, a, bytes, FMHA_MEMCPY_DEVICE_TO_DEVICE, stream));
    ok(fmha_memset_async(a, 0, bytes, stream));
    let mut out = vec![0u32; n];
    ok(fmha_memcpy_async(out.as_mut_ptr() as *mut c_void, b, bytes, FMHA_MEMCPY_DEVICE_TO_HOST, stream));
    ok(fmha_stream_synchronize(stream));
    assert_eq!(out, input);

    ok(fmha_memset(b, 0x5A, bytes));
    ok(fmha_memcpy(out.as_mut_ptr() as *mut c_void, b, bytes, FMHA_MEMCPY_DEVICE_TO_HOST));
    assert!(out.iter().all(|&w| w == 0x5A5A_5A5A));
    ok(fmha_memcpy(out.as_mut_ptr() as *mut c_void, a, bytes, FMHA_MEMCPY_DEVICE_TO_HOST));
    assert!(out.iter().all(|&w| w == 0));
    ok(fmha_device_synchronize());

    ok(fmha_stream_destroy(stream));
    ok(fmha_host_free_pinned(pinned));
    ok(fmha_device_free(a));
    ok(fmha_device_free(b));
}

#[test]
fn bad_inputs_get_a_status_and_a_message_naming_the_field() {
    expect_error(fmha_device_malloc(null_mut(), 16), FMHA_ERR_NULL_POINTER, &["ptr"]);
    expect_error(fmha_host_malloc_pinned(null_mut(), 16), FMHA_ERR_NULL_POINTER, &["ptr"]);
    expect_error(fmha_stream_create(null_mut()), FMHA_ERR_NULL_POINTER, &["stream"]);
    expect_error(fmha_device_cu_count(null_mut()), FMHA_ERR_NULL_POINTER, &["count"]);
    expect_error(fmha_memset(null_mut(), 300, 4), FMHA_ERR_INVALID_ARGUMENT, &["value", "300"]);
    expect_error(fmha_memset_async(null_mut(), -1, 4, null_mut()), FMHA_ERR_INVALID_ARGUMENT, &["value"]);
    expect_error(fmha_memcpy_async(null_mut(), null(), 4, 0, null_mut()), FMHA_ERR_INVALID_ARGUMENT, &["kind"]);
    if no_device() {
        return;
    }
    expect_error(fmha_stream_destroy(null_mut()), FMHA_ERR_INVALID_ARGUMENT, &["default stream"]);
    if fmha_backend() == FMHA_BACKEND_HOST {
        // The host backend tracks its allocations and handles, so misuse is an error, not a crash.
        let mut p = null_mut();
        ok(fmha_device_malloc(&mut p, 64));
        ok(fmha_device_free(p));
        expect_error(fmha_device_free(p), FMHA_ERR_INVALID_ARGUMENT, &["ptr", "already freed"]);
        expect_error(fmha_host_free_pinned(0x1000 as *mut c_void), FMHA_ERR_INVALID_ARGUMENT, &["ptr"]);
        expect_error(fmha_stream_synchronize(0xdead as fmha_stream_t), FMHA_ERR_INVALID_ARGUMENT, &["stream"]);
        expect_error(fmha_stream_destroy(0xdead as fmha_stream_t), FMHA_ERR_INVALID_ARGUMENT, &["stream"]);
        expect_error(fmha_memcpy(null_mut(), p, 8, FMHA_MEMCPY_DEVICE_TO_HOST), FMHA_ERR_NULL_POINTER, &["dst"]);
        expect_error(fmha_memcpy(p, null(), 8, FMHA_MEMCPY_HOST_TO_DEVICE), FMHA_ERR_NULL_POINTER, &["src"]);
        expect_error(fmha_memset(null_mut(), 0, 8), FMHA_ERR_NULL_POINTER, &["dst"]);
        // Zero-byte operations are no-ops, even with null pointers (like the GPU runtimes).
        ok(fmha_memcpy(null_mut(), null(), 0, FMHA_MEMCPY_DEVICE_TO_DEVICE));
    }
}

#[test]
fn cu_count_query_and_host_override() {
    if no_device() {
        return;
    }
    let mut count = 0;
    ok(fmha_device_cu_count(&mut count));
    assert!(count >= 1);
    if fmha_backend() == FMHA_BACKEND_HOST {
        expect_error(fmha_host_set_cu_count(0), FMHA_ERR_INVALID_ARGUMENT, &["cu_count"]);
        expect_error(fmha_host_set_cu_count(5000), FMHA_ERR_INVALID_ARGUMENT, &["cu_count"]);
        // Other tests run in parallel and may set their own count; only check the call succeeds.
        ok(fmha_host_set_cu_count(count));
    } else {
        expect_error(fmha_host_set_cu_count(8), FMHA_ERR_UNSUPPORTED, &["host backend"]);
    }
}
