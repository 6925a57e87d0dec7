// AMD CDNA3 (gfx942) / CDNA4 (gfx950) primitives of the attention mainloops, wave64: the MFMA with
// fp32 accumulation, LDS and global vector accesses, the exchange between the two halves of a wave,
// exp2 and the 16-bit conversions. Builtins only (-nogpulib): no device library is linked.
//
// Fragment layouts of v_mfma_f32_32x32x8_f16 / v_mfma_f32_32x32x8_bf16 (the "_1k" bf16 form), with
// l = lane, h = l / 32 (as composable_kernel's xdlops_gemm.hpp describes them: mfma_type {group_size
// 4, num_groups_per_blk 4, num_threads_per_blk 32, num_input_blks 2, k_per_blk 4},
// CalculateA/BThreadOriginDataIndex, GetBeginOfThreadBlk; and IREE's nested layouts for CDNA3
// V_MFMA_F32_32x32x8_F16):
//   A 32x8  (M x K) : 4 x 16-bit per lane (2 x b32) = A[l % 32][4h + e],          e = 0..3
//   B 8x32  (K x N) : 4 x 16-bit per lane (2 x b32) = B[4h + e][l % 32],          e = 0..3
//   C 32x32 (fp32)  : 16 floats per lane            = C[8 (r / 4) + 4h + r % 4][l % 32], r = 0..15
// Registers 4g..4g+3 of C hold rows 8g + 4h + e of column l % 32: exactly a B fragment whose k is C's
// row, for the 8-row step g. So an accumulator, four registers at a time, is the B operand of a
// product that sums over its rows, with no data movement: the forward computes Sᵀ = K·Qᵀ and feeds
// Pᵀ to Oᵀ += Vᵀ·Pᵀ straight from the registers, and each lane owns one query row.
//
// gfx950's v_mfma_f32_32x32x16_{f16,bf16} has the same C and 8 elements per lane in A and B:
// A[l % 32][8h + e], e = 0..7 (CK: k_per_blk 8). A product sums over k in any order, so feeding it
// the concatenations (A_s, A_s+1) and (B_s, B_s+1) of the 32x32x8 fragments of two 8-wide k steps
// computes exactly their two 32x32x8 MFMAs (lane half h supplies k = 8s + 4h + e as its k = 8h + e,
// and k = 8(s+1) + 4h + e as 8h + 4 + e, in A and B alike). The mainloops are written in 32x32x8
// fragments; `mma2` is one instruction on gfx950 and two on gfx942.
//
// v_mfma_f32_32x32x16_fp8_fp8 (fp8 e4m3 A and B; gfx942 reads the FNUZ encoding, gfx950 the OCP one) has
// the same C and 8 one-byte elements per lane in A and B: A[l % 32][8h + e], e = 0..7. Its A and B
// fragments are 8 bytes, like a 32x32x8 16-bit one, so the mainloops, written in 8-byte fragments of
// rows of bytes, are the same for both widths: a 16-bit fragment is 4 elements of k, an 8-bit one 8.
#pragma once

#include "arch/platform.h"

namespace fmha {
namespace arch {

// LDS per workgroup (and per CU).
#if defined(__gfx950__)
constexpr int kLdsBytes = 160 * 1024;
#else
constexpr int kLdsBytes = 64 * 1024;
#endif

// Kernel attribute: registers for at least `waves` waves per SIMD (the compiler keeps VGPRs + AGPRs
// within 512 / waves, or reports spills).
#define FMHA_AMD_MIN_WAVES_PER_SIMD(waves) __attribute__((amdgpu_waves_per_eu(waves)))

typedef uint32_t u32x2 __attribute__((ext_vector_type(2)));  // 4 x 16-bit: one A or B fragment
typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));  // 8 x 16-bit: one 16-byte vector
typedef float f32x4 __attribute__((ext_vector_type(4)));     // 4 fp32 from one 16-byte load
typedef float f32x16 __attribute__((ext_vector_type(16)));   // one 32x32 fp32 accumulator

// LDS bytes (address space 3: ds_read / ds_write with 32-bit addresses).
typedef __attribute__((address_space(3))) uint8_t lds_byte;

__device__ inline lds_byte* lds_pointer(void* shared) { return (lds_byte*)shared; }

__device__ inline u32x2 lds_load_8(const lds_byte* base, uint32_t offset) {
  return *(const __attribute__((address_space(3))) u32x2*)(base + offset);
}

__device__ inline void lds_store_8(lds_byte* base, uint32_t offset, u32x2 v) {
  *(__attribute__((address_space(3))) u32x2*)(base + offset) = v;
}

__device__ inline u32x4 lds_load_16(const lds_byte* base, uint32_t offset) {
  return *(const __attribute__((address_space(3))) u32x4*)(base + offset);
}

__device__ inline void lds_store_4(lds_byte* base, uint32_t offset, uint32_t v) {
  *(__attribute__((address_space(3))) uint32_t*)(base + offset) = v;
}

__device__ inline void lds_store_2(lds_byte* base, uint32_t offset, uint16_t v) {
  *(__attribute__((address_space(3))) uint16_t*)(base + offset) = v;
}

// A generic pointer to global memory at `address`, made from an address-space-1 pointer so that the
// compiler knows where loads through it go (after inlining): global_load rather than flat_load, and a
// load from a wave-uniform address is then uniform (a flat load could read per-lane scratch, so its
// result counts as divergent, and everything computed from it moves to vector registers and
// divergent branches).
template <typename T>
__device__ inline T* global_pointer(uint64_t address) {
  return (T*)(__attribute__((address_space(1))) T*)address;
}

// Global memory through address-space-1 pointers (global_load / global_store rather than flat).
__device__ inline u32x4 global_load_16(const void* p) { return *(const __attribute__((address_space(1))) u32x4*)(p); }

__device__ inline u32x2 global_load_8(const void* p) { return *(const __attribute__((address_space(1))) u32x2*)(p); }

__device__ inline uint32_t global_load_4(const void* p) { return *(const __attribute__((address_space(1))) uint32_t*)(p); }

// A raw buffer resource: `bytes` bytes from `base` (both wave-uniform). A buffer load at a byte offset
// at or past `bytes` returns zeros (range checking): the kernels point the loads of rows past a
// sequence's end and of padding columns there, so that those read as zeros with no select on the
// data, and no lane mask stays live until the data arrives. Every load is wholly inside or wholly past.
typedef __amdgpu_buffer_rsrc_t Buffer;

__device__ inline Buffer make_buffer(const void* base, uint32_t bytes) {
  // Word 3 of a gfx9 buffer descriptor: DATA_FORMAT 32 (a raw buffer of dwords).
  return __builtin_amdgcn_make_buffer_rsrc(const_cast<void*>(base), 0, static_cast<int>(bytes), 0x00020000);
}

__device__ inline u32x4 buffer_load_16(Buffer b, uint32_t offset) {
  return __builtin_amdgcn_raw_buffer_load_b128(b, static_cast<int>(offset), 0, 0);
}

__device__ inline u32x2 buffer_load_8(Buffer b, uint32_t offset) {
  return __builtin_amdgcn_raw_buffer_load_b64(b, static_cast<int>(offset), 0, 0);
}

__device__ inline uint32_t buffer_load_4(Buffer b, uint32_t offset) {
  return __builtin_amdgcn_raw_buffer_load_b32(b, static_cast<int>(offset), 0, 0);
}

__device__ inline void global_store_8(void* p, u32x2 v) { *(__attribute__((address_space(1))) u32x2*)(p) = v; }

__device__ inline void global_store_16(void* p, u32x4 v) { *(__attribute__((address_space(1))) u32x4*)(p) = v; }

// *p += x in global memory, one global_atomic_add_f32 without return (relaxed, device scope): the adds
// of one lane to one address apply in its program order.
__device__ inline void global_atomic_add(float* p, float x) {
  __hip_atomic_fetch_add((__attribute__((address_space(1))) float*)p, x, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// The kernel's first argument `params`, read through a pointer into the kernel argument segment that
// the compiler cannot see through: each field is then loaded (s_load) where it is read, instead of once
// at the kernel's start and held in scalar registers across every loop that reads it later. (Through
// `&params` the compiler would copy the argument to scratch memory first.)
template <typename Params>
__device__ inline const Params& reloaded(const Params&) {
  const __attribute__((address_space(4))) Params* p =
      (const __attribute__((address_space(4))) Params*)__builtin_amdgcn_kernarg_segment_ptr();
  asm volatile("" : "+s"(p));
  return *(const Params*)p;
}

// `x`, known to be the same in every lane, as the compiler's scalar value (v_readfirstlane per word):
// values read through generic pointers count as per-lane, and with them everything computed from them.
template <typename T>
__device__ inline T wave_uniform(const T& x) {
  static_assert(sizeof(T) % 4 == 0, "whole 32-bit words");
  uint32_t words[sizeof(T) / 4];
  __builtin_memcpy(words, &x, sizeof(T));
#pragma unroll
  for (unsigned i = 0; i < sizeof(T) / 4; ++i) words[i] = __builtin_amdgcn_readfirstlane(words[i]);
  T y = x;
  __builtin_memcpy(&y, words, sizeof(T));
  return y;
}

__device__ inline f32x16 zero_accumulator() { return f32x16(0.f); }

// x of lane l ^ 32, for lane l: the lanes of the two halves that share a C column.
// Every lane of the wave must take part.
__device__ inline float other_half(float x) {
  const uint32_t lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(static_cast<int>((lane ^ 32u) << 2),
                                                                __builtin_bit_cast(int, x)));
}

// x of lane `source` (0..63), for every lane; every lane of the wave must take part.
__device__ inline uint32_t lane_value(uint32_t x, int source) {
  return static_cast<uint32_t>(__builtin_amdgcn_ds_bpermute(source << 2, static_cast<int>(x)));
}

__device__ inline float halves_max(float x) { return __builtin_fmaxf(x, other_half(x)); }

__device__ inline float halves_sum(float x) { return x + other_half(x); }

// 2^x by v_exp_f32 alone (1 ulp, -inf -> +0), for P.
__device__ inline float fast_exp2(float x) { return __builtin_amdgcn_exp2f(x); }

// 2^x and log2 x with the compiler's full-range lowering (denormal scaling), for the rescale factor
// and the LSE.
__device__ inline float exact_exp2(float x) { return __builtin_exp2f(x); }

__device__ inline float exact_log2(float x) { return __builtin_log2f(x); }

// The input types (tags; tensors are arrays of uint16_t or uint8_t): conversion from fp32 and the MFMA.
// `Output`: the type of O; `kPShift`: P is rounded to the input type as 2^kPShift · P (fp8: P in [0, 1]
// would waste the format's upper binades and lose its small values to underflow).
struct Half {};
struct BFloat16 {};
// fp8 e4m3 in the architecture's encoding: FNUZ on gfx942 (bias 8, largest 240), OCP e4m3fn on gfx950
// (bias 7, largest 448).
struct Fp8E4m3 {};

template <typename T>
struct Element;

template <>
struct Element<Half> {
  static constexpr int kBytes = 2;
  static constexpr float kPShift = 0.f;
  typedef Half Output;
  typedef _Float16 h4 __attribute__((ext_vector_type(4)));
  typedef _Float16 h8 __attribute__((ext_vector_type(8)));

  __device__ static uint32_t bits(float x) {
    return __builtin_bit_cast(uint16_t, static_cast<_Float16>(x));  // v_cvt_f16_f32, round to nearest even
  }
  __device__ static void mma(f32x16& c, u32x2 a, u32x2 b) {
    c = __builtin_amdgcn_mfma_f32_32x32x8f16(__builtin_bit_cast(h4, a), __builtin_bit_cast(h4, b), c, 0, 0, 0);
  }
  __device__ static void mma2(f32x16& c, u32x2 a0, u32x2 a1, u32x2 b0, u32x2 b1) {
#if defined(__gfx950__)
    const u32x4 a = {a0.x, a0.y, a1.x, a1.y}, b = {b0.x, b0.y, b1.x, b1.y};
    c = __builtin_amdgcn_mfma_f32_32x32x16_f16(__builtin_bit_cast(h8, a), __builtin_bit_cast(h8, b), c, 0, 0, 0);
#else
    mma(c, a0, b0);
    mma(c, a1, b1);
#endif
  }
};

template <>
struct Element<BFloat16> {
  static constexpr int kBytes = 2;
  static constexpr float kPShift = 0.f;
  typedef BFloat16 Output;
  typedef short s4 __attribute__((ext_vector_type(4)));
  typedef __bf16 b8 __attribute__((ext_vector_type(8)));

  // Round to nearest even; NaN stays a (quiet) NaN: v_cvt_pk_bf16_f32 on gfx950; on gfx942 the compiler's
  // integer rounding, whose NaN test stays in VCC (a test written out here was kept in a scalar register
  // pair per conversion in flight, which the backward's scalar registers could not hold).
  __device__ static uint32_t bits(float x) { return __builtin_bit_cast(uint16_t, static_cast<__bf16>(x)); }
  __device__ static void mma(f32x16& c, u32x2 a, u32x2 b) {
    c = __builtin_amdgcn_mfma_f32_32x32x8bf16_1k(__builtin_bit_cast(s4, a), __builtin_bit_cast(s4, b), c, 0, 0, 0);
  }
  __device__ static void mma2(f32x16& c, u32x2 a0, u32x2 a1, u32x2 b0, u32x2 b1) {
#if defined(__gfx950__)
    const u32x4 a = {a0.x, a0.y, a1.x, a1.y}, b = {b0.x, b0.y, b1.x, b1.y};
    c = __builtin_amdgcn_mfma_f32_32x32x16_bf16(__builtin_bit_cast(b8, a), __builtin_bit_cast(b8, b), c, 0, 0, 0);
#else
    mma(c, a0, b0);
    mma(c, a1, b1);
#endif
  }
};

template <>
struct Element<Fp8E4m3> {
  static constexpr int kBytes = 1;
  // 2^8 · P <= 256 < 448 (OCP); FNUZ's largest value is 240, so 2^7 there (CK's block scale does the same).
#if defined(__gfx950__)
  static constexpr float kPShift = 8.f;
#else
  static constexpr float kPShift = 7.f;
#endif
  typedef BFloat16 Output;

  // Eight fp32 values rounded to nearest even (v_cvt_pk_fp8_f32; |x| <= 2^kPShift, so never out of
  // range): one A/B fragment, element e in bits 8e..8e+7.
  __device__ static u32x2 pack8(const float* x) {
    u32x2 f;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      int word = __builtin_amdgcn_cvt_pk_fp8_f32(x[4 * w], x[4 * w + 1], 0, false);
      word = __builtin_amdgcn_cvt_pk_fp8_f32(x[4 * w + 2], x[4 * w + 3], word, true);
      f[w] = static_cast<uint32_t>(word);
    }
    return f;
  }
  __device__ static void mma(f32x16& c, u32x2 a, u32x2 b) {
    c = __builtin_amdgcn_mfma_f32_32x32x16_fp8_fp8(__builtin_bit_cast(long, a), __builtin_bit_cast(long, b), c, 0, 0,
                                                    0);
  }
  __device__ static void mma2(f32x16& c, u32x2 a0, u32x2 a1, u32x2 b0, u32x2 b1) {
    mma(c, a0, b0);
    mma(c, a1, b1);
  }
};

// Four fp32 values rounded to a 16-bit T: one A/B fragment (element e in bits 16e..16e+15).
template <typename T>
__device__ inline u32x2 pack4(float x0, float x1, float x2, float x3) {
  using E = Element<T>;
  return u32x2{E::bits(x0) | (E::bits(x1) << 16), E::bits(x2) | (E::bits(x3) << 16)};
}

// Registers r0 .. r0 + 8 / kBytes - 1 of an accumulator rounded to T: one 8-byte A/B fragment.
template <typename T>
__device__ inline u32x2 fragment(const f32x16& x, int r0) {
  if constexpr (Element<T>::kBytes == 1) {
    const float y[8] = {x[r0], x[r0 + 1], x[r0 + 2], x[r0 + 3], x[r0 + 4], x[r0 + 5], x[r0 + 6], x[r0 + 7]};
    return Element<T>::pack8(y);
  } else {
    return pack4<T>(x[r0], x[r0 + 1], x[r0 + 2], x[r0 + 3]);
  }
}

}  // namespace arch
}  // namespace fmha
