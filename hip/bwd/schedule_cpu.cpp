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

}  // namespace

extern "C" int64_t fmha_cpu_batch_jobs(const fmha_walk_args* args, fmha_unit_record* units, int64_t capacity) {
  Collect collect{units, capacity};
  fmha::for_each_batch_job(args->params, args->worker, args->masked != 0, collect);
  return collect.count;
}

extern "C" int64_t fmha_cpu_group_jobs(const fmha_walk_args* args, fmha_unit_record* units, int64_t capacity) {
  Collect collect{units, capacity};
  fmha::for_each_group_job(args->params, static_cast<int32_t>(args->worker), args->masked != 0, collect);
  return collect.count;
}
