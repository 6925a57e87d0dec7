// The forward's tile on AMD (gfx942 / gfx950): the workgroup's shape (four waves of 32 query rows, keys
// per step for the architecture's LDS) and its LDS layout (two stages of K, then two of Vᵀ), for
// 16-bit or 8-bit elements (the layout is one of rows of bytes; arch/amd/matrix_core.h).
#pragma once

#include "arch/amd/matrix_core.h"
#include "arch/thread.h"

namespace fmha {

template <typename T, int kHeadDim>
struct AmdForwardTile {
  static constexpr int kBytes = arch::Element<T>::kBytes;  // per element
  static constexpr int kWaves = 4;
  static constexpr int kBlockM = kWaves * 32;  // one 32-row MFMA block per wave
  static constexpr int kThreads = kWaves * arch::kWaveSize;
  static constexpr int kDim = kHeadDim;
  static constexpr int kRowBytes = kHeadDim * kBytes;  // one K row (and Q row) in LDS and registers
  // Keys per step: the two stages of K and Vᵀ take at most half the LDS, so that two workgroups share
  // a CU (gfx942: 64 keys at 128-byte rows, 32 at 256; gfx950: 64 at both).
  static constexpr int kBlockN = 4 * 64 * kRowBytes <= arch::kLdsBytes / 2 ? 64 : 32;
  static constexpr int kKVBytes = kBlockN * kRowBytes;  // one K or Vᵀ tile
  static constexpr int kLdsBytes = 4 * kKVBytes;        // K stages 0 and 1, then Vᵀ stages 0 and 1
  static constexpr int kChunks = kRowBytes / 16;        // 16-byte chunks of a K or V row in memory
  static constexpr int kKUnits = kRowBytes / 8;         // 8-byte units of a K row in LDS
  static constexpr int kVUnits = kBlockN * kBytes / 8;  // 8-byte units of a Vᵀ row in LDS
  static_assert(kRowBytes % 128 == 0 && kRowBytes <= 256, "the copy mappings are for rows of 128 and 256 bytes");

  // Byte offset in a Vᵀ row (before the swizzle) of keys 4 q .. 4 q + 3. The B fragment of Pᵀ that lane
  // half h gives an MFMA is 8 bytes of accumulator registers, which hold keys 8 (r / 4) + 4 h + r % 4
  // (r = register): 16-bit, registers 4g .. 4g + 3 (keys 8g + 4h + 0..3, group q = 2g + h); 8-bit,
  // registers 8g' .. 8g' + 7 (groups 4g' + h and 4g' + 2 + h). The A fragment of Vᵀ must hold the same
  // keys in the same order in 8 consecutive bytes: 16-bit, group q in unit q; 8-bit, groups 4g' + h and
  // 4g' + 2 + h in unit 2g' + h, i.e. group q in 4-byte word q with its bits 0 and 1 swapped.
  __device__ static uint32_t v_group_byte(int q) {
    if constexpr (kBytes == 1) {
      return static_cast<uint32_t>(4 * ((q & ~3) | ((q & 1) << 1) | ((q >> 1) & 1)));
    } else {
      return static_cast<uint32_t>(8 * q);
    }
  }
};

}  // namespace fmha
