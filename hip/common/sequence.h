// Per-batch row ranges as every kernel reads them: physical offsets from `seqstart` in group mode,
// logical lengths from the optional length arrays, and the mask resolved for the batch's lengths
// (the semantics of src/problem/mask.rs, spec ck_fmha_bwd.md §1.6).
#pragma once

#include <stdint.h>

#include "arch/platform.h"

namespace fmha {

struct BatchRows {
  int64_t q_start, k_start;  // first physical row (0 in batch mode)
  int32_t sq, sk;            // logical lengths
};

// Group mode reads device arrays the host never sees, so they are clamped rather than trusted: a
// batch's rows lie inside [0, total) and inside its physical range, and a logical length never exceeds
// the physical one. Valid arrays pass unchanged (the host backend reports invalid ones as errors; a GPU
// kernel has no error channel, and clamping keeps every access inside the tensors).
__device__ inline int64_t clamp_rows(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

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
  // In group mode seqlen_q/seqlen_k are the totals of physical rows.
  r.q_start = clamp_rows(seqstart_q[b], 0, seqlen_q);
  r.k_start = clamp_rows(seqstart_k[b], 0, seqlen_k);
  const int64_t physical_q = clamp_rows(seqstart_q[b + 1], r.q_start, seqlen_q) - r.q_start;
  const int64_t physical_k = clamp_rows(seqstart_k[b + 1], r.k_start, seqlen_k) - r.k_start;
  r.sq = static_cast<int32_t>(seqlen_q_ptr ? clamp_rows(seqlen_q_ptr[b], 0, physical_q) : physical_q);
  r.sk = static_cast<int32_t>(seqlen_k_ptr ? clamp_rows(seqlen_k_ptr[b], 0, physical_k) : physical_k);
  return r;
}

// The rows of batch `b` from a kernel parameter block (fmha_fwd_params and fmha_bwd_params name the
// sequence fields alike).
template <typename Params>
__device__ inline BatchRows batch_rows(const Params& p, int32_t b) {
  return batch_rows(b, p.group_mode != 0, p.seqlen_q, p.seqlen_k, reinterpret_cast<const int32_t*>(p.seqstart_q),
                    reinterpret_cast<const int32_t*>(p.seqstart_k), reinterpret_cast<const int32_t*>(p.seqlen_q_ptr),
                    reinterpret_cast<const int32_t*>(p.seqlen_k_ptr));
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
