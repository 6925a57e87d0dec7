// Counters in global memory that order work across workgroups (the backward's ordered dQ adds): one
// thread waits, with acquire semantics, until a counter holds a value, and counts with release semantics
// once its writes are done.
#pragma once

#include <stdint.h>

#include "arch/platform.h"

namespace fmha {
namespace arch {

__device__ inline void semaphore_wait_equal(const int32_t* counter, int32_t value) {
  int32_t seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != value);
}

__device__ inline void semaphore_release_add(int32_t* counter, int32_t x) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(counter), "r"(x) : "memory");
}

}  // namespace arch
}  // namespace fmha
