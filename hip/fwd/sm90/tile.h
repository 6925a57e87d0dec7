// The forward's tile on Hopper (sm_90a): the CTA's shape (warpgroups of 64 query rows, keys per K/V tile)
// and its shared-memory layout (Q, then two stages of K and of V, in the wgmma 128-byte swizzle).
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"

namespace fmha {

template <typename T, int kHeadDim, int kWarpgroups_, int kBlockN_, bool kMasked_>
struct ForwardTile {
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kWarps = 4 * kWarpgroups;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kMasked = kMasked_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kDim = kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // The wgmma N shapes compiled in arch/nvidia/warpgroup.h: 64 and 128 (S is 64 x kBlockN, O 64 x D).
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128");
  static_assert(kBlockN == 64 || kBlockN == 128, "64 or 128 keys per tile");
  using QLayout = Swizzle128<kChunks, kBlockM>;
  using KVLayout = Swizzle128<kChunks, kBlockN>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * 2;
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * 2;
  // Q, two stages of K and of V, from a 1024-byte boundary.
  static constexpr int kSharedBytes = kQBytes + 4 * kKVBytes + kSwizzle128Slack;
};

}  // namespace fmha
