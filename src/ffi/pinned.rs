//! Pinned host memory: the caller-provided allocator struct and the pinned-host releaser.

use super::{boundary, check_struct_size, fmha_status, read_in, write_out};
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
/// which must be callable from any thread.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_pinned_allocator {
    pub struct_size: usize,
    pub user_data: *mut c_void,
    pub allocate: fmha_pinned_allocate_fn,
    pub free: fmha_pinned_free_fn,
}

/// A pinned-host releaser (opaque): a worker thread that frees buffers handed to it.
pub struct fmha_pinned_releaser {
    inner: PinnedReleaser,
}

/// A validated caller allocator, shareable with the releaser thread.
#[derive(Clone, Copy)]
pub(crate) struct CallerAllocator {
    user_data: usize,
    allocate: unsafe extern "C" fn(*mut c_void, usize, *mut *mut c_void) -> fmha_status,
    free: unsafe extern "C" fn(*mut c_void, *mut c_void),
}

impl CallerAllocator {
    pub(crate) fn new(allocator: &fmha_pinned_allocator) -> Result<CallerAllocator> {
        let size = std::mem::size_of::<fmha_pinned_allocator>();
        check_struct_size(allocator.struct_size, size, size, "allocator")?;
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
        Arc::new(move |ptr| {
            // SAFETY: `ptr` came from this allocator's allocate; the releaser frees it exactly once.
            unsafe { (self.free)(self.user_data as *mut c_void, ptr as *mut c_void) }
        })
    }
}

fn releaser_or_default<'a>(releaser: *const fmha_pinned_releaser) -> Result<&'a PinnedReleaser> {
    if releaser.is_null() {
        pinned::default_releaser()
    } else {
        read_in(releaser, "releaser").map(|r| &r.inner)
    }
}

/// Creates a releaser into `*releaser`. With `allocator == NULL` it frees with the backend's pinned
/// free (memory from `fmha_host_malloc_pinned`); otherwise with `allocator->free`.
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
            CallerAllocator::new(read_in(allocator, "allocator")?)?.freer()
        };
        let created = Box::new(fmha_pinned_releaser { inner: PinnedReleaser::new(free)? });
        write_out(releaser, "releaser", Box::into_raw(created))
    })
}

/// Hands `ptr` to the releaser's thread to be freed. Callable from any thread, including stream host
/// functions and runtime callbacks. `releaser == NULL` uses the library's process-wide releaser
/// (which frees with the backend's pinned free). NULL `ptr` is ignored.
#[no_mangle]
pub extern "C" fn fmha_pinned_releaser_release(releaser: *const fmha_pinned_releaser, ptr: *mut c_void) -> fmha_status {
    boundary(|| {
        releaser_or_default(releaser)?.release(ptr as usize);
        Ok(())
    })
}

/// Frees everything queued, stops the thread and destroys the releaser (NULL is a no-op). Releases
/// racing with destroy are still freed exactly once; none may start after destroy returned.
#[no_mangle]
pub extern "C" fn fmha_pinned_releaser_destroy(releaser: *mut fmha_pinned_releaser) -> fmha_status {
    boundary(|| {
        if !releaser.is_null() {
            // SAFETY: a non-null releaser comes from `fmha_pinned_releaser_create` (Box::into_raw) and
            // is destroyed once; dropping it drains the queue and joins the thread.
            drop(unsafe { Box::from_raw(releaser) });
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
