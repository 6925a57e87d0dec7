// Merging attention states (spec/inference.md §3.1): the C++ twin of `src/problem/merge.rs`. States
// (O_c normalised over its keys, LSE_c) of one row merge in state order, in fp32: M = max LSE_c,
// w_c = exp(LSE_c − M) / Σ exp(LSE_c − M), O = Σ w_c·O_c, LSE = M + ln Σ. An LSE of ±inf is an empty
// state of weight 0 (no state left: O = 0, LSE = −inf); a NaN LSE makes the row NaN. Base-2 LSEs
// (flashinfer's) are converted to the natural log at load and back at store (lse_to_natural and
// lse_from_natural, `LseBase` in Rust), so the rule stays one.
#pragma once

#include <math.h>

#include "arch/registers.h"

namespace fmha {

// fp32 math of the rule: CUDA's device functions under nvcc; elsewhere the compiler's builtins, which
// AMD device code compiled without a device library (-nogpulib) lowers to instructions.
namespace merge_math {
#if defined(__CUDACC__)
FMHA_HOST_DEVICE inline float exp(float x) { return expf(x); }
FMHA_HOST_DEVICE inline float log(float x) { return logf(x); }
FMHA_HOST_DEVICE inline float max(float a, float b) { return fmaxf(a, b); }
FMHA_HOST_DEVICE inline bool is_nan(float x) { return isnan(x); }
FMHA_HOST_DEVICE inline bool is_finite(float x) { return isfinite(x); }
#else
FMHA_HOST_DEVICE inline float exp(float x) { return __builtin_expf(x); }
FMHA_HOST_DEVICE inline float log(float x) { return __builtin_logf(x); }
FMHA_HOST_DEVICE inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
FMHA_HOST_DEVICE inline bool is_nan(float x) { return __builtin_isnan(x); }
FMHA_HOST_DEVICE inline bool is_finite(float x) { return __builtin_isfinite(x); }
#endif
}  // namespace merge_math

struct MergeScale {
  float max, inverse, lse;

  // The scale of `count` states, `lse(c)` giving state c's LSE.
  template <typename LseAt>
  FMHA_HOST_DEVICE static MergeScale of(int count, LseAt lse) {
    float m = -INFINITY;
    for (int c = 0; c < count; ++c) {
      const float x = lse(c);
      if (merge_math::is_nan(x)) return MergeScale{NAN, NAN, NAN};
      if (merge_math::is_finite(x)) m = merge_math::max(m, x);
    }
    if (m == -INFINITY) return MergeScale{m, 0.f, -INFINITY};
    float sum = 0.f;
    for (int c = 0; c < count; ++c) {
      const float x = lse(c);
      if (merge_math::is_finite(x)) sum += merge_math::exp(x - m);
    }
    return MergeScale{m, 1.f / sum, m + merge_math::log(sum)};
  }

  // The weight of a state whose LSE is `x`; 0 for an empty state (its O is never read).
  FMHA_HOST_DEVICE float weight(float x) const {
    if (merge_math::is_nan(x) || merge_math::is_nan(max)) return NAN;
    return merge_math::is_finite(x) ? merge_math::exp(x - max) * inverse : 0.f;
  }
};

// A stored LSE in the natural log (±inf and NaN stay what they are), and back: × ln 2 and × log2 e,
// rounded to fp32 as Rust's `std::f32::consts::{LN_2, LOG2_E}`.
FMHA_HOST_DEVICE inline float lse_to_natural(float x, bool base2) { return base2 ? x * 0x1.62e430p-1f : x; }
FMHA_HOST_DEVICE inline float lse_from_natural(float x, bool base2) { return base2 ? x * 0x1.715476p+0f : x; }

}  // namespace fmha
