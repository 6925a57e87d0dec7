//! The records of the group-mode persistent schedule that the workspace's metadata holds: written by
//! the prepare (Rust and C++), read by the kernels (C++) and the host executor. Part of the kernel ABI:
//! `hip/launch.h` declares them, generated from this file (see `launch/abi.rs`).

/// Where one workgroup starts and stops in group mode (CK's `FmhaBwdGroupPersistentCuState`, 32 bytes).
///
/// Work positions are the global chunk starts `pos(b, h, c) = pb_b + h * hw_b + c * sqw_b`; the
/// workgroup runs the chunks with positions in `[w_lo, w_hi)`, starting at (`ibatch`, `head_start`,
/// `c_start`) with split `isplit`. `ibatch == batch` marks an idle workgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct CuState {
    pub w_lo: i64,
    pub w_hi: i64,
    pub ibatch: i32,
    pub isplit: i32,
    pub head_start: i32,
    pub c_start: i32,
}

/// Per-batch schedule constants (CK's `FmhaBwdBatchState`, 16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct BatchState {
    /// Work weight of one chunk, in q rows (`schedule::chunk_weight`: the rows its K tile keeps,
    /// rounded up to `m0`, plus `m0`; `m0` when `sq == 0`, whose units store zero dK/dV). Only the
    /// walk's positions use it; dq_acc holds the physical rows.
    pub sq: i32,
    /// K tiles per kv head, `ceil(sk / n0)`.
    pub nc: i32,
    /// Split slots per (batch, kv head).
    pub nsplits: i32,
    /// Zero: the record is 16 bytes.
    pub pad: i32,
}
