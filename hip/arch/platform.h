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
}
#endif
