// Register-class hints, and the qualifiers of code that also compiles as plain CPU code (the CPU twins
// of src/launch/cpu_twin.rs): FMHA_HOST_DEVICE for functions both sides call, FMHA_DEVICE for device
// functions (which the CPU build compiles as ordinary functions).
#pragma once

#if defined(__CUDACC__) || defined(__HIP__)
#include "arch/platform.h"
#define FMHA_HOST_DEVICE __host__ __device__
#define FMHA_DEVICE __device__
#else
#define FMHA_HOST_DEVICE
#define FMHA_DEVICE
#endif

namespace fmha {
namespace arch {

// `v`, held in vector registers. On AMD GPUs the compiler runs arithmetic on wave-uniform values
// (in a one-thread routine: everything) on the scalar unit, whose ~100 registers the loop state and
// the long 64-bit division expansions overflow (register spills); an empty asm with a vector-register
// constraint makes it treat `v`, and everything computed from it, as per-lane, so that work moves to
// the vector unit, which has registers to spare. A no-op on every other target.
template <typename T>
FMHA_HOST_DEVICE inline T in_vector_registers(T v) {
#if defined(__AMDGCN__)
  asm("" : "+v"(v));
#endif
  return v;
}

}  // namespace arch
}  // namespace fmha
