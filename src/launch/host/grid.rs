//! Runs the blocks of a grid (or the workgroups of a persistent launch) on host threads, like a GPU
//! runs workgroups on its compute units.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Calls `block(i)` for every `i < blocks`, on up to `workers` threads (never more than the machine
/// has). Stops at the first error and returns it. Blocks must not depend on each other's order.
pub fn for_each_block(blocks: usize, workers: i64, block: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    if blocks == 0 {
        return Ok(());
    }
    let hardware = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = (workers.max(1) as usize).min(hardware).min(blocks);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let work = || {
        while !failed.load(Ordering::Relaxed) {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= blocks {
                break;
            }
            if let Err(e) = block(i) {
                failed.store(true, Ordering::Relaxed);
                first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(work);
            }
        });
    }
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
