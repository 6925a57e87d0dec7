//! The library's own pinned buffers, reused by size class so that a backward's host-path prepare
//! does not pin new memory.

use super::releaser::{runtime_freer, Freer};
use crate::error::{Error, Result};
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Frees the process-wide pool's idle buffers (library unload).
pub(super) fn drain_default() {
    POOL.drain();
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

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
}
