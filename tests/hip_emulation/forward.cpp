// CPU emulation test of the AMD forward (hip/fwd/amd/kernel.h with its tile, copy and mainloop): runs the
// unmodified kernel sources with every work-item a fiber, the MFMA and lane exchange emulated per the
// documented layouts (tests/hip_emulation/arch/amd/matrix_core.h), and compares with a float64
// reference. Poisoned padding columns, gap rows (group mode with logical lengths), poisoned outputs and
// LDS. fp8 e4m3 inputs (the emulated architecture's encoding) with descales per tensor or per (sequence,
// kv head), bf16 out, within the rule of tests/hip_emulation/kvcache.cpp: O within 4× (max) and 3× (mean)
// the error of a baseline that rounds 2^kPShift · P to the format and O to bf16, plus a floor.
#include "emu_test.h"

#include <math.h>

#include <algorithm>

#include <string>

#include "fwd/amd/dense_tiles.h"
#include "fwd/amd/kernel.h"
#include "fwd/amd/tile.h"

using namespace fmha;
using emu::from_bits;
using emu::nan_bits;
using emu::rng;
using emu::to_bits;

struct Case {
  int dtype;  // 0 fp16, 1 bf16, 2 fp8 (arch::Fp8E4m3; the 128 bucket)
  int hdim_q, hdim_v;
  int batch, nhead_q, nhead_k;
  bool group, logical;
  std::vector<int> sq, sk;  // logical lengths per batch (batch mode: sq[0], sk[0])
  int mask_type, left, right;
  bool write_lse;
  int scales = 0;  // fp8 descales: 0 none, 1 per tensor, 2 per (sequence, kv head)
};

template <typename T, int D, bool M>
static void launch(const fmha_fwd_params& p) {
  using Tile = AmdForwardTile<T, D>;
  static_assert(Tile::kThreads == 256, "emulated workgroups have 256 work-items");
  const dim3 grid((p.max_seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, p.nhead_q, p.batch);
  emu::launch(grid, Tile::kLdsBytes, [&] { forward_kernel_amd<T, D, M, fmha_fwd_params>(p); });
}

template <typename T, int D>
static void dispatch_masked(const fmha_fwd_params& p) {
  if (p.masked) launch<T, D, true>(p); else launch<T, D, false>(p);
}
template <typename T>
static void dispatch(const fmha_fwd_params& p) {
  if constexpr (arch::Element<T>::kBytes == 2) {
    if (p.hdim_bucket == 64) return dispatch_masked<T, 64>(p);
  }
  dispatch_masked<T, 128>(p);  // fp8: the 128 bucket only
}

// `Code`: the inputs' element (uint16_t, or uint8_t for fp8); O is 16-bit (bf16 for fp8).
template <typename Code>
static bool run_case(const Case& c) {
  const bool fp8 = c.dtype == 2;
  const int out_dtype = fp8 ? 1 : c.dtype;
  const int bucket = (c.hdim_q > 64 || c.hdim_v > 64 || fp8) ? 128 : 64;
  const int dpad = bucket + 16 / (int)sizeof(Code);  // padding columns (one 16-byte chunk), poisoned
  const int B = c.batch, Hq = c.nhead_q, Hk = c.nhead_k;
  // Physical layout: batch mode [b][s][h][dpad]; group mode [total][h][dpad] with gap rows.
  std::vector<int> qstart(B + 1, 0), kstart(B + 1, 0);
  int max_sq = 0;
  for (int b = 0; b < B; ++b) {
    const int gq = c.group && c.logical ? (b * 7) % 5 : 0, gk = c.group && c.logical ? (b * 3) % 4 + 1 : 0;
    qstart[b + 1] = qstart[b] + c.sq[b] + gq;
    kstart[b + 1] = kstart[b] + c.sk[b] + gk;
    if (c.sq[b] > max_sq) max_sq = c.sq[b];
  }
  const int sq0 = c.sq[0], sk0 = c.sk[0];
  const size_t q_rows = c.group ? qstart[B] : (size_t)B * sq0, k_rows = c.group ? kstart[B] : (size_t)B * sk0;
  std::vector<Code> q(q_rows * Hq * dpad + 16), k(k_rows * Hk * dpad + 16), v(k_rows * Hk * dpad + 16);
  std::vector<uint16_t> o(q_rows * Hq * dpad + 16);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto fill = [&](std::vector<Code>& t, int hdim) {
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = (Code)((i % dpad) < (size_t)hdim ? to_bits(c.dtype, uni(rng) * 2.f) : nan_bits(c.dtype));
  };
  fill(q, c.hdim_q);
  fill(k, c.hdim_q);
  fill(v, c.hdim_v);
  // Gap rows of group mode are NaN too.
  auto poison_gaps = [&](std::vector<Code>& t, const std::vector<int>& start, const std::vector<int>& len, int H) {
    if (!c.group) return;
    for (int b = 0; b < B; ++b)
      for (int r = start[b] + len[b]; r < start[b + 1]; ++r)
        for (int x = 0; x < H * dpad; ++x) t[(size_t)r * H * dpad + x] = (Code)nan_bits(c.dtype);
  };
  poison_gaps(q, qstart, c.sq, Hq);
  poison_gaps(k, kstart, c.sk, Hk);
  poison_gaps(v, kstart, c.sk, Hk);
  for (auto& x : o) x = 0x7c01;  // poison (a NaN in both types' views)
  const size_t total_q = c.group ? qstart[B] : (size_t)sq0;
  std::vector<float> lse(c.group ? (size_t)Hq * total_q : (size_t)B * Hq * sq0);
  for (auto& x : lse) x = 12345.f;

  arch::g_buffers.clear();
  std::vector<int32_t> seqstart_q(qstart.begin(), qstart.end()), seqstart_k(kstart.begin(), kstart.end());
  std::vector<int32_t> lens_q(c.sq.begin(), c.sq.end()), lens_k(c.sk.begin(), c.sk.end());
  emu::expose(q), emu::expose(k), emu::expose(v), emu::expose(o), emu::expose(lse);
  emu::expose(seqstart_q), emu::expose(seqstart_k), emu::expose(lens_q), emu::expose(lens_k);

  fmha_fwd_params p;
  memset(&p, 0, sizeof p);
  p.q = (uint64_t)q.data();
  p.k = (uint64_t)k.data();
  p.v = (uint64_t)v.data();
  p.o = (uint64_t)o.data();
  p.lse = c.write_lse ? (uint64_t)lse.data() : 0;
  if (c.group) {
    p.seqstart_q = (uint64_t)seqstart_q.data();
    p.seqstart_k = (uint64_t)seqstart_k.data();
    if (c.logical) {
      p.seqlen_q_ptr = (uint64_t)lens_q.data();
      p.seqlen_k_ptr = (uint64_t)lens_k.data();
    }
  }
  p.q_row_stride = (int64_t)Hq * dpad, p.q_head_stride = dpad, p.q_batch_stride = c.group ? 0 : (int64_t)sq0 * Hq * dpad;
  p.k_row_stride = (int64_t)Hk * dpad, p.k_head_stride = dpad, p.k_batch_stride = c.group ? 0 : (int64_t)sk0 * Hk * dpad;
  p.v_row_stride = p.k_row_stride, p.v_head_stride = dpad, p.v_batch_stride = p.k_batch_stride;
  p.o_row_stride = p.q_row_stride, p.o_head_stride = dpad, p.o_batch_stride = p.q_batch_stride;
  p.lse_head_stride = total_q, p.lse_batch_stride = c.group ? 0 : (int64_t)Hq * sq0;
  p.batch = B, p.nhead_q = Hq, p.nhead_k = Hk, p.hdim_q = c.hdim_q, p.hdim_v = c.hdim_v;
  p.seqlen_q = c.group ? qstart[B] : sq0;
  p.seqlen_k = c.group ? kstart[B] : sk0;
  p.max_seqlen_q = max_sq;
  p.group_mode = c.group;
  p.mask_type = c.mask_type, p.window_left = c.left, p.window_right = c.right;
  const double scale = 1.0 / sqrt((double)c.hdim_q);
  p.scale_log2 = (float)(scale * 1.4426950408889634);
  p.dtype = c.dtype, p.hdim_bucket = bucket, p.masked = c.mask_type != 0;

  // fp8 descales: [B][Hk] or one value, in [0.25, 2].
  std::uniform_real_distribution<float> scale_draw(0.25f, 2.f);
  std::vector<float> descales[3];  // q, k, v
  fmha_descale_params* fields[3] = {&p.q_descale, &p.k_descale, &p.v_descale};
  for (int t = 0; t < 3 && c.scales != 0; ++t) {
    descales[t].resize(c.scales == 2 ? (size_t)B * Hk : 1);
    for (auto& x : descales[t]) x = scale_draw(rng);
    emu::expose(descales[t]);
    fields[t]->data = (uint64_t)descales[t].data();
    fields[t]->batch_stride = c.scales == 2 ? Hk : 0;
    fields[t]->head_stride = c.scales == 2 ? 1 : 0;
  }
  auto descale = [&](int t, int b, int g) {
    return descales[t].empty() ? 1.0 : (double)descales[t][c.scales == 2 ? (size_t)b * Hk + g : 0];
  };

  if (max_sq > 0) {
    if (c.dtype == 0) dispatch<arch::Half>(p);
    else if (c.dtype == 1) dispatch<arch::BFloat16>(p);
    else dispatch<arch::Fp8E4m3>(p);
  }

  // Reference and checks.
  const double tol = c.dtype == 0 ? 4e-3 : 2.5e-2;
  const double shift = ldexp(1.0, (int)arch::Element<arch::Fp8E4m3>::kPShift);
  double max_err = 0, max_lse_err = 0, base_max = 0, err_sum = 0, base_sum = 0;
  size_t count = 0;
  int bad = 0;
  std::vector<char> written_o(o.size(), 0), written_lse(lse.size(), 0);
  for (int b = 0; b < B; ++b) {
    const int sq = c.sq[b], sk = c.sk[b];
    const int64_t qs = c.group ? qstart[b] : 0, ks = c.group ? kstart[b] : 0;
    const ResolvedMask mask = resolve_mask(c.mask_type, c.left, c.right, sq, sk);
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / (Hq / Hk);
      const double dq = descale(0, b, hk), dk = descale(1, b, hk), dv = descale(2, b, hk);
      for (int i = 0; i < sq; ++i) {
        const size_t qrow = c.group ? (size_t)(qs + i) : (size_t)b * sq0 + i;
        std::vector<double> s(sk);
        double m = -INFINITY, abs_dot = 0;
        for (int j = 0; j < sk; ++j) {
          if (c.mask_type != 0 && !mask.kept(i, j, sk)) { s[j] = -INFINITY; continue; }
          const size_t krow = c.group ? (size_t)(ks + j) : (size_t)b * sk0 + j;
          double dot = 0, abs = 0;
          for (int d = 0; d < c.hdim_q; ++d) {
            const double x =
                (double)from_bits(c.dtype, q[(qrow * Hq + h) * dpad + d]) * dq * from_bits(c.dtype, k[(krow * Hk + hk) * dpad + d]) * dk;
            dot += x, abs += fabs(x);
          }
          abs_dot = std::max(abs_dot, abs);
          s[j] = dot * scale;
          if (s[j] > m) m = s[j];
        }
        double l = 0;
        for (int j = 0; j < sk; ++j) if (s[j] != -INFINITY) l += exp(s[j] - m);
        for (int d = 0; d < c.hdim_v; ++d) {
          double acc = 0, low = 0;
          if (l > 0)
            for (int j = 0; j < sk; ++j) {
              if (s[j] == -INFINITY) continue;
              const size_t krow = c.group ? (size_t)(ks + j) : (size_t)b * sk0 + j;
              const double pj = exp(s[j] - m), vj = from_bits(c.dtype, v[(krow * Hk + hk) * dpad + d]) * dv;
              acc += pj / l * vj;
              // The baseline: P rounded to fp8 as 2^kPShift · P (against the final max), O to bf16.
              if (fp8) low += from_bits(2, to_bits(2, (float)(pj * shift))) / shift / l * vj;
            }
          const size_t at = (qrow * Hq + h) * dpad + d;
          written_o[at] = 1;
          const float got = from_bits(out_dtype, o[at]);
          const double err = fabs(got - acc);
          if (fp8) {
            const double base = fabs(from_bits(1, to_bits(1, (float)low)) - acc);
            base_max = std::max(base_max, base), base_sum += base, err_sum += err, ++count;
            if (err != err && bad++ < 5) printf("    O NaN b%d h%d i%d d%d\n", b, h, i, d);
          } else if (!(err <= tol)) {
            if (bad++ < 5) printf("    O mismatch b%d h%d i%d d%d: got %g want %g\n", b, h, i, d, got, acc);
          }
          if (err > max_err || err != err) max_err = err;
        }
        if (c.write_lse) {
          const size_t at = c.group ? (size_t)h * total_q + qs + i : ((size_t)b * Hq + h) * sq0 + i;
          written_lse[at] = 1;
          const double want = l > 0 ? m + log(l) : -INFINITY;
          const double got = lse[at];
          // fp8: plus the matrix cores' accumulation error (none in this emulation, which sums in fp32).
          const double accumulation = fp8 ? ldexp(scale * abs_dot, -13) : 0.0;
          const bool ok = (want == -INFINITY) ? got == -INFINITY
                                              : fabs(got - want) <= 2e-3 + 1e-4 * fabs(want) + accumulation;
          if (!ok && bad++ < 5) printf("    LSE mismatch b%d h%d i%d: got %g want %g\n", b, h, i, got, want);
          if (want != -INFINITY && fabs(got - want) > max_lse_err) max_lse_err = fabs(got - want);
        }
      }
    }
  }
  size_t stray = 0;
  for (size_t i = 0; i < o.size(); ++i) if (!written_o[i] && o[i] != 0x7c01) ++stray;
  for (size_t i = 0; i < lse.size(); ++i) if (!written_lse[i] && lse[i] != 12345.f) ++stray;
  if (stray) printf("    %zu elements written outside the output region\n", stray);
  if (fp8 && count > 0) {
    const double mean = err_sum / count, base_mean = base_sum / count;
    printf("    fp8: max |dO| %.2e (baseline %.2e), mean %.2e (baseline %.2e)\n", max_err, base_max, mean, base_mean);
    if (!(max_err <= 4 * base_max + ldexp(1.0, -6)) || !(mean <= 3 * base_mean + ldexp(1.0, -8))) ++bad;
  }
  return bad == 0 && stray == 0 && (printf("    max |dO| %.2e, max |dLSE| %.2e\n", max_err, max_lse_err), true);
}

int main(int argc, char** argv) {
  emu::seed_rng();
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  for (int dtype = 0; dtype < 2; ++dtype) {
    // Batch mode: masks, lengths, head dims.
    add({dtype, 64, 64, 2, 2, 2, false, false, {129, 129}, {200, 200}, 0, -1, -1, true});
    add({dtype, 128, 128, 1, 2, 1, false, false, {130}, {130}, 1, -1, 0, true});
    add({dtype, 128, 128, 1, 4, 1, false, false, {77}, {300}, 2, -1, 0, true});
    add({dtype, 96, 72, 1, 2, 2, false, false, {200}, {97}, 2, -1, 0, true});
    add({dtype, 48, 40, 2, 4, 2, false, false, {17, 17}, {1, 1}, 0, -1, -1, true});
    add({dtype, 64, 64, 1, 1, 1, false, false, {1}, {129}, 1, -1, 0, true});
    add({dtype, 128, 128, 1, 2, 2, false, false, {260}, {150}, 1, 20, 0, true});
    add({dtype, 64, 48, 1, 2, 1, false, false, {150}, {260}, 2, 5, 3, false});
    add({dtype, 128, 96, 1, 1, 1, false, false, {128}, {128}, 2, 0, 0, true});
    add({dtype, 64, 64, 1, 2, 2, false, false, {200}, {60}, 1, -1, 0, true});   // rows with no key
    add({dtype, 128, 64, 1, 1, 1, false, false, {64}, {0}, 0, -1, -1, true});   // seqlen_k = 0
    // Group mode: seqstarts, logical lengths, zero-length batches.
    add({dtype, 64, 64, 3, 2, 1, true, false, {100, 0, 37}, {50, 80, 0}, 2, -1, 0, true});
    add({dtype, 128, 128, 4, 2, 2, true, true, {129, 5, 0, 64}, {64, 0, 33, 190}, 1, -1, 0, true});
    add({dtype, 96, 96, 3, 4, 2, true, true, {70, 140, 1}, {210, 33, 1}, 0, -1, -1, true});
    add({dtype, 64, 32, 2, 2, 1, true, true, {90, 40}, {90, 170}, 2, 7, 2, true});
  }
  // fp8 (the 128 bucket; head dims in multiples of 16): descales per (sequence, kv head), per tensor and
  // none, batch and group mode, masks, GQA, rows with no key.
  add({2, 128, 128, 2, 4, 2, false, false, {129, 129}, {200, 200}, 0, -1, -1, true, 2});
  add({2, 128, 128, 1, 2, 1, false, false, {130}, {300}, 2, -1, 0, true, 1});
  add({2, 96, 64, 1, 2, 2, false, false, {200}, {60}, 1, -1, 0, true, 0});
  add({2, 128, 112, 3, 4, 2, true, true, {70, 0, 140}, {210, 33, 90}, 2, -1, 0, true, 2});
  add({2, 64, 48, 2, 2, 1, true, false, {90, 40}, {90, 170}, 2, 7, 2, false, 1});
  if (argc > 1 && std::string(argv[1]) == "long") {
    cases.clear();
    add({1, 128, 128, 1, 2, 1, false, false, {1000}, {1000}, 2, -1, 0, true});
    add({0, 64, 64, 1, 8, 1, false, false, {513}, {1000}, 0, -1, -1, true});
    add({0, 128, 128, 2, 2, 2, true, true, {700, 300}, {900, 1200}, 1, 100, 50, true});
  }
  int failed = 0;
  for (size_t n = 0; n < cases.size(); ++n) {
    const Case& c = cases[n];
    std::string lens;
    for (size_t b = 0; b < c.sq.size(); ++b) lens += std::to_string(c.sq[b]) + "x" + std::to_string(c.sk[b]) + " ";
    const char* dtype_names[] = {"fp16", "bf16", "fp8"};
    printf("case %zu: %s hq%d hv%d b%d h%d/%d %s%s mask %d (%d,%d) lens %s\n", n, dtype_names[c.dtype], c.hdim_q,
           c.hdim_v, c.batch, c.nhead_q, c.nhead_k, c.group ? "group" : "batch", c.logical ? "+logical" : "",
           c.mask_type, c.left, c.right, lens.c_str());
    fflush(stdout);
    if (c.scales != 0) printf("  descales %s\n", c.scales == 1 ? "per tensor" : "per (sequence, kv head)");
    if (!(c.dtype == 2 ? run_case<uint8_t>(c) : run_case<uint16_t>(c))) {
      printf("  FAILED\n");
      ++failed;
    }
  }
  printf("%s: %d of %zu cases failed\n", argc > 0 ? argv[0] : "", failed, cases.size());
  return failed != 0;
}
