// The backward's (dq_dk_dv) tile on Hopper (sm_90a): the workgroup's shape (two warpgroups of 64 keys,
// q steps of kBlockM rows) and its shared-memory layout (K, V, dSᵀ, two stages of Q, dO, LSE and D).
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"

namespace fmha {

template <int kHeadDim, int kWarps_, int kBlockM_, bool kMasked_, bool kDeterministic_>
struct BackwardTile {
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kBlockN = 16 * kWarps;  // one warpgroup per 64 keys
  static constexpr int kBlockM = kBlockM_;
  static constexpr bool kMasked = kMasked_;
  static constexpr bool kDeterministic = kDeterministic_;
  static constexpr int kDim = kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of a Q/K/V/dO row
  static constexpr int kMChunks = kBlockM / 8;  // of a dSᵀ row
  // The wgmma shapes compiled in arch/nvidia/warpgroup.h: Sᵀ and dPᵀ are 64 keys × kBlockM, dK and dV
  // 64 keys × kDim, each warpgroup's half of dQ kBlockM × kDim / 2.
  static_assert(kWarps == 8 && kBlockM == 64 && (kHeadDim == 64 || kHeadDim == 128), "wgmma tile shapes");
  static_assert(kMChunks == 8, "dSᵀ rows are one 128-byte swizzle block");
  // dQ = dS·K: warpgroup w computes columns [w · kDqCols, (w + 1) · kDqCols) of the kBlockM rows.
  static constexpr int kDqCols = kDim / 2;
  using KVLayout = Swizzle128<kChunks, kBlockN>;
  using QLayout = Swizzle128<kChunks, kBlockM>;
  using DsLayout = Swizzle128<kMChunks, kBlockN>;  // dSᵀ: kBlockN key rows of kBlockM q columns
  // Shared memory (bytes), from a 1024-byte boundary: K, V, dSᵀ, two stages of Q and dO, two stages
  // of LSE and D.
  static constexpr int kKVBytes = kBlockN * kDim * 2;
  static constexpr int kQBytes = kBlockM * kDim * 2;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kRowStatBytes = kBlockM * 4;
  static constexpr int kSharedBytes = 2 * kKVBytes + 4 * kQBytes + kDsBytes + 4 * kRowStatBytes + kSwizzle128Slack;
};

// Shared-memory addresses (32-bit shared window) of one workgroup's buffers. Stages are selected by
// arithmetic, not by indexing an array: a runtime index into an array would put it in local memory.
template <typename Tile>
struct BackwardShared {
  uint32_t k, v, ds, q0, d_o0, lse0, d0;
  const unsigned char* base;  // generic pointer to the same bytes, for the fp32 row statistics
  uint32_t base_address;

  __device__ explicit BackwardShared(unsigned char* bytes) : base(bytes), base_address(arch::shared_address(bytes)) {
    k = swizzle128_base(bytes);
    v = k + Tile::kKVBytes;
    ds = v + Tile::kKVBytes;
    q0 = ds + Tile::kDsBytes;             // then the second stage of Q
    d_o0 = q0 + 2 * Tile::kQBytes;        // two stages of dO
    lse0 = d_o0 + 2 * Tile::kQBytes;      // two stages of LSE
    d0 = lse0 + 2 * Tile::kRowStatBytes;  // two stages of D
  }
  __device__ uint32_t q(int stage) const { return q0 + stage * Tile::kQBytes; }
  __device__ uint32_t d_o(int stage) const { return d_o0 + stage * Tile::kQBytes; }
  __device__ uint32_t lse(int stage) const { return lse0 + stage * Tile::kRowStatBytes; }
  __device__ uint32_t d(int stage) const { return d0 + stage * Tile::kRowStatBytes; }
  __device__ const float* row_stats(uint32_t address) const {
    return reinterpret_cast<const float*>(base + (address - base_address));
  }
};

}  // namespace fmha
