// The forward's tile on AMD (gfx942 / gfx950): the workgroup's shape (four waves of 32 query rows, keys
// per step for the architecture's LDS) and its LDS layout (two stages of K, then two of Vᵀ).
#pragma once

#include "arch/amd/matrix_core.h"
#include "arch/thread.h"

namespace fmha {

template <int kHeadDim>
struct AmdForwardTile {
  static constexpr int kWaves = 4;
  static constexpr int kBlockM = kWaves * 32;  // one 32-row MFMA block per wave
  static constexpr int kThreads = kWaves * arch::kWaveSize;
  static constexpr int kDim = kHeadDim;
  // Keys per step: the two stages of K and Vᵀ take at most half the LDS, so that two workgroups share
  // a CU (gfx942: 64 keys at d64, 32 at d128; gfx950: 64 at both).
  static constexpr int kBlockN = 4 * 64 * kHeadDim * 2 <= arch::kLdsBytes / 2 ? 64 : 32;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;  // one K or Vᵀ tile
  static constexpr int kLdsBytes = 4 * kKVBytes;           // K stages 0 and 1, then Vᵀ stages 0 and 1
  static constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks of a K or V row in memory
  static constexpr int kKUnits = kHeadDim / 4;             // 8-byte units of a K row in LDS
  static constexpr int kVUnits = kBlockN / 4;              // 8-byte units of a Vᵀ row in LDS
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 128, "the copy mappings are for 64 and 128 dims");
};

}  // namespace fmha
