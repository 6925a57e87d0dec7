// The key tiles a forward CTA visits: those holding a key that one of its query rows keeps (fully
// masked tiles are never visited), and which of them need per-element mask checks.
#pragma once

#include "common/sequence.h"

namespace fmha {

struct KeyRange {
  ResolvedMask mask;
  int first, end;                     // key tiles [first, end)
  int64_t interior_lo, interior_hi;  // keys every row of the CTA keeps (with a mask)

  // A tile of kBlockN keys from j0 needs the checks when it reaches past sk or, masked, past the keys
  // every row keeps.
  template <int kBlockN, bool kMasked>
  __device__ bool edge(int64_t j0, int64_t sk) const {
    return j0 + kBlockN > sk || (kMasked && (j0 < interior_lo || j0 + kBlockN - 1 > interior_hi));
  }
};

// Query rows [first_query, last_query] of a sequence of `rows`; `p` names the mask fields as
// fmha_fwd_params and fmha_kvcache_params do.
template <int kBlockN, bool kMasked, typename Params>
__device__ inline KeyRange key_range(const Params& p, const BatchRows& rows, int64_t first_query, int64_t last_query) {
  KeyRange r;
  r.mask = resolve_mask(p.mask_type, p.window_left, p.window_right, rows.sq, rows.sk);
  int64_t key_lo = 0, key_hi = rows.sk;
  if (kMasked) {
    const int64_t lo = first_query + r.mask.off - r.mask.left, hi = last_query + r.mask.off + r.mask.right + 1;
    key_lo = lo > 0 ? lo : 0;
    key_hi = hi < rows.sk ? hi : rows.sk;
  }
  r.first = static_cast<int>(key_lo / kBlockN);
  r.end = key_hi > key_lo ? static_cast<int>((key_hi + kBlockN - 1) / kBlockN) : r.first;
  r.interior_lo = last_query + r.mask.off - r.mask.left;
  r.interior_hi = first_query + r.mask.off + r.mask.right;
  return r;
}

}  // namespace fmha
