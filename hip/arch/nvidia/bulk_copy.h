// Hopper (sm_90a) bulk groups: the thread that issued bulk copies or reductions from shared to global
// memory (arch/nvidia/tensor_map.h's tma_store_or_add) tracks its own in groups: it commits them, and waits
// for their reads of shared memory (before the source is written again) or for their writes.
#pragma once

#include "arch/platform.h"

namespace fmha {
namespace arch {

__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed bulk operations have completed their writes.
__device__ inline void bulk_wait_written() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Waits until they have read their shared sources (which may then be written again).
__device__ inline void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// bulk_wait_written where `written`, else waits until they have read their shared sources: one predicated
// instruction each, no branch.
__device__ inline void bulk_wait(bool written) {
  asm volatile(
      "{\n.reg .pred w;\nsetp.ne.b32 w, %0, 0;\n@w cp.async.bulk.wait_group 0;\n@!w cp.async.bulk.wait_group.read "
      "0;\n}\n" ::"r"(static_cast<uint32_t>(written))
      : "memory");
}

}  // namespace arch
}  // namespace fmha
