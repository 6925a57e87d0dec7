//! `fmha`: fused multi-head attention behind a stable C ABI.
//!
//! Module map, top layer first (docs/architecture.md; `tests/layers.rs` checks the direction):
//! - [`ffi`]: every exported `extern "C"` function and the handle tables; nothing else.
//! - [`fwd`], [`bwd`], [`kvcache`], [`merge`]: the operations: traits, arguments, validation, launchers.
//!   Independent of each other.
//! - [`launch`]: the kernels' parameter blocks (the C++ header is generated from them), the launch
//!   stubs, and the executor of this build (GPU stubs or the host backend's kernels).
//! - [`registry`]: compiled kernel instances and their selection.
//! - [`workspace`], [`schedule`]: the backward workspace layout and the deterministic persistent
//!   schedule, one implementation for every backend.
//! - [`problem`]: the attention problem (dtypes, strided tensors, shape, masks, output overlap).
//! - [`pinned`]: the pinned-host releaser thread, pool and staging buffers.
//! - [`runtime`]: the device runtime behind one trait (host, CUDA, ROCm); all foreign calls.
//! - [`abi_values`], [`error`], [`host_buffer`]: ABI constants, status and error type, fallible host
//!   allocations.
//! - [`reference`](mod@reference): float64 reference attention for tests.

pub mod abi_values;
pub mod bwd;
pub mod error;
pub mod ffi;
pub mod fwd;
pub mod host_buffer;
pub mod kvcache;
pub mod launch;
pub mod merge;
pub mod pinned;
pub mod problem;
pub mod reference;
pub mod registry;
pub mod runtime;
pub mod schedule;
#[doc(hidden)]
pub mod test_rng;
pub mod workspace;

pub use error::{Error, Result, Status};

/// `major * 10000 + minor * 100 + patch` of the crate version.
pub const VERSION_NUMBER: u32 = version_number(env!("CARGO_PKG_VERSION"));

const fn version_number(version: &str) -> u32 {
    let bytes = version.as_bytes();
    let mut parts = [0u32; 3];
    let mut part = 0;
    let mut i = 0;
    while i < bytes.len() && part < 3 {
        let c = bytes[i];
        if c == b'.' {
            part += 1;
        } else if c.is_ascii_digit() {
            parts[part] = parts[part] * 10 + (c - b'0') as u32;
        } else {
            break; // pre-release suffix
        }
        i += 1;
    }
    parts[0] * 10000 + parts[1] * 100 + parts[2]
}
