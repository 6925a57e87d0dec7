//! Calls into the library's own C++ (the kernels' launch stubs and their CPU-compiled twins), for the
//! launch layer. Every such entry point takes one argument block by pointer (`hip/launch.h`); these
//! helpers are generic over the block, so the runtime stays ignorant of what the blocks hold.

use super::Stream;
use std::ffi::c_void;

/// A launch stub (or a CPU twin with the same shape): reads `*args`, enqueues work on `stream`, and
/// returns the runtime's error code of the launch (0: success).
pub type Stub<A> = unsafe extern "C" fn(args: *const A, stream: *mut c_void) -> i32;

/// A CPU-compiled routine that writes at most `capacity` records to `out` and returns how many it has.
pub type Walker<A, R> = unsafe extern "C" fn(args: *const A, out: *mut R, capacity: i64) -> i64;

/// A CPU-compiled function of one value under `*args`, answering two values in `out`.
pub type PairFunction<A> = unsafe extern "C" fn(args: *const A, x: i64, out: *mut i64);

/// A CPU-compiled routine of one value under `*args` that writes at most `capacity` values to `out` and
/// returns how many it has.
pub type TableFunction<A> = unsafe extern "C" fn(args: *const A, x: i64, out: *mut i64, capacity: i64) -> i64;

/// A module loader of the launch stubs: no arguments, the runtime's error code.
pub type Loader = unsafe extern "C" fn() -> i32;

/// Calls `stub` with `args` on `stream`.
///
/// The stub copies `*args` into the kernel launch before it returns, and its kernels access only the
/// memory the block describes: the launch layer validated that description (extents, alignment, the
/// instance's requirements) before building the block, as every caller of this function must.
pub(crate) fn call_stub<A>(stub: Stub<A>, args: &A, stream: Stream) -> i32 {
    // SAFETY: `args` is a valid reference for the duration of the call and the stub does not keep it
    // (the C++ contract of `hip/launch.h`); the memory the kernels touch was validated by the launch
    // layer; `stream` is a native stream handle of this backend (or null: the default stream).
    unsafe { stub(args, stream.0 as *mut c_void) }
}

/// Calls a CPU walker with `args`, collecting its records; `None` when `capacity` was too small (the
/// routine's count is then larger than the buffer).
pub(crate) fn call_walker<A, R: Copy + Default>(walker: Walker<A, R>, args: &A, capacity: usize) -> Option<Vec<R>> {
    let mut out = vec![R::default(); capacity];
    // SAFETY: `args` is valid for the call; the routine writes at most `capacity` records to `out`, which
    // holds exactly that many (the C++ contract of `hip/launch.h`).
    let count = unsafe { walker(args, out.as_mut_ptr(), capacity as i64) };
    let count = usize::try_from(count).ok().filter(|&n| n <= capacity)?;
    out.truncate(count);
    Some(out)
}

/// Calls a CPU-compiled pair function.
pub(crate) fn call_pair<A>(function: PairFunction<A>, args: &A, x: i64) -> [i64; 2] {
    let mut out = [0i64; 2];
    // SAFETY: `args` is valid for the call and the routine writes exactly two values to `out`, which
    // holds two (the C++ contract of `hip/launch.h`).
    unsafe { function(args, x, out.as_mut_ptr()) };
    out
}

/// Calls a CPU table function with `args` and `x`, collecting its values; `None` when `capacity` was too
/// small.
pub(crate) fn call_table<A>(function: TableFunction<A>, args: &A, x: i64, capacity: usize) -> Option<Vec<i64>> {
    let mut out = vec![0i64; capacity];
    // SAFETY: `args` is valid for the call; the routine writes at most `capacity` values to `out`, which
    // holds exactly that many (the C++ contract of `hip/fwd/sm90/tile_walk_cpu.cpp`).
    let count = unsafe { function(args, x, out.as_mut_ptr(), capacity as i64) };
    let count = usize::try_from(count).ok().filter(|&n| n <= capacity)?;
    out.truncate(count);
    Some(out)
}

/// Calls a module loader.
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub(crate) fn call_loader(loader: Loader) -> i32 {
    // SAFETY: a loader only asks the runtime for a kernel's attributes on the current device.
    unsafe { loader() }
}
