//! The kv-cache launcher: created from traits, it owns the kernel selection; `prepare_async` checks a
//! call's lengths and tables on the stream and records the first fault in the workspace; `run`
//! enqueues the attention; `check` reports what a prepare recorded.
//!
//! Prefill runs every sequence unsplit, so `run` reads nothing from the workspace: its bytes are the
//! prepare's fault record (split-KV decode will add its partial results after it).

use super::{KvCacheArgs, KvCacheTraits};
use crate::error::{Error, Result, Status};
use crate::launch::abi::KvCacheFault;
use crate::launch::KvCacheKargs;
use crate::problem::paged::PoolLayout;
use crate::problem::scale::ScaleGranularity;
use crate::problem::MaskType;
use crate::registry::{Instance, Operation, Request};
use crate::runtime::{self, Arch, CopyKind, DevicePtr, Stream};
use crate::workspace::{check_workspace_argument, SECTION_ALIGNMENT};

/// Bytes of a prefill launcher's workspace: the fault record, rounded to a section.
pub const WORKSPACE_BYTES: usize = std::mem::size_of::<KvCacheFault>().next_multiple_of(SECTION_ALIGNMENT);

#[derive(Debug)]
pub struct KvCacheLauncher {
    traits: KvCacheTraits,
    instance: Instance,
}

fn select(traits: &KvCacheTraits) -> Result<Instance> {
    traits.validate()?;
    let arch = runtime::current()?.arch()?;
    crate::registry::select(
        arch,
        &Request {
            operation: Operation::KvCache,
            dtype: traits.dtype,
            hdim_q: traits.hdim_q,
            hdim_v: traits.hdim_v,
            masked: traits.mask_type != MaskType::None,
            deterministic: false,
        },
    )
}

/// The workspace size for `traits` on the current device without creating a launcher.
pub fn workspace_size_upper_bound(traits: &KvCacheTraits) -> Result<usize> {
    select(traits)?;
    Ok(WORKSPACE_BYTES)
}

impl KvCacheLauncher {
    pub fn new(traits: KvCacheTraits) -> Result<KvCacheLauncher> {
        let instance = select(&traits)?;
        instance.check_grid(traits.nhead_q, traits.batch)?;
        if instance.arch != Arch::Host && traits.layout == PoolLayout::Vectorized {
            return Err(Error::unsupported(format!(
                "kv_layout: the {} kv-cache kernels read strided pools only (FMHA_KV_LAYOUT_STRIDED)",
                instance.arch.name()
            )));
        }
        // Per-page descales: the AMD kernels read one descale per (sequence, kv head) only.
        if matches!(instance.arch, Arch::Gfx942 | Arch::Gfx950) && traits.scale_granularity == ScaleGranularity::Page {
            return Err(Error::unsupported(format!(
                "kv_scale_granularity: the {} kv-cache kernels take descales per tensor or per (sequence, kv head), \
                 not per page; per-page descales run on the host backend",
                instance.arch.name()
            )));
        }
        // Per-page descales on a GPU: one K and one V descale per key tile, so pages must hold whole
        // tiles (spec/inference.md §2.3; CK's block scale has the same rule).
        if instance.arch != Arch::Host
            && traits.scale_granularity == ScaleGranularity::Page
            && traits.page_size % instance.n0 != 0
        {
            return Err(Error::unsupported(format!(
                "kv_scale_granularity: the {} kv-cache kernels take per-page descales for pages of a multiple of \
                 {} tokens (page_size = {}); smaller pages run on the host backend",
                instance.arch.name(),
                instance.n0,
                traits.page_size
            )));
        }
        Ok(KvCacheLauncher { traits, instance })
    }

    pub fn workspace_size(&self) -> usize {
        WORKSPACE_BYTES
    }

    /// Checks a workspace the prepare writes and `check` reads: not null, aligned, large enough
    /// (when the caller says how large: `bytes > 0`).
    fn check_workspace(&self, workspace: DevicePtr<u8>, bytes: usize) -> Result<()> {
        let need = self.workspace_size();
        check_workspace_argument(workspace.addr().0, bytes, need, false, "fmha_kvcache_launcher_workspace_size")
    }

    fn kargs(&self, args: &KvCacheArgs) -> Result<KvCacheKargs> {
        args.validate(&self.traits, &self.instance)
    }

    /// Enqueues the check of `args`' lengths and tables on `stream` (nothing blocks the host); the
    /// outcome goes to `args.workspace`'s fault record.
    pub fn prepare_async(&self, args: &KvCacheArgs, stream: Stream) -> Result<()> {
        self.check_workspace(args.workspace, args.workspace_size)?;
        let kargs = self.kargs(args)?;
        crate::launch::kvcache_prepare(&kargs, args.workspace.addr().cast(), stream)
    }

    /// Validates `args` and enqueues the attention on `stream`.
    pub fn run(&self, args: &KvCacheArgs, stream: Stream) -> Result<()> {
        if !args.workspace.is_null() {
            self.check_workspace(args.workspace, args.workspace_size)?;
        }
        let kargs = self.kargs(args)?;
        if kargs.batch == 0 || kargs.bounds.total_q == 0 {
            return Ok(()); // nothing to compute: nothing enqueued
        }
        crate::launch::kvcache_forward(&kargs, stream)
    }

    /// Waits for `stream` and reports the fault record a prepare left in `workspace`: FMHA_OK,
    /// FMHA_ERR_ASYNC_FAILURE naming the field, sequence and value, or FMHA_ERR_WORKSPACE_NOT_PREPARED.
    pub fn check(&self, workspace: DevicePtr<u8>, bytes: usize, stream: Stream) -> Result<()> {
        self.check_workspace(workspace, bytes)?;
        let rt = runtime::current()?;
        rt.stream_synchronize(stream)?;
        let mut record = KvCacheFault::default();
        let size = std::mem::size_of::<KvCacheFault>();
        rt.memcpy(&mut record as *mut KvCacheFault as usize, workspace.addr().0, size, CopyKind::DeviceToHost)?;
        match record.outcome()? {
            None => Ok(()),
            Some(fault) => Err(Error::new(
                Status::AsyncFailure,
                format!("the prepare found an invalid value: {}", fault.to_error().message),
            )),
        }
    }
}
