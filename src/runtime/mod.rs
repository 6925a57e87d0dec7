//! The device runtime behind one trait, with one implementation per backend.
//!
//! Only this module (and `ffi/`) contains `unsafe` code. Everything above it talks to [`Runtime`]
//! through plain integers: device pointers and stream handles are `usize` values, so that launchers,
//! schedulers and the C ABI layer stay free of raw-pointer juggling.

#[cfg(all(feature = "cuda", feature = "rocm"))]
compile_error!("features `cuda` and `rocm` are mutually exclusive: build one GPU backend at a time");

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod gpu;
pub mod host;
pub mod launch;
#[cfg(feature = "rocm")]
mod rocm;

use crate::error::{Error, Result};

/// Which backend this build was compiled with (`fmha_backend()`; values are ABI).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Host = 0,
    Cuda = 1,
    Rocm = 2,
}

/// The backend selected at compile time.
pub const ACTIVE_BACKEND: BackendKind = if cfg!(feature = "cuda") {
    BackendKind::Cuda
} else if cfg!(feature = "rocm") {
    BackendKind::Rocm
} else {
    BackendKind::Host
};

/// The device architecture kernels are selected for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// The host backend's Rust executor.
    Host,
    /// NVIDIA Hopper (`sm_90a`).
    Sm90,
    /// AMD MI300 (CDNA3).
    Gfx942,
    /// AMD MI350 (CDNA4).
    Gfx950,
    /// A device this build has no kernels for; launches answer "unsupported".
    Other,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Host => "host",
            Arch::Sm90 => "sm_90a",
            Arch::Gfx942 => "gfx942",
            Arch::Gfx950 => "gfx950",
            Arch::Other => "other",
        }
    }

    /// AMD's MI300/MI350 dispatch workgroups round-robin over 8 XCDs; the persistent scheduler remaps
    /// its logical CUs so that each XCD walks a contiguous range (better L2 reuse).
    pub fn has_eight_xcds(self) -> bool {
        matches!(self, Arch::Gfx942 | Arch::Gfx950)
    }
}

/// Direction of a copy (`fmha_memcpy_kind`; values are ABI).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    HostToDevice = 1,
    DeviceToHost = 2,
    DeviceToDevice = 3,
}

impl CopyKind {
    pub fn from_i32(v: i32) -> Result<CopyKind> {
        match v {
            1 => Ok(CopyKind::HostToDevice),
            2 => Ok(CopyKind::DeviceToHost),
            3 => Ok(CopyKind::DeviceToDevice),
            _ => Err(Error::invalid(
                "kind",
                format!("{v} is not a copy kind (1 = host to device, 2 = device to host, 3 = device to device)"),
            )),
        }
    }
}

/// A stream handle as the runtime knows it: `0` is the default stream; for the GPU backends the value
/// is the native `cudaStream_t` / `hipStream_t`, for the host backend an id in its stream table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stream(pub usize);

/// An event handle (host: an id in the event table; GPU: the native event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub usize);

/// Work run on a stream's timeline by the host (a `hipLaunchHostFunc` callback on GPUs). An error it
/// returns becomes the stream's sticky error, reported by the stream's next synchronize (or the next
/// device synchronize), as a failed kernel's would be.
pub type HostFunc = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

/// Memory, streams, host functions, events and device properties of one backend.
pub trait Runtime: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// The ordinal of the calling thread's current device (0 on the host backend).
    fn device(&self) -> Result<i32>;
    /// The architecture of the current device.
    fn arch(&self) -> Result<Arch>;
    /// Compute units (AMD CUs, NVIDIA SMs, host logical CUs) the persistent scheduler plans for.
    fn cu_count(&self) -> Result<i64>;

    fn malloc(&self, bytes: usize) -> Result<usize>;
    fn free(&self, ptr: usize) -> Result<()>;
    fn malloc_pinned(&self, bytes: usize) -> Result<usize>;
    fn free_pinned(&self, ptr: usize) -> Result<()>;

    fn memcpy(&self, dst: usize, src: usize, bytes: usize, kind: CopyKind) -> Result<()>;
    fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, kind: CopyKind, stream: Stream) -> Result<()>;
    fn memset(&self, dst: usize, value: u8, bytes: usize) -> Result<()>;
    fn memset_async(&self, dst: usize, value: u8, bytes: usize, stream: Stream) -> Result<()>;

    fn stream_create(&self) -> Result<Stream>;
    fn stream_destroy(&self, stream: Stream) -> Result<()>;
    fn stream_synchronize(&self, stream: Stream) -> Result<()>;
    /// Whether the stream is being captured into a graph (host functions and pinned staging are then
    /// avoided by the library).
    fn stream_is_capturing(&self, stream: Stream) -> Result<bool>;
    /// Runs `func` on the host once all earlier work on `stream` is done; later work waits for it.
    /// `func` must not call the runtime (on GPUs it runs on the driver's callback thread). Its error is
    /// the stream's sticky error (see [`HostFunc`]).
    fn launch_host_func(&self, stream: Stream, func: HostFunc) -> Result<()>;

    fn event_create(&self) -> Result<Event>;
    fn event_destroy(&self, event: Event) -> Result<()>;
    fn event_record(&self, event: Event, stream: Stream) -> Result<()>;
    fn event_synchronize(&self, event: Event) -> Result<()>;
    /// Milliseconds between two recorded events.
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32>;

    /// Waits for all work queued on the device before the call, on every stream, including streams
    /// destroyed while their work was still queued; reports the first error of that work.
    fn device_synchronize(&self) -> Result<()>;
}

/// The runtime of the backend this build was compiled with. GPU builds fail with `NoDevice` when the
/// machine has no usable device.
pub fn current() -> Result<&'static dyn Runtime> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        gpu::runtime()
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        Ok(host::runtime())
    }
}
