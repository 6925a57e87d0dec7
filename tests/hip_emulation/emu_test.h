// What the CPU emulation tests share: the kernel keywords of a CPU build, fresh random inputs with a
// printed seed (FMHA_TEST_SEED replays one), 16-bit conversions, buffer registration and the launch of
// a grid of emulated workgroups with poisoned LDS.
#pragma once

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(x)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <functional>
#include <random>
#include <vector>

#include "arch/amd/matrix_core.h"

namespace emu {

inline std::mt19937_64 rng;

// Seeds `rng` from FMHA_TEST_SEED or the clock, and prints the seed.
inline void seed_rng() {
  const char* seed_env = getenv("FMHA_TEST_SEED");
  const uint64_t seed =
      seed_env ? strtoull(seed_env, nullptr, 10) : std::random_device{}() ^ (uint64_t(time(nullptr)) << 20);
  rng.seed(seed);
  printf("seed %llu (FMHA_TEST_SEED=%llu replays it)\n", (unsigned long long)seed, (unsigned long long)seed);
}

// dtype: 0 fp16, 1 bf16, 2 fp8 e4m3 in the emulated architecture's encoding (arch::Fp8E4m3).
inline uint16_t to_bits(int dtype, float x) {
  using namespace fmha::arch;
  if (dtype == 2) return fp8_bits(x);
  return static_cast<uint16_t>(dtype == 0 ? Element<Half>::bits(x) : Element<BFloat16>::bits(x));
}
inline float from_bits(int dtype, uint16_t b) {
  if (dtype == 2) return fmha::arch::fp8_to_float(static_cast<uint8_t>(b));
  return dtype == 0 ? fmha::arch::half_to_float(b) : fmha::arch::bf16_to_float(b);
}
inline uint16_t nan_bits(int dtype) {
  if (dtype == 2) return fmha::arch::kFp8Bias == 8 ? 0x80 : 0x7f;
  return dtype == 0 ? 0x7e00 : 0x7fc0;
}

// Makes `v` addressable by the emulated global loads and stores (every other address traps).
template <typename T>
inline void expose(const std::vector<T>& v) {
  fmha::arch::g_buffers.push_back({(const uint8_t*)v.data(), v.size() * sizeof(T)});
}

// Runs `body` as every workgroup of `grid` (256 work-items each, the one barrier size), in order, each
// with the kernel's `lds_bytes` of LDS poisoned with NaN bit patterns (by lds_pointer, at its first use
// in the workgroup). `before(x, y, z)`, if given, runs before each workgroup (e.g. to register only
// the buffers that workgroup may read).
inline void launch(dim3 grid, size_t lds_bytes, const std::function<void()>& body,
                   const std::function<void(uint32_t, uint32_t, uint32_t)>& before = {}) {
  fmha::arch::g_lds_size = lds_bytes;
  g_grid[0] = grid.x, g_grid[1] = grid.y, g_grid[2] = grid.z;
  for (uint32_t z = 0; z < grid.z; ++z)
    for (uint32_t y = 0; y < grid.y; ++y)
      for (uint32_t x = 0; x < grid.x; ++x) {
        g_block[0] = x, g_block[1] = y, g_block[2] = z;
        if (before) before(x, y, z);
        fmha::arch::g_lds = nullptr;
        run_workgroup(256, body);
      }
}

}  // namespace emu
