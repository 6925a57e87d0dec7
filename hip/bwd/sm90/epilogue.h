// The backward's (dq_dk_dv) epilogue on Hopper (sm_90a): a unit's dK (scaled) and dV leave the consumer
// warps' registers once, after its last q tile.
#pragma once

#include "arch/nvidia/tensor_core.h"
#include "bwd/sm90/mainloop.h"
#include "common/sequence.h"
#include "launch.h"

namespace fmha {

// dK = scale · Σ dSᵀ·Q and dV of the warp's 16 keys from j0 + warp_key, its warpgroup's part of the
// columns (zero when no query row reached the tile; keys past the batch's are not stored).
template <typename Tile, typename T>
__device__ inline void store_dk_dv(const fmha_bwd_params& p, const UnitState<Tile>& st, int64_t batch, int hk,
                                   const BatchRows& rows, int64_t j0, int warp, int g, int t) {
  using E = arch::Element<T>;
  constexpr int kDkTiles = UnitState<Tile>::kDkTiles, kDvTiles = UnitState<Tile>::kDvTiles;
  constexpr int kTiles = kDkTiles > kDvTiles ? kDkTiles : kDvTiles;
  const int warpgroup = warp / 4;
  T* dk = reinterpret_cast<T*>(p.dk) + batch * p.dk_batch_stride + hk * p.dk_head_stride;
  T* dv = reinterpret_cast<T*>(p.dv) + batch * p.dv_batch_stride + hk * p.dv_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = j0 + Tile::warp_key(warp) + g + 8 * r;
    if (key >= rows.sk) continue;
    T* dk_row = dk + (rows.k_start + key) * p.dk_row_stride;
    T* dv_row = dv + (rows.k_start + key) * p.dv_row_stride;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      if (n < kDkTiles) {
        const int col = Tile::dk_column(warpgroup, n) + 2 * t;
        if (col < p.hdim_q) {
          *reinterpret_cast<uint32_t*>(dk_row + col) = E::pack(st.dk[n][2 * r] * p.scale, st.dk[n][2 * r + 1] * p.scale);
        }
      }
      if (n < kDvTiles) {
        const int col = Tile::dv_column(warpgroup, n) + 2 * t;
        if (col < p.hdim_v) {
          *reinterpret_cast<uint32_t*>(dv_row + col) = E::pack(st.dv[n][2 * r], st.dv[n][2 * r + 1]);
        }
      }
    }
  }
}

}  // namespace fmha
