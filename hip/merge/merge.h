// The standalone merge of attention states (spec/inference.md §3.5; the host twin is
// src/launch/host/merge.rs): one wave per (row, head), in a grid-stride loop, merges the row's states
// in state order by the rule of common/merge_states.h and writes O (one rounding to the output type)
// and the LSE. Arch-neutral: the same source for sm_90a and gfx942/gfx950 (merge/merge.hip launches
// it; tests/hip_emulation/merge.cpp runs it on the CPU as AMD would). Rows move in vectors of up to
// 16 bytes per lane when the addresses and strides allow it, else element by element.
#pragma once

#include "arch/convert.h"
#include "arch/platform.h"
#include "arch/thread.h"
#include "common/merge_states.h"
#include "launch.h"

namespace fmha {
namespace merge {

constexpr int kWaves = 4;                // waves per workgroup
constexpr int kFp16 = 0, kBf16 = 1, kFp32 = 2;  // FMHA_DTYPE_* of states and outputs

// Storage of an element type and its conversions to and from fp32 (round to nearest even).
template <int kDtype>
struct Storage {
  typedef uint16_t T;
  __device__ static float load(T bits) { return arch::to_float<kDtype == kBf16>(bits); }
  __device__ static T store(float x) { return arch::from_float<kDtype == kBf16>(x); }
};
template <>
struct Storage<kFp32> {
  typedef float T;
  __device__ static float load(T x) { return x; }
  __device__ static T store(float x) { return x; }
};

// kN elements moved as one access.
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

// Columns per lane per access on the vector path: at most 16 bytes of the wider of the two types.
template <int kIn, int kOut>
constexpr int vector_columns() {
  return 16 / (sizeof(typename Storage<kIn>::T) > sizeof(typename Storage<kOut>::T) ? sizeof(typename Storage<kIn>::T)
                                                                                      : sizeof(typename Storage<kOut>::T));
}

template <int kIn, int kOut, int kN>
__global__ void __launch_bounds__(kWaves* arch::kWaveSize) merge_kernel(fmha_merge_params p) {
  typedef typename Storage<kIn>::T In;
  typedef typename Storage<kOut>::T Out;
  const int lane = static_cast<int>(arch::thread_index()) % arch::kWaveSize;
  const int wave = static_cast<int>(arch::thread_index()) / arch::kWaveSize;
  const bool base2 = p.lse_base2 != 0;
  const int64_t items = static_cast<int64_t>(p.num_rows) * p.nhead;
  const int64_t step = static_cast<int64_t>(arch::grid_blocks_x()) * kWaves;
  // The item is wave-uniform: every lane of a wave takes the same path, barriers included.
  for (int64_t item = static_cast<int64_t>(arch::block_index_x()) * kWaves + wave; item < items; item += step) {
    const int64_t row = item / p.nhead, head = item % p.nhead;
    const float* lse_in =
        reinterpret_cast<const float*>(p.lse_in) + head * p.lse_in_head_stride + row * p.lse_in_row_stride;
    const In* o_in = reinterpret_cast<const In*>(p.o_in) + head * p.o_in_head_stride + row * p.o_in_row_stride;
    Out* o_out = reinterpret_cast<Out*>(p.o_out) + head * p.o_out_head_stride + row * p.o_out_row_stride;
    const auto lse = [&](int s) { return lse_to_natural(lse_in[s * p.lse_in_state_stride], base2); };
    const MergeScale scale = MergeScale::of(p.num_states, lse);
    for (int col = lane * kN; col < p.hdim; col += kN * arch::kWaveSize) {
      float acc[kN];
#pragma unroll
      for (int e = 0; e < kN; ++e) acc[e] = 0.f;
      for (int s = 0; s < p.num_states; ++s) {
        const float w = scale.weight(lse(s));
        if (w != 0.f || merge_math::is_nan(w)) {  // an empty state's O is not read
          const Pack<In, kN> x = *reinterpret_cast<const Pack<In, kN>*>(o_in + s * p.o_in_state_stride + col);
#pragma unroll
          for (int e = 0; e < kN; ++e) acc[e] += w * Storage<kIn>::load(x.v[e]);
        }
      }
      Pack<Out, kN> y;
#pragma unroll
      for (int e = 0; e < kN; ++e) y.v[e] = Storage<kOut>::store(acc[e]);
      *reinterpret_cast<Pack<Out, kN>*>(o_out + col) = y;
    }
    if (p.lse_out != 0) {
      arch::wave_barrier();  // lse_out may be state 0's LSE, which every lane has read
      if (lane == 0) {
        float* lse_out = reinterpret_cast<float*>(p.lse_out);
        lse_out[head * p.lse_out_head_stride + row * p.lse_out_row_stride] = lse_from_natural(scale.lse, base2);
      }
    }
  }
}

// Whether rows of kN columns can move as single accesses: both bases aligned to a whole access, every
// stride and the row length multiples of kN.
template <int kIn, int kOut, int kN>
inline bool vectorizable(const fmha_merge_params& p) {
  const auto aligned = [](uint64_t address, size_t bytes) { return address % bytes == 0; };
  const int64_t strides[] = {p.o_in_state_stride, p.o_in_head_stride, p.o_in_row_stride,
                             p.o_out_head_stride, p.o_out_row_stride, p.hdim};
  for (const int64_t s : strides) {
    if (s % kN != 0) return false;
  }
  return kN > 1 && aligned(p.o_in, sizeof(typename Storage<kIn>::T) * kN) &&
         aligned(p.o_out, sizeof(typename Storage<kOut>::T) * kN);
}

}  // namespace merge
}  // namespace fmha
