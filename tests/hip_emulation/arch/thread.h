// CPU emulation of hip/arch/thread.h (AMD branch): every work-item is a fiber; barriers switch fibers.
#pragma once
#include "arch/platform.h"
#include "emu_runtime.h"

namespace fmha {
namespace arch {
constexpr int kWaveSize = 64;
inline uint32_t thread_index() { return emu::current().tid; }
inline uint32_t block_index_x() { return emu::g_block[0]; }
inline uint32_t block_index_y() { return emu::g_block[1]; }
inline uint32_t block_index_z() { return emu::g_block[2]; }
inline uint32_t grid_blocks_x() { return emu::g_grid[0]; }
inline uint32_t grid_blocks_y() { return emu::g_grid[1]; }
inline uint32_t grid_blocks_z() { return emu::g_grid[2]; }
inline void block_barrier() { emu::g_workgroup_barrier.wait(); }
// The lanes of a wave run as fibers here: they meet, as a wave's lanes do in lockstep on the GPU.
inline void wave_barrier() { emu::g_waves[thread_index() / 64].bar.wait(); }
// x of lane (this lane XOR mask); every lane of the wave must take part.
inline float shuffle_xor(float x, int mask) {
  emu::Wave& w = emu::g_waves[thread_index() / 64];
  const int lane = thread_index() % 64;
  __builtin_memcpy(&w.slot[lane][0], &x, 4);
  w.bar.wait();
  float y;
  __builtin_memcpy(&y, &w.slot[lane ^ mask][0], 4);
  w.bar.wait();
  return y;
}
}  // namespace arch
}  // namespace fmha
