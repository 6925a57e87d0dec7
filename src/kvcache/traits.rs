//! What selects a kv-cache kernel and bounds a launcher's calls.

use crate::error::{ensure, Error, Result};
use crate::problem::mask::MaskType;
use crate::problem::paged::{PoolLayout, TableKind};
use crate::problem::scale::ScaleGranularity;
use crate::problem::{check_head_dims, CacheDtype, Mode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheTraits {
    pub dtype: CacheDtype,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub mode: Mode,
    pub mask_type: MaskType,
    pub has_lse: bool,
    pub table_kind: TableKind,
    pub layout: PoolLayout,
    pub scale_granularity: ScaleGranularity,
    /// Tokens per page (CONTIGUOUS: the slot capacity).
    pub page_size: i64,
    /// Upper bounds of every call's batch, query rows (total and per sequence) and KV length.
    pub batch: i64,
    pub total_q: i64,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    /// Split-KV bounds of the decode path (0 = heuristic, 1 = never split); a prefill launcher runs
    /// every sequence unsplit.
    pub max_splits: i64,
    pub kv_split_tokens: i64,
    pub check_tables: bool,
}

/// Most KV splits a launcher may be created with.
pub const MAX_SPLITS: i64 = 256;

impl KvCacheTraits {
    /// Checks what the traits alone decide (each error names its field).
    pub fn validate(&self) -> Result<()> {
        check_head_dims(self.hdim_q, self.hdim_v)?;
        for (field, value) in [("nhead_q", self.nhead_q), ("nhead_k", self.nhead_k), ("page_size", self.page_size)] {
            ensure(value >= 1, field, || format!("{value} is less than 1"))?;
        }
        ensure(self.nhead_q % self.nhead_k == 0, "nhead_k", || {
            format!("{} does not divide nhead_q = {}", self.nhead_k, self.nhead_q)
        })?;
        for (field, value) in [
            ("batch", self.batch),
            ("total_q", self.total_q),
            ("max_seqlen_q", self.max_seqlen_q),
            ("max_seqlen_k", self.max_seqlen_k),
            ("kv_split_tokens", self.kv_split_tokens),
        ] {
            ensure(value >= 0, field, || format!("{value} is negative"))?;
        }
        ensure((0..=MAX_SPLITS).contains(&self.max_splits), "max_splits", || {
            format!("{} is outside 0..={MAX_SPLITS}", self.max_splits)
        })?;
        if self.mask_type == MaskType::TopLeft {
            return Err(Error::unsupported(
                "mask_type: a KV cache's mask is aligned to the bottom-right corner (FMHA_MASK_BOTTOM_RIGHT); \
                 FMHA_MASK_TOP_LEFT is not supported",
            ));
        }
        if self.layout == PoolLayout::Vectorized {
            let x = 16 / self.dtype.bytes() as i64;
            for (field, value) in [("page_size", self.page_size), ("hdim_q", self.hdim_q), ("hdim_v", self.hdim_v)] {
                ensure(value % x == 0, field, || {
                    format!(
                        "{value} is not a multiple of {x}, the vector length of FMHA_KV_LAYOUT_VECTORIZED for {}",
                        self.dtype.name()
                    )
                })?;
            }
        }
        if self.scale_granularity == ScaleGranularity::Page {
            ensure(matches!(self.dtype, CacheDtype::Fp8(_)), "kv_scale_granularity", || {
                "per-page descales apply to fp8 caches".into()
            })?;
            ensure(self.table_kind != TableKind::Contiguous, "kv_scale_granularity", || {
                "per-page descales need a paged table kind (FMHA_KV_BLOCK_TABLE or FMHA_KV_PAGE_CSR)".into()
            })?;
        }
        Ok(())
    }
}
