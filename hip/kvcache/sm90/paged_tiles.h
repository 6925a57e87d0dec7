// The kv-cache forward's K/V tiles on Hopper: key j of a sequence is row j mod P of page
// page_id(j / P) (clamped: kvcache/page_table.h). Each thread looks up the pages of its rows of the
// next tile while the current one is copied, so no copy waits for a table load.
#pragma once

#include "common/sequence.h"
#include "fwd/sm90/kernel.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {

template <typename T>
struct KeyValueTiles<fmha_kvcache_params, T> {
  static constexpr int kMaxRowsPerThread = 8;
  BatchRows rows;
  kvcache::Sequence seq;
  kvcache::PageLookup lookup;
  const T* k;  // the pools at this kv head
  const T* v;
  int64_t k_page_stride, k_row_stride, v_page_stride, v_row_stride;
  uint32_t page_size;
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
  }

  // Starts the table loads of the pages of this thread's rows of the tile of keys j0.. (rows past the
  // sequence read no entry).
  template <typename Copy>
  __device__ void look_ahead(const Copy& copy, int64_t j0) {
    static_assert(Copy::kPerThread <= kMaxRowsPerThread, "a page id per row of the thread");
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) {
      const int64_t token = j0 + copy.first_row() + i * Copy::kRowStep;
      ahead[i] = token < rows.sk ? static_cast<int32_t>(lookup.page_id(seq, static_cast<uint32_t>(token) / page_size)) : 0;
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
    if (j0 + Copy::kRowsPerTile < rows.sk) look_ahead(copy, j0 + Copy::kRowsPerTile);
    const int valid = static_cast<int>(rows.sk - j0);
    const uint32_t first = static_cast<uint32_t>(j0) + copy.first_row();
    auto row_in_page = [&](int i) { return (first + i * Copy::kRowStep) % page_size; };
    copy.issue_rows(sK, [&](int i) { return k + pages[i] * k_page_stride + row_in_page(i) * k_row_stride; }, k, valid, hdim_q);
    copy.issue_rows(sV, [&](int i) { return v + pages[i] * v_page_stride + row_in_page(i) * v_row_stride; }, v, valid, hdim_v);
  }
};

}  // namespace fmha
