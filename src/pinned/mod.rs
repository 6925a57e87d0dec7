//! The pinned-host releaser: one worker thread that frees page-locked host buffers handed to it from
//! any thread, including a runtime's callback thread, where calling the runtime (cudaFreeHost /
//! hipHostFree) can deadlock against a concurrent call on another thread (spec §5.3).
//!
//! `release` only takes a lock and pushes; the worker pops one buffer at a time and frees it outside
//! the lock. `shutdown` (and `Drop`) wakes the worker, which drains the queue before it exits; a
//! release that arrives after the worker exited is freed on the caller's thread, so nothing leaks
//! and nothing waits forever.
//!
//! The library's own staging buffers come from a pool of pinned buffers ([`PinnedPool`]) and go back
//! to it through the releaser, so that a backward's host-path prepare does not pin new memory.

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

/// How a buffer is freed (the runtime's pinned free, or a caller's allocator).
pub type Freer = Arc<dyn Fn(usize) + Send + Sync>;

struct Queue {
    pending: VecDeque<(usize, Freer)>,
    stopping: bool,
    worker_exited: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Critical sections only push, pop and set flags: a poisoned lock holds consistent data.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct PinnedReleaser {
    shared: Arc<Shared>,
    free: Freer,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl PinnedReleaser {
    /// A releaser whose `release` frees with `free`.
    pub fn new(free: Freer) -> Result<PinnedReleaser> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { pending: VecDeque::new(), stopping: false, worker_exited: false }),
            wake: Condvar::new(),
        });
        let worker_view = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("fmha-pinned-releaser".into())
            .spawn(move || work(&worker_view))
            .map_err(|e| Error::runtime(format!("cannot start the pinned releaser thread: {e}")))?;
        Ok(PinnedReleaser { shared, free, worker: Mutex::new(Some(worker)) })
    }

    /// Hands `ptr` to the worker, to be freed with this releaser's free function. Never calls the
    /// runtime on the caller's thread while the worker runs. Null is ignored.
    pub fn release(&self, ptr: usize) {
        self.release_with(ptr, Arc::clone(&self.free));
    }

    /// Hands `ptr` to the worker, to be freed with `free`.
    pub fn release_with(&self, ptr: usize, free: Freer) {
        if ptr == 0 {
            return;
        }
        let mut queue = self.shared.lock();
        if queue.worker_exited {
            drop(queue);
            free(ptr); // after shutdown: the caller's thread is the only one left to do it
            return;
        }
        queue.pending.push_back((ptr, free));
        drop(queue);
        self.shared.wake.notify_one();
    }

    /// Drains the queue, stops the worker and waits for it. Idempotent.
    pub fn shutdown(&self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(worker) = worker {
            // The worker catches panics of free functions, so join only fails if the thread was
            // killed; there is nothing left to clean up then.
            let _ = worker.join();
        }
    }

    /// Buffers queued and not yet freed.
    pub fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

fn work(shared: &Shared) {
    loop {
        let mut queue = shared.lock();
        while queue.pending.is_empty() && !queue.stopping {
            queue = shared.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        let Some((ptr, free)) = queue.pending.pop_front() else {
            queue.worker_exited = true; // stopping and drained
            return;
        };
        drop(queue);
        // A panicking free function must not kill the worker (the queue would never drain).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| free(ptr)));
    }
}

impl Drop for PinnedReleaser {
    fn drop(&mut self) {
        self.shutdown();
    }
}

static DEFAULT: OnceLock<std::result::Result<PinnedReleaser, Error>> = OnceLock::new();

/// The process-wide releaser the library uses for its own pinned staging buffers (frees with the
/// runtime's pinned free). Shut down when the library is unloaded or the process exits.
pub fn default_releaser() -> Result<&'static PinnedReleaser> {
    DEFAULT.get_or_init(|| PinnedReleaser::new(runtime_freer())).as_ref().map_err(Clone::clone)
}

/// Drains and stops the default releaser if something started it (library unload, process exit):
/// its thread must not outlive the library's code.
pub fn shutdown_default_releaser() {
    if let Some(Ok(releaser)) = DEFAULT.get() {
        releaser.shutdown();
    }
    POOL.drain();
}

/// Frees through the runtime's pinned free; failures cannot be reported from the worker and only
/// mean the runtime is already shutting down.
pub fn runtime_freer() -> Freer {
    Arc::new(|ptr| {
        if let Ok(rt) = crate::runtime::current() {
            let _ = rt.free_pinned(ptr);
        }
    })
}

/// Where pinned staging memory comes from: the runtime, or a caller's allocator.
#[derive(Clone)]
pub struct PinnedAllocator {
    pub allocate: Arc<dyn Fn(usize) -> Result<usize> + Send + Sync>,
    pub free: Freer,
}

impl PinnedAllocator {
    /// The backend's pinned allocation (cudaMallocHost / hipHostMalloc / host memory), through the
    /// process-wide [`PinnedPool`].
    pub fn runtime() -> PinnedAllocator {
        PinnedAllocator { allocate: Arc::new(|bytes| POOL.take(bytes)), free: Arc::new(|ptr| POOL.give(ptr)) }
    }
}

/// Idle buffers of [`PinnedAllocator::runtime`], reused by later allocations of their size class.
/// Pinning memory costs far more than the backward's staging copies it serves (the page mapping, and
/// a runtime call that can wait behind queued device work), and the host prepare path needs a buffer
/// for every backward. Classes are powers of two of at least a page; at most [`POOL_KEEP`] idle
/// buffers per class stay pinned, the rest go back to the runtime. Taking and giving only lock a
/// mutex, so a buffer may come back from a stream host function (through the releaser).
pub struct PinnedPool {
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    /// Idle buffers by class size.
    idle: std::collections::HashMap<usize, Vec<usize>>,
    /// The class size of every buffer the pool allocated, idle or in use.
    class_of: std::collections::HashMap<usize, usize>,
}

/// Idle buffers kept per size class.
pub const POOL_KEEP: usize = 8;

static POOL: std::sync::LazyLock<PinnedPool> = std::sync::LazyLock::new(PinnedPool::new);

impl PinnedPool {
    fn new() -> PinnedPool {
        PinnedPool { state: Mutex::new(PoolState::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Critical sections only move entries between maps: a poisoned lock holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pinned buffer of at least `bytes` bytes: an idle one of its class, or a new one.
    pub fn take(&self, bytes: usize) -> Result<usize> {
        let class = bytes
            .max(4096)
            .checked_next_power_of_two()
            .ok_or_else(|| Error::invalid("bytes", format!("{bytes} is too large for a pinned staging buffer")))?;
        if let Some(ptr) = self.lock().idle.get_mut(&class).and_then(Vec::pop) {
            return Ok(ptr);
        }
        let ptr = crate::runtime::current()?.malloc_pinned(class)?;
        self.lock().class_of.insert(ptr, class);
        Ok(ptr)
    }

    /// Returns a buffer from [`take`](Self::take): kept idle for reuse, or freed when its class
    /// already keeps [`POOL_KEEP`]. A pointer the pool did not allocate is freed.
    pub fn give(&self, ptr: usize) {
        let surplus = {
            let mut state = self.lock();
            match state.class_of.get(&ptr).copied() {
                Some(class) => {
                    let idle = state.idle.entry(class).or_default();
                    if idle.len() < POOL_KEEP {
                        idle.push(ptr);
                        false
                    } else {
                        state.class_of.remove(&ptr);
                        true
                    }
                }
                None => true,
            }
        };
        if surplus {
            runtime_freer()(ptr);
        }
    }

    /// Frees every idle buffer (library unload); buffers in use are freed when they come back.
    pub fn drain(&self) {
        let idle: Vec<usize> = {
            let mut state = self.lock();
            let idle: Vec<usize> = state.idle.drain().flat_map(|(_, list)| list).collect();
            for ptr in &idle {
                state.class_of.remove(ptr);
            }
            idle
        };
        let free = runtime_freer();
        for ptr in idle {
            free(ptr);
        }
    }

    /// Idle buffers kept, over all classes.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.lock().idle.values().map(Vec::len).sum()
    }
}

/// A pinned staging buffer. Dropping it hands the memory to the default releaser, so the last owner
/// may be a stream host function (which must not call the runtime).
pub struct PinnedStaging {
    ptr: usize,
    bytes: usize,
    free: Freer,
}

impl PinnedStaging {
    pub fn allocate(allocator: &PinnedAllocator, bytes: usize) -> Result<PinnedStaging> {
        let ptr = (allocator.allocate)(bytes)?;
        Ok(PinnedStaging { ptr, bytes, free: Arc::clone(&allocator.free) })
    }
    pub fn ptr(&self) -> usize {
        self.ptr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        // If no releaser thread could be started the buffer leaks: safe, where freeing on this thread
        // (possibly a runtime callback) may not be.
        if let Ok(releaser) = default_releaser() {
            releaser.release_with(self.ptr, Arc::clone(&self.free));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts frees per pointer: every pointer must be freed exactly once.
    #[derive(Default)]
    struct Ledger {
        freed: Mutex<HashSet<usize>>,
        duplicates: AtomicUsize,
    }

    fn counting(ledger: &Arc<Ledger>) -> Freer {
        let ledger = Arc::clone(ledger);
        Arc::new(move |ptr| {
            if !ledger.freed.lock().unwrap().insert(ptr) {
                ledger.duplicates.fetch_add(1, Ordering::Relaxed);
            }
        })
    }

    #[test]
    fn pool_reuses_buffers_by_class_and_keeps_a_bounded_number_idle() {
        let pool = PinnedPool::new();
        let a = pool.take(100).unwrap();
        let b = pool.take(5000).unwrap();
        assert_ne!(a, b);
        pool.give(a);
        pool.give(b);
        assert_eq!(pool.idle(), 2);
        // Same class (4096 bytes): the idle buffer comes back; 5000 bytes is the 8192 class.
        assert_eq!(pool.take(4096).unwrap(), a);
        assert_eq!(pool.take(8000).unwrap(), b);
        assert_eq!(pool.idle(), 0);
        pool.give(b);
        let many: Vec<usize> = (0..POOL_KEEP + 3).map(|_| pool.take(64).unwrap()).collect();
        assert!(!many.contains(&a), "a is in use");
        assert_eq!(many.iter().collect::<HashSet<_>>().len(), many.len());
        pool.give(a);
        for &ptr in &many {
            pool.give(ptr);
        }
        // The 4096 class keeps POOL_KEEP, the 8192 class b: the surplus went back to the runtime.
        assert_eq!(pool.idle(), POOL_KEEP + 1);
        pool.drain();
        assert_eq!(pool.idle(), 0);
        assert!(pool.lock().class_of.is_empty(), "every buffer was freed");
        assert!(pool.take(usize::MAX).is_err());
    }

    #[test]
    fn hundred_thousand_releases_from_sixteen_threads() {
        let ledger = Arc::new(Ledger::default());
        let releaser = Arc::new(PinnedReleaser::new(counting(&ledger)).unwrap());
        std::thread::scope(|scope| {
            for t in 0..16usize {
                let releaser = Arc::clone(&releaser);
                scope.spawn(move || {
                    for i in 0..6250usize {
                        releaser.release(1 + t * 6250 + i);
                    }
                });
            }
        });
        releaser.shutdown();
        assert_eq!(ledger.freed.lock().unwrap().len(), 100_000);
        assert_eq!(ledger.duplicates.load(Ordering::Relaxed), 0);
        assert_eq!(releaser.pending(), 0);
    }

    #[test]
    fn shutdown_drains_a_full_queue_and_later_releases_free_inline() {
        let ledger = Arc::new(Ledger::default());
        let (gate, opened) = (Arc::new(Mutex::new(false)), Arc::new(Condvar::new()));
        // The first free blocks until the queue is full, so shutdown starts with work pending.
        let blocking: Freer = {
            let (gate, opened, inner) = (Arc::clone(&gate), Arc::clone(&opened), counting(&ledger));
            Arc::new(move |ptr| {
                let mut open = gate.lock().unwrap();
                while !*open {
                    open = opened.wait(open).unwrap();
                }
                inner(ptr)
            })
        };
        let releaser = PinnedReleaser::new(blocking).unwrap();
        for ptr in 1..=10_000 {
            releaser.release(ptr);
        }
        assert!(releaser.pending() > 0);
        *gate.lock().unwrap() = true;
        opened.notify_all();
        releaser.shutdown();
        assert_eq!(ledger.freed.lock().unwrap().len(), 10_000);
        releaser.release(20_000); // after shutdown: freed on this thread
        assert!(ledger.freed.lock().unwrap().contains(&20_000));
        assert_eq!(ledger.duplicates.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn shutdown_while_releases_are_being_enqueued_loses_nothing() {
        for _ in 0..20 {
            let ledger = Arc::new(Ledger::default());
            let releaser = Arc::new(PinnedReleaser::new(counting(&ledger)).unwrap());
            std::thread::scope(|scope| {
                for t in 0..8usize {
                    let releaser = Arc::clone(&releaser);
                    scope.spawn(move || {
                        for i in 0..2000usize {
                            releaser.release(1 + t * 2000 + i);
                        }
                    });
                }
                let releaser = Arc::clone(&releaser);
                scope.spawn(move || releaser.shutdown());
            });
            releaser.shutdown();
            assert_eq!(ledger.freed.lock().unwrap().len(), 16_000);
            assert_eq!(ledger.duplicates.load(Ordering::Relaxed), 0);
        }
    }
}
