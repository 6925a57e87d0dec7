// The work units of the backward dq_dk_dv kernels: one (batch, kv head, K tile) with its dq_acc split
// slot. The deterministic walkers are the device loops of src/schedule/mod.rs (`BatchPersistent::jobs`,
// `group_jobs`), which the host executor runs too; the tests hold the two to the same units through
// the slot-ownership check of the host executor and the bitwise results of the GPU.
#pragma once

#include <stdint.h>

#include "bwd/workspace_view.h"

namespace fmha {

// schedule.rs `WorkUnit`. first_in_slot (0 or 1): the workgroup's first unit in this split slot, which
// writes every row of the slot (its partial, zeros elsewhere) instead of adding to a zeroed one.
struct WorkUnit {
  int32_t batch, head, k_tile, split, first_in_slot;
};

// schedule.rs `interleaved_tile`: 0, n-1, 1, n-2, ... so that consecutive units mix cheap and expensive
// tiles of a causal mask.
FMHA_DEVICE inline int64_t interleaved_tile(int64_t t, int64_t n) { return t % 2 == 0 ? t / 2 : n - 1 - t / 2; }

// `BatchPersistent::jobs` of workgroup `worker`: calls `run(unit)` for each unit, in order.
template <typename Run>
FMHA_DEVICE inline void for_each_batch_job(const fmha_bwd_params& p, int64_t worker, bool masked, Run&& run) {
  const int64_t jph = p.jobs_per_head, jpw = p.jobs_per_worker;
  const int64_t begin = worker * jpw;
  const int64_t end = begin + jpw < p.total_jobs ? begin + jpw : p.total_jobs;
  if (begin >= end) return;
  // The worker starting inside a head uses split ceil(offset / jpw) there; every other head starts at 0.
  const int64_t first_head = begin / jph;
  const int64_t first_split = (begin % jph + jpw - 1) / jpw;
  for (int64_t job = begin; job < end; ++job) {
    const int64_t flat_head = job / jph, t = job % jph;
    WorkUnit u;
    u.batch = static_cast<int32_t>(flat_head / p.nhead_k);
    u.head = static_cast<int32_t>(flat_head % p.nhead_k);
    u.k_tile = static_cast<int32_t>(masked ? interleaved_tile(t, jph) : t);
    u.split = static_cast<int32_t>(flat_head == first_head ? first_split : 0);
    u.first_in_slot = job == begin || t == 0;
    run(u);
  }
}

// `BatchPersistent::splits_used`: the split slots of a head that some worker writes, 0..n.
FMHA_DEVICE inline int64_t batch_splits_used(const fmha_bwd_params& p, int64_t flat_head) {
  const int64_t first = flat_head * p.jobs_per_head;
  const int64_t end = first + p.jobs_per_head < p.total_jobs ? first + p.jobs_per_head : p.total_jobs;
  if (first >= end) return 0;
  return (end - 1) / p.jobs_per_worker - first / p.jobs_per_worker + 1;
}

// `WorkspaceLayout::summed_splits`: the slots of batch b, kv head hk that convert_dq sums.
FMHA_DEVICE inline int32_t summed_splits(const fmha_bwd_params& p, const DqAccBlock& acc, int32_t b, int32_t hk) {
  if (p.group_mode || !p.deterministic) return acc.nsplits;
  return static_cast<int32_t>(batch_splits_used(p, int64_t(b) * p.nhead_k + hk));
}

// `group_jobs` of workgroup `cu`: walk chunks from the CU's start while the position is below w_hi; a
// new head restarts at split 0.
template <typename Run>
FMHA_DEVICE inline void for_each_group_job(const fmha_bwd_params& p, int32_t cu, bool masked, Run&& run) {
  const CuState s = cu_state(p, cu);
  int64_t w = s.w_lo;
  int32_t b = s.ibatch, h = s.head_start, c = s.c_start, split = s.isplit;
  int32_t first_in_slot = 1;
  while (b < p.batch && w < s.w_hi) {
    if (h >= p.nhead_k) {
      h = 0;
      ++b;
      continue;
    }
    const BatchState bs = batch_state(p, b);
    if (c < bs.nc) {
      WorkUnit u;
      u.batch = b;
      u.head = h;
      u.k_tile = static_cast<int32_t>(masked ? interleaved_tile(c, bs.nc) : c);
      u.split = split;
      u.first_in_slot = first_in_slot;
      run(u);
      w += bs.sq;
      ++c;
      first_in_slot = 0;
      continue;
    }
    c = 0;
    split = 0;
    ++h;
    first_in_slot = 1;
  }
}

}  // namespace fmha
