// The forward's epilogue on Hopper (sm_90a): normalise a warp's O rows and store them with the
// natural-log LSE; a split sequence's partial state (kvcache/split.h) goes to the workspace in fp32.
#pragma once

#include <type_traits>

#include "arch/nvidia/tensor_core.h"
#include "common/sequence.h"
#include "fwd/sm90/mainloop.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

// Where a thread's two fragment rows go: tile rows `row_of` (rows from `tile_rows` on are not
// written), their query rows `query_of` and heads `head_of(row)`, in sequence `b` whose rows start at
// `rows.q_start` of batch `batch`. `out_scale`: O's descale (fp8 V). `partial`: the CTA computed split
// `split` of its sequence (kv cache only; `seq_q_start` locates its partial rows).
template <typename Tile, typename Params, typename HeadOf>
__device__ inline void store_output(const Params& p, const RowState<Tile>& st, float scale_log2, float out_scale,
                                    const int64_t (&row_of)[2], const int64_t (&query_of)[2], int64_t tile_rows,
                                    const HeadOf& head_of, const BatchRows& rows, int b, int64_t batch, int t,
                                    bool partial, int split, int64_t seq_q_start) {
  using O = typename Tile::Output;
  constexpr int kDTiles = Tile::kDim / 8;
  O* out = reinterpret_cast<O*>(p.o) + batch * p.o_batch_stride;
  float* lse = reinterpret_cast<float*>(p.lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = arch::quad_sum(st.row_sum[r]);
    if (row_of[r] >= tile_rows) continue;
    const int64_t i = query_of[r];
    const int h = head_of(row_of[r]);
    const float inverse = sum > 0.f ? out_scale / sum : 0.f;
    // LSE = ln(Σ exp(scale · S)) = (scale_log2 · max + log2 Σ) · ln 2, Σ in units of 2^-kPShift
    // (one explicit FMA: the dense and the paged kernels must round it alike)
    const float natural =
        sum > 0.f ? fmaf(st.row_max[r], scale_log2, log2f(sum) - Tile::kPShift) * 0.69314718055994531f : -INFINITY;
    if constexpr (std::is_same_v<Params, fmha_kvcache_params>) {
      if (partial) {
        const int64_t state = kvcache::partial_state(p, split, h, kvcache::partial_row(p, seq_q_start, b, i));
        float* o_state = reinterpret_cast<float*>(p.partial_o) + state * p.hdim_v;
#pragma unroll
        for (int n = 0; n < kDTiles; ++n) {
          const int col = n * 8 + 2 * t;
          if (col < p.hdim_v) {
            *reinterpret_cast<float2*>(o_state + col) = make_float2(st.o[n][2 * r] * inverse, st.o[n][2 * r + 1] * inverse);
          }
        }
        if (t == 0) reinterpret_cast<float*>(p.partial_lse)[state] = natural;
        continue;
      }
    } else {
      (void)partial, (void)split, (void)seq_q_start;
    }
    O* out_row = out + h * p.o_head_stride + (rows.q_start + i) * p.o_row_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      const int col = n * 8 + 2 * t;
      if (col < p.hdim_v) {
        *reinterpret_cast<uint32_t*>(out_row + col) =
            arch::Element<O>::pack(st.o[n][2 * r] * inverse, st.o[n][2 * r + 1] * inverse);
      }
    }
    if (lse != nullptr && t == 0) {
      lse[(p.group_mode ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + rows.q_start + i] = natural;
    }
  }
}

}  // namespace fmha
