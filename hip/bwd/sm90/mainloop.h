// The backward's (dq_dk_dv) mainloop on Hopper (sm_90a): the wgmma operands of a warpgroup, one q tile
// against the unit's K/V (Sᵀ, dPᵀ, dV, dK, dSᵀ to shared memory), its dQ sent to the dq_acc slot, and the
// cp.async copies of a step.
#pragma once

#include "arch/nvidia/bulk_copy.h"
#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/nvidia/tensor_map.h"
#include "arch/nvidia/warpgroup.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/unit_walk.h"
#include "common/kept_range.h"
#include "common/sequence.h"
#include "bwd/sm90/tile.h"

namespace fmha {

// The named barrier of the consumer warpgroups: every warp's dSᵀ (and, column-split, Pᵀ) of a step is in
// shared memory.
constexpr uint32_t kDsComplete = 1;

// Everything a work unit keeps across its q tiles.
template <typename Tile>
struct UnitState {
  static constexpr int kDkTiles = Tile::kDkCols / 8, kDvTiles = Tile::kDvCols / 8;
  // rows: the warp's keys g, g + 8; columns: the warpgroup's part of the head dim (Tile::dk_column)
  float dk[kDkTiles][4];
  float dv[kDvTiles][4];
};

// Tiles [kFirst, kFirst + kCount) of an accumulator, as the accumulator of a narrower product.
template <int kFirst, int kCount, int kRows>
__device__ inline float (&tiles_of(float (&d)[kRows][4]))[kCount][4] {
  static_assert(kFirst + kCount <= kRows, "inside the accumulator");
  return *reinterpret_cast<float(*)[kCount][4]>(&d[kFirst]);
}

// The products of a ColumnPart's accumulator `d`: `mma(tiles, b)` issues one product, B being `whole`
// for the part's whole blocks (N = 64 · kWhole, d's first tiles) and `half` for its half block (N = 32).
// (An accumulator of one piece is passed as itself: a view of it would cost the consumers registers.)
template <typename Part, int kRows, typename Mma>
__device__ inline void part_products(float (&d)[kRows][4], uint64_t whole, uint64_t half, const Mma& mma) {
  static_assert(kRows == Part::kTiles, "the part's accumulator");
  if constexpr (Part::kHalf == 0) {
    mma(d, whole);
  } else if constexpr (Part::kWhole == 0) {
    mma(d, half);
  } else {
    mma(tiles_of<0, 8 * Part::kWhole>(d), whole);
    mma(tiles_of<8 * Part::kWhole, 4>(d), half);
  }
}

// The wgmma descriptors of one warpgroup's operands, stage 0 (a stage is kQBytes further, dO's kDoBytes).
struct BackwardOperands {
  uint64_t k_rows, v_rows;  // A: the warpgroup's 64 keys of K and V (K-major)
  uint64_t q, d_o;          // B of Sᵀ and dPᵀ (K-major), or N-major B of dK and dV (steps of 16 rows, at
                            // the warpgroup's ColumnPart offsets: accumulate_dk_dv_halves)
  uint64_t ds;              // A of dQ: dS, M-major from dSᵀ (steps of 16 keys), stage 0
  uint64_t k_columns;       // B of dQ: the warpgroup's whole blocks of K's columns (Tile::DqPart), N-major
                            // (steps of 16 keys)
  uint64_t k_half_columns;  // and its half block
};

template <typename Tile>
__device__ inline BackwardOperands backward_operands(const BackwardShared<Tile>& sh, int warpgroup) {
  using KV = typename Tile::KVLayout;
  using Q = typename Tile::QLayout;
  BackwardOperands o;
  const uint32_t key_rows = Tile::key_group(warpgroup) * 64 * 128;
  o.k_rows = arch::k_major_descriptor(sh.k + key_rows);
  o.v_rows = arch::k_major_descriptor(sh.v + key_rows);
  // Q and dO serve as K-major (Sᵀ, dPᵀ) and as N-major operands (dK, dV): the K-major reads ignore the
  // leading offset the N-major ones need.
  o.q = arch::mn_major_descriptor(sh.q(0), Q::kBlockBytes);
  o.d_o = arch::mn_major_descriptor(sh.d_o(0), Q::kBlockBytes);
  o.ds = arch::mn_major_descriptor(sh.ds(0), Tile::kDsBytes);
  using Dq = typename Tile::DqPart;
  o.k_columns = arch::mn_major_descriptor(sh.k + Dq::whole_offset(warpgroup, KV::kBlockBytes), KV::kBlockBytes);
  o.k_half_columns = arch::mn_major_descriptor(sh.k + Dq::half_offset(warpgroup, KV::kBlockBytes), KV::kBlockBytes);
  return o;
}

// A unit's start in a consumer thread: dK and dV at zero, and the query rows each of the thread's two
// keys (g and g + 8 of the warp's 16 from j0 + warp_key) keeps; returns its warpgroup's operands.
template <typename Tile, typename Walk>
__device__ inline BackwardOperands start_unit(UnitState<Tile>& st, IndexRange (&kept_rows)[2],
                                              const BackwardShared<Tile>& sh, const Walk& walk, int64_t j0,
                                              int warp, int g) {
  // (dK's and dV's tiles zeroed pairwise, in this order: ptxas's register assignment follows it, and
  // zeroing them one after the other cost the masked D = 256 kernel 216 more bytes of spills.)
  constexpr int kDk = UnitState<Tile>::kDkTiles, kDv = UnitState<Tile>::kDvTiles;
#pragma unroll
  for (int n = 0; n < (kDk > kDv ? kDk : kDv); ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (n < kDv) st.dv[n][e] = 0.f;
      if (n < kDk) st.dk[n][e] = 0.f;
    }
  }
  const BackwardOperands operands = backward_operands(sh, warp / 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    kept_rows[r] =
        rows_of_key<Tile::kMasked>(walk.mask, j0 + Tile::warp_key(warp) + g + 8 * r, walk.rows.sq, walk.rows.sk);
  }
  return operands;
}

// dS = P ∘ (dP - D) in place of dPᵀ's 8-column tile `dp` (q columns 8n + 2t, + 1: `d` holds their D), with
// P as rounded for the products: tile j of the A fragment `p` (two 8-column tiles of 16 columns).
template <typename T>
__device__ inline void ds_from_dp(float (&dp)[4], const uint32_t (&p)[4], int j, float2 d) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float2 pr = arch::Element<T>::unpack(p[2 * j + r]);
    dp[2 * r] = pr.x * (dp[2 * r] - d.x);
    dp[2 * r + 1] = pr.y * (dp[2 * r + 1] - d.y);
  }
}

// A fragment of a Pᵀ- or dSᵀ-shaped tile (`frag`: q columns 16 · kk + [0, 16) of the warp's 16 keys from
// `key`) into its stage in shared memory, laid out as the wgmma A operand (keys × q columns, K-major).
template <typename Tile>
__device__ inline void store_key_rows(uint32_t tile, const uint32_t (&frag)[4], int key, int kk, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      arch::shared_store_4(tile + Tile::DsLayout::offset(key + 8 * r, 2 * kk + half) + 4 * t, frag[2 * half + r]);
    }
  }
}

// An Sᵀ-shaped product (64 keys × the q rows of `q_rows`) = the warpgroup's key rows · q rowsᵀ, over kCols
// columns: Sᵀ (K·Qᵀ) or dPᵀ (V·dOᵀ).
template <typename Tile, typename T, int kCols, int kRows>
__device__ inline void key_scores(float (&out)[kRows][4], uint64_t key_rows, uint64_t q_rows) {
  arch::mma_rows_by_rows<T, kCols, Tile::KVLayout::kBlockBytes, Tile::QLayout::kBlockBytes>(out, key_rows, q_rows);
}

// One q tile (in stage `stage` of Q, dO, LSE and D) against the unit's K/V, each warpgroup its own keys:
// dV, dK accumulate; dSᵀ goes to its stage `ds_stage` in shared memory.
template <typename Tile, typename T, bool kEdge>
__device__ inline void accumulate_dk_dv(UnitState<Tile>& st, const BackwardShared<Tile>& sh, int stage, int ds_stage,
                                        const BackwardOperands& operands, float scale_log2,
                                        const IndexRange (&kept_rows)[2], int64_t i0, int warp, int g, int t) {
  static_assert(Tile::kColumnParts == 1, "column-split tiles: accumulate_dk_dv_halves");
  constexpr int M = Tile::kBlockM, kMTiles = M / 8;
  const uint64_t q = arch::descriptor_plus(operands.q, static_cast<uint32_t>(stage) * Tile::kQBytes);
  const uint64_t d_o = arch::descriptor_plus(operands.d_o, static_cast<uint32_t>(stage) * Tile::kDoBytes);

  // Sᵀ → P (kept rounded, as the MMAs consume it) → dV += Pᵀ·dO; dPᵀ → dS → dK += dSᵀ·Q and dSᵀ to shared
  // memory. Two fp32 score tiles are live next to the dK/dV accumulators: Sᵀ and dPᵀ are issued
  // together, P is computed while dPᵀ runs and dS while dV does.
  float acc[kMTiles][4] = {};     // Sᵀ, then P; overwritten by the first wgmma
  float dp_acc[kMTiles][4] = {};  // dPᵀ, then dS
  // Element (key row g + 8r of the warp's 16, q column 8n + 2t + c) of a score tile is acc[n][2r + c].
  const uint32_t lse = sh.lse(stage), big_d = sh.d(stage);
  constexpr float kLog2e = 1.4426950408889634f;

  // Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, then P = 2^(scale_log2 · S - LSE · log2 e), masked on edge tiles: q column
  // c of key row r is kept iff it lies in that key's kept range, as 32-bit offsets from the tile's first row.
  KeptRange kept[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) kept[r] = kept_range<M>(kept_rows[r], static_cast<int>(i0));
  arch::warpgroup_fence();
  key_scores<Tile, T, Tile::kDim>(acc, operands.k_rows, q);
  arch::warpgroup_commit();
  key_scores<Tile, T, Tile::kDimV>(dp_acc, operands.v_rows, d_o);
  arch::warpgroup_commit();
  arch::warpgroup_wait<1>();
  arch::hold_registers(acc);
#pragma unroll
  for (int n = 0; n < kMTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = n * 8 + 2 * t + c;
      const float l = arch::shared_load_f32(lse + 4 * col);
      // A fully masked row has LSE = -inf; 0 keeps P at 0 (its elements are masked) instead of NaN.
      const float row_bias = l == -INFINITY ? 0.f : l * kLog2e;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float p = arch::fast_exp2(fmaf(acc[n][2 * r + c], scale_log2, -row_bias));
        if (kEdge && (col < kept[r].lo || col > kept[r].last)) p = 0.f;
        acc[n][2 * r + c] = p;
      }
    }
  }
  uint32_t p_frag[M / 16][4];
#pragma unroll
  for (int kk = 0; kk < M / 16; ++kk) arch::a_fragment<T>(p_frag[kk], acc, kk);

  // dV += Pᵀ·dO (dO N-major, 16 q rows a step), behind dPᵀ.
  arch::warpgroup_fence();
  arch::mma_registers_by_columns<T>(st.dv, p_frag, d_o);
  arch::warpgroup_commit();
  arch::warpgroup_wait<1>();
  arch::hold_registers(dp_acc);

  // dS = P ∘ (dP - D) with P as rounded for dV.
#pragma unroll
  for (int n = 0; n < kMTiles; ++n) {
    ds_from_dp<T>(dp_acc[n], p_frag[n / 2], n % 2, arch::shared_load_f32x2(big_d + 4 * (n * 8 + 2 * t)));
  }

  // dSᵀ rows (keys) to shared memory, rounded as the MMAs consume them, then dK += dSᵀ·Q.
  uint32_t ds_frag[M / 16][4];
#pragma unroll
  for (int kk = 0; kk < M / 16; ++kk) {
    arch::a_fragment<T>(ds_frag[kk], dp_acc, kk);
    store_key_rows<Tile>(sh.ds(ds_stage), ds_frag[kk], Tile::warp_key(warp) + g, kk, t);
  }
  arch::fence_shared_for_async_proxy();  // dQ's wgmma reads dSᵀ after the consumers' barrier
  arch::warpgroup_fence();
  arch::mma_registers_by_columns<T>(st.dk, ds_frag, q);
  arch::warpgroup_commit();
  // Waiting here rather than behind the dQ product keeps ds_frag's registers free for dQ: deferring
  // the wait measured 4-17 % slower on an H200 (the kernels spilled).
  arch::warpgroup_wait<0>();
  arch::hold_registers(st.dv);
  arch::hold_registers(st.dk);
}

// The column-split tile's q step (D = 256, Q/K 192 with V 128: both warpgroups own the same 64 keys,
// warpgroup w its DkPart of dK's columns and DvPart of dV's): warpgroup w computes Sᵀ and dPᵀ of the tile's q rows
// [w · M / 2, (w + 1) · M / 2) and stores its half of Pᵀ and dSᵀ in their stage `ds_stage`; after the
// consumers' barrier each accumulates dV += Pᵀ·dO and dK += dSᵀ·Q over all the tile's rows for its columns,
// both operands from shared memory. (Each computing the whole Sᵀ and dPᵀ itself would cost 7 products a
// step for 5.) The caller's dQ product follows; the barrier is this function's.
template <typename Tile, typename T, bool kEdge>
__device__ inline void accumulate_dk_dv_halves(UnitState<Tile>& st, const BackwardShared<Tile>& sh, int stage,
                                               int ds_stage, const BackwardOperands& operands, float scale_log2,
                                               const IndexRange (&kept_rows)[2], int64_t i0, int warp, int g, int t) {
  static_assert(Tile::kColumnParts == 2, "key-split tiles: accumulate_dk_dv");
  constexpr int M = Tile::kBlockM, kHalf = M / 2, kMTiles = kHalf / 8;
  const int warpgroup = warp / 4, col0 = Tile::column_part(warpgroup) * kHalf;
  const uint64_t q = arch::descriptor_plus(operands.q, static_cast<uint32_t>(stage) * Tile::kQBytes);
  const uint64_t d_o = arch::descriptor_plus(operands.d_o, static_cast<uint32_t>(stage) * Tile::kDoBytes);
  float acc[kMTiles][4] = {};     // Sᵀ, then P; overwritten by the first wgmma
  float dp_acc[kMTiles][4] = {};  // dPᵀ, then dS
  const uint32_t lse = sh.lse(stage) + 4 * col0, big_d = sh.d(stage) + 4 * col0;
  constexpr float kLog2e = 1.4426950408889634f;
  KeptRange kept[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) kept[r] = kept_range<M>(kept_rows[r], static_cast<int>(i0));
  arch::warpgroup_fence();
  key_scores<Tile, T, Tile::kDim>(acc, operands.k_rows, arch::descriptor_plus(q, col0 * 128));
  arch::warpgroup_commit();
  key_scores<Tile, T, Tile::kDimV>(dp_acc, operands.v_rows, arch::descriptor_plus(d_o, col0 * 128));
  arch::warpgroup_commit();
  arch::warpgroup_wait<1>();
  arch::hold_registers(acc);
  const int key = Tile::warp_key(warp) + g;
  // P as in accumulate_dk_dv, over this warpgroup's q columns. (The loop as one function of both made
  // ptxas spill 80/132 more bytes, stores/loads, in the masked D = 128 split-slot kernel.)
#pragma unroll
  for (int n = 0; n < kMTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = n * 8 + 2 * t + c;
      const float l = arch::shared_load_f32(lse + 4 * col);
      const float row_bias = l == -INFINITY ? 0.f : l * kLog2e;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float p = arch::fast_exp2(fmaf(acc[n][2 * r + c], scale_log2, -row_bias));
        if (kEdge && (col0 + col < kept[r].lo || col0 + col > kept[r].last)) p = 0.f;
        acc[n][2 * r + c] = p;
      }
    }
  }
  arch::warpgroup_wait<0>();
  arch::hold_registers(dp_acc);
  // P as the products consume it (rounded), dS = P ∘ (dP - D) from it; both halves to shared memory.
#pragma unroll
  for (int kk = 0; kk < kHalf / 16; ++kk) {
    uint32_t p_frag[4], ds_frag[4];
    arch::a_fragment<T>(p_frag, acc, kk);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = 2 * kk + j;
      ds_from_dp<T>(dp_acc[n], p_frag, j, arch::shared_load_f32x2(big_d + 4 * (n * 8 + 2 * t)));
    }
    arch::a_fragment<T>(ds_frag, dp_acc, kk);
    store_key_rows<Tile>(sh.p(ds_stage), p_frag, key, col0 / 16 + kk, t);
    store_key_rows<Tile>(sh.ds(ds_stage), ds_frag, key, col0 / 16 + kk, t);
  }
  arch::fence_shared_for_async_proxy();  // the products read Pᵀ and dSᵀ after the consumers' barrier
  // Both warpgroups' halves of Pᵀ and dSᵀ are in shared memory. (The stage a warpgroup writes was last read
  // two steps back, by products that both waited for before arriving at the last step's barrier.)
  arch::named_barrier_sync(kDsComplete, Tile::kConsumerThreads);
  const uint64_t p_rows = arch::k_major_descriptor(sh.p(ds_stage)), ds_rows = arch::k_major_descriptor(sh.ds(ds_stage));
  // Each warpgroup's part of dV's and dK's columns: B is dO's or Q's columns there (N-major).
  constexpr uint32_t kBlock = Tile::QLayout::kBlockBytes;
  using Dv = typename Tile::DvPart;
  using Dk = typename Tile::DkPart;
  arch::warpgroup_fence();
  part_products<Dv>(st.dv, arch::descriptor_plus(d_o, Dv::whole_offset(warpgroup, kBlock)),
                    arch::descriptor_plus(d_o, Dv::half_offset(warpgroup, kBlock)),
                    [&](auto& tiles, uint64_t b) { arch::mma_rows_by_columns<T, M / 16>(tiles, p_rows, b); });
  part_products<Dk>(st.dk, arch::descriptor_plus(q, Dk::whole_offset(warpgroup, kBlock)),
                    arch::descriptor_plus(q, Dk::half_offset(warpgroup, kBlock)),
                    [&](auto& tiles, uint64_t b) { arch::mma_rows_by_columns<T, M / 16>(tiles, ds_rows, b); });
  arch::warpgroup_commit();
  arch::warpgroup_wait<0>();
  arch::hold_registers(st.dv);
  arch::hold_registers(st.dk);
}

// Where dQ rows go: the unit's dq_acc slot, `store`d (a split slot's first unit) or added element by element;
// or, where `map` is set, stored or added by TMA boxes of `map` (dq_acc as columns × query heads of the
// group × rows × slots: row i of the unit's slot is row `map_row` + i of slot `map_slot`, its query head
// `map_head`). `wait_written`: a deterministic unit's first tile, whose boxes go to rows the worker's
// previous unit may have sent boxes to: one thread's bulk operations are ordered only by waiting for them.
// `map_clips`: the map ends each slot at the sequence's rows (batch mode), so that a stored box reaching
// past them writes nothing there; else such a box adds, to a slot zeroed beforehand.
struct DqTarget {
  float* slot;
  int64_t row_elements, sq;
  int hdim_q;
  bool store;
  const CUtensorMap* map;
  int map_head, map_row, map_slot;
  bool wait_written, map_clips;
};

// The unit's slot (`unit_slot`, rows of `row_elements`) in dq_map's coordinates (bwd/backward.hip's
// encode_dq_acc_map): batch mode's slots are seqlen_q rows each; group mode's map is one slot of all rows.
// (Batch mode without query rows has no map: the place is unused.)
struct DqMapPlace {
  int row, slot;
};
__device__ inline DqMapPlace dq_map_place(const fmha_bwd_params& p, const float* unit_slot, int64_t row_elements) {
  const int64_t rows = (unit_slot - dq_acc_region(p)) / row_elements;
  if (p.group_mode || p.seqlen_q <= 0) return {static_cast<int>(rows), 0};
  return {static_cast<int>(rows % p.seqlen_q), static_cast<int>(rows / p.seqlen_q)};
}

// The boxes of one consumer warp's dQ rows (`boxes` in shared memory: its 16 rows from `warp_row` of the
// tile, the columns of warpgroup `col_group`'s DqPart) as TMA stores or adds into the target's map, from
// one thread. (Boxes wholly past the sequence add nothing.) A box is stored only where that writes none
// of another slot's rows.
template <typename Tile>
__device__ inline void send_dq_boxes(uint32_t boxes, int col_group, int64_t warp_row, const DqTarget& to) {
  const bool store = Tile::kSplitSlots && to.store && (to.map_clips || warp_row + Tile::kDqBoxRows <= to.sq);
#pragma unroll
  for (int box = 0; box < Tile::kDqCols / 32; ++box) {
    const int column = Tile::DqPart::column(col_group, 4 * box);  // (a box is 4 tiles of one block)
    if (column < to.hdim_q && warp_row < to.sq) {
      arch::tma_store_or_add(*to.map, boxes + box * Tile::kDqBoxBytes, column, to.map_head,
                             to.map_row + static_cast<int>(warp_row), to.map_slot, store);
    }
  }
}

// dQ = scale · dS·K for the q tile (after the consumers' barrier: dSᵀ of every warp is in stage `ds_stage`
// of shared memory), into the unit's dq_acc slot: warpgroup w its DqPart of the columns.
// `step`: the consumers' steps before this one, over all units (the ordered dQ writer's barrier phases).
template <typename Tile, typename T>
__device__ inline void accumulate_dq(const BackwardOperands& operands, const BackwardShared<Tile>& sh, int ds_stage,
                                     const DqTarget& to, int64_t i0, float scale, int warp, int lane, int step) {
  constexpr int N = Tile::kBlockN, kColTiles = Tile::kDqCols / 8;
  const int row_group = warp % 4, col_group = warp / 4, g = lane / 4, t = lane % 4;
  float dq[kColTiles][4];
  const uint64_t ds = arch::descriptor_plus(operands.ds, static_cast<uint32_t>(ds_stage) * Tile::kDsBytes);
  arch::warpgroup_fence();
  part_products<typename Tile::DqPart>(dq, operands.k_columns, operands.k_half_columns, [&](auto& tiles, uint64_t b) {
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) {
      // 16 keys a step: rows of dSᵀ (A, M-major) and of K (B, N-major).
      arch::WarpgroupMma<T>::template mma<1, 1>(tiles, arch::descriptor_plus(ds, ks * 16 * 128),
                                                arch::descriptor_plus(b, ks * 16 * 128), ks > 0);
    }
  });
  arch::warpgroup_commit();
  arch::warpgroup_wait<0>();
  arch::hold_registers(dq);
  const int64_t warp_row = i0 + row_group * Tile::kDqBoxRows;
  if (to.map != nullptr) {
    // The warp's rows through shared memory as boxes, which one lane sends to the slot while the warp
    // goes on to the next q tile (element-wise reductions each waited on their own address registers);
    // with ordered dQ the dQ writer warp sends every warp's boxes in the tile's turn (bwd/sm90/kernel.h's
    // write_dq_in_turn). Rows past the sequence are -0, which adds nothing to any value (in group mode a
    // box reaches into the next sequence's or head's rows; TMA skips those past the map): selected, not
    // scaled, so that no NaN of this sequence's K leaks.
    const uint32_t boxes = sh.dq_rows(warp);
    // The previous tile's boxes have been read (and, see wait_written, the previous unit's written).
    if constexpr (Tile::kOrdered) {
      arch::mbarrier_wait(sh.dq_empty(), (static_cast<uint32_t>(step) & 1) ^ 1);  // the first step's passes
    } else {
      arch::bulk_wait(Tile::kSplitSlots && to.wait_written);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      const bool in_sequence = warp_row + row < to.sq;
#pragma unroll
      for (int n = 0; n < kColTiles; ++n) {
        // Columns 8n + 2t, + 1: box n / 4, 16-byte chunk 2 (n % 4) + t / 2 of the row, swizzled by row % 8.
        const int chunk = (2 * (n % 4) + t / 2) ^ g;
        arch::shared_store_8(boxes + (n / 4) * Tile::kDqBoxBytes + row * 128 + chunk * 16 + (t % 2) * 8,
                             in_sequence ? dq[n][2 * r] * scale : -0.f, in_sequence ? dq[n][2 * r + 1] * scale : -0.f);
      }
    }
    arch::fence_shared_for_async_proxy();
    __syncwarp();
    if constexpr (Tile::kOrdered) {
      if (lane == 0) arch::mbarrier_arrive(sh.dq_full(step));
    } else if (lane == 0) {
      send_dq_boxes<Tile>(boxes, col_group, warp_row, to);
      arch::bulk_commit();
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = i0 + row_group * 16 + g + 8 * r;
    if (i >= to.sq) continue;
    float* row = to.slot + i * to.row_elements;
#pragma unroll
    for (int n = 0; n < kColTiles; ++n) {
      const int col = Tile::DqPart::column(col_group, n) + 2 * t;
      if (col >= to.hdim_q) continue;
      const float x = dq[n][2 * r] * scale, y = dq[n][2 * r + 1] * scale;
      // One vector reduction for the pair, fire and forget. With split slots the workgroup owns the
      // slot and this thread the element (same tile position in every unit), so the store and adds to
      // it are one thread's, which apply in program order: the sum is reproducible without the
      // load-add-store round trip. (The launch refuses ordered dQ without the dq_acc map.)
      arch::store_or_add_2(row + col, x, y, Tile::kSplitSlots && to.store);
    }
  }
}

// A step's LSE and D rows of the q tile by the producer's Tile::kStepThreads threads (`thread` of them), zeros
// past the batch's rows.
template <typename Tile>
__device__ inline void issue_row_stats(const fmha_bwd_params& p, const BackwardShared<Tile>& sh, int stage,
                                       const BatchRows& rows, int64_t batch, const QTile& tile, int thread) {
  const int64_t row = rows.q_start + tile.i0;
  const int valid_rows = static_cast<int>(rows.sq - tile.i0);
  const auto copy_row_stat = [&](int x) {  // LSE rows, then D rows
    const bool is_lse = x < Tile::kBlockM;
    const int r = is_lse ? x : x - Tile::kBlockM;
    const float* src = is_lse ? reinterpret_cast<const float*>(p.lse) + batch * p.lse_batch_stride +
                                    tile.h * p.lse_head_stride + row
                              : reinterpret_cast<const float*>(p.d) + batch * p.d_batch_stride +
                                    tile.h * p.d_head_stride + row;
    const bool valid = r < valid_rows;
    arch::copy_async_4((is_lse ? sh.lse(stage) : sh.d(stage)) + 4 * r, valid ? src + r : src, valid);
  };
  constexpr int kThreads = Tile::kStepThreads;
  if constexpr (kThreads > 2 * Tile::kBlockM) {
    if (thread < 2 * Tile::kBlockM) copy_row_stat(thread);
  } else {
    for (int x = thread; x < 2 * Tile::kBlockM; x += kThreads) copy_row_stat(x);
  }
}

// The q-tile copies of one step by the producer's Tile::kStepThreads threads (`q_copy`, `do_copy` are this
// thread's shares, of Tile::StepLoader's and StepLoaderV's threads): Q and dO rows (zero past the batch's
// rows) and their LSE and D.
template <typename Tile, typename T, typename QCopy, typename DoCopy>
__device__ inline void issue_q_tile(const fmha_bwd_params& p, const BackwardShared<Tile>& sh, int stage,
                                    const QCopy& q_copy, const DoCopy& do_copy, const BatchRows& rows, int64_t batch,
                                    const QTile& tile, int thread) {
  const int64_t row = rows.q_start + tile.i0;
  const int valid_rows = static_cast<int>(rows.sq - tile.i0);
  const T* q = reinterpret_cast<const T*>(p.q) + batch * p.q_batch_stride + tile.h * p.q_head_stride +
               row * p.q_row_stride;
  const T* d_o = reinterpret_cast<const T*>(p.d_o) + batch * p.do_batch_stride + tile.h * p.do_head_stride +
                 row * p.do_row_stride;
  if (Tile::StepLoader::copies(thread)) q_copy.issue(sh.q(stage), q, p.q_row_stride, valid_rows, p.hdim_q);
  if (Tile::StepLoaderV::copies(thread)) do_copy.issue(sh.d_o(stage), d_o, p.do_row_stride, valid_rows, p.hdim_v);
  issue_row_stats<Tile>(p, sh, stage, rows, batch, tile, thread);
}

}  // namespace fmha
