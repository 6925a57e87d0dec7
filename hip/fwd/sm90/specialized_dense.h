// The warp-specialized forward's source for the dense forward (fmha_fwd_params): tiles of 128 query
// rows, K and V tiles as TMA boxes of the tensors, the sequence's last V tile copied with cp.async.
#pragma once

#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "fwd/sm90/dense_tiles.h"
#include "fwd/sm90/specialized_work.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct SpecializedSource<fmha_fwd_params, Tile, T> {
  static constexpr int M = Tile::kBlockM, N = Tile::kBlockN;

  // Tile t of `tiles` walked by `ctas` CTAs. One CTA per tile: q blocks fastest, so that the CTAs running
  // together share a head's K and V in L2, masked calls taking the last ones (for causal masks the
  // heaviest) first. A static persistent walk over masked tiles (short sequences): q blocks slowest, the
  // heaviest of every head first, so that each CTA gets its share of heavy and light ones. Tiles taken
  // from a counter (masked calls given a workspace): the heads in sections whose K and V fit
  // in L2 together (kL2Bytes), sections in turn, each one's q blocks slowest and heaviest first.
  __device__ static int64_t tiles(const fmha_fwd_params& p) {
    return static_cast<int64_t>((p.max_seqlen_q + M - 1) / M) * p.nhead_q * p.batch;
  }
  // (only masked tiles are taken from a counter: the launch gives unmasked ones none)
  __device__ static int32_t* tile_counter(const fmha_fwd_params& p) {
    return Tile::kMasked ? reinterpret_cast<int32_t*>(p.tile_counter) : nullptr;
  }
  // (a third of the 50 MB L2: sections of 32 MiB re-read K and V from DRAM, docs/perf.md)
  static constexpr int64_t kL2Bytes = int64_t{16} << 20;
  // Query heads per section: a power of two of kv heads (a sequence's K and V of one) times the GQA group.
  __device__ static int64_t section_heads(const fmha_fwd_params& p) {
    const int64_t rows = p.group_mode ? p.seqlen_k / max(p.batch, 1) : p.seqlen_k;
    const int64_t fit = kL2Bytes / (max(rows, int64_t{1}) * (p.hdim_q + p.hdim_v) * static_cast<int64_t>(sizeof(T)));
    const int64_t kv_heads = fit < 1 ? 1 : int64_t{1} << (63 - __clzll(static_cast<unsigned long long>(fit)));
    return kv_heads * (p.nhead_q / p.nhead_k);
  }
  using Work = SpecializedWork;
  __device__ static Work work(const fmha_fwd_params& p, int64_t t, int64_t tiles, int64_t ctas) {
    Work w;
    const int m_blocks = (p.max_seqlen_q + M - 1) / M;
    const int64_t heads = static_cast<int64_t>(p.nhead_q) * p.batch;
    int m;
    int64_t rest;  // b · nhead_q + y
    if (tile_counter(p) != nullptr) {  // (the launch keeps counted grids below 2^31 tiles: 32-bit arithmetic)
      const uint32_t tt = static_cast<uint32_t>(t), all = static_cast<uint32_t>(heads);
      const uint32_t width = static_cast<uint32_t>(min(section_heads(p), heads)), whole = all / width * width;
      const uint32_t blocks = static_cast<uint32_t>(m_blocks), section_tiles = width * blocks;
      const bool last = tt >= whole * blocks;  // the heads past the whole sections
      const uint32_t first_head = last ? whole : tt / section_tiles * width;
      const uint32_t heads_here = last ? all - whole : width;
      const uint32_t within = last ? tt - whole * blocks : tt % section_tiles;
      m = static_cast<int>(within / heads_here);
      rest = first_head + within % heads_here;
    } else {
      const bool heaviest_first = Tile::kMasked && ctas < tiles;
      m = static_cast<int>(heaviest_first ? t / heads : t % m_blocks);
      rest = heaviest_first ? t % heads : t / m_blocks;
    }
    w.i0 = (Tile::kMasked ? m_blocks - 1 - m : m) * M;
    w.y = static_cast<int>(rest % p.nhead_q);
    w.b = static_cast<int>(rest / p.nhead_q);
    w.hk = w.y / (p.nhead_q / p.nhead_k);
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
    arch::tma_load_tile<Tile::kDimQK>(shared, Tile::QLayout::kBlockBytes, map, bar, Tile::kQBytes,
                                      static_cast<int>(w.rows.q_start + w.i0), w.y, static_cast<int>(w.batch), lane);
  }

  // Dense tensors have no pages (the paged source's `page_of` looks its pages up a tile ahead).
  __device__ static int64_t page_of(const fmha_fwd_params&, const Work&, int64_t, int) { return 0; }

  // The K or V (kValues) tile of keys j0.. (kCols columns, kBytes) from `map` into `shared`, completing on
  // `bar`.
  template <int kCols, uint32_t kBytes, bool kValues>
  __device__ static void load(const fmha_fwd_params&, const CUtensorMap& map, uint32_t shared, uint32_t bar,
                              const Work& w, int64_t j0, int lane, int64_t) {
    arch::tma_load_tile<kCols>(shared, Tile::KLayout::kBlockBytes, map, bar, kBytes,
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
