// Split-KV (spec/inference.md §3) as every kernel reads it: a sequence's chunks of key tiles, from the
// launcher's policy and the prepare's plan, and the partial results' row of a query row. The C++ twin
// of `src/problem/split.rs` (the tests compare them: launch/kvcache_prepare_tests.rs).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "arch/registers.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {
namespace kvcache {

constexpr uint32_t kPrepared = 0x4B564350u;  // KVCACHE_PREPARED

FMHA_HOST_DEVICE inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The splits of a forward grid, whose x is q tile · splits + split: the launcher's bound for the kv
// cache (1: unsplit); the dense forward never splits.
template <typename Params>
FMHA_HOST_DEVICE inline int grid_splits(const Params& p) {
  if constexpr (std::is_same_v<Params, fmha_kvcache_params>) {
    return p.max_splits > 1 ? p.max_splits : 1;
  } else {
    (void)p;
    return 1;
  }
}

// Block x's split and q tile in a grid of `grid_x` blocks. Masked grids (`last_first`) run their last
// (for causal masks: heaviest) q tiles first, so the long tail of a launch is made of short tiles.
struct GridTile {
  int split, tile;
};
FMHA_HOST_DEVICE inline GridTile grid_tile(int x, int grid_x, int splits, bool last_first) {
  const int q_tiles = grid_x / splits, x_tile = x / splits;
  return GridTile{x % splits, last_first ? q_tiles - 1 - x_tile : x_tile};
}

// Chunk c of a sequence holds its key tiles [c·tiles, (c + 1)·tiles).
struct Chunks {
  int64_t count, tiles;
};

// `problem::split::chunks`: the plan is read only when the launcher splits by it.
FMHA_HOST_DEVICE inline Chunks chunks(const fmha_kvcache_params& p, int64_t kv_len) {
  const int64_t n = ceil_div(kv_len > 0 ? kv_len : 0, p.block_n);
  if (p.max_splits <= 1 || n <= 1) return Chunks{1, n > 1 ? n : 1};
  int64_t want = n;
  if (p.split_tiles > 0) {
    want = p.split_tiles;
  } else {
    const fmha_kv_cache_split_plan plan = *reinterpret_cast<const fmha_kv_cache_split_plan*>(p.split_plan);
    if (plan.magic == kPrepared && plan.tiles_per_split > 0) want = plan.tiles_per_split;
  }
  const int64_t least = ceil_div(n, p.max_splits);
  const int64_t tiles = want > least ? want : least;
  return Chunks{ceil_div(n, tiles), tiles};
}

// The query heads one tile row set covers: with packed GQA a tile holds every query head of its kv head.
FMHA_HOST_DEVICE inline int32_t packed_heads(const fmha_kvcache_params& p) {
  return p.pack_gqa != 0 ? p.nhead_q / p.nhead_k : 1;
}

// `problem::split::work_units`: one sequence's query tiles times its key tiles (per tile head).
FMHA_HOST_DEVICE inline int64_t work_units(const fmha_kvcache_params& p, const Sequence& s) {
  // Divisors in vector registers: 64-bit divisions by uniform values expand on AMD's scalar unit (the
  // prepare kernel's loop then nears its register limit).
  const int64_t m = arch::in_vector_registers<int64_t>(p.block_m), n = arch::in_vector_registers<int64_t>(p.block_n);
  return ceil_div(s.sq * packed_heads(p), m) * ceil_div(s.kv_len, n);
}

// `problem::split::adaptive_tiles`: the call's work over the CUs, with 10 % slack.
FMHA_HOST_DEVICE inline int32_t adaptive_tiles(int64_t work, int32_t cu_count) {
  const int64_t capped = work < INT64_MAX / 16 ? work : INT64_MAX / 16;
  const int64_t tiles = ceil_div(capped * 11, 10 * static_cast<int64_t>(cu_count > 1 ? cu_count : 1));
  return static_cast<int32_t>(tiles < 1 ? 1 : (tiles > INT32_MAX ? INT32_MAX : tiles));
}

// Whether the prepare orders this call's sequences longest-first (`KvSplitArgs::order_len` is the
// launcher's batch bound, capped at `problem::split::MAX_ORDERED_BATCH`: the workspace holds that many).
constexpr int32_t kMaxOrderedBatch = 8192;
constexpr int kOrderClasses = 256;
FMHA_HOST_DEVICE inline bool orders(const fmha_kvcache_params& p) {
  return p.sequence_order != 0 && p.order_keys != 0 && p.batch <= kMaxOrderedBatch;
}

// The plan the prepare writes: the adaptive chunk length of a call whose sequences hold `work` units
// (`problem::split::work_units` summed) and whether it wrote the longest-first order, or none where it
// found a fault (the kernels then split nothing and run the sequences in their order).
FMHA_HOST_DEVICE inline fmha_kv_cache_split_plan plan_of(const fmha_kvcache_params& p, bool faulted, int64_t work) {
  fmha_kv_cache_split_plan plan;
  plan.magic = faulted ? 0u : kPrepared;
  plan.tiles_per_split = faulted ? 0 : adaptive_tiles(work * (p.nhead_q / packed_heads(p)), p.cu_count);
  plan.ordered = !faulted && orders(p) ? p.batch : 0;
  plan.pad = 0;
  return plan;
}

// `problem::split::order_key`: 0 for no work, else 1 + 4·floor(log2 work) + the two bits below the
// leading one.
FMHA_HOST_DEVICE inline uint8_t order_key(int64_t work) {
  if (work <= 0) return 0;
  int e = 0;
#if defined(__CUDACC__) || defined(__HIP__)
#pragma unroll 1  // unrolled, each step's lane masks take scalar registers (the AMD prepare spilled them)
#endif
  while (e < 62 && (work >> (e + 1)) != 0) ++e;
  const int64_t below = e >= 2 ? work >> (e - 2) : work << (2 - e);
  return static_cast<uint8_t>(1 + 4 * e + (below & 3));
}

// `problem::split::longest_first`, one class at a time: class `c`'s sequences in sequence order, at
// `order[first..]`, where `first` counts the sequences of the classes above `c` and `keys[b]` is
// sequence b's class (`order_key`).
FMHA_HOST_DEVICE inline void place_class(const fmha_kvcache_params& p, const uint8_t* keys, int c, int32_t first) {
  int32_t* order = reinterpret_cast<int32_t*>(p.sequence_order);
  for (int32_t b = 0; b < p.batch; ++b) {
    if (keys[b] == c) order[first++] = b;
  }
}

// The sequence the grid's z-th sequence slot runs: the prepared longest-first order where the plan
// holds one for this batch, else z (a stale order from other lengths is still a permutation).
FMHA_HOST_DEVICE inline int32_t sequence_at(const fmha_kvcache_params& p, int32_t z) {
  if (p.sequence_order == 0 || p.split_plan == 0) return z;
  const fmha_kv_cache_split_plan plan = *reinterpret_cast<const fmha_kv_cache_split_plan*>(p.split_plan);
  if (plan.magic != kPrepared || plan.ordered != p.batch) return z;
  const int32_t b = reinterpret_cast<const int32_t*>(p.sequence_order)[z];
  return b >= 0 && b < p.batch ? b : z;
}

// The partials' row of row i of sequence b, whose rows start at q_start (`fmha_kvcache_params::partial_rows`).
FMHA_HOST_DEVICE inline int64_t partial_row(const fmha_kvcache_params& p, int64_t q_start, int32_t b, int64_t i) {
  return p.group_mode != 0 ? q_start + i : static_cast<int64_t>(b) * p.seqlen_q + i;
}

// The index of (split, head, row) in the partial LSE plane (times hdim_v: in O's).
FMHA_HOST_DEVICE inline int64_t partial_state(const fmha_kvcache_params& p, int64_t split, int32_t head, int64_t row) {
  return (split * p.nhead_q + head) * p.partial_rows + row;
}

}  // namespace kvcache
}  // namespace fmha
