// Hopper (sm_90a) bulk reductions from shared to global memory without a tensor map: one thread adds a
// contiguous run of fp32 (a multiple of 16 bytes, both ends 16-byte aligned) in L2 with one instruction,
// while the warp goes on. The thread that issued them tracks its own in bulk groups: it commits them, and
// waits for their reads of shared memory (before the source is written again) or for their writes.
#pragma once

#include "arch/platform.h"

namespace fmha {
namespace arch {

// global[0 .. bytes) += shared[0 .. bytes), element-wise fp32 adds in L2.
__device__ inline void bulk_reduce_add_f32(float* global, uint32_t shared, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global),
               "r"(shared), "r"(bytes)
               : "memory");
}

__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed bulk reductions have read their shared sources.
__device__ inline void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Waits until this thread's committed bulk reductions have completed their writes.
__device__ inline void bulk_wait_written() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace arch
}  // namespace fmha
