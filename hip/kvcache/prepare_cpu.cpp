// kvcache/page_table.h's prepare built for the host CPU, in every backend: the tests compare the fault
// it records with the Rust `problem::paged::resolve_sequences` on random tables, so the code the GPU
// prepare kernel runs is checked in every CI run, without a GPU.
#include "kvcache/page_table.h"

// Writes the fault record of the call `params` describes (host addresses) at `params->workspace`: the
// first fault in sequence order, or none. Returns 0, or 8 (null pointer) when there is no record.
extern "C" int32_t fmha_cpu_kvcache_prepare(const fmha_kvcache_params* params, void* /*unused*/) {
  using namespace fmha::kvcache;
  if (params == nullptr || params->workspace == 0) return 8;
  int32_t first = params->batch;
  Fault fault = {kNoFault, 0, 0};
  for (int32_t b = 0; b < params->batch && first == params->batch; ++b) {
    const Fault f = sequence_fault(*params, b);
    if (f.field != kNoFault) {
      first = b;
      fault = f;
    }
  }
  *reinterpret_cast<fmha_kv_cache_fault*>(params->workspace) = record_of(first, fault);
  return 0;
}
