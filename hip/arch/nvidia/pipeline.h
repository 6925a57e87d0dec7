// Hopper (sm_90a) primitives of warp-specialized kernels: shared-memory transaction barriers (mbarrier)
// that hand pipeline stages between a producer and its consumers, named barriers that order warpgroups
// without stopping the rest of the CTA, and the register reallocation between warpgroups (setmaxnreg).
#pragma once

#include "arch/platform.h"

namespace fmha {
namespace arch {

// This thread's warpgroup, as a value ptxas knows to be warp-uniform (read from lane 0): a branch on
// `threadIdx.x / 128` would count as divergent, and wgmmas under a divergent branch are serialized
// (ptxas advisory C7520).
__device__ inline int warpgroup_index() { return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0); }

// An mbarrier at shared address `bar` (8 bytes, 8-aligned) completing a phase after `count` arrivals.
// One thread initialises; the fence and a CTA barrier publish it before any use.
__device__ inline void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ inline void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival (release: this thread's earlier writes are visible to whoever sees the phase complete).
__device__ inline void mbarrier_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` has completed (acquire). A barrier starts in phase 0, so a
// wait for parity 1 passes at once: the producer's first lap over empty stages.
__device__ inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// Named barriers 1..15 (0 is __syncthreads): `threads` (a multiple of 32) complete one, counting the
// threads that sync (and wait) and the ones that only arrive.
__device__ inline void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Keeps the work that computed `value` ahead of what follows: ptxas moves a wgmma wait (and the
// arithmetic around it) freely over register-only work, but never a shared store below a barrier nor a
// wait above one. The threads only arrive (nothing waits on the barrier, so no warp waits for the
// others): the caller lets no warp arrive twice before every other warp has arrived once. `scratch`: 4
// bytes of shared memory of this thread's own; the barrier `id` takes `threads` threads (the warpgroup).
__device__ inline void complete_before(float value, uint32_t scratch, uint32_t id, uint32_t threads) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(scratch), "f"(value) : "memory");
  named_barrier_arrive(id, threads);
}

// Gives registers back to the CTA's pool (every warp of the warpgroup, same count), or takes them
// (waits until the pool has them); ptxas allocates the code after it within the new count.
template <int kRegisters>
__device__ inline void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ inline void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace arch
}  // namespace fmha
