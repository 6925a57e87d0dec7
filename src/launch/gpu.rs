//! The GPU executor: the kernels' parameter blocks handed to the C++ launch stubs of `hip/launch.h`
//! (compiled from `hip/` by `build.rs`).

use super::abi::{self, FillParams, PrepareArgs, PrepareParams};
use super::{BwdKargs, Executor, FwdKargs, KvCacheKargs, MergeKargs};
use crate::error::{Error, Result};
use crate::runtime::foreign::{call_loader, call_stub};
use crate::runtime::{self, DevicePtr, Stream};
use crate::workspace::WorkspaceLayout;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct GpuExecutor;

fn launch_result(kernel: &str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::runtime(format!("launch of kernel {kernel} failed with runtime error code {code}")))
    }
}

/// Devices (ordinals below 64) whose modules are loaded. Devices past 64 load every time: loading a
/// loaded module is a lookup.
static LOADED: AtomicU64 = AtomicU64::new(0);

impl Executor for GpuExecutor {
    fn load_kernels() -> Result<()> {
        let device = runtime::current()?.device()?; // NoDevice before touching the driver
        let bit = if (0..64).contains(&device) { 1u64 << device } else { 0 };
        if bit != 0 && LOADED.load(Ordering::Acquire) & bit != 0 {
            return Ok(());
        }
        let loads: [(&str, runtime::foreign::Loader); 6] = [
            ("fill", abi::fmha_hip_load_fill),
            ("prepare", abi::fmha_hip_load_prepare),
            ("forward", abi::fmha_hip_load_forward),
            ("backward", abi::fmha_hip_load_backward),
            ("kvcache", abi::fmha_hip_load_kvcache),
            ("merge", abi::fmha_hip_load_merge),
        ];
        for (module, load) in loads {
            launch_result(&format!("module load {module}"), call_loader(load))?;
        }
        LOADED.fetch_or(bit, Ordering::AcqRel);
        Ok(())
    }

    fn fill_u32(dst: DevicePtr<u32>, value: u32, count: usize, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The caller's `dst` holds `count` words (the fill's contract).
        let args = FillParams { dst: dst.addr().0 as u64, count: count as u64, value, pad: 0 };
        launch_result("fill_u32", call_stub(abi::fmha_hip_fill_u32, &args, stream))
    }

    fn prepare_workspace(
        layout: &WorkspaceLayout,
        workspace: DevicePtr<u8>,
        seqstart_q: DevicePtr<i32>,
        seqstart_k: DevicePtr<i32>,
        stream: Stream,
    ) -> Result<()> {
        Self::load_kernels()?;
        // The kernel writes `layout.metadata_bytes` bytes at `workspace` and reads `batch + 1` entries of
        // each non-null seqstart array: device memory of those sizes, as the operation checked.
        let args = PrepareArgs {
            workspace: workspace.addr().0 as u64,
            seqstart_q: seqstart_q.addr().0 as u64,
            seqstart_k: seqstart_k.addr().0 as u64,
            params: PrepareParams::new(layout),
        };
        launch_result("prepare_workspace", call_stub(abi::fmha_hip_prepare_workspace, &args, stream))
    }

    fn forward(kargs: &FwdKargs, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The block describes tensors validated against their shapes and strides (FwdArgs::validate)
        // for an instance this build compiled.
        let params = abi::FwdParams::new(kargs);
        launch_result("fwd", call_stub(abi::fmha_hip_fwd, &params, stream))
    }

    fn backward(kargs: &BwdKargs, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The block describes tensors validated against their shapes and strides (BwdArgs::extents,
        // Instance::check_tensor) and a workspace of at least the launcher's size, for an instance this
        // build compiled.
        let params = abi::BwdParams::new(kargs);
        launch_result("bwd", call_stub(abi::fmha_hip_bwd, &params, stream))
    }

    fn kvcache_prepare(kargs: &KvCacheKargs, record: DevicePtr<abi::KvCacheFault>, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The kernel reads the table arrays of the validated kernel arguments (addressable for their
        // lengths, KvCacheArgs::validate) and writes one record at `record`, inside the workspace.
        let params = abi::KvCacheParams::new(kargs, record);
        launch_result("kvcache_prepare", call_stub(abi::fmha_hip_kvcache_prepare, &params, stream))
    }

    fn kvcache_forward(kargs: &KvCacheKargs, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The block describes tensors and arrays validated against the traits (KvCacheArgs::validate,
        // KvCacheLauncher::run) for an instance this build compiled; device values are clamped.
        let params = abi::KvCacheParams::new(kargs, DevicePtr::NULL);
        launch_result("kvcache_fwd", call_stub(abi::fmha_hip_kvcache_fwd, &params, stream))
    }

    fn merge(kargs: &MergeKargs, stream: Stream) -> Result<()> {
        Self::load_kernels()?;
        // The block describes states and outputs validated against their shapes and strides
        // (MergeArgs::validate): every element the kernel reads or writes lies in them.
        let params = abi::MergeParams::new(kargs);
        launch_result("merge", call_stub(abi::fmha_hip_merge, &params, stream))
    }
}
