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

// A workgroup's place in its walk of the persistent schedule, between two units: the batch, kv head,
// chunk (K tile) and split of its next unit, whether that is the first in its slot, and `w`: batch mode's
// jobs left, group mode's work position. The walkers below take one unit at a time from it, without
// divisions, so that a kernel can keep it where it likes (in registers, or in shared memory).
struct ScheduleCursor {
  int64_t w;
  int32_t b, h, c, split, first_in_slot;
};

// `BatchPersistent::jobs` of workgroup `worker`: its first place, then each unit in order, false past the
// last. Jobs are (batch, head, tile) in order, jobs_per_head tiles a head.
FMHA_DEVICE inline ScheduleCursor batch_jobs_start(const fmha_bwd_params& p, int64_t worker) {
  const int64_t jph = p.jobs_per_head, jpw = p.jobs_per_worker;
  const int64_t begin = worker * jpw;
  const int64_t end = begin + jpw < p.total_jobs ? begin + jpw : p.total_jobs;
  ScheduleCursor at{};
  if (begin >= end) return at;
  at.w = end - begin;
  const int64_t flat_head = begin / jph;
  at.b = static_cast<int32_t>(flat_head / p.nhead_k);
  at.h = static_cast<int32_t>(flat_head % p.nhead_k);
  at.c = static_cast<int32_t>(begin % jph);
  // The worker starting inside a head uses split ceil(offset / jpw) there; every other head starts at 0.
  at.split = static_cast<int32_t>((at.c + jpw - 1) / jpw);
  at.first_in_slot = 1;
  return at;
}

FMHA_DEVICE inline bool next_batch_job(const fmha_bwd_params& p, bool masked, ScheduleCursor& at, WorkUnit& u) {
  if (at.w <= 0) return false;
  const int64_t jph = p.jobs_per_head;
  u.batch = at.b;
  u.head = at.h;
  u.k_tile = static_cast<int32_t>(masked ? interleaved_tile(at.c, jph) : at.c);
  u.split = at.split;
  u.first_in_slot = at.first_in_slot;
  --at.w;
  at.first_in_slot = 0;
  if (++at.c == jph) {
    at.c = 0;
    at.split = 0;
    at.first_in_slot = 1;
    if (++at.h == p.nhead_k) {
      at.h = 0;
      ++at.b;
    }
  }
  return true;
}

template <typename Run>
FMHA_DEVICE inline void for_each_batch_job(const fmha_bwd_params& p, int64_t worker, bool masked, Run&& run) {
  ScheduleCursor at = batch_jobs_start(p, worker);
  WorkUnit u;
  while (next_batch_job(p, masked, at, u)) run(u);
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
FMHA_DEVICE inline ScheduleCursor group_jobs_start(const fmha_bwd_params& p, int32_t cu) {
  const CuState s = cu_state(p, cu);
  return ScheduleCursor{s.w_lo, s.ibatch, s.head_start, s.c_start, s.isplit, 1};
}

FMHA_DEVICE inline bool next_group_job(const fmha_bwd_params& p, int32_t cu, bool masked, ScheduleCursor& at,
                                       WorkUnit& u) {
  const int64_t w_hi = cu_state(p, cu).w_hi;
  while (at.b < p.batch && at.w < w_hi) {
    if (at.h >= p.nhead_k) {
      at.h = 0;
      ++at.b;
      continue;
    }
    const BatchState bs = batch_state(p, at.b);
    if (at.c < bs.nc) {
      u.batch = at.b;
      u.head = at.h;
      u.k_tile = static_cast<int32_t>(masked ? interleaved_tile(at.c, bs.nc) : at.c);
      u.split = at.split;
      u.first_in_slot = at.first_in_slot;
      at.w += bs.sq;
      ++at.c;
      at.first_in_slot = 0;
      return true;
    }
    at.c = 0;
    at.split = 0;
    ++at.h;
    at.first_in_slot = 1;
  }
  return false;
}

template <typename Run>
FMHA_DEVICE inline void for_each_group_job(const fmha_bwd_params& p, int32_t cu, bool masked, Run&& run) {
  ScheduleCursor at = group_jobs_start(p, cu);
  WorkUnit u;
  while (next_group_job(p, cu, masked, at, u)) run(u);
}

}  // namespace fmha
