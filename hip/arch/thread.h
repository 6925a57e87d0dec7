// Thread and workgroup indices, wave size and barriers for each GPU family.
#pragma once

#include "arch/platform.h"

namespace fmha {
namespace arch {

#if defined(FMHA_PLATFORM_NVIDIA)
constexpr int kWaveSize = 32;
__device__ inline uint32_t thread_index() { return threadIdx.x; }
__device__ inline uint32_t block_index_x() { return blockIdx.x; }
__device__ inline uint32_t block_index_y() { return blockIdx.y; }
__device__ inline uint32_t block_index_z() { return blockIdx.z; }
__device__ inline uint32_t grid_blocks_x() { return gridDim.x; }
__device__ inline uint32_t grid_blocks_y() { return gridDim.y; }
__device__ inline uint32_t grid_blocks_z() { return gridDim.z; }
__device__ inline void block_barrier() { __syncthreads(); }
// *p += x, atomically for the workgroup (p in shared memory).
__device__ inline void shared_atomic_add(int32_t* p, int32_t x) { atomicAdd(p, x); }
// Orders the memory accesses of the lanes of this warp before the ones after it (lanes may diverge).
__device__ inline void wave_barrier() { __syncwarp(); }
// x of lane (this lane XOR mask); every lane of the warp must take part.
__device__ inline float shuffle_xor(float x, int mask) { return __shfl_xor_sync(0xffffffffu, x, mask); }
// x of lane `source` of this lane's group of `width` lanes (a power of two); every lane of the warp
// must take part.
__device__ inline int64_t shuffle(int64_t x, int source, int width) {
  return __shfl_sync(0xffffffffu, static_cast<long long>(x), source, width);
}
// Whether `p` holds on every lane of the warp; every lane of the warp must take part.
__device__ inline bool all_lanes(bool p) { return __all_sync(0xffffffffu, p); }
#else
constexpr int kWaveSize = 64;
__device__ inline uint32_t thread_index() { return __builtin_amdgcn_workitem_id_x(); }
__device__ inline uint32_t block_index_x() { return __builtin_amdgcn_workgroup_id_x(); }
__device__ inline uint32_t block_index_y() { return __builtin_amdgcn_workgroup_id_y(); }
__device__ inline uint32_t block_index_z() { return __builtin_amdgcn_workgroup_id_z(); }
__device__ inline uint32_t grid_blocks_x() { return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(); }
__device__ inline uint32_t grid_blocks_y() { return __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(); }
__device__ inline uint32_t grid_blocks_z() { return __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z(); }
// A workgroup barrier that also orders LDS and global memory between the waves of the workgroup.
__device__ inline void block_barrier() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// *p += x, atomically for the workgroup (p in LDS).
__device__ inline void shared_atomic_add(int32_t* p, int32_t x) {
  __hip_atomic_fetch_add(p, x, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
}
// A wave runs its lanes in lockstep, so its earlier accesses are issued before its later ones; this
// keeps the compiler from moving them across.
__device__ inline void wave_barrier() { __builtin_amdgcn_wave_barrier(); }
// x of lane (this lane XOR mask); every lane of the wave must take part.
__device__ inline float shuffle_xor(float x, int mask) {
  const uint32_t lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(static_cast<int>((lane ^ uint32_t(mask)) << 2),
                                                                __builtin_bit_cast(int, x)));
}
#endif

}  // namespace arch
}  // namespace fmha
