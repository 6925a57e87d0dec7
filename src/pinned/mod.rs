//! Page-locked host memory that crosses threads and streams.
//!
//! - `releaser`: one worker thread that frees pinned buffers handed to it from any thread,
//!   including a runtime's callback thread, where the runtime's pinned free may deadlock.
//! - `pool`: the library's own pinned buffers, reused by size class.
//! - `staging`: a pinned staging buffer whose drop hands it to the releaser.

mod pool;
mod releaser;
mod staging;

pub use pool::{PinnedAllocator, PinnedPool, POOL_KEEP};
pub use releaser::{default_releaser, runtime_freer, Freer, PinnedReleaser};
pub use staging::PinnedStaging;

/// Drains and stops the default releaser if something started it, then frees the pool's idle
/// buffers (library unload, process exit): the worker thread must not outlive the library's code.
pub fn shutdown_default_releaser() {
    releaser::shutdown_default();
    pool::drain_default();
}
