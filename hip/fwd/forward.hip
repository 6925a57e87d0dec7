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
#include "fwd/amd/dense_tiles.h"
#include "fwd/amd/instances.h"
#include "fwd/amd/kernel.h"

extern "C" int32_t fmha_hip_fwd(const fmha_fwd_params* params, void* stream) {
  if (params == nullptr || params->max_seqlen_q <= 0 || params->batch <= 0) return 0;  // nothing to compute
  const hipStream_t s = static_cast<hipStream_t>(stream);
  return params->dtype == 0 ? fmha::dispatch_forward<fmha::arch::Half>(*params, s)
                            : fmha::dispatch_forward<fmha::arch::BFloat16>(*params, s);
}

extern "C" int32_t fmha_hip_load_forward(void) {
  return fmha::arch::load_module(fmha::forward_kernel_amd<fmha::arch::Half, 64, false, fmha_fwd_params>);
}

#endif
