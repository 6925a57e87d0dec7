// The attention forward kernel on Hopper tensor cores (wgmma, sm_90a) with cp.async copies:
// FlashAttention-2's algorithm on warpgroup MMAs.
//
// One CTA computes a tile of kBlockM query rows of one (batch, query head): one warpgroup (4 warps) per
// 64 rows. The Q tile stays in shared memory for the whole CTA and is read by the tensor cores directly.
// K and V tiles of kBlockN rows stream through a double-buffered shared-memory ring in the wgmma
// 128-byte swizzle (the copy of tile j+1 is in flight while tile j is computed). Per tile: S = Q·Kᵀ
// (fp32, both operands from shared memory), mask on edge tiles, online softmax in the exp2 domain, P
// rounded to the input type in registers as the A operand of O += P·V (V read N-major from shared
// memory). Fully masked tiles are never visited. Rows with no kept key get O = 0 and LSE = -inf.
// fp8 inputs (the kv-cache's): 8-bit wgmmas, whose B operands must be K-major, so V is transposed in
// shared memory while S is computed (fwd/sm90/transpose_v.h); P is scaled by 2^8 before its rounding to
// e4m3; the descales of q and k multiply the softmax scale and v's the output, which is bf16.
//
// The kernel is its tile (fwd/sm90/tile.h: the CTA's shape and shared-memory layout), its mainloop
// (fwd/sm90/mainloop.h: one K/V tile for one warpgroup) and, at the end of forward_kernel below, the
// epilogue (normalise O, store O and the LSE). The copies are arch/nvidia/shared_tile.h's TileCopy; the
// K/V tiles come from dense tensors (the forward) or through a page table (the kv-cache operation).
#pragma once

#include <type_traits>

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/nvidia/warpgroup.h"
#include "arch/thread.h"
#include "common/descale.h"
#include "common/sequence.h"
#include "launch.h"
#include "fwd/sm90/epilogue.h"
#include "fwd/sm90/key_range.h"
#include "fwd/sm90/mainloop.h"
#include "fwd/sm90/transpose_v.h"
#include "kvcache/split.h"

namespace fmha {

// Where a call's K and V tiles come from, per parameter block: `rows` (the sequence's query rows and
// KV length), `qk_descale` and `v_descale` (the fp8 descales uniform over the call's tiles; 1 for
// 16-bit inputs), `issue(k_copy, v_copy, sK, sV, j0)`, which queues the copy of the tiles of keys j0..
// into shared memory (keys from `rows.sk` on as zeros), and with per-page descales `tile_scales()`, the
// K and V descales of the tile issued last (the kernel asks before it issues the next). fwd/sm90/dense_tiles.h: dense tensors (fmha_fwd_params);
// kvcache/sm90/paged_tiles.h: a paged pool (fmha_kvcache_params).
template <typename Params, typename Tile, typename T>
struct KeyValueTiles;

template <typename Tile, typename T, typename Params>
__global__ void __launch_bounds__(Tile::kThreads) forward_kernel(Params p) {
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN;
  constexpr uint32_t kKVBytes = Tile::kKVBytes;
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  const uint32_t sQ = swizzle128_base(shared_bytes);
  const uint32_t sK = sQ + Tile::kQBytes;  // two stages
  const uint32_t sV = sK + 2 * kKVBytes;   // two stages
  const uint32_t sVt = sV + 2 * kKVBytes;  // 8-bit inputs: the transposed V tile

  // Split-KV (the kv-cache's decode): x = q tile · splits + split; the dense forward never splits.
  constexpr bool kCanSplit = std::is_same_v<Params, fmha_kvcache_params>;
  const int splits = kvcache::grid_splits(p);
  const kvcache::GridTile slot = kvcache::grid_tile(static_cast<int>(arch::block_index_x()),
                                                    static_cast<int>(arch::grid_blocks_x()), splits, Tile::kMasked);
  const int split = slot.split, tile = slot.tile;
  // y: the query head, or with packed GQA the kv head, whose `group` query heads share the tile: its
  // row r is query row r / group of head hk · group + r % group.
  const int y = arch::block_index_y();
  // z: the sequence, in the prepare's longest-first order where it wrote one (kvcache/split.h).
  int b = static_cast<int>(arch::block_index_z());
  if constexpr (kCanSplit) b = kvcache::sequence_at(p, b);
  const int group = Tile::kPackGqa ? p.nhead_q / p.nhead_k : 1;
  const int hk = Tile::kPackGqa ? y : y / (p.nhead_q / p.nhead_k);
  KeyValueTiles<Params, Tile, T> kv(p, b, hk);
  const BatchRows rows = kv.rows;
  const int64_t tile_rows = static_cast<int64_t>(rows.sq) * group;  // rows of this sequence's tiles
  const int i0 = tile * M;
  if (i0 >= tile_rows) return;
  const int i1 = static_cast<int>(min(static_cast<int64_t>(i0 + M), tile_rows));
  const int64_t first_query = i0 / group, last_query = (i1 - 1) / group;
  const int64_t batch = p.group_mode ? 0 : b;
  // Head `head`'s query row `i` (and output row) is `i · row_stride` from its row 0.
  const auto head_of = [&](int64_t r) { return Tile::kPackGqa ? hk * group + static_cast<int>(r % group) : y; };

  // Tile row r's query row: q_row(r).
  const T* q_sequence = reinterpret_cast<const T*>(p.q) + batch * p.q_batch_stride + rows.q_start * p.q_row_stride;
  const auto q_row = [&](int64_t r) { return q_sequence + head_of(r) * p.q_head_stride + (r / group) * p.q_row_stride; };

  const KeyRange keys = key_range<N, Tile::kMasked>(p, rows, first_query, last_query);
  int first_tile = keys.first, end_tile = keys.end;
  // A split sequence's CTA attends to its chunk's tiles only and leaves a partial state
  // (kvcache/split.h); an empty chunk leaves O = 0, LSE = -inf.
  bool partial = false;
  if constexpr (kCanSplit) {
    if (splits > 1) {
      const kvcache::Chunks chunks = kvcache::chunks(p, rows.sk);
      if (split >= chunks.count) return;
      partial = chunks.count > 1;
      if (partial) {
        const int lo = static_cast<int>(split * chunks.tiles), hi = static_cast<int>((split + 1) * chunks.tiles);
        first_tile = max(first_tile, lo);
        end_tile = max(min(end_tile, hi), first_tile);
      }
    }
  }

  const int lane = arch::thread_index() % arch::kWarpSize, warp = arch::thread_index() / arch::kWarpSize;
  const int g = lane / 4, t = lane % 4;

  const TileCopy<Tile, M, typename Tile::QLayout> q_copy;
  const TileCopy<Tile, N, typename Tile::KLayout> k_copy;
  const TileCopy<Tile, N, typename Tile::VLayout> v_copy;
  if (first_tile < end_tile) {
    if constexpr (Tile::kPackGqa) {  // rows of several heads: no common row stride
      constexpr int kStep = decltype(q_copy)::kRowStep;
      q_copy.issue_rows(sQ, [&](int it) { return q_row(i0 + q_copy.first_row() + it * kStep); }, q_row(i0), i1 - i0,
                        p.hdim_q);
    } else {
      q_copy.issue(sQ, q_row(i0), p.q_row_stride, i1 - i0, p.hdim_q);
    }
    kv.issue(k_copy, v_copy, sK, sV, static_cast<int64_t>(first_tile) * N);
  }
  arch::copy_async_commit();

  RowState<Tile> st;
  st.clear();
  const int64_t row_of[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};  // tile rows
  const int64_t query_of[2] = {row_of[0] / group, row_of[1] / group};      // their query rows
  const KeptKeys kept = KeptKeys::of<Tile::kMasked>(keys.mask, query_of, rows.sk);
  // This warpgroup's 64 Q rows; K and V tiles of stage 0 (a stage is kKVBytes further).
  const uint64_t q_rows = arch::k_major_descriptor(sQ + (warp / 4) * 64 * 128);
  const uint64_t k_tile = arch::k_major_descriptor(sK);
  uint64_t v_tile;
  if constexpr (Tile::kTransposeV) {
    v_tile = arch::k_major_descriptor(sVt);
  } else {
    v_tile = arch::mn_major_descriptor(sV, Tile::VLayout::kBlockBytes);
  }
  const float scale_log2 = p.scale_log2 * kv.qk_descale;
  float tile_v = 1.f;  // per-page descales: the V descale O is in units of
  for (int jt = first_tile; jt < end_tile; ++jt) {
    const uint32_t stage = static_cast<uint32_t>((jt - first_tile) & 1) * kKVBytes;
    float tile_dk = 1.f, o_rescale = 1.f;
    if constexpr (Tile::kPageScales) {
      const TileScales scales = kv.tile_scales();  // tile jt's, asked before the issue of jt + 1
      tile_dk = scales.k;
      o_rescale = tile_v / scales.v;
      tile_v = scales.v;
    }
    if (jt + 1 < end_tile) {
      kv.issue(k_copy, v_copy, (sK + kKVBytes) - stage, (sV + kKVBytes) - stage, static_cast<int64_t>(jt + 1) * N);
      arch::copy_async_commit();
      arch::copy_async_wait<1>();
    } else {
      arch::copy_async_wait<0>();
    }
    arch::fence_shared_for_async_proxy();
    arch::block_barrier();

    const int64_t j0 = static_cast<int64_t>(jt) * N;
    const bool edge = keys.edge<N, Tile::kMasked>(j0, rows.sk);
    // 8-bit inputs: one Vᵀ tile, rewritten each step (every warpgroup's P·V of the previous step is
    // waited for before the barrier that ends it).
    const uint64_t v_step = Tile::kTransposeV ? v_tile : arch::descriptor_plus(v_tile, stage);
    auto under_s = [&] {
      if constexpr (Tile::kTransposeV) {
        transpose_values<Tile::kThreads, N>(sV + stage, sVt);
        arch::fence_shared_for_async_proxy();
        arch::block_barrier();
      }
    };
    if (edge) {
      attend_tile<Tile, T, true>(st, q_rows, arch::descriptor_plus(k_tile, stage), v_step, scale_log2, tile_dk,
                                 o_rescale, kept, j0, t, under_s);
    } else {
      attend_tile<Tile, T, false>(st, q_rows, arch::descriptor_plus(k_tile, stage), v_step, scale_log2, tile_dk,
                                  o_rescale, kept, j0, t, under_s);
    }
    arch::block_barrier();  // this stage is overwritten by the copy issued next iteration
  }

  int64_t seq_q_start = 0;
  if constexpr (kCanSplit) seq_q_start = kv.seq.q_start;
  store_output<Tile>(p, st, scale_log2, kv.v_descale * tile_v, row_of, query_of, tile_rows, head_of, rows, b, batch, t,
                     partial, split, seq_q_start);
}

}  // namespace fmha
