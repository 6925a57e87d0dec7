// CPU emulation test of the merge of attention states (hip/merge/merge.h) as compiled for AMD: the
// unmodified kernel with every work-item a fiber, on random states (empty ±inf, all-empty and NaN
// rows, poisoned empty states, random strides, in place), every pair of element types, both LSE bases,
// on the vector and the element-by-element paths, against a float64 merge; the gaps of the outputs
// must stay as poisoned.
#include "emu_test.h"

#include <math.h>

#include <string>

#include "merge/merge.h"

using namespace fmha;
using emu::rng;

namespace {

int g_failures = 0;

void fail(const std::string& what) {
  if (++g_failures <= 10) printf("FAIL %s\n", what.c_str());
}

double unit() { return std::uniform_real_distribution<double>(-1.0, 1.0)(rng); }
int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Element codes as merge.h: 0 fp16, 1 bf16, 2 fp32; stored as 4 bytes per element in a byte vector.
size_t bytes_of(int dtype) { return dtype == 2 ? 4 : 2; }
void store(std::vector<uint8_t>& buf, size_t index, int dtype, double x) {
  if (dtype == 2) {
    const float f = static_cast<float>(x);
    memcpy(&buf[index * 4], &f, 4);
  } else {
    const uint16_t b = emu::to_bits(dtype, static_cast<float>(x));
    memcpy(&buf[index * 2], &b, 2);
  }
}
double load(const std::vector<uint8_t>& buf, size_t index, int dtype) {
  if (dtype == 2) {
    float f;
    memcpy(&f, &buf[index * 4], 4);
    return f;
  }
  uint16_t b;
  memcpy(&b, &buf[index * 2], 2);
  return emu::from_bits(dtype, b);
}

template <int kIn, int kOut>
void launch(const fmha_merge_params& p, bool vector) {
  constexpr int kN = merge::vector_columns<kIn, kOut>();
  const int64_t items = int64_t(p.num_rows) * p.nhead;
  const dim3 grid(static_cast<uint32_t>((items + merge::kWaves - 1) / merge::kWaves));
  if (vector && merge::vectorizable<kIn, kOut, kN>(p)) {
    emu::launch(grid, 0, [&] { merge::merge_kernel<kIn, kOut, kN>(p); });
  } else {
    emu::launch(grid, 0, [&] { merge::merge_kernel<kIn, kOut, 1>(p); });
  }
}

template <int kIn>
void launch_in(const fmha_merge_params& p, bool vector) {
  if (p.out_dtype == 0) launch<kIn, 0>(p, vector);
  if (p.out_dtype == 1) launch<kIn, 1>(p, vector);
  if (p.out_dtype == 2) launch<kIn, 2>(p, vector);
}

void run_case(int index, int in_dtype, int out_dtype, bool base2, bool padded, bool in_place) {
  const int s = pick(1, 8), r = pick(1, 9), h = pick(1, 3);
  const int d = padded ? pick(1, 70) : 8 * pick(1, 17);
  const int pad = padded ? pick(1, 3) : 0;
  const double ln2 = log(2.0);
  // o_in [s][h][r][d] with rows of d + pad, lse_in [s][h][r] with a gap per state; o_out / lse_out
  // [h][r] (in place: state 0 of o_in / lse_in).
  const int64_t row = d + pad, head = row * r, state = head * h + pad;
  const int64_t lse_head = r, lse_state = int64_t(r) * h + 1;
  std::vector<uint8_t> o_in(size_t(state) * s * bytes_of(in_dtype));
  std::vector<uint8_t> lse_in(size_t(lse_state) * s * 4, 0x7f);
  for (size_t i = 0; i < o_in.size() / bytes_of(in_dtype); ++i) store(o_in, i, in_dtype, 1e4);
  std::vector<double> lse(size_t(s) * h * r);
  std::vector<std::vector<double>> o(size_t(s) * h * r);
  const bool nan_row = pick(0, 2) == 0;
  for (int si = 0; si < s; ++si)
    for (int hi = 0; hi < h; ++hi)
      for (int ri = 0; ri < r; ++ri) {
        const size_t at = (size_t(si) * h + hi) * r + ri;
        const int kind = pick(0, 14);
        double x = kind < 2 ? -INFINITY : kind == 2 ? INFINITY : float(unit() * 6.0);
        if (hi == 0 && ri == 0) x = si % 2 ? INFINITY : -INFINITY;  // an all-empty row
        if (nan_row && hi == h - 1 && ri == r - 1 && si == s / 2) x = NAN;
        const float stored = static_cast<float>(base2 ? x / ln2 : x);
        memcpy(&lse_in[(si * lse_state + hi * lse_head + ri) * 4], &stored, 4);
        lse[at] = base2 ? double(stored) * ln2 : double(stored);
        o[at].resize(d);
        for (int c = 0; c < d; ++c) {
          const size_t e = si * state + hi * head + ri * row + c;
          store(o_in, e, in_dtype, std::isinf(x) ? NAN : unit());  // an empty state's O is not read
          o[at][c] = load(o_in, e, in_dtype);
        }
      }
  std::vector<uint8_t> o_out(size_t(head) * h * bytes_of(out_dtype)), lse_out(size_t(r) * h * 4);
  for (size_t i = 0; i < o_out.size() / bytes_of(out_dtype); ++i) store(o_out, i, out_dtype, NAN);
  for (size_t i = 0; i < lse_out.size() / 4; ++i) store(lse_out, i, 2, NAN);
  std::vector<uint8_t> o_before = in_place ? o_in : o_out, lse_before = in_place ? lse_in : lse_out;

  fmha_merge_params p = {};
  p.o_in = reinterpret_cast<uint64_t>(o_in.data());
  p.lse_in = reinterpret_cast<uint64_t>(lse_in.data());
  p.o_out = reinterpret_cast<uint64_t>(in_place ? o_in.data() : o_out.data());
  p.lse_out = reinterpret_cast<uint64_t>(in_place ? lse_in.data() : lse_out.data());
  p.o_in_state_stride = state, p.o_in_head_stride = head, p.o_in_row_stride = row;
  p.lse_in_state_stride = lse_state, p.lse_in_head_stride = lse_head, p.lse_in_row_stride = 1;
  p.o_out_head_stride = head, p.o_out_row_stride = row, p.lse_out_head_stride = lse_head, p.lse_out_row_stride = 1;
  p.num_states = s, p.num_rows = r, p.nhead = h, p.hdim = d;
  p.in_dtype = in_dtype, p.out_dtype = out_dtype, p.lse_base2 = base2;
  if (in_dtype == 0) launch_in<0>(p, true);
  if (in_dtype == 1) launch_in<1>(p, true);
  if (in_dtype == 2) launch_in<2>(p, true);

  std::vector<uint8_t>& o_after = in_place ? o_in : o_out;
  std::vector<uint8_t>& lse_after = in_place ? lse_in : lse_out;
  const double eps = out_dtype == 0 ? 0x1p-10 : out_dtype == 1 ? 0x1p-7 : 0x1p-23, fp32 = 0x1p-24 * 8 * (s + 2);
  const std::string ctx = "case " + std::to_string(index) + " in " + std::to_string(in_dtype) + " out " +
                          std::to_string(out_dtype) + (base2 ? " base2" : "") + (padded ? " padded" : "") +
                          (in_place ? " in place" : "");
  for (int hi = 0; hi < h; ++hi)
    for (int ri = 0; ri < r; ++ri) {
      // The float64 merge.
      double m = -INFINITY, total = 0, scale = 0;
      bool nan = false;
      for (int si = 0; si < s; ++si) {
        const double x = lse[(size_t(si) * h + hi) * r + ri];
        nan |= std::isnan(x);
        if (std::isfinite(x)) m = fmax(m, x);
      }
      std::vector<double> want(d, 0.0);
      for (int si = 0; si < s && m > -INFINITY; ++si) {
        const size_t at = (size_t(si) * h + hi) * r + ri;
        if (!std::isfinite(lse[at])) continue;
        const double w = exp(lse[at] - m);
        total += w;
        for (int c = 0; c < d; ++c) {
          want[c] += w * o[at][c];
          scale = fmax(scale, fabs(o[at][c]));
        }
      }
      for (int c = 0; c < d; ++c) want[c] = nan ? NAN : total > 0 ? want[c] / total : 0.0;
      double want_lse = nan ? NAN : total > 0 ? m + log(total) : -INFINITY;
      if (base2) want_lse /= ln2;
      for (int c = 0; c < d; ++c) {
        const size_t e = hi * head + ri * row + c;
        const double got = load(o_after, e, out_dtype);
        const bool good = std::isnan(want[c]) ? std::isnan(got) : fabs(got - want[c]) <= eps * fabs(want[c]) + fp32 * scale;
        if (!good) fail(ctx + ": O(" + std::to_string(ri) + ", " + std::to_string(hi) + ", " + std::to_string(c) + ") = " +
                        std::to_string(got) + ", expected " + std::to_string(want[c]));
        memcpy(&o_before[e * bytes_of(out_dtype)], &o_after[e * bytes_of(out_dtype)], bytes_of(out_dtype));
      }
      const size_t e = hi * lse_head + ri;
      const double got = load(lse_after, e, 2);
      const bool good = std::isnan(want_lse)   ? std::isnan(got)
                        : std::isinf(want_lse) ? got == want_lse
                                               : fabs(got - want_lse) <= fp32 * (fabs(want_lse) + s + 1);
      if (!good) fail(ctx + ": LSE = " + std::to_string(got) + ", expected " + std::to_string(want_lse));
      memcpy(&lse_before[e * 4], &lse_after[e * 4], 4);
    }
  if (o_before != o_after || lse_before != lse_after) fail(ctx + ": a byte outside the outputs changed");
}

}  // namespace

int main() {
  emu::seed_rng();
  int index = 0;
  for (int in = 0; in < 3; ++in)
    for (int out = 0; out < 3; ++out)
      for (int base2 = 0; base2 < 2; ++base2)
        for (int padded = 0; padded < 2; ++padded) run_case(index++, in, out, base2, padded, in == out && !padded && base2);
  printf("%d merge cases, %d failures\n", index, g_failures);
  return g_failures == 0 ? 0 : 1;
}
