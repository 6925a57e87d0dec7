//! The launch layer: the one place that knows the kernels' parameter blocks (`abi.rs`, built by
//! `params.rs`), the C++ launch stubs, and the host executor (`host/`). Operations hand it validated
//! kernel arguments (`kargs.rs`); it runs them through the backend this build has: the `Executor` of
//! `gpu.rs` (the HIP kernels through the stubs) or of `host/` (the same algorithms on the CPU). Below it
//! is only the runtime.

pub mod abi;
pub mod cpu_twin;
pub mod dq_order;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod gpu;
pub mod host;
mod kargs;
mod params;

pub use kargs::{
    BwdExtents, BwdKargs, FwdExtents, FwdKargs, KvCacheKargs, KvSplitArgs, KvTableArgs, MergeExtents, MergeKargs,
};

use crate::error::{Error, Result};
use crate::runtime::{DevicePtr, Stream};
use crate::workspace::WorkspaceLayout;

/// How one backend runs the library's kernels. Each call only enqueues work on `stream`.
trait Executor {
    /// Makes every kernel of the build ready on the current device (see [`load_kernels`]).
    fn load_kernels() -> Result<()>;
    fn fill_u32(dst: DevicePtr<u32>, value: u32, count: usize, stream: Stream) -> Result<()>;
    fn prepare_workspace(
        layout: &WorkspaceLayout,
        workspace: DevicePtr<u8>,
        seqstart_q: DevicePtr<i32>,
        seqstart_k: DevicePtr<i32>,
        stream: Stream,
    ) -> Result<()>;
    fn forward(kargs: &FwdKargs, stream: Stream) -> Result<()>;
    fn backward(kargs: &BwdKargs, stream: Stream) -> Result<()>;
    fn kvcache_prepare(kargs: &KvCacheKargs, record: DevicePtr<abi::KvCacheFault>, stream: Stream) -> Result<()>;
    fn kvcache_forward(kargs: &KvCacheKargs, stream: Stream) -> Result<()>;
    fn merge(kargs: &MergeKargs, stream: Stream) -> Result<()>;
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
type Active = gpu::GpuExecutor;
#[cfg(not(any(feature = "cuda", feature = "rocm")))]
type Active = host::HostExecutor;

/// Loads the build's kernels onto the current device. The GPU executor does it before its first launch
/// on a device: the runtimes load a kernel's code module when one of its kernels is first used, and that
/// load can wait for all the work queued on the device (docs/perf.md, 2026-11-23), which would make
/// the first call of a new kernel (a new shape, a new mode) block the host. The host backend has
/// nothing to load.
pub fn load_kernels() -> Result<()> {
    Active::load_kernels()
}

/// Sets `count` 32-bit words at `dst` to `value`, on `stream`.
pub fn fill_u32(dst: DevicePtr<u32>, value: u32, count: usize, stream: Stream) -> Result<()> {
    if count > 0 && dst.is_null() {
        return Err(Error::null("dst"));
    }
    Active::fill_u32(dst, value, count, stream)
}

/// Prepares the backward workspace's metadata region at `workspace` from the sequence starts in device
/// memory, on `stream`, without synchronizing with the host: graph-capture safe (spec
/// `ck_fmha_bwd.md` §4.3). The seqstarts are `[batch + 1]` each in group mode, null in batch mode;
/// `workspace` holds at least `layout.metadata_bytes` bytes. The dq_acc region after the metadata is
/// not touched. Invalid seqstarts (only seen when the stream gets there) leave an all-zero region,
/// which a run refuses as not prepared; the host backend also reports the error at the stream's next
/// synchronize.
pub fn prepare_workspace(
    layout: &WorkspaceLayout,
    workspace: DevicePtr<u8>,
    seqstart_q: DevicePtr<i32>,
    seqstart_k: DevicePtr<i32>,
    stream: Stream,
) -> Result<()> {
    if workspace.is_null() {
        return Err(Error::null("workspace"));
    }
    crate::workspace::check_section_aligned("workspace", workspace.addr().0)?;
    Active::prepare_workspace(layout, workspace, seqstart_q, seqstart_k, stream)
}

/// Enqueues the forward described by `kargs` on `stream`.
pub fn forward(kargs: &FwdKargs, stream: Stream) -> Result<()> {
    Active::forward(kargs, stream)
}

/// Enqueues the backward (dot_do_o → dq_acc zeroing → dq_dk_dv → convert_dq; the GPU kernels zero dq_acc in
/// the dot_do_o launch) on `stream`.
pub fn backward(kargs: &BwdKargs, stream: Stream) -> Result<()> {
    Active::backward(kargs, stream)
}

/// Checks the lengths and page tables of a kv-cache call on `stream` (reading only them), writing the
/// outcome into the fault record at `record` (the workspace's first bytes), without synchronizing
/// with the host: graph-capture safe on the GPU.
pub fn kvcache_prepare(kargs: &KvCacheKargs, record: DevicePtr<abi::KvCacheFault>, stream: Stream) -> Result<()> {
    Active::kvcache_prepare(kargs, record, stream)
}

/// Enqueues a kv-cache forward on `stream`.
pub fn kvcache_forward(kargs: &KvCacheKargs, stream: Stream) -> Result<()> {
    Active::kvcache_forward(kargs, stream)
}

/// Enqueues a merge of attention states on `stream`.
pub fn merge(kargs: &MergeKargs, stream: Stream) -> Result<()> {
    Active::merge(kargs, stream)
}

#[cfg(test)]
mod kvcache_prepare_tests;
#[cfg(test)]
mod prepare_tests;
#[cfg(test)]
mod tile_walk_tests;
#[cfg(test)]
mod walker_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{current, CopyKind};

    /// The first kernel path end to end: allocate, fill on a stream, copy back, verify (runs on the
    /// GPU in cuda/rocm builds, on the host executor otherwise).
    #[test]
    fn fill_kernel_writes_every_word_and_nothing_else() {
        let rt = match current() {
            Ok(rt) => rt,
            Err(e) if e.status == crate::Status::NoDevice => {
                eprintln!("skipped: {}", e.message);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        for count in [0usize, 1, 255, 256, 257, 100_003, 70_000 * 256 + 5] {
            let total = count + 64; // guard words after the filled range must stay untouched
            let buffer = rt.malloc(total * 4).unwrap();
            rt.memset(buffer, 0xAB, total * 4).unwrap();
            let stream = rt.stream_create().unwrap();
            fill_u32(DevicePtr::new(buffer), 0x1234_5678, count, stream).unwrap();
            rt.stream_synchronize(stream).unwrap();
            let mut back = vec![0u32; total];
            rt.memcpy(back.as_mut_ptr() as usize, buffer, total * 4, CopyKind::DeviceToHost).unwrap();
            assert!(back[..count].iter().all(|&w| w == 0x1234_5678), "count {count}: unfilled word");
            assert!(back[count..].iter().all(|&w| w == 0xABAB_ABAB), "count {count}: write past the end");
            rt.stream_destroy(stream).unwrap();
            rt.free(buffer).unwrap();
        }
    }
}
