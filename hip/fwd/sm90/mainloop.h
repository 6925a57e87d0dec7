// The forward's mainloop on Hopper (sm_90a): one K/V tile for one warpgroup (S = Q·Kᵀ on wgmma, the
// mask of edge tiles, the online softmax, O += P·V) and the per-thread running state it updates.
#pragma once

#include "arch/nvidia/tensor_core.h"
#include "arch/nvidia/warpgroup.h"
#include "common/sequence.h"
#include "fwd/sm90/tile.h"

namespace fmha {

// The running state of one thread's share of its warp's 16 query rows: the O accumulator and the
// online softmax statistics (in the exp2 domain of unscaled scores: max is of raw S, times the tile's K
// descale with per-page descales).
template <typename Tile>
struct RowState {
  float o[Tile::kDim / 8][4];
  float row_max[2];
  float row_sum[2];

  // The state before any key: O = 0, max = -inf, sum = 0.
  __device__ void clear() {
#pragma unroll
    for (int n = 0; n < Tile::kDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }
};

// The keys each of a thread's two fragment rows keeps: positions [lo, hi] of the sequence (hi < sk).
// Computed once per CTA, so that an edge tile's mask is two 32-bit compares per element.
struct KeptKeys {
  int64_t lo[2], hi[2];

  template <bool kMasked>
  __device__ static KeptKeys of(const ResolvedMask& mask, const int64_t (&query)[2], int64_t sk) {
    KeptKeys k;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      k.lo[r] = kMasked ? query[r] + mask.off - mask.left : 0;
      k.hi[r] = kMasked ? min(query[r] + mask.off + mask.right, sk - 1) : sk - 1;
    }
    return k;
  }
};

// Edge tiles: scores of keys the rows do not keep become -inf (the interior path compiles this out).
template <typename Tile, int kNTiles>
__device__ inline void mask_scores(float (&s)[kNTiles][4], const KeptKeys& kept, int64_t j0, int t) {
  constexpr int64_t N = kNTiles * 8;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // The row's kept columns of this tile, [lo, hi] (empty when lo > hi).
    const int lo = static_cast<int>(max(min(kept.lo[r] - j0, N), int64_t{0}));
    const int hi = static_cast<int>(max(min(kept.hi[r] - j0, N - 1), int64_t{-1}));
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = n * 8 + 2 * t + e;
        if (c < lo || c > hi) s[n][2 * r + e] = -INFINITY;
      }
    }
  }
}

// The online softmax of one tile of raw scores: P = 2^(scale_log2 · (S - max)) in place of S (one FFMA
// and one EX2 per element), the running max and sum updated. Returns, per row, the factor the O
// accumulator must be multiplied by before this tile's P·V is added to it. Per-page descales
// (Tile::kPageScales): `tile_dk`, this tile's K descale, and `o_rescale`, the previous tile's V descale
// over this one's (O is kept in units of the current tile's V descale).
template <typename Tile, int kNTiles>
__device__ inline float2 online_softmax(RowState<Tile>& st, float (&s)[kNTiles][4], float scale_log2, float tile_dk,
                                        float o_rescale) {
  const float coefficient = Tile::kPageScales ? scale_log2 * tile_dk : scale_log2;
  float o_correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    tile_max = arch::quad_max(tile_max);
    if constexpr (Tile::kPageScales) tile_max *= tile_dk;  // dk > 0: the max of S · dk
    const float new_max = fmaxf(st.row_max[r], tile_max);
    // A row with every key so far masked keeps max = -inf; 0 keeps the exponent away from NaN.
    const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;
    // Exact exp2 here: the running sum is rescaled by this factor on every tile whose max grows, and
    // the approximate one's ~2^-22 error compounds over the tiles into the LSE (O cancels it).
    const float correction = exp2f(st.row_max[r] * scale_log2 - base);
    const float p_base = base - Tile::kPShift;  // P in units of 2^-kPShift
    st.row_max[r] = new_max;
    st.row_sum[r] *= correction;
    o_correction[r] = Tile::kPageScales ? correction * o_rescale : correction;
    // The tile's sum first, then one add into the running sum: thousands of keys would otherwise
    // accumulate one rounding each.
    float tile_sum = 0.f;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      s[n][2 * r] = arch::fast_exp2(fmaf(s[n][2 * r], coefficient, -p_base));
      s[n][2 * r + 1] = arch::fast_exp2(fmaf(s[n][2 * r + 1], coefficient, -p_base));
      tile_sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    st.row_sum[r] += tile_sum;
  }
  return make_float2(o_correction[0], o_correction[1]);
}

template <typename Tile>
__device__ inline void rescale_output(RowState<Tile>& st, float2 correction) {
#pragma unroll
  for (int n = 0; n < Tile::kDim / 8; ++n) {
    st.o[n][0] *= correction.x;
    st.o[n][1] *= correction.x;
    st.o[n][2] *= correction.y;
    st.o[n][3] *= correction.y;
  }
}

// One K/V tile for one warpgroup: S = Q·Kᵀ, mask (edge tiles only: the masks are compiled out of the
// interior path), online softmax, O += P·V. `q`, `k`, `v`: the descriptors of the warpgroup's Q rows
// and of this stage's K and V (8-bit inputs: Vᵀ) tiles; `under_s()` runs while S is computed (8-bit
// inputs: the CTA's transpose of V into the Vᵀ tile, with the barrier that publishes it). Per-page
// descales: as online_softmax.
template <typename Tile, typename T, bool kEdge, typename UnderS>
__device__ inline void attend_tile(RowState<Tile>& st, uint64_t q, uint64_t k, uint64_t v, float scale_log2,
                                   float tile_dk, float o_rescale, const KeptKeys& kept, int64_t j0, int t,
                                   const UnderS& under_s) {
  constexpr int N = Tile::kBlockN, D = Tile::kDim, kNTiles = N / 8;

  float s[kNTiles][4];
  arch::warpgroup_fence();
  arch::mma_rows_by_rows<T, D, Tile::QLayout::kBlockBytes, Tile::KLayout::kBlockBytes>(s, q, k);
  arch::warpgroup_commit();
  under_s();
  arch::warpgroup_wait<0>();
  arch::hold_registers(s);
  if (kEdge) mask_scores<Tile>(s, kept, j0, t);
  rescale_output(st, online_softmax(st, s, scale_log2, tile_dk, o_rescale));

  // O += P·V: P's accumulator layout is (up to a permutation of the keys, for 8-bit types) the
  // A-fragment layout of a wgmma step.
  constexpr int kSteps = N * Tile::kElementBytes / arch::kStepBytes;
  uint32_t p[kSteps][4];
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) arch::a_fragment<T>(p[kk], s, kk);
  arch::warpgroup_fence();
  if constexpr (Tile::kTransposeV) {
    arch::mma_registers_by_rows<T, kSteps, Tile::VtLayout::kBlockBytes>(st.o, p, v);
  } else {
    arch::mma_registers_by_columns<T>(st.o, p, v);
  }
  arch::warpgroup_commit();
  arch::warpgroup_wait<0>();
  arch::hold_registers(st.o);
}

}  // namespace fmha
