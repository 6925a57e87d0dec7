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

// A workgroup's place in its walk of the persistent schedule, between two units. Batch mode: the next
// job `w`, the end of the worker's range, the head it starts in and its split there (`split`), and whether
// the next unit is the worker's first. Group mode: the work position `w` and the batch, kv head, chunk
// (K tile) and split of the next unit, and whether that is the first in its slot. The walkers below take
// one unit at a time from it, so that a kernel can keep it where it likes (in registers, or in shared
// memory).
struct ScheduleCursor {
  int64_t w, end, first_head;
  int32_t b, h, c, split, first_in_slot;
};

// `BatchPersistent::jobs` of workgroup `worker`: its first place, then each unit in order, false past the
// last.
FMHA_DEVICE inline ScheduleCursor batch_jobs_start(const fmha_bwd_params& p, int64_t worker) {
  const int64_t jph = p.jobs_per_head, jpw = p.jobs_per_worker;
  ScheduleCursor at{};
  at.w = worker * jpw;
  at.end = at.w + jpw < p.total_jobs ? at.w + jpw : p.total_jobs;
  if (at.w >= at.end) return at;
  // The worker starting inside a head uses split ceil(offset / jpw) there; every other head starts at 0.
  at.first_head = at.w / jph;
  at.split = static_cast<int32_t>((at.w % jph + jpw - 1) / jpw);
  at.first_in_slot = 1;
  return at;
}

// The unit of batch job `job` of the range `start` describes (`first`: the range's first job).
FMHA_DEVICE inline WorkUnit batch_job_unit(const fmha_bwd_params& p, const ScheduleCursor& start, bool masked,
                                           int64_t job, bool first) {
  const int64_t jph = p.jobs_per_head;
  const int64_t flat_head = job / jph, t = job % jph;
  WorkUnit u;
  u.batch = static_cast<int32_t>(flat_head / p.nhead_k);
  u.head = static_cast<int32_t>(flat_head % p.nhead_k);
  u.k_tile = static_cast<int32_t>(masked ? interleaved_tile(t, jph) : t);
  u.split = flat_head == start.first_head ? start.split : 0;
  u.first_in_slot = first || t == 0;
  return u;
}

FMHA_DEVICE inline bool next_batch_job(const fmha_bwd_params& p, bool masked, ScheduleCursor& at, WorkUnit& u) {
  if (at.w >= at.end) return false;
  u = batch_job_unit(p, at, masked, at.w, at.first_in_slot);
  at.first_in_slot = 0;
  ++at.w;
  return true;
}

// (A loop over the jobs rather than over next_batch_job: in that form the AMD kernels spilled.)
template <typename Run>
FMHA_DEVICE inline void for_each_batch_job(const fmha_bwd_params& p, int64_t worker, bool masked, Run&& run) {
  const ScheduleCursor start = batch_jobs_start(p, worker);
  for (int64_t job = start.w; job < start.end; ++job) run(batch_job_unit(p, start, masked, job, job == start.w));
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
  if (p.group_mode || !split_slots(p)) return acc.nsplits;
  return static_cast<int32_t>(batch_splits_used(p, int64_t(b) * p.nhead_k + hk));
}

// `group_jobs` of workgroup `cu`: walk chunks from the CU's start while the position is below w_hi; a
// new head restarts at split 0.
FMHA_DEVICE inline ScheduleCursor group_jobs_start(const fmha_bwd_params& p, int32_t cu) {
  const CuState s = cu_state(p, cu);
  return ScheduleCursor{s.w_lo, 0, 0, s.ibatch, s.head_start, s.c_start, s.isplit, 1};
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
