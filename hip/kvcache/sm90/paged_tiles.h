// The kv-cache forward's K/V tiles on Hopper: key j of a sequence is row j mod P of page
// page_id(j / P) (clamped: kvcache/page_table.h). The copy is on the critical path of every warp (no
// producer warps in this kernel), so it must cost about what a dense copy costs: page ids are loaded
// a tile ahead (no copy waits for a table load); pages holding whole tiles (P a multiple of the tile)
// copy like dense tiles; smaller pages have each row's offsets computed once, by one thread, into
// shared memory, from where the 16 threads that copy the row read them.
#pragma once

#include "common/descale.h"
#include "common/sequence.h"
#include "fwd/sm90/kernel.h"
#include "kvcache/page_table.h"
#include "arch/thread.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct KeyValueTiles<fmha_kvcache_params, Tile, T> {
  static constexpr int N = Tile::kBlockN;
  // The element offsets of a tile row's key and value in the pools.
  struct RowOffsets {
    int64_t k, v;
  };

  BatchRows rows;
  kvcache::Sequence seq;
  kvcache::PageLookup lookup;
  const T* k;  // the pools at this kv head
  const T* v;
  int64_t k_page_stride, k_row_stride, v_page_stride, v_row_stride;
  uint32_t page_size;
  int shift;         // log2(page_size) for powers of two, else -1
  bool whole_tiles;   // page_size is a multiple of the tile: every tile lies in one page
  bool same_strides;  // K and V pools have the same page and row strides
  int hdim_q, hdim_v;
  // fp8 descales uniform over this sequence and kv head: q's times k's, and v's (1 where none is given
  // or where they vary by page).
  float qk_descale, v_descale;
  // Per-page K/V descales (Tile::kPageScales; pages of whole tiles, the launcher refuses the rest): this
  // kv head's column of each array (null where uniform), its page stride, and the values of the tile
  // issued last.
  const float* k_page_scales = nullptr;
  const float* v_page_scales = nullptr;
  int64_t k_scale_stride = 0, v_scale_stride = 0;
  float issued_k = 1.f, issued_v = 1.f;
  // Pages holding whole tiles: the page of the tile of keys ahead_j0.. (looked up one tile ahead).
  // Smaller pages: the offsets of the rows of the tile of keys ahead_j0.. are in `staged[stage]` (shared
  // memory, written one tile ahead by the thread that owns the row), and `ahead` is the page of this
  // thread's row (thread t owns row t) of the tile after that.
  int64_t ahead_j0 = -1;
  int32_t ahead = 0;
  int stage = 0;
  RowOffsets (*staged)[N];

  __device__ KeyValueTiles(const fmha_kvcache_params& p, int b, int hk)
      : lookup(kvcache::PageLookup::of(p)), k_page_stride(p.k_batch_stride), k_row_stride(p.k_row_stride),
        v_page_stride(p.v_batch_stride), v_row_stride(p.v_row_stride), page_size(static_cast<uint32_t>(p.page_size)),
        hdim_q(p.hdim_q), hdim_v(p.hdim_v) {
    __shared__ RowOffsets offsets[2][N];
    staged = offsets;
    kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
    seq = kvcache::resolve(p, b, ignored);
    rows.q_start = seq.q_start;
    rows.k_start = 0;
    rows.sq = static_cast<int32_t>(seq.sq);
    rows.sk = static_cast<int32_t>(seq.kv_len);
    k = reinterpret_cast<const T*>(p.k) + hk * p.k_head_stride;
    v = reinterpret_cast<const T*>(p.v) + hk * p.v_head_stride;
    shift = (page_size & (page_size - 1)) == 0 ? __ffs(static_cast<int>(page_size)) - 1 : -1;
    whole_tiles = page_size % N == 0;
    const bool k_paged = Tile::kPageScales && p.k_descale.data != 0 && p.k_descale.page_stride != 0;
    const bool v_paged = Tile::kPageScales && p.v_descale.data != 0 && p.v_descale.page_stride != 0;
    qk_descale = uniform_descale(p.q_descale, b, hk) * (k_paged ? 1.f : uniform_descale(p.k_descale, b, hk));
    v_descale = v_paged ? 1.f : uniform_descale(p.v_descale, b, hk);
    if (k_paged) {
      k_page_scales = reinterpret_cast<const float*>(p.k_descale.data) + hk * p.k_descale.head_stride;
      k_scale_stride = p.k_descale.page_stride;
    }
    if (v_paged) {
      v_page_scales = reinterpret_cast<const float*>(p.v_descale.data) + hk * p.v_descale.head_stride;
      v_scale_stride = p.v_descale.page_stride;
    }
    same_strides = k_page_stride == v_page_stride && k_row_stride == v_row_stride;
  }

  // The K and V descales of the tile issued last (the kernel asks before it issues the next).
  __device__ TileScales tile_scales() const { return TileScales{issued_k, issued_v}; }

  // Token -> (logical page, row in it): shifts and masks for powers of two.
  __device__ uint32_t page_of(uint32_t token) const { return shift >= 0 ? token >> shift : token / page_size; }
  __device__ uint32_t row_of(uint32_t token) const { return shift >= 0 ? token & (page_size - 1) : token % page_size; }

  // The page of `token` (0 past the sequence: such rows are never copied); starts a table load.
  __device__ int32_t page_of_token(int64_t token) const {
    return token < rows.sk ? static_cast<int32_t>(lookup.page_id(seq, page_of(static_cast<uint32_t>(token)))) : 0;
  }

  // Writes the offsets of row `r` (key `token`, on page `page`) into stage `s`.
  __device__ void stage_row(int s, int r, int64_t token, int32_t page) const {
    const uint32_t u = row_of(static_cast<uint32_t>(token));
    staged[s][r] = RowOffsets{page * k_page_stride + u * k_row_stride, page * v_page_stride + u * v_row_stride};
  }

  // Queues the copies of the tiles of keys j0.. Called by every thread with j0 = first, first + N, ...
  template <typename KCopy, typename VCopy>
  __device__ void issue(const KCopy& k_copy, const VCopy& v_copy, uint32_t sK, uint32_t sV, int64_t j0) {
    const int valid = static_cast<int>(rows.sk - j0);
    if (whole_tiles) {
      const int32_t page = ahead_j0 == j0 ? ahead : page_of_token(j0);
      ahead = page_of_token(j0 + N);  // in flight while this tile is copied and computed
      ahead_j0 = j0 + N;
      const uint32_t u0 = row_of(static_cast<uint32_t>(j0));
      if constexpr (Tile::kPageScales) {  // loaded now, read when the tile is computed (an iteration later)
        if (k_page_scales != nullptr) issued_k = k_page_scales[page * k_scale_stride];
        if (v_page_scales != nullptr) issued_v = v_page_scales[page * v_scale_stride];
      }
      k_copy.issue(sK, k + page * k_page_stride + u0 * k_row_stride, k_row_stride, valid, hdim_q);
      v_copy.issue(sV, v + page * v_page_stride + u0 * v_row_stride, v_row_stride, valid, hdim_v);
      return;
    }
    const int t = static_cast<int>(arch::thread_index());
    const bool first = ahead_j0 != j0;  // the first tile (block-uniform)
    if (first) {  // staged here, and the next tile's pages loaded
      if (t < N) stage_row(stage, t, j0 + t, page_of_token(j0 + t));
      ahead = t < N ? page_of_token(j0 + N + t) : 0;
      arch::block_barrier();
    }
    const RowOffsets* rows_now = staged[stage];
    // Both copies take the same rows of the tile (same thread mapping, different shared layouts).
    auto k_offset = [&](int i) { return rows_now[k_copy.first_row() + i * KCopy::kRowStep].k; };
    k_copy.issue_rows(sK, [&](int i) { return k + k_offset(i); }, k, valid, hdim_q);
    if (same_strides) {  // the usual pools: V's offsets are K's (half the shared-memory reads)
      v_copy.issue_rows(sV, [&](int i) { return v + k_offset(i); }, v, valid, hdim_v);
    } else {
      v_copy.issue_rows(sV, [&](int i) { return v + rows_now[v_copy.first_row() + i * VCopy::kRowStep].v; }, v, valid,
                        hdim_v);
    }
    // The next tile's rows from the pages loaded one tile ago (the kernel's barriers between two issues
    // order these writes after every read of that stage and before the next issue), and the loads of
    // the tile after.
    if (t < N) {
      stage_row(stage ^ 1, t, j0 + N + t, ahead);
      ahead = page_of_token(j0 + 2 * N + t);
    }
    stage ^= 1;
    ahead_j0 = j0 + N;
    // The kernel issues the second tile right after the first, with no barrier between: this one
    // publishes the stage just written and keeps the next call's writes after this call's reads.
    if (first) arch::block_barrier();
  }
};

}  // namespace fmha
