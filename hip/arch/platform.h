// The one place that knows which GPU platform the HIP sources are compiled for.
//
// NVIDIA: nvcc compiles the sources as CUDA (HIP's CUDA platform); the runtime types are CUDA's.
// AMD: clang -x hip with -nogpuinc -nogpulib (no ROCm install needed): we declare the handful of
// runtime symbols that kernel launches (<<<>>>) need ourselves; libamdhip64 provides them at link time.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_runtime.h>
typedef cudaStream_t hipStream_t;
typedef cudaError_t hipError_t;
#define hipGetLastError cudaGetLastError
#define FMHA_PLATFORM_NVIDIA 1
#else
#define FMHA_PLATFORM_AMD 1
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __host__
#define __host__ __attribute__((host))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#endif
struct dim3 {
  uint32_t x, y, z;
  constexpr __host__ __device__ dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef struct ihipStream_t* hipStream_t;
typedef int hipError_t;
extern "C" {
hipError_t hipGetLastError(void);
hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared_bytes, hipStream_t stream);
hipError_t __hipPopCallConfiguration(dim3* grid, dim3* block, size_t* shared_bytes, hipStream_t* stream);
hipError_t hipLaunchKernel(const void* function, dim3 grid, dim3 block, void** args, size_t shared_bytes,
                           hipStream_t stream);
// HIP's definition (hip_runtime_api.h), for load_module below.
typedef struct hipFuncAttributes {
  int binaryVersion;
  int cacheModeCA;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxDynamicSharedSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int preferredShmemCarveout;
  int ptxVersion;
  size_t sharedSizeBytes;
} hipFuncAttributes;
hipError_t hipFuncGetAttributes(hipFuncAttributes* attributes, const void* function);
}
#endif

namespace fmha {
namespace arch {

// Loads the code module holding `kernel` onto the current device now. The runtimes load a module when
// one of its kernels is first used, and that load can wait for the work queued on the device (measured
// on an H200: a first launch of a never-used translation unit's kernel blocked the host until a busy
// stream drained, docs/perf.md): the library loads its modules once per device before its first launch.
template <typename Kernel>
inline int32_t load_module(Kernel kernel) {
#if defined(FMHA_PLATFORM_NVIDIA)
  cudaFuncAttributes attributes;
  return static_cast<int32_t>(cudaFuncGetAttributes(&attributes, kernel));
#else
  hipFuncAttributes attributes;
  return static_cast<int32_t>(hipFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kernel)));
#endif
}

}  // namespace arch
}  // namespace fmha
