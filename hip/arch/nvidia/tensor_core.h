// NVIDIA primitives around the tensor cores (the products themselves: arch/nvidia/warpgroup.h):
// asynchronous global→shared copies and 32-bit shared stores, packing fp32 results into 16-bit operand
// registers, and the reductions and exp2 of the softmax over the register fragments.
//
// A warp's fragments of a 16-row tile (PTX ISA, "mma.m16n8k16"; wgmma uses them per warp), with
// g = lane / 4 and t = lane % 4:
//   A 16x16 (row-major)  : 4 x b32 = {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}
//   C 16x8  (fp32)       : 4 floats = {(g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)}
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "arch/platform.h"

namespace fmha {
namespace arch {

constexpr int kWarpSize = 32;

__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 4 bytes to shared memory at `shared` (a 32-bit shared-window address).
__device__ inline void shared_store_4(uint32_t shared, uint32_t value) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(shared), "r"(value));
}

// Two floats to shared memory at `shared` (8-byte aligned).
__device__ inline void shared_store_8(uint32_t shared, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(shared), "f"(x), "f"(y) : "memory");
}

// 16 bytes to shared memory at `shared` (16-byte aligned).
__device__ inline void shared_store_16(uint32_t shared, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(shared), "r"(x), "r"(y), "r"(z), "r"(w));
}

// 4 bytes from shared memory at `shared` (volatile: the copies that wrote it are asynchronous, ordered
// by the caller's waits and barriers, which the compiler does not see as writes).
__device__ inline uint32_t shared_load_4(uint32_t shared) {
  uint32_t value;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(shared));
  return value;
}

// One float and two (8-byte aligned) from shared memory, volatile like shared_load_4.
__device__ inline float shared_load_f32(uint32_t shared) { return __uint_as_float(shared_load_4(shared)); }
__device__ inline float2 shared_load_f32x2(uint32_t shared) {
  float2 value;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(value.x), "=f"(value.y) : "r"(shared));
  return value;
}

// 16 bytes global → shared (a 32-bit shared-window address), bypassing L1; `valid == false` writes
// zeros (rows past the sequence).
__device__ inline void copy_async_16(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 16 : 0));
}

// 4 bytes global → shared (a 32-bit shared-window address), through L1 (`cg` takes 16 bytes only);
// `valid == false` writes zero.
__device__ inline void copy_async_4(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global), "r"(valid ? 4 : 0));
}

__device__ inline void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// The mbarrier at `bar` receives one arrival once every cp.async this thread issued before has landed
// (`noinc`: the arrival is one of the count the barrier was initialised with), so the thread goes on
// issuing copies instead of waiting for them.
__device__ inline void copy_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ inline void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// *global += (x, y), one vector reduction in L2 (sm_90 `red.global.add.v2.f32`): nothing comes back, so
// the warp does not wait for it (atomicAdd on a float2 compiles to a generic-address ATOM, which measured
// 4-5 % slower in the backward on an H200); or, where `store`, global[0..1] = {x, y}. One predicated
// instruction each, no branch (a branch per pair, in a loop that holds the accumulators, cost ptxas
// registers).
__device__ inline void store_or_add_2(float* global, float x, float y, bool store) {
  asm volatile(
      "{\n.reg .pred s;\nsetp.ne.b32 s, %3, 0;\n@s st.global.v2.f32 [%0], {%1, %2};\n"
      "@!s red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(global),
      "f"(x), "f"(y), "r"(static_cast<uint32_t>(store))
      : "memory");
}

// The 16-bit input types: packing two floats into an operand register, and back.
template <typename T>
struct Element;

template <>
struct Element<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static float2 unpack(uint32_t bits) { return __half22float2(*reinterpret_cast<__half2*>(&bits)); }
};

template <>
struct Element<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static float2 unpack(uint32_t bits) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&bits));
  }
};

// fp8 e4m3 (OCP): four floats into one operand register, x0 in the low byte, saturating to ±448.
template <>
struct Element<__nv_fp8_e4m3> {
  __device__ static uint32_t pack4(float x0, float x1, float x2, float x3) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x0, x1), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(x2, x3), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  }
};

// Step kk of a row of C fragments, rounded to T, as an A fragment (the steps of a wgmma: 16 columns
// for 16-bit types, 32 for 8-bit ones).
//   16-bit: the C layout of two 8-column tiles is the A layout of one 16-column step.
//   8-bit: the A fragment holds columns 4t..4t+3 and 16+4t..16+4t+3 of rows g and g+8, the C tiles
//     columns 2t, 2t+1 of each 8: the step's columns are taken permuted, position 16h + 4t + 2a + b
//     holding column 16h + 8a + 2t + b of C (tile 4kk + 2h + a, element b), and the B operand's rows
//     must be permuted alike (fwd/sm90/transpose_v.h).
template <typename T, int kTiles>
__device__ inline void a_fragment(uint32_t (&a)[4], const float (&c)[kTiles][4], int kk) {
  if constexpr (sizeof(T) == 1) {
    const float(&c0)[4] = c[4 * kk];
    const float(&c1)[4] = c[4 * kk + 1];
    const float(&c2)[4] = c[4 * kk + 2];
    const float(&c3)[4] = c[4 * kk + 3];
    a[0] = Element<T>::pack4(c0[0], c0[1], c1[0], c1[1]);
    a[1] = Element<T>::pack4(c0[2], c0[3], c1[2], c1[3]);
    a[2] = Element<T>::pack4(c2[0], c2[1], c3[0], c3[1]);
    a[3] = Element<T>::pack4(c2[2], c2[3], c3[2], c3[3]);
  } else {
    a[0] = Element<T>::pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = Element<T>::pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = Element<T>::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = Element<T>::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

// Reductions over the four lanes that share a fragment row (same g).
__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// 2^x with the special-function unit (ex2.approx: 2 ulp, -inf -> +0), as the softmax needs it.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace arch
}  // namespace fmha
