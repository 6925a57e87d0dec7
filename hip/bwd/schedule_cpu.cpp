// The deterministic walkers of bwd/schedule.h built for the host CPU, in every backend: the tests compare
// the units they walk with src/schedule (the host executor's walk), so the walk every GPU kernel runs is
// checked in every CI run, without a GPU.
#include "bwd/schedule.h"

namespace {

// Collects the walked units into `units` (at most `capacity`) and counts all of them.
struct Collect {
  fmha_unit_record* units;
  int64_t capacity;
  int64_t count = 0;

  void operator()(const fmha::WorkUnit& u) {
    if (count < capacity) units[count] = fmha_unit_record{u.batch, u.head, u.k_tile, u.split, u.first_in_slot};
    ++count;
  }
};

bool same_unit(const fmha_unit_record& r, const fmha::WorkUnit& u) {
  return r.batch == u.batch && r.head == u.head && r.k_tile == u.k_tile && r.split == u.split &&
         r.first_in_slot == u.first_in_slot;
}

}  // namespace

// Batch mode has two walks of one schedule: for_each_batch_job's loop (the AMD kernel) and next_batch_job's
// cursor (the sm_90a kernel's poster). Both are walked; -1 where they disagree.
extern "C" int64_t fmha_cpu_batch_jobs(const fmha_walk_args* args, fmha_unit_record* units, int64_t capacity) {
  const bool masked = args->masked != 0;
  Collect collect{units, capacity};
  fmha::for_each_batch_job(args->params, args->worker, masked, collect);
  fmha::ScheduleCursor at = fmha::batch_jobs_start(args->params, args->worker);
  fmha::WorkUnit u;
  int64_t walked = 0;
  for (; fmha::next_batch_job(args->params, masked, at, u); ++walked) {
    if (walked < capacity && walked < collect.count && !same_unit(units[walked], u)) return -1;
  }
  return walked == collect.count ? collect.count : -1;
}

extern "C" int64_t fmha_cpu_group_jobs(const fmha_walk_args* args, fmha_unit_record* units, int64_t capacity) {
  Collect collect{units, capacity};
  fmha::for_each_group_job(args->params, static_cast<int32_t>(args->worker), args->masked != 0, collect);
  return collect.count;
}
