// The split-KV combine (spec/inference.md §3.1): each query row of a split sequence merges its chunks'
// partial states (kvcache/split.h) in chunk order (common/merge_states.h) and writes O and the LSE where
// an unsplit forward would. One warp per (row, head); rows of unsplit sequences were written by the
// forward and are skipped. Hopper only for now (the AMD kernels do not split).
#pragma once

#include "arch/nvidia/tensor_core.h"
#include "arch/thread.h"
#include "common/merge_states.h"
#include "kvcache/page_table.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

constexpr int kCombineWarps = 4;

// O: the output's element type.
template <typename O>
__global__ void __launch_bounds__(kCombineWarps* arch::kWarpSize) kvcache_combine_kernel(fmha_kvcache_params p) {
  const int lane = static_cast<int>(arch::thread_index()) % arch::kWarpSize;
  const int warp = static_cast<int>(arch::thread_index()) / arch::kWarpSize;
  const int h = static_cast<int>(arch::block_index_y()), b = static_cast<int>(arch::block_index_z());
  const int64_t i = static_cast<int64_t>(arch::block_index_x()) * kCombineWarps + warp;
  kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
  const kvcache::Sequence s = kvcache::resolve(p, b, ignored);
  if (i >= s.sq) return;
  const kvcache::Chunks chunks = kvcache::chunks(p, s.kv_len);
  if (chunks.count <= 1) return;
  const int64_t row = kvcache::partial_row(p, s, b, i);
  const int64_t first = kvcache::partial_state(p, 0, h, row);
  const int64_t split_stride = static_cast<int64_t>(p.nhead_q) * p.partial_rows;
  const float* lse_in = reinterpret_cast<const float*>(p.partial_lse) + first;
  const float* o_in = reinterpret_cast<const float*>(p.partial_o) + first * p.hdim_v;
  const int count = static_cast<int>(chunks.count);
  const MergeScale scale = MergeScale::of(count, [&](int c) { return lse_in[c * split_stride]; });

  const int64_t batch = p.group_mode ? 0 : b;
  O* out = reinterpret_cast<O*>(p.o) + batch * p.o_batch_stride + h * p.o_head_stride + (s.q_start + i) * p.o_row_stride;
  for (int col = 2 * lane; col < p.hdim_v; col += 2 * arch::kWarpSize) {
    float x = 0.f, y = 0.f;
    for (int c = 0; c < count; ++c) {
      const float w = scale.weight(lse_in[c * split_stride]);
      if (w != 0.f || merge_math::is_nan(w)) {  // an empty chunk's O is not read
        const float2 v = *reinterpret_cast<const float2*>(o_in + c * split_stride * p.hdim_v + col);
        x += w * v.x;
        y += w * v.y;
      }
    }
    *reinterpret_cast<uint32_t*>(out + col) = arch::Element<O>::pack(x, y);
  }
  float* lse = reinterpret_cast<float*>(p.lse);
  if (lse != nullptr && lane == 0) {
    lse[(p.group_mode ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + s.q_start + i] = scale.lse;
  }
}

// Enqueues the combine of a splitting launcher's call (after its forward, on the same stream).
template <typename O>
int32_t launch_combine(const fmha_kvcache_params& p, hipStream_t stream) {
  if (p.max_splits <= 1) return 0;
  const dim3 grid((p.max_seqlen_q + kCombineWarps - 1) / kCombineWarps, p.nhead_q, p.batch);
  kvcache_combine_kernel<O><<<grid, kCombineWarps * arch::kWarpSize, 0, stream>>>(p);
  return static_cast<int32_t>(hipGetLastError());
}

}  // namespace fmha
