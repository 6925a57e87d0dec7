// The attention forward mainloop on NVIDIA tensor cores (mma.sync m16n8k16, ldmatrix, cp.async):
// FlashAttention-2's algorithm.
//
// One CTA computes a tile of kBlockM query rows of one (batch, query head): one warp per 16 rows.
// The Q tile is loaded once and kept in registers as MMA A-fragments. K and V tiles of kBlockN rows
// stream through a double-buffered, XOR-swizzled shared-memory ring (the copy of tile j+1 is in flight
// while tile j is computed). Per tile: S = Q·Kᵀ (fp32), mask on edge tiles, online softmax in the exp2
// domain, P rounded to the input type as the A operand of O += P·V. Fully masked tiles are never
// visited. Rows with no kept key get O = 0 and LSE = -inf.
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/thread.h"
#include "common/sequence.h"
#include "fwd/fwd_params.h"

namespace fmha {

template <typename T, int kHeadDim, int kBlockN_, bool kMasked_, int kWarps_, bool kSkipSettledRescale_>
struct ForwardTile {
  static constexpr int kWarps = kWarps_;
  // Test once per tile whether any row's max moved before rescaling O (a warp vote and a branch).
  // Measured on an H200: worth it at D = 64 (causal S = 16k: 285 -> 313 TFLOPS), a loss at D = 128
  // (320 -> 287: the branch splits the softmax the scheduler otherwise interleaves with the MMAs).
  static constexpr bool kSkipSettledRescale = kSkipSettledRescale_;
  static constexpr int kBlockM = kWarps * 16;
  static constexpr int kBlockN = kBlockN_;
  static constexpr bool kMasked = kMasked_;
  static constexpr int kThreads = kWarps * arch::kWarpSize;
  static constexpr int kDim = kHeadDim;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static_assert(kChunks >= 8 && kChunks % 8 == 0, "the swizzle needs rows of a multiple of 128 bytes");
  static_assert(kBlockM == kWarps * 16, "one 16-row MMA tile per warp");
  // Shared memory, in elements: Q, then two stages of K and of V.
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKVElems = kBlockN * kHeadDim;
  static constexpr int kSharedBytes = (kQElems + 4 * kKVElems) * 2;
};

// The running state of one warp's 16 query rows: Q fragments, the O accumulator and the online
// softmax statistics (in the exp2 domain of unscaled scores: max is of raw S).
template <typename Tile>
struct RowState {
  static constexpr int kDTiles = Tile::kDim / 8;
  uint32_t q[Tile::kDim / 16][4];
  float o[kDTiles][4];
  float row_max[2];
  float row_sum[2];
};

// One K/V tile for one warp: S = Q·Kᵀ, mask (edge tiles only: the masks are compiled out of the
// interior path), online softmax, O += P·V.
template <typename Tile, typename T, bool kEdge>
__device__ inline void attend_tile(RowState<Tile>& st, uint32_t k_tile, uint32_t v_tile,
                                   const LaneAddress<Tile::kChunks>& k_lane, const LaneAddress<Tile::kChunks>& v_lane,
                                   float scale_log2, const ResolvedMask& mask, int64_t j0, int64_t sk,
                                   const int64_t (&row_of)[2], int t) {
  using E = arch::Element<T>;
  constexpr int N = Tile::kBlockN, D = Tile::kDim, kNTiles = N / 8, kDTiles = D / 8;

  float s[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t r[4];
      arch::load_matrix_x4(r, k_tile + k_lane.at(nn, kk));
      E::mma(s[2 * nn], st.q[kk], r[0], r[1]);
      E::mma(s[2 * nn + 1], st.q[kk], r[2], r[3]);
    }
  }

  if (kEdge) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = row_of[e / 2], j = j0 + n * 8 + 2 * t + (e & 1);
        const bool keep = Tile::kMasked ? mask.kept(i, j, sk) : j < sk;
        if (!keep) s[n][e] = -INFINITY;
      }
    }
  }

  // Online softmax on raw scores: P = 2^(scale_log2 · (S - max)), one FFMA and one EX2 per element.
  float correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) tile_max = fmaxf(tile_max, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    tile_max = arch::quad_max(tile_max);
    const float new_max = fmaxf(st.row_max[r], tile_max);
    // A row with every key so far masked keeps max = -inf; 0 keeps the exponent away from NaN.
    const float base = new_max == -INFINITY ? 0.f : new_max * scale_log2;
    // Exact exp2 here: the running sum is rescaled by this factor on every tile whose max grows, and
    // the approximate one's ~2^-22 error compounds over the tiles into the LSE (O cancels it).
    correction[r] = exp2f(st.row_max[r] * scale_log2 - base);
    st.row_max[r] = new_max;
    st.row_sum[r] *= correction[r];
    if constexpr (!Tile::kSkipSettledRescale) {
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        st.o[n][2 * r] *= correction[r];
        st.o[n][2 * r + 1] *= correction[r];
      }
    }
    // The tile's sum first, then one add into the running sum: thousands of keys would otherwise
    // accumulate one rounding each.
    float tile_sum = 0.f;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      s[n][2 * r] = arch::fast_exp2(fmaf(s[n][2 * r], scale_log2, -base));
      s[n][2 * r + 1] = arch::fast_exp2(fmaf(s[n][2 * r + 1], scale_log2, -base));
      tile_sum += s[n][2 * r] + s[n][2 * r + 1];
    }
    st.row_sum[r] += tile_sum;
  }
  if constexpr (Tile::kSkipSettledRescale) {
    // Once the running max settles, most tiles change no row's max: one warp-uniform test per tile
    // skips the O rescale.
    if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < kDTiles; ++n) {
        st.o[n][0] *= correction[0];
        st.o[n][1] *= correction[0];
        st.o[n][2] *= correction[1];
        st.o[n][3] *= correction[1];
      }
    }
  }

  // O += P·V: P's accumulator layout is the A-fragment layout of a 16-key step.
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    uint32_t a[4];
    a[0] = E::pack(s[2 * kk][0], s[2 * kk][1]);
    a[1] = E::pack(s[2 * kk][2], s[2 * kk][3]);
    a[2] = E::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = E::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t r[4];
      arch::load_matrix_x4_transposed(r, v_tile + v_lane.at(kk, dd));
      E::mma(st.o[2 * dd], a, r[0], r[1]);
      E::mma(st.o[2 * dd + 1], a, r[2], r[3]);
    }
  }
}

template <typename Tile, typename T>
__global__ void __launch_bounds__(Tile::kThreads) forward_kernel(fmha_fwd_params p) {
  using E = arch::Element<T>;
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN, kChunks = Tile::kChunks;
  constexpr int kDTiles = Tile::kDim / 8;
  constexpr uint32_t kKVBytes = Tile::kKVElems * 2;
  extern __shared__ __align__(128) unsigned char shared_bytes[];
  const uint32_t sQ = arch::shared_address(shared_bytes);
  const uint32_t sK = sQ + Tile::kQElems * 2;  // two stages
  const uint32_t sV = sK + 2 * kKVBytes;       // two stages

  // Masked grids run their last (for causal masks: heaviest) q tiles first, so the long tail of a
  // launch is made of short tiles.
  const int tile = Tile::kMasked ? static_cast<int>(arch::grid_blocks_x() - 1 - arch::block_index_x()) : arch::block_index_x();
  const int h = arch::block_index_y(), b = arch::block_index_z();
  const BatchRows rows = batch_rows(p, b);
  const int i0 = tile * M;
  if (i0 >= rows.sq) return;
  const int i1 = min(i0 + M, rows.sq);
  const int hk = h / (p.nhead_q / p.nhead_k);
  const int64_t batch = p.group_mode ? 0 : b;

  const T* q = reinterpret_cast<const T*>(p.q) + batch * p.q_batch_stride + h * p.q_head_stride +
               (rows.q_start + i0) * p.q_row_stride;
  const T* k = reinterpret_cast<const T*>(p.k) + batch * p.k_batch_stride + hk * p.k_head_stride +
               rows.k_start * p.k_row_stride;
  const T* v = reinterpret_cast<const T*>(p.v) + batch * p.v_batch_stride + hk * p.v_head_stride +
               rows.k_start * p.v_row_stride;

  // Keys that any row of this tile keeps: [key_lo, key_hi); tiles outside are never visited.
  const ResolvedMask mask = resolve_mask(p.mask_type, p.window_left, p.window_right, rows.sq, rows.sk);
  int64_t key_lo = 0, key_hi = rows.sk;
  if (Tile::kMasked) {
    const int64_t lo = i0 + mask.off - mask.left, hi = (i1 - 1) + mask.off + mask.right + 1;
    key_lo = lo > 0 ? lo : 0;
    key_hi = hi < rows.sk ? hi : rows.sk;
  }
  const int first_tile = static_cast<int>(key_lo / N);
  const int end_tile = key_hi > key_lo ? static_cast<int>((key_hi + N - 1) / N) : first_tile;

  const int lane = arch::thread_index() % arch::kWarpSize, warp = arch::thread_index() / arch::kWarpSize;
  const int g = lane / 4, t = lane % 4;

  const TileCopy<Tile, M> q_copy;
  const TileCopy<Tile, N> kv_copy;
  q_copy.issue(sQ, q, p.q_row_stride, i1 - i0, p.hdim_q);
  arch::copy_async_commit();
  if (first_tile < end_tile) {
    const int64_t j0 = static_cast<int64_t>(first_tile) * N;
    kv_copy.issue(sK, k + j0 * p.k_row_stride, p.k_row_stride, static_cast<int>(rows.sk - j0), p.hdim_q);
    kv_copy.issue(sV, v + j0 * p.v_row_stride, p.v_row_stride, static_cast<int>(rows.sk - j0), p.hdim_v);
  }
  arch::copy_async_commit();
  arch::copy_async_wait<1>();
  arch::block_barrier();

  RowState<Tile> st;
  const LaneAddress<kChunks> q_lane(warp * 16 + lane % 16, lane / 16);
#pragma unroll
  for (int kk = 0; kk < Tile::kDim / 16; ++kk) arch::load_matrix_x4(st.q[kk], sQ + q_lane.at(0, kk));
#pragma unroll
  for (int n = 0; n < kDTiles; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.f;
  st.row_max[0] = st.row_max[1] = -INFINITY;
  st.row_sum[0] = st.row_sum[1] = 0.f;
  const int64_t row_of[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  // K rows for the B operand (matrices: keys 0-7 / 8-15 × columns 0-7 / 8-15), V rows transposed.
  const LaneAddress<kChunks> k_lane(lane % 8 + 8 * (lane / 16), (lane / 8) % 2);
  const LaneAddress<kChunks> v_lane(lane % 8 + 8 * ((lane / 8) % 2), lane / 16);
  // Tiles whose every element the mask keeps and that end before sk need no per-element checks.
  const int64_t interior_lo = (i1 - 1) + mask.off - mask.left, interior_hi = i0 + mask.off + mask.right;

  for (int jt = first_tile; jt < end_tile; ++jt) {
    const uint32_t stage = static_cast<uint32_t>((jt - first_tile) & 1) * kKVBytes;
    if (jt + 1 < end_tile) {
      const int64_t j0 = static_cast<int64_t>(jt + 1) * N;
      kv_copy.issue((sK + kKVBytes) - stage, k + j0 * p.k_row_stride, p.k_row_stride,
                    static_cast<int>(rows.sk - j0), p.hdim_q);
      kv_copy.issue((sV + kKVBytes) - stage, v + j0 * p.v_row_stride, p.v_row_stride,
                    static_cast<int>(rows.sk - j0), p.hdim_v);
      arch::copy_async_commit();
      arch::copy_async_wait<1>();
    } else {
      arch::copy_async_wait<0>();
    }
    arch::block_barrier();

    const int64_t j0 = static_cast<int64_t>(jt) * N;
    const bool edge = j0 + N > rows.sk || (Tile::kMasked && (j0 < interior_lo || j0 + N - 1 > interior_hi));
    if (edge) {
      attend_tile<Tile, T, true>(st, sK + stage, sV + stage, k_lane, v_lane, p.scale_log2, mask, j0, rows.sk, row_of, t);
    } else {
      attend_tile<Tile, T, false>(st, sK + stage, sV + stage, k_lane, v_lane, p.scale_log2, mask, j0, rows.sk, row_of, t);
    }
    arch::block_barrier();  // this stage is overwritten by the copy issued next iteration
  }

  // Normalise and store O (rows past the batch's length are not written) and the natural-log LSE.
  T* out = reinterpret_cast<T*>(p.o) + batch * p.o_batch_stride + h * p.o_head_stride;
  float* lse = reinterpret_cast<float*>(p.lse);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = arch::quad_sum(st.row_sum[r]);
    const int64_t i = row_of[r];
    if (i >= rows.sq) continue;
    const float inverse = sum > 0.f ? 1.f / sum : 0.f;
    T* out_row = out + (rows.q_start + i) * p.o_row_stride;
#pragma unroll
    for (int n = 0; n < kDTiles; ++n) {
      const int col = n * 8 + 2 * t;
      if (col < p.hdim_v) {
        *reinterpret_cast<uint32_t*>(out_row + col) = E::pack(st.o[n][2 * r] * inverse, st.o[n][2 * r + 1] * inverse);
      }
    }
    if (lse != nullptr && t == 0) {
      // LSE = ln(Σ exp(scale · S)) = (scale_log2 · max + log2 Σ) · ln 2
      const float natural = sum > 0.f ? (st.row_max[r] * p.scale_log2 + log2f(sum)) * 0.69314718055994531f : -INFINITY;
      lse[(p.group_mode ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + rows.q_start + i] = natural;
    }
  }
}

}  // namespace fmha
