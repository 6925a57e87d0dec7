//! Forward kernel arguments: everything a forward kernel reads, validated, with device addresses as
//! integers. The host kernel and the GPU launch stubs consume this same struct.

use crate::problem::{Shape, Tensor};
use crate::registry::Instance;

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
    /// Device arrays: `seqstart_q/k` `[batch + 1]` (group mode), optional logical lengths `[batch]`.
    pub seqstart_q: usize,
    pub seqstart_k: usize,
    pub seqlen_q_ptr: usize,
    pub seqlen_k_ptr: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FwdExtents {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub o: usize,
    pub lse: usize,
}

/// The forward kernels' parameter block: mirrors `fmha_fwd_params` in `hip/fwd/fwd_params.h` field
/// for field (addresses as u64, strides in elements).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub seqstart_q: u64,
    pub seqstart_k: u64,
    pub seqlen_q_ptr: u64,
    pub seqlen_k_ptr: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_row_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_row_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_row_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_row_stride: i64,
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub batch: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub max_seqlen_q: i32,
    pub group_mode: i32,
    pub mask_type: i32,
    pub window_left: i32,
    pub window_right: i32,
    pub scale_log2: f32,
    pub dtype: i32,
    pub hdim_bucket: i32,
    pub masked: i32,
}

impl FwdParams {
    /// The parameter block of validated kernel arguments. Lengths fit in i32: the ABI passes them so.
    pub fn new(k: &FwdKargs) -> FwdParams {
        let s = &k.shape;
        let addr = |x: usize| x as u64;
        FwdParams {
            q: addr(k.q.ptr),
            k: addr(k.k.ptr),
            v: addr(k.v.ptr),
            o: addr(k.o.ptr),
            lse: addr(k.lse.ptr),
            seqstart_q: addr(k.seqstart_q),
            seqstart_k: addr(k.seqstart_k),
            seqlen_q_ptr: addr(k.seqlen_q_ptr),
            seqlen_k_ptr: addr(k.seqlen_k_ptr),
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
            dtype: s.dtype as i32,
            hdim_bucket: k.instance.hdim_q as i32,
            masked: s.masked() as i32,
        }
    }
}
