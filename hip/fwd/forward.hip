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
  switch (params->dtype) {
    case 0:  // FMHA_DTYPE_FP16
      return fmha::dispatch_forward<__half>(*params, s);
    case 1:  // FMHA_DTYPE_BF16
      return fmha::dispatch_forward<__nv_bfloat16>(*params, s);
    case 3:  // FMHA_DTYPE_FP8_E4M3FN (o bf16; the D = 128 instance only)
      return fmha::dispatch_forward<__nv_fp8_e4m3>(*params, s);
    default:  // no instance (the registry refuses the call first)
      return static_cast<int32_t>(cudaErrorInvalidValue);
  }
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
  switch (params->dtype) {
    case 0:  // fp16
      return fmha::dispatch_forward<fmha::arch::Half>(*params, s);
    case 1:  // bf16
      return fmha::dispatch_forward<fmha::arch::BFloat16>(*params, s);
    case 3:  // FMHA_DTYPE_FP8_E4M3FN (gfx950; o bf16, the 128-dim bucket)
    case 4:  // FMHA_DTYPE_FP8_E4M3FNUZ (gfx942)
      // One instance: each architecture's code object reads its own encoding (arch::Fp8E4m3); the
      // registry lists the one format each architecture has.
      return fmha::dispatch_forward<fmha::arch::Fp8E4m3>(*params, s);
    default:  // no AMD instance (the registry refuses the call first)
      return 1;  // hipErrorInvalidValue
  }
}

extern "C" int32_t fmha_hip_load_forward(void) {
  return fmha::arch::load_module(fmha::forward_kernel_amd<fmha::arch::Half, 64, false, fmha_fwd_params>);
}

#endif
