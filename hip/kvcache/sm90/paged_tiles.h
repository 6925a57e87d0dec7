// The kv-cache forward's K/V tiles on Hopper: key j of a sequence is row j mod P of page
// page_id(j / P), looked up per row (clamped: kvcache/page_table.h); a tile inside one page needs
// one lookup.
#pragma once

#include "common/sequence.h"
#include "fwd/sm90/kernel.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {

template <typename T>
struct KeyValueTiles<fmha_kvcache_params, T> {
  BatchRows rows;
  kvcache::Sequence seq;
  kvcache::PageLookup lookup;
  const T* k;  // the pools at this kv head
  const T* v;
  int64_t k_page_stride, k_row_stride, v_page_stride, v_row_stride;
  uint32_t page_size;
  int hdim_q, hdim_v;

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

  template <typename Copy>
  __device__ void issue(const Copy& copy, uint32_t sK, uint32_t sV, int64_t j0) const {
    const int valid = static_cast<int>(rows.sk - j0);
    const uint32_t u0 = static_cast<uint32_t>(j0) % page_size;
    if (u0 + Copy::kRowsPerTile <= page_size) {
      // The whole tile lies in one page: one lookup.
      const int64_t page = lookup.page_id(seq, static_cast<uint32_t>(j0) / page_size);
      const T* k_rows = k + page * k_page_stride + u0 * k_row_stride;
      const T* v_rows = v + page * v_page_stride + u0 * v_row_stride;
      copy.issue_rows(sK, [&](int r) { return k_rows + r * k_row_stride; }, k, valid, hdim_q);
      copy.issue_rows(sV, [&](int r) { return v_rows + r * v_row_stride; }, v, valid, hdim_v);
    } else {
      copy.issue_rows(sK, [&](int r) { return row(k, k_page_stride, k_row_stride, j0 + r); }, k, valid, hdim_q);
      copy.issue_rows(sV, [&](int r) { return row(v, v_page_stride, v_row_stride, j0 + r); }, v, valid, hdim_v);
    }
  }

  __device__ const T* row(const T* pool, int64_t page_stride, int64_t row_stride, int64_t j) const {
    const uint32_t token = static_cast<uint32_t>(j);
    return pool + lookup.page_id(seq, token / page_size) * page_stride + (token % page_size) * row_stride;
  }
};

}  // namespace fmha
