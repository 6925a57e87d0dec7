// CPU emulation test of the AMD kv-cache forward (hip/fwd/amd/kernel.h with the paged K/V tiles of
// hip/kvcache/amd/paged_tiles.h): the unmodified kernel sources with every work-item a fiber (see
// forward.cpp), against a float64 reference of spec/inference.md §1 written out here.
//
// Every sequence's pages are a random draw from a shuffled pool, some shared with other sequences;
// block-table entries past a sequence's last page hold garbage ids (huge, negative, just past the
// pool). Each workgroup may read only its own sequence's table entries and pages: every other byte
// of the table and of the pools is unregistered while it runs, so that any read of it traps. Padding
// columns and unreferenced pages are NaN, outputs poisoned.
//
// Split-KV (spec/inference.md §3): the forward writes each chunk's partial state to the workspace, the
// combine kernel (kvcache/combine.h) merges them into O and the LSE; chunks from a fixed length or from
// a prepared plan, sequences in the plan's order where it holds one (a shuffle here, as the prepare's
// longest-first order permutes them: the grid's z-th slot runs order[z]).
//
// fp8 e4m3 (the emulated architecture's encoding: FNUZ on gfx942, OCP on gfx950) with descales per
// tensor, per (sequence, kv head), or K/V per (page, kv head): against float64 on the dequantised inputs, within the rule of
// tests/kvcache.rs (spec/inference.md §2.5): O within 4× (max) and 3× (mean) the error of a baseline
// that rounds 2^kPShift · P to the format and O to bf16, plus a floor; the LSE within a bound that
// includes the matrix cores' accumulation error.
#include "emu_test.h"

#include <math.h>

#include <algorithm>
#include <string>

#include "fwd/amd/kernel.h"
#include "fwd/amd/tile.h"
#include "kvcache/amd/paged_tiles.h"
#include "kvcache/combine.h"

using namespace fmha;
using emu::from_bits;
using emu::nan_bits;
using emu::rng;
using emu::to_bits;

enum Kind { kContiguous = 0, kBlockTable = 1, kPageCsr = 2 };

struct Case {
  int dtype;  // 0 fp16, 1 bf16, 2 fp8 (arch::Fp8E4m3)
  int hdim_q, hdim_v;
  int nhead_q, nhead_k;
  bool group;
  std::vector<int> sq, sk;  // per sequence (batch mode: every sq equal)
  Kind kind;
  int page_size;
  bool hnd;        // pool [pages][h_k][page_size][d] instead of [pages][page_size][h_k][d]
  int mask_type;   // 0 none, 2 bottom-right
  int left, right;
  bool write_lse;
  int scales = 0;  // fp8 descales: 0 none, 1 per tensor (q's absent: 1), 2 per (sequence, kv head),
                   // 3 K/V per (page, kv head) with q per tensor (pages of whole tiles)
  int splits = 0;  // split-KV: the launcher's max_splits (0: unsplit)
  int split_tiles = 0;  // key tiles per chunk, fixed (kv_split_tokens); 0: the prepared plan's
  bool ordered = false;  // the plan holds a sequence order (shuffled here)
  bool pack = false;     // packed GQA: a workgroup's rows are (query row, head) pairs of one kv head
};

// The forward (and, splitting, the combine), with the tile's key count as the launcher sets it.
template <typename T, int D, bool M, bool P, bool S>
static void launch(fmha_kvcache_params p, const std::function<void(uint32_t, uint32_t, uint32_t)>& before) {
  using Tile = AmdForwardTile<T, D>;
  static_assert(Tile::kThreads == 256, "emulated workgroups have 256 work-items");
  p.block_n = Tile::kBlockN;
  const int splits = kvcache::grid_splits(p);
  const int group = P ? p.nhead_q / p.nhead_k : 1;
  const dim3 grid((p.max_seqlen_q * group + Tile::kBlockM - 1) / Tile::kBlockM * splits, P ? p.nhead_k : p.nhead_q,
                  p.batch);
  emu::launch(grid, Tile::kLdsBytes, [&] { forward_kernel_amd<T, D, M, fmha_kvcache_params, P, S>(p); }, before);
  if (splits > 1) {
    static_assert(kCombineWaves * arch::kWaveSize == 256, "emulated workgroups have 256 work-items");
    const dim3 combine_grid((p.max_seqlen_q + kCombineWaves - 1) / kCombineWaves, p.nhead_q, p.batch);
    emu::launch(combine_grid, 0, [&] {
      if (p.dtype == 0) kvcache_combine_kernel<false>(p); else kvcache_combine_kernel<true>(p);
    });
  }
}

template <typename T, int D>
static void dispatch_masked(const fmha_kvcache_params& p, const std::function<void(uint32_t, uint32_t, uint32_t)>& b) {
  if constexpr (arch::Element<T>::kBytes == 1) {
    if (p.k_descale.page_stride != 0 || p.v_descale.page_stride != 0) {
      if (p.pack_gqa) {
        if (p.masked) launch<T, D, true, true, true>(p, b); else launch<T, D, false, true, true>(p, b);
      } else {
        if (p.masked) launch<T, D, true, false, true>(p, b); else launch<T, D, false, false, true>(p, b);
      }
      return;
    }
  }
  if (p.pack_gqa) {
    if (p.masked) launch<T, D, true, true, false>(p, b); else launch<T, D, false, true, false>(p, b);
  } else {
    if (p.masked) launch<T, D, true, false, false>(p, b); else launch<T, D, false, false, false>(p, b);
  }
}
template <typename T>
static void dispatch(const fmha_kvcache_params& p, const std::function<void(uint32_t, uint32_t, uint32_t)>& b) {
  if constexpr (arch::Element<T>::kBytes == 2) {
    if (p.hdim_bucket == 64) return dispatch_masked<T, 64>(p, b);
  }
  dispatch_masked<T, 128>(p, b);  // fp8: the 128 bucket only
}

// `Code`: the inputs' element (uint16_t, or uint8_t for fp8); O is 16-bit (bf16 for fp8).
template <typename Code>
static bool run_case(const Case& c) {
  const int B = static_cast<int>(c.sq.size()), Hq = c.nhead_q, Hk = c.nhead_k, P = c.page_size;
  const bool fp8 = c.dtype == 2;
  const int out_dtype = fp8 ? 1 : c.dtype;
  const int bucket = (c.hdim_q > 64 || c.hdim_v > 64 || fp8) ? 128 : 64;
  const int dpad = bucket + 16 / (int)sizeof(Code);  // padding columns (one 16-byte chunk), poisoned
  std::uniform_int_distribution<int> coin(0, 3);

  // Pages: sequence b uses n_b = ceil(L_b / P) of them (CONTIGUOUS: one slot each).
  std::vector<int> pages_of(B);
  int used = 0, max_pages = 1;
  for (int b = 0; b < B; ++b) {
    pages_of[b] = c.kind == kContiguous ? 1 : (c.sk[b] + P - 1) / P;
    used += pages_of[b];
    max_pages = std::max(max_pages, pages_of[b]);
  }
  const int num_pages = used + 3;  // a few pages no sequence references (NaN)
  std::vector<int> order(num_pages);
  for (int i = 0; i < num_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  // CONTIGUOUS takes the slots from cache_batch_idx (optional: slot b otherwise).
  const bool slots = c.kind == kContiguous && coin(rng) < 2;
  if (c.kind == kContiguous && !slots)
    for (int i = 0; i < num_pages; ++i) order[i] = i;
  std::vector<std::vector<int>> ids(B);
  int next = 0;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < pages_of[b]; ++t) {
      // A quarter of the pages are shared with an earlier sequence (a common prefix cache).
      const bool share = c.kind != kContiguous && b > 0 && !ids[b - 1].empty() && coin(rng) == 0;
      ids[b].push_back(share ? ids[b - 1][t % ids[b - 1].size()] : order[next++]);
    }
  }
  std::vector<char> referenced(num_pages, 0);
  for (int b = 0; b < B; ++b)
    if (c.sk[b] > 0)
      for (int id : ids[b]) referenced[id] = 1;

  // Pools: strides of either layout; V's pages are longer than K's in HND cases (other strides).
  const int64_t k_head = c.hnd ? (int64_t)P * dpad : dpad, k_row = c.hnd ? dpad : (int64_t)Hk * dpad;
  const int64_t k_page = (int64_t)P * Hk * dpad;
  const int64_t v_head = k_head, v_row = k_row, v_page = k_page + (c.hnd ? 16 / (int)sizeof(Code) : 0);
  std::vector<Code> kpool(num_pages * k_page + 16), vpool(num_pages * v_page + 16);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto fill_pool = [&](std::vector<Code>& pool, int64_t page_stride, int64_t head, int64_t row, int hdim) {
    for (auto& x : pool) x = nan_bits(c.dtype);
    for (int pg = 0; pg < num_pages; ++pg) {
      if (!referenced[pg]) continue;
      for (int u = 0; u < P; ++u)
        for (int g = 0; g < Hk; ++g)
          for (int e = 0; e < hdim; ++e) pool[pg * page_stride + u * row + g * head + e] = to_bits(c.dtype, uni(rng) * 2.f);
    }
  };
  fill_pool(kpool, k_page, k_head, k_row, c.hdim_q);
  fill_pool(vpool, v_page, v_head, v_row, c.hdim_v);
  auto k_at = [&](int b, int j, int g, int e) {
    const int id = c.kind == kContiguous ? ids[b][0] : ids[b][j / P];
    return from_bits(c.dtype, kpool[id * k_page + (j % P) * k_row + g * k_head + e]);
  };
  auto v_at = [&](int b, int j, int g, int e) {
    const int id = c.kind == kContiguous ? ids[b][0] : ids[b][j / P];
    return from_bits(c.dtype, vpool[id * v_page + (j % P) * v_row + g * v_head + e]);
  };

  // Tables. Garbage past each sequence's pages: any id a clamp would accept as well as ones it fixes.
  const int32_t garbage[] = {0x7fffffff, -1, -123456789, num_pages, num_pages + 1000};
  auto junk = [&] { return garbage[std::uniform_int_distribution<int>(0, 4)(rng)]; };
  const int stride = max_pages + 2;
  std::vector<int32_t> seqlen_k(c.sk.begin(), c.sk.end()), block_table, kv_indptr(B + 1, 0), page_indices,
      last_page_len(B), cache_batch_idx(B);
  std::vector<std::pair<int64_t, int64_t>> entries(B, {0, 0});  // the table entries sequence b may read
  if (c.kind == kBlockTable) {
    block_table.assign((size_t)B * stride, 0);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < stride; ++t) block_table[(size_t)b * stride + t] = t < pages_of[b] ? ids[b][t] : junk();
      entries[b] = {(int64_t)b * stride, pages_of[b]};
    }
  } else if (c.kind == kPageCsr) {
    for (int b = 0; b < B; ++b) {
      kv_indptr[b] = (int32_t)page_indices.size();
      entries[b] = {kv_indptr[b], pages_of[b]};
      for (int id : ids[b]) page_indices.push_back(id);
      last_page_len[b] = c.sk[b] > 0 ? c.sk[b] - (pages_of[b] - 1) * P : 0;
    }
    kv_indptr[B] = (int32_t)page_indices.size();
    for (int i = 0; i < 3; ++i) page_indices.push_back(junk());  // past the last sequence
  } else {
    for (int b = 0; b < B; ++b) cache_batch_idx[b] = ids[b][0];
  }

  // Queries and outputs: group mode [total][Hq][dpad], batch mode [b][Sq][Hq][dpad].
  std::vector<int> qstart(B + 1, 0);
  int max_sq = 0, max_sk = 0;
  for (int b = 0; b < B; ++b) {
    qstart[b + 1] = qstart[b] + c.sq[b];
    max_sq = std::max(max_sq, c.sq[b]);
    max_sk = std::max(max_sk, c.sk[b]);
  }
  const int total_q = qstart[B], sq0 = c.sq[0];
  std::vector<Code> q((size_t)total_q * Hq * dpad + 16);
  std::vector<uint16_t> o(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = (i % dpad) < (size_t)c.hdim_q ? to_bits(c.dtype, uni(rng) * 2.f) : nan_bits(c.dtype);
  for (auto& x : o) x = 0x7c01;  // poison (a NaN in both types' views)
  std::vector<float> lse((size_t)Hq * total_q + 1, 12345.f);  // group [Hq][total]; batch [b][Hq][Sq]
  std::vector<int32_t> seqstart_q(qstart.begin(), qstart.end());

  fmha_kvcache_params p;
  memset(&p, 0, sizeof p);
  p.q = (uint64_t)q.data(), p.k = (uint64_t)kpool.data(), p.v = (uint64_t)vpool.data(), p.o = (uint64_t)o.data();
  p.lse = c.write_lse ? (uint64_t)lse.data() : 0;
  p.seqstart_q = c.group ? (uint64_t)seqstart_q.data() : 0;
  if (c.kind != kPageCsr) p.seqlen_k = (uint64_t)seqlen_k.data();
  if (c.kind == kBlockTable) p.block_table = (uint64_t)block_table.data();
  if (c.kind == kPageCsr) {
    p.kv_indptr = (uint64_t)kv_indptr.data();
    p.page_indices = (uint64_t)page_indices.data();
    p.last_page_len = (uint64_t)last_page_len.data();
  }
  if (slots) p.cache_batch_idx = (uint64_t)cache_batch_idx.data();
  p.q_row_stride = (int64_t)Hq * dpad, p.q_head_stride = dpad, p.q_batch_stride = c.group ? 0 : (int64_t)sq0 * Hq * dpad;
  p.o_row_stride = p.q_row_stride, p.o_head_stride = dpad, p.o_batch_stride = p.q_batch_stride;
  p.k_batch_stride = k_page, p.k_head_stride = k_head, p.k_row_stride = k_row;
  p.v_batch_stride = v_page, p.v_head_stride = v_head, p.v_row_stride = v_row;
  p.lse_head_stride = c.group ? total_q : sq0, p.lse_batch_stride = c.group ? 0 : (int64_t)Hq * sq0;
  p.block_table_stride = c.kind == kBlockTable ? stride : 0;
  p.batch = B, p.nhead_q = Hq, p.nhead_k = Hk, p.hdim_q = c.hdim_q, p.hdim_v = c.hdim_v;
  p.seqlen_q = c.group ? total_q : sq0;
  p.max_seqlen_q = max_sq, p.max_seqlen_k = max_sk;
  p.group_mode = c.group;
  p.mask_type = c.mask_type, p.window_left = c.left, p.window_right = c.right;
  const double scale = 1.0 / sqrt((double)c.hdim_q);
  p.scale_log2 = (float)(scale * 1.4426950408889634);
  p.dtype = c.dtype, p.hdim_bucket = bucket, p.masked = c.mask_type != 0;
  p.table_kind = c.kind, p.page_size = P, p.num_pages = num_pages;
  p.max_pages_per_seq = c.kind == kBlockTable ? max_pages : 0;
  p.pack_gqa = c.pack;
  p.num_page_indices = (int32_t)page_indices.size();

  // fp8 descales: [B][Hk] (per sequence and kv head) or one value (per tensor), in [0.25, 2].
  std::uniform_real_distribution<float> scale_draw(0.25f, 2.f);
  std::vector<float> descales[3];  // q, k, v
  fmha_descale_params* fields[3] = {&p.q_descale, &p.k_descale, &p.v_descale};
  for (int t = 0; t < 3 && c.scales != 0; ++t) {
    if (c.scales == 1 && t == 0) continue;  // q's absent: 1
    const bool paged = c.scales == 3 && t > 0;
    descales[t].resize(c.scales == 2 ? (size_t)B * Hk : paged ? (size_t)num_pages * Hk : 1);
    for (auto& x : descales[t]) x = scale_draw(rng);
    fields[t]->data = (uint64_t)descales[t].data();
    fields[t]->batch_stride = c.scales == 2 ? Hk : 0;
    fields[t]->head_stride = c.scales == 2 || paged ? 1 : 0;
    fields[t]->page_stride = paged ? Hk : 0;
  }
  // The descale of tensor t for key j of sequence b (per page: its physical page's).
  auto descale = [&](int t, int b, int g, int j) {
    if (descales[t].empty()) return 1.0;
    if (c.scales == 3 && t > 0) return (double)descales[t][(size_t)ids[b][c.kind == kContiguous ? 0 : j / P] * Hk + g];
    return (double)descales[t][c.scales == 2 ? (size_t)b * Hk + g : 0];
  };

  // Split-KV: the partial states (poisoned), the plan and the sequence order.
  const int64_t partial_rows = c.group ? total_q : (int64_t)B * sq0;
  std::vector<float> partial_lse, partial_o;
  std::vector<int32_t> sequence_order(B);
  for (int b = 0; b < B; ++b) sequence_order[b] = b;
  fmha_kv_cache_split_plan plan = {kvcache::kPrepared, 0, 0, 0};
  if (c.splits > 1) {
    partial_lse.assign((size_t)c.splits * Hq * partial_rows, 12345.f);
    partial_o.assign(partial_lse.size() * c.hdim_v, __builtin_nanf(""));
    p.max_splits = c.splits, p.split_tiles = c.split_tiles;
    p.partial_rows = partial_rows;
    p.partial_lse = (uint64_t)partial_lse.data(), p.partial_o = (uint64_t)partial_o.data();
    plan.tiles_per_split = 2;
    p.split_plan = (uint64_t)&plan;
    if (c.ordered) {
      std::shuffle(sequence_order.begin(), sequence_order.end(), rng);
      plan.ordered = B;
      p.sequence_order = (uint64_t)sequence_order.data();
    }
  }

  // Workgroup (x, h, z) may read the call's arrays, q, its sequence's table entries and pages only.
  auto before = [&](uint32_t, uint32_t, uint32_t slot) {
    const int z = sequence_order[slot];
    arch::g_buffers.clear();
    emu::expose(partial_o);
    emu::expose(q), emu::expose(o), emu::expose(lse), emu::expose(seqstart_q), emu::expose(seqlen_k);
    emu::expose(kv_indptr), emu::expose(last_page_len), emu::expose(cache_batch_idx);
    for (auto& d : descales) emu::expose(d);
    const int32_t* table = c.kind == kBlockTable ? block_table.data() : page_indices.data();
    if (entries[z].second > 0) arch::g_buffers.push_back({(const uint8_t*)(table + entries[z].first), (size_t)entries[z].second * 4});
    if (c.sk[z] == 0) return;
    for (int id : ids[z]) {
      arch::g_buffers.push_back({(const uint8_t*)(kpool.data() + id * k_page), (size_t)k_page * sizeof(Code)});
      arch::g_buffers.push_back({(const uint8_t*)(vpool.data() + id * v_page), (size_t)v_page * sizeof(Code)});
    }
  };
  if (max_sq > 0) {
    if (c.dtype == 0) dispatch<arch::Half>(p, before);
    else if (c.dtype == 1) dispatch<arch::BFloat16>(p, before);
    else dispatch<arch::Fp8E4m3>(p, before);
  }

  // Reference (spec/inference.md §1.1, §1.6) and checks.
  const double tol = c.dtype == 0 ? 4e-3 : 2.5e-2;
  const double shift = ldexp(1.0, (int)arch::Element<arch::Fp8E4m3>::kPShift);
  double max_err = 0, max_lse_err = 0, base_max = 0, err_sum = 0, base_sum = 0;
  size_t count = 0;
  int bad = 0;
  std::vector<char> written_o(o.size(), 0), written_lse(lse.size(), 0);
  for (int b = 0; b < B; ++b) {
    const int sq = c.sq[b], L = c.sk[b];
    const int64_t off = (int64_t)L - sq;
    for (int h = 0; h < Hq; ++h) {
      const int g = h / (Hq / Hk);
      const double dq = descale(0, b, g, 0);
      for (int i = 0; i < sq; ++i) {
        const size_t qrow = (size_t)qstart[b] + i;  // batch mode: b · Sq + i, the same
        std::vector<double> s(L, -INFINITY);
        double m = -INFINITY, abs_dot = 0;
        for (int j = 0; j < L; ++j) {
          const bool kept = c.mask_type == 0 ||
                            ((c.left < 0 || j >= i + off - c.left) && (c.right < 0 || j <= i + off + c.right));
          if (!kept) continue;
          double dot = 0, abs = 0;
          const double dk = descale(1, b, g, j);
          for (int e = 0; e < c.hdim_q; ++e) {
            const double x = from_bits(c.dtype, q[(qrow * Hq + h) * dpad + e]) * dq * k_at(b, j, g, e) * dk;
            dot += x, abs += fabs(x);
          }
          abs_dot = std::max(abs_dot, abs);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (int j = 0; j < L; ++j) if (s[j] != -INFINITY) l += exp(s[j] - m);
        for (int e = 0; e < c.hdim_v; ++e) {
          double acc = 0, low = 0;
          for (int j = 0; j < L && l > 0; ++j) {
            if (s[j] == -INFINITY) continue;
            const double pj = exp(s[j] - m), vj = v_at(b, j, g, e) * descale(2, b, g, j);
            acc += pj / l * vj;
            // The baseline: P rounded to fp8 as 2^kPShift · P (against the final max), O to bf16.
            if (fp8) low += from_bits(2, to_bits(2, (float)(pj * shift))) / shift / l * vj;
          }
          const size_t at = (qrow * Hq + h) * dpad + e;
          written_o[at] = 1;
          const float got = from_bits(out_dtype, o[at]);
          const double err = fabs(got - acc);
          if (fp8) {
            const double base = fabs(from_bits(1, to_bits(1, (float)low)) - acc);
            base_max = std::max(base_max, base), base_sum += base, err_sum += err, ++count;
            if (err != err && bad++ < 5) printf("    O NaN b%d h%d i%d d%d\n", b, h, i, e);
          } else if (!(err <= tol) && bad++ < 5) {
            printf("    O mismatch b%d h%d i%d d%d: got %g want %g\n", b, h, i, e, got, acc);
          }
          if (err > max_err || err != err) max_err = err;
        }
        if (c.write_lse) {
          const size_t at = c.group ? (size_t)h * total_q + qstart[b] + i : ((size_t)b * Hq + h) * sq0 + i;
          written_lse[at] = 1;
          const double want = l > 0 ? m + log(l) : -INFINITY;
          const double got = lse[at];
          // fp8: plus the accumulation error of the matrix cores' fp8 dot products (tests/kvcache.rs:
          // 2^-13 of the sum of the products' magnitudes; none in this emulation, which sums in fp32).
          const double accumulation = fp8 ? ldexp(scale * abs_dot, -13) : 0.0;
          const bool ok = want == -INFINITY ? got == -INFINITY
                                            : fabs(got - want) <= 2e-3 + 1e-4 * fabs(want) + accumulation;
          if (!ok && bad++ < 5) printf("    LSE mismatch b%d h%d i%d: got %g want %g\n", b, h, i, got, want);
          if (want != -INFINITY && fabs(got - want) > max_lse_err) max_lse_err = fabs(got - want);
        }
      }
    }
  }
  if (c.splits > 1) {
    const size_t partials = std::count_if(partial_lse.begin(), partial_lse.end(), [](float x) { return x != 12345.f; });
    printf("    %zu partial states written\n", partials);
    if (partials == 0) ++bad;  // every split case has a sequence of several chunks
  }
  size_t stray = 0;
  for (size_t i = 0; i < o.size(); ++i) if (!written_o[i] && o[i] != 0x7c01) ++stray;
  for (size_t i = 0; i < lse.size(); ++i) if (!written_lse[i] && lse[i] != 12345.f) ++stray;
  if (stray) printf("    %zu elements written outside the output region\n", stray);
  if (fp8 && count > 0) {
    // tests/kvcache.rs: max within 4× the baseline's plus 2^-6, mean within 3× plus 2^-8.
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
  const Kind paged[] = {kBlockTable, kPageCsr};
  for (int dtype = 0; dtype < 2; ++dtype) {
    for (Kind kind : paged) {
      const bool hnd = (dtype + kind) % 2 == 1;
      // Group mode, every page size: scattered and shared pages, lengths not multiples of the page,
      // zero-length queries and caches, GQA, causal and window masks.
      add({dtype, 64, 64, 4, 2, true, {37, 0, 70, 5}, {150, 90, 0, 133}, kind, 1, hnd, 2, -1, 0, true});
      add({dtype, 128, 96, 2, 1, true, {65, 20}, {200, 31}, kind, 3, !hnd, 0, -1, -1, true});
      add({dtype, 64, 48, 2, 2, true, {9, 130}, {101, 130}, kind, 16, hnd, 2, 20, 3, true});
      add({dtype, 128, 128, 2, 1, true, {40, 3}, {190, 97}, kind, 48, !hnd, 2, -1, 0, dtype == 0});
      add({dtype, 96, 64, 3, 1, true, {70, 1, 0}, {260, 129, 60}, kind, 128, hnd, 2, -1, 0, true});
      add({dtype, 64, 64, 2, 2, true, {33, 60}, {300, 41}, kind, 1024, !hnd, 0, -1, -1, true});
      add({dtype, 128, 128, 1, 1, true, {50}, {77}, kind, 1000, hnd, 2, 10, -1, true});
    }
    // Batch mode (equal query rows) and queries longer than the cache (fully masked rows).
    add({dtype, 64, 64, 4, 2, false, {17, 17, 17}, {64, 5, 0}, kBlockTable, 16, false, 2, -1, 0, true});
    add({dtype, 128, 128, 2, 2, false, {1, 1}, {300, 129}, kPageCsr, 3, true, 0, -1, -1, true});
    add({dtype, 64, 32, 2, 1, false, {80, 80}, {40, 100}, kPageCsr, 128, false, 2, -1, 0, true});
    // CONTIGUOUS: one slot of `cap` rows per sequence, slots shuffled (cache_batch_idx) or in order.
    add({dtype, 64, 64, 4, 1, true, {30, 0, 66}, {250, 10, 1}, kContiguous, 256, false, 2, -1, 0, true});
    add({dtype, 128, 64, 2, 2, false, {33, 33}, {70, 0}, kContiguous, 100, true, 0, -1, -1, true});
  }
  // fp8 (the 128 bucket): descales per tensor (1), per (sequence, kv head) (2) or none, pages of one key,
  // of part of a tile, of whole tiles and of none (64 = the tile), masks, GQA, both table kinds.
  add({2, 128, 128, 4, 2, true, {37, 0, 70}, {150, 90, 0}, kBlockTable, 1, false, 2, -1, 0, true, 2});
  add({2, 128, 96, 2, 1, true, {65, 20}, {200, 31}, kPageCsr, 16, true, 0, -1, -1, true, 1});
  add({2, 112, 128, 2, 2, true, {9, 130}, {101, 130}, kBlockTable, 16, false, 2, 20, 3, true, 2});
  add({2, 128, 128, 3, 1, true, {70, 1, 0}, {260, 129, 60}, kPageCsr, 128, false, 2, -1, 0, true, 2});
  add({2, 128, 128, 2, 1, true, {40, 3}, {190, 97}, kBlockTable, 64, true, 0, -1, -1, true, 1});
  add({2, 128, 128, 2, 2, false, {17, 17}, {300, 5}, kPageCsr, 5, false, 2, -1, 0, true, 0});
  add({2, 128, 64, 4, 1, true, {30, 66}, {250, 1}, kContiguous, 256, false, 2, -1, 0, true, 2});
  // Head dims below the bucket (multiples of 16 bytes): padding chunks read as zeros.
  add({2, 48, 32, 4, 2, true, {20, 45}, {77, 130}, kBlockTable, 3, true, 2, -1, 0, true, 1});
  // Split-KV: decode-like queries (1-16 rows) over long caches, every table kind, both chunk sources,
  // more splits than a sequence has chunks, empty and one-tile caches (unsplit rows of a split call).
  for (int dtype = 0; dtype < 2; ++dtype) {
    add({dtype, 128, 128, 4, 2, true, {1, 4, 0, 1}, {300, 129, 50, 0}, kBlockTable, 16, dtype == 1, 2, -1, 0, true, 0,
         4, 0, true});
    add({dtype, 64, 64, 2, 1, true, {16, 3}, {200, 31}, kPageCsr, 1, dtype == 0, 2, 40, 0, dtype == 0, 0, 3, 1,
         false});
    add({dtype, 64, 48, 2, 2, false, {2, 2, 2}, {400, 7, 96}, kContiguous, 512, false, 0, -1, -1, true, 0, 8, 0, true});
  }
  add({2, 128, 128, 4, 1, true, {1, 8, 1}, {260, 330, 0}, kBlockTable, 64, false, 2, -1, 0, true, 2, 4, 0, true});
  add({2, 128, 128, 2, 2, false, {3, 3}, {150, 500}, kPageCsr, 5, true, 0, -1, -1, true, 1, 5, 2, false});
  // fp8 K/V descales per (page, kv head) (CK's KV block scale): pages of whole 64-key tiles, every table
  // kind, masks, split and packed decode; pages shared between sequences share their descales.
  add({2, 128, 128, 4, 2, true, {37, 0, 70}, {150, 90, 200}, kBlockTable, 64, false, 2, -1, 0, true, 3});
  add({2, 128, 96, 2, 1, true, {65, 20}, {300, 31}, kPageCsr, 128, true, 0, -1, -1, true, 3});
  add({2, 112, 128, 2, 2, false, {17, 17}, {260, 129}, kPageCsr, 64, false, 2, 40, 3, true, 3});
  add({2, 128, 128, 8, 2, true, {1, 4, 1}, {500, 300, 0}, kBlockTable, 64, true, 2, -1, 0, true, 3, 4, 0, true, true});
  add({2, 128, 128, 4, 1, true, {2, 3}, {400, 250}, kPageCsr, 256, false, 2, -1, 0, true, 3, 3, 1, false});
  // Packed GQA (decode: query rows × group fit one tile of 128), split and not, every table kind; a
  // window mask, so that rows of one tile keep different keys.
  for (int dtype = 0; dtype < 2; ++dtype) {
    add({dtype, 128, 128, 8, 2, true, {1, 4, 0, 16}, {300, 129, 50, 77}, kBlockTable, 16, dtype == 1, 2, -1, 0, true,
         0, 4, 0, true, true});
    add({dtype, 64, 64, 6, 2, true, {3, 20}, {200, 31}, kPageCsr, 1, dtype == 0, 2, 40, 0, true, 0, 0, 0, false,
         true});
    add({dtype, 64, 48, 4, 1, false, {5, 5}, {400, 7}, kContiguous, 512, false, 0, -1, -1, dtype == 0, 0, 3, 1, false,
         true});
  }
  add({2, 128, 128, 8, 2, true, {1, 8, 1}, {260, 330, 0}, kBlockTable, 64, false, 2, -1, 0, true, 2, 4, 0, true,
       true});
  add({2, 128, 96, 4, 1, true, {2, 30}, {200, 97}, kPageCsr, 16, true, 2, 30, 0, true, 1, 0, 0, false, true});
  int failed = 0;
  for (size_t n = 0; n < cases.size(); ++n) {
    const Case& c = cases[n];
    std::string lens;
    for (size_t b = 0; b < c.sq.size(); ++b) lens += std::to_string(c.sq[b]) + "x" + std::to_string(c.sk[b]) + " ";
    const char* kinds[] = {"contiguous", "block_table", "page_csr"};
    const char* dtype_names[] = {"fp16", "bf16", "fp8"};
    printf("case %zu: %s hq%d hv%d h%d/%d %s %s page %d %s mask %d (%d,%d) lens %s\n", n, dtype_names[c.dtype],
           c.hdim_q, c.hdim_v, c.nhead_q, c.nhead_k, c.group ? "group" : "batch", kinds[c.kind], c.page_size,
           c.hnd ? "HND" : "NHD", c.mask_type, c.left, c.right, lens.c_str());
    if (c.scales != 0) {
      const char* kinds[] = {"", "per tensor", "per (sequence, kv head)", "K/V per (page, kv head), q per tensor"};
      printf("  descales %s\n", kinds[c.scales]);
    }
    if (c.pack) printf("  packed GQA (%d query heads per kv head)\n", c.nhead_q / c.nhead_k);
    if (c.splits > 1) {
      printf("  max_splits %d, %s%s\n", c.splits, c.split_tiles > 0 ? "fixed chunks of tiles: " : "the plan's chunks",
             c.split_tiles > 0 ? std::to_string(c.split_tiles).c_str() : "");
      if (c.ordered) printf("  sequences in the plan's order\n");
    }
    fflush(stdout);
    if (!(c.dtype == 2 ? run_case<uint8_t>(c) : run_case<uint16_t>(c))) {
      printf("  FAILED\n");
      ++failed;
    }
  }
  printf("%s: %d of %zu cases failed\n", argc > 0 ? argv[0] : "", failed, cases.size());
  return failed != 0;
}
