// Forward kernel parameters: a POD struct filled by Rust (src/fwd/kargs.rs, `FwdParams`, which
// mirrors it field by field) and passed by value to the kernels. Addresses are 64-bit integers so the
// two definitions cannot drift in pointer width; strides are in elements.
#pragma once

#include <stdint.h>

typedef struct fmha_fwd_params {
  uint64_t q, k, v, o, lse;                                      // lse == 0: not written
  uint64_t seqstart_q, seqstart_k, seqlen_q_ptr, seqlen_k_ptr;  // group mode (0 when absent)
  int64_t q_batch_stride, q_head_stride, q_row_stride;
  int64_t k_batch_stride, k_head_stride, k_row_stride;
  int64_t v_batch_stride, v_head_stride, v_row_stride;
  int64_t o_batch_stride, o_head_stride, o_row_stride;
  int64_t lse_batch_stride, lse_head_stride;
  int32_t batch, nhead_q, nhead_k, hdim_q, hdim_v;
  int32_t seqlen_q, seqlen_k, max_seqlen_q;  // batch mode: per batch; group mode: totals / bound
  int32_t group_mode;
  int32_t mask_type;  // 0 none, 1 top-left, 2 bottom-right
  int32_t window_left, window_right;
  float scale_log2;  // softmax scale * log2(e): the kernels work in the exp2 domain
  // Instance selection (what the launch stub dispatches on).
  int32_t dtype;        // 0 fp16, 1 bf16
  int32_t hdim_bucket;  // compiled head dim the tiles are sized for
  int32_t masked;       // masked instance (any mask type other than none)
} fmha_fwd_params;
