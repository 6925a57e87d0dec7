// The XOR swizzle of the AMD mainloops' LDS tiles. Plain arithmetic (no builtins), shared by the forward
// and the backward and by their CPU emulation.
#pragma once

#include <stdint.h>

#include "arch/platform.h"

namespace fmha {

// Byte offset of the 8-byte unit `unit` (4 elements) of row `row` in an LDS tile of kUnits units per
// row. The unit index is XORed with a function of the row so that the 16 lanes of a ds_read_b64
// phase, which read one unit column of 16 consecutive rows, hit 16 distinct 8-byte slots of the
// 128-byte bank window: rows of 128 bytes or more use row mod 16, rows of 64 bytes (two per window)
// (row / 2) mod 8. Since row · kUnits · 8 has no bits below kUnits · 8, swizzled(row, u ^ c) =
// swizzled(row, u) ^ (8 c) for c < kUnits: a lane computes one base and XORs in each step's unit.
template <int kUnits>
__device__ inline uint32_t swizzled(int row, int unit) {
  static_assert(kUnits == 8 || kUnits % 16 == 0, "rows of 64 bytes or of a multiple of 128 bytes");
  const int term = kUnits == 8 ? (row >> 1) & 7 : row & 15;
  return static_cast<uint32_t>(row * kUnits * 8 + ((unit ^ term) * 8));
}

}  // namespace fmha
