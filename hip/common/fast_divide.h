// Division by a divisor fixed before a kernel starts, as a multiply and a shift: a GPU has no integer
// divider, and a 32-bit quotient in software takes ~20 dependent instructions (64-bit: a ~90-instruction
// call). The launch builds the divisor on the host; the kernel divides per tile.
#pragma once

#include <stdint.h>

#include "arch/registers.h"

namespace fmha {

// For a divisor d ≥ 1 and l = ⌈log2 d⌉: m = ⌈2^(31+l) / d⌉ < 2^32, and for 0 ≤ n < 2^31,
// ⌊n / d⌋ = ⌊n · m / 2^(31+l)⌋ (n · m / 2^(31+l) exceeds n / d by less than n / 2^(31+l) < 2^-l ≤ 1/d,
// which cannot carry past the next multiple of 1/d). Divisors of 2^31 and more take m = 0 (their
// quotients of such n are 0); dividends outside [0, 2^31) divide the slow way.
class FastDivide {
 public:
  FastDivide() = default;
  FMHA_HOST_DEVICE explicit FastDivide(int64_t divisor) : divisor_(divisor < 1 ? 1 : divisor) {
    int l = 0;
    while (l < 32 && (int64_t{1} << l) < divisor_) ++l;
    shift_ = 31 + l;
    multiplier_ = divisor_ <= kFastMax ? static_cast<uint32_t>(((uint64_t{1} << shift_) + divisor_ - 1) / divisor_) : 0;
  }

  FMHA_HOST_DEVICE int64_t divisor() const { return divisor_; }
  FMHA_HOST_DEVICE int64_t quotient(int64_t n) const {
    if (static_cast<uint64_t>(n) > kFastMax) return n / divisor_;
    return static_cast<int64_t>((static_cast<uint64_t>(n) * multiplier_) >> shift_);
  }
  FMHA_HOST_DEVICE int64_t remainder(int64_t n) const { return n - quotient(n) * divisor_; }

 private:
  static constexpr int64_t kFastMax = 0x7fffffff;
  int64_t divisor_ = 1;
  uint32_t multiplier_ = 1u << 31;
  int shift_ = 31;
};

}  // namespace fmha
