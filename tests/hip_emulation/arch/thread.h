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
inline void block_barrier() { emu::g_workgroup_barrier.wait(); }
}  // namespace arch
}  // namespace fmha
