// Zeroes fp32 elements with 16-byte stores, the threads of a block or of a grid striding over them:
// the dq_acc zeroing pass and a deterministic unit's first writes to its split slot.
#pragma once

#include <stdint.h>

#include "arch/platform.h"

namespace fmha {

struct Float4 {
  float x, y, z, w;
};

// x[0, n) = 0 by the thread `start` of `stride` threads; x must be 16-byte aligned.
__device__ inline void zero_floats(float* x, int64_t n, int64_t start, int64_t stride) {
  for (int64_t q = start; q < n / 4; q += stride) reinterpret_cast<Float4*>(x)[q] = Float4{0.f, 0.f, 0.f, 0.f};
  for (int64_t e = n / 4 * 4 + start; e < n; e += stride) x[e] = 0.f;
}

}  // namespace fmha
