// The kv-cache forward's K/V tiles on Hopper: key j of a sequence is row j mod P of page
// page_id(j / P) (clamped: kvcache/page_table.h). The page ids of the next tile are looked up while the
// current one is copied, so no copy waits for a table load. The copy is on the critical path of every
// warp (no producer warps in this kernel), so the address arithmetic per row is kept to a few
// instructions: pages that hold whole tiles (P a multiple of the tile) need one lookup per tile and
// copy like a dense tile; smaller pages look up a page per row, with shifts and masks when P is a
// power of two.
#pragma once

#include "common/sequence.h"
#include "fwd/sm90/kernel.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct KeyValueTiles<fmha_kvcache_params, Tile, T> {
  static constexpr int kMaxRowsPerThread = 8;
  BatchRows rows;
  kvcache::Sequence seq;
  kvcache::PageLookup lookup;
  const T* k;  // the pools at this kv head
  const T* v;
  int64_t k_page_stride, k_row_stride, v_page_stride, v_row_stride;
  uint32_t page_size;
  int shift;         // log2(page_size) for powers of two, else -1
  bool whole_tiles;  // page_size is a multiple of the tile: every tile lies in one page
  int hdim_q, hdim_v;
  // The pages of this thread's rows of the tile of keys ahead_j0.. (looked up one tile ahead).
  int64_t ahead_j0 = -1;
  int32_t ahead[kMaxRowsPerThread];

  __device__ KeyValueTiles(const fmha_kvcache_params& p, int b, int hk)
      : lookup(kvcache::PageLookup::of(p)), k_page_stride(p.k_batch_stride), k_row_stride(p.k_row_stride),
        v_page_stride(p.v_batch_stride), v_row_stride(p.v_row_stride), page_size(static_cast<uint32_t>(p.page_size)),
        hdim_q(p.hdim_q), hdim_v(p.hdim_v) {
    kvcache::Fault ignored = {kvcache::kNoFault, 0, 0};  // the prepare reports faults; kernels clamp
    seq = kvcache::resolve(p, b, ignored);
    rows.q_start = seq.q_start;
    rows.k_start = 0;
    rows.sq = static_cast<int32_t>(seq.sq);
    rows.sk = static_cast<int32_t>(seq.kv_len);
    k = reinterpret_cast<const T*>(p.k) + hk * p.k_head_stride;
    v = reinterpret_cast<const T*>(p.v) + hk * p.v_head_stride;
    shift = (page_size & (page_size - 1)) == 0 ? __ffs(static_cast<int>(page_size)) - 1 : -1;
    whole_tiles = page_size % Tile::kBlockN == 0;
  }

  // Token -> (logical page, row in it): shifts and masks for powers of two.
  __device__ uint32_t page_of(uint32_t token) const { return shift >= 0 ? token >> shift : token / page_size; }
  __device__ uint32_t row_of(uint32_t token) const { return shift >= 0 ? token & (page_size - 1) : token % page_size; }

  // Starts the table loads of the pages of the tile of keys j0..: one page when pages hold whole
  // tiles, else one per row of this thread (rows past the sequence read no entry).
  template <typename Copy>
  __device__ void look_ahead(const Copy& copy, int64_t j0) {
    static_assert(Copy::kPerThread <= kMaxRowsPerThread, "a page id per row of the thread");
    if (whole_tiles) {
      ahead[0] = static_cast<int32_t>(lookup.page_id(seq, page_of(static_cast<uint32_t>(j0))));
    } else {
#pragma unroll
      for (int i = 0; i < Copy::kPerThread; ++i) {
        const uint32_t token = static_cast<uint32_t>(j0) + copy.first_row() + i * Copy::kRowStep;
        ahead[i] = token < static_cast<uint32_t>(rows.sk) ? static_cast<int32_t>(lookup.page_id(seq, page_of(token))) : 0;
      }
    }
    ahead_j0 = j0;
  }

  template <typename Copy>
  __device__ void issue(const Copy& copy, uint32_t sK, uint32_t sV, int64_t j0) {
    if (ahead_j0 != j0) look_ahead(copy, j0);
    int32_t pages[kMaxRowsPerThread];
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) pages[i] = ahead[i];
    // The next tile's lookups are in flight while this tile is copied and computed.
    if (j0 + Tile::kBlockN < rows.sk) look_ahead(copy, j0 + Tile::kBlockN);
    const int valid = static_cast<int>(rows.sk - j0);
    if (whole_tiles) {
      const uint32_t u0 = row_of(static_cast<uint32_t>(j0));
      copy.issue(sK, k + pages[0] * k_page_stride + u0 * k_row_stride, k_row_stride, valid, hdim_q);
      copy.issue(sV, v + pages[0] * v_page_stride + u0 * v_row_stride, v_row_stride, valid, hdim_v);
    } else {
      const uint32_t first = static_cast<uint32_t>(j0) + copy.first_row();
      auto row_in_page = [&](int i) { return row_of(first + i * Copy::kRowStep); };
      copy.issue_rows(sK, [&](int i) { return k + pages[i] * k_page_stride + row_in_page(i) * k_row_stride; }, k, valid, hdim_q);
      copy.issue_rows(sV, [&](int i) { return v + pages[i] * v_page_stride + row_in_page(i) * v_row_stride; }, v, valid, hdim_v);
    }
  }
};

}  // namespace fmha
