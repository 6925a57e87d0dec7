// Backward kernel parameters: a POD struct filled by Rust (src/bwd/kargs.rs, `BwdParams`, which mirrors
// it field by field) and passed by value to the three stages. Addresses are 64-bit integers, strides
// are in elements, and the workspace fields are the layout the host computed (src/workspace.rs), so
// the kernels read exactly the bytes the prepare wrote.
#pragma once

#include <stdint.h>

typedef struct fmha_bwd_params {
  uint64_t q, k, v, o, lse, d_o, d, dq, dk, dv;
  uint64_t seqstart_q, seqstart_k, seqlen_q_ptr, seqlen_k_ptr;  // group mode (0 when absent)
  uint64_t workspace;                                           // metadata region, dq_acc after it
  int64_t q_batch_stride, q_head_stride, q_row_stride;  // (Rust: `strides[0..8]`, in this order)
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t do_batch_stride, do_head_stride, do_row_stride;
  int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  int64_t lse_batch_stride, lse_head_stride;  // lse and d share the LSE layout (row stride 1)
  int64_t d_batch_stride, d_head_stride;
  // Workspace layout (byte offsets inside the metadata region) and the dq_acc region's size.
  int64_t metadata_bytes, nsplits_offset, dq_acc_offsets_offset, cu_state_offset, batch_state_offset;
  int64_t dq_acc_elements;
  // workspace.rs `fingerprint` after the params words: the kernels absorb the seqstarts they were given
  // and compare with the header, so a workspace prepared for other sequences is never trusted.
  uint64_t fingerprint_params;
  // Batch-mode persistent schedule (schedule.rs `BatchPersistent`), deterministic mode.
  int64_t jobs_per_head, jobs_per_worker, total_jobs;
  int32_t batch, nhead_q, nhead_k, hdim_q, hdim_v;
  int32_t seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k;  // batch mode: per batch; group mode: bounds
  int32_t group_mode, deterministic;
  int32_t mask_type;  // 0 none, 1 top-left, 2 bottom-right
  int32_t window_left, window_right;
  int32_t num_cus;  // workgroups of the persistent grid (the workspace was laid out for it)
  int32_t m0, n0;   // the dq_dk_dv tile: q rows per step, keys per work unit
  float scale;      // softmax scale
  float scale_log2; // scale * log2(e)
  // Instance selection (what the launch stub dispatches on).
  int32_t dtype;        // 0 fp16, 1 bf16
  int32_t hdim_bucket;  // compiled head dim the tiles are sized for
  int32_t masked;
} fmha_bwd_params;
