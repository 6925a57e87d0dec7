// The split-KV combine (spec/inference.md §3.1): each query row of a split sequence merges its chunks'
// partial states (kvcache/split.h) in chunk order (common/merge_states.h) and writes O and the LSE where
// an unsplit forward would. One wave per (row, head); rows of unsplit sequences were written by the
// forward and are skipped. Arch-neutral: the same source for sm_90a and gfx942/gfx950.
#pragma once

#include "arch/convert.h"
#include "arch/thread.h"
#include "common/merge_states.h"
#include "kvcache/page_table.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

constexpr int kCombineWaves = 4;

// kBf16: the output is bf16, else fp16.
template <bool kBf16>
__global__ void __launch_bounds__(kCombineWaves* arch::kWaveSize) kvcache_combine_kernel(fmha_kvcache_params p) {
  const int lane = static_cast<int>(arch::thread_index()) % arch::kWaveSize;
  const int wave = static_cast<int>(arch::thread_index()) / arch::kWaveSize;
  const int h = static_cast<int>(arch::block_index_y()), b = static_cast<int>(arch::block_index_z());
  const int64_t i = static_cast<int64_t>(arch::block_index_x()) * kCombineWaves + wave;
  kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
  const kvcache::Sequence s = kvcache::resolve(p, b, ignored);
  if (i >= s.sq) return;
  const kvcache::Chunks chunks = kvcache::chunks(p, s.kv_len);
  if (chunks.count <= 1) return;
  const int64_t row = kvcache::partial_row(p, s.q_start, b, i);
  const int64_t first = kvcache::partial_state(p, 0, h, row);
  const int64_t split_stride = static_cast<int64_t>(p.nhead_q) * p.partial_rows;
  const float* lse_in = reinterpret_cast<const float*>(p.partial_lse) + first;
  const float* o_in = reinterpret_cast<const float*>(p.partial_o) + first * p.hdim_v;
  const int count = static_cast<int>(chunks.count);
  const MergeScale scale = MergeScale::of(count, [&](int c) { return lse_in[c * split_stride]; });

  const int64_t batch = p.group_mode ? 0 : b;
  uint16_t* out =
      reinterpret_cast<uint16_t*>(p.o) + batch * p.o_batch_stride + h * p.o_head_stride + (s.q_start + i) * p.o_row_stride;
  for (int col = 2 * lane; col < p.hdim_v; col += 2 * arch::kWaveSize) {
    float x = 0.f, y = 0.f;
    for (int c = 0; c < count; ++c) {
      const float w = scale.weight(lse_in[c * split_stride]);
      if (w != 0.f || merge_math::is_nan(w)) {  // an empty chunk's O is not read
        const float* v = o_in + c * split_stride * p.hdim_v + col;
        x += w * v[0];
        y += w * v[1];
      }
    }
    *reinterpret_cast<uint32_t*>(out + col) =
        uint32_t(arch::from_float<kBf16>(x)) | (uint32_t(arch::from_float<kBf16>(y)) << 16);
  }
  float* lse = reinterpret_cast<float*>(p.lse);
  if (lse != nullptr && lane == 0) {
    lse[(p.group_mode ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + s.q_start + i] = scale.lse;
  }
}

}  // namespace fmha
