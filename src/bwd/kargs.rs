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
