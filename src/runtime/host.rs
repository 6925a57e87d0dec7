//! The host backend: "device" memory is host memory, streams are in-order queues executed by one
//! worker thread each, host functions run in order on that worker, events are completion markers in
//! the queue, and the CU count the scheduler plans for is settable.
//!
//! It executes the same algorithms as the GPU backends (same tiles, workspace bytes and schedule), so
//! every CI run exercises the scheduler and workspace contracts end to end without a GPU.

use super::{Arch, BackendKind, CopyKind, Event, HostFunc, Runtime, Stream};
use crate::error::{Error, Result, Status};
use std::alloc::Layout;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Device allocations are aligned like `cudaMalloc`'s, so vectorised GPU-style indexing stays valid.
const DEVICE_ALIGNMENT: usize = 256;

/// Work queued on a host stream; an error is kept by the stream and reported by its next synchronize.
type Task = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

#[derive(Default)]
struct Progress {
    submitted: u64,
    completed: u64,
    /// The first failure of a queued task since the last synchronize (sticky, like a CUDA async error).
    error: Option<Error>,
}

struct HostStream {
    sender: Mutex<Option<mpsc::Sender<Task>>>,
    progress: Mutex<Progress>,
    done: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the protected data half-updated (every
    // critical section is a few field assignments), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl HostStream {
    fn spawn(name: String) -> Result<Arc<HostStream>> {
        let (sender, receiver) = mpsc::channel::<Task>();
        let stream = Arc::new(HostStream {
            sender: Mutex::new(Some(sender)),
            progress: Mutex::new(Progress::default()),
            done: Condvar::new(),
        });
        let worker_view = Arc::clone(&stream);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                // Runs until the stream is destroyed (sender dropped) and the queue is drained.
                for task in receiver {
                    let outcome = catch_unwind(AssertUnwindSafe(task)).unwrap_or_else(|panic| {
                        Err(Error::internal(format!(
                            "a task on a host stream panicked: {}",
                            crate::error::panic_message(&panic)
                        )))
                    });
                    let mut progress = lock(&worker_view.progress);
                    progress.completed += 1;
                    if let Err(e) = outcome {
                        progress.error.get_or_insert(e);
                    }
                    drop(progress);
                    worker_view.done.notify_all();
                }
            })
            .map_err(|e| Error::runtime(format!("cannot start a host stream worker thread: {e}")))?;
        Ok(stream)
    }

    fn enqueue(&self, task: Task) -> Result<()> {
        let sender = lock(&self.sender);
        let sender = sender.as_ref().ok_or_else(|| Error::invalid("stream", "the stream was destroyed"))?;
        lock(&self.progress).submitted += 1;
        sender.send(task).map_err(|_| Error::internal("host stream worker exited while the stream was alive"))
    }

    fn is_idle(&self) -> bool {
        let progress = lock(&self.progress);
        progress.completed == progress.submitted
    }

    /// Waits for the work queued before the call; the stream's error, if any, is taken (reported once).
    fn synchronize(&self) -> Result<()> {
        let mut progress = self.wait_for_queued();
        match progress.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for the work queued before the call and returns the stream's error without taking it: a
    /// destroyed stream's error goes to every device synchronize that waited for its work.
    fn wait_and_peek(&self) -> Option<Error> {
        self.wait_for_queued().error.clone()
    }

    fn wait_for_queued(&self) -> MutexGuard<'_, Progress> {
        let mut progress = lock(&self.progress);
        let target = progress.submitted;
        while progress.completed < target {
            progress = self.done.wait(progress).unwrap_or_else(|p| p.into_inner());
        }
        progress
    }

    fn has_error(&self) -> bool {
        lock(&self.progress).error.is_some()
    }
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    completed: u64,
    at: Option<Instant>,
}

#[derive(Default)]
struct HostEvent {
    state: Mutex<EventState>,
    done: Condvar,
}

/// The host runtime: tables of streams, events and allocations behind handles, so that a stale or
/// foreign handle is an error message, not a crash.
pub struct HostRuntime {
    cu_count: AtomicI64,
    default_stream: OnceLock<Arc<HostStream>>,
    streams: Mutex<HashMap<usize, Arc<HostStream>>>,
    /// Destroyed streams whose queued work may still be running, or whose failure no device synchronize
    /// has reported yet: `device_synchronize` waits for them too, as cudaDeviceSynchronize does. A
    /// stream leaves the list once a device synchronize saw it finished; every device synchronize that
    /// started before then waits for it and reports its error.
    draining: Mutex<Vec<Arc<HostStream>>>,
    events: Mutex<HashMap<usize, Arc<HostEvent>>>,
    allocations: Mutex<HashMap<usize, Layout>>,
    next_handle: AtomicUsize,
}

/// The process-wide host runtime.
pub fn runtime() -> &'static HostRuntime {
    static RUNTIME: OnceLock<HostRuntime> = OnceLock::new();
    RUNTIME.get_or_init(|| HostRuntime {
        cu_count: AtomicI64::new(default_cu_count()),
        default_stream: OnceLock::new(),
        streams: Mutex::new(HashMap::new()),
        draining: Mutex::new(Vec::new()),
        events: Mutex::new(HashMap::new()),
        allocations: Mutex::new(HashMap::new()),
        next_handle: AtomicUsize::new(1),
    })
}

/// By default one logical CU per hardware thread, so the executor uses the whole machine.
fn default_cu_count() -> i64 {
    std::thread::available_parallelism().map(|n| n.get() as i64).unwrap_or(1)
}

/// Largest CU count accepted by [`HostRuntime::set_cu_count`] (the biggest GPUs have a few hundred).
pub const MAX_HOST_CU_COUNT: i64 = 4096;

impl HostRuntime {
    /// Sets the CU count the persistent scheduler plans for (tests sweep it; results must not depend
    /// on it in deterministic mode).
    pub fn set_cu_count(&self, count: i64) -> Result<()> {
        crate::error::ensure((1..=MAX_HOST_CU_COUNT).contains(&count), "cu_count", || {
            format!("{count} is outside 1..={MAX_HOST_CU_COUNT}")
        })?;
        self.cu_count.store(count, Ordering::Relaxed);
        Ok(())
    }

    fn stream(&self, stream: Stream) -> Result<Arc<HostStream>> {
        if stream.0 == 0 {
            if let Some(s) = self.default_stream.get() {
                return Ok(Arc::clone(s));
            }
            let created = HostStream::spawn("fmha-default-stream".into())?;
            return Ok(Arc::clone(self.default_stream.get_or_init(|| created)));
        }
        lock(&self.streams).get(&stream.0).cloned().ok_or_else(|| {
            Error::invalid("stream", format!("{:#x} is not a live stream of the host backend", stream.0))
        })
    }

    fn event(&self, event: Event) -> Result<Arc<HostEvent>> {
        lock(&self.events)
            .get(&event.0)
            .cloned()
            .ok_or_else(|| Error::invalid("event", format!("{:#x} is not a live event of the host backend", event.0)))
    }

    /// Queues fallible work (a host kernel) on `stream`; its error is reported by the next synchronize.
    pub fn enqueue(&self, stream: Stream, task: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
        self.stream(stream)?.enqueue(Box::new(task))
    }

    fn alloc(&self, bytes: usize) -> Result<usize> {
        let layout = Layout::from_size_align(bytes.max(1), DEVICE_ALIGNMENT)
            .map_err(|_| Error::invalid("bytes", format!("{bytes} bytes cannot be allocated")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) } as usize;
        if ptr == 0 {
            return Err(Error::new(Status::OutOfMemory, format!("host backend: cannot allocate {bytes} bytes")));
        }
        lock(&self.allocations).insert(ptr, layout);
        Ok(ptr)
    }

    fn dealloc(&self, ptr: usize, field: &str) -> Result<()> {
        if ptr == 0 {
            return Ok(()); // like cudaFree(nullptr)
        }
        let layout = lock(&self.allocations)
            .remove(&ptr)
            .ok_or_else(|| Error::invalid(field, format!("{ptr:#x} was not allocated by fmha or was already freed")))?;
        // SAFETY: `ptr` was returned by `std::alloc::alloc(layout)` and removed from the table just now,
        // so it is freed exactly once.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        Ok(())
    }
}

fn copy_bytes(dst: usize, src: usize, bytes: usize) {
    if bytes > 0 {
        // SAFETY: the host backend's device memory is host memory; like `cudaMemcpy`, the caller
        // guarantees both ranges are valid for `bytes` bytes (checked non-null above). `copy` allows
        // overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
    }
}

fn set_bytes(dst: usize, value: u8, bytes: usize) {
    if bytes > 0 {
        // SAFETY: as for `copy_bytes`: the caller guarantees `dst` is valid for `bytes` bytes.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, bytes) };
    }
}

impl Runtime for HostRuntime {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn device(&self) -> Result<i32> {
        Ok(0)
    }
    fn arch(&self) -> Result<Arch> {
        Ok(Arch::Host)
    }
    fn cu_count(&self) -> Result<i64> {
        Ok(self.cu_count.load(Ordering::Relaxed))
    }

    fn malloc(&self, bytes: usize) -> Result<usize> {
        self.alloc(bytes)
    }
    fn free(&self, ptr: usize) -> Result<()> {
        self.dealloc(ptr, "ptr")
    }
    fn malloc_pinned(&self, bytes: usize) -> Result<usize> {
        self.alloc(bytes)
    }
    fn free_pinned(&self, ptr: usize) -> Result<()> {
        self.dealloc(ptr, "ptr")
    }

    fn memcpy(&self, dst: usize, src: usize, bytes: usize, kind: CopyKind) -> Result<()> {
        // Ordered after earlier default-stream work, like the legacy default stream of CUDA/HIP.
        self.memcpy_async(dst, src, bytes, kind, Stream(0))?;
        self.stream_synchronize(Stream(0))
    }
    fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, _kind: CopyKind, stream: Stream) -> Result<()> {
        super::check_range("dst", dst, bytes)?;
        super::check_range("src", src, bytes)?;
        self.enqueue(stream, move || {
            copy_bytes(dst, src, bytes);
            Ok(())
        })
    }
    fn memset(&self, dst: usize, value: u8, bytes: usize) -> Result<()> {
        self.memset_async(dst, value, bytes, Stream(0))?;
        self.stream_synchronize(Stream(0))
    }
    fn memset_async(&self, dst: usize, value: u8, bytes: usize, stream: Stream) -> Result<()> {
        super::check_range("dst", dst, bytes)?;
        self.enqueue(stream, move || {
            set_bytes(dst, value, bytes);
            Ok(())
        })
    }

    fn stream_create(&self) -> Result<Stream> {
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let stream = HostStream::spawn(format!("fmha-stream-{id}"))?;
        lock(&self.streams).insert(id, stream);
        Ok(Stream(id))
    }
    fn stream_destroy(&self, stream: Stream) -> Result<()> {
        if stream.0 == 0 {
            return Err(Error::invalid("stream", "the default stream cannot be destroyed"));
        }
        let removed = lock(&self.streams).remove(&stream.0).ok_or_else(|| {
            Error::invalid("stream", format!("{:#x} is not a live stream of the host backend", stream.0))
        })?;
        // Like cudaStreamDestroy: returns at once; queued work still runs, then the worker exits.
        lock(&removed.sender).take();
        let mut draining = lock(&self.draining);
        draining.retain(|s| !s.is_idle() || s.has_error());
        draining.push(removed);
        Ok(())
    }
    fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        self.stream(stream)?.synchronize()
    }
    fn stream_is_capturing(&self, stream: Stream) -> Result<bool> {
        self.stream(stream).map(|_| false)
    }
    fn launch_host_func(&self, stream: Stream, func: HostFunc) -> Result<()> {
        self.enqueue(stream, func)
    }

    fn event_create(&self) -> Result<Event> {
        let id = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.events).insert(id, Arc::new(HostEvent::default()));
        Ok(Event(id))
    }
    fn event_destroy(&self, event: Event) -> Result<()> {
        lock(&self.events)
            .remove(&event.0)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("event", format!("{:#x} is not a live event of the host backend", event.0)))
    }
    fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        let host_event = self.event(event)?;
        let generation = {
            let mut state = lock(&host_event.state);
            state.recorded += 1;
            state.recorded
        };
        self.enqueue(stream, move || {
            let mut state = lock(&host_event.state);
            if generation > state.completed {
                state.completed = generation;
                state.at = Some(Instant::now());
            }
            drop(state);
            host_event.done.notify_all();
            Ok(())
        })
    }
    fn event_synchronize(&self, event: Event) -> Result<()> {
        let host_event = self.event(event)?;
        let mut state = lock(&host_event.state);
        let target = state.recorded;
        while state.completed < target {
            state = host_event.done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        let at = |event: Event, field: &str| -> Result<Instant> {
            let host_event = self.event(event)?;
            let state = lock(&host_event.state);
            match (state.at, state.completed == state.recorded) {
                (Some(at), true) => Ok(at),
                _ => Err(Error::invalid(field, "the event has not completed (record and synchronize it first)")),
            }
        };
        let (t0, t1) = (at(start, "start")?, at(end, "end")?);
        Ok(t1.saturating_duration_since(t0).as_secs_f32() * 1e3)
    }

    fn device_synchronize(&self) -> Result<()> {
        let mut live: Vec<Arc<HostStream>> = lock(&self.streams).values().cloned().collect();
        live.extend(self.default_stream.get().cloned());
        // A snapshot, not a drain: a concurrent caller must wait for the same destroyed streams.
        let destroyed: Vec<Arc<HostStream>> = lock(&self.draining).clone();
        let mut first_error = None;
        for stream in &live {
            if let Err(e) = stream.synchronize() {
                first_error.get_or_insert(e);
            }
        }
        for stream in &destroyed {
            if let Some(e) = stream.wait_and_peek() {
                first_error.get_or_insert(e);
            }
        }
        // Destroyed streams take no new work, so the ones waited for are finished for good.
        lock(&self.draining).retain(|s| !destroyed.iter().any(|d| Arc::ptr_eq(d, s)));
        first_error.map_or(Ok(()), Err)
    }
}

/// Typed element access to host-backend device memory for kernels running on stream workers.
///
/// Elements are read and written through raw pointers, never through Rust references, so several
/// workers may write disjoint elements of one buffer at the same time (as GPU threads do).
#[derive(Debug)]
pub struct DeviceSlice<T> {
    ptr: usize,
    len: usize,
    _element: PhantomData<T>,
}

impl<T> Clone for DeviceSlice<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSlice<T> {}

impl<T: Copy> DeviceSlice<T> {
    /// A view of `len` elements at `ptr`. The launcher that builds it has validated that the tensor's
    /// extent (from its shape and strides) is what the caller described; like a GPU kernel, the view
    /// trusts that description. Null or misaligned pointers are refused here.
    pub fn new(ptr: super::DevicePtr<T>, len: usize, field: &str) -> Result<Self> {
        let ptr = ptr.addr().0;
        if len > 0 && ptr == 0 {
            return Err(Error::null(field));
        }
        // An empty view is never read: its address need not be aligned (the calls check what they use).
        if len > 0 && ptr % std::mem::align_of::<T>() != 0 {
            return Err(Error::invalid(
                field,
                format!("{ptr:#x} is not aligned to {} bytes", std::mem::align_of::<T>()),
            ));
        }
        Ok(DeviceSlice { ptr, len, _element: PhantomData })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn element(&self, index: usize) -> *mut T {
        assert!(index < self.len, "device slice index {index} out of bounds (len {})", self.len);
        (self.ptr as *mut T).wrapping_add(index)
    }

    pub fn get(&self, index: usize) -> T {
        // SAFETY: index is in bounds of the validated extent; unaligned reads are impossible because
        // the base is aligned for T.
        unsafe { self.element(index).read() }
    }

    pub fn set(&self, index: usize, value: T) {
        // SAFETY: as for `get`; no reference to the element exists, so concurrent writers of other
        // elements do not alias.
        unsafe { self.element(index).write(value) }
    }

    /// Copies `out.len()` contiguous elements starting at `start` into `out`.
    pub fn read_into(&self, start: usize, out: &mut [T]) {
        if out.is_empty() {
            return;
        }
        let _ = self.element(start + out.len() - 1);
        // SAFETY: the whole range [start, start + len) is in bounds (its last element was checked).
        unsafe { std::ptr::copy_nonoverlapping(self.element(start), out.as_mut_ptr(), out.len()) }
    }

    /// Sets the `count` contiguous elements starting at `start` to `value`.
    pub fn fill(&self, start: usize, count: usize, value: T) {
        if count == 0 {
            return;
        }
        let _ = self.element(start + count - 1);
        let first = self.element(start);
        for i in 0..count {
            // SAFETY: the range is in bounds (its last element was checked); written through raw
            // pointers, as `set` writes, so no reference to the elements exists.
            unsafe { first.add(i).write(value) }
        }
    }

    /// Writes `values` to the contiguous elements starting at `start`.
    pub fn write_from(&self, start: usize, values: &[T]) {
        if values.is_empty() {
            return;
        }
        let _ = self.element(start + values.len() - 1);
        // SAFETY: the range is in bounds (its last element was checked) and `values` is a distinct
        // Rust allocation.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.element(start), values.len()) }
    }
}

impl DeviceSlice<f32> {
    /// `atomicAdd` on an fp32 element: any interleaving of concurrent adds is allowed, as on a GPU.
    pub fn atomic_add(&self, index: usize, value: f32) {
        // SAFETY: the element is in bounds and 4-byte aligned; all concurrent accesses to dq_acc
        // elements that can race go through this atomic view.
        let cell = unsafe { AtomicU32::from_ptr(self.element(index) as *mut u32) };
        let mut current = cell.load(Ordering::Relaxed);
        loop {
            let next = (f32::from_bits(current) + value).to_bits();
            match cell.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}
