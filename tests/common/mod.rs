//! Helpers shared by the integration tests: they call the library through its C ABI (only [`Gate`]
//! uses the runtime's host functions directly, which the C ABI does not export).
#![allow(dead_code)]

pub mod attention;

use fmha::ffi::runtime::fmha_stream_t;
use fmha::ffi::status::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Whether this build is the host backend (else a GPU build).
pub fn host_backend() -> bool {
    fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Host
}

/// Tests that hold a stream with a [`Gate`] run alone ([`gated`], a write lock), all others of their
/// binary share ([`not_gated`], a read lock). On a GPU, a host function that blocks stalls the runtime's
/// callback thread, and synchronous calls (copies, the legacy stream's synchronize) wait for every
/// blocking stream, the gated one included: a gate next to another test's CUDA calls can deadlock the
/// process (measured: the hardening binary hung in 8 of 10 parallel runs on an H200 before its tests
/// took these locks, never in 25 runs without its gated test).
static GATE_LOCK: RwLock<()> = RwLock::new(());

pub fn gated() -> RwLockWriteGuard<'static, ()> {
    GATE_LOCK.write().unwrap_or_else(|p| p.into_inner())
}

pub fn not_gated() -> RwLockReadGuard<'static, ()> {
    GATE_LOCK.read().unwrap_or_else(|p| p.into_inner())
}

/// A host function that holds a stream until [`open`](Gate::open) is called; it then fails with
/// `AsyncFailure` if asked to (the stream's sticky error).
pub struct Gate {
    state: Arc<(Mutex<bool>, Condvar)>,
}

impl Gate {
    pub fn close(stream: fmha_stream_t, fail: bool) -> Gate {
        let state = Arc::new((Mutex::new(false), Condvar::new()));
        let waiter = Arc::clone(&state);
        let func = Box::new(move || {
            let (open, changed) = &*waiter;
            let mut open = open.lock().unwrap();
            while !*open {
                open = changed.wait(open).unwrap();
            }
            if fail {
                Err(fmha::Error::new(fmha::Status::AsyncFailure, "gate: failed on purpose"))
            } else {
                Ok(())
            }
        });
        let stream = fmha::runtime::Stream(stream as usize);
        fmha::runtime::current().unwrap().launch_host_func(stream, func).unwrap();
        Gate { state }
    }

    pub fn open(&self) {
        *self.state.0.lock().unwrap() = true;
        self.state.1.notify_all();
    }
}

/// The thread-local message of the last failed call.
pub fn last_error() -> String {
    let len = fmha::ffi::status::fmha_last_error_message(std::ptr::null_mut(), 0);
    let mut buffer = vec![0u8; len + 1];
    fmha::ffi::status::fmha_last_error_message(buffer.as_mut_ptr() as *mut _, buffer.len());
    String::from_utf8_lossy(&buffer[..len]).into_owned()
}

/// Asserts `status` is `expected` and the message mentions every word of `needles`.
#[track_caller]
pub fn expect_error(status: fmha_status, expected: fmha_status, needles: &[&str]) {
    let message = last_error();
    assert_eq!(status, expected, "unexpected status; message: {message}");
    for needle in needles {
        assert!(message.contains(needle), "message {message:?} does not mention {needle:?}");
    }
}

/// An error that only the work on a stream can find (device-side arguments): the host backend reports
/// it at the stream's synchronize; GPU kernels have no error channel, so there the work is refused
/// without writing outside its buffers and the synchronize succeeds.
#[track_caller]
pub fn expect_stream_error(status: fmha_status, expected: fmha_status, needles: &[&str]) {
    if host_backend() {
        expect_error(status, expected, needles);
    } else {
        ok(status);
    }
}

#[track_caller]
pub fn ok(status: fmha_status) {
    assert_eq!(status, FMHA_OK, "call failed: {}", last_error());
}

/// True on GPU builds running without a device (tests then only check the clean failure).
pub fn no_device() -> bool {
    let mut count = 0;
    fmha::ffi::runtime::fmha_device_cu_count(&mut count) == FMHA_ERR_NO_DEVICE
}

/// Serialises tests that change the host backend's CU count (a process-wide setting).
pub static CU_COUNT_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// max over the keys of Σ_e |q_e · k_e| for query row `i` of head `h` (`q`: [hq][sq][d] of one
/// sequence, `k`: [hk][kv][d]).
pub fn abs_dot_max(
    q: &[f64],
    k: &[f64],
    h: usize,
    i: usize,
    (hq, hk, sq, kv, d): (usize, usize, usize, usize, usize),
) -> f64 {
    let qi = &q[(h * sq + i) * d..(h * sq + i + 1) * d];
    let g = h / (hq / hk);
    (0..kv)
        .map(|j| qi.iter().zip(&k[(g * kv + j) * d..(g * kv + j + 1) * d]).map(|(a, b)| (a * b).abs()).sum::<f64>())
        .fold(0.0, f64::max)
}

/// What fp8 tensor cores may add to a score's (and so the LSE's) error: Hopper's e4m3 wgmma keeps
/// about 14 bits of the running sum of a dot product (DeepSeek-V3 §3.3.2) and rounds it at every 32-deep
/// k step, so a score of head dim `d` may be off by ⌈d / 32⌉ · 2^-12 (two of those units per step) of
/// `scaled_abs_dot`, the scaled sum of its products' magnitudes. The roundings do not cancel when the
/// products have one sign: an H200 with inputs in [0, 1) and d = 128 gave LSEs low by about 1.4 · 2^-13
/// per step (2026-11-24, tests/python/test_forward.py::test_fp8_forward).
pub fn fp8_accumulation(d: usize, scaled_abs_dot: f64) -> f64 {
    d.div_ceil(32) as f64 * 2f64.powi(-12) * scaled_abs_dot
}

/// The fp8 output rule (spec/inference.md §2.5): against the float64 reference on the dequantised
/// inputs, the max error within 4× and the mean within 3× of the baseline's (the same computation with
/// P rounded to the format as the kernels round it and O to bf16), plus bf16's output rounding of
/// values up to 4 as a floor. `max` and `sum` are (kernel, baseline) pairs over `count` elements.
#[track_caller]
pub fn fp8_output_rule(ctx: &str, (err_max, base_max): (f64, f64), (err_sum, base_sum): (f64, f64), count: usize) {
    let floor = 2f64.powi(-8) * 4.0;
    assert!(err_max <= 4.0 * base_max + floor, "{ctx}: O max error {err_max:e} > 4 × {base_max:e} + {floor:e}");
    if count > 0 {
        let (mean, base_mean) = (err_sum / count as f64, base_sum / count as f64);
        assert!(mean <= 3.0 * base_mean + floor / 4.0, "{ctx}: O mean error {mean:e} vs baseline {base_mean:e}");
    }
}

/// Memory of `len` bytes that ends where an unreadable page begins: a read past `len` faults.
pub struct GuardedBytes {
    map: *mut c_void,
    map_len: usize,
    start: *mut u8,
}

impl GuardedBytes {
    pub fn new(len: usize) -> GuardedBytes {
        let page = 4096;
        let pages = len.div_ceil(page) + 1;
        let map_len = pages * page;
        // SAFETY: an anonymous private mapping; the last page is made inaccessible below.
        let map = unsafe {
            libc::mmap(
                null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let guard = (map as usize + map_len - page) as *mut c_void;
        // SAFETY: the guard page lies inside the mapping made above.
        assert_eq!(unsafe { libc::mprotect(guard, page, libc::PROT_NONE) }, 0);
        GuardedBytes { map, map_len, start: (guard as usize - len) as *mut u8 }
    }

    /// Copies the first `len` bytes of `value` to the guarded memory and returns a pointer to them.
    pub fn place<T>(&self, value: &T, len: usize) -> *const T {
        // SAFETY: `value` has at least `len` bytes (len <= size_of::<T>()), the region holds `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(value as *const T as *const u8, self.start, len) };
        self.start as *const T
    }
}

impl Drop for GuardedBytes {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}
