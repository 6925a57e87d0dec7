// The forward's tile on Hopper (sm_90a): the CTA's shape (warpgroups of 64 query rows, keys per K/V tile)
// and its shared-memory layout (Q, then two stages of K and of V, in the wgmma 128-byte swizzle; for
// 8-bit inputs V's stages are staging tiles and one transposed Vᵀ tile follows, fwd/sm90/transpose_v.h).
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"

namespace fmha {

// What the input type T decides in both forward kernels' tiles (ForwardTile, SpecializedTile): 8-bit
// inputs have V transposed on its way to the tensor cores (8-bit wgmmas read both operands K-major), P
// scaled by 2^kPShift before it is rounded (FA3's shift: the largest P, 1, becomes 256, inside e4m3's
// normal range), and O in bf16.
template <typename T>
struct InputPrecision {
  static constexpr bool kTransposeV = sizeof(T) == 1;
  static constexpr float kPShift = kTransposeV ? 8.f : 0.f;
  using Output = std::conditional_t<kTransposeV, __nv_bfloat16, T>;
};

// kPageScales_: fp8 K/V descales per page (pages of whole tiles), one K and one V descale per tile.
// kPackGqa_: the kv-cache's decode tile, whose rows are (query row, query head of the CTA's kv head)
// pairs (spec/inference.md §3.2), so that a K/V tile is read once for all the heads that share it.
template <typename T, int kHeadDim, int kWarpgroups_, int kBlockN_, bool kMasked_, bool kPageScales_ = false,
          bool kPackGqa_ = false>
struct ForwardTile {
  static constexpr int kWarpgroups = kWarpgroups_;
  static constexpr int kWarps = 4 * kWarpgroups;
  static constexpr int kBlockM = 64 * kWarpgroups;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kMasked = kMasked_;
  static constexpr bool kPageScales = kPageScales_;
  static constexpr bool kPackGqa = kPackGqa_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kDim = kHeadDim;
  static constexpr int kElementBytes = static_cast<int>(sizeof(T));
  static constexpr int kChunks = kHeadDim * kElementBytes / 16;  // 16-byte chunks per row
  static constexpr bool kTransposeV = InputPrecision<T>::kTransposeV;
  static constexpr float kPShift = InputPrecision<T>::kPShift;
  using Output = typename InputPrecision<T>::Output;
  // The wgmma N shapes compiled in arch/nvidia/warpgroup.h (S is 64 x kBlockN, O 64 x D); D = 256 for
  // 16-bit inputs only.
  static_assert(kHeadDim == 64 || kHeadDim == 128 || (kHeadDim == 256 && !kTransposeV), "head dims 64, 128, 256");
  static_assert(kBlockN == 64 || kBlockN == 128, "64 or 128 keys per tile");
  static_assert(kChunks % 8 == 0, "rows of whole 128-byte swizzle blocks");
  using QLayout = Swizzle128<kChunks, kBlockM>;
  using KLayout = Swizzle128<kChunks, kBlockN>;
  // Where V tiles are copied to (for 8-bit inputs, the staging tile), and the tile the P·V product reads
  // for 8-bit inputs (Vᵀ).
  using VLayout = Swizzle128<kChunks, kBlockN>;
  using VtLayout = Swizzle128<kBlockN * kElementBytes / 16, kHeadDim>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * kElementBytes;
  static constexpr uint32_t kKVBytes = kBlockN * kHeadDim * kElementBytes;
  // Q, two stages of K and of V (and Vᵀ), from a 1024-byte boundary.
  static constexpr int kSharedBytes = kQBytes + (kTransposeV ? 5 : 4) * kKVBytes + kSwizzle128Slack;
};

}  // namespace fmha
