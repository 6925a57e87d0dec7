// The AMD forward's K/V tiles from dense tensors: batch mode by batch stride, group mode from
// seqstart_k; a tile is its row 0 plus 32-bit offsets (KVCopy::load). fp8 inputs (one byte an element)
// bring their descales, per tensor or per (sequence, kv head), read once per workgroup.
#pragma once

#include "arch/amd/matrix_core.h"
#include "common/sequence.h"
#include "fwd/amd/copy.h"
#include "fwd/amd/kernel.h"
#include "launch.h"

namespace fmha {

// The descales of a dense call: none for 16-bit inputs (compile-time ones), fp8's from the parameters.
template <int kBytes>
struct DenseDescales {
  static constexpr float qk_descale = 1.f, v_descale = 1.f;
  __device__ void read(const fmha_fwd_params&, int, int) {}
};

template <>
struct DenseDescales<1> {
  float qk_descale = 1.f, v_descale = 1.f;  // q's times k's, and v's
  __device__ void read(const fmha_fwd_params& p, int b, int hk) {
    qk_descale = amd_uniform_descale(p.q_descale, b, hk) * amd_uniform_descale(p.k_descale, b, hk);
    v_descale = amd_uniform_descale(p.v_descale, b, hk);
  }
};

template <typename Tile>
struct AmdKeyValueTiles<fmha_fwd_params, Tile> : DenseDescales<Tile::kBytes> {
  static constexpr int kBytes = Tile::kBytes;
  BatchRows rows;
  const uint8_t* k;  // row 0 of the sequence at this kv head
  const uint8_t* v;
  int64_t k_row_stride, v_row_stride;
  int hdim_q, hdim_v;

  __device__ AmdKeyValueTiles(const fmha_fwd_params& p, int b)
      : rows(batch_rows(b, p.group_mode != 0, p.seqlen_q, p.seqlen_k, arch::global_pointer<const int32_t>(p.seqstart_q),
                        arch::global_pointer<const int32_t>(p.seqstart_k),
                        arch::global_pointer<const int32_t>(p.seqlen_q_ptr),
                        arch::global_pointer<const int32_t>(p.seqlen_k_ptr))),
        k_row_stride(p.k_row_stride), v_row_stride(p.v_row_stride), hdim_q(p.hdim_q), hdim_v(p.hdim_v) {}

  __device__ void at_head(const fmha_fwd_params& p, int hk) {
    const int b = arch::block_index_z();
    const int64_t batch = p.group_mode ? 0 : b;
    k = arch::global_pointer<const uint8_t>(p.k) +
        kBytes * (batch * p.k_batch_stride + hk * p.k_head_stride + rows.k_start * k_row_stride);
    v = arch::global_pointer<const uint8_t>(p.v) +
        kBytes * (batch * p.v_batch_stride + hk * p.v_head_stride + rows.k_start * v_row_stride);
    this->read(p, b, hk);
  }

  __device__ void start(int) const {}

  __device__ void load(KVCopy<Tile>& copy, int j0, int valid_rows) const {
    copy.load(k + kBytes * (j0 * k_row_stride), v + kBytes * (j0 * v_row_stride), valid_rows, hdim_q, hdim_v);
  }
};

}  // namespace fmha
