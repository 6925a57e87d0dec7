// fp8 descales uniform over a call's (sequence, kv head): per tensor, or per (sequence, kv head)
// through the strides (src/problem/scale.rs), and per-page descales' per-tile values. Shared by the
// dense forward's and the kv cache's tiles.
#pragma once

#include "arch/platform.h"
#include "launch.h"

namespace fmha {

// The fp8 descales of one K/V tile (per-page descales: the tile's page's).
struct TileScales {
  float k, v;
};

// The descale of sequence b, kv head hk; 1 where none is given.
__device__ inline float uniform_descale(const fmha_descale_params& d, int b, int hk) {
  const float* data = reinterpret_cast<const float*>(d.data);
  return data != nullptr ? data[b * d.batch_stride + hk * d.head_stride] : 1.f;
}

// The descales of a call of element type T uniform over sequence b and kv head hk: `k` q's times k's,
// `v` v's; 1 for 16-bit inputs (which carry none).
template <typename T, typename Params>
__device__ inline TileScales uniform_descales(const Params& p, int b, int hk) {
  if constexpr (sizeof(T) == 1) {
    return TileScales{uniform_descale(p.q_descale, b, hk) * uniform_descale(p.k_descale, b, hk),
                      uniform_descale(p.v_descale, b, hk)};
  } else {
    return TileScales{1.f, 1.f};
  }
}

}  // namespace fmha
