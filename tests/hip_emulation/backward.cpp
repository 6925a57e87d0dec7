// CPU emulation test of the AMD backward: the unmodified kernel sources of the whole run (dot_do_o,
// the dq_acc zeroing, dq_dk_dv in bwd/amd/, convert_dq), with every work-item a fiber and MFMA,
// buffer loads and the lane exchange emulated per the documented layouts (arch/amd/matrix_core.h
// here), on a workspace prepared by the project's own prepare_metadata. dQ, dK and dV are held to the
// field's rule against a float64 reference: at most 3x the error of the same computation in the input
// precision (src/reference.rs's LowPrecision), plus a rounding floor. Poisoned padding columns, gap
// rows, outputs, dq_acc and LDS; deterministic mode checks that every dq_acc element is added to by one
// work-item only.
#include "emu_test.h"

#include <math.h>

#include <string>
#include <unordered_map>

#include "bwd/convert_dq.h"
#include "bwd/dot_do_o.h"
#include "bwd/amd/kernel.h"
#include "bwd/amd/tile.h"
#include "bwd/prepare_workspace.h"

using namespace fmha;
using emu::from_bits;
using emu::nan_bits;
using emu::to_bits;

struct Case {
  int dtype;  // 0 fp16, 1 bf16
  int hdim_q, hdim_v;
  int nhead_q, nhead_k;
  bool group, logical;      // group mode; with logical lengths (gap rows after each batch)
  std::vector<int> sq, sk;  // per batch (batch mode: all equal)
  int mask_type, left, right;
  bool deterministic;
  int num_cus;
};

// The tensors of one case, in the kernels' layouts: rows × heads × (bucket + 8) 16-bit elements (batch
// mode [batch][rows]; group mode the batches' physical rows one after the other), LSE and D [batch][head]
// [rows] (batch mode) or [head][total rows] (group mode).
struct Problem {
  const Case& c;
  int batch, bucket, dpad, group_size;
  std::vector<int> qstart, kstart;  // physical row starts (batch mode: b · rows)
  int q_rows, k_rows, max_sq, max_sk_physical;

  explicit Problem(const Case& c_) : c(c_) {
    batch = static_cast<int>(c.sq.size());
    bucket = c.hdim_q > 64 || c.hdim_v > 64 ? 128 : 64;
    dpad = bucket + 8;
    group_size = c.nhead_q / c.nhead_k;
    qstart.assign(batch + 1, 0);
    kstart.assign(batch + 1, 0);
    max_sq = max_sk_physical = 0;
    for (int b = 0; b < batch; ++b) {
      const int gq = c.logical ? (b * 7) % 5 : 0, gk = c.logical ? (b * 3) % 4 + 1 : 0;
      qstart[b + 1] = qstart[b] + c.sq[b] + gq;
      kstart[b + 1] = kstart[b] + c.sk[b] + gk;
      max_sq = std::max(max_sq, c.sq[b]);
      max_sk_physical = std::max(max_sk_physical, c.sk[b] + gk);
    }
    q_rows = qstart[batch];
    k_rows = kstart[batch];
  }
  size_t q_at(int b, int i, int h, int d) const { return (size_t(qstart[b] + i) * c.nhead_q + h) * dpad + d; }
  size_t k_at(int b, int j, int h, int d) const { return (size_t(kstart[b] + j) * c.nhead_k + h) * dpad + d; }
  size_t stat_at(int b, int h, int i) const {
    return c.group ? size_t(h) * q_rows + qstart[b] + i : (size_t(b) * c.nhead_q + h) * c.sq[0] + i;
  }
};

// The reference (src/reference.rs): the forward, then D = rowsum(dO∘O), dS = P∘(dO·Vᵀ − D),
// dQ = scale·dS·K, dK = scale·dSᵀ·Q summed over the GQA group, dV = Pᵀ·dO likewise. `low`: every
// intermediate in f32, P and dS rounded to the input type for the products, outputs rounded.
struct Grads {
  std::vector<double> dq, dk, dv, o, lse;  // indexed like the tensors (o, lse: the forward's)
};

static Grads reference(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, const std::vector<double>& d_o, float scale_f, bool low) {
  const Case& c = pr.c;
  auto acc = [&](double x) { return low ? double(float(x)) : x; };
  auto lp = [&](double x) { return low ? double(from_bits(c.dtype, to_bits(c.dtype, float(x)))) : x; };
  const double scale = acc(scale_f);
  Grads g;
  g.dq.assign(q.size(), 0), g.dk.assign(k.size(), 0), g.dv.assign(v.size(), 0), g.o.assign(q.size(), 0);
  g.lse.assign(size_t(c.nhead_q) * (c.group ? pr.q_rows : pr.batch * c.sq[0]), 0);
  for (int b = 0; b < pr.batch; ++b) {
    const int sq = c.sq[b], sk = c.sk[b];
    const ResolvedMask mask = resolve_mask(c.mask_type, c.left, c.right, sq, sk);
    std::vector<double> dk_h(size_t(sk) * c.hdim_q), dv_h(size_t(sk) * c.hdim_v);
    for (int h = 0; h < c.nhead_q; ++h) {
      const int hk = h / pr.group_size;
      std::fill(dk_h.begin(), dk_h.end(), 0.0);
      std::fill(dv_h.begin(), dv_h.end(), 0.0);
      for (int i = 0; i < sq; ++i) {
        std::vector<double> t(sk, -INFINITY), p(sk, 0.0);
        double max = -INFINITY;
        for (int j = 0; j < sk; ++j) {
          if (c.mask_type != 0 && !mask.kept(i, j, sk)) continue;
          double s = 0;
          for (int d = 0; d < c.hdim_q; ++d) s = acc(s + acc(q[pr.q_at(b, i, h, d)] * k[pr.k_at(b, j, hk, d)]));
          t[j] = acc(scale * s);
          max = std::max(max, t[j]);
        }
        double lse = -INFINITY;
        if (max != -INFINITY) {
          double sum = 0;
          for (int j = 0; j < sk; ++j)
            if (t[j] != -INFINITY) sum = acc(sum + acc(exp(acc(t[j] - max))));
          lse = acc(max + acc(log(sum)));
          for (int j = 0; j < sk; ++j)
            if (t[j] != -INFINITY) p[j] = acc(exp(acc(t[j] - lse)));
        }
        g.lse[pr.stat_at(b, h, i)] = lse;
        std::vector<double> o(c.hdim_v);
        for (int d = 0; d < c.hdim_v; ++d) {
          double x = 0;
          for (int j = 0; j < sk; ++j) x = acc(x + acc(lp(p[j]) * v[pr.k_at(b, j, hk, d)]));
          o[d] = lp(x);
          g.o[pr.q_at(b, i, h, d)] = o[d];
        }
        double big_d = 0;
        for (int d = 0; d < c.hdim_v; ++d) big_d = acc(big_d + acc(d_o[pr.q_at(b, i, h, d)] * o[d]));
        std::vector<double> dq_row(c.hdim_q, 0.0);
        for (int j = 0; j < sk; ++j) {
          if (p[j] == 0.0) continue;
          double dp = 0;
          for (int d = 0; d < c.hdim_v; ++d) dp = acc(dp + acc(d_o[pr.q_at(b, i, h, d)] * v[pr.k_at(b, j, hk, d)]));
          const double ds = lp(acc(p[j] * acc(dp - big_d))), p_lp = lp(p[j]);
          for (int d = 0; d < c.hdim_q; ++d) {
            dq_row[d] = acc(dq_row[d] + acc(ds * k[pr.k_at(b, j, hk, d)]));
            dk_h[size_t(j) * c.hdim_q + d] = acc(dk_h[size_t(j) * c.hdim_q + d] + acc(ds * q[pr.q_at(b, i, h, d)]));
          }
          for (int d = 0; d < c.hdim_v; ++d) {
            dv_h[size_t(j) * c.hdim_v + d] = acc(dv_h[size_t(j) * c.hdim_v + d] + acc(p_lp * d_o[pr.q_at(b, i, h, d)]));
          }
        }
        for (int d = 0; d < c.hdim_q; ++d) g.dq[pr.q_at(b, i, h, d)] = lp(acc(dq_row[d] * scale));
      }
      for (int j = 0; j < sk; ++j) {
        for (int d = 0; d < c.hdim_q; ++d) {
          double& out = g.dk[pr.k_at(b, j, hk, d)];
          out = acc(out + acc(dk_h[size_t(j) * c.hdim_q + d] * scale));
        }
        for (int d = 0; d < c.hdim_v; ++d) {
          double& out = g.dv[pr.k_at(b, j, hk, d)];
          out = acc(out + dv_h[size_t(j) * c.hdim_v + d]);
        }
      }
    }
  }
  for (auto* t : {&g.dk, &g.dv}) {
    for (double& x : *t) x = lp(x);
  }
  return g;
}

// The workspace of src/workspace/ for the case: the metadata layout (WorkspaceLayout::new, for the
// launcher's params: units are kv heads, dq_acc rows group · hdim_q wide), filled by the project's
// prepare_metadata, then dq_acc.
struct Workspace {
  fmha_prepare_params pp;
  prepare::BatchPersistent plan;
  int64_t dq_acc_elements;
  std::vector<uint8_t> bytes;
};

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <typename Tile>
static bool prepare_workspace(const Problem& pr, Workspace& w, const std::vector<int32_t>& seqstart_q,
                              const std::vector<int32_t>& seqstart_k) {
  const Case& c = pr.c;
  fmha_prepare_params& p = w.pp;
  memset(&p, 0, sizeof p);
  p.group_mode = c.group, p.deterministic = c.deterministic, p.batch = pr.batch;
  p.nhead_q = int64_t(pr.group_size) * c.nhead_k, p.nhead_k = c.nhead_k;
  p.row_elements = int64_t(pr.group_size) * c.hdim_q;
  p.seqlen_q = c.group ? pr.q_rows : c.sq[0];
  p.seqlen_k = c.group ? pr.k_rows : c.sk[0];
  p.max_seqlen_k = c.group ? pr.max_sk_physical : c.sk[0];
  p.m0 = Tile::kBlockM, p.n0 = Tile::kBlockN, p.num_cus = c.num_cus;
  p.remap = 1;  // AMD devices have 8 XCDs (runtime::Arch::has_eight_xcds)
  const bool g = c.group && c.deterministic;
  const int64_t b = pr.batch;
  p.nsplits_offset = 16;
  p.nsplits_count = g ? b : 1;
  p.dq_acc_offsets_offset = p.nsplits_offset + round_up(4 * p.nsplits_count, 16);
  p.dq_acc_offsets_count = g ? b + 1 : 0;
  p.cu_state_offset = p.dq_acc_offsets_offset + round_up(8 * p.dq_acc_offsets_count, 16);
  p.cu_state_count = g ? c.num_cus : 0;
  p.batch_state_offset = p.cu_state_offset + round_up(32 * p.cu_state_count, 16);
  p.batch_state_count = g ? b : 0;
  p.metadata_bytes = round_up(p.batch_state_offset + round_up(16 * p.batch_state_count, 16), 4096);
  if (!prepare::batch_persistent(p, &w.plan)) return false;
  const int64_t splits = !c.deterministic ? 1 : (c.group ? (p.max_seqlen_k + p.n0 - 1) / p.n0 : w.plan.nsplits);
  const int64_t total_q = c.group ? p.seqlen_q : b * p.seqlen_q;
  w.dq_acc_elements = p.nhead_k * splits * total_q * p.row_elements;
  w.bytes.assign(size_t(p.metadata_bytes) + 4 * size_t(w.dq_acc_elements), 0);
  // dq_acc poisoned: what convert_dq reads must have been zeroed or written by the run.
  for (size_t i = size_t(p.metadata_bytes); i < w.bytes.size(); i += 4) memcpy(&w.bytes[i], "\xff\xff\xff\x7f", 4);
  const int32_t status = prepare::prepare_metadata(w.bytes.data(), c.group ? seqstart_q.data() : nullptr,
                                                   c.group ? seqstart_k.data() : nullptr, p);
  if (status != prepare::kOk) printf("    prepare_metadata: status %d\n", status);
  return status == prepare::kOk;
}

// The launch stub's sequence (bwd/backward.hip), each grid emulated.
template <typename T, bool kBf16, int D, bool kMasked, bool kDeterministic>
static void run_backward(const fmha_bwd_params& p) {
  using Tile = AmdBackwardTile<D>;
  static_assert(Tile::kThreads == 256 && kDotThreads == 256 && kConvertThreads == 256,
                "emulated workgroups have 256 work-items");
  emu::launch(dot_do_o_grid(p), 0, [&] { dot_do_o_kernel<kBf16>(p); });
  const UnitGrid grid = dq_dk_dv_grid(p, kDeterministic, Tile::kBlockN);
  if (grid.x > 0) {
    emu::launch(dim3(grid.x, grid.y, grid.z), Tile::kLdsBytes,
                [&] { dq_dk_dv_kernel_amd<T, D, kMasked, kDeterministic>(p); });
  }
  if (p.max_seqlen_q > 0) emu::launch(row_tiles_grid(p, kConvertRows), 0, [&] { convert_dq_kernel<kBf16>(p); });
}

template <typename T, bool kBf16, int D>
static void dispatch_modes(const fmha_bwd_params& p) {
  if (p.deterministic) {
    if (p.masked) run_backward<T, kBf16, D, true, true>(p); else run_backward<T, kBf16, D, false, true>(p);
  } else {
    if (p.masked) run_backward<T, kBf16, D, true, false>(p); else run_backward<T, kBf16, D, false, false>(p);
  }
}

template <typename T, bool kBf16>
static void dispatch(const fmha_bwd_params& p) {
  if (p.hdim_bucket == 64) dispatch_modes<T, kBf16, 64>(p); else dispatch_modes<T, kBf16, 128>(p);
}

// max |x - y| over the logical elements of a tensor (x: the kernel's 16-bit output).
struct Check {
  double kernel = 0, same_precision = 0, max_exact = 0;
  size_t unwritten = 0;
};

template <typename At>
static void compare(Check& r, int dtype, const std::vector<uint16_t>& out, const Grads& exact, const Grads& low,
                    const std::vector<double> Grads::*t, At at_each) {
  at_each([&](size_t at) {
    const double got = from_bits(dtype, out[at]);
    if (!isfinite(got)) ++r.unwritten;
    r.kernel = std::max(r.kernel, isnan(got) ? INFINITY : fabs(got - (exact.*t)[at]));
    r.same_precision = std::max(r.same_precision, fabs((low.*t)[at] - (exact.*t)[at]));
    r.max_exact = std::max(r.max_exact, fabs((exact.*t)[at]));
  });
}

static bool run_case(const Case& c) {
  const Problem pr(c);
  const int B = pr.batch, Hq = c.nhead_q, Hk = c.nhead_k, dpad = pr.dpad;
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const size_t q_elems = size_t(pr.q_rows) * Hq * dpad + 8, k_elems = size_t(pr.k_rows) * Hk * dpad + 8;
  std::vector<uint16_t> q(q_elems), k(k_elems), v(k_elems), d_o(q_elems), o(q_elems, nan_bits(c.dtype));
  std::vector<uint16_t> dq(q_elems, 0x7c01), dk(k_elems, 0x7c01), dv(k_elems, 0x7c01);  // NaN in both types
  // Inputs: the logical rows' head dims random, everything else (padding columns, gap rows) NaN.
  auto fill = [&](std::vector<uint16_t>& t, bool k_side, int heads, int hdim) {
    for (auto& x : t) x = nan_bits(c.dtype);
    for (int b = 0; b < B; ++b) {
      const int rows = k_side ? c.sk[b] : c.sq[b], start = k_side ? pr.kstart[b] : pr.qstart[b];
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < heads; ++h)
          for (int d = 0; d < hdim; ++d) {
            t[(size_t(start + r) * heads + h) * dpad + d] = to_bits(c.dtype, uni(emu::rng));
          }
    }
  };
  fill(q, false, Hq, c.hdim_q), fill(k, true, Hk, c.hdim_q);
  fill(v, true, Hk, c.hdim_v), fill(d_o, false, Hq, c.hdim_v);
  auto widen = [&](const std::vector<uint16_t>& t) {
    std::vector<double> x(t.size());
    for (size_t i = 0; i < t.size(); ++i) x[i] = from_bits(c.dtype, t[i]);
    return x;
  };
  const float scale = 1.f / sqrtf(float(c.hdim_q));
  const std::vector<double> qd = widen(q), kd = widen(k), vd = widen(v), dod = widen(d_o);
  const Grads exact = reference(pr, qd, kd, vd, dod, scale, false);
  const Grads low = reference(pr, qd, kd, vd, dod, scale, true);

  // The forward's outputs as the backward reads them: O rounded to the type, the natural-log LSE in fp32.
  std::vector<float> lse(exact.lse.size(), 12345.f), d_buf(exact.lse.size(), -12345.f);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < c.sq[b]; ++i) {
        lse[pr.stat_at(b, h, i)] = float(exact.lse[pr.stat_at(b, h, i)]);
        for (int d = 0; d < c.hdim_v; ++d) {
          o[pr.q_at(b, i, h, d)] = to_bits(c.dtype, float(exact.o[pr.q_at(b, i, h, d)]));
        }
      }

  std::vector<int32_t> seqstart_q(pr.qstart.begin(), pr.qstart.end()), seqstart_k(pr.kstart.begin(), pr.kstart.end());
  std::vector<int32_t> lens_q(c.sq.begin(), c.sq.end()), lens_k(c.sk.begin(), c.sk.end());
  Workspace ws;
  const bool prepared = pr.bucket == 64 ? prepare_workspace<AmdBackwardTile<64>>(pr, ws, seqstart_q, seqstart_k)
                                        : prepare_workspace<AmdBackwardTile<128>>(pr, ws, seqstart_q, seqstart_k);
  if (!prepared) return false;

  arch::g_buffers.clear();
  emu::expose(q), emu::expose(k), emu::expose(v), emu::expose(o), emu::expose(d_o), emu::expose(lse);
  emu::expose(d_buf), emu::expose(dq), emu::expose(dk), emu::expose(dv), emu::expose(ws.bytes);
  emu::expose(seqstart_q), emu::expose(seqstart_k), emu::expose(lens_q), emu::expose(lens_k);

  fmha_bwd_params p;
  memset(&p, 0, sizeof p);
  p.q = uint64_t(q.data()), p.k = uint64_t(k.data()), p.v = uint64_t(v.data()), p.o = uint64_t(o.data());
  p.lse = uint64_t(lse.data()), p.d_o = uint64_t(d_o.data()), p.d = uint64_t(d_buf.data());
  p.dq = uint64_t(dq.data()), p.dk = uint64_t(dk.data()), p.dv = uint64_t(dv.data());
  if (c.group) {
    p.seqstart_q = uint64_t(seqstart_q.data()), p.seqstart_k = uint64_t(seqstart_k.data());
    if (c.logical) p.seqlen_q_ptr = uint64_t(lens_q.data()), p.seqlen_k_ptr = uint64_t(lens_k.data());
  }
  p.workspace = uint64_t(ws.bytes.data());
  const int64_t q_row = int64_t(Hq) * dpad, k_row = int64_t(Hk) * dpad;
  const int64_t q_batch = c.group ? 0 : c.sq[0] * q_row, k_batch = c.group ? 0 : c.sk[0] * k_row;
  for (int64_t* s : {&p.q_batch_stride, &p.o_batch_stride, &p.do_batch_stride, &p.dq_batch_stride}) *s = q_batch;
  for (int64_t* s : {&p.k_batch_stride, &p.v_batch_stride, &p.dk_batch_stride, &p.dv_batch_stride}) *s = k_batch;
  for (int64_t* s : {&p.q_row_stride, &p.o_row_stride, &p.do_row_stride, &p.dq_row_stride}) *s = q_row;
  for (int64_t* s : {&p.k_row_stride, &p.v_row_stride, &p.dk_row_stride, &p.dv_row_stride}) *s = k_row;
  for (int64_t* s : {&p.q_head_stride, &p.o_head_stride, &p.do_head_stride, &p.dq_head_stride, &p.k_head_stride,
                     &p.v_head_stride, &p.dk_head_stride, &p.dv_head_stride}) {
    *s = dpad;
  }
  p.lse_head_stride = p.d_head_stride = c.group ? pr.q_rows : c.sq[0];
  p.lse_batch_stride = p.d_batch_stride = c.group ? 0 : int64_t(Hq) * c.sq[0];
  p.metadata_bytes = ws.pp.metadata_bytes, p.nsplits_offset = ws.pp.nsplits_offset;
  p.dq_acc_offsets_offset = ws.pp.dq_acc_offsets_offset, p.cu_state_offset = ws.pp.cu_state_offset;
  p.batch_state_offset = ws.pp.batch_state_offset, p.dq_acc_elements = ws.dq_acc_elements;
  p.fingerprint_params = prepare::fingerprint_of_params(ws.pp);
  p.jobs_per_head = ws.plan.jobs_per_head, p.jobs_per_worker = ws.plan.jobs_per_worker;
  p.total_jobs = ws.plan.total_jobs;
  p.batch = B, p.nhead_q = Hq, p.nhead_k = Hk, p.hdim_q = c.hdim_q, p.hdim_v = c.hdim_v;
  p.seqlen_q = int32_t(ws.pp.seqlen_q), p.seqlen_k = int32_t(ws.pp.seqlen_k);
  p.max_seqlen_q = pr.max_sq, p.max_seqlen_k = int32_t(ws.pp.max_seqlen_k);
  p.group_mode = c.group, p.deterministic = c.deterministic;
  p.mask_type = c.mask_type, p.window_left = c.left, p.window_right = c.right;
  p.num_cus = c.num_cus, p.m0 = int32_t(ws.pp.m0), p.n0 = int32_t(ws.pp.n0);
  p.scale = scale, p.scale_log2 = scale * 1.4426950408889634f;
  p.dtype = c.dtype, p.hdim_bucket = pr.bucket, p.masked = c.mask_type != 0;

  std::unordered_map<const float*, uint64_t> owners;
  arch::g_owners = c.deterministic ? &owners : nullptr;
  arch::g_owner_conflicts = 0;
  if (c.dtype == 0) dispatch<arch::Half, false>(p); else dispatch<arch::BFloat16, true>(p);
  arch::g_owners = nullptr;

  // The field's rule per gradient, over the logical elements; nothing else written.
  Check r_dq, r_dk, r_dv;
  std::vector<char> mine_q(q_elems, 0), mine_k(k_elems, 0);
  auto each_q = [&](auto f) {
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.sq[b]; ++i)
        for (int h = 0; h < Hq; ++h)
          for (int d = 0; d < c.hdim_q; ++d) mine_q[pr.q_at(b, i, h, d)] = 1, f(pr.q_at(b, i, h, d));
  };
  auto each_k = [&](int hdim, char bit) {  // bit 1: dK's elements, bit 2: dV's
    return [&, hdim, bit](auto f) {
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < c.sk[b]; ++j)
          for (int h = 0; h < Hk; ++h)
            for (int d = 0; d < hdim; ++d) mine_k[pr.k_at(b, j, h, d)] |= bit, f(pr.k_at(b, j, h, d));
    };
  };
  compare(r_dq, c.dtype, dq, exact, low, &Grads::dq, each_q);
  compare(r_dk, c.dtype, dk, exact, low, &Grads::dk, each_k(c.hdim_q, 1));
  compare(r_dv, c.dtype, dv, exact, low, &Grads::dv, each_k(c.hdim_v, 2));
  size_t stray = 0;
  for (size_t i = 0; i < q_elems; ++i) stray += !mine_q[i] && dq[i] != 0x7c01;
  for (size_t i = 0; i < k_elems; ++i) {
    stray += (!(mine_k[i] & 1) && dk[i] != 0x7c01) + (!(mine_k[i] & 2) && dv[i] != 0x7c01);
  }
  const double eps = c.dtype == 0 ? 1.0 / 1024 : 1.0 / 128;
  bool ok = stray == 0 && arch::g_owner_conflicts == 0;
  for (auto [name, r] : {std::pair<const char*, Check&>{"dQ", r_dq}, {"dK", r_dk}, {"dV", r_dv}}) {
    const double floor = 0.25 * eps * std::max(r.max_exact, 1e-3), bound = 3 * r.same_precision + floor;
    const bool pass = r.unwritten == 0 && r.kernel <= bound;
    printf("    %s: max error %.3e, bound 3 x %.3e + %.1e%s", name, r.kernel, r.same_precision, floor,
           pass ? "\n" : "  FAIL");
    if (r.unwritten) printf(" (%zu elements not finite)", r.unwritten);
    if (!pass) printf("\n");
    ok = ok && pass;
  }
  if (stray) printf("    %zu elements written outside the outputs' logical rows and head dims\n", stray);
  if (arch::g_owner_conflicts) printf("    %zu dq_acc adds by a second work-item\n", arch::g_owner_conflicts);
  return ok;
}

// Runs every case, or the one numbered argv[1].
int main(int argc, char** argv) {
  emu::seed_rng();
  std::vector<Case> cases;
  // Batch mode: the head-dim buckets (32 and 96 padded), hdim_q != hdim_v, GQA, every mask kind, more
  // than one unit and more than one q tile, lengths that are no tile multiples; both dQ modes.
  cases.push_back({0, 64, 64, 2, 1, false, false, {100, 100}, {150, 150}, 0, -1, -1, false, 4});
  cases.push_back({1, 64, 64, 2, 1, false, false, {100, 100}, {150, 150}, 0, -1, -1, true, 3});
  cases.push_back({1, 128, 128, 2, 2, false, false, {70}, {150}, 1, -1, 0, false, 4});
  cases.push_back({0, 128, 128, 2, 2, false, false, {70}, {150}, 1, -1, 0, true, 5});
  cases.push_back({0, 96, 72, 4, 2, false, false, {90}, {130}, 2, -1, 0, true, 8});
  cases.push_back({1, 32, 48, 2, 1, false, false, {150}, {60}, 2, -1, 0, false, 2});  // rows with no key
  cases.push_back({0, 64, 40, 1, 1, false, false, {200}, {200}, 1, 20, 5, false, 4});  // sliding window
  cases.push_back({1, 128, 96, 2, 1, false, false, {80}, {170}, 2, 9, 30, true, 3});
  cases.push_back({1, 128, 128, 3, 1, false, false, {200}, {300}, 2, -1, 0, true, 2});  // interleaved K tiles
  // Group mode: zero-length batches (seqlen_q = 0: zero dK/dV; seqlen_k = 0: zero dQ), logical lengths
  // with gap rows.
  cases.push_back({0, 64, 64, 2, 1, true, false, {100, 0, 37}, {50, 80, 0}, 2, -1, 0, true, 4});
  cases.push_back({1, 64, 64, 2, 1, true, false, {100, 0, 37}, {50, 80, 0}, 2, -1, 0, false, 4});
  cases.push_back({1, 128, 128, 2, 2, true, true, {129, 5, 0, 40}, {64, 0, 33, 140}, 1, -1, 0, true, 8});
  cases.push_back({0, 96, 128, 3, 1, true, true, {70, 20}, {140, 33}, 0, -1, -1, false, 4});
  cases.push_back({0, 64, 32, 2, 1, true, true, {90, 40}, {90, 150}, 2, 7, 2, true, 3});
  cases.push_back({0, 64, 64, 2, 2, true, false, {300, 65}, {257, 0}, 1, 40, 10, true, 5});
  int failed = 0, run = 0;
  for (size_t n = 0; n < cases.size(); ++n) {
    if (argc > 1 && n != strtoul(argv[1], nullptr, 10)) continue;
    ++run;
    const Case& c = cases[n];
    std::string lens;
    for (size_t b = 0; b < c.sq.size(); ++b) lens += std::to_string(c.sq[b]) + "x" + std::to_string(c.sk[b]) + " ";
    printf("case %zu: %s hq%d hv%d h%d/%d %s%s mask %d (%d,%d) %s cus %d lens %s\n", n, c.dtype ? "bf16" : "fp16",
           c.hdim_q, c.hdim_v, c.nhead_q, c.nhead_k, c.group ? "group" : "batch", c.logical ? "+logical" : "",
           c.mask_type, c.left, c.right, c.deterministic ? "deterministic" : "atomic", c.num_cus, lens.c_str());
    fflush(stdout);
    if (!run_case(c)) {
      printf("  FAILED\n");
      ++failed;
    }
  }
  printf("%d of %d cases failed\n", failed, run);
  return failed != 0;
}
