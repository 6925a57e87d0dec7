//! The kv-cache workspace (spec/inference.md §3.4), fixed when the launcher is created: a header
//! section with the prepare's fault record and split plan, the longest-first sequence order the
//! prepare writes (i32 per sequence, and the u8 class it sorts by; up to `MAX_ORDERED_BATCH`
//! sequences), then, for a launcher that splits the KV,
//! the partial results of every chunk — fp32 LSE `[split][head][row]` and O `[split][head][row][hdim_v]`,
//! one row per query row the traits allow. Every partial the combine reads is written by the chunk's
//! forward in the same run (an empty chunk writes O = 0, LSE = −inf), so nothing is zeroed.

use super::KvCacheTraits;
use crate::error::{Error, Result};
use crate::launch::abi::{KvCacheFault, KvCacheSplitPlan};
use crate::launch::KvSplitArgs;
use crate::problem::split::{SplitPolicy, MAX_ORDERED_BATCH};
use crate::problem::Mode;
use crate::runtime::DevicePtr;
use crate::workspace::SECTION_ALIGNMENT;

/// Offset of the split plan in the header section (after the fault record).
const PLAN_OFFSET: usize = std::mem::size_of::<KvCacheFault>().next_multiple_of(16);
const HEADER_BYTES: usize = (PLAN_OFFSET + std::mem::size_of::<KvCacheSplitPlan>()).next_multiple_of(SECTION_ALIGNMENT);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheWorkspace {
    pub policy: SplitPolicy,
    /// Rows of each (split, head) plane of the partials.
    pub rows: i64,
    /// Sequences the order section holds (the traits' batch, up to `MAX_ORDERED_BATCH`; 0: none).
    order_len: i64,
    order_keys: usize,
    partial_lse: usize,
    partial_o: usize,
    pub bytes: usize,
}

impl KvCacheWorkspace {
    pub fn new(traits: &KvCacheTraits, policy: SplitPolicy) -> Result<KvCacheWorkspace> {
        let rows = match traits.mode {
            Mode::Group => traits.total_q,
            Mode::Batch => traits.batch.saturating_mul(traits.max_seqlen_q),
        };
        let order_len = traits.batch.clamp(0, MAX_ORDERED_BATCH);
        let order_keys = HEADER_BYTES + (4 * order_len as usize).next_multiple_of(SECTION_ALIGNMENT);
        let order_end = order_keys + (order_len as usize).next_multiple_of(SECTION_ALIGNMENT);
        let unsplit =
            KvCacheWorkspace { policy, rows, order_len, order_keys, partial_lse: 0, partial_o: 0, bytes: order_end };
        if !policy.splits() {
            return Ok(unsplit);
        }
        let too_large = || {
            Error::invalid(
                "max_splits",
                format!("the partial results of {} splits of {rows} query rows overflow", policy.max_splits),
            )
        };
        let section = |floats: i64| -> Result<usize> {
            usize::try_from(floats)
                .ok()
                .and_then(|f| f.checked_mul(4))
                .and_then(|b| b.checked_next_multiple_of(SECTION_ALIGNMENT))
                .ok_or_else(too_large)
        };
        let states =
            policy.max_splits.checked_mul(traits.nhead_q).and_then(|x| x.checked_mul(rows)).ok_or_else(too_large)?;
        let lse_bytes = section(states)?;
        let o_bytes = section(states.checked_mul(traits.hdim_v).ok_or_else(too_large)?)?;
        let partial_lse = order_end;
        let partial_o = partial_lse + lse_bytes;
        let bytes = partial_o.checked_add(o_bytes).ok_or_else(too_large)?;
        Ok(KvCacheWorkspace { partial_lse, partial_o, bytes, ..unsplit })
    }

    /// The fault record of the workspace at `base`.
    pub fn fault(base: DevicePtr<u8>) -> DevicePtr<KvCacheFault> {
        base.addr().cast()
    }

    /// The split arguments of a call with the workspace at `base` (null: the unsplit forward, which
    /// reads nothing from it).
    pub fn split_args(&self, base: DevicePtr<u8>, cu_count: i64) -> KvSplitArgs {
        if base.is_null() {
            return KvSplitArgs { cu_count, ..KvSplitArgs::UNSPLIT };
        }
        let at = |offset: usize| base.addr().offset(offset);
        let splits = self.policy.splits();
        KvSplitArgs {
            policy: self.policy,
            cu_count,
            plan: at(PLAN_OFFSET).cast(),
            partial_lse: if splits { at(self.partial_lse).cast() } else { DevicePtr::NULL },
            partial_o: if splits { at(self.partial_o).cast() } else { DevicePtr::NULL },
            rows: self.rows,
            order: if self.order_len > 0 { at(HEADER_BYTES).cast() } else { DevicePtr::NULL },
            order_keys: if self.order_len > 0 { at(self.order_keys).cast() } else { DevicePtr::NULL },
            order_len: self.order_len,
        }
    }
}
