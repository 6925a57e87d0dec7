// Stage 2 of the backward on Hopper tensor cores (wgmma, sm_90a) with cp.async copies:
// FlashAttention-2's dK/dV-resident algorithm (host twin: src/launch/host/backward/dq_dk_dv.rs).
//
// A work unit is one (batch, kv head, K tile of kBlockN keys); one warpgroup owns 64 keys. K and V stay
// in shared memory while the q tiles (kBlockM rows) of every query head of the GQA group stream past,
// double-buffered with their dO, LSE and D rows. Per q tile, each warpgroup computes its keys'
// transposed scores Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (both operands from shared memory), so that the
// accumulators are directly the register A operands of
//   dV += Pᵀ·dO,   dK += dSᵀ·Q,     with P = 2^(scale_log2 · S - LSE · log2 e), dS = P ∘ (dP - D),
// and stores dSᵀ to shared memory, from which each warpgroup then computes its half of the columns of
// dQ = dS·K for the tile and adds it to the unit's dq_acc split slot.
// Non-deterministic mode (bwd/sm90/specialized_kernel.h: the same steps, warp-specialized): one
// workgroup per unit, slot 0, adds in any order. Deterministic mode (this kernel: every thread copies
// and computes): the persistent schedule gives every slot to one workgroup, and every element of it to
// one thread, whose vector atomics apply in program order; the workgroup's first unit in a slot stores
// instead, and zeroes the rows it does not visit (no zeroing pass over the slots).
// dK (scaled) and dV are stored once per unit. Fully masked q tiles are never visited.
//
// The kernel is its tile (bwd/sm90/tile.h: the workgroup's shape and shared-memory layout), its
// mainloop (bwd/sm90/mainloop.h: a step's copies, dK/dV and dQ of one q tile), its epilogue
// (bwd/sm90/epilogue.h: dK and dV) and, in run_unit below, the walk of a unit's q tiles; the units come
// from the schedule (bwd/unit_walk.h's for_each_unit). The copies are arch/nvidia/shared_tile.h's TileCopy.
#pragma once

#include "arch/nvidia/shared_tile.h"
#include "arch/nvidia/tensor_core.h"
#include "arch/nvidia/warpgroup.h"
#include "arch/thread.h"
#include "launch.h"
#include "bwd/unit_walk.h"
#include "common/kept_range.h"
#include "bwd/sm90/epilogue.h"
#include "bwd/sm90/mainloop.h"
#include "bwd/sm90/tile.h"

namespace fmha {

template <typename Tile, typename T>
__device__ inline void run_unit(const fmha_bwd_params& p, const WorkUnit& unit, unsigned char* shared_bytes) {
  constexpr int M = Tile::kBlockM, N = Tile::kBlockN;
  const UnitQTiles<M, N, Tile::kMasked> walk(p, unit);
  const DqAccBlock acc = dq_acc_block(p, unit.batch);
  // The unit's split slot: rows of group · hdim_q, a q tile's query head gh at column gh · hdim_q.
  float* const unit_slot = dq_acc_region(p) + acc.index(unit.head, unit.split, 0, 0);
  const int64_t slot_row_elements = acc.row_elements;
  const bool store_dq = unit.first_in_slot;
  const int thread = static_cast<int>(arch::thread_index());
  if (store_dq) walk.template zero_unvisited_rows<Tile::kThreads>(unit_slot, slot_row_elements, thread);
  if (!walk.has_keys()) return;
  const BatchRows& rows = walk.rows;
  const int64_t batch = walk.batch, j0 = walk.j0, j1 = walk.j1, steps = walk.steps;
  const int hk = unit.head;
  const BackwardShared<Tile> sh(shared_bytes);
  const int lane = thread % arch::kWarpSize, warp = thread / arch::kWarpSize;
  const int g = lane / 4, t = lane % 4;

  const TileCopy<Tile, M, typename Tile::QLayout> q_copy;
  const TileCopy<Tile, N, typename Tile::KVLayout> kv_copy;
  const T* k = reinterpret_cast<const T*>(p.k) + batch * p.k_batch_stride + hk * p.k_head_stride +
               (rows.k_start + j0) * p.k_row_stride;
  const T* v = reinterpret_cast<const T*>(p.v) + batch * p.v_batch_stride + hk * p.v_head_stride +
               (rows.k_start + j0) * p.v_row_stride;
  kv_copy.issue(sh.k, k, p.k_row_stride, static_cast<int>(j1 - j0), p.hdim_q);
  kv_copy.issue(sh.v, v, p.v_row_stride, static_cast<int>(j1 - j0), p.hdim_v);
  QTile tile = walk.tile(0);
  if (steps > 0) issue_q_tile<Tile, T, Tile::kThreads>(p, sh, 0, q_copy, rows, batch, tile, thread);
  arch::copy_async_commit();

  UnitState<Tile> st;
  IndexRange kept_rows[2];
  const BackwardOperands operands = start_unit(st, kept_rows, sh, walk, j0, warp, g);
  auto slot_of = [&](const QTile& q) { return unit_slot + (q.h - walk.first_head) * p.hdim_q; };
  auto dq_target = [&](const QTile& q) {
    return DqTarget{slot_of(q), slot_row_elements, rows.sq, p.hdim_q, store_dq, nullptr, 0, 0, 0};
  };
  auto prefetch_dq = [&](const QTile& q) {
    // The first unit overwrites whole sectors: nothing to fetch.
    if (Tile::kDeterministic && !store_dq) {
      prefetch_dq_rows<Tile>(slot_of(q), slot_row_elements, q.i0, rows.sq, p.hdim_q, thread);
    }
  };
  if (steps > 0) prefetch_dq(tile);

  for (int64_t step = 0; step < steps; ++step) {
    const int stage = static_cast<int>(step & 1);
    const QTile next = walk.next(tile);
    if (step + 1 < steps) {
      issue_q_tile<Tile, T, Tile::kThreads>(p, sh, stage ^ 1, q_copy, rows, batch, next, thread);
      arch::copy_async_commit();
      prefetch_dq(next);
      arch::copy_async_wait<1>();
    } else {
      arch::copy_async_wait<0>();
    }
    arch::fence_shared_for_async_proxy();
    arch::block_barrier();

    if (walk.edge(tile)) {
      accumulate_dk_dv<Tile, T, true>(st, sh, stage, operands, p.scale_log2, kept_rows, tile.i0, warp, g, t);
    } else {
      accumulate_dk_dv<Tile, T, false>(st, sh, stage, operands, p.scale_log2, kept_rows, tile.i0, warp, g, t);
    }
    arch::block_barrier();  // dSᵀ complete; this stage's Q/dO are no longer read

    accumulate_dq<Tile, T>(operands, sh, stage, dq_target(tile), tile.i0, p.scale, warp, lane);
    tile = next;
  }

  store_dk_dv<Tile, T>(p, st, batch, hk, rows, j0, warp, g, t);
  arch::block_barrier();  // the next unit overwrites K and V, which the last dQ step read
}

template <typename Tile, typename T>
__global__ void __launch_bounds__(Tile::kThreads, 1) dq_dk_dv_kernel(fmha_bwd_params p) {
  static_assert(!Tile::kSpecialized, "every thread copies and computes");
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  if (!workspace_prepared(p)) return;
  for_each_unit<Tile::kDeterministic>(p, Tile::kMasked,
                                      [&](const WorkUnit& unit) { run_unit<Tile, T>(p, unit, shared_bytes); });
}

}  // namespace fmha
