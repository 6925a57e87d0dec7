// The warp-specialized forward's source for the dense forward (fmha_fwd_params): tiles of 128 query
// rows, K and V tiles as TMA boxes of the tensors, the sequence's last V tile copied with cp.async.
#pragma once

#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "fwd/sm90/dense_tiles.h"
#include "fwd/sm90/specialized_work.h"
#include "fwd/sm90/tile_walk.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct SpecializedSource<fmha_fwd_params, Tile, T> {
  static constexpr int M = Tile::kBlockM, N = Tile::kBlockN;

  // The grid's tiles and the order its CTAs take them in: fwd/sm90/tile_walk.h, decided by the launch.
  using Walk = DenseTileWalk;
  __device__ static int64_t tiles(const fmha_fwd_params& p) {
    return static_cast<int64_t>((p.max_seqlen_q + M - 1) / M) * p.nhead_q * p.batch;
  }
  // (only masked tiles are taken from a counter: the launch gives unmasked ones none)
  __device__ static int32_t* tile_counter(const fmha_fwd_params& p) {
    return Tile::kMasked ? reinterpret_cast<int32_t*>(p.tile_counter) : nullptr;
  }
  using Work = SpecializedWork;
  __device__ static Work work(const fmha_fwd_params& p, const Walk& walk, int64_t t) {
    Work w;
    const TilePosition at = walk.at(t);
    const int64_t b = walk.nhead_q.quotient(at.pair);
    w.y = static_cast<int>(at.pair - b * p.nhead_q);
    w.b = static_cast<int>(b);
    w.hk = static_cast<int>(walk.group.quotient(w.y));
    w.i0 = static_cast<int>(at.block) * M;
    w.group = 1;
    w.batch = p.group_mode ? 0 : w.b;
    w.rows = batch_rows(p, w.b);
    w.live = w.i0 < w.rows.sq;
    w.i1 = min(w.i0 + M, w.rows.sq);
    w.keys = key_range<N, Tile::kMasked>(p, w.rows, w.i0, w.i1 - 1);
    w.first = w.keys.first;
    w.steps = w.live ? w.keys.end - w.keys.first : 0;
    w.split = 0;
    w.partial = false;
    w.seq_q_start = 0;
    return w;
  }

  // The tile's Q rows from `map` (encode_query_map) into `shared`, completing on `bar`.
  __device__ static void load_query(const fmha_fwd_params&, const CUtensorMap& map, uint32_t shared, uint32_t bar,
                                    const Work& w, int lane) {
    arch::tma_load_tile<T, Tile::kDimQK>(shared, Tile::QLayout::kBlockBytes, map, bar, Tile::kQBytes,
                                         static_cast<int>(w.rows.q_start + w.i0), w.y, static_cast<int>(w.batch),
                                         lane);
  }

  // Dense tensors have no pages (the paged source's `page_of` looks its pages up a tile ahead).
  __device__ static int64_t page_of(const fmha_fwd_params&, const Work&, int64_t, int) { return 0; }

  // The K or V (kValues) tile of keys j0.. (kCols columns, kBytes) from `map` into `shared`, completing on
  // `bar`.
  template <int kCols, uint32_t kBytes, bool kValues>
  __device__ static void load(const fmha_fwd_params&, const CUtensorMap& map, uint32_t shared, uint32_t bar,
                              const Work& w, int64_t j0, int lane, int64_t) {
    arch::tma_load_tile<T, kCols>(shared, Tile::KLayout::kBlockBytes, map, bar, kBytes,
                                  static_cast<int>(w.rows.k_start + j0), w.hk, static_cast<int>(w.batch), lane);
  }

  // Whether the map reads the rows past w's sequence as zeros: a sequence that ends where the tensor does
  // (every batch-mode sequence, the last of group mode), whose rows past it are out of the map's bounds.
  __device__ static bool zeros_past_sequence(const fmha_fwd_params& p, const Work& w) {
    return w.rows.k_start + w.rows.sk == p.seqlen_k;
  }

  // The V tile of keys j0.. that reaches past the sequence, with zeros past it (cp.async by the warp).
  __device__ static void copy_values(const fmha_fwd_params& p, uint32_t shared, const Work& w, int64_t j0) {
    const KeyValueTiles<fmha_fwd_params, Tile, T> kv(p, w.b, w.hk);
    const TileCopy<typename Tile::Producer, N, typename Tile::VLayout> v_copy;
    kv.issue_values(v_copy, shared, j0);
  }
};

}  // namespace fmha
