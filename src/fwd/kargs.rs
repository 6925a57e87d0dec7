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
