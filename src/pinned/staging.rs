//! A pinned staging buffer whose last owner may be a stream host function.

use super::pool::PinnedAllocator;
use super::releaser::{default_releaser, Freer};
use crate::error::Result;
use std::sync::Arc;

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
