// The forward's K/V tiles from dense tensors: batch mode by batch stride, group mode from seqstart_k.
#pragma once

#include "common/descale.h"
#include "common/sequence.h"
#include "fwd/sm90/kernel.h"
#include "launch.h"

namespace fmha {

template <typename Tile, typename T>
struct KeyValueTiles<fmha_fwd_params, Tile, T> {
  BatchRows rows;
  const T* k;
  const T* v;
  int64_t k_row_stride, v_row_stride;
  int hdim_q, hdim_v;
  // fp8 descales of this sequence and kv head (per tensor or per (sequence, kv head)): q's times k's,
  // and v's; 1 for 16-bit inputs.
  float qk_descale, v_descale;

  __device__ KeyValueTiles(const fmha_fwd_params& p, int b, int hk)
      : rows(batch_rows(p, b)), k_row_stride(p.k_row_stride), v_row_stride(p.v_row_stride), hdim_q(p.hdim_q),
        hdim_v(p.hdim_v) {
    const TileScales descales = uniform_descales<T>(p, b, hk);
    qk_descale = descales.k;
    v_descale = descales.v;
    const int64_t batch = p.group_mode ? 0 : b;
    k = reinterpret_cast<const T*>(p.k) + batch * p.k_batch_stride + hk * p.k_head_stride + rows.k_start * k_row_stride;
    v = reinterpret_cast<const T*>(p.v) + batch * p.v_batch_stride + hk * p.v_head_stride + rows.k_start * v_row_stride;
  }

  template <typename KCopy, typename VCopy>
  __device__ void issue(const KCopy& k_copy, const VCopy& v_copy, uint32_t sK, uint32_t sV, int64_t j0) const {
    issue_keys(k_copy, sK, j0);
    issue_values(v_copy, sV, j0);
  }

  // The K or the V tile alone (the warp-specialized kernel's producer has a pipeline for each).
  template <typename Copy>
  __device__ void issue_keys(const Copy& copy, uint32_t sK, int64_t j0) const {
    copy.issue(sK, k + j0 * k_row_stride, k_row_stride, static_cast<int>(rows.sk - j0), hdim_q);
  }
  template <typename Copy>
  __device__ void issue_values(const Copy& copy, uint32_t sV, int64_t j0) const {
    copy.issue(sV, v + j0 * v_row_stride, v_row_stride, static_cast<int>(rows.sk - j0), hdim_v);
  }
};

}  // namespace fmha
