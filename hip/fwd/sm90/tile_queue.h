// The tiles a CTA of the warp-specialized forward computes, in order, handed from its producer to its
// consumers through shared memory.
//
// CTA c starts with tile c. Its next tile is the current one plus the grid (a static walk: one CTA per
// tile, or a persistent grid over tiles of equal cost), or, given a tile counter in global memory, the
// counter's next value plus the grid: a persistent grid over tiles of unequal cost (masked ones), where
// whichever CTA finishes first takes the next tile, as FlashAttention-3's dynamic scheduler does. The
// launch zeroes the counter on the stream before the kernel.
//
// With a counter, the producer's first thread takes the next tile once the current one's loads are
// issued and publishes it in one of two slots (a full and an empty mbarrier each); the consumers read it
// when they finish the current tile. A static walk needs no hand-over: every role computes its k-th tile,
// c + k · grid. A tile ≥ the grid's tile count ends every role.
#pragma once

#include <cstdint>

#include "arch/nvidia/pipeline.h"

namespace fmha {

class TileQueue {
 public:
  // Two 8-byte slots, then two full and two empty mbarriers.
  static constexpr int kBytes = 2 * 8 + 4 * 8;
  // The named barrier that publishes a slot to the producer's other threads (after the consumers' ones,
  // fwd/sm90/specialized_kernel.h).
  static constexpr uint32_t kProducerSync = 7;

  // `base`: kBytes of 8-aligned shared memory; `counter`: the tile counter, or null for a static walk;
  // this CTA and the grid's CTAs.
  __device__ TileQueue(uint32_t base, int32_t* counter, int64_t cta, int64_t ctas)
      : base_(base), counter_(counter), cta_(cta), ctas_(ctas) {}

  // One thread, before the fence and CTA barrier that publish the CTA's mbarriers.
  __device__ void init(uint32_t consumer_warps) const {
    for (int s = 0; s < 2; ++s) {
      arch::mbarrier_init(full(s), 1);
      arch::mbarrier_init(empty(s), consumer_warps);
    }
  }

  // The CTA's first tile, and the one after `tile` (the producer's first thread).
  __device__ int64_t first() const { return cta_; }
  __device__ int64_t next(int64_t tile) const {
    return counter_ != nullptr ? atomicAdd(counter_, 1) + ctas_ : tile + ctas_;
  }

  // The producer's threads (kProducerThreads, a multiple of 32): the first one publishes its `tile` as
  // the CTA's lap-th tile (once the consumers have read what the slot held two laps before); every one
  // returns it.
  template <int kProducerThreads>
  __device__ int64_t publish(int lap, int thread, int64_t tile) const {
    if (counter_ == nullptr) return cta_ + lap * ctas_;
    const int s = lap & 1;
    if (thread == 0) {
      arch::mbarrier_wait(empty(s), ((lap >> 1) & 1) ^ 1);  // the first lap of each slot passes
      asm volatile("st.shared.b64 [%0], %1;\n" ::"r"(slot(s)), "l"(tile) : "memory");
      arch::mbarrier_arrive(full(s));
    }
    // (the slot is rewritten two laps later, after every producer thread has passed the next lap's sync)
    arch::named_barrier_sync(kProducerSync, kProducerThreads);
    return read(s);
  }

  // Every consumer thread (`lane` of its warp): the CTA's lap-th tile. Lane 0 of each warp releases the
  // slot once the warp has read it (__syncwarp orders the lanes' reads before its arrival, whose release
  // orders them before the producer's rewrite): an arrival per warp rather than per thread.
  __device__ int64_t take(int lap, int lane) const {
    if (counter_ == nullptr) return cta_ + lap * ctas_;
    const int s = lap & 1;
    arch::mbarrier_wait(full(s), (lap >> 1) & 1);
    const int64_t tile = read(s);
    __syncwarp();
    if (lane == 0) arch::mbarrier_arrive(empty(s));
    return tile;
  }

 private:
  __device__ uint32_t slot(int s) const { return base_ + 8 * s; }
  __device__ uint32_t full(int s) const { return base_ + 16 + 8 * s; }
  __device__ uint32_t empty(int s) const { return base_ + 32 + 8 * s; }
  __device__ int64_t read(int s) const {
    int64_t tile;
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(tile) : "r"(slot(s)) : "memory");
    return tile;
  }

  uint32_t base_;
  int32_t* counter_;
  int64_t cta_, ctas_;
};

}  // namespace fmha
