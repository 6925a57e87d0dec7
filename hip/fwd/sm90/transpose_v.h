// The 8-bit forward's V on its way to the tensor cores. An 8-bit wgmma reads both operands K-major, so
// the P·V product needs Vᵀ (keys along a row) where the copies bring V (dims along a row): V tiles are
// copied (cp.async or TMA) into a staging tile and transposed into a Vᵀ tile, by the whole CTA while the
// tensor cores compute S = Q·Kᵀ (the cp.async kernel) or by the producer warpgroup (the warp-specialized
// one). The keys of each 32-key step are permuted as P's A fragments hold them (arch/nvidia/tensor_core.h,
// a_fragment): position 4t + 2a + b of a 16-key chunk holds key 8a + 2t + b.
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/thread.h"

namespace fmha {

template <int kThreads, int kKeys>
__device__ inline void transpose_values(uint32_t staging, uint32_t vt) {
  static_assert((kThreads == 256 || kThreads == 128) && kKeys == 128, "128 keys x 128 dims, 4 or 8 warps");
  const int tid = arch::thread_index(), l = tid % 32;
  const int c = l % 8, quad = l / 8;
#pragma unroll
  for (int w = tid / 32; w < 8; w += kThreads / 32) {
    const int dims = w ^ c;  // this lane's group of 16 dims
    uint32_t in[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int key = 16 * c + j;
      in[j] = arch::shared_load_4(staging + key * 128 + ((dims ^ (j & 7)) * 16) + 4 * quad);
    }
    uint32_t out[4][4];  // [dim x][word t]: keys 2t, 2t + 1, 8 + 2t, 9 + 2t of dim 16 dims + 4 quad + x
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint32_t ab_lo = __byte_perm(in[2 * t], in[2 * t + 1], 0x5140);  // a0 b0 a1 b1
      const uint32_t ab_hi = __byte_perm(in[2 * t], in[2 * t + 1], 0x7362);  // a2 b2 a3 b3
      const uint32_t cd_lo = __byte_perm(in[8 + 2 * t], in[9 + 2 * t], 0x5140);
      const uint32_t cd_hi = __byte_perm(in[8 + 2 * t], in[9 + 2 * t], 0x7362);
      out[0][t] = __byte_perm(ab_lo, cd_lo, 0x5410);
      out[1][t] = __byte_perm(ab_lo, cd_lo, 0x7632);
      out[2][t] = __byte_perm(ab_hi, cd_hi, 0x5410);
      out[3][t] = __byte_perm(ab_hi, cd_hi, 0x7632);
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = 16 * dims + 4 * quad + x;
      arch::shared_store_16(vt + row * 128 + ((c ^ (row & 7)) * 16), out[x][0], out[x][1], out[x][2], out[x][3]);
    }
  }
}

}  // namespace fmha
