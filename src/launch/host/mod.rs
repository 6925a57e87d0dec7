//! The host executor: the same algorithms as `hip/`, as tile loops over the same kernel arguments,
//! workspace bytes and schedule, run on the host backend's stream worker threads.

pub mod attend;
pub mod backward;
pub mod fill;
pub mod forward;
pub mod grid;
pub mod merge;
pub mod paged_forward;
pub mod sequence;
pub mod tensor_view;
pub mod tile_math;

use super::abi::KvCacheFault;
use super::{BwdKargs, Executor, FwdKargs, KvCacheKargs, MergeKargs};
use crate::error::{Error, Result};
use crate::host_buffer::{try_filled, AlignedBytes};
use crate::problem::fp8::{E4m3fn, E4m3fnuz};
use crate::problem::{CacheDtype, Dtype, Element, Fp8Format};
use crate::runtime::host::{runtime, DeviceSlice};
use crate::runtime::{DevicePtr, Runtime, Stream};
use crate::workspace::WorkspaceLayout;
use half::{bf16, f16};

pub struct HostExecutor;

/// The workspace prepare as the device kernel does it, on memory the host addresses (host-backend
/// device memory, or pinned staging memory in a GPU stream's host function): reads the seqstart arrays
/// (group mode), packs the metadata region into `out` with `workspace::prepare_metadata`, or, when that
/// fails, leaves `out` all zero ("not prepared": a run with it computes nothing) and returns the error.
pub fn prepare_region(
    layout: &WorkspaceLayout,
    seqstart_q: Option<DeviceSlice<i32>>,
    seqstart_k: Option<DeviceSlice<i32>>,
    out: DeviceSlice<u8>,
) -> Result<()> {
    let packed = || -> Result<AlignedBytes> {
        let read = |s: Option<DeviceSlice<i32>>, field: &str| -> Result<Option<Vec<i32>>> {
            s.map(|s| {
                let mut host = try_filled(s.len(), 0, field)?;
                s.read_into(0, &mut host);
                Ok(host)
            })
            .transpose()
        };
        let (q, k) = (read(seqstart_q, "seqstart_q")?, read(seqstart_k, "seqstart_k")?);
        let mut bytes = AlignedBytes::new(layout.metadata_bytes, 0, "batch")?;
        crate::workspace::prepare_metadata(layout, q.as_deref(), k.as_deref(), bytes.as_mut_slice())?;
        Ok(bytes)
    };
    match packed() {
        Ok(bytes) => {
            out.write_from(0, bytes.as_slice());
            Ok(())
        }
        Err(error) => {
            out.fill(0, out.len(), 0);
            Err(error)
        }
    }
}

impl Executor for HostExecutor {
    fn load_kernels() -> Result<()> {
        Ok(())
    }

    fn fill_u32(dst: DevicePtr<u32>, value: u32, count: usize, stream: Stream) -> Result<()> {
        let out = DeviceSlice::<u32>::new(dst, count, "dst")?;
        runtime().enqueue(stream, move || {
            fill::fill_u32(out, value);
            Ok(())
        })
    }

    fn prepare_workspace(
        layout: &WorkspaceLayout,
        workspace: DevicePtr<u8>,
        seqstart_q: DevicePtr<i32>,
        seqstart_k: DevicePtr<i32>,
        stream: Stream,
    ) -> Result<()> {
        let out = DeviceSlice::<u8>::new(workspace, layout.metadata_bytes, "workspace")?;
        let entries = layout.params.batch as usize + 1;
        let seqstart = |array: DevicePtr<i32>, field: &str| {
            (!array.is_null()).then(|| DeviceSlice::<i32>::new(array, entries, field)).transpose()
        };
        let (q, k) = (seqstart(seqstart_q, "seqstart_q")?, seqstart(seqstart_k, "seqstart_k")?);
        let layout = *layout;
        runtime().enqueue(stream, move || prepare_region(&layout, q, k, out))
    }

    fn forward(kargs: &FwdKargs, stream: Stream) -> Result<()> {
        let cu_count = runtime().cu_count()?;
        let kargs = *kargs;
        runtime().enqueue(stream, move || match kargs.shape.dtype {
            CacheDtype::Half(Dtype::F16) => forward::run::<f16, f16>(&kargs, cu_count),
            CacheDtype::Half(Dtype::Bf16) => forward::run::<bf16, bf16>(&kargs, cu_count),
            CacheDtype::Fp8(Fp8Format::E4m3fn) => forward::run::<E4m3fn, bf16>(&kargs, cu_count),
            CacheDtype::Fp8(Fp8Format::E4m3fnuz) => forward::run::<E4m3fnuz, bf16>(&kargs, cu_count),
        })
    }

    fn backward(kargs: &BwdKargs, stream: Stream) -> Result<()> {
        fn stages<E: Element>(kargs: &BwdKargs, workers: i64) -> Result<()> {
            use backward::*;
            let context = BwdContext::<E>::new(kargs)?;
            dot_do_o::run(&context, workers)?;
            zero_dq_acc::run(&context)?;
            dq_dk_dv::run(&context, workers)?;
            convert_dq::run(&context, workers)
        }
        let workers = kargs.layout.params.num_cus;
        let kargs = *kargs;
        runtime().enqueue(stream, move || match kargs.shape.dtype {
            CacheDtype::Half(Dtype::F16) => stages::<f16>(&kargs, workers),
            CacheDtype::Half(Dtype::Bf16) => stages::<bf16>(&kargs, workers),
            // The backward's traits take 16-bit types only (fmha_bwd_traits.dtype refuses fp8).
            CacheDtype::Fp8(_) => Err(Error::unsupported("dtype: the backward takes fp16 and bf16")),
        })
    }

    fn kvcache_prepare(kargs: &KvCacheKargs, record: DevicePtr<KvCacheFault>, stream: Stream) -> Result<()> {
        let record = DeviceSlice::new(record, 1, "workspace")?;
        let kargs = *kargs;
        runtime().enqueue(stream, move || paged_forward::prepare(&kargs, record))
    }

    fn kvcache_forward(kargs: &KvCacheKargs, stream: Stream) -> Result<()> {
        let cu_count = runtime().cu_count()?;
        let kargs = *kargs;
        runtime().enqueue(stream, move || match kargs.dtype {
            CacheDtype::Half(Dtype::F16) => paged_forward::run::<f16, f16>(&kargs, cu_count),
            CacheDtype::Half(Dtype::Bf16) => paged_forward::run::<bf16, bf16>(&kargs, cu_count),
            CacheDtype::Fp8(Fp8Format::E4m3fn) => paged_forward::run::<E4m3fn, bf16>(&kargs, cu_count),
            CacheDtype::Fp8(Fp8Format::E4m3fnuz) => paged_forward::run::<E4m3fnuz, bf16>(&kargs, cu_count),
        })
    }

    fn merge(kargs: &MergeKargs, stream: Stream) -> Result<()> {
        let cu_count = runtime().cu_count()?;
        let kargs = *kargs;
        runtime().enqueue(stream, move || merge::run(&kargs, cu_count))
    }
}
