// The warp-specialized forward's source for the kv-cache operation (fmha_kvcache_params), 16-bit pools
// whose pages hold whole 128-key tiles or divide them into pieces of at least 8 rows: the grid and
// split-KV of the cp.async kernel (kvcache/split.h), and K/V tiles as TMA boxes of the pool, one per
// page piece (key j of a sequence is row j mod P of page page_id(j / P); kvcache/page_table.h). The
// sequence's last V tile is copied with cp.async (zeros past its keys: the rest of a page is not the
// sequence's).
#pragma once

#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "fwd/sm90/specialized_work.h"
#include "kvcache/page_table.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct SpecializedSource<fmha_kvcache_params, Tile, T> {
  static constexpr int M = Tile::kBlockM, N = Tile::kBlockN;

  struct Work : SpecializedWork {
    kvcache::Sequence seq;
  };

  // The grid of the cp.async kernel, [q tiles · splits, query heads, sequences], x fastest.
  __device__ static int grid_x(const fmha_kvcache_params& p) {
    return (p.max_seqlen_q + M - 1) / M * kvcache::grid_splits(p);
  }
  __device__ static int64_t tiles(const fmha_kvcache_params& p) {
    return static_cast<int64_t>(grid_x(p)) * p.nhead_q * p.batch;
  }
  // Page pieces per tile (the launch admits pages of whole tiles, or of at least 8 rows dividing one).
  __device__ static int pieces(const fmha_kvcache_params& p) {
    return p.page_size >= N ? 1 : N / p.page_size;
  }

  __device__ static Work work(const fmha_kvcache_params& p, int64_t t, int64_t, int64_t) {
    Work w;
    const int splits = kvcache::grid_splits(p), gx = grid_x(p);
    const int64_t rest = t / gx;
    const kvcache::GridTile slot = kvcache::grid_tile(static_cast<int>(t % gx), gx, splits, Tile::kMasked);
    w.y = static_cast<int>(rest % p.nhead_q);
    w.b = kvcache::sequence_at(p, static_cast<int32_t>(rest / p.nhead_q));
    w.hk = w.y / (p.nhead_q / p.nhead_k);
    kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
    w.seq = kvcache::resolve(p, w.b, ignored);
    w.rows.q_start = w.seq.q_start;
    w.rows.k_start = 0;
    w.rows.sq = static_cast<int32_t>(w.seq.sq);
    w.rows.sk = static_cast<int32_t>(w.seq.kv_len);
    w.batch = p.group_mode ? 0 : w.b;
    w.seq_q_start = w.seq.q_start;
    w.i0 = slot.tile * M;
    w.live = w.i0 < w.rows.sq;
    w.i1 = min(w.i0 + M, w.rows.sq);
    w.keys = key_range<N, Tile::kMasked>(p, w.rows, w.i0, w.i1 - 1);
    w.first = w.keys.first;
    int end = w.keys.end;
    w.split = slot.split;
    w.partial = false;
    // A split sequence's CTA attends to its chunk's tiles only and leaves a partial state; a split
    // past the sequence's chunks has nothing to write.
    if (splits > 1) {
      const kvcache::Chunks chunks = kvcache::chunks(p, w.rows.sk);
      if (w.split >= chunks.count) w.live = false;
      w.partial = chunks.count > 1;
      if (w.partial) {
        w.first = max(w.first, static_cast<int>(w.split * chunks.tiles));
        end = max(min(end, static_cast<int>((w.split + 1) * chunks.tiles)), w.first);
      }
    }
    w.steps = w.live ? end - w.first : 0;
    return w;
  }

  // This lane's page of the tile of keys j0..: pages of whole tiles, lane 0's is the tile's page;
  // smaller pages, lane c's holds the tile's piece c (clamped to the sequence's pages). The producer
  // asks a tile ahead, so that the table load is in flight while it waits for a stage.
  __device__ static int64_t page_of(const fmha_kvcache_params& p, const Work& w, int64_t j0, int lane) {
    const int64_t page = p.page_size;
    const int64_t token = j0 + (page >= N ? 0 : lane * page);
    return lane < pieces(p) ? kvcache::PageLookup::of(p).page_id(w.seq, token / page) : 0;
  }

  // The K or V tile of keys j0.. (kCols columns, kBytes) from the pool's `map` into `shared`, completing
  // on `bar`: pages of whole tiles are one box per 64 columns; smaller pages one per page piece, lane c
  // issuing piece c on its page `id` (page_of). Lane 0 arms the barrier with the tile's bytes; every
  // lane arrives.
  template <int kCols, uint32_t kBytes>
  __device__ static void load(const fmha_kvcache_params& p, const CUtensorMap& map, uint32_t shared, uint32_t bar,
                              const Work& w, int64_t j0, int lane, int64_t id) {
    const int64_t page = p.page_size;
    const int rows = page >= N ? N : static_cast<int>(page);
    if (lane == 0) arch::mbarrier_arrive_expect_bytes(bar, kBytes);
    if (lane < pieces(p)) {
      const int64_t token = j0 + lane * rows;
#pragma unroll
      for (int col = 0; col < kCols; col += 64) {
        arch::tma_load(shared + (col / 64) * Tile::KLayout::kBlockBytes + lane * rows * 128, map, bar, col,
                       static_cast<int>(token % page), w.hk, static_cast<int>(id));
      }
    }
    if (lane != 0) arch::mbarrier_arrive(bar);
  }

  // A page's rows past the sequence are the pool's (never zeros).
  __device__ static bool zeros_past_sequence(const fmha_kvcache_params&, const Work&) { return false; }

  // The V tile of keys j0.. that reaches past the sequence, with zeros past it (cp.async by the warp,
  // one page lookup per row).
  __device__ static void copy_values(const fmha_kvcache_params& p, uint32_t shared, const Work& w, int64_t j0) {
    const kvcache::PageLookup lookup = kvcache::PageLookup::of(p);
    const TileCopy<typename Tile::Producer, N, typename Tile::VLayout> copy;
    using Copy = decltype(copy);
    const T* v = reinterpret_cast<const T*>(p.v) + w.hk * p.v_head_stride;
    const int64_t page = p.page_size;
    const auto row_address = [&](int i) {
      const int64_t token = j0 + copy.first_row() + i * Copy::kRowStep;
      return v + lookup.page_id(w.seq, token / page) * p.v_batch_stride + (token % page) * p.v_row_stride;
    };
    copy.issue_rows(shared, row_address, v, static_cast<int>(w.rows.sk - j0), p.hdim_v);
  }
};

}  // namespace fmha
