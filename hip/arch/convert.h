// 16-bit storage <-> fp32 for the element-wise stages, which treat tensors as arrays of uint16_t:
// kBf16 selects bfloat16, otherwise IEEE half. Round to nearest even on the way down.
#pragma once

#include <stdint.h>

#include "arch/platform.h"
#if defined(FMHA_PLATFORM_NVIDIA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#include "arch/amd/matrix_core.h"
#endif

namespace fmha {
namespace arch {

template <bool kBf16>
__device__ inline float to_float(uint16_t bits) {
#if defined(FMHA_PLATFORM_NVIDIA)
  if constexpr (kBf16) return __uint_as_float(uint32_t(bits) << 16);
  else return __half2float(__ushort_as_half(bits));
#else
  if constexpr (kBf16) return __builtin_bit_cast(float, uint32_t(bits) << 16);
  else return static_cast<float>(__builtin_bit_cast(_Float16, bits));
#endif
}

template <bool kBf16>
__device__ inline uint16_t from_float(float x) {
#if defined(FMHA_PLATFORM_NVIDIA)
  if constexpr (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  else return __half_as_ushort(__float2half_rn(x));
#else
  if constexpr (kBf16) return static_cast<uint16_t>(Element<BFloat16>::bits(x));
  else return static_cast<uint16_t>(Element<Half>::bits(x));
#endif
}

}  // namespace arch
}  // namespace fmha
