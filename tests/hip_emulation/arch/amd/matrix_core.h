// CPU emulation of hip/arch/amd/matrix_core.h: the same interface; MFMA and the lane exchange follow
// the documented register layouts (l = lane, h = l / 32):
//   32x32x8 : A[i][k] = lane i + 32 (k / 4), element k % 4; B[k][j] = lane j + 32 (k / 4), element k % 4
//   32x32x16: A[i][k] = lane i + 32 (k / 8), element k % 8; B likewise (16-bit: EMU_GFX950; fp8: both)
//   C[i][j]  = lane j + 32 ((i / 4) % 2), register 4 (i / 8) + i % 4
#pragma once
#include <math.h>
#include <string.h>
#include <type_traits>
#include <unordered_map>
#include "arch/platform.h"
#include "arch/thread.h"
#include "emu_runtime.h"

namespace fmha {
namespace arch {

#if defined(EMU_GFX950)
constexpr int kLdsBytes = 160 * 1024;
#else
constexpr int kLdsBytes = 64 * 1024;
#endif

#define FMHA_AMD_MIN_WAVES_PER_SIMD(waves)
typedef uint32_t u32x2 __attribute__((ext_vector_type(2)));
typedef uint32_t u32x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef float f32x16 __attribute__((ext_vector_type(16)));
typedef uint8_t lds_byte;

inline size_t g_lds_size = 0;
inline void check_lds(uint32_t offset, uint32_t bytes) {
  if (offset % bytes != 0 || offset + bytes > g_lds_size) __builtin_trap();
}
inline uint8_t* g_lds = nullptr;
// Poisons the LDS the first time a workgroup uses it (emu::launch clears g_lds before each; the first
// work-item to get here does it before any store).
inline lds_byte* lds_pointer(void* shared) {
  if (g_lds != shared) {
    g_lds = (uint8_t*)shared;
    memset(g_lds, 0xff, g_lds_size);
  }
  return g_lds;
}
inline u32x2 lds_load_8(const lds_byte* base, uint32_t offset) {
  check_lds(offset, 8);
  u32x2 v;
  memcpy(&v, base + offset, 8);
  return v;
}
inline void lds_store_8(lds_byte* base, uint32_t offset, u32x2 v) {
  check_lds(offset, 8);
  memcpy(base + offset, &v, 8);
}
inline u32x4 lds_load_16(const lds_byte* base, uint32_t offset) {
  check_lds(offset, 16);
  u32x4 v;
  memcpy(&v, base + offset, 16);
  return v;
}
inline void lds_store_4(lds_byte* base, uint32_t offset, uint32_t v) {
  check_lds(offset, 4);
  memcpy(base + offset, &v, 4);
}
inline void lds_store_2(lds_byte* base, uint32_t offset, uint16_t v) {
  check_lds(offset, 2);
  memcpy(base + offset, &v, 2);
}
template <typename T>
inline T* global_pointer(uint64_t address) { return (T*)address; }

// Global accesses are checked against the registered buffers.
struct Region { const uint8_t* lo; size_t bytes; };
inline std::vector<Region> g_buffers;
inline void check_global(const void* p, size_t n) {
  const uint8_t* b = (const uint8_t*)p;
  if ((uintptr_t)b % n != 0) __builtin_trap();
  for (auto& buf : g_buffers) if (b >= buf.lo && b + n <= buf.lo + buf.bytes) return;
  __builtin_trap();
}
inline u32x4 global_load_16(const void* p) { check_global(p, 16); u32x4 v; memcpy(&v, p, 16); return v; }
inline u32x2 global_load_8(const void* p) { check_global(p, 8); u32x2 v; memcpy(&v, p, 8); return v; }
inline uint32_t global_load_4(const void* p) { check_global(p, 4); uint32_t v; memcpy(&v, p, 4); return v; }
inline void global_store_8(void* p, u32x2 v) { check_global(p, 8); memcpy(p, &v, 8); }
inline void global_store_16(void* p, u32x4 v) { check_global(p, 16); memcpy(p, &v, 16); }

// Raw buffers: loads at or past `bytes` read zeros; a load that straddles the end is a kernel bug here
// (the kernels keep every load wholly inside or wholly past).
struct Buffer { const uint8_t* base; uint32_t bytes; };
inline Buffer make_buffer(const void* base, uint32_t bytes) { return Buffer{(const uint8_t*)base, bytes}; }
template <typename V>
inline V buffer_load(Buffer b, uint32_t offset) {
  V v;
  if (offset >= b.bytes) {
    memset(&v, 0, sizeof v);
    return v;
  }
  if (offset + sizeof v > b.bytes) __builtin_trap();
  check_global(b.base + offset, sizeof v);
  memcpy(&v, b.base + offset, sizeof v);
  return v;
}
inline u32x4 buffer_load_16(Buffer b, uint32_t offset) { return buffer_load<u32x4>(b, offset); }
inline u32x2 buffer_load_8(Buffer b, uint32_t offset) { return buffer_load<u32x2>(b, offset); }
inline uint32_t buffer_load_4(Buffer b, uint32_t offset) { return buffer_load<uint32_t>(b, offset); }

// Atomic adds (fibers never interleave inside one). With g_owners set, each address records the first
// (workgroup, work-item) that adds to it, and an add by another counts in g_owner_conflicts: the
// deterministic mode's "one work-item per element" rule.
inline std::unordered_map<const float*, uint64_t>* g_owners = nullptr;
inline size_t g_owner_conflicts = 0;
inline void global_atomic_add(float* p, float x) {
  check_global(p, 4);
  *p += x;
  if (g_owners) {
    const uint64_t who = ((uint64_t(emu::g_block[2]) * emu::g_grid[1] + emu::g_block[1]) * emu::g_grid[0] +
                          emu::g_block[0]) * 1024 + emu::current().tid;
    const auto [it, inserted] = g_owners->emplace(p, who);
    if (!inserted && it->second != who) ++g_owner_conflicts;
  }
}

// Kernel parameters: the compiler hint is no-op here.
template <typename Params>
inline const Params& reloaded(const Params& params) { return params; }

inline f32x16 zero_accumulator() { return f32x16(0.f); }

inline int lane() { return thread_index() % 64; }
inline emu::Wave& wave() { return emu::g_waves[thread_index() / 64]; }

// Lane 0's value in every lane, as v_readfirstlane gives it; where the type has no padding, every lane
// must have passed the same bytes.
template <typename T>
inline T wave_uniform(const T& x) {
  static_assert(sizeof(T) <= sizeof(emu::Wave::bytes[0]), "exchange slot");
  emu::Wave& w = wave();
  memcpy(w.bytes[lane()], &x, sizeof(T));
  w.bar.wait();
  if (std::has_unique_object_representations_v<T> && memcmp(w.bytes[lane()], w.bytes[0], sizeof(T)) != 0) {
    __builtin_trap();
  }
  T y = x;
  memcpy(&y, w.bytes[0], sizeof(T));
  w.bar.wait();
  return y;
}

inline float other_half(float x) {
  emu::Wave& w = wave();
  memcpy(&w.slot[lane()][0], &x, 4);
  w.bar.wait();
  float y;
  memcpy(&y, &w.slot[lane() ^ 32][0], 4);
  w.bar.wait();
  return y;
}
inline uint32_t lane_value(uint32_t x, int source) {
  if (source < 0 || source >= 64) __builtin_trap();
  emu::Wave& w = wave();
  w.slot[lane()][0] = x;
  w.bar.wait();
  const uint32_t y = w.slot[source][0];
  w.bar.wait();
  return y;
}
inline float halves_max(float x) { return fmaxf(x, other_half(x)); }
inline float halves_sum(float x) { return x + other_half(x); }
inline float fast_exp2(float x) { return exp2f(x); }
inline float exact_exp2(float x) { return exp2f(x); }
inline float exact_log2(float x) { return log2f(x); }

struct Half {};
struct BFloat16 {};

inline float half_to_float(uint16_t b) { _Float16 h; memcpy(&h, &b, 2); return (float)h; }
inline float bf16_to_float(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

// One MFMA over the wave: each lane's kK elements (codes of `Code`: 16 or 8 bits) of A and B.
template <int kK, typename Code>
inline void emulate_mfma(f32x16& c, const Code* a, const Code* b, float (*to_float)(Code)) {
  emu::Wave& w = wave();
  const int l = lane();
  memcpy(&w.slot[l][0], a, sizeof(Code) * kK);
  memcpy(&w.slot[l][8], b, sizeof(Code) * kK);
  w.bar.wait();
  f32x16 d = c;
  const int j = l % 32;
  for (int r = 0; r < 16; ++r) {
    const int i = 8 * (r / 4) + 4 * (l / 32) + r % 4;
    float acc = 0.f;
    for (int k = 0; k < 2 * kK; ++k) {
      Code ai, bj;
      memcpy(&ai, (const uint8_t*)&w.slot[i + 32 * (k / kK)][0] + sizeof(Code) * (k % kK), sizeof(Code));
      memcpy(&bj, (const uint8_t*)&w.slot[j + 32 * (k / kK)][8] + sizeof(Code) * (k % kK), sizeof(Code));
      acc += to_float(ai) * to_float(bj);
    }
    d[r] += acc;
  }
  w.bar.wait();
  c = d;
}

template <typename Derived>
struct MmaOps {
  static constexpr int kBytes = 2;
  static constexpr float kPShift = 0.f;
  static void mma(f32x16& c, u32x2 a, u32x2 b) {
    emulate_mfma<4>(c, (const uint16_t*)&a, (const uint16_t*)&b, &Derived::to_float);
  }
  static void mma2(f32x16& c, u32x2 a0, u32x2 a1, u32x2 b0, u32x2 b1) {
#if defined(EMU_GFX950)
    const u32x4 a = {a0.x, a0.y, a1.x, a1.y}, b = {b0.x, b0.y, b1.x, b1.y};
    emulate_mfma<8>(c, (const uint16_t*)&a, (const uint16_t*)&b, &Derived::to_float);
#else
    mma(c, a0, b0);
    mma(c, a1, b1);
#endif
  }
};

template <typename T> struct Element;
template <> struct Element<Half> : MmaOps<Element<Half>> {
  typedef Half Output;
  static uint32_t bits(float x) { _Float16 h = (_Float16)x; uint16_t b; memcpy(&b, &h, 2); return b; }
  static float to_float(uint16_t b) { return half_to_float(b); }
};
template <> struct Element<BFloat16> : MmaOps<Element<BFloat16>> {
  typedef BFloat16 Output;
  static uint32_t bits(float x) {
    uint32_t u; memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  }
  static float to_float(uint16_t b) { return bf16_to_float(b); }
};

// fp8 e4m3 in the emulated architecture's encoding: gfx942 FNUZ (bias 8, 0x80 the only NaN, no
// infinity, no -0, largest 240), gfx950 OCP e4m3fn (bias 7, 0x7f / 0xff NaN, no infinity, largest 448).
struct Fp8E4m3 {};
#if defined(EMU_GFX950)
constexpr int kFp8Bias = 7;
constexpr float kFp8Max = 448.f;
#else
constexpr int kFp8Bias = 8;
constexpr float kFp8Max = 240.f;
#endif

inline float fp8_to_float(uint8_t b) {
  const bool fnuz = kFp8Bias == 8;
  if (fnuz ? b == 0x80 : (b & 0x7f) == 0x7f) return NAN;
  const int e = (b >> 3) & 15, m = b & 7;
  const float magnitude = e == 0 ? ldexpf((float)m, 1 - kFp8Bias - 3) : ldexpf(8.f + m, e - kFp8Bias - 3);
  return (b & 0x80) ? -magnitude : magnitude;
}

// v_cvt_pk_fp8_f32 without clamp: round to nearest even, subnormals kept. The kernels convert only
// 2^kPShift · P, within range and not NaN: anything else traps here.
inline uint8_t fp8_bits(float x) {
  if (!(fabsf(x) <= kFp8Max)) __builtin_trap();
  const double a = fabs((double)x);
  uint32_t code;
  if (a < ldexp(1.0, 1 - kFp8Bias)) {
    code = (uint32_t)nearbyint(ldexp(a, kFp8Bias + 2));  // subnormal steps of 2^(-bias-2); 8 = the least normal
  } else {
    int e;
    frexp(a, &e);  // a = f · 2^e, f in [0.5, 1)
    const uint32_t steps = (uint32_t)nearbyint(ldexp(a, 4 - e));  // 8..16: 1.mmm in eighths
    code = (uint32_t)(e - 1 + kFp8Bias) * 8 + (steps - 8);  // steps 16 carries into the exponent
  }
  if (code == 0) return 0;  // FNUZ has no -0 (0x80 is its NaN); +0 in either
  return (uint8_t)(code | (x < 0 ? 0x80u : 0u));
}

template <> struct Element<Fp8E4m3> {
  static constexpr int kBytes = 1;
  static constexpr float kPShift = kFp8Bias == 7 ? 8.f : 7.f;
  typedef BFloat16 Output;
  static u32x2 pack8(const float* x) {
    uint8_t b[8];
    for (int e = 0; e < 8; ++e) b[e] = fp8_bits(x[e]);
    u32x2 f;
    memcpy(&f, b, 8);
    return f;
  }
  static float to_float(uint8_t b) { return fp8_to_float(b); }
  static void mma(f32x16& c, u32x2 a, u32x2 b) {
    emulate_mfma<8>(c, (const uint8_t*)&a, (const uint8_t*)&b, &to_float);
  }
  static void mma2(f32x16& c, u32x2 a0, u32x2 a1, u32x2 b0, u32x2 b1) {
    mma(c, a0, b0);
    mma(c, a1, b1);
  }
};

template <typename T>
inline u32x2 pack4(float x0, float x1, float x2, float x3) {
  using E = Element<T>;
  return u32x2{E::bits(x0) | (E::bits(x1) << 16), E::bits(x2) | (E::bits(x3) << 16)};
}

template <typename T>
inline u32x2 fragment(const f32x16& x, int r0) {
  if constexpr (Element<T>::kBytes == 1) {
    const float y[8] = {x[r0], x[r0 + 1], x[r0 + 2], x[r0 + 3], x[r0 + 4], x[r0 + 5], x[r0 + 6], x[r0 + 7]};
    return Element<T>::pack8(y);
  } else {
    return pack4<T>(x[r0], x[r0 + 1], x[r0 + 2], x[r0 + 3]);
  }
}

}  // namespace arch
}  // namespace fmha
