//! The kv-cache launcher: created from traits, it owns the kernel selection; `prepare_async` checks a
//! call's lengths and tables on the stream and records the first fault in the workspace; `run`
//! enqueues the attention; `check` reports what a prepare recorded.
//!
//! A launcher that splits the KV (decode: few query rows, long sequences; spec/inference.md §3) runs
//! each sequence's chunks into partial results in the workspace and combines them in chunk order, with
//! the chunk length the prepare chose; an unsplit launcher's `run` reads nothing from the workspace.

use super::workspace::KvCacheWorkspace;
use super::{KvCacheArgs, KvCacheTraits, MAX_SPLITS};
use crate::error::{Error, Result, Status};
use crate::launch::abi::KvCacheFault;
use crate::launch::KvCacheKargs;
use crate::problem::paged::PoolLayout;
use crate::problem::scale::ScaleGranularity;
use crate::problem::split::{ceil_div, decode_split, heuristic_max_splits, SplitPolicy};
use crate::problem::MaskType;
use crate::registry::{Instance, Operation, Plan, Request, Stage};
use crate::runtime::{self, Arch, CopyKind, DevicePtr, Stream};
use crate::workspace::{check_workspace_argument, SCHEDULER_WORKSPACE_BYTES};

#[derive(Debug)]
pub struct KvCacheLauncher {
    traits: KvCacheTraits,
    instance: Instance,
    cu_count: i64,
    workspace: KvCacheWorkspace,
}

/// The instance for `traits`: the first decode tile with packed GQA that takes the call (every
/// sequence's (query row, query head) pairs of one kv head in one tile, spec/inference.md §3.2;
/// `Instance::packs`), else the prefill tile.
fn select(traits: &KvCacheTraits) -> Result<Instance> {
    traits.validate()?;
    let arch = runtime::current()?.arch()?;
    let request = Request {
        operation: Operation::KvCache,
        dtype: traits.dtype,
        hdim_q: traits.hdim_q,
        hdim_v: traits.hdim_v,
        masked: traits.mask_type != MaskType::None,
        deterministic: false,
        packed_gqa: false,
    };
    let group = traits.nhead_q / traits.nhead_k;
    let packed = crate::registry::serving(arch, &Request { packed_gqa: true, ..request }).into_iter().find(|i| {
        let page_scales = traits.scale_granularity == ScaleGranularity::Page;
        i.packs(group, traits.max_seqlen_q, traits.page_size, page_scales)
    });
    match packed {
        Some(instance) => Ok(instance),
        None => crate::registry::select(arch, &request),
    }
}

/// How a launcher for `traits` splits the KV on a device of `cu_count` CUs (spec/inference.md §3.3):
/// `kv_split_tokens > 0` fixes the chunks (rounded up to whole key tiles) and so their count for the
/// longest sequence; otherwise `max_splits`, or when it is 0 the library's rule on the traits' bounds:
/// `decode_split` for the decode tile, FA3's static rule for the prefill tile (every CTA of a grid sized
/// for more chunks than a sequence has returns at once, but is launched).
fn split_policy(traits: &KvCacheTraits, instance: &Instance, cu_count: i64) -> Result<SplitPolicy> {
    let n0 = instance.n0;
    let policy = if traits.kv_split_tokens > 0 {
        let split_tiles = ceil_div(traits.kv_split_tokens, n0);
        let needed = ceil_div(traits.max_seqlen_k, split_tiles * n0).max(1);
        if needed > MAX_SPLITS || (traits.max_splits > 0 && needed > traits.max_splits) {
            return Err(Error::invalid(
                "kv_split_tokens",
                format!(
                    "chunks of {} tokens cut max_seqlen_k = {} into {needed} splits, over max_splits = {}",
                    split_tiles * n0,
                    traits.max_seqlen_k,
                    if traits.max_splits > 0 { traits.max_splits } else { MAX_SPLITS }
                ),
            ));
        }
        SplitPolicy { max_splits: needed, split_tiles }
    } else if traits.max_splits > 0 {
        SplitPolicy { max_splits: traits.max_splits, split_tiles: 0 }
    } else if instance.packed_gqa {
        // Decode: a packed tile serves every query head of its kv head, one tile per sequence and kv head.
        decode_split(traits.batch, traits.nhead_k, traits.max_seqlen_k, n0, cu_count)
    } else {
        let bound = heuristic_max_splits(
            traits.batch,
            traits.nhead_q,
            traits.max_seqlen_q,
            traits.max_seqlen_k,
            instance.m0,
            n0,
            cu_count,
        );
        SplitPolicy { max_splits: bound, split_tiles: 0 }
    };
    Ok(policy)
}

/// The workspace size for `traits` on the current device without creating a launcher.
pub fn workspace_size_upper_bound(traits: &KvCacheTraits) -> Result<usize> {
    Ok(KvCacheLauncher::new(*traits)?.workspace_size())
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
        let cu_count = runtime::current()?.cu_count()?;
        let workspace = KvCacheWorkspace::new(&traits, split_policy(&traits, &instance, cu_count)?)?;
        Ok(KvCacheLauncher { traits, instance, cu_count, workspace })
    }

    pub fn workspace_size(&self) -> usize {
        self.workspace.bytes
    }

    /// Bytes of the scheduler workspace (`KvCacheArgs::scheduler_workspace`) a run takes: the same on
    /// every backend and device.
    pub fn scheduler_workspace_size(&self) -> usize {
        SCHEDULER_WORKSPACE_BYTES
    }

    /// How this launcher splits the KV.
    pub fn split_policy(&self) -> SplitPolicy {
        self.workspace.policy
    }

    /// What [`run`](Self::run) launches: the attention and, when this launcher splits the KV, the
    /// combine of the chunks' partial states (`launch_combine` in `hip/kvcache/kvcache.hip`).
    pub fn plan(&self) -> Plan {
        let mut stages = vec![Stage::instance("kvcache_fwd", self.instance)];
        if self.split_policy().splits() {
            stages.push(Stage::kernel("combine").with_note("merges the chunks' partial states into O and LSE"));
        }
        Plan { operation: Operation::KvCache, arch: self.instance.arch, stages }
    }

    /// Checks a workspace the prepare writes and `check` reads: not null, aligned, large enough
    /// (when the caller says how large: `bytes > 0`).
    fn check_workspace(&self, workspace: DevicePtr<u8>, bytes: usize) -> Result<()> {
        let need = self.workspace_size();
        check_workspace_argument(workspace.addr().0, bytes, need, false, "fmha_kvcache_launcher_workspace_size")
    }

    fn kargs(&self, args: &KvCacheArgs) -> Result<KvCacheKargs> {
        // A workspace passed without its size (0 skips the size check) spans what the prepare and the run
        // write there, this launcher's size, in the overlap check (with the scheduler workspace, say).
        let mut args = *args;
        if !args.workspace.is_null() && args.workspace_size == 0 {
            args.workspace_size = self.workspace_size();
        }
        let mut kargs = args.validate(&self.traits, &self.instance)?;
        kargs.splits = self.workspace.split_args(args.workspace, self.cu_count);
        Ok(kargs)
    }

    /// Enqueues the check of `args`' lengths and tables on `stream` (nothing blocks the host); the
    /// outcome goes to `args.workspace`'s fault record.
    /// The scheduler workspace is the run's: the prepare neither checks nor uses it.
    pub fn prepare_async(&self, args: &KvCacheArgs, stream: Stream) -> Result<()> {
        self.check_workspace(args.workspace, args.workspace_size)?;
        let args = KvCacheArgs { scheduler_workspace: DevicePtr::NULL, scheduler_workspace_size: 0, ..*args };
        let kargs = self.kargs(&args)?;
        crate::launch::kvcache_prepare(&kargs, KvCacheWorkspace::fault(args.workspace), stream)
    }

    /// Validates `args` and enqueues the attention on `stream`.
    pub fn run(&self, args: &KvCacheArgs, stream: Stream) -> Result<()> {
        let kargs = self.run_kargs(args)?;
        if kargs.batch == 0 || kargs.bounds.total_q == 0 {
            return Ok(()); // nothing to compute: nothing enqueued
        }
        crate::launch::kvcache_forward(&kargs, stream)
    }

    /// What [`run`](Self::run) checks of `args`, without enqueuing anything (the one-call
    /// `fmha_kvcache_fwd` checks the run's arguments before it enqueues the prepare).
    pub fn check_run(&self, args: &KvCacheArgs) -> Result<()> {
        self.run_kargs(args).map(drop)
    }

    /// The run's validated kernel arguments.
    fn run_kargs(&self, args: &KvCacheArgs) -> Result<KvCacheKargs> {
        if !args.workspace.is_null() {
            self.check_workspace(args.workspace, args.workspace_size)?;
        } else if self.split_policy().splits() {
            return Err(Error::new(
                Status::NullPointer,
                format!(
                    "workspace must not be null: this launcher splits the KV (up to {} chunks per sequence) \
                     and run writes partial results into the prepared workspace",
                    self.split_policy().max_splits
                ),
            ));
        }
        self.kargs(args)
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
