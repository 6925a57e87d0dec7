// Stage 3 of the backward: dQ = Σ_split dq_acc[split] over the slots holding partials (summed_splits),
// summed in split order (bit-reproducible), cast to the input type; batches without keys get dQ = 0
// without reading dq_acc (host twin: src/launch/host/backward/convert_dq.rs).
#pragma once

#include "arch/convert.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/schedule.h"
#include "bwd/workspace_view.h"
#include "common/sequence.h"
#include "common/zero_floats.h"

namespace fmha {

constexpr int kConvertThreads = 256;
constexpr int kConvertRows = 64;  // rows per block

template <bool kBf16>
__global__ void __launch_bounds__(kConvertThreads) convert_dq_kernel(fmha_bwd_params p) {
  if (!workspace_prepared(p)) return;
  const int h = arch::block_index_y(), b = arch::block_index_z();
  const BatchRows rows = batch_rows(p, b);
  const int64_t first = int64_t(arch::block_index_x()) * kConvertRows;
  if (first >= rows.sq) return;
  const int group = p.nhead_q / p.nhead_k;
  const int hk = h / group, g = h % group;
  const DqAccBlock acc = dq_acc_block(p, b);
  const int32_t splits = summed_splits(p, acc, b, hk);
  const float* dq_acc = dq_acc_region(p);
  const int64_t batch = p.group_mode ? 0 : b;
  uint16_t* dq = reinterpret_cast<uint16_t*>(p.dq) + batch * p.dq_batch_stride + h * p.dq_head_stride;
  const int quads = p.hdim_q / 4;
  const int64_t last = first + kConvertRows < rows.sq ? first + kConvertRows : rows.sq;
  for (int64_t e = arch::thread_index(); e < (last - first) * quads; e += kConvertThreads) {
    const int64_t i = first + e / quads;
    const int col = static_cast<int>(e % quads) * 4;
    Float4 sum = {0.f, 0.f, 0.f, 0.f};
    if (rows.sk > 0) {
      for (int split = 0; split < splits; ++split) {
        const Float4 x = *reinterpret_cast<const Float4*>(dq_acc + acc.index(hk, split, i, int64_t(g) * p.hdim_q + col));
        sum.x += x.x;
        sum.y += x.y;
        sum.z += x.z;
        sum.w += x.w;
      }
    }
    uint16_t* out = dq + (rows.q_start + i) * p.dq_row_stride + col;
    const uint32_t lo = arch::from_float<kBf16>(sum.x) | (uint32_t(arch::from_float<kBf16>(sum.y)) << 16);
    const uint32_t hi = arch::from_float<kBf16>(sum.z) | (uint32_t(arch::from_float<kBf16>(sum.w)) << 16);
    reinterpret_cast<uint32_t*>(out)[0] = lo;
    reinterpret_cast<uint32_t*>(out)[1] = hi;
  }
}

}  // namespace fmha
