//! The GPU runtime: one implementation of [`Runtime`] for both GPU backends, over the raw API names
//! that `cuda.rs` (libcudart) and `rocm.rs` (libamdhip64) provide.

#[cfg(feature = "cuda")]
use super::cuda as api;
#[cfg(feature = "rocm")]
use super::rocm as api;

use super::{Arch, BackendKind, CopyKind, Event, HostFunc, Runtime, Stream, ACTIVE_BACKEND};
use crate::error::{Error, Result, Status};
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Mutex, OnceLock};

pub struct GpuRuntime {
    _private: (),
}

/// The GPU runtime, or `NoDevice` when the machine has no usable device (checked once).
pub fn runtime() -> Result<&'static dyn Runtime> {
    static RUNTIME: OnceLock<std::result::Result<GpuRuntime, Error>> = OnceLock::new();
    match RUNTIME.get_or_init(probe) {
        Ok(runtime) => Ok(runtime),
        Err(e) => Err(e.clone()),
    }
}

fn probe() -> std::result::Result<GpuRuntime, Error> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-pointer.
    let code = unsafe { api::get_device_count(&mut count) };
    if code != api::SUCCESS || count <= 0 {
        return Err(Error::new(
            Status::NoDevice,
            format!(
                "no usable {} device: {} (a {} build of fmha needs a GPU and its driver)",
                api::BACKEND_NAME,
                if code != api::SUCCESS { describe(code) } else { "device count is 0".to_string() },
                api::BACKEND_NAME
            ),
        ));
    }
    Ok(GpuRuntime { _private: () })
}

fn describe(code: api::Code) -> String {
    // SAFETY: the error-string function returns null or a pointer to a static NUL-terminated string.
    let text = unsafe { api::error_string(code) };
    if text.is_null() {
        format!("{} error {code}", api::BACKEND_NAME)
    } else {
        // SAFETY: non-null static C string (see above).
        let text = unsafe { CStr::from_ptr(text) };
        format!("{} error {code} ({})", api::BACKEND_NAME, text.to_string_lossy())
    }
}

fn check(code: api::Code, what: &str) -> Result<()> {
    match code {
        api::SUCCESS => Ok(()),
        // cudaErrorMemoryAllocation = hipErrorOutOfMemory = 2
        2 => Err(Error::new(Status::OutOfMemory, format!("{what}: {}", describe(code)))),
        _ => Err(Error::runtime(format!("{what}: {}", describe(code)))),
    }
}

fn current_device() -> Result<c_int> {
    let mut device: c_int = 0;
    // SAFETY: valid out-pointer.
    check(unsafe { api::get_device(&mut device) }, "get current device")?;
    Ok(device)
}

fn attribute(attribute: c_int, what: &str) -> Result<c_int> {
    let device = current_device()?;
    let mut value: c_int = 0;
    // SAFETY: valid out-pointer; attribute ids come from the backend's constants.
    check(unsafe { api::device_get_attribute(&mut value, attribute, device) }, what)?;
    Ok(value)
}

fn stream_ptr(stream: Stream) -> api::RawStream {
    stream.0 as api::RawStream
}

fn event_ptr(event: Event) -> api::RawEvent {
    event.0 as api::RawEvent
}

/// Errors of host functions, by stream handle: the GPU runtime's own sticky error has no slot for them,
/// so the library keeps them and reports them from its synchronize calls. (A callback may only lock
/// this, never call the runtime.)
static STICKY: Mutex<Vec<(usize, Error)>> = Mutex::new(Vec::new());

fn sticky() -> std::sync::MutexGuard<'static, Vec<(usize, Error)>> {
    // Critical sections push or remove whole entries: a poisoned lock holds consistent data.
    STICKY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the host-function errors recorded for `stream` (for every stream when `None`) and reports the
/// first.
fn take_sticky(stream: Option<Stream>) -> Result<()> {
    let mut errors = sticky();
    let mut first = None;
    errors.retain(|(s, e)| {
        let taken = stream.map_or(true, |stream| *s == stream.0);
        if taken && first.is_none() {
            first = Some(e.clone());
        }
        !taken
    });
    first.map_or(Ok(()), Err)
}

/// What travels to the trampoline: the closure and the stream it runs on.
struct HostCall {
    func: HostFunc,
    stream: Stream,
}

/// Trampoline for host functions: the boxed [`HostCall`] travels as the user-data pointer.
unsafe extern "C" fn run_host_func(user_data: *mut c_void) {
    // SAFETY: `user_data` came from `Box::into_raw(Box<HostCall>)` in `launch_host_func` and the
    // runtime calls this trampoline exactly once.
    let call = unsafe { Box::from_raw(user_data as *mut HostCall) };
    let stream = call.stream;
    // Never unwind into the driver's callback thread.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call.func)).unwrap_or_else(|panic| {
        Err(Error::internal(format!("a host function panicked: {}", crate::error::panic_message(&*panic))))
    });
    if let Err(e) = outcome {
        sticky().push((stream.0, e));
    }
}

impl Runtime for GpuRuntime {
    fn kind(&self) -> BackendKind {
        ACTIVE_BACKEND
    }
    fn device(&self) -> Result<i32> {
        current_device()
    }
    fn arch(&self) -> Result<Arch> {
        let major = attribute(api::ATTRIBUTE_ARCH_MAJOR, "query device architecture")?;
        let minor = attribute(api::ATTRIBUTE_ARCH_MINOR, "query device architecture")?;
        Ok(api::arch_from_version(major, minor))
    }
    fn cu_count(&self) -> Result<i64> {
        attribute(api::ATTRIBUTE_CU_COUNT, "query compute unit count").map(i64::from)
    }

    fn malloc(&self, bytes: usize) -> Result<usize> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { api::malloc(&mut ptr, bytes) }, &format!("device allocation of {bytes} bytes"))?;
        Ok(ptr as usize)
    }
    fn free(&self, ptr: usize) -> Result<()> {
        // SAFETY: the caller passes a pointer from `malloc` (the runtime rejects others with an error).
        check(unsafe { api::free(ptr as *mut c_void) }, "device free")
    }
    fn malloc_pinned(&self, bytes: usize) -> Result<usize> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { api::malloc_host(&mut ptr, bytes) }, &format!("pinned allocation of {bytes} bytes"))?;
        Ok(ptr as usize)
    }
    fn free_pinned(&self, ptr: usize) -> Result<()> {
        // SAFETY: the caller passes a pointer from `malloc_pinned`.
        check(unsafe { api::free_host(ptr as *mut c_void) }, "pinned free")
    }

    fn memcpy(&self, dst: usize, src: usize, bytes: usize, kind: CopyKind) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are valid for `bytes` bytes in the spaces `kind` names.
        check(unsafe { api::memcpy(dst as *mut c_void, src as *const c_void, bytes, kind as c_int) }, "memcpy")
    }
    fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, kind: CopyKind, stream: Stream) -> Result<()> {
        // SAFETY: as for `memcpy`, valid until the stream has run the copy.
        check(
            unsafe {
                api::memcpy_async(dst as *mut c_void, src as *const c_void, bytes, kind as c_int, stream_ptr(stream))
            },
            "memcpy_async",
        )
    }
    fn memset(&self, dst: usize, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller guarantees `dst` is device memory valid for `bytes` bytes.
        check(unsafe { api::memset(dst as *mut c_void, c_int::from(value), bytes) }, "memset")
    }
    fn memset_async(&self, dst: usize, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: as for `memset`.
        check(
            unsafe { api::memset_async(dst as *mut c_void, c_int::from(value), bytes, stream_ptr(stream)) },
            "memset_async",
        )
    }

    fn stream_create(&self) -> Result<Stream> {
        let mut stream: api::RawStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { api::stream_create(&mut stream) }, "stream create")?;
        Ok(Stream(stream as usize))
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        if stream.0 == 0 {
            return Err(Error::invalid("stream", "the default stream cannot be destroyed"));
        }
        // SAFETY: a stream handle from the caller; the runtime validates it.
        check(unsafe { api::stream_destroy(stream_ptr(stream)) }, "stream destroy")
    }
    fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        // SAFETY: as above.
        check(unsafe { api::stream_synchronize(stream_ptr(stream)) }, "stream synchronize")?;
        take_sticky(Some(stream))
    }
    fn stream_is_capturing(&self, stream: Stream) -> Result<bool> {
        let mut status: c_int = 0;
        // SAFETY: valid out-pointer; stream from the caller.
        check(unsafe { api::stream_is_capturing(stream_ptr(stream), &mut status) }, "stream capture query")?;
        Ok(status != 0)
    }
    fn launch_host_func(&self, stream: Stream, func: HostFunc) -> Result<()> {
        let user_data = Box::into_raw(Box::new(HostCall { func, stream })) as *mut c_void;
        // SAFETY: the trampoline takes ownership of `user_data` when the runtime calls it.
        let code = unsafe { api::launch_host_func(stream_ptr(stream), run_host_func, user_data) };
        if code != api::SUCCESS {
            // SAFETY: the runtime refused the callback, so ownership stayed here; free it once.
            drop(unsafe { Box::from_raw(user_data as *mut HostCall) });
        }
        check(code, "launch host function")
    }

    fn event_create(&self) -> Result<Event> {
        let mut event: api::RawEvent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { api::event_create(&mut event) }, "event create")?;
        Ok(Event(event as usize))
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        // SAFETY: event handle from `event_create`.
        check(unsafe { api::event_destroy(event_ptr(event)) }, "event destroy")
    }
    fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        // SAFETY: handles from the caller.
        check(unsafe { api::event_record(event_ptr(event), stream_ptr(stream)) }, "event record")
    }
    fn event_synchronize(&self, event: Event) -> Result<()> {
        // SAFETY: handle from the caller.
        check(unsafe { api::event_synchronize(event_ptr(event)) }, "event synchronize")
    }
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid out-pointer; handles from the caller.
        check(unsafe { api::event_elapsed_time(&mut ms, event_ptr(start), event_ptr(end)) }, "event elapsed time")?;
        Ok(ms)
    }

    fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        check(unsafe { api::device_synchronize() }, "device synchronize")?;
        take_sticky(None)
    }
}
