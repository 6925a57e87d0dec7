// The kv-cache operation's kernels: the prepare (checks a call's lengths and tables and records the
// first fault, kvcache/page_table.h, and the split plan, kvcache/split.h), the forward kernel reading
// its K/V tiles through the page table, and the split-KV combine (kvcache/combine.h). Hopper:
// kvcache/sm90/paged_tiles.h, fp16, bf16 and fp8 e4m3 (OCP), split and GQA-packed decode; gfx942 /
// gfx950: kvcache/amd/paged_tiles.h, fp16, bf16 and fp8 e4m3 (FNUZ on gfx942, OCP on gfx950), split.
#include "arch/platform.h"
#include "arch/thread.h"
#include "kvcache/combine.h"
#include "kvcache/page_table.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

constexpr int kPrepareThreads = 256;

// One workgroup: thread t checks sequences t, t + 256, ... and keeps its first fault; the smallest
// faulty sequence's fault is recorded (the Rust order: the first in sequence order). The work units of
// every sequence are summed into the split plan (kvcache/split.h), and where the plan orders the
// sequences, thread c then places class c's sequences (the order of `problem::split::longest_first`).
// The first fault and the sum are reduced as a tree, and the classes are kept in shared memory: one
// thread's serial loop over all threads' values, or over classes in global memory, costs microseconds on
// the critical path of every decode step (docs/perf.md).
__global__ void __launch_bounds__(kPrepareThreads) kvcache_prepare_kernel(fmha_kvcache_params p) {
  static_assert(kPrepareThreads == kvcache::kOrderClasses, "one thread per class of the order");
  __shared__ int32_t first[kPrepareThreads];
  __shared__ kvcache::Fault faults[kPrepareThreads];
  __shared__ int64_t work[kPrepareThreads];
  __shared__ int32_t count[kvcache::kOrderClasses];
  __shared__ uint8_t keys[kvcache::kMaxOrderedBatch];  // (the host executor's are in the workspace)
  __shared__ fmha_kv_cache_split_plan plan;
  const int t = static_cast<int>(arch::thread_index());
  const bool ordering = p.split_plan != 0 && kvcache::orders(p);
  first[t] = p.batch;
  count[t] = 0;
  arch::block_barrier();
  int64_t mine = 0;
  for (int32_t b = t; b < p.batch; b += kPrepareThreads) {
    kvcache::Sequence s;
    const kvcache::Fault f = kvcache::sequence_fault(p, b, s);
    const int64_t units = kvcache::work_units(p, s);
    mine += units;
    if (ordering) {
      keys[b] = kvcache::order_key(units);
      arch::shared_atomic_add(&count[keys[b]], 1);
    }
    if (f.field != kvcache::kNoFault && first[t] == p.batch) {
      first[t] = b;
      faults[t] = f;
    }
  }
  work[t] = mine;
  arch::block_barrier();
  for (int half = kPrepareThreads / 2; half > 0; half /= 2) {
    if (t < half) {
      if (first[t + half] < first[t]) {
        first[t] = first[t + half];
        faults[t] = faults[t + half];
      }
      work[t] += work[t + half];
    }
    arch::block_barrier();
  }
  if (t == 0) {
    const kvcache::Fault none = {kvcache::kNoFault, 0, 0};
    const bool found = first[0] < p.batch;
    *reinterpret_cast<fmha_kv_cache_fault*>(p.workspace) = kvcache::record_of(first[0], found ? faults[0] : none);
    plan = kvcache::plan_of(p, found, work[0]);
    if (p.split_plan != 0) *reinterpret_cast<fmha_kv_cache_split_plan*>(p.split_plan) = plan;
  }
  arch::block_barrier();
  if (p.split_plan == 0 || plan.ordered == 0 || count[t] == 0) return;
  int32_t placed = 0;  // the sequences of the classes above t
  for (int c = kvcache::kOrderClasses - 1; c > t; --c) placed += count[c];
  kvcache::place_class(p, keys, t, placed);
}

}  // namespace fmha

extern "C" int32_t fmha_hip_kvcache_prepare(const fmha_kvcache_params* params, void* stream) {
  constexpr int32_t kInvalidValue = 1;  // hipErrorInvalidValue / cudaErrorInvalidValue
  if (params == nullptr || params->workspace == 0) return kInvalidValue;
  fmha::kvcache_prepare_kernel<<<dim3(1), dim3(fmha::kPrepareThreads), 0, static_cast<hipStream_t>(stream)>>>(*params);
  return static_cast<int32_t>(hipGetLastError());
}

#if defined(FMHA_PLATFORM_NVIDIA)
#include "fwd/sm90/instances.h"
#include "kvcache/sm90/paged_tiles.h"
#include "kvcache/sm90/specialized_paged.h"

namespace fmha {

// The forward of the architecture's instance for the call's dtype.
inline int32_t kvcache_forward(const fmha_kvcache_params& p, hipStream_t s) {
  switch (p.dtype) {
    case 0:  // FMHA_DTYPE_FP16
      return dispatch_forward<__half>(p, s);
    case 1:  // FMHA_DTYPE_BF16
      return dispatch_forward<__nv_bfloat16>(p, s);
    case 3:  // FMHA_DTYPE_FP8_E4M3FN (bf16 out)
      return p.k_descale.page_stride != 0 || p.v_descale.page_stride != 0 ? dispatch_forward<__nv_fp8_e4m3, true>(p, s)
                                                                           : dispatch_forward<__nv_fp8_e4m3, false>(p, s);
    default:
      return static_cast<int32_t>(cudaErrorInvalidValue);
  }
}

}  // namespace fmha

#else
#include "fwd/amd/instances.h"
#include "kvcache/amd/paged_tiles.h"

namespace fmha {

// The forward of the architecture's instance for the call's dtype.
inline int32_t kvcache_forward(const fmha_kvcache_params& p, hipStream_t s) {
  switch (p.dtype) {
    case 0:  // fp16
      return dispatch_forward<arch::Half>(p, s);
    case 1:  // bf16
      return dispatch_forward<arch::BFloat16>(p, s);
    case 3:  // FMHA_DTYPE_FP8_E4M3FN (gfx950)
    case 4:  // FMHA_DTYPE_FP8_E4M3FNUZ (gfx942)
      // One instance: each architecture's code object reads its own encoding (arch::Fp8E4m3); the
      // registry lists the one format each architecture has, and the launcher refuses per-page descales.
      return dispatch_forward<arch::Fp8E4m3>(p, s);
    default:  // no AMD instance (the registry refuses the call first)
      return 1;  // hipErrorInvalidValue
  }
}

}  // namespace fmha

#endif

namespace fmha {

// Enqueues the combine of a splitting launcher's call (after its forward, on the same stream); O is
// bf16 for fp8 inputs.
inline int32_t launch_combine(const fmha_kvcache_params& p, hipStream_t stream) {
  if (p.max_splits <= 1) return 0;
  const dim3 grid((p.max_seqlen_q + kCombineWaves - 1) / kCombineWaves, p.nhead_q, p.batch);
  const dim3 block(kCombineWaves * arch::kWaveSize);
  if (p.dtype == 0) {  // FMHA_DTYPE_FP16
    kvcache_combine_kernel<false><<<grid, block, 0, stream>>>(p);
  } else {
    kvcache_combine_kernel<true><<<grid, block, 0, stream>>>(p);
  }
  return static_cast<int32_t>(hipGetLastError());
}

}  // namespace fmha

// The forward, then (splitting launchers) the combine of its partial states.
extern "C" int32_t fmha_hip_kvcache_fwd(const fmha_kvcache_params* params, void* stream) {
  if (params == nullptr || params->max_seqlen_q <= 0 || params->batch <= 0) return 0;  // nothing to compute
  const hipStream_t s = static_cast<hipStream_t>(stream);
  const int32_t forward = fmha::kvcache_forward(*params, s);
  return forward != 0 ? forward : fmha::launch_combine(*params, s);
}

extern "C" int32_t fmha_hip_load_kvcache(void) { return fmha::arch::load_module(fmha::kvcache_prepare_kernel); }
