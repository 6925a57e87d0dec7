//! What an operation hands the launch layer: validated kernel arguments (CK's "kargs"), with device
//! addresses as typed values. The host executor reads them directly; the GPU executor turns them into
//! the kernels' parameter blocks (`abi.rs`, built in `params.rs`).

use super::abi::KvCacheSplitPlan;
use crate::problem::merge::{LseBase, StateDtype};
use crate::problem::paged::{PoolLayout, SequenceBounds, TableKind};
use crate::problem::scale::Descales;
use crate::problem::split::SplitPolicy;
use crate::problem::{CacheDtype, Mask, Mode, SequenceArrays, Shape, Tensor};
use crate::registry::Instance;
use crate::runtime::DevicePtr;
use crate::workspace::WorkspaceLayout;

/// A forward call.
#[derive(Debug, Clone, Copy)]
pub struct FwdKargs {
    pub shape: Shape,
    pub instance: Instance,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    /// fp32 natural-log LSE, row stride 1; `ptr == 0` means "do not write LSE".
    pub lse: Tensor,
    /// Element counts each tensor spans (bounds of the host backend's device views).
    pub extents: FwdExtents,
    pub sequences: SequenceArrays,
    /// fp8 inputs' descales (per tensor or per (sequence, kv head)) and the elements each array spans
    /// (q, k, v); none for 16-bit inputs.
    pub descales: Descales,
    pub descale_extents: [usize; 3],
    /// The scheduler workspace (its first 4 bytes: the tile counter of the sm_90a persistent grid), null
    /// when the call has none. Validated: 16-byte aligned, `SCHEDULER_WORKSPACE_BYTES` that overlap no tensor.
    pub workspace: DevicePtr<u8>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FwdExtents {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub lse: usize,
}

/// A backward call: the three stages share it.
#[derive(Debug, Clone, Copy)]
pub struct BwdKargs {
    pub shape: Shape,
    pub instance: Instance,
    pub deterministic: bool,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub d_o: Tensor,
    /// fp32 scratch in the LSE layout, written by dot_do_o.
    pub d: Tensor,
    pub dq: Tensor,
    /// dK/dV have `nhead_k` heads: the GQA reduction happens inside the library.
    pub dk: Tensor,
    pub dv: Tensor,
    pub extents: BwdExtents,
    pub sequences: SequenceArrays,
    pub workspace: DevicePtr<u8>,
    /// The kernels check the workspace header's fingerprint against the sequence starts they read.
    pub layout: WorkspaceLayout,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BwdExtents {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub lse: usize,
    pub d_o: usize,
    pub d: usize,
    pub dq: usize,
    pub dk: usize,
    pub dv: usize,
}

/// A kv-cache forward (prefill and chunked prefill): queries against each sequence's tokens in a
/// paged (or per-sequence contiguous) pool (spec/inference.md §1, §2).
#[derive(Debug, Clone, Copy)]
pub struct KvCacheKargs {
    pub dtype: CacheDtype,
    /// Group mode: `q`/`o` rows of sequence `b` are `seqstart_q[b]..seqstart_q[b + 1]`; batch mode:
    /// every sequence has `bounds.max_seqlen_q` rows, at batch `b` of `q`/`o`.
    pub mode: Mode,
    pub batch: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub bounds: SequenceBounds,
    /// `FMHA_MASK_NONE` or bottom-right aligned to each sequence's KV length.
    pub mask: Mask,
    pub scale: f32,
    /// The kernel instance (its tile: query rows and keys per step).
    pub instance: Instance,
    pub q: Tensor,
    pub o: Tensor,
    /// fp32, row stride 1; null = not written.
    pub lse: Tensor,
    /// The pools: `batch_stride` is the page stride (CONTIGUOUS: the slot stride).
    pub k: Tensor,
    pub v: Tensor,
    pub layout: PoolLayout,
    pub extents: FwdExtents,
    pub descales: Descales,
    /// Elements each descale array spans (q, k, v).
    pub descale_extents: [usize; 3],
    pub seqstart_q: DevicePtr<i32>,
    pub table: KvTableArgs,
    /// The prepare scans every page id the sequences use.
    pub check_tables: bool,
    pub splits: KvSplitArgs,
    /// The scheduler workspace (its first 4 bytes: the tile counter of the sm_90a persistent grid), null
    /// when the run has none (and for the prepare). Validated: 16-byte aligned,
    /// `SCHEDULER_WORKSPACE_BYTES` that overlap no tensor, array or workspace.
    pub scheduler_workspace: DevicePtr<u8>,
}

/// Split-KV of a kv-cache call: the launcher's policy, the CU count the prepare sizes chunks by, and
/// the workspace's plan and partial results (null for an unsplit launcher's forward).
#[derive(Debug, Clone, Copy)]
pub struct KvSplitArgs {
    pub policy: SplitPolicy,
    pub cu_count: i64,
    pub plan: DevicePtr<KvCacheSplitPlan>,
    /// fp32 `[split][head][row]` and `[split][head][row][hdim_v]`, `rows` rows per plane.
    pub partial_lse: DevicePtr<f32>,
    pub partial_o: DevicePtr<f32>,
    pub rows: i64,
    /// The longest-first sequence order and its classes, `order_len` entries each (null: none).
    pub order: DevicePtr<i32>,
    pub order_keys: DevicePtr<u8>,
    pub order_len: i64,
}

impl KvSplitArgs {
    pub const UNSPLIT: KvSplitArgs = KvSplitArgs {
        policy: SplitPolicy::UNSPLIT,
        cu_count: 1,
        plan: DevicePtr::NULL,
        partial_lse: DevicePtr::NULL,
        partial_o: DevicePtr::NULL,
        rows: 0,
        order: DevicePtr::NULL,
        order_keys: DevicePtr::NULL,
        order_len: 0,
    };
}

/// The page table's device arrays and bounds (`problem::paged::PageTable` reads them).
#[derive(Debug, Clone, Copy)]
pub struct KvTableArgs {
    pub kind: TableKind,
    pub page_size: i64,
    pub num_pages: i64,
    pub max_pages_per_seq: i64,
    pub num_page_indices: i64,
    pub seqlen_k: DevicePtr<i32>,
    pub block_table: DevicePtr<i32>,
    pub block_table_stride: i64,
    pub kv_indptr: DevicePtr<i32>,
    pub page_indices: DevicePtr<i32>,
    pub last_page_len: DevicePtr<i32>,
    pub cache_batch_idx: DevicePtr<i32>,
}

impl KvTableArgs {
    /// Entries of the block table a call may read: `batch` rows `block_table_stride` apart, of
    /// `max_pages_per_seq` entries each (0 for other kinds or no sequences); `None` when that count
    /// overflows.
    pub fn block_table_len(&self, batch: usize) -> Option<usize> {
        if batch == 0 || self.kind != TableKind::BlockTable {
            return Some(0);
        }
        (batch as i64 - 1)
            .checked_mul(self.block_table_stride)
            .and_then(|x| x.checked_add(self.max_pages_per_seq))
            .and_then(|e| usize::try_from(e).ok())
    }
}

/// A merge of attention states (spec/inference.md §3.5): for each (row, head), the `num_states`
/// states `(o_in[s][head][row], lse_in[s][head][row])` merged in state order into `o_out[head][row]`
/// and `lse_out[head][row]`. `o_in`/`lse_in` use the batch stride as the state stride; `o_out`/`lse_out`
/// have none (their batch stride is unused); the LSEs are one fp32 column.
#[derive(Debug, Clone, Copy)]
pub struct MergeKargs {
    pub num_states: i64,
    pub num_rows: i64,
    pub nhead: i64,
    pub hdim: i64,
    pub in_dtype: StateDtype,
    pub out_dtype: StateDtype,
    pub lse_base: LseBase,
    pub o_in: Tensor,
    pub lse_in: Tensor,
    pub o_out: Tensor,
    /// Null: the merged LSE is not written.
    pub lse_out: Tensor,
    pub extents: MergeExtents,
}

/// Elements each tensor of a merge spans from its base (bounds of the host backend's views).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeExtents {
    pub o_in: usize,
    pub lse_in: usize,
    pub o_out: usize,
    pub lse_out: usize,
}
