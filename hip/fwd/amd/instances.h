// The AMD forward kernel's instances and their launch, for either parameter block (the dense forward's
// fmha_fwd_params, the kv-cache's fmha_kvcache_params): the element type, the head-dim bucket (which
// fixes the tile shapes) and masked or not are compiled per instance.
#pragma once

#include "fwd/amd/kernel.h"
#include "fwd/amd/tile.h"

namespace fmha {

// 4 waves of 32 query rows; the keys per step are chosen per architecture on the device side
// (AmdForwardTile::kBlockN), and the LDS is static and within 64 KiB on both architectures, so the
// host needs only the workgroup shape.
template <typename T, int kHeadDim, bool kMasked, typename Params>
int32_t launch_forward(const Params& p, hipStream_t stream) {
  using Tile = AmdForwardTile<T, kHeadDim>;
  // Split-KV (kv-cache): each q tile's splits are adjacent in x (fwd/amd/kernel.h).
  uint32_t splits = 1;
  if constexpr (std::is_same_v<Params, fmha_kvcache_params>) splits = p.max_splits > 1 ? p.max_splits : 1;
  const dim3 grid((p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM * splits, p.nhead_q, p.batch);
  forward_kernel_amd<T, kHeadDim, kMasked, Params><<<grid, Tile::kThreads, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}

template <typename T, typename Params>
int32_t dispatch_forward(const Params& p, hipStream_t stream) {
  // The kernels address the rows of a Q, K or V tile with 32-bit byte offsets from its first row:
  // 128 rows must span less than 4 GiB. hipErrorInvalidValue beyond (row strides of 2^24 elements); the
  // host refuses those first (registry.rs AMD_MAX_INPUT_ROW_STRIDE).
  constexpr int64_t kMaxRowStride = int64_t(1) << 24;
  if (p.q_row_stride >= kMaxRowStride || p.k_row_stride >= kMaxRowStride || p.v_row_stride >= kMaxRowStride) {
    return 1;
  }
  switch (p.hdim_bucket) {
    case 64:
      // fp8 has the 128-dim shape only (rows of 128 bytes; fwd/amd/tile.h); the registry lists no other.
      if constexpr (arch::Element<T>::kBytes == 2) {
        return p.masked ? launch_forward<T, 64, true>(p, stream) : launch_forward<T, 64, false>(p, stream);
      } else {
        return 1;  // hipErrorInvalidValue
      }
    case 128:
      return p.masked ? launch_forward<T, 128, true>(p, stream) : launch_forward<T, 128, false>(p, stream);
    default:
      return 1;  // hipErrorInvalidValue
  }
}

}  // namespace fmha
