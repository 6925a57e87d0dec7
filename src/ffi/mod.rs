//! The C ABI. Every `extern "C"` function of the library lives under this module, and every one that
//! can fail goes through `boundary`: it catches panics, turns errors into status codes and keeps the
//! message in a thread-local buffer for `fmha_last_error_message`.

#![allow(non_camel_case_types)]
// Exported functions take raw pointers from C and check them (null, extent) before use; marking them
// `unsafe fn` in Rust would change nothing for their C callers.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod attention;
pub mod backward;
mod handle;
pub mod kvcache;
pub mod merge;
pub mod pinned;
pub mod runtime;
pub mod status;
pub mod version;

use crate::error::{panic_message, Error, Result, Status};
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use status::fmha_status;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_last_error(message: String) {
    LAST_ERROR.with(|m| *m.borrow_mut() = message);
}

pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|m| m.borrow().clone())
}

/// Runs the body of an exported function: `Ok` → `FMHA_OK` and the message cleared; `Err` → its
/// status with the message kept; a panic → `FMHA_ERR_INTERNAL`, never an unwind into C.
pub(crate) fn boundary(body: impl FnOnce() -> Result<()>) -> fmha_status {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        Err(Error::internal(format!("internal error (please report): {}", panic_message(&*panic))))
    });
    match outcome {
        Ok(()) => {
            set_last_error(String::new());
            Status::Ok as fmha_status
        }
        Err(e) => {
            let status = e.status as fmha_status;
            set_last_error(e.message);
            status
        }
    }
}

/// Writes `value` through an out-pointer given by the caller.
pub(crate) fn write_out<T>(out: *mut T, field: &str, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::null(field));
    }
    // SAFETY: non-null (checked); the C caller passes a pointer to a writable `T` (the documented
    // contract of every out-parameter); `write` does not read or drop the old value.
    unsafe { out.write(value) };
    Ok(())
}
/// An extensible struct of the C ABI: it begins with `size_t struct_size`, and fields appended by later
/// versions take their defaults (zero) when an older caller's `struct_size` does not cover them.
///
/// # Safety
/// Implementors are `#[repr(C)]`, begin with a `usize` `struct_size`, and all-zero bytes are a valid
/// value of them (fields are integers, floats, raw pointers and `Option<fn>`).
pub(crate) unsafe trait Extensible: Copy {
    /// `sizeof` of each earlier published version of the struct, ascending; with this version's
    /// `sizeof`, the only `struct_size` values accepted (a size ending inside a field is no header's).
    const EARLIER_VERSION_SIZES: &'static [usize] = &[];
}

/// Reads a caller's extensible struct as docs/abi.md promises: `struct_size` first, then exactly that
/// many bytes over a zeroed struct, so a caller compiled against an older (smaller) header is never
/// read past its struct. Sizes that are not some version's `sizeof` are refused.
pub(crate) fn read_extensible<T: Extensible>(ptr: *const T, field: &str) -> Result<T> {
    if ptr.is_null() {
        return Err(Error::null(field));
    }
    // SAFETY: every extensible struct begins with `size_t struct_size` (the trait's contract), which any
    // caller's struct, of any version, holds; unaligned because nothing else is known of the address.
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    check_struct_size(size, T::EARLIER_VERSION_SIZES, std::mem::size_of::<T>(), field)?;
    // SAFETY: all-zero bytes are a valid `T` (the trait's contract).
    let mut value: T = unsafe { std::mem::zeroed() };
    // SAFETY: the caller provides `struct_size` readable bytes at `ptr` (the ABI contract of extensible
    // structs), and `size <= size_of::<T>()` (checked above), so the copy stays inside `value`.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&mut value as *mut T).cast::<u8>(), size) };
    Ok(value)
}

/// Borrows a caller-provided host array of `len` elements (null allowed only when `len == 0`).
pub(crate) fn read_slice<'a, T>(ptr: *const T, len: usize, field: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::null(field));
    }
    // SAFETY: non-null; the caller guarantees `len` initialised elements that outlive the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Checks the `struct_size` field that begins every extensible struct: a caller compiled against an
/// older header passes that version's smaller size, and the fields it does not know keep their
/// defaults.
fn check_struct_size(struct_size: usize, earlier: &[usize], current: usize, field: &str) -> Result<()> {
    crate::error::ensure(struct_size == current || earlier.contains(&struct_size), field, || {
        let older = if earlier.is_empty() { String::new() } else { format!(" or an earlier version's {earlier:?}") };
        format!("struct_size is {struct_size}, expected sizeof(the struct) = {current}{older}")
    })
}

/// A flag field of a C struct: 0 or 1; anything else is refused, naming the field.
pub(crate) fn flag(value: i32, field: &str) -> Result<bool> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::invalid(field, format!("{value} is not 0 or 1"))),
    }
}

/// Hands a JSON text out the way every `fmha_*_json` function does: the full length (without NUL) into
/// `*required`, the text into `buffer` as [`copy_c_string`] does (`buffer` may be NULL to ask for the
/// length).
pub(crate) fn write_json(json: &str, buffer: *mut std::ffi::c_char, length: usize, required: *mut usize) -> Result<()> {
    write_out(required, "required", json.len())?;
    copy_c_string(json, buffer, length);
    Ok(())
}

/// Copies `text` into a caller buffer of `length` bytes as a NUL-terminated string, truncated to
/// `length - 1` bytes. Nothing is written when `buffer` is null or `length` is 0.
pub(crate) fn copy_c_string(text: &str, buffer: *mut std::ffi::c_char, length: usize) {
    if buffer.is_null() || length == 0 {
        return;
    }
    let n = text.len().min(length - 1);
    // SAFETY: the caller provides `length` writable bytes at `buffer`; we write n + 1 <= length.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buffer as *mut u8, n);
        *buffer.add(n) = 0;
    }
}
