//! Backward kernel arguments shared by the three stages, the host kernels and the GPU launch stubs.

use crate::problem::{Shape, Tensor};
use crate::registry::Instance;
use crate::workspace::WorkspaceLayout;

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
    pub seqstart_q: usize,
    pub seqstart_k: usize,
    pub seqlen_q_ptr: usize,
    pub seqlen_k_ptr: usize,
    pub workspace: usize,
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

/// The backward kernels' parameter block: mirrors `fmha_bwd_params` in `hip/bwd/bwd_params.h` field
/// for field (addresses as u64, strides in elements, the workspace layout as byte offsets).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub d: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    pub seqstart_q: u64,
    pub seqstart_k: u64,
    pub seqlen_q_ptr: u64,
    pub seqlen_k_ptr: u64,
    pub workspace: u64,
    /// Batch, head and row strides of q, k, v, o, do, dq, dk, dv, in that order.
    pub strides: [[i64; 3]; 8],
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub d_batch_stride: i64,
    pub d_head_stride: i64,
    pub metadata_bytes: i64,
    pub nsplits_offset: i64,
    pub dq_acc_offsets_offset: i64,
    pub cu_state_offset: i64,
    pub batch_state_offset: i64,
    pub dq_acc_elements: i64,
    pub fingerprint_params: u64,
    pub jobs_per_head: i64,
    pub jobs_per_worker: i64,
    pub total_jobs: i64,
    pub batch: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub group_mode: i32,
    pub deterministic: i32,
    pub mask_type: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub num_cus: i32,
    pub m0: i32,
    pub n0: i32,
    pub scale: f32,
    pub scale_log2: f32,
    pub dtype: i32,
    pub hdim_bucket: i32,
    pub masked: i32,
}

impl BwdParams {
    /// The parameter block of validated kernel arguments. Lengths fit in i32 (the ABI passes them so);
    /// the workspace fields are the launcher's layout.
    pub fn new(k: &BwdKargs) -> crate::error::Result<BwdParams> {
        let s = &k.shape;
        let layout = &k.layout;
        let w = &layout.params;
        // The deterministic batch-mode schedule, exactly as the host executor and the layout compute it.
        let plan = crate::schedule::BatchPersistent::new(w.batch, w.nhead_q, w.seqlen_k, w.n0, w.num_cus)?;
        let strides = |t: &Tensor| [t.batch_stride, t.head_stride, t.row_stride];
        let addr = |x: usize| x as u64;
        Ok(BwdParams {
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
            seqstart_q: addr(k.seqstart_q),
            seqstart_k: addr(k.seqstart_k),
            seqlen_q_ptr: addr(k.seqlen_q_ptr),
            seqlen_k_ptr: addr(k.seqlen_k_ptr),
            workspace: addr(k.workspace),
            strides: [&k.q, &k.k, &k.v, &k.o, &k.d_o, &k.dq, &k.dk, &k.dv].map(strides),
            lse_batch_stride: k.lse.batch_stride,
            lse_head_stride: k.lse.head_stride,
            d_batch_stride: k.d.batch_stride,
            d_head_stride: k.d.head_stride,
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
            num_cus: w.num_cus as i32,
            m0: k.instance.m0 as i32,
            n0: k.instance.n0 as i32,
            scale: s.scale,
            scale_log2: s.scale * std::f32::consts::LOG2_E,
            dtype: s.dtype as i32,
            hdim_bucket: k.instance.hdim_q as i32,
            masked: s.masked() as i32,
        })
    }
}
