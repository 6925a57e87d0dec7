// Forward kernel instances and their launch stub. Only what changes the inner loop is compiled per
// instance: the element type, the head-dim bucket (which fixes the tile shapes) and masked or not.
#include "arch/platform.h"
#include "launch.h"

#if defined(FMHA_PLATFORM_NVIDIA)
#include "fwd/sm90/dense_tiles.h"
#include "fwd/sm90/kernel.h"
#include "fwd/sm90/instances.h"
#include "fwd/sm90/tile.h"

extern "C" int32_t fmha_hip_fwd(const fmha_fwd_params* params, void* stream) {
  if (params == nullptr || params->max_seqlen_q <= 0 || params->batch <= 0) return 0;  // nothing to compute
  const hipStream_t s = static_cast<hipStream_t>(stream);
  return params->dtype == 0 ? fmha::dispatch_forward<__half>(*params, s)
                            : fmha::dispatch_forward<__nv_bfloat16>(*params, s);
}

extern "C" int32_t fmha_hip_load_forward(void) {
  using Tile = fmha::ForwardTile<__half, 64, 1, 128, false>;
  return fmha::arch::load_module(fmha::forward_kernel<Tile, __half, fmha_fwd_params>);
}

#else
#include "fwd/amd/kernel.h"
#include "fwd/amd/tile.h"

namespace fmha {

// 4 waves of 32 query rows; the keys per step are chosen per architecture on the device side
// (AmdForwardTile::kBlockN), and the LDS is static and within 64 KiB on both architectures, so the
// host needs only the workgroup shape.
template <typename T, int kHeadDim, bool kMasked>
int32_t launch_forward(const fmha_fwd_params& p, hipStream_t stream) {
  using Tile = AmdForwardTile<kHeadDim>;
  const dim3 grid((p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, p.nhead_q, p.batch);
  forward_kernel_amd<T, kHeadDim, kMasked><<<grid, Tile::kThreads, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}

template <typename T>
int32_t dispatch_forward(const fmha_fwd_params& p, hipStream_t stream) {
  switch (p.hdim_bucket) {
    case 64:
      return p.masked ? launch_forward<T, 64, true>(p, stream) : launch_forward<T, 64, false>(p, stream);
    case 128:
      return p.masked ? launch_forward<T, 128, true>(p, stream) : launch_forward<T, 128, false>(p, stream);
    default:
      return 1;  // hipErrorInvalidValue
  }
}

}  // namespace fmha

extern "C" int32_t fmha_hip_fwd(const fmha_fwd_params* params, void* stream) {
  if (params == nullptr || params->max_seqlen_q <= 0 || params->batch <= 0) return 0;  // nothing to compute
  // The kernels address the rows of a Q, K or V tile with 32-bit byte offsets from its first row:
  // 128 rows must span less than 4 GiB. hipErrorInvalidValue beyond (row strides of 2^24 elements); the
  // host refuses those first (registry.rs AMD_MAX_INPUT_ROW_STRIDE).
  constexpr int64_t kMaxRowStride = int64_t(1) << 24;
  if (params->q_row_stride >= kMaxRowStride || params->k_row_stride >= kMaxRowStride ||
      params->v_row_stride >= kMaxRowStride) {
    return 1;
  }
  const hipStream_t s = static_cast<hipStream_t>(stream);
  return params->dtype == 0 ? fmha::dispatch_forward<fmha::arch::Half>(*params, s)
                            : fmha::dispatch_forward<fmha::arch::BFloat16>(*params, s);
}

extern "C" int32_t fmha_hip_load_forward(void) {
  return fmha::arch::load_module(fmha::forward_kernel_amd<fmha::arch::Half, 64, false>);
}

#endif
