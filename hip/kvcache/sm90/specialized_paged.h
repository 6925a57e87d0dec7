// The warp-specialized forward's source for the kv-cache operation (fmha_kvcache_params), pools whose
// pages hold whole key tiles (128 keys; D = 256: 64) or, for the prefill, pieces of one (a page size
// dividing the tile: Tile::kGather false, K/V tiles are TMA boxes of the pool, a box per page) or any
// other number of rows (Tile::kGather: the producer warpgroup gathers them with cp.async, a run of
// consecutive rows per thread): the grid and split-KV of the cp.async kernel (kvcache/split.h); key j of
// a sequence is row j mod P of page page_id(j / P) (kvcache/page_table.h).
// A boxed sequence's last V tile is copied with cp.async (zeros past its keys: the rest of a page is not
// the sequence's); gathered tiles have zeros there.
#pragma once

#include <type_traits>

#include "arch/nvidia/pipeline.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_map.h"
#include "common/fast_divide.h"
#include "fwd/sm90/specialized_work.h"
#include "kvcache/page_table.h"
#include "kvcache/split.h"
#include "launch.h"

namespace fmha {

// The paged grid's divisions by the call's sizes (its x, its heads, the GQA group, the page size),
// precomputed by the launch (common/fast_divide.h).
struct PagedTileWalk {
  FastDivide x, heads, group, page;
};

template <typename Tile, typename T>
struct SpecializedSource<fmha_kvcache_params, Tile, T> {
  static constexpr int M = Tile::kBlockM, N = Tile::kBlockN;

  struct Work : SpecializedWork {
    kvcache::Sequence seq;
    FastDivide page;  // keys per page
  };

  // The grid of the cp.async kernel, [q tiles · splits, query heads (packed GQA, the decode tile: kv
  // heads, whose query heads share a tile's rows), sequences], x fastest; the launch sizes its grid by it.
  FMHA_HOST_DEVICE static int grid_x(const fmha_kvcache_params& p) {
    const int64_t rows = static_cast<int64_t>(p.max_seqlen_q) * kvcache::packed_heads(p);
    return static_cast<int>((rows + M - 1) / M) * kvcache::grid_splits(p);
  }
  FMHA_HOST_DEVICE static int grid_heads(const fmha_kvcache_params& p) {
    return p.pack_gqa != 0 ? p.nhead_k : p.nhead_q;
  }
  FMHA_HOST_DEVICE static int64_t tiles(const fmha_kvcache_params& p) {
    return static_cast<int64_t>(grid_x(p)) * grid_heads(p) * p.batch;
  }
  // (only masked tiles are taken from a counter: the launch gives unmasked ones none)
  __device__ static int32_t* tile_counter(const fmha_kvcache_params& p) {
    return Tile::kMasked ? reinterpret_cast<int32_t*>(p.tile_counter) : nullptr;
  }
  using Walk = PagedTileWalk;
  static Walk walk(const fmha_kvcache_params& p) {
    return {FastDivide(grid_x(p)), FastDivide(grid_heads(p)), FastDivide(p.nhead_q / p.nhead_k),
            FastDivide(p.page_size)};
  }
  __device__ static Work work(const fmha_kvcache_params& p, const Walk& walk, int64_t t) {
    Work w;
    const int splits = kvcache::grid_splits(p), gx = static_cast<int>(walk.x.divisor());  // grid_x(p)
    const int64_t rest = walk.x.quotient(t);
    const kvcache::GridTile slot = kvcache::grid_tile(static_cast<int>(t - rest * gx), gx, splits, Tile::kMasked);
    const int64_t b = walk.heads.quotient(rest);
    w.y = static_cast<int>(rest - b * walk.heads.divisor());
    w.b = kvcache::sequence_at(p, static_cast<int32_t>(b));
    w.group = kvcache::packed_heads(p);
    w.hk = p.pack_gqa != 0 ? w.y : static_cast<int>(walk.group.quotient(w.y));
    w.page = walk.page;
    kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
    w.seq = kvcache::resolve(p, w.b, ignored);
    w.rows.q_start = w.seq.q_start;
    w.rows.k_start = 0;
    w.rows.sq = static_cast<int32_t>(w.seq.sq);
    w.rows.sk = static_cast<int32_t>(w.seq.kv_len);
    w.batch = p.group_mode ? 0 : w.b;
    w.seq_q_start = w.seq.q_start;
    w.i0 = slot.tile * M;
    const int64_t tile_rows = w.tile_rows();
    w.live = w.i0 < tile_rows;
    w.i1 = static_cast<int>(min(static_cast<int64_t>(w.i0 + M), tile_rows));
    w.keys = key_range<N, Tile::kMasked>(p, w.rows, w.query_of(w.i0), w.query_of(w.i1 - 1));
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

  // The tile's Q rows from `map` into `shared`, completing on `bar`. Packed GQA: the map's boxes are
  // `group` heads by M / group rows (encode_packed_rows_map), so that box row r is tile row r; the launch
  // packs only where the group divides M.
  __device__ static void load_query(const fmha_kvcache_params& p, const CUtensorMap& map, uint32_t shared,
                                    uint32_t bar, const Work& w, int lane) {
    const int batch = static_cast<int>(w.batch);
    const int row = static_cast<int>(w.rows.q_start + w.query_of(w.i0));
    if (p.pack_gqa != 0) {
      arch::tma_load_tile<T, Tile::kDimQK>(shared, Tile::QLayout::kBlockBytes, map, bar, Tile::kQBytes,
                                           w.hk * w.group, row, batch, lane);
    } else {
      arch::tma_load_tile<T, Tile::kDimQK>(shared, Tile::QLayout::kBlockBytes, map, bar, Tile::kQBytes, row, w.y,
                                           batch, lane);
    }
  }

  // Gathered tiles: producer thread t copies the 16-byte chunk t mod kChunks of kRun consecutive rows,
  // from row kRun · (t / kChunks) (16 rows at D = 128 and 256: 128 keys of 16 chunks, 64 keys of 32).
  // Where the pages hold a multiple of kRun rows, a run lies in one page; else (row_pages) lane i of the
  // run's kChunks threads, lanes of one warp, looks up row i mod kRun, and they pass each other the rows'
  // offsets by shuffles: one table load per thread and tile either way.
  static constexpr int kRun = N * Tile::kChunks / Tile::Producer::kThreads;
  static_assert(!Tile::kGather || (Tile::kChunksQK == Tile::kChunks && Tile::kChunks % kRun == 0 &&
                                   arch::kWarpSize % Tile::kChunks == 0),
                "gathered K and V rows of the same chunks, a run per kChunks lanes of one warp");
  __device__ static bool row_pages(const Work& w) { return w.page.divisor() % kRun != 0; }

  // TMA boxes of pages smaller than a tile: N / page of them per tile, one per lane.
  __device__ static int pieces(const Work& w) { return static_cast<int>(w.page.quotient(N)); }

  // The page this lane loads from in the tile of keys j0.. (clamped to the sequence's pages): TMA, the
  // tile's page (lane 0 issues the boxes), or with pieces that of the lane's piece; gathered, the page of
  // the lane's run, or with row_pages of its run's row lane mod kRun. The producer asks a tile ahead,
  // so that the table load is in flight while it waits for a stage.
  __device__ static int64_t page_of(const fmha_kvcache_params& p, const Work& w, int64_t j0, int lane) {
    int64_t row;
    if constexpr (Tile::kGather) {
      row = (lane / Tile::kChunks) * kRun + (row_pages(w) ? lane % kRun : 0);
    } else {
      row = lane < pieces(w) ? lane * w.page.divisor() : 0;
    }
    return kvcache::PageLookup::of(p).page_id(w.seq, w.page.quotient(j0 + row));
  }

  // The K or V (kValues) tile of keys j0.. (kCols columns, kBytes) from the pool's page `id` (page_of)
  // into `shared`, completing on `bar`. TMA: lane 0 arms the barrier with the tile's bytes, every lane
  // arrives, and lane 0 issues the tile's boxes (a box per 128 bytes of columns) from the pool's `map`,
  // or with pieces lane q its piece's boxes, at the piece's rows (q · page: whole swizzle periods).
  // Gathered: every producer thread copies its run of rows (zeros past the sequence) with cp.async, which
  // arrive on `bar` once landed.
  template <int kCols, uint32_t kBytes, bool kValues>
  __device__ static void load(const fmha_kvcache_params& p, const CUtensorMap& map, uint32_t shared, uint32_t bar,
                              const Work& w, int64_t j0, int lane, int64_t id) {
    if constexpr (Tile::kGather) {
      using Layout = std::conditional_t<kValues, typename Tile::VLayout, typename Tile::KLayout>;
      gather<Layout>(p, kValues, shared, w, j0, lane, id);
      arch::copy_async_arrive(bar);
    } else if (pieces(w) <= 1) {
      arch::tma_load_tile<T, kCols>(shared, Tile::KLayout::kBlockBytes, map, bar, kBytes,
                                    static_cast<int>(w.page.remainder(j0)), w.hk, static_cast<int>(id), lane);
    } else {
      arch::arm_or_arrive(bar, kBytes, lane);
      const uint32_t piece_bytes = static_cast<uint32_t>(w.page.divisor()) * 128;
      if (lane < pieces(w)) {
        arch::tma_load_rows<T, kCols>(shared + lane * piece_bytes, Tile::KLayout::kBlockBytes, map, bar, 0, w.hk,
                                      static_cast<int>(id));
      }
    }
  }

  // Producer thread `lane`'s run of the K or V (`values`) tile of keys j0.. into `shared` (`Layout`) from
  // page `id` (page_of) with cp.async; keys from the sequence's end on are zeros.
  template <typename Layout>
  __device__ static void gather(const fmha_kvcache_params& p, bool values, uint32_t shared, const Work& w,
                                int64_t j0, int lane, int64_t id) {
    const T* pool = reinterpret_cast<const T*>(values ? p.v : p.k) + w.hk * (values ? p.v_head_stride : p.k_head_stride);
    const int64_t page_stride = values ? p.v_batch_stride : p.k_batch_stride;
    const int64_t row_stride = values ? p.v_row_stride : p.k_row_stride;
    const int chunk = lane % Tile::kChunks, first = (lane / Tile::kChunks) * kRun;
    const int column = chunk * (16 / static_cast<int>(sizeof(T)));
    const bool column_valid = column < (values ? p.hdim_v : p.hdim_q);
    const int valid_rows = static_cast<int>(min(w.rows.sk - j0, static_cast<int64_t>(N))) - first;
    // Row first + i's chunk: the run starts on a swizzle period (bits 7-9 of its address are zero), so
    // its slot is the run's first one with bits 4-6 XORed by i mod 8 (Swizzle128 on absolute addresses)
    // plus i rows: one of 8 registers plus an immediate (16 offsets held across the producer's loop
    // spill, and a spill's reload waits behind the copies in flight).
    static_assert(kRun % Layout::kSwizzlePeriod == 0, "runs start on a swizzle period");
    const uint32_t run = shared + Layout::offset(first, chunk);
    uint32_t period[Layout::kSwizzlePeriod];
#pragma unroll
    for (int i = 0; i < Layout::kSwizzlePeriod; ++i) period[i] = run ^ (i << 4);
    const auto slot = [&](int i) { return period[i % Layout::kSwizzlePeriod] + i * Layout::kRowBytes; };
    // A run wholly in the sequence (every tile's but the last's) copies without zeros or predicates.
    const bool whole = column_valid && valid_rows >= kRun;
    const auto copy = [&](int i, const T* row) {
      const bool valid = column_valid && i < valid_rows;
      arch::copy_async_16(slot(i), valid ? row : pool, valid);
    };
    if (row_pages(w)) {  // this lane's page is row first + chunk mod kRun's; row i's offset is lane i's
      const int64_t mine = id * page_stride + w.page.remainder(j0 + first + chunk % kRun) * row_stride;
      const auto row = [&](int i) { return pool + arch::shuffle(mine, i, Tile::kChunks) + column; };
      if (arch::all_lanes(whole)) {  // (the warp's lanes take one branch: each shuffle needs all of them)
#pragma unroll
        for (int i = 0; i < kRun; ++i) arch::copy_async_16(slot(i), row(i), true);
      } else {
#pragma unroll
        for (int i = 0; i < kRun; ++i) copy(i, row(i));
      }
      return;
    }
    const T* row = pool + id * page_stride + w.page.remainder(j0 + first) * row_stride + column;
    if (whole) {
#pragma unroll
      for (int i = 0; i < kRun; ++i, row += row_stride) arch::copy_async_16(slot(i), row, true);
      return;
    }
#pragma unroll
    for (int i = 0; i < kRun; ++i, row += row_stride) copy(i, row);
  }

  // TMA: a page's rows past the sequence are the pool's (never zeros); gathered tiles have zeros there.
  __device__ static bool zeros_past_sequence(const fmha_kvcache_params&, const Work&) { return Tile::kGather; }

  // The V tile of keys j0.. that reaches past the sequence, with zeros past it (cp.async by the warp,
  // one page lookup per row).
  __device__ static void copy_values(const fmha_kvcache_params& p, uint32_t shared, const Work& w, int64_t j0) {
    const kvcache::PageLookup lookup = kvcache::PageLookup::of(p);
    const TileCopy<typename Tile::Producer, N, typename Tile::VLayout> copy;
    using Copy = decltype(copy);
    const T* v = reinterpret_cast<const T*>(p.v) + w.hk * p.v_head_stride;
    const auto row_address = [&](int i) {
      const int64_t token = j0 + copy.first_row() + i * Copy::kRowStep, index = w.page.quotient(token);
      return v + lookup.page_id(w.seq, index) * p.v_batch_stride + (token - index * w.page.divisor()) * p.v_row_stride;
    };
    copy.issue_rows(shared, row_address, v, static_cast<int>(w.rows.sk - j0), p.hdim_v);
  }
};

}  // namespace fmha
