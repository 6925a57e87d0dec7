//! The kv-cache call's runtime arguments and their validation against the traits.

use super::traits::KvCacheTraits;
use crate::error::{ensure, Error, Result};
use crate::launch::{FwdExtents, KvCacheKargs, KvSplitArgs, KvTableArgs};
use crate::problem::mask::Mask;
use crate::problem::paged::{PoolLayout, SequenceBounds, TableKind};
use crate::problem::scale::{Descale, Descales, ScaleGranularity};
use crate::problem::{check_device_array, check_lse_layout, check_memory_overlap, Mode, Operand, Tensor};
use crate::registry::Instance;
use crate::runtime::DevicePtr;
use crate::workspace::{check_scheduler_workspace, SCHEDULER_WORKSPACE_BYTES};

/// Pointers, strides (elements) and lengths of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvCacheArgs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub seqstart_q: DevicePtr<i32>,
    pub batch: i64,
    /// Batch mode: the query rows of every sequence; group mode: the rows of `q`.
    pub seqlen_q: i64,
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
    pub scale: f32,
    pub window_size_left: i32,
    pub window_size_right: i32,
    pub q_descale: Descale,
    pub k_descale: Descale,
    pub v_descale: Descale,
    pub workspace: DevicePtr<u8>,
    pub workspace_size: usize,
    /// The scheduler workspace, [`SCHEDULER_WORKSPACE_BYTES`] written by the run (the sm_90a
    /// launch's tile counter); null: none. The prepare ignores it.
    pub scheduler_workspace: DevicePtr<u8>,
    /// Bytes at `scheduler_workspace` (ignored when it is null).
    pub scheduler_workspace_size: usize,
}

/// Requires a device array the table kind reads (naming it), and checks its addressability.
fn required(array: DevicePtr<i32>, count: usize, field: &str) -> Result<()> {
    if array.is_null() && count > 0 {
        return Err(Error::null(field));
    }
    check_device_array(array, count, field)
}

/// Refuses an array the table kind does not read: a caller passing one has mixed up the kinds.
fn unused(array: DevicePtr<i32>, field: &str, kind: TableKind) -> Result<()> {
    ensure(array.is_null(), field, || format!("must be NULL with kv_table_kind = {}", kind.name()))
}

impl KvCacheArgs {
    /// Validates the call against the traits into kernel arguments for `instance`.
    pub fn validate(&self, traits: &KvCacheTraits, instance: &Instance) -> Result<KvCacheKargs> {
        let t = traits;
        ensure((0..=t.batch).contains(&self.batch), "batch", || {
            format!("{} is outside 0..={} (traits.batch)", self.batch, t.batch)
        })?;
        let bounds = match t.mode {
            Mode::Group => {
                ensure((0..=t.total_q).contains(&self.seqlen_q), "seqlen_q", || {
                    format!("{} (the rows of q) is outside 0..={} (traits.total_q)", self.seqlen_q, t.total_q)
                })?;
                SequenceBounds { total_q: self.seqlen_q, max_seqlen_q: t.max_seqlen_q, max_seqlen_k: t.max_seqlen_k }
            }
            Mode::Batch => {
                ensure((0..=t.max_seqlen_q).contains(&self.seqlen_q), "seqlen_q", || {
                    format!("{} is outside 0..={} (traits.max_seqlen_q)", self.seqlen_q, t.max_seqlen_q)
                })?;
                ensure(self.seqstart_q.is_null(), "seqstart_q", || "must be NULL in batch mode".into())?;
                SequenceBounds {
                    total_q: self.batch * self.seqlen_q,
                    max_seqlen_q: self.seqlen_q,
                    max_seqlen_k: t.max_seqlen_k,
                }
            }
        };
        let mask = Mask { kind: t.mask_type, left: self.window_size_left, right: self.window_size_right };
        mask.validate()?;
        ensure(self.scale.is_finite(), "scale", || format!("{} is not finite", self.scale))?;
        let scale = if self.scale == 0.0 { 1.0 / (t.hdim_q as f32).sqrt() } else { self.scale };
        let table = self.table(t)?;

        // Tensors: q/o/lse by the mode, the pools by page.
        let (b, mode) = (self.batch, t.mode);
        let rows = self.seqlen_q;
        let q_batch = if mode == Mode::Group { 1 } else { b };
        let (in_bytes, out_bytes) = (t.dtype.bytes(), 2);
        let q = Operand::tensor("q", &self.q, mode, (q_batch, t.nhead_q, rows, t.hdim_q), in_bytes, false)?;
        let o = Operand::tensor("o", &self.o, mode, (q_batch, t.nhead_q, rows, t.hdim_v), out_bytes, true)?;
        let lse = match (t.has_lse, self.lse.ptr.is_null()) {
            (true, true) if b > 0 && rows > 0 => return Err(Error::null("lse.data")),
            (false, false) => {
                return Err(Error::invalid("lse.data", "must be NULL: the launcher was created with has_lse = 0"))
            }
            (true, false) => {
                check_lse_layout(&self.lse, "lse")?;
                Some(Operand::tensor("lse", &self.lse, mode, (q_batch, t.nhead_q, rows, 1), 4, true)?)
            }
            _ => None,
        };
        // STRIDED: [page][row][head] by strides; VECTORIZED: a page's rows of one head are one run of
        // page_size × hdim elements in the vectorized order.
        let pages = self.num_pages;
        let pool = |field, tensor: &Tensor, d: i64| match t.layout {
            PoolLayout::Strided => {
                Operand::tensor(field, tensor, Mode::Batch, (pages, t.nhead_k, t.page_size, d), in_bytes, false)
            }
            PoolLayout::Vectorized => {
                Operand::tensor(field, tensor, Mode::Batch, (pages, t.nhead_k, 1, t.page_size * d), in_bytes, false)
            }
        };
        let (k, v) = (pool("k", &self.k, t.hdim_q)?, pool("v", &self.v, t.hdim_v)?);
        // The GPU kernels move 16-byte vectors of rows they address by 32-bit-safe strides.
        for (field, tensor, tensor_mode, bytes, input) in [
            ("q", &self.q, mode, in_bytes, true),
            ("k", &self.k, Mode::Batch, in_bytes, true),
            ("v", &self.v, Mode::Batch, in_bytes, true),
            ("o", &self.o, mode, out_bytes, false),
        ] {
            instance.check_tensor(field, tensor, tensor_mode, bytes)?;
            if input {
                instance.check_input_rows(field, tensor)?;
            }
        }
        let descales = Descales { q: self.q_descale, k: self.k_descale, v: self.v_descale };
        let per_page = t.scale_granularity == ScaleGranularity::Page;
        let descale_extents = descales.extents(t.dtype, b, t.nhead_k, per_page.then_some(self.num_pages))?;

        // The scheduler workspace (written: the run zeroes its counter).
        let address = self.scheduler_workspace.addr();
        let scheduler_workspace = check_scheduler_workspace(
            "scheduler_workspace",
            address.0,
            self.scheduler_workspace_size,
            "fmha_kvcache_launcher_scheduler_workspace_size",
        )?
        .then(|| Operand::bytes("scheduler_workspace", address, SCHEDULER_WORKSPACE_BYTES, true));

        // The outputs may share no byte with any input: the tensors, the descales and the device
        // arrays the prepare and the run read (an unused array is NULL, checked by `table`); the
        // scheduler workspace none with any of them nor with the workspace.
        let workspace = Operand::bytes("workspace", self.workspace.addr(), self.workspace_size, true);
        let mut operands: Vec<Operand<'_>> = scheduler_workspace.into_iter().collect();
        operands.extend([q, k, v, o, workspace]);
        operands.extend(lse);
        operands.extend(descales.operands(descale_extents));
        let n = b as usize;
        let block_table_len = table.block_table_len(n).unwrap_or(0); // checked by `table`
        for (field, array, entries) in [
            ("seqstart_q", self.seqstart_q, if mode == Mode::Group { n + 1 } else { 0 }),
            ("seqlen_k", self.seqlen_k, n),
            ("block_table", self.block_table, block_table_len),
            ("kv_indptr", self.kv_indptr, n + 1),
            ("page_indices", self.page_indices, self.num_page_indices.max(0) as usize),
            ("last_page_len", self.last_page_len, n),
            ("cache_batch_idx", self.cache_batch_idx, n),
        ] {
            let bytes = if array.is_null() { 0 } else { entries * 4 };
            operands.push(Operand::bytes(field, array.addr(), bytes, false));
        }
        check_memory_overlap(&operands)?;
        Ok(KvCacheKargs {
            dtype: t.dtype,
            mode,
            batch: b,
            nhead_q: t.nhead_q,
            nhead_k: t.nhead_k,
            hdim_q: t.hdim_q,
            hdim_v: t.hdim_v,
            bounds,
            mask,
            scale,
            instance: *instance,
            q: self.q,
            o: self.o,
            lse: self.lse,
            k: self.k,
            v: self.v,
            layout: t.layout,
            extents: FwdExtents {
                q: q.elements,
                k: k.elements,
                v: v.elements,
                o: o.elements,
                lse: lse.map_or(0, |l| l.elements),
            },
            descales,
            descale_extents,
            seqstart_q: self.seqstart_q,
            table,
            check_tables: t.check_tables,
            splits: KvSplitArgs::UNSPLIT, // the launcher's: it owns the workspace layout
            scheduler_workspace: self.scheduler_workspace,
        })
    }

    /// The page table's arrays, required and checked per table kind.
    fn table(&self, t: &KvCacheTraits) -> Result<KvTableArgs> {
        let (b, kind) = (self.batch as usize, t.table_kind);
        ensure(self.num_pages >= 1, "num_pages", || format!("{} is less than 1", self.num_pages))?;
        if t.mode == Mode::Group {
            required(self.seqstart_q, b + 1, "seqstart_q")?;
        }
        let table = KvTableArgs {
            kind,
            page_size: t.page_size,
            num_pages: self.num_pages,
            max_pages_per_seq: self.max_pages_per_seq,
            num_page_indices: self.num_page_indices,
            seqlen_k: self.seqlen_k,
            block_table: self.block_table,
            block_table_stride: self.block_table_stride,
            kv_indptr: self.kv_indptr,
            page_indices: self.page_indices,
            last_page_len: self.last_page_len,
            cache_batch_idx: self.cache_batch_idx,
        };
        match kind {
            TableKind::Contiguous => {
                required(self.seqlen_k, b, "seqlen_k")?;
                check_device_array(self.cache_batch_idx, b, "cache_batch_idx")?;
                for (array, field) in [(self.block_table, "block_table"), (self.kv_indptr, "kv_indptr")] {
                    unused(array, field, kind)?;
                }
                for (array, field) in [(self.page_indices, "page_indices"), (self.last_page_len, "last_page_len")] {
                    unused(array, field, kind)?;
                }
            }
            TableKind::BlockTable => {
                ensure(self.max_pages_per_seq >= 1, "max_pages_per_seq", || {
                    format!("{} is less than 1", self.max_pages_per_seq)
                })?;
                ensure(self.block_table_stride >= self.max_pages_per_seq, "block_table_stride", || {
                    format!("{} is less than max_pages_per_seq = {}", self.block_table_stride, self.max_pages_per_seq)
                })?;
                let entries = table.block_table_len(b).ok_or_else(|| {
                    Error::invalid("block_table_stride", "batch rows of the table span more than the address space")
                })?;
                required(self.seqlen_k, b, "seqlen_k")?;
                required(self.block_table, entries, "block_table")?;
                for (array, field) in [
                    (self.kv_indptr, "kv_indptr"),
                    (self.page_indices, "page_indices"),
                    (self.last_page_len, "last_page_len"),
                    (self.cache_batch_idx, "cache_batch_idx"),
                ] {
                    unused(array, field, kind)?;
                }
            }
            TableKind::PageCsr => {
                ensure(self.num_page_indices >= 0, "num_page_indices", || {
                    format!("{} is negative", self.num_page_indices)
                })?;
                required(self.kv_indptr, b + 1, "kv_indptr")?;
                required(self.page_indices, self.num_page_indices as usize, "page_indices")?;
                if t.page_size > 1 {
                    required(self.last_page_len, b, "last_page_len")?;
                } else {
                    check_device_array(self.last_page_len, b, "last_page_len")?;
                }
                for (array, field) in [
                    (self.seqlen_k, "seqlen_k"),
                    (self.block_table, "block_table"),
                    (self.cache_batch_idx, "cache_batch_idx"),
                ] {
                    unused(array, field, kind)?;
                }
            }
        }
        Ok(table)
    }
}
