// Merging attention states (spec/inference.md §3.1): the C++ twin of `src/problem/merge.rs`. States
// (O_c normalised over its keys, LSE_c) of one row merge in state order, in fp32: M = max LSE_c,
// w_c = exp(LSE_c − M) / Σ exp(LSE_c − M), O = Σ w_c·O_c, LSE = M + ln Σ. An LSE of ±inf is an empty
// state of weight 0 (no state left: O = 0, LSE = −inf); a NaN LSE makes the row NaN.
#pragma once

#include <math.h>

#include "arch/registers.h"

namespace fmha {

struct MergeScale {
  float max, inverse, lse;

  // The scale of `count` states, `lse(c)` giving state c's LSE.
  template <typename LseAt>
  FMHA_HOST_DEVICE static MergeScale of(int count, LseAt lse) {
    float m = -INFINITY;
    for (int c = 0; c < count; ++c) {
      const float x = lse(c);
      if (isnan(x)) return MergeScale{NAN, NAN, NAN};
      if (isfinite(x)) m = fmaxf(m, x);
    }
    if (m == -INFINITY) return MergeScale{m, 0.f, -INFINITY};
    float sum = 0.f;
    for (int c = 0; c < count; ++c) {
      const float x = lse(c);
      if (isfinite(x)) sum += expf(x - m);
    }
    return MergeScale{m, 1.f / sum, m + logf(sum)};
  }

  // The weight of a state whose LSE is `x`; 0 for an empty state (its O is never read).
  FMHA_HOST_DEVICE float weight(float x) const {
    if (isnan(x) || isnan(max)) return NAN;
    return isfinite(x) ? expf(x - max) * inverse : 0.f;
  }
};

}  // namespace fmha
