//! The pinned-host releaser: one worker thread that frees page-locked host buffers handed to it from
//! any thread, including a runtime's callback thread, where calling the runtime (cudaFreeHost /
//! hipHostFree) can deadlock against a concurrent call on another thread (spec §5.3).
//!
//! `release` only takes a lock and pushes; the worker pops one buffer at a time and frees it outside
//! the lock. `shutdown` (and `Drop`) wakes the worker, which drains the queue before it exits; a
//! release that arrives after the worker exited is freed on the caller's thread, so nothing leaks
//! and nothing waits forever.

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

/// Drains and stops the default releaser if something started it.
pub(super) fn shutdown_default() {
    if let Some(Ok(releaser)) = DEFAULT.get() {
        releaser.shutdown();
    }
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
