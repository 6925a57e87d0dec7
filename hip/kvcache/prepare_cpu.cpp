// kvcache/page_table.h's prepare and kvcache/split.h's chunks built for the host CPU, in every backend: the tests compare the fault
// it records with the Rust `problem::paged::resolve_sequences` on random tables, so the code the GPU
// prepare kernel runs is checked in every CI run, without a GPU.
#include "kvcache/page_table.h"
#include "kvcache/split.h"

// Writes the fault record of the call `params` describes (host addresses) at `params->workspace`: the
// first fault in sequence order, or none; and at `params->split_plan` (when not 0) the split plan and,
// where the plan says so, the longest-first order (as the prepare kernel's workgroup does: every
// sequence's class, then the classes from the highest down). Returns 0, or 8 (null pointer) when there
// is no record.
extern "C" int32_t fmha_cpu_kvcache_prepare(const fmha_kvcache_params* params, void* /*unused*/) {
  using namespace fmha::kvcache;
  if (params == nullptr || params->workspace == 0) return 8;
  const bool ordering = params->split_plan != 0 && orders(*params);
  int32_t count[kOrderClasses] = {};
  int32_t first = params->batch;
  Fault fault = {kNoFault, 0, 0};
  int64_t work = 0;
  for (int32_t b = 0; b < params->batch; ++b) {
    Sequence s;
    const Fault f = sequence_fault(*params, b, s);
    work += work_units(*params, s);
    if (ordering) {
      const uint8_t key = order_key(work_units(*params, s));
      reinterpret_cast<uint8_t*>(params->order_keys)[b] = key;
      ++count[key];
    }
    if (f.field != kNoFault && first == params->batch) {
      first = b;
      fault = f;
    }
  }
  *reinterpret_cast<fmha_kv_cache_fault*>(params->workspace) = record_of(first, fault);
  if (params->split_plan == 0) return 0;
  const fmha_kv_cache_split_plan plan = plan_of(*params, first < params->batch, work);
  *reinterpret_cast<fmha_kv_cache_split_plan*>(params->split_plan) = plan;
  if (plan.ordered != 0) {
    int32_t placed = 0;
    for (int c = kOrderClasses - 1; c >= 0; --c) {
      place_class(*params, reinterpret_cast<const uint8_t*>(params->order_keys), c, placed);
      placed += count[c];
    }
  }
  return 0;
}

// `split.h`'s chunks of a sequence of `kv_len` keys, into out[0] (count) and out[1] (tiles per chunk).
extern "C" void fmha_cpu_kvcache_chunks(const fmha_kvcache_params* params, int64_t kv_len, int64_t* out) {
  const fmha::kvcache::Chunks c = fmha::kvcache::chunks(*params, kv_len);
  out[0] = c.count;
  out[1] = c.tiles;
}
