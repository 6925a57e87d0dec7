// Arguments of the workspace prepare routine (hip/bwd/prepare_workspace.h): the backward workspace
// params and the metadata layout the host computed for them. Plain C so that hip/launch.h can name it;
// Rust mirrors it field for field as `workspace::PrepareParams` (`#[repr(C)]`), so keep the two in step.
//
// Every field is int64_t: no padding, one size on every compiler, and the same integer type the Rust
// workspace code computes with.
#pragma once

#include <stdint.h>

typedef struct fmha_prepare_params {
  // WorkspaceParams (src/workspace.rs). Booleans and the XCD remap are 0 or 1.
  int64_t group_mode;
  int64_t deterministic;
  int64_t batch;
  int64_t nhead_q;
  int64_t hdim_q;
  int64_t seqlen_q;  // batch mode: per-batch Sq; group mode: seqstart_q[batch]
  int64_t seqlen_k;  // batch mode: Sk; group mode: seqstart_k[batch]
  int64_t max_seqlen_k;
  int64_t m0;
  int64_t n0;
  int64_t num_cus;
  int64_t remap;  // 0 = none, 1 = 8 XCDs
  // WorkspaceLayout: byte offset (from the workspace start) and element count of each section.
  int64_t nsplits_offset;
  int64_t nsplits_count;
  int64_t dq_acc_offsets_offset;
  int64_t dq_acc_offsets_count;
  int64_t cu_state_offset;
  int64_t cu_state_count;
  int64_t batch_state_offset;
  int64_t batch_state_count;
  int64_t metadata_bytes;  // size of the whole metadata region (a multiple of 4096)
} fmha_prepare_params;

#ifdef __cplusplus
static_assert(sizeof(fmha_prepare_params) == 21 * 8, "fmha_prepare_params must match workspace::PrepareParams");
#endif
