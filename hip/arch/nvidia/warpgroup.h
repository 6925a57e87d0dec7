// Hopper (sm_90a) warpgroup MMA: `wgmma.mma_async` m64nNk16 (16-bit types) and m64nNk32 (fp8 e4m3) with
// fp32 accumulators, operands read by the tensor cores straight from shared memory through 64-bit
// matrix descriptors (no ldmatrix).
//
// A warpgroup is 4 consecutive warps (128 threads, the first a multiple of 4). Warp w of the group holds
// rows 16w..16w+15 of the 64-row accumulator in the C fragment layout of tensor_core.h, repeated along N:
// d[n][0..3] = (g, 8n + 2t), (g, 8n + 2t + 1), (g + 8, 8n + 2t), (g + 8, 8n + 2t + 1), with g = lane / 4,
// t = lane % 4. An A operand in registers is the A fragment (tensor_core.h) of the warp's 16 rows.
//
// Shared operands use the 128-byte swizzle (`Swizzle128` in shared_tile.h): a tile is stored as blocks
// of 64 columns, each block [rows][128 B] with 16-byte chunk c of row r at chunk c XOR (r mod 8); the
// hardware applies that XOR to absolute address bits, so every tile starts on a 1024-byte boundary.
//   K-major operand (the reduced columns inside a row: Q and K for S = Q·Kᵀ, and Vᵀ for the 8-bit
//     P·V): start at the step's 32-byte offset in its block; 8-row groups 1024 B apart (stride offset).
//   N-major operand (reduced along rows: V for O = P·V, rows = keys): start at the step's 16 rows
//     (2048 B); 8-row groups 1024 B apart (stride offset), 64-column blocks `rows · 128` B apart
//     (leading offset).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "arch/platform.h"

namespace fmha {
namespace arch {

// A shared-memory matrix descriptor with the 128-byte swizzle: 8-row groups are 1024 B apart (the
// stride offset); byte offsets added later go into the address field as `offset >> 4` (shared
// addresses are below 2^18, so the field never carries).
__device__ inline uint64_t swizzle128_descriptor(uint32_t shared, uint32_t leading_bytes) {
  return static_cast<uint64_t>((shared & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16 |
         static_cast<uint64_t>(1024 >> 4) << 32 | static_cast<uint64_t>(1) << 62;
}

// A K-major operand (the swizzled layout leaves the leading offset unused; 16 B as by convention).
__device__ inline uint64_t k_major_descriptor(uint32_t shared) { return swizzle128_descriptor(shared, 16); }

// An M- or N-major operand whose 64-column blocks are `block_bytes` apart (the leading offset).
__device__ inline uint64_t mn_major_descriptor(uint32_t shared, uint32_t block_bytes) {
  return swizzle128_descriptor(shared, block_bytes);
}

__device__ inline uint64_t descriptor_plus(uint64_t descriptor, uint32_t bytes) { return descriptor + (bytes >> 4); }

// Registers written by ordinary instructions are ready for the next wgmma (accumulators, A fragments).
__device__ inline void warpgroup_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void warpgroup_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed wgmma groups are in flight.
template <int kPending>
__device__ inline void warpgroup_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Pins accumulator registers at this point of the program: the compiler must not move their reads
// above a warpgroup_wait (it cannot see that the wgmma writes them asynchronously) nor their writes
// below the next wgmma.
template <int kRows>
__device__ inline void hold_registers(float (&d)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
  }
}

// The same for A-fragment registers a wgmma reads asynchronously: placed after the wait that retires
// it, they stay live (not reused for other values) until the product has read them.
template <int kSteps>
__device__ inline void hold_registers(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    asm volatile("" : "+r"(a[i][0]), "+r"(a[i][1]), "+r"(a[i][2]), "+r"(a[i][3])::"memory");
  }
}

// Shared-memory operands make a copy of every thread's shared writes visible to the tensor cores'
// (async) proxy: each writing thread fences before the barrier that publishes them.
__device__ inline void fence_shared_for_async_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// This thread's generic-proxy writes to global memory, before async-proxy operations (TMA) on them that follow a
// barrier.
__device__ inline void fence_global_for_async_proxy() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

#define FMHA_ACC4(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define FMHA_ACC_N32 FMHA_ACC4(0), FMHA_ACC4(1), FMHA_ACC4(2), FMHA_ACC4(3)
#define FMHA_ACC_N64 FMHA_ACC_N32, FMHA_ACC4(4), FMHA_ACC4(5), FMHA_ACC4(6), FMHA_ACC4(7)
#define FMHA_ACC_N128                                                                                       \
  FMHA_ACC_N64, FMHA_ACC4(8), FMHA_ACC4(9), FMHA_ACC4(10), FMHA_ACC4(11), FMHA_ACC4(12), FMHA_ACC4(13), \
      FMHA_ACC4(14), FMHA_ACC4(15)
#define FMHA_ACC_N80 FMHA_ACC_N64, FMHA_ACC4(8), FMHA_ACC4(9)
#define FMHA_ACC_N256 FMHA_ACC_N128, FMHA_ACC4(16), FMHA_ACC4(17), FMHA_ACC4(18), FMHA_ACC4(19), FMHA_ACC4(20), FMHA_ACC4(21), FMHA_ACC4(22), FMHA_ACC4(23), FMHA_ACC4(24), FMHA_ACC4(25), FMHA_ACC4(26), FMHA_ACC4(27), FMHA_ACC4(28), FMHA_ACC4(29), FMHA_ACC4(30), FMHA_ACC4(31)
#define FMHA_REGS_0_15 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FMHA_REGS_0_31 \
  FMHA_REGS_0_15 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FMHA_REGS_0_63                                                                                      \
  FMHA_REGS_0_31 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
                 "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FMHA_REGS_0_39 FMHA_REGS_0_31 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FMHA_REGS_0_127 FMHA_REGS_0_63 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// D (+)= A·B for one element type TYPE ("f16" or "bf16"), by the accumulator's rows: shared A · shared B
// with N = 32, 64, 80 or 128 (S), register A · shared B with N = 64, 128 or 256 (O).
//   Shared A · shared B: K-major operands unless kTransposeA / kTransposeB (then M- / N-major).
//   `accumulate` = 0 overwrites D (the first step of a fresh product).
//   Register A · shared B: B N-major (`imm-trans-b` = 1), accumulating.
#define FMHA_WARPGROUP_MMA_SHARED(N, REGS, ACC, A, B, SCALE, TRANS_A, TRANS_B, TYPE)                            \
  template <int kTransposeA = 0, int kTransposeB = 0>                                                          \
  __device__ static void mma(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS "}, " A ", " B       \
                 ", p, 1, 1, " TRANS_A ", " TRANS_B ";\n}\n"                                                   \
                 : ACC                                                                                         \
                 : "l"(a), "l"(b), "r"(accumulate), "n"(kTransposeA), "n"(kTransposeB));                       \
  }
#define FMHA_WARPGROUP_MMA_REGISTERS(N, REGS, ACC, A, B, TYPE)                                              \
  __device__ static void mma(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {                   \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " REGS "}, " A ", " B \
                 ", 1, 1, 1, 1;\n"                                                                         \
                 : ACC                                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                    \
  }
#define FMHA_WARPGROUP_MMA(TYPE)                                                                                  \
  FMHA_WARPGROUP_MMA_SHARED(32, FMHA_REGS_0_15, FMHA_ACC_N32, "%16", "%17", "%18", "%19", "%20", TYPE)           \
  FMHA_WARPGROUP_MMA_SHARED(64, FMHA_REGS_0_31, FMHA_ACC_N64, "%32", "%33", "%34", "%35", "%36", TYPE)           \
  FMHA_WARPGROUP_MMA_SHARED(80, FMHA_REGS_0_39, FMHA_ACC_N80, "%40", "%41", "%42", "%43", "%44", TYPE)           \
  FMHA_WARPGROUP_MMA_SHARED(128, FMHA_REGS_0_63, FMHA_ACC_N128, "%64", "%65", "%66", "%67", "%68", TYPE)         \
  FMHA_WARPGROUP_MMA_REGISTERS(64, FMHA_REGS_0_31, FMHA_ACC_N64, "{%32, %33, %34, %35}", "%36", TYPE)            \
  FMHA_WARPGROUP_MMA_REGISTERS(128, FMHA_REGS_0_63, FMHA_ACC_N128, "{%64, %65, %66, %67}", "%68", TYPE)          \
  FMHA_WARPGROUP_MMA_REGISTERS(256, FMHA_REGS_0_127, FMHA_ACC_N256, "{%128, %129, %130, %131}", "%132", TYPE)

// The 8-bit types: m64nNk32, both operands K-major (no transpose immediates exist for them).
#define FMHA_WARPGROUP_MMA_8BIT_SHARED(N, REGS, ACC, A, B, SCALE, TYPE)                                         \
  __device__ static void mma(float (&d)[N / 8][4], uint64_t a, uint64_t b, int accumulate) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." TYPE "." TYPE " " REGS "}, " A ", " B       \
                 ", p, 1, 1;\n}\n"                                                                             \
                 : ACC                                                                                         \
                 : "l"(a), "l"(b), "r"(accumulate));                                                           \
  }
#define FMHA_WARPGROUP_MMA_8BIT_REGISTERS(N, REGS, ACC, A, B, TYPE)                                         \
  __device__ static void mma(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b) {                   \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." TYPE "." TYPE " " REGS "}, " A ", " B \
                 ", 1, 1, 1;\n"                                                                           \
                 : ACC                                                                                     \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                    \
  }

template <typename T>
struct WarpgroupMma;

template <>
struct WarpgroupMma<__half> {
  FMHA_WARPGROUP_MMA("f16")
};

template <>
struct WarpgroupMma<__nv_bfloat16> {
  FMHA_WARPGROUP_MMA("bf16")
};

template <>
struct WarpgroupMma<__nv_fp8_e4m3> {
  FMHA_WARPGROUP_MMA_8BIT_SHARED(64, FMHA_REGS_0_31, FMHA_ACC_N64, "%32", "%33", "%34", "e4m3")
  FMHA_WARPGROUP_MMA_8BIT_SHARED(128, FMHA_REGS_0_63, FMHA_ACC_N128, "%64", "%65", "%66", "e4m3")
  FMHA_WARPGROUP_MMA_8BIT_REGISTERS(64, FMHA_REGS_0_31, FMHA_ACC_N64, "{%32, %33, %34, %35}", "%36", "e4m3")
  FMHA_WARPGROUP_MMA_8BIT_REGISTERS(128, FMHA_REGS_0_63, FMHA_ACC_N128, "{%64, %65, %66, %67}", "%68", "e4m3")
};

#undef FMHA_WARPGROUP_MMA_8BIT_REGISTERS
#undef FMHA_WARPGROUP_MMA_8BIT_SHARED
#undef FMHA_WARPGROUP_MMA
#undef FMHA_WARPGROUP_MMA_REGISTERS
#undef FMHA_WARPGROUP_MMA_SHARED
#undef FMHA_REGS_0_127
#undef FMHA_REGS_0_63
#undef FMHA_REGS_0_39
#undef FMHA_REGS_0_31
#undef FMHA_REGS_0_15
#undef FMHA_ACC_N256
#undef FMHA_ACC_N128
#undef FMHA_ACC_N80
#undef FMHA_ACC_N64
#undef FMHA_ACC_N32
#undef FMHA_ACC4

// The bytes of a row one wgmma step reduces: 16 columns of a 16-bit type, 32 of an 8-bit one.
constexpr uint32_t kStepBytes = 32;

// D = A·Bᵀ over kDim columns, A (64 rows) and B (N rows) both K-major Swizzle128 tiles whose
// 64-column blocks are kABlockBytes / kBBlockBytes apart; overwrites D. Issue only: fence before,
// commit and wait after.
template <typename T, int kDim, uint32_t kABlockBytes, uint32_t kBBlockBytes, int kRows>
__device__ inline void mma_rows_by_rows(float (&d)[kRows][4], uint64_t a, uint64_t b) {
  constexpr int kSteps = kDim * static_cast<int>(sizeof(T)) / kStepBytes;
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const uint32_t column = (kk % 4) * kStepBytes;  // the step's columns inside their 128-byte block
    WarpgroupMma<T>::mma(d, descriptor_plus(a, (kk / 4) * kABlockBytes + column),
                         descriptor_plus(b, (kk / 4) * kBBlockBytes + column), kk > 0);
  }
}

// D += A·B, A in registers as kSteps fragments, B an N-major Swizzle128 tile read 16 rows (2048 bytes)
// a step (16-bit types). Issue only, like mma_rows_by_rows.
template <typename T, int kSteps, int kRows>
__device__ inline void mma_registers_by_columns(float (&d)[kRows][4], const uint32_t (&a)[kSteps][4], uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) WarpgroupMma<T>::mma(d, a[kk], descriptor_plus(b, kk * 16 * 128));
}

// D += A·B, A a K-major Swizzle128 tile of one 128-byte block (kSteps ≤ 4 steps of 16 columns), B an
// N-major Swizzle128 tile read 16 rows (2048 bytes) a step (16-bit types). Issue only.
template <typename T, int kSteps, int kRows>
__device__ inline void mma_rows_by_columns(float (&d)[kRows][4], uint64_t a, uint64_t b) {
  static_assert(kSteps * kStepBytes <= 128, "A is one 128-byte block wide");
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    WarpgroupMma<T>::template mma<0, 1>(d, descriptor_plus(a, kk * kStepBytes), descriptor_plus(b, kk * 16 * 128), 1);
  }
}

// D += A·Bᵀ, A in registers as kSteps fragments, B a K-major Swizzle128 tile (Bᵀ stored: the
// reduced dimension inside its rows) whose 128-byte blocks are kBBlockBytes apart. The 8-bit types'
// P·V, whose V must arrive transposed (no N-major 8-bit operands). Issue only.
template <typename T, int kSteps, uint32_t kBBlockBytes, int kRows>
__device__ inline void mma_registers_by_rows(float (&d)[kRows][4], const uint32_t (&a)[kSteps][4], uint64_t b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    WarpgroupMma<T>::mma(d, a[kk], descriptor_plus(b, (kk / 4) * kBBlockBytes + (kk % 4) * kStepBytes));
  }
}

}  // namespace arch
}  // namespace fmha
