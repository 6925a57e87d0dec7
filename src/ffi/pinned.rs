//! Pinned host memory: the caller-provided allocator struct and the pinned-host releaser.

use super::handle::HandleTable;
use super::{boundary, fmha_status, read_extensible, write_out, Extensible};
use crate::error::{Error, Result};
use crate::pinned::{self, Freer, PinnedReleaser};
use std::ffi::c_void;
use std::sync::Arc;

/// Allocates `bytes` of page-locked host memory into `*ptr`; returns `FMHA_OK` or an error status.
pub type fmha_pinned_allocate_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, bytes: usize, ptr: *mut *mut c_void) -> fmha_status>;
/// Frees memory from the matching allocate function. fmha calls it only on its releaser thread,
/// never on a runtime callback thread, so it may call the device runtime.
pub type fmha_pinned_free_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, ptr: *mut c_void)>;

/// A caller's pinned host allocator (e.g. a framework's caching host allocator). Extensible: set
/// `struct_size = sizeof(fmha_pinned_allocator)`. `user_data` is passed back to both functions,
/// which must be callable from any thread. A releaser only frees: it needs `free`, and `allocate` may
/// be NULL there; an asynchronous prepare needs both.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_pinned_allocator {
    pub struct_size: usize,
    pub user_data: *mut c_void,
    pub allocate: fmha_pinned_allocate_fn,
    pub free: fmha_pinned_free_fn,
}

// SAFETY: repr(C), begins with `struct_size`; a raw pointer and two `Option<fn>` (zero is `None`).
unsafe impl Extensible for fmha_pinned_allocator {}

/// A pinned-host releaser (opaque): a worker thread that frees buffers handed to it. The handle is a
/// checked id, not an address: a destroyed or foreign handle is FMHA_ERR_INVALID_ARGUMENT.
pub struct fmha_pinned_releaser {
    _opaque: [u8; 0],
}

/// The live releasers.
static RELEASERS: HandleTable<PinnedReleaser> = HandleTable::new(0x524C, "fmha_pinned_releaser");

/// A validated caller allocator, shareable with the releaser thread.
#[derive(Clone, Copy)]
pub(crate) struct CallerAllocator {
    user_data: usize,
    allocate: unsafe extern "C" fn(*mut c_void, usize, *mut *mut c_void) -> fmha_status,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void),
}

impl CallerAllocator {
    /// Both functions of a caller's allocator (what the asynchronous prepare's staging needs).
    pub(crate) fn new(allocator: &fmha_pinned_allocator) -> Result<CallerAllocator> {
        Ok(CallerAllocator {
            user_data: allocator.user_data as usize,
            allocate: allocator.allocate.ok_or_else(|| Error::null("allocator.allocate"))?,
            free: allocator.free.ok_or_else(|| Error::null("allocator.free"))?,
        })
    }

    pub(crate) fn allocate(&self, bytes: usize) -> Result<usize> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller's allocate function, with its own user data and a valid out-pointer.
        let status = unsafe { (self.allocate)(self.user_data as *mut c_void, bytes, &mut ptr) };
        if status != super::status::FMHA_OK || ptr.is_null() {
            return Err(Error::new(
                crate::error::Status::OutOfMemory,
                format!("allocator.allocate: the caller's pinned allocator failed for {bytes} bytes (status {status})"),
            ));
        }
        Ok(ptr as usize)
    }

    /// The allocator as the launcher uses it (safe closures over the caller's functions).
    pub(crate) fn into_allocator(self) -> crate::pinned::PinnedAllocator {
        crate::pinned::PinnedAllocator { allocate: Arc::new(move |bytes| self.allocate(bytes)), free: self.freer() }
    }

    pub(crate) fn freer(self) -> Freer {
        caller_freer(self.user_data, self.free)
    }
}

/// Frees through a caller's free function.
fn caller_freer(user_data: usize, free: unsafe extern "C" fn(*mut c_void, *mut c_void)) -> Freer {
    Arc::new(move |ptr| {
        // SAFETY: `ptr` came from the caller's matching allocation; the releaser frees it exactly once.
        unsafe { free(user_data as *mut c_void, ptr as *mut c_void) }
    })
}

/// Creates a releaser into `*releaser`. With `allocator == NULL` it frees with the backend's pinned
/// free (memory from `fmha_host_malloc_pinned`); otherwise with `allocator->free` (`allocate` is not
/// used and may be NULL).
#[no_mangle]
pub extern "C" fn fmha_pinned_releaser_create(
    allocator: *const fmha_pinned_allocator,
    releaser: *mut *mut fmha_pinned_releaser,
) -> fmha_status {
    boundary(|| {
        if releaser.is_null() {
            return Err(Error::null("releaser"));
        }
        let free = if allocator.is_null() {
            pinned::runtime_freer()
        } else {
            let allocator = read_extensible(allocator, "allocator")?;
            let free = allocator.free.ok_or_else(|| Error::null("allocator.free"))?;
            caller_freer(allocator.user_data as usize, free)
        };
        let handle = RELEASERS.insert(PinnedReleaser::new(free)?)?;
        write_out(releaser, "releaser", handle as *mut fmha_pinned_releaser)
    })
}

/// Hands `ptr` to the releaser's thread to be freed. Callable from any thread, including stream host
/// functions and runtime callbacks. `releaser == NULL` uses the library's process-wide releaser
/// (which frees with the backend's pinned free). NULL `ptr` is ignored. A release that returns
/// `FMHA_OK` frees `ptr` exactly once; one that fails (the releaser was destroyed) leaves it to the
/// caller.
#[no_mangle]
pub extern "C" fn fmha_pinned_releaser_release(releaser: *const fmha_pinned_releaser, ptr: *mut c_void) -> fmha_status {
    boundary(|| {
        if releaser.is_null() {
            pinned::default_releaser()?.release(ptr as usize);
        } else {
            RELEASERS.get(releaser as usize, "releaser")?.release(ptr as usize);
        }
        Ok(())
    })
}

/// Destroys a releaser (NULL is a no-op): waits for the releases in flight on other threads, frees
/// everything queued and stops the thread. Releases racing with destroy either are freed exactly once
/// (`FMHA_OK`) or fail with `FMHA_ERR_INVALID_ARGUMENT` and free nothing; no call touches freed memory.
/// Destroying it again is `FMHA_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub extern "C" fn fmha_pinned_releaser_destroy(releaser: *mut fmha_pinned_releaser) -> fmha_status {
    boundary(|| {
        if !releaser.is_null() {
            let releaser = RELEASERS.remove(releaser as usize, "releaser")?;
            // New releases are refused from here; the ones in flight hold their own reference and only
            // push to the queue, so this wait is short. Then dropping the last reference drains the
            // queue on the worker and joins it.
            let mut releaser = releaser;
            loop {
                match Arc::try_unwrap(releaser) {
                    Ok(last) => break drop(last),
                    Err(shared) => {
                        releaser = shared;
                        std::thread::yield_now();
                    }
                }
            }
        }
        Ok(())
    })
}

/// Runs when the library is unloaded (dlclose) or the process exits: the default releaser's thread
/// must drain and stop before the code it runs goes away, and the staging pool's idle buffers are
/// unpinned.
extern "C" fn on_unload() {
    pinned::shutdown_default_releaser();
}

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;
