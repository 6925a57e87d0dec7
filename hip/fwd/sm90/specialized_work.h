// What the warp-specialized forward (fwd/sm90/specialized_kernel.h) needs from its parameter block:
// the tiles of its grid, each tile's work, and the K/V loads of its producer. One `SpecializedSource`
// per parameter block: fwd/sm90/specialized_dense.h (fmha_fwd_params), kvcache/sm90/specialized_paged.h
// (fmha_kvcache_params).
#pragma once

#include <cuda.h>

#include "common/sequence.h"
#include "fwd/sm90/key_range.h"

namespace fmha {

// One tile of the grid: tile rows [i0, i1) of query head `y` (kv head `hk`) of sequence `b`, whose
// rows are `rows` (batch `batch` of batch-mode tensors), and its `steps` key tiles from key tile
// `first`. With packed GQA (the kv cache's decode tile, `group` > 1) `y` is the kv head and tile row r
// is query row r / group of query head hk · group + r % group. `live`: the tile has rows to write. A
// split sequence's tile (`partial`) computes split `split` and writes a partial state
// (kvcache/split.h; its rows start at `seq_q_start`).
struct SpecializedWork {
  int b, y, hk, group, i0, i1, first, steps, split;
  bool live, partial;
  int64_t batch, seq_q_start;
  BatchRows rows;
  KeyRange keys;

  __device__ int64_t tile_rows() const { return static_cast<int64_t>(rows.sq) * group; }
  // (packed tiles hold a sequence's pairs below 2^32: a 32-bit division)
  __device__ int64_t query_of(int64_t r) const {
    return group == 1 ? r : static_cast<uint32_t>(r) / static_cast<uint32_t>(group);
  }
  __device__ int head_of(int64_t r) const {
    return group == 1 ? y : hk * group + static_cast<int>(static_cast<uint32_t>(r) % static_cast<uint32_t>(group));
  }
};

// The TMA maps of a call's Q, K and V, encoded by the launch.
struct ForwardMaps {
  CUtensorMap q, k, v;
};

template <typename Params, typename Tile, typename T>
struct SpecializedSource;

}  // namespace fmha
