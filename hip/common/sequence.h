// Per-batch row ranges as every kernel reads them: physical offsets from `seqstart` in group mode,
// logical lengths from the optional length arrays, and the mask resolved for the batch's lengths
// (the semantics of src/mask.rs, spec ck_fmha_bwd.md §1.6).
#pragma once

#include <stdint.h>

#include "arch/platform.h"

namespace fmha {

struct BatchRows {
  int64_t q_start, k_start;  // first physical row (0 in batch mode)
  int32_t sq, sk;            // logical lengths
};

__device__ inline BatchRows batch_rows(int32_t b, bool group, int32_t seqlen_q, int32_t seqlen_k,
                                       const int32_t* seqstart_q, const int32_t* seqstart_k,
                                       const int32_t* seqlen_q_ptr, const int32_t* seqlen_k_ptr) {
  BatchRows r;
  if (!group) {
    r.q_start = 0;
    r.k_start = 0;
    r.sq = seqlen_q;
    r.sk = seqlen_k;
    return r;
  }
  r.q_start = seqstart_q[b];
  r.k_start = seqstart_k[b];
  r.sq = seqlen_q_ptr ? seqlen_q_ptr[b] : seqstart_q[b + 1] - seqstart_q[b];
  r.sk = seqlen_k_ptr ? seqlen_k_ptr[b] : seqstart_k[b + 1] - seqstart_k[b];
  return r;
}

// Element (i, j) is kept iff lo(i) <= j <= hi(i) and j < sk, with lo(i) = i + off - left and
// hi(i) = i + off + right; an unbounded side (-1) resolves to a bound that never excludes anything.
struct ResolvedMask {
  int64_t off, left, right;

  __device__ bool kept(int64_t i, int64_t j, int64_t sk) const {
    return j < sk && j >= i + off - left && j <= i + off + right;
  }
};

__device__ inline ResolvedMask resolve_mask(int32_t type, int32_t left, int32_t right, int64_t sq, int64_t sk) {
  const bool top_left = type == 1;
  ResolvedMask m;
  m.left = left < 0 ? (top_left ? sq - 1 : sk - 1) : left;
  m.right = right < 0 ? (top_left ? sk - 1 : sq - 1) : right;
  m.off = top_left ? 0 : sk - sq;
  return m;
}

}  // namespace fmha
