//! The device runtime behind one trait, with one implementation per backend: memory, streams, host
//! functions, events and device properties. The bottom layer: it imports nothing of the library but
//! its error type.
//!
//! Only this module (and `ffi/`) contains `unsafe` code. Everything above it talks to [`Runtime`]
//! through plain values: device addresses are [`DeviceAddr`] / [`DevicePtr`], stream handles
//! [`Stream`], so that launchers, schedulers and the C ABI layer stay free of raw-pointer juggling.

#[cfg(all(feature = "cuda", feature = "rocm"))]
compile_error!("features `cuda` and `rocm` are mutually exclusive: build one GPU backend at a time");

#[cfg(feature = "cuda")]
mod cuda;
pub mod foreign;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod gpu;
pub mod host;
#[cfg(feature = "rocm")]
mod rocm;

use crate::abi_values::*;
use crate::error::{Error, Result};
use std::marker::PhantomData;

abi_enum! {
    /// Which backend this build was compiled with (`fmha_backend()`, `FMHA_BACKEND_*`).
    pub enum BackendKind {
        Host = FMHA_BACKEND_HOST => "host",
        Cuda = FMHA_BACKEND_CUDA => "cuda",
        Rocm = FMHA_BACKEND_ROCM => "rocm",
    }
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

abi_enum! {
    /// Direction of a copy (`FMHA_MEMCPY_*`).
    pub enum CopyKind {
        HostToDevice = FMHA_MEMCPY_HOST_TO_DEVICE => "host to device",
        DeviceToHost = FMHA_MEMCPY_DEVICE_TO_HOST => "device to host",
        DeviceToDevice = FMHA_MEMCPY_DEVICE_TO_DEVICE => "device to device",
    }
}

impl CopyKind {
    pub fn from_i32(v: i32) -> Result<CopyKind> {
        CopyKind::parse(v)
            .ok_or_else(|| Error::invalid("kind", format!("{v} is not a copy kind ({})", CopyKind::choices())))
    }
}

/// A device address: device memory on GPU builds, host memory on the host backend. 0 is null.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct DeviceAddr(pub usize);

impl DeviceAddr {
    pub const NULL: DeviceAddr = DeviceAddr(0);

    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further (callers have checked that the range fits the address space).
    pub fn offset(self, bytes: usize) -> DeviceAddr {
        DeviceAddr(self.0.wrapping_add(bytes))
    }

    /// This address as the start of an array of `T`.
    pub fn cast<T>(self) -> DevicePtr<T> {
        DevicePtr::new(self.0)
    }
}

/// The device address of an array of `T`: seqstarts are `DevicePtr<i32>`, a workspace `DevicePtr<u8>`,
/// so the addresses of different things cannot be swapped by accident.
pub struct DevicePtr<T> {
    addr: DeviceAddr,
    _of: PhantomData<fn() -> T>,
}

impl<T> DevicePtr<T> {
    pub const NULL: DevicePtr<T> = DevicePtr::new(0);

    pub const fn new(addr: usize) -> DevicePtr<T> {
        DevicePtr { addr: DeviceAddr(addr), _of: PhantomData }
    }

    pub fn addr(self) -> DeviceAddr {
        self.addr
    }

    pub fn is_null(self) -> bool {
        self.addr.is_null()
    }
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}
impl<T> Default for DevicePtr<T> {
    fn default() -> Self {
        DevicePtr::NULL
    }
}
impl<T> PartialEq for DevicePtr<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr
    }
}
impl<T> Eq for DevicePtr<T> {}
impl<T> std::fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevicePtr<{}>({:#x})", std::any::type_name::<T>(), self.addr.0)
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

/// The check every backend makes on each range of a copy or memset before the runtime sees it (at the C
/// boundary; the host runtime again before it touches the memory itself): a null pointer or a range
/// that runs past the end of the address space is refused, naming the field (a GPU runtime would answer
/// only "invalid value"); beyond that, like `cudaMemcpy`, the caller vouches for the range.
pub fn check_range(field: &str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes > 0 && ptr == 0 {
        return Err(Error::null(field));
    }
    crate::error::ensure(ptr.checked_add(bytes).is_some(), field, || {
        format!("{bytes} bytes from {ptr:#x} run past the end of the address space")
    })
}
