//! What an operation hands the launch layer: validated kernel arguments (CK's "kargs"), with device
//! addresses as typed values. The host executor reads them directly; the GPU executor turns them into
//! the kernels' parameter blocks (`abi.rs`, built in `params.rs`).

use crate::problem::{SequenceArrays, Shape, Tensor};
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
