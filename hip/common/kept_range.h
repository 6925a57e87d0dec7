// A lane's kept elements under a resolved mask, for the mainloops where a lane owns one index of the
// tile (the AMD forward: a query row; the AMD backward: a key; the NVIDIA backward: two keys) and its
// registers hold a few of the other (keys; query rows) at fixed offsets: the lane's kept range over
// the whole sequence is computed once, in 64 bits and clamped into 32, and each tile then tests
// register offsets against it without branches.
#pragma once

#include <stdint.h>

#include "arch/platform.h"
#include "common/sequence.h"

namespace fmha {

// Kept iff first <= index <= last (an empty range has last < first).
struct IndexRange {
  int first, last;
};

// The keys query row `row` keeps: ResolvedMask::kept's [row + off - left, row + off + right] ∩ [0, sk)
// (unmasked instances: [0, sk)), clamped to [0, sk] and [-1, sk - 1].
template <bool kMasked>
__device__ inline IndexRange keys_of_row(const ResolvedMask& mask, int64_t row, int sk) {
  int64_t lo = kMasked ? row + mask.off - mask.left : 0;
  int64_t hi = kMasked && row + mask.off + mask.right < sk - 1 ? row + mask.off + mask.right : sk - 1;
  IndexRange keys;
  keys.first = static_cast<int>(lo < 0 ? 0 : (lo > sk ? sk : lo));
  keys.last = static_cast<int>(hi < -1 ? -1 : hi);
  return keys;
}

// The query rows that keep key `key`: [key - off - right, key - off + left] ∩ [0, sq) (unmasked
// instances: [0, sq)), nothing for a key at or past sk; clamped to [0, sq] and [-1, sq - 1].
template <bool kMasked>
__device__ inline IndexRange rows_of_key(const ResolvedMask& mask, int64_t key, int sq, int sk) {
  int64_t lo = kMasked ? key - mask.off - mask.right : 0;
  int64_t hi = kMasked && key - mask.off + mask.left < sq - 1 ? key - mask.off + mask.left : sq - 1;
  if (key >= sk) hi = -1;
  IndexRange rows;
  rows.first = static_cast<int>(lo < 0 ? 0 : (lo > sq ? sq : lo));
  rows.last = static_cast<int>(hi < -1 ? -1 : hi);
  return rows;
}

// The same range as offsets c from a lane's first index in a tile of N, `base`: kept iff
// lo <= c <= last, clamped to [0, N] and [-1, N - 1] (c is in [0, N)).
struct KeptRange {
  int lo, last;
};

template <int N>
__device__ inline KeptRange kept_range(IndexRange range, int base) {
  const int lo = range.first - base, last = range.last - base;
  KeptRange kept;
  kept.lo = lo < 0 ? 0 : (lo > N ? N : lo);
  kept.last = last < -1 ? -1 : (last > N - 1 ? N - 1 : last);
  return kept;
}

// s for a kept offset c, -inf otherwise: min(s, +inf) = s, min(s, -inf) = -inf, where the limit's sign
// is that of (c - lo) | (last - c), negative iff c is outside [lo, last]. No compares, no lane masks.
__device__ inline float masked_score(float s, int c, KeptRange kept) {
  const uint32_t outside = static_cast<uint32_t>((c - kept.lo) | (kept.last - c)) & 0x80000000u;
  return __builtin_fminf(s, __builtin_bit_cast(float, outside | 0x7f800000u));
}

}  // namespace fmha
