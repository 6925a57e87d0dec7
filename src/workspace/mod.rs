//! The backward workspace: one buffer = metadata region, then the compact fp32 dq_acc region
//! (spec `ck_fmha_bwd.md` §3).
//!
//! Metadata byte layout (all little-endian, every section 16-byte aligned, region rounded up to
//! 4096 so that dq_acc starts on a page; `G` = group mode and deterministic):
//!
//! | section | offset | contents |
//! |---|---|---|
//! | header (ours) | 0 | `u32` magic `"FMHW"`, `u32` format version, `u64` [`fingerprint`] of the inputs |
//! | nsplits | 16 | `i32 × (G ? batch : 1)` |
//! | dq_acc_offsets | after nsplits | `i64 × (G ? batch + 1 : 0)` (elements; the last is the total) |
//! | cu_state | after offsets | [`CuState`](crate::schedule::CuState) × (G ? num_cus : 0), 32 bytes each |
//! | batch_state | after cu_state | [`BatchState`](crate::schedule::BatchState) × (G ? batch : 0), 16 bytes each |
//!
//! After the dq_acc region's upper bound, the ordered dQ scheme (`WorkspaceParams::ordered_dq`, the
//! NVIDIA kernel's deterministic mode) keeps its int32 semaphores, one per (batch, query head, q tile),
//! zeroed with dq_acc before every run ([`WorkspaceLayout::dq_semaphore`]).
//!
//! Bytes not covered by a section are zero, so the region is a pure function of the inputs and a
//! device-side prepare can be compared byte for byte with the host one. The header is our addition to
//! CK's layout: `run` checks it to refuse a workspace prepared for other arguments.

mod fingerprint;
mod layout;
mod metadata;

pub use fingerprint::{fingerprint, fingerprint_of_params};
pub use layout::{
    check_scheduler_workspace, check_section_aligned, check_workspace_argument, workspace_size_upper_bound, DqAccBlock,
    Section, WorkspaceLayout, WorkspaceParams, FORMAT_VERSION, MAGIC, MAX_METADATA_BYTES, METADATA_ALIGNMENT,
    SCHEDULER_WORKSPACE_BYTES, SECTION_ALIGNMENT,
};
pub use metadata::{prepare_metadata, MetadataView, PreparedInfo};

#[cfg(test)]
mod tests;
