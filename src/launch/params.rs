//! The kernels' parameter blocks (`abi.rs`) built from validated kernel arguments.

use super::abi::{
    BwdParams, DescaleParams, FwdParams, KvCacheFault, KvCacheParams, MergeParams, PrepareParams, KVCACHE_PREPARED,
};
use super::kargs::{BwdKargs, FwdKargs, KvCacheKargs, MergeKargs};
use crate::error::{Error, Result, Status};
use crate::problem::merge::LseBase;
use crate::problem::paged::{KvField, TableFault};
use crate::problem::scale::Descale;
use crate::problem::Mode;
use crate::runtime::{DeviceAddr, DevicePtr};
use crate::workspace::WorkspaceLayout;

impl FwdParams {
    /// The parameter block of validated kernel arguments. Lengths fit in i32: the ABI passes them so.
    pub fn new(k: &FwdKargs) -> FwdParams {
        let s = &k.shape;
        let addr = |x: DeviceAddr| x.0 as u64;
        FwdParams {
            q: addr(k.q.ptr),
            k: addr(k.k.ptr),
            v: addr(k.v.ptr),
            o: addr(k.o.ptr),
            lse: addr(k.lse.ptr),
            seqstart_q: addr(k.sequences.seqstart_q.addr()),
            seqstart_k: addr(k.sequences.seqstart_k.addr()),
            seqlen_q_ptr: addr(k.sequences.seqlen_q.addr()),
            seqlen_k_ptr: addr(k.sequences.seqlen_k.addr()),
            q_batch_stride: k.q.batch_stride,
            q_head_stride: k.q.head_stride,
            q_row_stride: k.q.row_stride,
            k_batch_stride: k.k.batch_stride,
            k_head_stride: k.k.head_stride,
            k_row_stride: k.k.row_stride,
            v_batch_stride: k.v.batch_stride,
            v_head_stride: k.v.head_stride,
            v_row_stride: k.v.row_stride,
            o_batch_stride: k.o.batch_stride,
            o_head_stride: k.o.head_stride,
            o_row_stride: k.o.row_stride,
            lse_batch_stride: k.lse.batch_stride,
            lse_head_stride: k.lse.head_stride,
            batch: s.batch as i32,
            nhead_q: s.nhead_q as i32,
            nhead_k: s.nhead_k as i32,
            hdim_q: s.hdim_q as i32,
            hdim_v: s.hdim_v as i32,
            seqlen_q: s.seqlen_q as i32,
            seqlen_k: s.seqlen_k as i32,
            max_seqlen_q: s.max_seqlen_q as i32,
            group_mode: (s.mode == crate::problem::Mode::Group) as i32,
            mask_type: s.mask.kind as i32,
            window_left: s.mask.left,
            window_right: s.mask.right,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
            dtype: s.dtype.abi_value(),
            hdim_bucket: k.instance.hdim_q as i32,
            masked: s.masked() as i32,
            q_descale: DescaleParams::new(&k.descales.q),
            k_descale: DescaleParams::new(&k.descales.k),
            v_descale: DescaleParams::new(&k.descales.v),
            tile_counter: addr(k.workspace.addr()),
        }
    }
}

impl BwdParams {
    /// The parameter block of validated kernel arguments. Lengths fit in i32 (the ABI passes them so);
    /// the workspace fields are the launcher's layout.
    pub fn new(k: &BwdKargs) -> BwdParams {
        let s = &k.shape;
        let addr = |x: DeviceAddr| x.0 as u64;
        let params = BwdParams {
            q: addr(k.q.ptr),
            k: addr(k.k.ptr),
            v: addr(k.v.ptr),
            o: addr(k.o.ptr),
            lse: addr(k.lse.ptr),
            d_o: addr(k.d_o.ptr),
            d: addr(k.d.ptr),
            dq: addr(k.dq.ptr),
            dk: addr(k.dk.ptr),
            dv: addr(k.dv.ptr),
            seqstart_q: addr(k.sequences.seqstart_q.addr()),
            seqstart_k: addr(k.sequences.seqstart_k.addr()),
            seqlen_q_ptr: addr(k.sequences.seqlen_q.addr()),
            seqlen_k_ptr: addr(k.sequences.seqlen_k.addr()),
            q_batch_stride: k.q.batch_stride,
            q_head_stride: k.q.head_stride,
            q_row_stride: k.q.row_stride,
            k_batch_stride: k.k.batch_stride,
            k_head_stride: k.k.head_stride,
            k_row_stride: k.k.row_stride,
            v_batch_stride: k.v.batch_stride,
            v_head_stride: k.v.head_stride,
            v_row_stride: k.v.row_stride,
            o_batch_stride: k.o.batch_stride,
            o_head_stride: k.o.head_stride,
            o_row_stride: k.o.row_stride,
            do_batch_stride: k.d_o.batch_stride,
            do_head_stride: k.d_o.head_stride,
            do_row_stride: k.d_o.row_stride,
            dq_batch_stride: k.dq.batch_stride,
            dq_head_stride: k.dq.head_stride,
            dq_row_stride: k.dq.row_stride,
            dk_batch_stride: k.dk.batch_stride,
            dk_head_stride: k.dk.head_stride,
            dk_row_stride: k.dk.row_stride,
            dv_batch_stride: k.dv.batch_stride,
            dv_head_stride: k.dv.head_stride,
            dv_row_stride: k.dv.row_stride,
            lse_batch_stride: k.lse.batch_stride,
            lse_head_stride: k.lse.head_stride,
            d_batch_stride: k.d.batch_stride,
            d_head_stride: k.d.head_stride,
            batch: s.batch as i32,
            nhead_q: s.nhead_q as i32,
            nhead_k: s.nhead_k as i32,
            hdim_q: s.hdim_q as i32,
            hdim_v: s.hdim_v as i32,
            seqlen_q: s.seqlen_q as i32,
            seqlen_k: s.seqlen_k as i32,
            max_seqlen_q: s.max_seqlen_q as i32,
            max_seqlen_k: s.max_seqlen_k as i32,
            group_mode: (s.mode == crate::problem::Mode::Group) as i32,
            deterministic: k.deterministic as i32,
            mask_type: s.mask.kind as i32,
            window_left: s.mask.left,
            window_right: s.mask.right,
            m0: k.instance.m0 as i32,
            n0: k.instance.n0 as i32,
            scale: s.scale,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
            dtype: s.dtype.abi_value(),
            hdim_bucket: k.instance.hdim_q as i32,
            masked: s.masked() as i32,
            ..BwdParams::default()
        };
        params.with_workspace(&k.layout, k.workspace)
    }

    /// The block with `workspace` laid out as `layout`: the metadata sections' offsets, the dq_acc
    /// region's size, the fingerprint of the layout's parameters, and the batch-mode schedule (zero in
    /// the other modes) as the layout computed it.
    pub fn with_workspace(self, layout: &WorkspaceLayout, workspace: DevicePtr<u8>) -> BwdParams {
        let w = &layout.params;
        let plan = layout.batch_plan.unwrap_or_default();
        BwdParams {
            workspace: workspace.addr().0 as u64,
            metadata_bytes: layout.metadata_bytes as i64,
            nsplits_offset: layout.nsplits.offset as i64,
            dq_acc_offsets_offset: layout.dq_acc_offsets.offset as i64,
            cu_state_offset: layout.cu_state.offset as i64,
            batch_state_offset: layout.batch_state.offset as i64,
            dq_acc_elements: (layout.upper_bound_dq_acc_bytes() / 4) as i64,
            fingerprint_params: crate::workspace::fingerprint_of_params(w),
            jobs_per_head: plan.jobs_per_head,
            jobs_per_worker: plan.jobs_per_worker,
            total_jobs: plan.total_jobs,
            ordered_dq: i64::from(w.ordered()),
            dq_semaphore_words: layout.dq_semaphore_words as i64,
            num_cus: w.num_cus as i32,
            ..self
        }
    }
}

impl PrepareParams {
    /// The prepare arguments for `layout`. Every size of a layout fits `i64`: [`WorkspaceLayout::new`]
    /// bounds the counts by `i32::MAX` and the region by the address space.
    pub fn new(layout: &WorkspaceLayout) -> PrepareParams {
        let p = &layout.params;
        let size = |v: usize| v as i64;
        PrepareParams {
            group_mode: i64::from(p.group_mode),
            deterministic: i64::from(p.deterministic),
            batch: p.batch,
            nhead_k: p.nhead_k,
            row_elements: p.row_elements,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            max_seqlen_k: p.max_seqlen_k,
            m0: p.m0,
            n0: p.n0,
            num_cus: p.num_cus,
            remap: p.remap.code(),
            nsplits_offset: size(layout.nsplits.offset),
            nsplits_count: size(layout.nsplits.count),
            dq_acc_offsets_offset: size(layout.dq_acc_offsets.offset),
            dq_acc_offsets_count: size(layout.dq_acc_offsets.count),
            cu_state_offset: size(layout.cu_state.offset),
            cu_state_count: size(layout.cu_state.count),
            batch_state_offset: size(layout.batch_state.offset),
            batch_state_count: size(layout.batch_state.count),
            metadata_bytes: size(layout.metadata_bytes),
            masked: i64::from(p.masked),
            ordered_dq: i64::from(p.ordered_dq),
            nhead_q: p.nhead_q,
        }
    }
}

impl KvCacheFault {
    /// The record of a prepare that found `fault` (or nothing).
    pub fn new(fault: Option<TableFault>) -> KvCacheFault {
        let mut record = KvCacheFault { magic: KVCACHE_PREPARED, ..KvCacheFault::default() };
        if let Some(f) = fault {
            record.field = f.field as i32;
            (record.sequence, record.value, record.bound) = (f.sequence, f.value, f.bound);
        }
        record
    }

    /// What the record says: not prepared, a fault, or nothing found.
    pub fn outcome(&self) -> Result<Option<TableFault>> {
        if self.magic != KVCACHE_PREPARED {
            return Err(Error::new(
                Status::WorkspaceNotPrepared,
                "workspace: no prepare has completed on it (fmha_kvcache_launcher_prepare_async)",
            ));
        }
        if self.field == 0 {
            return Ok(None);
        }
        let field = KvField::from_i32(self.field)
            .ok_or_else(|| Error::internal(format!("workspace: fault record names field {}", self.field)))?;
        Ok(Some(TableFault { field, sequence: self.sequence, value: self.value, bound: self.bound }))
    }
}

impl DescaleParams {
    fn new(d: &Descale) -> DescaleParams {
        DescaleParams {
            data: d.data.addr().0 as u64,
            batch_stride: d.batch_stride,
            head_stride: d.head_stride,
            page_stride: d.page_stride,
        }
    }
}

impl KvCacheParams {
    /// The parameter block of validated kernel arguments; `record` is the prepare's fault record
    /// (null for the forward). Lengths fit in i32: the ABI passes them so.
    pub fn new(k: &KvCacheKargs, record: DevicePtr<KvCacheFault>) -> KvCacheParams {
        let addr = |x: DeviceAddr| x.0 as u64;
        let array = |x: DevicePtr<i32>| x.addr().0 as u64;
        let t = &k.table;
        KvCacheParams {
            q: addr(k.q.ptr),
            k: addr(k.k.ptr),
            v: addr(k.v.ptr),
            o: addr(k.o.ptr),
            lse: addr(k.lse.ptr),
            seqstart_q: array(k.seqstart_q),
            seqlen_k: array(t.seqlen_k),
            block_table: array(t.block_table),
            kv_indptr: array(t.kv_indptr),
            page_indices: array(t.page_indices),
            last_page_len: array(t.last_page_len),
            cache_batch_idx: array(t.cache_batch_idx),
            workspace: record.addr().0 as u64,
            q_batch_stride: k.q.batch_stride,
            q_head_stride: k.q.head_stride,
            q_row_stride: k.q.row_stride,
            k_batch_stride: k.k.batch_stride,
            k_head_stride: k.k.head_stride,
            k_row_stride: k.k.row_stride,
            v_batch_stride: k.v.batch_stride,
            v_head_stride: k.v.head_stride,
            v_row_stride: k.v.row_stride,
            o_batch_stride: k.o.batch_stride,
            o_head_stride: k.o.head_stride,
            o_row_stride: k.o.row_stride,
            lse_batch_stride: k.lse.batch_stride,
            lse_head_stride: k.lse.head_stride,
            block_table_stride: t.block_table_stride,
            q_descale: DescaleParams::new(&k.descales.q),
            k_descale: DescaleParams::new(&k.descales.k),
            v_descale: DescaleParams::new(&k.descales.v),
            batch: k.batch as i32,
            nhead_q: k.nhead_q as i32,
            nhead_k: k.nhead_k as i32,
            hdim_q: k.hdim_q as i32,
            hdim_v: k.hdim_v as i32,
            seqlen_q: if k.mode == Mode::Group { k.bounds.total_q } else { k.bounds.max_seqlen_q } as i32,
            max_seqlen_q: k.bounds.max_seqlen_q as i32,
            max_seqlen_k: k.bounds.max_seqlen_k as i32,
            group_mode: i32::from(k.mode == Mode::Group),
            mask_type: k.mask.kind as i32,
            window_left: k.mask.left,
            window_right: k.mask.right,
            scale_log2: k.scale * std::f32::consts::LOG2_E,
            dtype: k.dtype.abi_value(),
            hdim_bucket: k.instance.hdim_q as i32,
            // Decode's causal mask keeps every key: the unmasked tiles skip its per-element checks.
            masked: i32::from(!k.mask.keeps_every_key(k.bounds.max_seqlen_q)),
            table_kind: t.kind as i32,
            page_size: t.page_size as i32,
            num_pages: t.num_pages as i32,
            max_pages_per_seq: t.max_pages_per_seq as i32,
            num_page_indices: t.num_page_indices as i32,
            check_tables: i32::from(k.check_tables),
            max_splits: k.splits.policy.max_splits as i32,
            split_tiles: k.splits.policy.split_tiles as i32,
            block_m: k.instance.m0 as i32,
            block_n: k.instance.n0 as i32,
            cu_count: k.splits.cu_count.min(i64::from(i32::MAX)) as i32,
            split_plan: k.splits.plan.addr().0 as u64,
            partial_lse: k.splits.partial_lse.addr().0 as u64,
            partial_o: k.splits.partial_o.addr().0 as u64,
            partial_rows: k.splits.rows,
            pack_gqa: i32::from(k.instance.packed_gqa),
            pad: 0,
            sequence_order: k.splits.order.addr().0 as u64,
            order_keys: k.splits.order_keys.addr().0 as u64,
            tile_counter: addr(k.scheduler_workspace.addr()),
        }
    }
}

impl MergeParams {
    /// The parameter block of validated kernel arguments. Counts fit in i32: the ABI passes them so.
    pub fn new(k: &MergeKargs) -> MergeParams {
        let addr = |x: DeviceAddr| x.0 as u64;
        MergeParams {
            o_in: addr(k.o_in.ptr),
            lse_in: addr(k.lse_in.ptr),
            o_out: addr(k.o_out.ptr),
            lse_out: addr(k.lse_out.ptr),
            o_in_state_stride: k.o_in.batch_stride,
            o_in_head_stride: k.o_in.head_stride,
            o_in_row_stride: k.o_in.row_stride,
            lse_in_state_stride: k.lse_in.batch_stride,
            lse_in_head_stride: k.lse_in.head_stride,
            lse_in_row_stride: k.lse_in.row_stride,
            o_out_head_stride: k.o_out.head_stride,
            o_out_row_stride: k.o_out.row_stride,
            lse_out_head_stride: k.lse_out.head_stride,
            lse_out_row_stride: k.lse_out.row_stride,
            num_states: k.num_states as i32,
            num_rows: k.num_rows as i32,
            nhead: k.nhead as i32,
            hdim: k.hdim as i32,
            in_dtype: k.in_dtype as i32,
            out_dtype: k.out_dtype as i32,
            lse_base2: i32::from(k.lse_base == LseBase::Base2),
            pad: 0,
        }
    }
}
