// Split-KV (spec/inference.md §3) as every kernel reads it: a sequence's chunks of key tiles, from the
// launcher's policy and the prepare's plan, and the partial results' row of a query row. The C++ twin
// of `src/problem/split.rs` (the tests compare them: launch/kvcache_prepare_tests.rs).
#pragma once

#include <stdint.h>

#include "arch/registers.h"
#include "kvcache/page_table.h"
#include "launch.h"

namespace fmha {
namespace kvcache {

constexpr uint32_t kPrepared = 0x4B564350u;  // KVCACHE_PREPARED

FMHA_HOST_DEVICE inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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
  return ceil_div(s.sq * packed_heads(p), p.block_m) * ceil_div(s.kv_len, p.block_n);
}

// `problem::split::adaptive_tiles`: the call's work over the CUs, with 10 % slack.
FMHA_HOST_DEVICE inline int32_t adaptive_tiles(int64_t work, int32_t cu_count) {
  const int64_t capped = work < INT64_MAX / 16 ? work : INT64_MAX / 16;
  const int64_t tiles = ceil_div(capped * 11, 10 * static_cast<int64_t>(cu_count > 1 ? cu_count : 1));
  return static_cast<int32_t>(tiles < 1 ? 1 : (tiles > INT32_MAX ? INT32_MAX : tiles));
}

// The plan the prepare writes: the adaptive chunk length of a call whose sequences hold `work` units
// (`problem::split::work_units` summed), or none where it found a fault (the kernels then split nothing).
FMHA_HOST_DEVICE inline fmha_kv_cache_split_plan plan_of(const fmha_kvcache_params& p, bool faulted, int64_t work) {
  fmha_kv_cache_split_plan plan;
  plan.magic = faulted ? 0u : kPrepared;
  plan.tiles_per_split = faulted ? 0 : adaptive_tiles(work * (p.nhead_q / packed_heads(p)), p.cu_count);
  return plan;
}

// The partials' row of row i of sequence b (`fmha_kvcache_params::partial_rows`).
FMHA_HOST_DEVICE inline int64_t partial_row(const fmha_kvcache_params& p, const Sequence& s, int32_t b, int64_t i) {
  return p.group_mode != 0 ? s.q_start + i : static_cast<int64_t>(b) * p.seqlen_q + i;
}

// The index of (split, head, row) in the partial LSE plane (times hdim_v: in O's).
FMHA_HOST_DEVICE inline int64_t partial_state(const fmha_kvcache_params& p, int64_t split, int32_t head, int64_t row) {
  return (split * p.nhead_q + head) * p.partial_rows + row;
}

}  // namespace kvcache
}  // namespace fmha
