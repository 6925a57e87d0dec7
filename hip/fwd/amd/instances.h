// The AMD forward kernel's instances and their launch, for either parameter block (the dense forward's
// fmha_fwd_params, the kv-cache's fmha_kvcache_params): the element type, the head-dim bucket (which
// fixes the tile shapes) and masked or not are compiled per instance.
#pragma once

#include <type_traits>

#include "fwd/amd/kernel.h"
#include "fwd/amd/tile.h"

namespace fmha {

// 4 waves of 32 query rows; the keys per step are chosen per architecture on the device side
// (AmdForwardTile::kBlockN), and the LDS is static and within 64 KiB on both architectures, so the
// host needs only the workgroup shape.
// x: q tiles (kv cache: times the launcher's splits, each q tile's splits adjacent), y: query heads
// (packed GQA: kv heads, each tile row one of their query heads), z: batches (fwd/amd/kernel.h).
template <typename T, int kHeadDim, bool kMasked, bool kPackGqa = false, bool kPageScales = false, typename Params>
int32_t launch_forward(const Params& p, hipStream_t stream) {
  using Tile = AmdForwardTile<T, kHeadDim>;
  const int splits = kvcache::grid_splits(p);
  const int64_t rows = static_cast<int64_t>(p.max_seqlen_q) * (kPackGqa ? p.nhead_q / p.nhead_k : 1);
  const dim3 grid(static_cast<uint32_t>((rows + Tile::kBlockM - 1) / Tile::kBlockM * splits),
                  kPackGqa ? p.nhead_k : p.nhead_q, p.batch);
  forward_kernel_amd<T, kHeadDim, kMasked, Params, kPackGqa, kPageScales><<<grid, Tile::kThreads, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}

// Masked or not; for the kv cache, packed GQA or not, and (fp8) per-page K/V descales or not.
template <typename T, int kHeadDim, bool kPageScales = false, typename Params>
int32_t launch_variant(const Params& p, hipStream_t stream) {
  if constexpr (std::is_same_v<Params, fmha_kvcache_params>) {
    if constexpr (arch::Element<T>::kBytes == 1 && !kPageScales) {
      if (p.k_descale.page_stride != 0 || p.v_descale.page_stride != 0) return launch_variant<T, kHeadDim, true>(p, stream);
    }
    if (p.pack_gqa != 0) {
      return p.masked ? launch_forward<T, kHeadDim, true, true, kPageScales>(p, stream)
                      : launch_forward<T, kHeadDim, false, true, kPageScales>(p, stream);
    }
  }
  return p.masked ? launch_forward<T, kHeadDim, true, false, kPageScales>(p, stream)
                  : launch_forward<T, kHeadDim, false, false, kPageScales>(p, stream);
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
        return launch_variant<T, 64>(p, stream);
      } else {
        return 1;  // hipErrorInvalidValue
      }
    case 128:
      return launch_variant<T, 128>(p, stream);
    default:
      return 1;  // hipErrorInvalidValue
  }
}

}  // namespace fmha
